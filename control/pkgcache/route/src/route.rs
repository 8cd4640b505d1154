//! The path router: one function from a request path to the endpoint it names.
//!
//! Fixed endpoints have one or two segments (`/health`, `/health/live`, `/metrics`,
//! `/api/docs`, …) and are matched on the raw path; package addresses have three or four
//! (`/{name}/{version}/{sha}[/{triplet}]`), are percent-decoded segment by segment and then
//! validated by [`PackageKey`]. The two shapes never overlap, so `/health/1/ab` is the package
//! `health` and needs the credentials of a package, not those of a health probe.

use crate::key::{KeyError, PackageKey};

/// Endpoint groups that authentication can cover (`auth.protect` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Packages,
    Health,
    Metrics,
    Docs,
}

/// The documentation pages and their embedded assets under `/api/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocPage {
    OpenApiJson,
    SwaggerUi,
    Redoc,
    SwaggerJs,
    SwaggerCss,
    SwaggerIcon,
    RedocJs,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `/health`
    Health,
    /// `/health/live`
    Live,
    /// `/health/ready`
    Ready,
    /// `/health/details`
    Details,
    /// `/metrics`
    Metrics,
    /// `/api/…`
    Doc(DocPage),
    /// A valid package address.
    Package(PackageKey),
    /// A path shaped like a package address whose segments are not valid (answered 400).
    InvalidPackage(KeyError),
    /// Anything else (answered 404).
    NotFound,
}

/// The documentation routes: path under `/api/` and page.
pub const DOC_PAGES: &[(&str, DocPage)] = &[
    ("openapi.json", DocPage::OpenApiJson),
    ("docs", DocPage::SwaggerUi),
    ("redoc", DocPage::Redoc),
    ("swagger-ui-bundle.js", DocPage::SwaggerJs),
    ("swagger-ui.css", DocPage::SwaggerCss),
    ("favicon-32x32.png", DocPage::SwaggerIcon),
    ("redoc.standalone.js", DocPage::RedocJs),
];

impl Endpoint {
    /// The group whose credentials this endpoint needs; `None` for paths that name nothing.
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Endpoint::Health | Endpoint::Live | Endpoint::Ready | Endpoint::Details => {
                Some(Scope::Health)
            }
            Endpoint::Metrics => Some(Scope::Metrics),
            Endpoint::Doc(_) => Some(Scope::Docs),
            Endpoint::Package(_) | Endpoint::InvalidPackage(_) => Some(Scope::Packages),
            Endpoint::NotFound => None,
        }
    }
}

/// The endpoint `path` (the path of the request target, without query) names.
pub fn resolve(path: &str) -> Endpoint {
    let Some(rest) = path.strip_prefix('/') else {
        return Endpoint::NotFound;
    };
    let mut parts = rest.split('/');
    let mut seg = [""; 4];
    let mut n = 0;
    for part in parts.by_ref() {
        if n == seg.len() {
            return Endpoint::NotFound;
        }
        seg[n] = part;
        n += 1;
    }
    match &seg[..n] {
        ["health"] => Endpoint::Health,
        ["health", "live"] => Endpoint::Live,
        ["health", "ready"] => Endpoint::Ready,
        ["health", "details"] => Endpoint::Details,
        ["metrics"] => Endpoint::Metrics,
        ["api", page] => DOC_PAGES
            .iter()
            .find(|(p, _)| p == page)
            .map_or(Endpoint::NotFound, |(_, d)| Endpoint::Doc(*d)),
        [name, version, sha] => package(&[name, version, sha], None),
        [name, version, sha, triplet] => package(&[name, version, sha], Some(triplet)),
        _ => Endpoint::NotFound,
    }
}

fn package(raw: &[&str; 3], triplet: Option<&str>) -> Endpoint {
    let decoded = (|| {
        let name = percent_decode("name", raw[0])?;
        let version = percent_decode("version", raw[1])?;
        let sha = percent_decode("sha", raw[2])?;
        match triplet {
            None => PackageKey::parse(&name, &version, &sha),
            Some(t) => {
                let t = percent_decode("triplet", t)?;
                PackageKey::parse_with_triplet(&name, &version, &sha, &t)
            }
        }
    })();
    match decoded {
        Ok(key) => Endpoint::Package(key),
        Err(e) => Endpoint::InvalidPackage(e),
    }
}

/// Decodes `%XX` escapes of one path segment; the result must be UTF-8.
pub fn percent_decode(segment: &'static str, s: &str) -> Result<String, KeyError> {
    let bad = |reason: &str| KeyError {
        segment,
        reason: reason.to_string(),
    };
    if !s.contains('%') {
        return Ok(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = bytes.get(i + 1).and_then(|b| (*b as char).to_digit(16));
            let lo = bytes.get(i + 2).and_then(|b| (*b as char).to_digit(16));
            match (hi, lo) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err(bad("bad percent-encoding")),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("not UTF-8 after percent-decoding"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fixed_endpoints_are_exact() {
        assert_eq!(resolve("/health"), Endpoint::Health);
        assert_eq!(resolve("/health/live"), Endpoint::Live);
        assert_eq!(resolve("/health/ready"), Endpoint::Ready);
        assert_eq!(resolve("/health/details"), Endpoint::Details);
        assert_eq!(resolve("/metrics"), Endpoint::Metrics);
        assert_eq!(resolve("/api/docs"), Endpoint::Doc(DocPage::SwaggerUi));
        assert_eq!(
            resolve("/api/openapi.json"),
            Endpoint::Doc(DocPage::OpenApiJson)
        );
        for p in [
            "",
            "/",
            "/health/",
            "/metrics/x",
            "/api",
            "/api/x",
            "/a/b",
            "health",
            "/%68ealth",
        ] {
            assert_eq!(resolve(p), Endpoint::NotFound, "{p}");
        }
    }

    #[test]
    fn reserved_names_are_packages_with_package_scope() {
        for name in ["health", "metrics", "api", "docs", "redoc", "openapi.json"] {
            for path in [
                format!("/{name}/1/abcdef0123"),
                format!("/{name}/docs/ab/x64-linux"),
            ] {
                let e = resolve(&path);
                assert!(matches!(e, Endpoint::Package(_)), "{path}: {e:?}");
                assert_eq!(e.scope(), Some(Scope::Packages), "{path}");
            }
        }
        assert_eq!(resolve("/api/docs/x").scope(), Some(Scope::Packages));
        assert!(matches!(
            resolve("/api/docs/x"),
            Endpoint::InvalidPackage(_)
        ));
        assert_eq!(resolve("/a/b/c/d/e"), Endpoint::NotFound);
    }

    #[test]
    fn package_segments_are_percent_decoded_then_validated() {
        let Endpoint::Package(k) = resolve("/qt5-base/5.15.2%2B1/AB") else {
            panic!()
        };
        assert_eq!((k.version.as_str(), k.sha.as_str()), ("5.15.2+1", "ab"));
        for p in [
            "/%2E%2E/1/ab",
            "/a%2Fb/1/ab",
            "/a/1/%zz",
            "/a/1/ab%",
            "/a/%ff/ab",
            "/a//ab",
            "/a/1/ab/",
        ] {
            assert!(matches!(resolve(p), Endpoint::InvalidPackage(_)), "{p}");
        }
    }
}
