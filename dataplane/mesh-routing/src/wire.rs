//! Control messages of the mesh control port (UDP 7387, virtual IP to virtual IP, inside the
//! sessions).
//!
//! Every datagram starts with `[kind: u8][version: u8]`; integers are big-endian; a peer id is
//! `[len: u8][UTF-8 bytes]` (1..=[`MAX_ID_LEN`]); lists carry a `u8` count. The decoder checks
//! every length against the bytes present and against the limits below, rejects trailing bytes
//! and never panics, whatever it is given.
//!
//! | kind | message | body |
//! |------|---------|------|
//! | 1 | [`Announcement`] | sender id, seq u64, count u8, entries |
//! | 2 | probe ([`Probe`]) | nonce u64, timestamp µs u64 |
//! | 3 | probe reply ([`Probe`]) | the probe's nonce and timestamp, echoed |
//! | 4 | [`Membership`] | origin id, origin vip, seq u64, count u8, group addresses |
//! | 5 | [`Flood`] | origin id, id u64, ttl u8, mode u8 (+ group), len u16, payload |
//!
//! A route entry is `dest id, vip [4], metric u32, latency_ms u32, hop_count u8, count u8,
//! path ids` where the path lists the peers between the sender and the destination (empty for
//! the sender's direct route), so `hop_count == path.len()`. Metric [`METRIC_INFINITY`] means
//! "unreachable through me" (a withdrawal, or poisoned reverse).

use std::net::Ipv4Addr;

use thiserror::Error;

/// The mesh control port: UDP from virtual IP to virtual IP, consumed by the peer.
pub const CONTROL_PORT: u16 = 7387;
/// The wire version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Announcements and memberships are split to stay within this many bytes: it fits a mesh
/// device MTU of 1400 minus the IPv4 and UDP headers with room to spare.
pub const MAX_DATAGRAM: usize = 1200;
/// Longest peer id on the wire (registry ids are UUID-sized).
pub const MAX_ID_LEN: usize = 64;
/// Longest path vector accepted (max_hops is clamped below it).
pub const MAX_PATH: usize = 16;
/// Most groups one peer may announce.
pub const MAX_GROUPS: usize = 64;
/// Largest packet carried in a [`Flood`] (a jumbo Ethernet payload).
pub const MAX_FLOOD_PAYLOAD: usize = 9216;
/// The unreachable metric.
pub const METRIC_INFINITY: u32 = u32::MAX;

const KIND_ANNOUNCEMENT: u8 = 1;
const KIND_PROBE: u8 = 2;
const KIND_PROBE_REPLY: u8 = 3;
const KIND_MEMBERSHIP: u8 = 4;
const KIND_FLOOD: u8 = 5;

const MODE_BROADCAST: u8 = 0;
const MODE_MULTICAST: u8 = 1;

/// Why a datagram was not decoded (or a message not encoded).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("empty datagram")]
    Empty,
    #[error("datagram truncated")]
    Truncated,
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("unsupported control version {0}")]
    UnsupportedVersion(u8),
    #[error("peer id is empty, longer than {MAX_ID_LEN} bytes or not UTF-8")]
    BadPeerId,
    #[error("{0} exceeds its limit")]
    TooLong(&'static str),
    #[error("inconsistent field: {0}")]
    Inconsistent(&'static str),
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    #[error("unknown flood mode {0}")]
    UnknownMode(u8),
}

/// One decoded control datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Announcement(Announcement),
    Probe(Probe),
    ProbeReply(Probe),
    Membership(Membership),
    Flood(Flood),
}

/// Routes the sender offers to the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub sender: String,
    /// Increases with every announcement datagram the sender writes; older ones are ignored.
    pub seq: u64,
    pub entries: Vec<RouteEntry>,
}

/// The sender's route to one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub dest: String,
    pub vip: Ipv4Addr,
    /// latency_ms + hop_count × 100 as the sender sees it, or [`METRIC_INFINITY`].
    pub metric: u32,
    /// Summed link latency from the sender to the destination.
    pub latency_ms: u32,
    pub hop_count: u8,
    /// Peers between the sender and the destination, nearest first.
    pub path: Vec<String>,
}

/// A latency probe, echoed unchanged as the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub nonce: u64,
    /// Microseconds on the prober's own clock; only the prober interprets it.
    pub timestamp_us: u64,
}

