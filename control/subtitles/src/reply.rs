//! Reading a translation model's numbered reply (runtime-free, std only, so the fuzz target in
//! `control/subtitles/fuzz` compiles it on its own).
//!
//! Models wrap their answer in things a person skips without thinking: a preamble ("Here are the
//! translations:"), an echo of the prompt before the answer, a code fence, a closing remark. Only
//! numbered lines count (`1. text`, `1) text`, `1: text`, `1 - text`, `[1] text`, `(1) text`,
//! also in markdown bold `**1.** text`); every other line is ignored, so chatter never becomes a
//! subtitle. Numbered lines form runs (a number not above the previous one starts a new run); the
//! answer is the last run numbered exactly 1..=expected with a non-empty text on each line. A
//! merged, dropped, repeated or extra number leaves no such run: a [`Mismatch`], and the caller
//! asks again.

/// No run of numbered lines answers every segment exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Numbered lines in the run that came closest (the last run), for the re-ask message.
    pub numbered: usize,
}

/// The longest segment number read; longer digit strings are text, not numbers.
const MAX_DIGITS: usize = 6;

/// A numbered line → (number, text). `None` for anything else (preambles, prose, context
/// bullets, code fences, numbers without a separator such as "1990 was a year").
pub fn numbered(line: &str) -> Option<(usize, &str)> {
    let line = line.trim();
    let (line, bold) = match line.strip_prefix("**") {
        Some(rest) => (rest.trim_start(), true),
        None => (line, false),
    };
    let (n, rest) = if let Some(inner) = line.strip_prefix('[') {
        let (n, rest) = leading_number(inner)?;
        (n, rest.strip_prefix(']')?)
    } else if let Some(inner) = line.strip_prefix('(') {
        let (n, rest) = leading_number(inner)?;
        (n, rest.strip_prefix(')')?)
    } else {
        let (n, rest) = leading_number(line)?;
        let spaced = rest.trim_start();
        let rest = match spaced.strip_prefix(['.', ')', ':']) {
            Some(r) => r,
            // `1 - text`; `1-2 people` and `1 -2` are text
            None if spaced.len() < rest.len() => spaced
                .strip_prefix(['-', '–'])
                .filter(|r| r.starts_with(char::is_whitespace))?,
            None => return None,
        };
        (n, rest)
    };
    let mut text = rest.trim();
    if bold {
        text = text.strip_prefix("**").unwrap_or(text).trim_start();
    }
    Some((n, text))
}

/// Leading ASCII digits (1 to [`MAX_DIGITS`]) as a number, and the rest.
fn leading_number(s: &str) -> Option<(usize, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > MAX_DIGITS {
        return None;
    }
    let n = s.get(..digits)?.parse().ok()?;
    Some((n, s.get(digits..)?))
}

fn is_fence(line: &str) -> bool {
    line.trim_start().starts_with("```")
}

