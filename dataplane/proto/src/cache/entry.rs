//! The on-disk format of a cache entry: a header block followed by the body.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "SYCACHE\n"
//!      8     2  format version (1), little endian
//!     10     2  flags (0; readers reject unknown bits)
//!     12     4  meta length M
//!     16     4  header block length H (a multiple of 4096, at least 24 + M)
//!     20     4  header checksum: CRC-32C of bytes 0..20 followed by the M meta bytes
//!     24     M  meta (below)
//!   24+M     …  zero padding up to H
//!      H        body (EntryMeta::body_len bytes, CRC-32C = EntryMeta::body_checksum)
//! ```
//!
//! Meta, all integers little endian, strings and byte strings as a `u32` length then the
//! bytes: `key`, `url`, `host`, `status: u16`, `content_type`, `body_len: u64`,
//! `body_checksum: u32`, `created_unix: u64`, `expires_unix: u64`, then a `u32` header count
//! and per header `name`, `value`. Strings must be UTF-8.
//!
//! The body starts at a multiple of 4096 so it can be read with `O_DIRECT` / DMA reads
//! straight into aligned buffers. Both checksums are CRC-32C (hardware-accelerated on x86-64
//! SSE 4.2 and ARMv8): the header's is checked on every decode, the body's by the store when
//! it verifies an entry (see [`BodyChecksum`]). Combined with write-to-temporary-then-rename,
//! this means a torn or corrupted file is detected, never served.
//!
//! [`decode_header`] never panics: every length is checked against the input and against
//! [`MAX_HEADER_LEN`] before use.

/// Alignment of the body within the file, and granularity of the header block.
pub const BLOCK: usize = 4096;

/// Largest header block accepted by [`decode_header`] and [`header_len_hint`] (4 MiB): far
/// above any real entry (request and response heads are bounded by the proxy's head limits),
/// small enough that a corrupt length cannot make a reader allocate much.
pub const MAX_HEADER_LEN: usize = 4 << 20;

/// Current format version.
pub const FORMAT_VERSION: u16 = 1;

const MAGIC: &[u8; 8] = b"SYCACHE\n";
const FIXED: usize = 24;

/// What an entry file's header says about the entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntryMeta {
    /// The cache key (possibly a `Vary` variant key).
    pub key: String,
    /// The URL requested (`http://host/path?query` as fetched from the origin).
    pub url: String,
    /// Lower-case host name, for per-domain listing and deletion.
    pub host: String,
    /// Response status (200).
    pub status: u16,
    /// Response headers to replay (see [`super::policy::stored_headers`]).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The response's `Content-Type` (empty when none).
    pub content_type: String,
    /// Body length in bytes.
    pub body_len: u64,
    /// CRC-32C of the body.
    pub body_checksum: u32,
    /// When the entry was stored, seconds since the Unix epoch.
    pub created_unix: u64,
    /// When the entry stops being fresh, seconds since the Unix epoch.
    pub expires_unix: u64,
}

impl EntryMeta {
    /// The first stored header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Why an entry header was rejected. Always the file's fault (torn write, corruption, another
/// format): the store discards the entry and treats the request as a miss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Fewer bytes than the header needs; read at least `need` bytes and retry.
    #[error("entry header truncated: {need} bytes needed")]
    Truncated { need: usize },
    #[error("not a cache entry (bad magic)")]
    BadMagic,
    #[error("unsupported entry format version {0} (flags {1:#x})")]
    UnsupportedVersion(u16, u16),
    #[error("entry header has inconsistent lengths")]
    BadLength,
    #[error("entry header checksum mismatch")]
    Checksum,
    #[error("malformed entry header: {0}")]
    Malformed(&'static str),
}

/// Encodes the header block of `meta`: a multiple of [`BLOCK`] bytes, after which the body
/// follows. A block larger than [`MAX_HEADER_LEN`] (megabytes of headers) would be rejected
/// by readers; callers store such entries nowhere.
pub fn encode_header(meta: &EntryMeta) -> Vec<u8> {
    let mut m = Vec::with_capacity(
        64 + meta.key.len()
            + meta.url.len()
            + meta.host.len()
            + meta
                .headers
                .iter()
                .map(|(n, v)| 8 + n.len() + v.len())
                .sum::<usize>(),
    );
    put_bytes(&mut m, meta.key.as_bytes());
    put_bytes(&mut m, meta.url.as_bytes());
    put_bytes(&mut m, meta.host.as_bytes());
    m.extend_from_slice(&meta.status.to_le_bytes());
    put_bytes(&mut m, meta.content_type.as_bytes());
    m.extend_from_slice(&meta.body_len.to_le_bytes());
    m.extend_from_slice(&meta.body_checksum.to_le_bytes());
    m.extend_from_slice(&meta.created_unix.to_le_bytes());
    m.extend_from_slice(&meta.expires_unix.to_le_bytes());
    put_u32(&mut m, meta.headers.len());
    for (name, value) in &meta.headers {
        put_bytes(&mut m, name.as_bytes());
        put_bytes(&mut m, value);
    }

    let block_len = (FIXED + m.len()).div_ceil(BLOCK) * BLOCK;
    let mut out = Vec::with_capacity(block_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    put_u32(&mut out, m.len());
    put_u32(&mut out, block_len);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), &m);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&m);
    out.resize(block_len, 0);
    out
}

