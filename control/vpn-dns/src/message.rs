//! DNS messages without I/O: reading a client's query, building the answer for it (with the
//! truncation rules of UDP), building the upstream query and checking the upstream's reply, and
//! finding the addresses (and the CNAME chain) an answer gives.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

use crate::name::normalise;

/// Largest UDP answer to a client without EDNS (RFC 1035 §4.2.1).
pub const PLAIN_UDP_LIMIT: usize = 512;
/// Ceiling of a client's advertised EDNS size that we honour; 4096 is what resolvers use.
pub const EDNS_UDP_CEILING: u16 = 4096;
/// EDNS size we advertise to clients and upstreams (the DNS flag day 2020 value: fits one
/// packet on every usual path, so answers are not fragmented).
pub const ADVERTISED_UDP_SIZE: u16 = 1232;
/// Longest CNAME chain followed when collecting addresses (loops end here too).
const MAX_CHAIN: usize = 16;

/// A well-formed query from a client.
#[derive(Debug, Clone)]
pub struct ClientQuery {
    pub id: u16,
    /// The question as the client spelled it (its case is echoed back, for 0x20 clients).
    pub query: Query,
    pub recursion_desired: bool,
    pub checking_disabled: bool,
    /// The client's EDNS UDP size when it sent an OPT record.
    pub edns_udp_size: Option<u16>,
}

impl ClientQuery {
    /// Largest UDP answer this client accepts.
    pub fn udp_limit(&self) -> usize {
        match self.edns_udp_size {
            Some(size) => usize::from(size.clamp(PLAIN_UDP_LIMIT as u16, EDNS_UDP_CEILING)),
            None => PLAIN_UDP_LIMIT,
        }
    }
}

/// What to do with the bytes a client sent.
#[derive(Debug)]
pub enum Incoming {
    /// Resolve it.
    Query(ClientQuery),
    /// Answer at once with these bytes (FORMERR, NOTIMP, REFUSED).
    Reject(Vec<u8>),
    /// Ignore: too short to answer, or not a query at all (a response: answering could start a
    /// loop between two resolvers).
    Drop,
}

/// Classifies a client's datagram or TCP frame. Never panics, whatever the bytes.
pub fn read_query(bytes: &[u8]) -> Incoming {
    let [id_hi, id_lo, flags, ..] = *bytes else {
        return Incoming::Drop;
    };
    if bytes.len() < 12 || flags & 0x80 != 0 {
        return Incoming::Drop;
    }
    let id = u16::from_be_bytes([id_hi, id_lo]);
    // Unassigned opcodes cannot be echoed by hickory; they are answered NOTIMP as QUERY.
    let op_code = OpCode::from_u8((flags >> 3) & 0x0f).ok();
    let recursion_desired = flags & 0x01 != 0;
    let reject = |code: ResponseCode, query: Option<&Query>| {
        let mut m = Message::error_msg(id, op_code.unwrap_or(OpCode::Query), code);
        m.set_recursion_desired(recursion_desired)
            .set_recursion_available(true);
        if let Some(q) = query {
            m.add_query(q.clone());
        }
        m.to_vec().map_or(Incoming::Drop, Incoming::Reject)
    };
    if op_code != Some(OpCode::Query) {
        return reject(ResponseCode::NotImp, None);
    }
    let Ok(msg) = Message::from_vec(bytes) else {
        return reject(ResponseCode::FormErr, None);
    };
    let [query] = msg.queries() else {
        return reject(ResponseCode::FormErr, None);
    };
    if !msg.answers().is_empty() || !msg.name_servers().is_empty() {
        return reject(ResponseCode::FormErr, Some(query));
    }
    match query.query_type() {
        // Zone transfers and meta types are not a stub resolver's business.
        RecordType::AXFR | RecordType::IXFR | RecordType::OPT => {
            return reject(ResponseCode::NotImp, Some(query));
        }
        _ => {}
    }
    Incoming::Query(ClientQuery {
        id,
        query: query.clone(),
        recursion_desired: msg.recursion_desired(),
        checking_disabled: msg.checking_disabled(),
        edns_udp_size: msg.extensions().as_ref().map(Edns::max_payload),
    })
}

