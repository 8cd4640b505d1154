//! Chunked-body scanning: never panics, never consumes more than given, and the result does not
//! depend on how the input is split into reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::http1::ChunkedScanner;

/// (total consumed, complete) or None on error.
fn scan_in_pieces(data: &[u8], cuts: &[usize]) -> Option<(usize, bool)> {
    let mut s = ChunkedScanner::new();
    let mut start = 0;
    let mut total = 0;
    for &cut in cuts.iter().chain(std::iter::once(&data.len())) {
        let cut = cut.clamp(start, data.len());
        let piece = &data[start..cut];
        let r = s.scan(piece).ok()?;
        assert!(r.consumed <= piece.len());
        total += r.consumed;
        if r.complete {
            return Some((total, true));
        }
        assert_eq!(r.consumed, piece.len());
        start = cut;
    }
    Some((total, false))
}

fuzz_target!(|input: &[u8]| {
    // First byte chooses split points; the rest is the body.
    let Some((&seed, data)) = input.split_first() else {
        return;
    };
    let whole = scan_in_pieces(data, &[]);
    let step = usize::from(seed % 16) + 1;
    let cuts: Vec<usize> = (step..data.len()).step_by(step).collect();
    let pieces = scan_in_pieces(data, &cuts);
    assert_eq!(whole, pieces);
    let bytewise: Vec<usize> = (1..data.len()).collect();
    assert_eq!(whole, scan_in_pieces(data, &bytewise));
});
