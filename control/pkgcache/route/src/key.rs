//! Package addresses: `/{name}/{version}/{sha}` (and `/{name}/{version}/{sha}/{triplet}`),
//! validated before anything touches the store. Runtime-free; unit-tested below.
//!
//! Rules (anything else is a 400):
//! - `name`, `version`, `triplet`: 1–128 bytes of ASCII letters, digits and `. _ - + ~ @ = , ^`,
//!   not starting with `.` (so never `.` or `..`, never a hidden file), no separators or controls.
//! - `sha`: 1–128 hex digits; stored lower-case, so `ABC…` and `abc…` are one package.
//!
//! The triplet of the 4-segment form is validated and otherwise ignored: vcpkg's `{sha}` is the
//! ABI hash, which already covers the triplet, so both forms address the same package.

use std::fmt;

/// Longest accepted segment, in bytes.
pub const MAX_SEGMENT: usize = 128;

/// A validated package address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PackageKey {
    pub name: String,
    pub version: String,
    /// Lower-case hex.
    pub sha: String,
}

/// Why a path is not a package address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {segment}: {reason}")]
pub struct KeyError {
    /// `name`, `version`, `sha` or `triplet`.
    pub segment: &'static str,
    pub reason: String,
}

fn word(segment: &'static str, s: &str) -> Result<(), KeyError> {
    let err = |reason: String| Err(KeyError { segment, reason });
    if s.is_empty() {
        return err("empty".into());
    }
    if s.len() > MAX_SEGMENT {
        return err(format!("longer than {MAX_SEGMENT} bytes"));
    }
    if s.starts_with('.') {
        return err("must not start with '.'".into());
    }
    if let Some(c) = s.chars().find(|c| {
        !(c.is_ascii_alphanumeric()
            || matches!(c, '.' | '_' | '-' | '+' | '~' | '@' | '=' | ',' | '^'))
    }) {
        return err(format!("character {c:?} not allowed"));
    }
    Ok(())
}

impl PackageKey {
    /// Validates the three segments (already percent-decoded).
    pub fn parse(name: &str, version: &str, sha: &str) -> Result<Self, KeyError> {
        word("name", name)?;
        word("version", version)?;
        if sha.is_empty() || sha.len() > MAX_SEGMENT || !sha.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(KeyError {
                segment: "sha",
                reason: format!("must be 1-{MAX_SEGMENT} hex digits"),
            });
        }
        Ok(PackageKey {
            name: name.to_string(),
            version: version.to_string(),
            sha: sha.to_ascii_lowercase(),
        })
    }

    /// Validates the 4-segment form; the triplet is checked and dropped (see the module docs).
    pub fn parse_with_triplet(
        name: &str,
        version: &str,
        sha: &str,
        triplet: &str,
    ) -> Result<Self, KeyError> {
        let key = PackageKey::parse(name, version, sha)?;
        word("triplet", triplet)?;
        Ok(key)
    }

    /// Relative storage path `name/version/sha` (always three safe segments).
    pub fn rel_path(&self) -> String {
        format!("{}/{}/{}", self.name, self.version, self.sha)
    }
}

impl fmt::Display for PackageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.name, self.version, self.sha)
    }
}

/// Whether a file name in the store is a package (hex) rather than a sidecar or a stray file.
pub fn is_package_file_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SEGMENT && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn accepts_vcpkg_addresses() {
        let k = PackageKey::parse("zlib", "1.3.1", &"AB".repeat(32)).unwrap();
        assert_eq!(k.sha, "ab".repeat(32));
        assert_eq!(k.rel_path(), format!("zlib/1.3.1/{}", "ab".repeat(32)));
        assert!(PackageKey::parse("boost-asio", "2024-01-11", "deadbeef").is_ok());
        assert!(PackageKey::parse("qt5-base", "5.15.2+1", "00").is_ok());
        assert!(PackageKey::parse_with_triplet("zlib", "1", "ab", "x64-linux").is_ok());
    }

    #[test]
    fn rejects_traversal_separators_and_junk() {
        for (n, v, s) in [
            ("..", "1", "ab"),
            (".", "1", "ab"),
            (".hidden", "1", "ab"),
            ("a/b", "1", "ab"),
            ("a\\b", "1", "ab"),
            ("a", "..", "ab"),
            ("a", "1/..", "ab"),
            ("a", "1", "xyz"),
            ("a", "1", ""),
            ("", "1", "ab"),
            ("a b", "1", "ab"),
            ("a\0", "1", "ab"),
            ("ä", "1", "ab"),
            ("a", "1", "../ab"),
        ] {
            assert!(PackageKey::parse(n, v, s).is_err(), "{n:?} {v:?} {s:?}");
        }
        let long = "a".repeat(MAX_SEGMENT + 1);
        assert!(PackageKey::parse(&long, "1", "ab").is_err());
        assert!(PackageKey::parse("a", "1", &"a".repeat(MAX_SEGMENT + 1)).is_err());
        assert!(PackageKey::parse("a", "1", &"a".repeat(MAX_SEGMENT)).is_ok());
        let e = PackageKey::parse_with_triplet("a", "1", "ab", "..").unwrap_err();
        assert_eq!(e.segment, "triplet");
    }

    #[test]
    fn package_file_names() {
        assert!(is_package_file_name("abc123"));
        assert!(!is_package_file_name("abc123.meta"));
        assert!(!is_package_file_name(""));
    }
}