/// The multicast and anycast groups one peer belongs to (all of them: it replaces the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub origin: String,
    pub vip: Ipv4Addr,
    pub seq: u64,
    pub groups: Vec<Ipv4Addr>,
}

/// A broadcast or multicast packet travelling down the origin's delivery tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flood {
    pub origin: String,
    /// Unique per origin; (origin, id) is the duplicate-suppression key.
    pub id: u64,
    /// Peer-to-peer hops left; a copy with ttl 1 is delivered but not forwarded.
    pub ttl: u8,
    pub mode: FloodMode,
    /// The IP packet (TUN mode) or Ethernet frame (TAP mode) to deliver.
    pub payload: Vec<u8>,
}

/// Who a [`Flood`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodMode {
    Broadcast,
    Multicast(Ipv4Addr),
}

impl Message {
    /// Decodes one datagram received on [`CONTROL_PORT`].
    pub fn decode(datagram: &[u8]) -> Result<Message, WireError> {
        let mut r = Reader { buf: datagram };
        let kind = r.u8().map_err(|_| WireError::Empty)?;
        if !(KIND_ANNOUNCEMENT..=KIND_FLOOD).contains(&kind) {
            return Err(WireError::UnknownKind(kind));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        let msg = match kind {
            KIND_ANNOUNCEMENT => Message::Announcement(decode_announcement(&mut r)?),
            KIND_PROBE => Message::Probe(decode_probe(&mut r)?),
            KIND_PROBE_REPLY => Message::ProbeReply(decode_probe(&mut r)?),
            KIND_MEMBERSHIP => Message::Membership(decode_membership(&mut r)?),
            _ => Message::Flood(decode_flood(&mut r)?),
        };
        if !r.buf.is_empty() {
            return Err(WireError::TrailingBytes(r.buf.len()));
        }
        Ok(msg)
    }

    /// Encodes the message; fails when a field is over its limit.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(64);
        match self {
            Message::Announcement(a) => {
                out.extend([KIND_ANNOUNCEMENT, VERSION]);
                put_id(&mut out, &a.sender)?;
                out.extend(a.seq.to_be_bytes());
                out.push(count(
                    a.entries.len(),
                    usize::from(u8::MAX),
                    "route entries",
                )?);
                for e in &a.entries {
                    encode_entry(&mut out, e)?;
                }
            }
            Message::Probe(p) | Message::ProbeReply(p) => {
                let kind = match self {
                    Message::Probe(_) => KIND_PROBE,
                    _ => KIND_PROBE_REPLY,
                };
                out.extend([kind, VERSION]);
                out.extend(p.nonce.to_be_bytes());
                out.extend(p.timestamp_us.to_be_bytes());
            }
            Message::Membership(m) => {
                out.extend([KIND_MEMBERSHIP, VERSION]);
                put_id(&mut out, &m.origin)?;
                out.extend(m.vip.octets());
                out.extend(m.seq.to_be_bytes());
                out.push(count(m.groups.len(), MAX_GROUPS, "groups")?);
                for g in &m.groups {
                    out.extend(g.octets());
                }
            }
            Message::Flood(f) => {
                out.extend([KIND_FLOOD, VERSION]);
                put_id(&mut out, &f.origin)?;
                out.extend(f.id.to_be_bytes());
                out.push(f.ttl);
                match f.mode {
                    FloodMode::Broadcast => out.push(MODE_BROADCAST),
                    FloodMode::Multicast(g) => {
                        out.push(MODE_MULTICAST);
                        out.extend(g.octets());
                    }
                }
                if f.payload.len() > MAX_FLOOD_PAYLOAD {
                    return Err(WireError::TooLong("flood payload"));
                }
                // MAX_FLOOD_PAYLOAD < u16::MAX, checked just above.
                out.extend((f.payload.len() as u16).to_be_bytes());
                out.extend(&f.payload);
            }
        }
        Ok(out)
    }
}

/// The encoded size of one route entry (to split announcements under [`MAX_DATAGRAM`]).
pub fn entry_len(e: &RouteEntry) -> usize {
    1 + e.dest.len() + 4 + 4 + 4 + 1 + 1 + e.path.iter().map(|p| 1 + p.len()).sum::<usize>()
}