/// Lengths above `u32::MAX` cannot occur for in-memory headers of sane size; saturate so the
/// decoder rejects such a block instead of misreading it.
fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

/// From the first bytes of a file (at least 24; one [`BLOCK`] is the natural read), the length
/// of the header block, i.e. how much to read before calling [`decode_header`] and where
/// the body starts. `None` if the bytes do not start a valid header of this format.
pub fn header_len_hint(first: &[u8]) -> Option<usize> {
    let (version, flags, meta_len, block_len) = fixed_fields(first).ok()?;
    (version == FORMAT_VERSION && flags == 0 && lengths_ok(meta_len, block_len))
        .then_some(block_len)
}

fn lengths_ok(meta_len: usize, block_len: usize) -> bool {
    block_len.is_multiple_of(BLOCK)
        && block_len <= MAX_HEADER_LEN
        && FIXED.checked_add(meta_len).is_some_and(|n| n <= block_len)
}

/// (version, flags, meta length, block length) after checking the magic.
fn fixed_fields(b: &[u8]) -> Result<(u16, u16, usize, usize), EntryError> {
    if b.len() < FIXED {
        let n = b.len().min(MAGIC.len());
        if b.get(..n) != MAGIC.get(..n) {
            return Err(EntryError::BadMagic);
        }
        return Err(EntryError::Truncated { need: FIXED });
    }
    let mut r = Reader { b, pos: 0 };
    if r.take(MAGIC.len())? != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = r.u16()?;
    let flags = r.u16()?;
    let meta_len = r.len()?;
    let block_len = r.len()?;
    Ok((version, flags, meta_len, block_len))
}

/// Decodes a header block (the padding after the meta need not be present). Returns the meta
/// and the header block length (the body's offset in the file). Never panics.
pub fn decode_header(bytes: &[u8]) -> Result<(EntryMeta, usize), EntryError> {
    let (version, flags, meta_len, block_len) = fixed_fields(bytes)?;
    if version != FORMAT_VERSION || flags != 0 {
        return Err(EntryError::UnsupportedVersion(version, flags));
    }
    if !lengths_ok(meta_len, block_len) {
        return Err(EntryError::BadLength);
    }
    let meta_end = FIXED + meta_len;
    let (Some(prefix), Some(stored_crc), Some(meta_bytes)) = (
        bytes.get(..20),
        bytes.get(20..FIXED),
        bytes.get(FIXED..meta_end),
    ) else {
        return Err(EntryError::Truncated { need: meta_end });
    };
    let crc = crc32c::crc32c_append(crc32c::crc32c(prefix), meta_bytes);
    if stored_crc != crc.to_le_bytes() {
        return Err(EntryError::Checksum);
    }

    let mut r = Reader {
        b: meta_bytes,
        pos: 0,
    };
    let key = r.string()?;
    let url = r.string()?;
    let host = r.string()?;
    let status = r.u16()?;
    let content_type = r.string()?;
    let body_len = r.u64()?;
    let body_checksum = r.u32()?;
    let created_unix = r.u64()?;
    let expires_unix = r.u64()?;
    let count = r.len()?;
    // Each header takes at least 8 bytes: bound the allocation by what is left.
    let mut headers = Vec::with_capacity(count.min(r.remaining() / 8));
    for _ in 0..count {
        let name = r.string()?;
        let value = r.bytes()?.to_vec();
        headers.push((name, value));
    }
    if r.remaining() != 0 {
        return Err(EntryError::Malformed("trailing bytes after the headers"));
    }
    Ok((
        EntryMeta {
            key,
            url,
            host,
            status,
            headers,
            content_type,
            body_len,
            body_checksum,
            created_unix,
            expires_unix,
        },
        block_len,
    ))
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.b.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(EntryError::Malformed("length overflow"))?;
        let s = self
            .b
            .get(self.pos..end)
            .ok_or(EntryError::Malformed("field runs past the meta section"))?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], EntryError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, EntryError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, EntryError> {
        self.array().map(u32::from_le_bytes)
    }

    /// A `u32` length or count.
    fn len(&mut self) -> Result<usize, EntryError> {
        self.u32().map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn u64(&mut self) -> Result<u64, EntryError> {
        self.array().map(u64::from_le_bytes)
    }

    fn bytes(&mut self) -> Result<&'a [u8], EntryError> {
        let n = self.len()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, EntryError> {
        let b = self.bytes()?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| EntryError::Malformed("string is not UTF-8"))
    }
}