/// The texts of segments 1..=`expected`, in order, read from the last complete numbered run.
pub fn parse_reply(reply: &str, expected: usize) -> Result<Vec<String>, Mismatch> {
    let mut runs: Vec<Vec<(usize, &str)>> = Vec::new();
    for line in reply.lines().filter(|l| !is_fence(l)) {
        let Some((n, text)) = numbered(line) else {
            continue;
        };
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|&(last, _)| n > last) => run.push((n, text)),
            _ => runs.push(vec![(n, text)]),
        }
    }
    let complete = |run: &&Vec<(usize, &str)>| {
        run.len() == expected
            && run
                .iter()
                .enumerate()
                .all(|(i, &(n, text))| n == i + 1 && !text.is_empty())
    };
    match runs.iter().rev().find(complete) {
        Some(run) if expected > 0 => Ok(run.iter().map(|&(_, t)| t.to_string()).collect()),
        _ => Err(Mismatch {
            numbered: runs.last().map_or(0, Vec::len),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ANSWER: [&str; 3] = ["Hola", "¿Qué tal?", "Bien"];

    fn ok(reply: &str) -> Vec<String> {
        parse_reply(reply, 3).unwrap_or_else(|e| panic!("{e:?} for {reply:?}"))
    }

    #[test]
    fn numbering_styles() {
        for style in [
            "{}. ", "{}) ", "{}: ", "[{}] ", "({}) ", "{} - ", "**{}.** ", "{}.\t",
        ] {
            let reply: String = ANSWER
                .iter()
                .enumerate()
                .map(|(i, t)| format!("{}{t}\n", style.replace("{}", &(i + 1).to_string())))
                .collect();
            assert_eq!(ok(&reply), ANSWER, "{style:?}");
        }
        assert_eq!(numbered("12.Hola"), Some((12, "Hola")));
        assert_eq!(numbered("  3 :  x  "), Some((3, "x")));
        assert_eq!(numbered("1990 was a year"), None);
        assert_eq!(numbered("1. 1990: a year"), Some((1, "1990: a year")));
        assert_eq!(numbered("1-2 people"), None, "a range, not a numbered line");
        assert_eq!(numbered("- 1. context bullet"), None);
        assert_eq!(numbered("1234567. too long"), None);
        assert_eq!(numbered("[1 missing bracket"), None);
        assert_eq!(numbered("Here are the translations:"), None);
    }

    #[test]
    fn surroundings_are_ignored() {
        // preamble and closing remark
        assert_eq!(
            ok("Here are the translations:\n\n1. Hola\n2. ¿Qué tal?\n3. Bien\n\nLet me know!"),
            ANSWER
        );
        // a code block, with its language tag and prose around it
        assert_eq!(
            ok("Sure!\n```text\n1) Hola\n2) ¿Qué tal?\n3) Bien\n```\nDone."),
            ANSWER
        );
        // the prompt echoed before the answer: the last complete run is the answer
        assert_eq!(
            ok("Translate these 3 lines:\n1. Hello\n2. How are you?\n3. Fine\n\n\
                Context after (do not translate):\n- Four\n\nTranslation:\n1. Hola\n2. ¿Qué tal?\n3. Bien"),
            ANSWER
        );
        // blank lines between numbered lines
        assert_eq!(ok("1. Hola\n\n2. ¿Qué tal?\n\n3. Bien\n"), ANSWER);
    }

    #[test]
    fn lines_not_tied_to_a_number_are_never_accepted() {
        // the confirmed defect: an unnumbered correction with the right line count
        assert_eq!(
            parse_reply(
                "I apologize for the confusion.\nHere is the corrected answer:\nBien",
                3
            ),
            Err(Mismatch { numbered: 0 })
        );
        assert_eq!(parse_reply("Lo siento.", 1), Err(Mismatch { numbered: 0 }));
        // a continuation line is dropped, never glued to a segment or counted as one
        assert_eq!(ok("1. Hola\n   (informal)\n2. ¿Qué tal?\n3. Bien"), ANSWER);
        assert_eq!(parse_reply("", 1), Err(Mismatch { numbered: 0 }));
        assert_eq!(parse_reply("1. x", 0), Err(Mismatch { numbered: 1 }));
    }

    #[test]
    fn merged_dropped_repeated_or_extra_lines_are_mismatches() {
        let m = |reply: &str| parse_reply(reply, 3).unwrap_err().numbered;
        assert_eq!(m("1. Hola ¿qué tal?\n2. Bien"), 2, "merged");
        assert_eq!(m("1. Hola\n3. Bien"), 2, "dropped");
        assert_eq!(m("1. Hola\n2. ¿Qué tal?"), 2, "dropped at the end");
        assert_eq!(m("1. Hola\n2. ¿Qué tal?\n3. Bien\n4. Cuatro"), 4, "extra");
        assert_eq!(m("2. ¿Qué tal?\n1. Hola\n3. Bien"), 2, "out of order");
        assert_eq!(
            m("1. Hola\n2. ¿Qué tal?\n2. ¿Qué tal?\n3. Bien"),
            2,
            "repeated"
        );
        assert_eq!(m("1. Hola\n2.\n3. Bien"), 3, "an empty text");
        assert_eq!(m("Hola\n¿Qué tal?\nBien"), 0, "not numbered");
    }
}
