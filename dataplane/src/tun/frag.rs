//! IPv4 fragment reassembly for the TUN path. Runtime-free.
//!
//! A UDP datagram larger than the TUN's MTU enters the device as IPv4 fragments (the kernel
//! fragments what an application sends, and what the data plane's VPN UDP socket replies); only
//! the first fragment carries the ports, so the NAT can rewrite nothing until the datagram is
//! whole. The pump hands each fragment to [`Reassembler::add`]; the completed datagram (one IPv4
//! packet of up to 64 KiB) is translated like any other packet and written back whole (the
//! receiving stack takes a packet larger than the device's MTU).
//!
//! Bounded like the kernel's own reassembly (`ipfrag_time`, `ipfrag_high_thresh`): at most
//! [`Limits::datagrams`] datagrams and [`Limits::bytes`] buffered bytes at once, each datagram at
//! most 65535 bytes and [`Limits::fragments`] fragments, and a datagram still incomplete
//! [`Limits::timeout`] seconds after its first fragment is freed. Overlapping fragments discard
//! the whole datagram (as Linux does since the FragmentSmack fixes, RFC 5722's rule); an exact
//! duplicate is ignored. No input panics: every offset is checked before it is used.

use std::collections::HashMap;
use std::net::Ipv4Addr;

/// Largest IPv4 packet (the total length field).
const MAX_PACKET: usize = u16::MAX as usize;

/// The bounds of a [`Reassembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Datagrams being reassembled at once.
    pub datagrams: usize,
    /// Buffered payload bytes over all of them.
    pub bytes: usize,
    /// Fragments of one datagram (65535 bytes at an MTU of 576 need 122).
    pub fragments: usize,
    /// Seconds from a datagram's first fragment until an incomplete one is freed (Linux's
    /// `ipfrag_time` is 30).
    pub timeout: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            datagrams: 256,
            bytes: 4 << 20,
            fragments: 256,
            timeout: 30,
        }
    }
}

/// Why a fragment (and, except for `Malformed`, the datagram it belongs to) was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragDrop {
    /// Not a well-formed IPv4 fragment (lengths, a middle fragment not a multiple of 8 bytes).
    Malformed,
    /// The datagram would exceed 65535 bytes.
    TooLarge,
    /// The fragment overlaps another one (not an exact duplicate), or disagrees on the end.
    Overlap,
    /// The datagram has too many fragments.
    TooManyFragments,
    /// The datagram or byte bound is reached.
    Full,
}

/// What [`Reassembler::add`] did with a fragment.
#[derive(Debug, PartialEq, Eq)]
pub enum Reassembly {
    /// Kept; the datagram is not complete yet (or the fragment was an exact duplicate).
    Held,
    /// The datagram is complete: one unfragmented IPv4 packet, header checksum recomputed.
    Complete(Vec<u8>),
    Dropped(FragDrop),
}

/// RFC 791's identity of a datagram: source, destination, protocol and identification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    id: u16,
}

struct Pending {
    /// The IP header of the fragment at offset 0, once it arrived (its options are the
    /// datagram's).
    header: Option<Vec<u8>>,
    /// Payload bytes by offset; grows as fragments arrive.
    data: Vec<u8>,
    /// `(start, end)` of the fragments received, sorted and disjoint.
    ranges: Vec<(usize, usize)>,
    received: usize,
    /// The payload's length, once the last fragment (more-fragments clear) arrived.
    total: Option<usize>,
    first_seen: u64,
}

impl Pending {
    /// Bytes this datagram holds against [`Limits::bytes`].
    fn cost(&self) -> usize {
        self.data.len() + self.header.as_ref().map_or(0, Vec::len)
    }
}

/// Counters of what reassembly did (the pump adds them to its own statistics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FragCounts {
    pub reassembled: u64,
    /// Fragments dropped ([`FragDrop`]) plus datagrams freed incomplete by the timeout.
    pub dropped: u64,
    pub timed_out: u64,
}

/// The pump's reassembly state (never shared).
pub struct Reassembler {
    limits: Limits,
    pending: HashMap<Key, Pending>,
    bytes: usize,
    pub counts: FragCounts,
}

