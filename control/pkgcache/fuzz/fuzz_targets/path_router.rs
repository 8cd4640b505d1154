//! The pkgcache path router on arbitrary paths: never panics; a package address is three valid
//! segments that re-resolve to the same key; fixed endpoints are exactly the paths of one or
//! two segments they are named by, so no package path ever gets the scope of a health, metrics
//! or docs endpoint (the auth bypass this router replaced).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_pkgcache_route::key::PackageKey;
use switchyard_pkgcache_route::route::{resolve, Endpoint, Scope};

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let endpoint = resolve(path);
    let segments: Vec<&str> = path.strip_prefix('/').map_or(Vec::new(), |r| r.split('/').collect());
    match &endpoint {
        Endpoint::Package(key) => {
            assert!(segments.len() == 3 || segments.len() == 4, "{path:?}");
            // what the store would use as a relative path: three safe segments
            let rel = key.rel_path();
            let parts: Vec<&str> = rel.split('/').collect();
            assert_eq!(parts.len(), 3, "{rel:?}");
            for p in &parts {
                assert!(!p.is_empty() && !p.starts_with('.'), "{rel:?}");
            }
            assert_eq!(
                PackageKey::parse(parts[0], parts[1], parts[2]).as_ref(),
                Ok(key),
                "{rel:?}"
            );
            // the canonical path names the same package
            assert_eq!(resolve(&format!("/{rel}")), endpoint, "{path:?}");
        }
        Endpoint::InvalidPackage(_) => {
            assert!(segments.len() == 3 || segments.len() == 4, "{path:?}")
        }
        Endpoint::NotFound => assert_eq!(endpoint.scope(), None),
        fixed => {
            assert!(segments.len() == 1 || segments.len() == 2, "{path:?}");
            assert_ne!(fixed.scope(), Some(Scope::Packages));
            assert_ne!(fixed.scope(), None);
        }
    }
    if segments.len() >= 3 {
        assert!(
            matches!(endpoint.scope(), Some(Scope::Packages) | None),
            "{path:?} resolved to {endpoint:?}"
        );
    }
});
