//! The offload arithmetic of the mesh's batched I/O, runtime-free: cutting the TCP
//! super-packets a TUN device with offloads hands over into the IP packets they stand for
//! (each one is encrypted as its own WireGuard message), finishing a checksum the kernel left
//! to "the device", grouping outgoing datagrams into UDP GSO sends, and reading the segment
//! size of a UDP GRO receive from its control message. Every function takes hostile input:
//! a malformed packet is refused, never a panic.

use crate::tun::packet::complete_checksum;
use crate::tun::vnet::{VnetHeader, F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4};
use std::net::SocketAddr;

/// Most datagrams one `UDP_SEGMENT` send may carry (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Most payload bytes of one `UDP_SEGMENT` send (an IPv4 datagram's limit, with margin).
pub const MAX_GSO_BYTES: usize = 65_000;

/// TCP flags the segmentation moves (FIN and PSH end the super-packet; CWR starts it).
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;

/// IP packets in one buffer (what one hand-off from the device reader carries): fewer
/// allocations and queue operations than one `Vec` per packet.
#[derive(Debug, Default)]
pub struct PacketBatch {
    bytes: Vec<u8>,
    /// End offset of each packet in `bytes`.
    ends: Vec<usize>,
}

impl PacketBatch {
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    pub fn push(&mut self, packet: &[u8]) {
        self.bytes.extend_from_slice(packet);
        self.ends.push(self.bytes.len());
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Packets held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn packets(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let p = &self.bytes[start..end];
            start = end;
            p
        })
    }
}

/// Why a packet read from the device was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Shorter than its headers claim.
    Truncated,
    /// An offload the mesh did not ask for (not IPv4 TCP, a checksum outside the packet).
    Offload,
}

/// The IP packets that the packet `p` read after header `hdr` stands for, appended to `out`:
/// a plain packet as it is, one with a pending checksum with that checksum finished, and a
/// TCPv4 super-packet cut into `gso_size`-byte segments with their own IP and TCP headers and
/// checksums (sequence numbers and IP ids advanced; FIN/PSH on the last segment only, CWR on
/// the first only).
pub fn split(hdr: &VnetHeader, p: &mut [u8], out: &mut PacketBatch) -> Result<(), Refused> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(p, usize::from(hdr.csum_start), usize::from(hdr.csum_offset))
                .ok_or(Refused::Offload)?;
        }
        out.push(p);
        return Ok(());
    }
    if gso != GSO_TCPV4 || hdr.gso_size == 0 {
        return Err(Refused::Offload);
    }
    let (ihl, headers) = tcp_v4_headers(p)?;
    let mss = usize::from(hdr.gso_size);
    let payload_len = p.len() - headers;
    if payload_len <= mss {
        // one segment: only the IP length and the checksums can be stale
        let len = p.len();
        finish_segment(&mut p[..], ihl, len);
        out.push(p);
        return Ok(());
    }
    let (header, payload) = p.split_at(headers);
    let seq = u32::from_be_bytes([
        header[ihl + 4],
        header[ihl + 5],
        header[ihl + 6],
        header[ihl + 7],
    ]);
    let id = u16::from_be_bytes([header[4], header[5]]);
    let flags = header[ihl + 13];
    let count = payload_len.div_ceil(mss);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let start = out.bytes.len();
        out.bytes.extend_from_slice(header);
        out.bytes.extend_from_slice(chunk);
        let seg = &mut out.bytes[start..];
        let offset = u32::try_from(i * mss).unwrap_or(u32::MAX);
        seg[ihl + 4..ihl + 8].copy_from_slice(&seq.wrapping_add(offset).to_be_bytes());
        seg[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        let mut f = flags;
        if i + 1 < count {
            f &= !(FIN | PSH);
        }
        if i > 0 {
            f &= !CWR;
        }
        seg[ihl + 13] = f;
        let len = seg.len();
        finish_segment(seg, ihl, len);
        out.ends.push(out.bytes.len());
    }
    Ok(())
}