/// An IPv4 packet that is a fragment (more-fragments set or a non-zero offset).
pub fn is_fragment(p: &[u8]) -> bool {
    p.len() >= 20 && p[0] >> 4 == 4 && u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0
}

/// The IPv4 header checksum of `header` (its checksum field taken as zero).
fn header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for (i, w) in header.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Reassembler {
    pub fn new(limits: Limits) -> Self {
        Reassembler {
            limits,
            pending: HashMap::new(),
            bytes: 0,
            counts: FragCounts::default(),
        }
    }

    /// Datagrams being reassembled.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Buffered bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn discard(&mut self, key: &Key) {
        if let Some(p) = self.pending.remove(key) {
            self.bytes -= p.cost();
        }
    }

    fn drop_datagram(&mut self, key: &Key, why: FragDrop) -> Reassembly {
        self.discard(key);
        self.counts.dropped += 1;
        Reassembly::Dropped(why)
    }

    /// Takes one IPv4 fragment (see [`is_fragment`]); `now` is in seconds.
    pub fn add(&mut self, p: &[u8], now: u64) -> Reassembly {
        let Some(Fragment {
            key,
            header,
            offset,
            more,
            payload,
        }) = split(p)
        else {
            self.counts.dropped += 1;
            return Reassembly::Dropped(FragDrop::Malformed);
        };
        let (start, end) = (offset, offset + payload.len());
        if header.len() + end > MAX_PACKET {
            return self.drop_datagram(&key, FragDrop::TooLarge);
        }
        if !self.pending.contains_key(&key) {
            if self.pending.len() >= self.limits.datagrams {
                self.counts.dropped += 1;
                return Reassembly::Dropped(FragDrop::Full);
            }
            self.pending.insert(
                key,
                Pending {
                    header: None,
                    data: Vec::new(),
                    ranges: Vec::new(),
                    received: 0,
                    total: None,
                    first_seen: now,
                },
            );
        }
        let limits = self.limits;
        let Some(d) = self.pending.get_mut(&key) else {
            return Reassembly::Held;
        };
        // where the fragment goes among the received ones: an exact duplicate is ignored, any
        // other overlap discards the datagram
        let at = d.ranges.partition_point(|&(s, _)| s < start);
        if d.ranges.get(at) == Some(&(start, end)) {
            return Reassembly::Held;
        }
        let overlaps_next = d.ranges.get(at).is_some_and(|&(s, _)| s < end);
        let overlaps_prev = at > 0 && d.ranges[at - 1].1 > start;
        let end_disagrees = match (more, d.total) {
            (false, Some(total)) => total != end,
            (false, None) => d.ranges.last().is_some_and(|&(_, e)| e > end),
            (true, Some(total)) => end > total,
            (true, None) => false,
        };
        if overlaps_next || overlaps_prev || end_disagrees || (start == end && more) {
            return self.drop_datagram(&key, FragDrop::Overlap);
        }
        if d.ranges.len() >= limits.fragments {
            return self.drop_datagram(&key, FragDrop::TooManyFragments);
        }
        let grow = end.saturating_sub(d.data.len())
            + if start == 0 && d.header.is_none() {
                header.len()
            } else {
                0
            };
        if self.bytes + grow > limits.bytes {
            return self.drop_datagram(&key, FragDrop::Full);
        }
        self.bytes += grow;
        if d.data.len() < end {
            d.data.resize(end, 0);
        }
        d.data[start..end].copy_from_slice(payload);
        if start == 0 {
            d.header = Some(header.to_vec());
        }
        if !more {
            d.total = Some(end);
        }
        d.ranges.insert(at, (start, end));
        d.received += end - start;
        let complete = d.header.is_some() && d.total == Some(d.received);
        if !complete {
            return Reassembly::Held;
        }
        if d.cost() > MAX_PACKET {
            // the first fragment's header (options) and the payload together
            return self.drop_datagram(&key, FragDrop::TooLarge);
        }
        let Some(d) = self.pending.remove(&key) else {
            return Reassembly::Held;
        };
        self.bytes -= d.cost();
        self.counts.reassembled += 1;
        Reassembly::Complete(assemble(d))
    }

    /// Frees datagrams whose first fragment is [`Limits::timeout`] seconds old or older;
    /// returns how many.
    pub fn sweep(&mut self, now: u64) -> usize {
        let timeout = self.limits.timeout;
        let before = self.pending.len();
        let mut freed_bytes = 0;
        self.pending.retain(|_, d| {
            let keep = now.saturating_sub(d.first_seen) < timeout;
            if !keep {
                freed_bytes += d.cost();
            }
            keep
        });
        self.bytes -= freed_bytes;
        let freed = before - self.pending.len();
        self.counts.timed_out += freed as u64;
        self.counts.dropped += freed as u64;
        freed
    }
}