/// The content of an answer, independent of which client asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub response_code: ResponseCode,
    pub answers: Vec<Record>,
    /// Authority records (the SOA of a negative answer).
    pub authority: Vec<Record>,
}

impl Answer {
    pub fn servfail() -> Self {
        Self::empty(ResponseCode::ServFail)
    }

    /// The answer to a question the resolver must not forward (see `DnsInterceptor::set_refuse`).
    pub fn refused() -> Self {
        Self::empty(ResponseCode::Refused)
    }

    fn empty(response_code: ResponseCode) -> Self {
        Answer {
            response_code,
            answers: Vec::new(),
            authority: Vec::new(),
        }
    }
}

/// Which transport an answer leaves by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Encodes the answer to `q`. Over UDP an answer larger than the client accepts is sent with
/// the TC bit and empty sections (the client retries over TCP, RFC 7766); over TCP the limit is
/// the frame size. `None` only when the message cannot be encoded.
pub fn encode_answer(q: &ClientQuery, answer: &Answer, transport: Transport) -> Option<Vec<u8>> {
    let mut m = Message::new();
    m.set_id(q.id)
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(q.recursion_desired)
        .set_recursion_available(true)
        .set_checking_disabled(q.checking_disabled)
        .set_response_code(answer.response_code)
        .add_query(q.query.clone());
    if q.edns_udp_size.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(ADVERTISED_UDP_SIZE);
        m.set_edns(edns);
    }
    m.add_answers(answer.answers.iter().cloned())
        .add_name_servers(answer.authority.iter().cloned());
    let limit = match transport {
        Transport::Udp => q.udp_limit(),
        Transport::Tcp => usize::from(u16::MAX),
    };
    let bytes = m.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    m.take_answers();
    m.take_name_servers();
    m.take_additionals();
    m.set_truncated(true);
    m.to_vec().ok()
}

/// The query sent upstream for a client's question: recursion desired, EDNS with our size.
pub fn upstream_query(id: u16, query: &Query) -> Message {
    let mut m = Message::new();
    let mut edns = Edns::new();
    edns.set_max_payload(ADVERTISED_UDP_SIZE);
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(query.clone())
        .set_edns(edns);
    m
}

/// Why an upstream reply does not answer our query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyMismatch {
    #[error("not a DNS message")]
    Malformed,
    #[error("not a response")]
    NotResponse,
    #[error("answers another query id")]
    OtherId,
    #[error("answers another question")]
    OtherQuestion,
}

/// Decodes an upstream reply and checks that it answers `id`/`query` (RFC 5452: id and question
/// must match, otherwise it is ignored).
pub fn read_reply(bytes: &[u8], id: u16, query: &Query) -> Result<Message, ReplyMismatch> {
    let msg = Message::from_vec(bytes).map_err(|_| ReplyMismatch::Malformed)?;
    if msg.message_type() != MessageType::Response {
        return Err(ReplyMismatch::NotResponse);
    }
    if msg.id() != id {
        return Err(ReplyMismatch::OtherId);
    }
    match msg.queries() {
        [q] if same_question(q, query) => Ok(msg),
        // A truncated reply may leave the question out.
        [] if msg.truncated() => Ok(msg),
        _ => Err(ReplyMismatch::OtherQuestion),
    }
}

fn same_question(a: &Query, b: &Query) -> bool {
    a.query_type() == b.query_type()
        && a.query_class() == b.query_class()
        && a.name().to_lowercase() == b.name().to_lowercase()
}

/// The upstream reply as an [`Answer`]: its code, answers and authority (additional records are
/// not passed on; OPT is our own per client).
pub fn answer_of(reply: Message) -> Answer {
    let response_code = reply.response_code();
    let mut reply = reply;
    Answer {
        response_code,
        answers: reply.take_answers(),
        authority: reply.take_name_servers(),
    }
}