/// The IP header length and the IP+TCP header length of an IPv4 TCP packet, checked to lie
/// inside `p`.
fn tcp_v4_headers(p: &[u8]) -> Result<(usize, usize), Refused> {
    if p.len() < 20 {
        return Err(Refused::Truncated);
    }
    if p[0] >> 4 != 4 || p[9] != 6 {
        return Err(Refused::Offload);
    }
    let ihl = usize::from(p[0] & 0x0F) * 4;
    if ihl < 20 || p.len() < ihl + 20 {
        return Err(Refused::Truncated);
    }
    let doff = usize::from(p[ihl + 12] >> 4) * 4;
    if doff < 20 || p.len() < ihl + doff {
        return Err(Refused::Truncated);
    }
    Ok((ihl, ihl + doff))
}

/// Sets the IP total length and both checksums of the segment `seg` (`len` bytes).
fn finish_segment(seg: &mut [u8], ihl: usize, len: usize) {
    let total = u16::try_from(len).unwrap_or(u16::MAX);
    seg[2..4].copy_from_slice(&total.to_be_bytes());
    seg[10] = 0;
    seg[11] = 0;
    let ip = !fold(sum(&seg[..ihl], 0));
    seg[10..12].copy_from_slice(&ip.to_be_bytes());
    let tcp_len = (len - ihl) as u64;
    let pseudo = sum(&seg[12..20], 6 + tcp_len);
    seg[ihl + 16] = 0;
    seg[ihl + 17] = 0;
    let tcp = match !fold(sum(&seg[ihl..], pseudo)) {
        0 => 0xFFFF,
        c => c,
    };
    seg[ihl + 16..ihl + 18].copy_from_slice(&tcp.to_be_bytes());
}

