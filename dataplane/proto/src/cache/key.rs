//! Cache keys and the file names derived from them.
//!
//! A key is the canonical absolute URL of the cached resource:
//! `http://host[:port]/path[?query]`.
//!
//! * the host is lower-cased and loses one trailing dot (`Example.COM.` → `example.com`); an
//!   IPv6 literal is written in brackets;
//! * port 80 (the `http` default) is left out, any other port is kept;
//! * an empty path becomes `/`; a fragment (`#…`, never sent to an origin) is dropped;
//! * with `ignore_query` everything from the first `?` is dropped;
//! * the path and query are otherwise kept byte for byte — no percent-decoding, so two
//!   spellings of one URL are two keys (safe: the cache never merges what the origin may
//!   distinguish).
//!
//! Responses that vary on request headers are stored under [`super::policy::variant_key`]s
//! built on top of this key.

use sha2::{Digest, Sha256};

/// The canonical cache key for a plain-HTTP request (see the [module docs](self)).
pub fn cache_key(host: &str, port: u16, path_and_query: &str, ignore_query: bool) -> String {
    let host = host.strip_suffix('.').unwrap_or(host);
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ipv6 = bare.contains(':');

    let mut target = path_and_query;
    if let Some(i) = target.find('#') {
        target = target.get(..i).unwrap_or(target);
    }
    if ignore_query {
        if let Some(i) = target.find('?') {
            target = target.get(..i).unwrap_or(target);
        }
    }

    let mut key = String::with_capacity(16 + bare.len() + target.len());
    key.push_str("http://");
    if ipv6 {
        key.push('[');
    }
    key.extend(bare.chars().map(|c| c.to_ascii_lowercase()));
    if ipv6 {
        key.push(']');
    }
    if port != 80 {
        key.push(':');
        key.push_str(&port.to_string());
    }
    if !target.starts_with('/') {
        key.push('/');
    }
    key.push_str(target);
    key
}

/// The file-name stem of the entry stored under `key`: the first 16 bytes (128 bits) of the
/// SHA-256 digest of the key's UTF-8 bytes, as 32 lower-case hex digits.
///
/// SHA-256 is fixed by FIPS 180-4, so the stem is the same on every platform, architecture
/// and version of this program (files written before an upgrade are found after it), and two
/// keys colliding — one URL's file served for another — would need a SHA-256 collision on
/// the first 128 bits, which nobody can construct (unlike with a fast non-cryptographic
/// hash, where a client could craft URLs that collide). The entry header also stores the
/// key, so a reader can confirm it.
pub fn file_stem(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut out = String::with_capacity(32);
    for b in digest.iter().take(16) {
        out.push(hex_digit(b >> 4));
        out.push(hex_digit(b & 0x0f));
    }
    out
}

fn hex_digit(n: u8) -> char {
    char::from_digit(u32::from(n), 16).unwrap_or('0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form() {
        assert_eq!(
            cache_key("Example.COM", 80, "/a/B?x=1", false),
            "http://example.com/a/B?x=1"
        );
        assert_eq!(
            cache_key("example.com.", 80, "/", false),
            "http://example.com/"
        );
        assert_eq!(
            cache_key("example.com", 8080, "/f", false),
            "http://example.com:8080/f"
        );
        assert_eq!(
            cache_key("example.com", 80, "", false),
            "http://example.com/"
        );
        assert_eq!(
            cache_key("example.com", 80, "?q", false),
            "http://example.com/?q"
        );
        assert_eq!(
            cache_key("example.com", 443, "/x", false),
            "http://example.com:443/x"
        );
    }

    #[test]
    fn query_and_fragment() {
        assert_eq!(
            cache_key("h", 80, "/f.bin?token=abc&x=1", true),
            "http://h/f.bin"
        );
        assert_eq!(cache_key("h", 80, "/f.bin?", true), "http://h/f.bin");
        assert_eq!(cache_key("h", 80, "/f.bin?", false), "http://h/f.bin?");
        assert_eq!(cache_key("h", 80, "/f#frag", false), "http://h/f");
        assert_eq!(cache_key("h", 80, "/f?a#frag?b", true), "http://h/f");
        assert_eq!(cache_key("h", 80, "/f?a#frag", false), "http://h/f?a");
        // bytes are kept as given: no percent-decoding, case of the path kept
        assert_eq!(cache_key("h", 80, "/%41b", false), "http://h/%41b");
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(cache_key("::1", 80, "/", false), "http://[::1]/");
        assert_eq!(cache_key("[::1]", 8080, "/", false), "http://[::1]:8080/");
        assert_eq!(
            cache_key("[2001:DB8::1]", 80, "/x", false),
            "http://[2001:db8::1]/x"
        );
        assert_eq!(
            cache_key("127.0.0.1", 80, "/x", false),
            "http://127.0.0.1/x"
        );
    }

    #[test]
    fn file_stem_is_stable_sha256_prefix() {
        // SHA-256("") = e3b0c44298fc1c149afbf4c8996fb924 27ae41e4649b934ca495991b7852b855
        assert_eq!(file_stem(""), "e3b0c44298fc1c149afbf4c8996fb924");
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
        assert_eq!(file_stem("abc"), "ba7816bf8f01cfea414140de5dae2223");
        let a = file_stem("http://example.com/a");
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(a, file_stem("http://example.com/b"));
        assert_eq!(a, file_stem("http://example.com/a"));
    }
}