/// The encoded size of an announcement header from `sender` (kind, version, id, seq, count).
pub fn announcement_header_len(sender: &str) -> usize {
    2 + 1 + sender.len() + 8 + 1
}

fn count(n: usize, max: usize, what: &'static str) -> Result<u8, WireError> {
    if n > max {
        return Err(WireError::TooLong(what));
    }
    u8::try_from(n).map_err(|_| WireError::TooLong(what))
}

fn put_id(out: &mut Vec<u8>, id: &str) -> Result<(), WireError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(WireError::BadPeerId);
    }
    out.push(id.len() as u8);
    out.extend(id.as_bytes());
    Ok(())
}

fn encode_entry(out: &mut Vec<u8>, e: &RouteEntry) -> Result<(), WireError> {
    if usize::from(e.hop_count) != e.path.len() {
        return Err(WireError::Inconsistent(
            "hop_count differs from the path length",
        ));
    }
    put_id(out, &e.dest)?;
    out.extend(e.vip.octets());
    out.extend(e.metric.to_be_bytes());
    out.extend(e.latency_ms.to_be_bytes());
    out.push(e.hop_count);
    out.push(count(e.path.len(), MAX_PATH, "path vector")?);
    for p in &e.path {
        put_id(out, p)?;
    }
    Ok(())
}

fn decode_announcement(r: &mut Reader<'_>) -> Result<Announcement, WireError> {
    let sender = r.id()?;
    let seq = r.u64()?;
    let n = r.u8()?;
    let mut entries = Vec::with_capacity(usize::from(n).min(32));
    for _ in 0..n {
        let dest = r.id()?;
        let vip = r.ipv4()?;
        let metric = r.u32()?;
        let latency_ms = r.u32()?;
        let hop_count = r.u8()?;
        let plen = usize::from(r.u8()?);
        if plen > MAX_PATH {
            return Err(WireError::TooLong("path vector"));
        }
        if plen != usize::from(hop_count) {
            return Err(WireError::Inconsistent(
                "hop_count differs from the path length",
            ));
        }
        let mut path = Vec::with_capacity(plen);
        for _ in 0..plen {
            path.push(r.id()?);
        }
        entries.push(RouteEntry {
            dest,
            vip,
            metric,
            latency_ms,
            hop_count,
            path,
        });
    }
    Ok(Announcement {
        sender,
        seq,
        entries,
    })
}

fn decode_probe(r: &mut Reader<'_>) -> Result<Probe, WireError> {
    Ok(Probe {
        nonce: r.u64()?,
        timestamp_us: r.u64()?,
    })
}

fn decode_membership(r: &mut Reader<'_>) -> Result<Membership, WireError> {
    let origin = r.id()?;
    let vip = r.ipv4()?;
    let seq = r.u64()?;
    let n = usize::from(r.u8()?);
    if n > MAX_GROUPS {
        return Err(WireError::TooLong("groups"));
    }
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        groups.push(r.ipv4()?);
    }
    Ok(Membership {
        origin,
        vip,
        seq,
        groups,
    })
}

fn decode_flood(r: &mut Reader<'_>) -> Result<Flood, WireError> {
    let origin = r.id()?;
    let id = r.u64()?;
    let ttl = r.u8()?;
    let mode = match r.u8()? {
        MODE_BROADCAST => FloodMode::Broadcast,
        MODE_MULTICAST => FloodMode::Multicast(r.ipv4()?),
        other => return Err(WireError::UnknownMode(other)),
    };
    let len = usize::from(r.u16()?);
    if len > MAX_FLOOD_PAYLOAD {
        return Err(WireError::TooLong("flood payload"));
    }
    let payload = r.take(len)?.to_vec();
    Ok(Flood {
        origin,
        id,
        ttl,
        mode,
        payload,
    })
}