/// The one's-complement sum of `data` as 16-bit big-endian words (an odd last byte padded),
/// added to `seed`, unfolded.
fn sum(data: &[u8], seed: u64) -> u64 {
    let mut acc = seed;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]))
            + u64::from(u16::from_be_bytes([w[2], w[3]]))
            + u64::from(u16::from_be_bytes([w[4], w[5]]))
            + u64::from(u16::from_be_bytes([w[6], w[7]]));
    }
    let mut rest = words.remainder().chunks_exact(2);
    for w in &mut rest {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = rest.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

/// GRO on the device side: consecutive TCP segments of one flow, as the mesh decrypts them,
/// are joined into one super-packet for a TUN device with a virtio-net header (the kernel
/// takes it as one packet, as a NIC's GRO would hand it over), so the receiving stack and the
/// device see one write instead of dozens. Only plain in-order data segments are joined
/// (ACK, PSH on the last one; identical headers but for length, id, sequence number and
/// checksums); anything else is written as it came, after what is held. The joined packet's
/// TCP checksum is left to the kernel (`NEEDS_CSUM`): its segments arrived authenticated
/// by their WireGuard sessions.
#[derive(Debug, Default)]
pub struct Coalescer {
    /// The packet held: the first segment, then the payloads joined to it.
    held: Vec<u8>,
    /// Its IP header length and IP+TCP header length.
    ihl: usize,
    headers: usize,
    /// Payload length of the first segment: the segment size of the super-packet.
    mss: usize,
    segments: usize,
    /// Sequence number the next segment must carry to be joined.
    next_seq: u32,
    /// Whether another segment may still be joined (the last one was full and without PSH).
    open: bool,
}

/// The TCP flags a joined segment may carry (ACK; PSH only on the last).
const ACK: u8 = 0x10;

impl Coalescer {
    /// Takes `packet` for the device: joins it to the held packet, or writes what is held
    /// (through `write`) and holds it, or writes both.
    pub fn push(&mut self, packet: &[u8], write: &mut impl FnMut(VnetHeader, &[u8])) {
        if self.join(packet) {
            return;
        }
        self.flush(write);
        match joinable(packet) {
            Some((ihl, headers, seq, payload)) => {
                self.held.clear();
                self.held.extend_from_slice(packet);
                self.ihl = ihl;
                self.headers = headers;
                self.mss = payload;
                self.segments = 1;
                self.next_seq = seq.wrapping_add(payload as u32);
                self.open = packet[ihl + 13] == ACK;
            }
            None => write(VnetHeader::default(), packet),
        }
    }

    /// Writes what is held.
    pub fn flush(&mut self, write: &mut impl FnMut(VnetHeader, &[u8])) {
        if self.segments == 0 {
            return;
        }
        let segments = std::mem::take(&mut self.segments);
        if segments == 1 {
            write(VnetHeader::default(), &self.held);
            return;
        }
        let (ihl, len) = (self.ihl, self.held.len());
        let p = &mut self.held[..];
        p[2..4].copy_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
        p[10] = 0;
        p[11] = 0;
        let ip = !fold(sum(&p[..ihl], 0));
        p[10..12].copy_from_slice(&ip.to_be_bytes());
        // the pending checksum: the pseudo-header sum, uncomplemented
        let pseudo = fold(sum(&p[12..20], 6 + (len - ihl) as u64));
        p[ihl + 16..ihl + 18].copy_from_slice(&pseudo.to_be_bytes());
        let hdr = VnetHeader {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: self.headers as u16,
            gso_size: self.mss as u16,
            csum_start: ihl as u16,
            csum_offset: 16,
        };
        write(hdr, &self.held);
    }

    /// Appends `packet`'s payload to the held packet when it continues it.
    fn join(&mut self, packet: &[u8]) -> bool {
        if self.segments == 0 || !self.open {
            return false;
        }
        let Some((ihl, headers, seq, payload)) = joinable(packet) else {
            return false;
        };
        let held = &self.held;
        let flags = packet[ihl + 13];
        let same = ihl == self.ihl
            && headers == self.headers
            && seq == self.next_seq
            && payload <= self.mss
            && held.len() + payload <= usize::from(u16::MAX)
            && (flags == ACK || flags == ACK | PSH)
            // IP: version, TOS; flags, TTL, protocol; addresses and options
            && packet[..2] == held[..2]
            && packet[6..10] == held[6..10]
            && packet[12..ihl] == held[12..ihl]
            // TCP: ports; acknowledgement, offset, window; urgent pointer and options
            && packet[ihl..ihl + 4] == held[ihl..ihl + 4]
            && packet[ihl + 8..ihl + 13] == held[ihl + 8..ihl + 13]
            && packet[ihl + 14..ihl + 16] == held[ihl + 14..ihl + 16]
            && packet[ihl + 18..headers] == held[ihl + 18..headers];
        if !same {
            return false;
        }
        self.held.extend_from_slice(&packet[headers..]);
        self.held[ihl + 13] |= flags;
        self.segments += 1;
        self.next_seq = seq.wrapping_add(payload as u32);
        self.open = payload == self.mss && flags == ACK;
        true
    }
}

/// An IPv4 TCP data segment that may take part in a join: its IP header length, header
/// length, sequence number and payload length. Not a fragment, total length matching.
fn joinable(p: &[u8]) -> Option<(usize, usize, u32, usize)> {
    let (ihl, headers) = tcp_v4_headers(p).ok()?;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    let fragment = u16::from_be_bytes([p[6], p[7]]) & 0x3FFF != 0;
    if total != p.len() || fragment || p.len() == headers {
        return None;
    }
    let seq = u32::from_be_bytes([p[ihl + 4], p[ihl + 5], p[ihl + 6], p[ihl + 7]]);
    Some((ihl, headers, seq, p.len() - headers))
}

/// How many datagrams from the start of `out` go in one UDP GSO send: a run to one address
/// whose datagrams all have the first one's size, except a last one that may be shorter
/// (what `UDP_SEGMENT` cuts), within the kernel's limits. At least 1 unless `out` is empty.
pub fn gso_run(out: &[(SocketAddr, Vec<u8>)]) -> usize {
    let Some((to, first)) = out.first() else {
        return 0;
    };
    let size = first.len();
    let mut n = 1;
    let mut bytes = size;
    for (addr, d) in &out[1..] {
        if addr != to || d.len() > size || n == MAX_GSO_SEGMENTS || bytes + d.len() > MAX_GSO_BYTES
        {
            break;
        }
        n += 1;
        bytes += d.len();
        if d.len() < size {
            break; // a shorter datagram can only be the last
        }
    }
    n
}

/// The segment size of a UDP GRO receive: the `SOL_UDP`/`UDP_GRO` control message among the
/// `control` bytes `recvmsg(2)` returned (native-endian `cmsghdr`s, each padded to its
/// alignment). `None` when there is none (the datagram came on its own).
pub fn gro_segment_size(control: &[u8]) -> Option<usize> {
    let header = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::align_of::<libc::cmsghdr>();
    let usize_len = std::mem::size_of::<usize>();
    let mut at = 0;
    while at + header <= control.len() {
        let c = &control[at..];
        let len = usize::from_ne_bytes(c[..usize_len].try_into().ok()?);
        let level = i32::from_ne_bytes(c[usize_len..usize_len + 4].try_into().ok()?);
        let kind = i32::from_ne_bytes(c[usize_len + 4..usize_len + 8].try_into().ok()?);
        if len < header || len > c.len() {
            return None;
        }
        if level == libc::SOL_UDP && kind == libc::UDP_GRO && len >= header + 2 {
            let data = &c[header..len];
            let size = match data.len() {
                2 | 3 => usize::from(u16::from_ne_bytes([data[0], data[1]])),
                _ => usize::try_from(i32::from_ne_bytes(data[..4].try_into().ok()?)).ok()?,
            };
            return (size > 0).then_some(size);
        }
        at += len.div_ceil(align) * align;
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tun::packet::tests::{full_checksums, packet, partial};
    use crate::tun::packet::ACK;
    use std::net::SocketAddrV4;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    fn gso_header(mss: u16) -> VnetHeader {
        VnetHeader {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 40,
            gso_size: mss,
            csum_start: 20,
            csum_offset: 16,
        }
    }

    fn checksums_of(p: &[u8]) -> (u16, u16) {
        (
            u16::from_be_bytes([p[10], p[11]]),
            u16::from_be_bytes([p[36], p[37]]),
        )
    }

    #[test]
    fn a_super_packet_becomes_segments_with_their_own_headers_and_checksums() {
        let payload: Vec<u8> = (0..3001u32).map(|i| (i * 7 % 251) as u8).collect();
        let (a, b) = (sa("10.9.0.1:40000"), sa("10.9.0.2:5201"));
        // as the kernel hands it: FIN|PSH|ACK|CWR on the whole, checksum pending
        let mut p = partial(a, b, ACK | PSH | FIN | CWR, &payload);
        let mut hdr = gso_header(1000);
        hdr.gso_type |= GSO_ECN;
        let mut out = PacketBatch::default();
        split(&hdr, &mut p, &mut out).unwrap();
        let segs: Vec<&[u8]> = out.packets().collect();
        assert_eq!(segs.len(), 4);
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            assert_eq!(
                usize::from(u16::from_be_bytes([s[2], s[3]])),
                s.len(),
                "IP length"
            );
            assert_eq!(checksums_of(s), full_checksums(s), "segment {i}");
            let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
            assert_eq!(seq, 0x1234_5678u32.wrapping_add(i as u32 * 1000));
            assert_eq!(u16::from_be_bytes([s[4], s[5]]), i as u16, "IP id advances");
            let f = s[33];
            assert_eq!(f & ACK, ACK);
            assert_eq!(f & (FIN | PSH) != 0, i == 3, "FIN/PSH only on the last");
            assert_eq!(f & CWR != 0, i == 0, "CWR only on the first");
            joined.extend_from_slice(&s[40..]);
        }
        assert_eq!(joined, payload);
        assert_eq!(segs[3].len(), 40 + 1);
    }

    #[test]
    fn plain_and_pending_checksum_packets_pass_whole() {
        let (a, b) = (sa("10.9.0.1:1"), sa("10.9.0.2:2"));
        let full = packet(a, b, ACK, b"hello");
        let mut p = full.clone();
        let mut out = PacketBatch::default();
        split(&VnetHeader::default(), &mut p, &mut out).unwrap();
        // a pending checksum is finished as the device would
        let mut p = partial(a, b, ACK, b"hello");
        let hdr = VnetHeader {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..VnetHeader::default()
        };
        split(&hdr, &mut p, &mut out).unwrap();
        // a "super-packet" no longer than one segment
        let mut p = partial(a, b, ACK, b"hello");
        split(&gso_header(1400), &mut p, &mut out).unwrap();
        let all: Vec<&[u8]> = out.packets().collect();
        assert_eq!(all, [&full[..], &full[..], &full[..]]);
        assert_eq!((out.len(), out.bytes()), (3, 3 * full.len()));
    }

    #[test]
    fn hostile_headers_are_refused_never_a_panic() {
        let (a, b) = (sa("10.9.0.1:1"), sa("10.9.0.2:2"));
        let good = partial(a, b, ACK, &[1u8; 100]);
        let mut out = PacketBatch::default();
        // every truncation, with and without GSO
        for cut in 0..good.len() {
            let mut p = good[..cut].to_vec();
            let _ = split(&gso_header(10), &mut p, &mut out);
            let _ = split(
                &VnetHeader {
                    flags: F_NEEDS_CSUM,
                    csum_start: 20,
                    csum_offset: 16,
                    ..VnetHeader::default()
                },
                &mut p,
                &mut out,
            );
        }
        // silly header lengths and offsets
        for (ihl, doff) in [(0u8, 5u8), (15, 5), (5, 0), (5, 15), (4, 5)] {
            let mut p = good.clone();
            p[0] = 0x40 | ihl;
            p[32] = doff << 4;
            let _ = split(&gso_header(7), &mut p, &mut out);
        }
        let mut p = good.clone();
        assert_eq!(
            split(&gso_header(0), &mut p, &mut out),
            Err(Refused::Offload)
        );
        let mut udp = good.clone();
        udp[9] = 17;
        assert_eq!(
            split(&gso_header(10), &mut udp, &mut out),
            Err(Refused::Offload)
        );
        let mut v6 = VnetHeader {
            gso_type: 4,
            ..gso_header(10)
        };
        let mut p = good.clone();
        assert_eq!(split(&v6, &mut p, &mut out), Err(Refused::Offload));
        v6.gso_type = GSO_NONE;
        v6.csum_start = 200;
        assert_eq!(split(&v6, &mut p, &mut out), Err(Refused::Offload));
        // a one-byte segment size is bounded by the packet
        let mut p = good.clone();
        out.clear();
        split(&gso_header(1), &mut p, &mut out).unwrap();
        assert_eq!(out.len(), 100);
    }

    /// Segments as the sending peer's reader cuts them from one super-packet.
    fn segments(from: &str, payload_len: u32, mss: u16, flags: u8) -> Vec<Vec<u8>> {
        let payload: Vec<u8> = (0..payload_len).map(|i| (i * 13 % 255) as u8).collect();
        let mut p = partial(sa(from), sa("10.9.0.2:5201"), flags, &payload);
        let mut out = PacketBatch::default();
        split(&gso_header(mss), &mut p, &mut out).unwrap();
        out.packets().map(<[u8]>::to_vec).collect()
    }

    fn coalesce(packets: &[Vec<u8>]) -> Vec<(VnetHeader, Vec<u8>)> {
        let mut c = Coalescer::default();
        let mut writes = Vec::new();
        let mut write = |h: VnetHeader, p: &[u8]| writes.push((h, p.to_vec()));
        for p in packets {
            c.push(p, &mut write);
        }
        c.flush(&mut write);
        writes
    }

    #[test]
    fn segments_of_one_flow_are_joined_and_cut_again_to_the_same_bytes() {
        let segs = segments("10.9.0.1:40000", 4500, 1000, ACK | PSH);
        assert_eq!(segs.len(), 5);
        let writes = coalesce(&segs);
        assert_eq!(writes.len(), 1, "one write for the whole train");
        let (hdr, joined) = &writes[0];
        assert_eq!(
            (
                hdr.flags,
                hdr.gso_type,
                hdr.gso_size,
                hdr.csum_start,
                hdr.csum_offset
            ),
            (F_NEEDS_CSUM, GSO_TCPV4, 1000, 20, 16)
        );
        assert_eq!(usize::from(hdr.hdr_len), 40);
        assert_eq!(
            usize::from(u16::from_be_bytes([joined[2], joined[3]])),
            joined.len()
        );
        assert_eq!(joined[33], ACK | PSH);
        // the kernel's view: cutting the joined packet gives back exactly the segments
        let mut again = PacketBatch::default();
        split(hdr, &mut joined.clone(), &mut again).unwrap();
        let again: Vec<Vec<u8>> = again.packets().map(<[u8]>::to_vec).collect();
        assert_eq!(again, segs);
    }

    #[test]
    fn only_in_order_plain_segments_of_one_flow_are_joined() {
        let a = segments("10.9.0.1:40000", 3000, 1000, ACK);
        let b = segments("10.9.0.1:40001", 2000, 1000, ACK);
        // flows interleaved: each run is written as it ends, order kept
        let mixed = vec![
            a[0].clone(),
            a[1].clone(),
            b[0].clone(),
            b[1].clone(),
            a[2].clone(),
        ];
        let writes = coalesce(&mixed);
        let sizes: Vec<(u16, usize)> = writes.iter().map(|(h, p)| (h.gso_size, p.len())).collect();
        assert_eq!(sizes, [(1000, 2040), (1000, 2040), (0, 1040)]);
        assert_eq!(writes[2].1, a[2], "a lone segment goes as it came");
        // a gap in the sequence, a short segment in the middle, and a SYN break the run
        let writes = coalesce(&[a[0].clone(), a[2].clone()]);
        assert_eq!(writes.len(), 2);
        // a short segment ends a run: the next one, in sequence, starts another
        let short = segments("10.9.0.1:40000", 2500, 1000, ACK);
        let mut next = short[0].clone();
        next[24..28].copy_from_slice(&0x1234_5678u32.wrapping_add(2500).to_be_bytes());
        let writes = coalesce(&[short[0].clone(), short[1].clone(), short[2].clone(), next]);
        let sizes: Vec<usize> = writes.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(sizes, [40 + 2500, 1040]);
        let mut syn = short[0].clone();
        syn[33] = 0x02;
        assert_eq!(coalesce(&[syn.clone(), syn]).len(), 2);
        // a pure ACK and a UDP packet are written as they are, in their place
        let ack = packet(sa("10.9.0.2:5201"), sa("10.9.0.1:40000"), ACK, b"");
        let udp = crate::mesh::wire::udp_packet(
            "10.9.0.1".parse().unwrap(),
            "10.9.0.2".parse().unwrap(),
            53,
            b"q",
        );
        let writes = coalesce(&[a[0].clone(), ack.clone(), udp.clone(), a[1].clone()]);
        let plain: Vec<&Vec<u8>> = writes.iter().map(|(_, p)| p).collect();
        assert_eq!(plain, [&a[0], &ack, &udp, &a[1]]);
        assert!(writes.iter().all(|(h, _)| *h == VnetHeader::default()));
    }

    #[test]
    fn hostile_packets_never_panic_the_coalescer() {
        let segs = segments("10.9.0.1:40000", 3000, 1000, ACK);
        let mut c = Coalescer::default();
        let mut n = 0;
        let mut write = |_: VnetHeader, _: &[u8]| n += 1;
        for cut in 0..segs[1].len() {
            c.push(&segs[0], &mut write);
            c.push(&segs[1][..cut], &mut write);
            let mut odd = segs[1].clone();
            odd[0] = 0x4F; // IP header length past the TCP header
            c.push(&odd, &mut write);
            odd[0] = 0x45;
            odd[32] = 0xF0; // TCP header length past the packet
            c.push(&odd, &mut write);
        }
        c.flush(&mut write);
        assert!(n > 0);
    }

    fn to(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn gso_runs_are_equal_sizes_to_one_address_with_a_shorter_last() {
        let d = |port, len| (to(port), vec![0u8; len]);
        assert_eq!(gso_run(&[]), 0);
        assert_eq!(gso_run(&[d(1, 100)]), 1);
        let out = [d(1, 100), d(1, 100), d(1, 60), d(1, 100)];
        assert_eq!(gso_run(&out), 3, "ends after the shorter one");
        let out = [d(1, 100), d(1, 100), d(2, 100)];
        assert_eq!(gso_run(&out), 2, "ends at another address");
        let out = [d(1, 100), d(1, 120)];
        assert_eq!(gso_run(&out), 1, "a longer one cannot follow");
        let out: Vec<_> = (0..100).map(|_| d(1, 100)).collect();
        assert_eq!(gso_run(&out), MAX_GSO_SEGMENTS);
        let out: Vec<_> = (0..60).map(|_| d(1, 1500)).collect();
        assert_eq!(gso_run(&out), MAX_GSO_BYTES / 1500);
    }

    fn cmsg(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let header = std::mem::size_of::<libc::cmsghdr>();
        let align = std::mem::align_of::<libc::cmsghdr>();
        let len = header + data.len();
        let mut c = Vec::new();
        c.extend_from_slice(&len.to_ne_bytes());
        c.extend_from_slice(&level.to_ne_bytes());
        c.extend_from_slice(&kind.to_ne_bytes());
        c.extend_from_slice(data);
        c.resize(len.div_ceil(align) * align, 0);
        c
    }

    #[test]
    fn the_gro_segment_size_is_read_from_its_control_message() {
        assert_eq!(gro_segment_size(&[]), None);
        let gro = cmsg(libc::SOL_UDP, libc::UDP_GRO, &1452i32.to_ne_bytes());
        assert_eq!(gro_segment_size(&gro), Some(1452));
        // after another control message
        let mut two = cmsg(libc::SOL_IP, libc::IP_TOS, &[0u8; 1]);
        two.extend_from_slice(&gro);
        assert_eq!(gro_segment_size(&two), Some(1452));
        assert_eq!(
            gro_segment_size(&cmsg(libc::SOL_IP, libc::IP_TOS, &[0u8; 4])),
            None
        );
        // hostile lengths: every truncation, and a length past the end or under the header
        for cut in 0..gro.len() {
            let _ = gro_segment_size(&gro[..cut]);
        }
        let mut bad = gro.clone();
        let word = std::mem::size_of::<usize>();
        bad[..word].copy_from_slice(&10_000usize.to_ne_bytes());
        assert_eq!(gro_segment_size(&bad), None);
        bad[..word].copy_from_slice(&0usize.to_ne_bytes());
        assert_eq!(gro_segment_size(&bad), None);
    }
}
