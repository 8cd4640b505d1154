//! The subtitle reply parser on arbitrary model output: never panics; an accepted answer has
//! exactly one non-empty text per segment, each taken from a line of the reply; and a proper
//! answer wrapped in chatter (a preamble, a closing remark, a code fence, any numbering style
//! it accepts) is read back exactly.
//!
//! The parser module is std-only and compiled here straight from the service's source, so this
//! crate does not build the service's dependency tree (sqlx, reqwest, axum) under the fuzzer.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/reply.rs"]
#[allow(dead_code)]
mod reply;

const STYLES: [&str; 7] = ["N. ", "N) ", "N: ", "[N] ", "(N) ", "N - ", "**N.** "];

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let expected = usize::from(first % 24);
    let text = String::from_utf8_lossy(rest);

    // 1. arbitrary replies
    match reply::parse_reply(&text, expected) {
        Ok(texts) => {
            assert_eq!(texts.len(), expected);
            for t in &texts {
                assert!(!t.is_empty());
                assert!(!t.contains('\n'));
                assert!(text.lines().any(|l| l.contains(t.as_str())), "{t:?} is not from the reply");
            }
        }
        Err(m) => assert!(m.numbered <= text.lines().count()),
    }

    // 2. a real answer built from the input's lines, wrapped in chatter, is read back exactly
    let answers: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("**"))
        .take(20)
        .collect();
    if answers.is_empty() {
        return;
    }
    let style = STYLES[usize::from(first) % STYLES.len()];
    let mut built = String::from("Here are the translations:\n\n");
    if first & 0x80 != 0 {
        built.push_str("```text\n");
    }
    for (i, a) in answers.iter().enumerate() {
        built.push_str(&style.replace('N', &(i + 1).to_string()));
        built.push_str(a);
        built.push('\n');
    }
    if first & 0x80 != 0 {
        built.push_str("```\n");
    }
    built.push_str("\nLet me know if you need anything else.");
    let got = reply::parse_reply(&built, answers.len()).expect("a wrapped answer is accepted");
    assert_eq!(got.len(), answers.len());
    for (g, a) in got.iter().zip(&answers) {
        // a text that itself starts like a bold marker or a fence may lose that prefix
        if !a.starts_with("```") {
            assert_eq!(g, a.trim_start_matches("**").trim());
        }
    }
});
