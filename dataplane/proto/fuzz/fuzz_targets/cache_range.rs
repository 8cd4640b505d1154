//! Range evaluation on arbitrary headers and lengths: never panics, and a partial answer is a
//! non-empty list of sorted, disjoint, non-adjacent ranges inside the representation whose
//! multipart layout adds up to its content length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::cache::range::{evaluate, multipart, RangeAnswer};

fuzz_target!(|data: &[u8]| {
    let Some((len_bytes, header)) = data.split_at_checked(8) else {
        return;
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(len_bytes);
    // Mostly small lengths (so ranges overlap the representation), sometimes huge ones.
    let raw = u64::from_le_bytes(n);
    let total = if raw & 1 == 0 { raw % 4096 } else { raw };
    match evaluate(Some(header), total) {
        RangeAnswer::Full => {}
        RangeAnswer::Unsatisfiable => assert!(total > 0),
        RangeAnswer::Partial(ranges) => {
            assert!(!ranges.is_empty());
            for r in &ranges {
                assert!(r.start <= r.end && r.end < total, "{r:?} of {total}");
            }
            for w in ranges.windows(2) {
                assert!(w[0].end + 1 < w[1].start, "{ranges:?}");
            }
            let plan = multipart(&ranges, total, Some("application/octet-stream"), "b0undary");
            let sum: u64 = plan
                .parts
                .iter()
                .fold(0u64, |acc, (p, r)| {
                    acc.saturating_add(p.len() as u64).saturating_add(r.len())
                })
                .saturating_add(plan.trailer.len() as u64);
            assert!(plan.content_length == sum || sum == u64::MAX);
        }
    }
});