/// One fragment, read.
struct Fragment<'a> {
    key: Key,
    header: &'a [u8],
    /// Where its payload starts in the datagram's payload.
    offset: usize,
    /// More fragments follow (it is not the last).
    more: bool,
    payload: &'a [u8],
}

/// Reads a fragment; `None` when it is not a well-formed IPv4 fragment.
fn split(p: &[u8]) -> Option<Fragment<'_>> {
    let first = *p.first()?;
    if first >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(first & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*p.get(2)?, *p.get(3)?]));
    if ihl < 20 || total < ihl || total > p.len() {
        return None;
    }
    let frag = u16::from_be_bytes([p[6], p[7]]);
    let more = frag & 0x2000 != 0;
    let offset = usize::from(frag & 0x1fff) * 8;
    let payload = &p[ihl..total];
    // only the last fragment may end off an 8-byte boundary (the next one's offset is in units
    // of 8)
    if more && !payload.len().is_multiple_of(8) {
        return None;
    }
    let ip = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
    let key = Key {
        src: ip(12),
        dst: ip(16),
        protocol: p[9],
        id: u16::from_be_bytes([p[4], p[5]]),
    };
    Some(Fragment {
        key,
        header: &p[..ihl],
        offset,
        more,
        payload,
    })
}

/// The whole datagram: the first fragment's header with the total length, no fragment bits
/// (the don't-fragment and reserved bits kept) and a fresh checksum, then the payload.
fn assemble(d: Pending) -> Vec<u8> {
    let header = d.header.unwrap_or_default();
    let mut p = Vec::with_capacity(header.len() + d.data.len());
    p.extend_from_slice(&header);
    p.extend_from_slice(&d.data);
    let total = p.len() as u16;
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[6] &= 0xc0;
    p[7] = 0;
    let check = header_checksum(&p[..header.len()]);
    p[10..12].copy_from_slice(&check.to_be_bytes());
    p
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The unfragmented UDP datagram `payload` from 10.255.0.2:5000 to 192.0.2.7:53 (id 0x1234;
    /// the UDP checksum is left 0, none, as the reassembler never reads it).
    pub(crate) fn datagram(payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 255, 0, 2]);
        p[16..20].copy_from_slice(&[192, 0, 2, 7]);
        p[20..22].copy_from_slice(&5000u16.to_be_bytes());
        p[22..24].copy_from_slice(&53u16.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(payload);
        let check = header_checksum(&p[..20]);
        p[10..12].copy_from_slice(&check.to_be_bytes());
        p
    }

    /// The fragment of `whole` (an unfragmented packet with a 20-byte header) holding its IP
    /// payload bytes `start..end`, as the kernel would send it.
    fn fragment(whole: &[u8], start: usize, end: usize) -> Vec<u8> {
        let body = &whole[20..];
        let more = end < body.len();
        let mut p = whole[..20].to_vec();
        p.extend_from_slice(&body[start..end]);
        p[2..4].copy_from_slice(&((20 + end - start) as u16).to_be_bytes());
        let frag = (start / 8) as u16 | if more { 0x2000 } else { 0 };
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        let check = header_checksum(&p[..20]);
        p[10..12].copy_from_slice(&check.to_be_bytes());
        p
    }

    /// `whole` cut into fragments of `size` payload bytes (a multiple of 8).
    pub(crate) fn fragments(whole: &[u8], size: usize) -> Vec<Vec<u8>> {
        let len = whole.len() - 20;
        (0..len)
            .step_by(size)
            .map(|s| fragment(whole, s, (s + size).min(len)))
            .collect()
    }

    pub(crate) fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn complete(r: Reassembly) -> Vec<u8> {
        match r {
            Reassembly::Complete(p) => p,
            other => panic!("not complete: {other:?}"),
        }
    }

    #[test]
    fn fragments_in_order_give_back_the_datagram() {
        let whole = datagram(&payload(4000));
        let frags = fragments(&whole, 1400);
        assert_eq!(frags.len(), 3);
        assert!(frags.iter().all(|f| is_fragment(f)));
        assert!(!is_fragment(&whole));
        let mut r = Reassembler::new(Limits::default());
        assert_eq!(r.add(&frags[0], 0), Reassembly::Held);
        assert_eq!(r.add(&frags[1], 0), Reassembly::Held);
        assert!(r.bytes() > 0);
        assert_eq!(complete(r.add(&frags[2], 0)), whole);
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        assert_eq!(r.counts.reassembled, 1);
    }

    #[test]
    fn out_of_order_and_duplicate_fragments_give_back_the_datagram() {
        let whole = datagram(&payload(9000));
        let frags = fragments(&whole, 1480);
        let mut r = Reassembler::new(Limits::default());
        let last = frags.len() - 1;
        assert_eq!(r.add(&frags[last], 0), Reassembly::Held);
        for i in (1..last).rev() {
            assert_eq!(r.add(&frags[i], 1), Reassembly::Held);
        }
        // an exact duplicate changes nothing
        assert_eq!(r.add(&frags[2], 1), Reassembly::Held);
        assert_eq!(complete(r.add(&frags[0], 2)), whole);
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        // the DF bit of the first fragment stays; the fragment bits go
        let mut df = whole.clone();
        df[6] = 0x40;
        let mut frags = fragments(&df, 1480);
        for f in &mut frags {
            f[6] |= 0x40;
        }
        for f in &frags[..frags.len() - 1] {
            assert_eq!(r.add(f, 3), Reassembly::Held);
        }
        let back = complete(r.add(&frags[frags.len() - 1], 3));
        assert_eq!((back[6], back[7]), (0x40, 0));
        assert_eq!(
            u16::from_be_bytes([back[10], back[11]]),
            header_checksum(&back[..20])
        );
    }

    #[test]
    fn overlapping_fragments_discard_the_datagram() {
        let whole = datagram(&payload(3000));
        let mut r = Reassembler::new(Limits::default());
        assert_eq!(r.add(&fragment(&whole, 0, 1600), 0), Reassembly::Held);
        assert_eq!(
            r.add(&fragment(&whole, 1200, 2400), 0),
            Reassembly::Dropped(FragDrop::Overlap)
        );
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        // the rest arriving later cannot complete it (its start is gone)
        assert_eq!(r.add(&fragment(&whole, 1600, 3008), 0), Reassembly::Held);
        assert_eq!(r.pending(), 1);
        // a fragment inside another one, and two last fragments that disagree
        let mut r = Reassembler::new(Limits::default());
        assert_eq!(r.add(&fragment(&whole, 800, 2400), 0), Reassembly::Held);
        assert_eq!(
            r.add(&fragment(&whole, 1600, 1608), 0),
            Reassembly::Dropped(FragDrop::Overlap)
        );
        assert_eq!(r.add(&fragment(&whole, 2400, 3008), 0), Reassembly::Held);
        // claims to be the last fragment, ending before data already received
        let mut early_end = fragment(&whole, 800, 2000);
        early_end[6] &= !0x20;
        assert_eq!(r.add(&early_end, 0), Reassembly::Dropped(FragDrop::Overlap));
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        assert_eq!(r.counts.dropped, 2);
    }

    #[test]
    fn a_datagram_past_64_kib_and_malformed_fragments_are_dropped() {
        let whole = datagram(&payload(1000));
        let mut r = Reassembler::new(Limits::default());
        assert_eq!(r.add(&fragment(&whole, 0, 1000), 0), Reassembly::Held);
        // offset 8191 * 8 = 65528: a payload ending past 65535 - 20
        let mut far = fragment(&whole, 0, 16);
        far[6..8].copy_from_slice(&0x1fffu16.to_be_bytes());
        assert_eq!(r.add(&far, 0), Reassembly::Dropped(FragDrop::TooLarge));
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        // a middle fragment off the 8-byte grid, lengths past the buffer, not IPv4
        let mut odd = fragment(&whole, 0, 1000);
        odd[2..4].copy_from_slice(&(20u16 + 999).to_be_bytes());
        assert_eq!(r.add(&odd, 0), Reassembly::Dropped(FragDrop::Malformed));
        let mut long = fragment(&whole, 0, 1000);
        long[2..4].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(r.add(&long, 0), Reassembly::Dropped(FragDrop::Malformed));
        assert_eq!(
            r.add(&[0x60; 40], 0),
            Reassembly::Dropped(FragDrop::Malformed)
        );
        // no input panics, whatever its bytes
        for len in 0..64 {
            for seed in 0..32u32 {
                let mut junk: Vec<u8> = (0..len)
                    .map(|i| (i as u32 * 37 + seed * 101) as u8)
                    .collect();
                if let Some(first) = junk.first_mut() {
                    *first = 0x45 + (seed % 3) as u8;
                }
                let _ = r.add(&junk, 0);
            }
        }
    }

    #[test]
    fn an_incomplete_datagram_is_freed_after_the_timeout() {
        let whole = datagram(&payload(3000));
        let limits = Limits::default();
        let mut r = Reassembler::new(limits);
        assert_eq!(r.add(&fragment(&whole, 0, 1480), 5), Reassembly::Held);
        assert_eq!(r.sweep(5 + limits.timeout - 1), 0);
        assert_eq!(r.pending(), 1);
        assert_eq!(r.sweep(5 + limits.timeout), 1);
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        assert_eq!(r.counts.timed_out, 1);
        // the rest arriving afterwards starts afresh and never completes the old one
        assert_eq!(r.add(&fragment(&whole, 1480, 3008), 40), Reassembly::Held);
    }

    #[test]
    fn the_datagram_byte_and_fragment_bounds_hold() {
        let limits = Limits {
            datagrams: 2,
            bytes: 3000,
            fragments: 4,
            timeout: 30,
        };
        let mut r = Reassembler::new(limits);
        let with_id = |id: u16, len: usize| {
            let mut p = datagram(&payload(len));
            p[4..6].copy_from_slice(&id.to_be_bytes());
            p
        };
        let (a, b, c) = (with_id(1, 4000), with_id(2, 4000), with_id(3, 4000));
        assert_eq!(r.add(&fragment(&a, 0, 1000), 0), Reassembly::Held);
        assert_eq!(r.add(&fragment(&b, 0, 1000), 0), Reassembly::Held);
        // a third datagram does not fit; the two held ones go on
        assert_eq!(
            r.add(&fragment(&c, 0, 1000), 0),
            Reassembly::Dropped(FragDrop::Full)
        );
        assert_eq!(r.pending(), 2);
        // 2 × 1020 bytes held: a's next 1000 would pass 3000, so a is discarded, b goes on
        assert_eq!(
            r.add(&fragment(&a, 1000, 2000), 0),
            Reassembly::Dropped(FragDrop::Full)
        );
        assert_eq!((r.pending(), r.bytes()), (1, 1020));
        assert_eq!(r.add(&fragment(&b, 1000, 2000), 0), Reassembly::Held);
        assert!(r.bytes() <= limits.bytes);
        // a datagram of more fragments than allowed
        let d = with_id(4, 800);
        for s in (0..32).step_by(8) {
            assert_eq!(r.add(&fragment(&d, s, s + 8), 0), Reassembly::Held);
        }
        assert_eq!(
            r.add(&fragment(&d, 32, 40), 0),
            Reassembly::Dropped(FragDrop::TooManyFragments)
        );
        assert_eq!(r.pending(), 1);
        r.sweep(30);
        assert_eq!((r.pending(), r.bytes()), (0, 0));
    }
}
