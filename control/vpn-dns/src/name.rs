//! Name normalisation: one spelling per domain for cache keys and split-tunnel reports.

use hickory_proto::rr::Name;

/// The name in lower case, without the root dot (`WWW.Example.COM.` → `www.example.com`); the root
/// itself is `.`. Labels with bytes outside letters, digits and `-` keep hickory's escaping, so
/// two different names never share a spelling.
pub fn normalise(name: &Name) -> String {
    let ascii = name.to_lowercase().to_ascii();
    if ascii == "." {
        return ascii;
    }
    match ascii.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => ascii,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lower_case_without_root_dot() {
        let n = Name::from_ascii("WWW.Example.COM.").unwrap();
        assert_eq!(normalise(&n), "www.example.com");
        let n = Name::from_ascii("host.lan").unwrap();
        assert_eq!(normalise(&n), "host.lan");
        assert_eq!(normalise(&Name::root()), ".");
    }

    #[test]
    fn escaped_labels_stay_distinct() {
        let dotted = Name::from_labels(vec![&b"a.b"[..], &b"c"[..]]).unwrap();
        let plain = Name::from_ascii("a.b.c.").unwrap();
        assert_ne!(normalise(&dotted), normalise(&plain));
    }
}