/// A name and the addresses the answer gives for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    pub addresses: Vec<IpAddr>,
}

/// The addresses an answer gives for `qname`, reported under the queried name and under every
/// canonical name of its CNAME chain (the split tunnel may have a rule for either). Empty when
/// the answer has no address for the chain.
pub fn resolved_names(qname: &hickory_proto::rr::Name, answers: &[Record]) -> Vec<Resolved> {
    let mut chain = vec![normalise(qname)];
    while chain.len() < MAX_CHAIN {
        let Some(last) = chain.last() else { break };
        let next = answers.iter().find_map(|r| match r.data() {
            Some(RData::CNAME(target)) if normalise(r.name()) == *last => Some(normalise(target)),
            _ => None,
        });
        match next {
            Some(n) if !chain.contains(&n) => chain.push(n),
            _ => break,
        }
    }
    let mut addresses: Vec<IpAddr> = Vec::new();
    for r in answers {
        if r.dns_class() != DNSClass::IN {
            continue;
        }
        let ip = match r.data() {
            Some(RData::A(a)) => IpAddr::V4(a.0),
            Some(RData::AAAA(a)) => IpAddr::V6(a.0),
            _ => continue,
        };
        if chain.contains(&normalise(r.name())) && !addresses.contains(&ip) {
            addresses.push(ip);
        }
    }
    if addresses.is_empty() {
        return Vec::new();
    }
    chain
        .into_iter()
        .map(|name| Resolved {
            name,
            addresses: addresses.clone(),
        })
        .collect()
}