/// A cursor that fails with [`WireError::Truncated`] instead of reading past the end.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.take(N)?.try_into().map_err(|_| WireError::Truncated)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.array()?))
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn ipv4(&mut self) -> Result<Ipv4Addr, WireError> {
        Ok(Ipv4Addr::from(self.array::<4>()?))
    }

    fn id(&mut self) -> Result<String, WireError> {
        let len = usize::from(self.u8()?);
        if len == 0 || len > MAX_ID_LEN {
            return Err(WireError::BadPeerId);
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| WireError::BadPeerId)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample_announcement() -> Message {
        Message::Announcement(Announcement {
            sender: "peer-a".into(),
            seq: 42,
            entries: vec![
                RouteEntry {
                    dest: "peer-b".into(),
                    vip: Ipv4Addr::new(10, 9, 0, 2),
                    metric: 5,
                    latency_ms: 5,
                    hop_count: 0,
                    path: vec![],
                },
                RouteEntry {
                    dest: "peer-d".into(),
                    vip: Ipv4Addr::new(10, 9, 0, 4),
                    metric: 217,
                    latency_ms: 17,
                    hop_count: 2,
                    path: vec!["peer-b".into(), "peer-c".into()],
                },
            ],
        })
    }

    fn samples() -> Vec<Message> {
        vec![
            sample_announcement(),
            Message::Probe(Probe {
                nonce: 7,
                timestamp_us: 123_456,
            }),
            Message::ProbeReply(Probe {
                nonce: u64::MAX,
                timestamp_us: 0,
            }),
            Message::Membership(Membership {
                origin: "peer-c".into(),
                vip: Ipv4Addr::new(10, 9, 0, 3),
                seq: 3,
                groups: vec![Ipv4Addr::new(239, 1, 2, 3), Ipv4Addr::new(10, 9, 255, 1)],
            }),
            Message::Flood(Flood {
                origin: "peer-a".into(),
                id: 9,
                ttl: 8,
                mode: FloodMode::Multicast(Ipv4Addr::new(239, 1, 2, 3)),
                payload: vec![0x45, 0, 0, 20],
            }),
            Message::Flood(Flood {
                origin: "peer-a".into(),
                id: 10,
                ttl: 1,
                mode: FloodMode::Broadcast,
                payload: vec![],
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            let bytes = m.encode().unwrap();
            assert_eq!(Message::decode(&bytes).unwrap(), m);
        }
    }

    #[test]
    fn first_byte_is_kind_and_second_is_version() {
        let kinds: Vec<u8> = samples().iter().map(|m| m.encode().unwrap()[0]).collect();
        assert_eq!(kinds, vec![1, 2, 3, 4, 5, 5]);
        for m in samples() {
            assert_eq!(m.encode().unwrap()[1], VERSION);
        }
    }

    #[test]
    fn entry_len_matches_the_encoding() {
        let Message::Announcement(a) = sample_announcement() else {
            unreachable!()
        };
        let bytes = sample_announcement().encode().unwrap();
        let expected =
            announcement_header_len(&a.sender) + a.entries.iter().map(entry_len).sum::<usize>();
        assert_eq!(bytes.len(), expected);
    }

    #[test]
    fn every_truncation_is_an_error() {
        for m in samples() {
            let bytes = m.encode().unwrap();
            for cut in 0..bytes.len() {
                assert!(
                    Message::decode(&bytes[..cut]).is_err(),
                    "{m:?} cut at {cut} decoded"
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_unknown_kind_and_version_are_rejected() {
        let mut bytes = sample_announcement().encode().unwrap();
        bytes.push(0);
        assert_eq!(Message::decode(&bytes), Err(WireError::TrailingBytes(1)));
        assert_eq!(Message::decode(&[]), Err(WireError::Empty));
        assert_eq!(Message::decode(&[0, 1]), Err(WireError::UnknownKind(0)));
        assert_eq!(Message::decode(&[9, 1]), Err(WireError::UnknownKind(9)));
        assert_eq!(
            Message::decode(&[2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(WireError::UnsupportedVersion(2))
        );
    }

    #[test]
    fn limits_are_enforced_both_ways() {
        let long = "x".repeat(MAX_ID_LEN + 1);
        let m = Message::Flood(Flood {
            origin: long,
            id: 0,
            ttl: 1,
            mode: FloodMode::Broadcast,
            payload: vec![],
        });
        assert_eq!(m.encode(), Err(WireError::BadPeerId));
        // A hop count that disagrees with the path.
        let mut bytes = sample_announcement().encode().unwrap();
        // The last entry ends with hop_count 2, the path count and two 7-byte ids.
        let hop = bytes.len() - 16;
        assert_eq!(bytes[hop], 2);
        bytes[hop] = 3;
        assert_eq!(
            Message::decode(&bytes),
            Err(WireError::Inconsistent(
                "hop_count differs from the path length"
            ))
        );
        // Invalid UTF-8 in a peer id.
        let mut bytes = Message::Probe(Probe {
            nonce: 0,
            timestamp_us: 0,
        })
        .encode()
        .unwrap();
        bytes[0] = KIND_MEMBERSHIP;
        bytes.truncate(2);
        bytes.extend([2, 0xff, 0xfe]);
        assert_eq!(Message::decode(&bytes), Err(WireError::BadPeerId));
        // An oversized flood payload length.
        let mut bytes = vec![KIND_FLOOD, VERSION, 1, b'a'];
        bytes.extend(0u64.to_be_bytes());
        bytes.extend([1, MODE_BROADCAST]);
        bytes.extend(u16::MAX.to_be_bytes());
        assert_eq!(
            Message::decode(&bytes),
            Err(WireError::TooLong("flood payload"))
        );
    }

    mod arb {
        use super::*;
        use proptest::prelude::*;

        fn id() -> impl Strategy<Value = String> {
            "[a-z0-9-]{1,64}"
        }

        fn ip() -> impl Strategy<Value = Ipv4Addr> {
            any::<u32>().prop_map(Ipv4Addr::from)
        }

        fn entry() -> impl Strategy<Value = RouteEntry> {
            (
                id(),
                ip(),
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(id(), 0..=MAX_PATH),
            )
                .prop_map(|(dest, vip, metric, latency_ms, path)| RouteEntry {
                    dest,
                    vip,
                    metric,
                    latency_ms,
                    hop_count: path.len() as u8,
                    path,
                })
        }

        pub fn message() -> impl Strategy<Value = Message> {
            let probe = (any::<u64>(), any::<u64>()).prop_map(|(nonce, timestamp_us)| Probe {
                nonce,
                timestamp_us,
            });
            prop_oneof![
                (id(), any::<u64>(), proptest::collection::vec(entry(), 0..6)).prop_map(
                    |(sender, seq, entries)| Message::Announcement(Announcement {
                        sender,
                        seq,
                        entries
                    })
                ),
                probe.clone().prop_map(Message::Probe),
                probe.prop_map(Message::ProbeReply),
                (
                    id(),
                    ip(),
                    any::<u64>(),
                    proptest::collection::vec(ip(), 0..=MAX_GROUPS)
                )
                    .prop_map(|(origin, vip, seq, groups)| {
                        Message::Membership(Membership {
                            origin,
                            vip,
                            seq,
                            groups,
                        })
                    }),
                (
                    id(),
                    any::<u64>(),
                    any::<u8>(),
                    proptest::option::of(ip()),
                    proptest::collection::vec(any::<u8>(), 0..512)
                )
                    .prop_map(|(origin, id, ttl, group, payload)| {
                        Message::Flood(Flood {
                            origin,
                            id,
                            ttl,
                            mode: group.map_or(FloodMode::Broadcast, FloodMode::Multicast),
                            payload,
                        })
                    }),
            ]
        }
    }

    proptest::proptest! {
        #[test]
        fn any_valid_message_round_trips_and_every_truncation_fails(m in arb::message()) {
            let bytes = m.encode().unwrap();
            proptest::prop_assert_eq!(Message::decode(&bytes).unwrap(), m);
            for cut in 0..bytes.len() {
                proptest::prop_assert!(Message::decode(&bytes[..cut]).is_err());
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn random_bytes_after_a_valid_header_never_panic(
            kind in 1u8..=5,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            let mut bytes = vec![kind, VERSION];
            bytes.extend(body);
            if let Ok(m) = Message::decode(&bytes) {
                // Whatever decodes re-encodes to the same bytes.
                proptest::prop_assert_eq!(m.encode().unwrap(), bytes);
            }
        }

        #[test]
        fn mutated_valid_messages_never_panic(
            which in 0usize..6,
            flips in proptest::collection::vec((0usize..256, proptest::num::u8::ANY), 1..4),
        ) {
            let mut bytes = samples()[which].encode().unwrap();
            for (pos, val) in flips {
                let len = bytes.len();
                bytes[pos % len] = val;
            }
            let _ = Message::decode(&bytes);
        }
    }
}