/// Incremental CRC-32C of a body, fed in the order the bytes are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyChecksum {
    crc: u32,
}

impl BodyChecksum {
    /// The checksum of nothing (0).
    pub fn new() -> Self {
        BodyChecksum { crc: 0 }
    }

    /// Adds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }

    /// The CRC-32C of everything added so far.
    pub fn finish(&self) -> u32 {
        self.crc
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> EntryMeta {
        EntryMeta {
            key: "http://example.com/f.bin".into(),
            url: "http://example.com/f.bin?x=1".into(),
            host: "example.com".into(),
            status: 200,
            headers: vec![
                ("Content-Type".into(), b"application/octet-stream".to_vec()),
                ("ETag".into(), b"\"abc\"".to_vec()),
                ("X-Bin".into(), vec![0, 255, 10, 13]),
            ],
            content_type: "application/octet-stream".into(),
            body_len: 123_456_789_012,
            body_checksum: 0xdead_beef,
            created_unix: 1_700_000_000,
            expires_unix: 1_800_000_000,
        }
    }

    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        fn text(&mut self, max: usize) -> String {
            let n = self.below(max + 1);
            (0..n)
                .map(|_| {
                    let c = self.below(0x250) as u32;
                    char::from_u32(c).unwrap_or('x')
                })
                .collect()
        }
    }

    fn random_meta(rng: &mut XorShift) -> EntryMeta {
        let headers = (0..rng.below(20))
            .map(|_| {
                let name = rng.text(20);
                let value = (0..rng.below(200)).map(|_| rng.next() as u8).collect();
                (name, value)
            })
            .collect();
        EntryMeta {
            key: rng.text(3000),
            url: rng.text(300),
            host: rng.text(60),
            status: rng.next() as u16,
            headers,
            content_type: rng.text(40),
            body_len: rng.next(),
            body_checksum: rng.next() as u32,
            created_unix: rng.next(),
            expires_unix: rng.next(),
        }
    }

    #[test]
    fn round_trip_and_alignment() {
        let meta = sample();
        let block = encode_header(&meta);
        assert_eq!(block.len(), BLOCK);
        assert_eq!(&block[..8], b"SYCACHE\n");
        assert_eq!(header_len_hint(&block[..24]), Some(BLOCK));
        assert_eq!(header_len_hint(&block), Some(BLOCK));
        let (back, len) = decode_header(&block).unwrap();
        assert_eq!(back, meta);
        assert_eq!(len, BLOCK);
        assert_eq!(back.header("etag"), Some(b"\"abc\"".as_slice()));
        assert_eq!(back.header("nope"), None);
        // the padding need not be there
        let used = 24 + u32::from_le_bytes(block[12..16].try_into().unwrap()) as usize;
        assert_eq!(decode_header(&block[..used]).unwrap().0, meta);
        // and a body after the block is ignored
        let mut file = block.clone();
        file.extend_from_slice(b"body bytes");
        assert_eq!(decode_header(&file).unwrap().1, BLOCK);

        let empty = EntryMeta::default();
        let block = encode_header(&empty);
        assert_eq!(block.len(), BLOCK);
        assert_eq!(decode_header(&block).unwrap().0, empty);
    }

    #[test]
    fn large_headers_span_several_blocks() {
        let mut meta = sample();
        meta.key = "k".repeat(10_000);
        let block = encode_header(&meta);
        assert_eq!(block.len(), 3 * BLOCK);
        assert_eq!(header_len_hint(&block[..BLOCK]), Some(3 * BLOCK));
        assert_eq!(
            decode_header(&block[..BLOCK]),
            Err(EntryError::Truncated {
                need: 24 + sample_meta_len(&meta)
            })
        );
        assert_eq!(decode_header(&block).unwrap().0, meta);
    }

    fn sample_meta_len(meta: &EntryMeta) -> usize {
        let block = encode_header(meta);
        u32::from_le_bytes(block[12..16].try_into().unwrap()) as usize
    }

    #[test]
    fn truncation_is_reported() {
        let block = encode_header(&sample());
        let used = 24 + sample_meta_len(&sample());
        for n in 0..used {
            let r = decode_header(&block[..n]);
            assert!(
                matches!(r, Err(EntryError::Truncated { need }) if need > n),
                "{n}: {r:?}"
            );
            if n < 24 {
                assert_eq!(header_len_hint(&block[..n]), None);
            }
        }
        assert_eq!(decode_header(b"XY"), Err(EntryError::BadMagic));
    }