/// All A/AAAA addresses in `answers` (for the cache view).
pub fn addresses(answers: &[Record]) -> Vec<IpAddr> {
    answers
        .iter()
        .filter_map(|r| match r.data() {
            Some(RData::A(a)) => Some(IpAddr::V4(a.0)),
            Some(RData::AAAA(a)) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
    use hickory_proto::rr::Name;
    use rand::{Rng, SeedableRng};

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn client_query(qname: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x4242)
            .set_recursion_desired(true)
            .add_query(Query::query(name(qname), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    fn parsed(bytes: &[u8]) -> ClientQuery {
        match read_query(bytes) {
            Incoming::Query(q) => q,
            other => panic!("not a query: {other:?}"),
        }
    }

    fn rejected_code(bytes: &[u8]) -> ResponseCode {
        match read_query(bytes) {
            Incoming::Reject(r) => Message::from_vec(&r).unwrap().response_code(),
            other => panic!("not rejected: {other:?}"),
        }
    }

    fn a(owner: &str, ip: [u8; 4], ttl: u32) -> Record {
        Record::from_rdata(
            name(owner),
            ttl,
            RData::A(A::from(std::net::Ipv4Addr::from(ip))),
        )
    }

    fn cname(owner: &str, target: &str) -> Record {
        Record::from_rdata(name(owner), 60, RData::CNAME(CNAME(name(target))))
    }

    #[test]
    fn reads_a_query_with_and_without_edns() {
        let q = parsed(&client_query("Example.COM.", RecordType::A, None));
        assert_eq!(q.id, 0x4242);
        assert!(q.recursion_desired);
        assert_eq!(q.query.name().to_ascii(), "Example.COM.");
        assert_eq!(q.udp_limit(), 512);
        let q = parsed(&client_query("example.com.", RecordType::AAAA, Some(1400)));
        assert_eq!(q.udp_limit(), 1400);
        let q = parsed(&client_query("example.com.", RecordType::A, Some(100)));
        assert_eq!(q.udp_limit(), 512, "EDNS sizes below 512 mean 512");
        let q = parsed(&client_query("example.com.", RecordType::A, Some(65000)));
        assert_eq!(q.udp_limit(), 4096);
    }

    #[test]
    fn rejects_what_is_not_one_plain_question() {
        // Two questions.
        let mut m = Message::new();
        m.set_id(7)
            .add_query(Query::query(name("a.test."), RecordType::A))
            .add_query(Query::query(name("b.test."), RecordType::A));
        assert_eq!(rejected_code(&m.to_vec().unwrap()), ResponseCode::FormErr);
        // No question.
        let mut m = Message::new();
        m.set_id(7);
        assert_eq!(rejected_code(&m.to_vec().unwrap()), ResponseCode::FormErr);
        // Zone transfer.
        let bytes = client_query("zone.test.", RecordType::AXFR, None);
        assert_eq!(rejected_code(&bytes), ResponseCode::NotImp);
        // NOTIFY / UPDATE opcodes.
        let mut m = Message::new();
        m.set_id(9)
            .set_op_code(OpCode::Update)
            .add_query(Query::query(name("a.test."), RecordType::SOA));
        assert_eq!(rejected_code(&m.to_vec().unwrap()), ResponseCode::NotImp);
        // Garbage after a valid header: FORMERR carrying the client's id.
        let mut bytes = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[63, b'x', b'y']);
        match read_query(&bytes) {
            Incoming::Reject(r) => {
                let m = Message::from_vec(&r).unwrap();
                assert_eq!(m.id(), 0xabcd);
                assert_eq!(m.response_code(), ResponseCode::FormErr);
                assert_eq!(m.message_type(), MessageType::Response);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn drops_short_messages_and_responses() {
        assert!(matches!(read_query(&[]), Incoming::Drop));
        assert!(matches!(read_query(&[1, 2, 3]), Incoming::Drop));
        assert!(matches!(read_query(&[0; 11]), Incoming::Drop));
        let mut m = Message::new();
        m.set_id(1)
            .set_message_type(MessageType::Response)
            .add_query(Query::query(name("a.test."), RecordType::A));
        assert!(matches!(read_query(&m.to_vec().unwrap()), Incoming::Drop));
    }

    /// Random bytes, and random corruptions of a valid query, never panic and never produce
    /// anything but a query, a well-formed rejection or a drop.
    #[test]
    fn random_bytes_never_panic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let valid = client_query("fuzz.example.com.", RecordType::A, Some(1232));
        for round in 0..20_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = rng.gen_range(0..300);
                (0..len).map(|_| rng.gen()).collect()
            } else {
                let mut b = valid.clone();
                for _ in 0..rng.gen_range(1..6) {
                    let i = rng.gen_range(0..b.len());
                    b[i] = rng.gen();
                }
                b.truncate(rng.gen_range(0..=b.len()));
                b
            };
            match read_query(&bytes) {
                Incoming::Query(q) => {
                    let answer = Answer::servfail();
                    let out = encode_answer(&q, &answer, Transport::Udp).unwrap();
                    assert!(out.len() <= q.udp_limit());
                }
                Incoming::Reject(r) => {
                    let m = Message::from_vec(&r).unwrap();
                    assert_eq!(m.message_type(), MessageType::Response);
                    assert_eq!(&r[..2], &bytes[..2], "reply carries the client's id");
                }
                Incoming::Drop => {}
            }
        }
    }

    #[test]
    fn answers_echo_the_question_and_flags() {
        let q = parsed(&client_query("Mixed.Case.test.", RecordType::A, Some(1232)));
        let answer = Answer {
            response_code: ResponseCode::NoError,
            answers: vec![a("mixed.case.test.", [10, 0, 0, 1], 30)],
            authority: vec![],
        };
        let m = Message::from_vec(&encode_answer(&q, &answer, Transport::Udp).unwrap()).unwrap();
        assert_eq!(m.id(), 0x4242);
        assert_eq!(m.message_type(), MessageType::Response);
        assert!(m.recursion_available() && m.recursion_desired());
        assert_eq!(m.queries()[0].name().to_ascii(), "Mixed.Case.test.");
        assert_eq!(m.answers().len(), 1);
        assert_eq!(
            m.max_payload(),
            ADVERTISED_UDP_SIZE,
            "OPT answered with OPT"
        );
        assert!(!m.truncated());
    }

    #[test]
    fn large_udp_answers_are_truncated_and_tcp_ones_are_not() {
        let big = Answer {
            response_code: ResponseCode::NoError,
            answers: (0..40)
                .map(|i| {
                    Record::from_rdata(
                        name("big.test."),
                        60,
                        RData::TXT(TXT::new(vec![format!("{i:0>60}")])),
                    )
                })
                .collect(),
            authority: vec![],
        };
        for edns in [None, Some(1232)] {
            let q = parsed(&client_query("big.test.", RecordType::TXT, edns));
            let udp = encode_answer(&q, &big, Transport::Udp).unwrap();
            assert!(udp.len() <= q.udp_limit());
            let m = Message::from_vec(&udp).unwrap();
            assert!(m.truncated(), "TC bit set");
            assert!(m.answers().is_empty());
            assert_eq!(m.queries().len(), 1);
            let tcp = encode_answer(&q, &big, Transport::Tcp).unwrap();
            let m = Message::from_vec(&tcp).unwrap();
            assert!(!m.truncated());
            assert_eq!(m.answers().len(), 40);
        }
        // An answer that fits 1232 but not 512.
        let mid = Answer {
            answers: big.answers[..10].to_vec(),
            ..big.clone()
        };
        let q = parsed(&client_query("big.test.", RecordType::TXT, None));
        let m = Message::from_vec(&encode_answer(&q, &mid, Transport::Udp).unwrap()).unwrap();
        assert!(m.truncated());
        let q = parsed(&client_query("big.test.", RecordType::TXT, Some(1232)));
        let m = Message::from_vec(&encode_answer(&q, &mid, Transport::Udp).unwrap()).unwrap();
        assert!(!m.truncated());
        assert_eq!(m.answers().len(), 10);
    }

    #[test]
    fn upstream_replies_must_match_id_and_question() {
        let query = Query::query(name("www.test."), RecordType::A);
        let mut reply = upstream_query(77, &query);
        reply.set_message_type(MessageType::Response);
        reply.queries_mut()[0].set_name(name("WWW.TEST."));
        let bytes = reply.to_vec().unwrap();
        assert!(read_reply(&bytes, 77, &query).is_ok(), "case-insensitive");
        assert_eq!(
            read_reply(&bytes, 78, &query).unwrap_err(),
            ReplyMismatch::OtherId
        );
        let other = Query::query(name("www.test."), RecordType::AAAA);
        assert_eq!(
            read_reply(&bytes, 77, &other).unwrap_err(),
            ReplyMismatch::OtherQuestion
        );
        let q = upstream_query(77, &query).to_vec().unwrap();
        assert_eq!(
            read_reply(&q, 77, &query).unwrap_err(),
            ReplyMismatch::NotResponse
        );
        assert_eq!(
            read_reply(&[1, 2], 77, &query).unwrap_err(),
            ReplyMismatch::Malformed
        );
    }

    #[test]
    fn cname_chains_are_reported_under_every_name() {
        let answers = vec![
            cname("www.shop.test.", "shop.cdn.test."),
            cname("shop.cdn.test.", "edge.cdn.test."),
            a("edge.cdn.test.", [192, 0, 2, 7], 60),
            Record::from_rdata(
                name("edge.cdn.test."),
                60,
                RData::AAAA(AAAA::from(
                    "2001:db8::7".parse::<std::net::Ipv6Addr>().unwrap(),
                )),
            ),
            // Not in the chain: must not be reported.
            a("unrelated.test.", [198, 51, 100, 1], 60),
        ];
        let got = resolved_names(&name("WWW.Shop.test."), &answers);
        let names: Vec<&str> = got.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["www.shop.test", "shop.cdn.test", "edge.cdn.test"]);
        for r in &got {
            assert_eq!(
                r.addresses,
                vec![
                    "192.0.2.7".parse::<IpAddr>().unwrap(),
                    "2001:db8::7".parse().unwrap()
                ]
            );
        }
        // A CNAME loop ends; no address, no report.
        let looped = vec![cname("a.test.", "b.test."), cname("b.test.", "a.test.")];
        assert!(resolved_names(&name("a.test."), &looped).is_empty());
    }
}