    #[test]
    fn corruption_is_detected() {
        let block = encode_header(&sample());
        let used = 24 + sample_meta_len(&sample());
        for i in 0..used {
            for bit in [0x01u8, 0x80] {
                let mut bad = block.clone();
                bad[i] ^= bit;
                assert!(decode_header(&bad).is_err(), "flip at {i}");
            }
        }
        let mut bad = block.clone();
        bad[8] = 2; // version 2
        assert_eq!(
            decode_header(&bad),
            Err(EntryError::UnsupportedVersion(2, 0))
        );
        assert_eq!(header_len_hint(&bad), None);
        let mut bad = block.clone();
        bad[16..20].copy_from_slice(&100u32.to_le_bytes()); // not a multiple of 4096
        assert_eq!(decode_header(&bad), Err(EntryError::BadLength));
        assert_eq!(header_len_hint(&bad), None);
        let mut bad = block.clone();
        bad[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_header(&bad), Err(EntryError::BadLength));
        let mut bad = block.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_header(&bad), Err(EntryError::BadLength));
        // padding is not covered: changing it is harmless
        let mut padded = block.clone();
        padded[BLOCK - 1] = 7;
        assert!(decode_header(&padded).is_ok());
    }

    /// A consistent header (valid checksum) whose meta lies about its field lengths.
    #[test]
    fn lying_lengths_inside_a_valid_checksum() {
        let reseal = |meta: &[u8]| {
            let mut out = Vec::new();
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&1u16.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
            out.extend_from_slice(&(BLOCK as u32).to_le_bytes());
            let crc = crc32c::crc32c_append(crc32c::crc32c(&out), meta);
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(meta);
            out
        };
        // key length says 4 GiB
        assert!(matches!(
            decode_header(&reseal(&u32::MAX.to_le_bytes())),
            Err(EntryError::Malformed(_))
        ));
        // header count says 4 billion, nothing follows
        let mut meta = encode_header(&EntryMeta::default());
        let used = 24 + u32::from_le_bytes(meta[12..16].try_into().unwrap()) as usize;
        meta.truncate(used);
        let mut inner = meta[24..].to_vec();
        let n = inner.len();
        inner[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_header(&reseal(&inner)),
            Err(EntryError::Malformed(_))
        ));
        // trailing garbage
        let mut inner = meta[24..].to_vec();
        inner.push(0);
        assert!(matches!(
            decode_header(&reseal(&inner)),
            Err(EntryError::Malformed(_))
        ));
        // invalid UTF-8 in the key
        let mut inner = meta[24..].to_vec();
        inner.splice(0..4, [1, 0, 0, 0, 0xff]);
        assert!(matches!(
            decode_header(&reseal(&inner)),
            Err(EntryError::Malformed(_))
        ));
    }

    #[test]
    fn randomized_round_trips_and_garbage() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let meta = random_meta(&mut rng);
            let block = encode_header(&meta);
            assert_eq!(block.len() % BLOCK, 0);
            assert_eq!(header_len_hint(&block), Some(block.len()));
            assert_eq!(decode_header(&block).unwrap(), (meta, block.len()));
            // random damage: never a panic, and never a different successful decode
            let mut bad = block.clone();
            let cut = rng.below(bad.len());
            match rng.below(3) {
                0 => bad.truncate(cut),
                1 => bad[cut] ^= (rng.next() as u8) | 1,
                _ => {
                    let n = rng.below(64).min(bad.len() - cut);
                    for b in &mut bad[cut..cut + n] {
                        *b = rng.next() as u8;
                    }
                }
            }
            if let Ok((m, _)) = decode_header(&bad) {
                assert_eq!(encode_header(&m), block, "only padding may differ");
            }
            let _ = header_len_hint(&bad);
        }
        for _ in 0..2000 {
            let mut junk: Vec<u8> = (0..rng.below(200)).map(|_| rng.next() as u8).collect();
            if rng.below(2) == 0 && junk.len() >= 8 {
                junk[..8].copy_from_slice(MAGIC);
            }
            let _ = decode_header(&junk);
            let _ = header_len_hint(&junk);
        }
    }

    #[test]
    fn body_checksum_is_incremental_crc32c() {
        // CRC-32C check value (RFC 3720 / iSCSI): "123456789" → 0xE3069283
        let mut c = BodyChecksum::new();
        c.update(b"1234");
        c.update(b"");
        c.update(b"56789");
        assert_eq!(c.finish(), 0xe306_9283);
        assert_eq!(BodyChecksum::default().finish(), 0);
    }
}
