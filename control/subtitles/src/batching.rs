//! Translation batching as a runtime-free state machine: segments go to the provider in
//! numbered batches with surrounding context; a reply must have exactly one numbered line per
//! segment ([`reply`](crate::reply) reads it and ignores whatever surrounds the numbers). On a
//! mismatch the same batch is asked again once (with the wrong reply and a correction); if that
//! fails too the batch is split in halves, each asked on its own, down to single segments. Batches leave in source order, so results can be streamed as they come.
//!
//! Line breaks inside a segment travel as ` <br> ` and come back as `\n`.

use std::collections::VecDeque;
use std::ops::Range;

use serde::Serialize;

use crate::reply::{self, Mismatch};

/// A chat message in the OpenAI wire shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl Message {
    fn new(role: &'static str, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// Batching settings.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    pub batch_size: usize,
    pub context_lines: usize,
}

/// One request to make: the segments it covers and the messages to send.
#[derive(Debug, Clone)]
pub struct Ask {
    pub range: Range<usize>,
    pub messages: Vec<Message>,
    /// This is the second try of the same range.
    pub reask: bool,
}

/// What to do after a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The range is translated: one text per segment, in order.
    Accepted {
        range: Range<usize>,
        texts: Vec<String>,
    },
    /// The reply did not fit; the same range will be asked again ([`BatchPlan::next_ask`]).
    Reask { expected: usize, got: usize },
    /// Asked twice without a fitting reply; the range was split in two.
    Split { expected: usize, got: usize },
    /// A single segment could not be translated after two tries.
    Failed { index: usize, got: usize },
}

#[derive(Debug, Clone)]
struct Work {
    range: Range<usize>,
    /// The reply to the first try, when this is the re-ask.
    previous_reply: Option<String>,
}

/// The plan for one job's segments.
#[derive(Debug)]
pub struct BatchPlan {
    texts: Vec<String>,
    source_name: String,
    target_name: String,
    cfg: BatchConfig,
    queue: VecDeque<Work>,
}

const BR: &str = " <br> ";
/// A re-ask quotes at most this much of the wrong reply.
const MAX_QUOTED_REPLY: usize = 8000;

impl BatchPlan {
    /// `source_name`/`target_name` are language names for the prompt (`None` source = "the
    /// source language").
    pub fn new(
        texts: &[String],
        source_name: Option<&str>,
        target_name: &str,
        cfg: BatchConfig,
    ) -> Self {
        let size = cfg.batch_size.max(1);
        let queue = (0..texts.len())
            .step_by(size)
            .map(|start| Work {
                range: start..(start + size).min(texts.len()),
                previous_reply: None,
            })
            .collect();
        BatchPlan {
            texts: texts
                .iter()
                .map(|t| {
                    t.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .collect::<Vec<_>>()
                        .join(BR)
                })
                .collect(),
            source_name: source_name.unwrap_or("the source language").to_string(),
            target_name: target_name.to_string(),
            cfg,
            queue,
        }
    }

    /// The next request, in source order; `None` when everything is translated.
    pub fn next_ask(&self) -> Option<Ask> {
        let work = self.queue.front()?;
        Some(Ask {
            range: work.range.clone(),
            messages: self.messages(work),
            reask: work.previous_reply.is_some(),
        })
    }

    /// Feeds the reply to the ask last returned by [`next_ask`](Self::next_ask).
    pub fn answer(&mut self, reply: &str) -> Outcome {
        let Some(work) = self.queue.pop_front() else {
            return Outcome::Failed { index: 0, got: 0 };
        };
        let expected = work.range.len();
        match reply::parse_reply(reply, expected) {
            Ok(texts) => Outcome::Accepted {
                range: work.range,
                texts: texts
                    .into_iter()
                    .map(|t| {
                        t.replace("<br>", "\n")
                            .lines()
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .collect(),
            },
            Err(Mismatch { numbered: got }) if work.previous_reply.is_none() => {
                let mut quoted = reply.to_string();
                if quoted.len() > MAX_QUOTED_REPLY {
                    let mut cut = MAX_QUOTED_REPLY;
                    while !quoted.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    quoted.truncate(cut);
                }
                self.queue.push_front(Work {
                    range: work.range,
                    previous_reply: Some(quoted),
                });
                Outcome::Reask { expected, got }
            }
            Err(Mismatch { numbered: got }) if expected > 1 => {
                let mid = work.range.start + expected / 2;
                self.queue.push_front(Work {
                    range: mid..work.range.end,
                    previous_reply: None,
                });
                self.queue.push_front(Work {
                    range: work.range.start..mid,
                    previous_reply: None,
                });
                Outcome::Split { expected, got }
            }
            Err(Mismatch { numbered: got }) => Outcome::Failed {
                index: work.range.start,
                got,
            },
        }
    }

    fn messages(&self, work: &Work) -> Vec<Message> {
        let n = work.range.len();
        let system = format!(
            "You translate video subtitles from {src} into {tgt}. You receive {n} numbered lines. \
             Reply with exactly {n} lines, numbered 1 to {n} in the same order, each written as \
             `<number>. <translation>`, one line per numbered input line and nothing else: no \
             notes, no blank lines, no merged or split lines. Keep `<br>` where a line break \
             belongs. Lines under \"Context\" are only there to help you understand; do not \
             translate or repeat them.",
            src = self.source_name,
            tgt = self.target_name,
        );
        let ctx = self.cfg.context_lines;
        let before = work.range.start.saturating_sub(ctx)..work.range.start;
        let after = work.range.end..(work.range.end + ctx).min(self.texts.len());
        let mut user = String::new();
        if !before.is_empty() {
            user.push_str("Context before (do not translate):\n");
            for t in &self.texts[before] {
                user.push_str(&format!("- {t}\n"));
            }
            user.push('\n');
        }
        user.push_str(&format!("Translate these {n} lines:\n"));
        for (i, t) in self.texts[work.range.clone()].iter().enumerate() {
            user.push_str(&format!("{}. {t}\n", i + 1));
        }
        if !after.is_empty() {
            user.push_str("\nContext after (do not translate):\n");
            for t in &self.texts[after] {
                user.push_str(&format!("- {t}\n"));
            }
        }
        let mut messages = vec![Message::new("system", system), Message::new("user", user)];
        if let Some(previous) = &work.previous_reply {
            let got = reply::parse_reply(previous, n)
                .err()
                .map_or(n, |m| m.numbered);
            messages.push(Message::new("assistant", previous.clone()));
            messages.push(Message::new(
                "user",
                format!(
                    "Your reply had {got} numbered lines, but exactly {n} are required, one per \
                     numbered line. Reply again with exactly {n} lines numbered 1 to {n}, each \
                     written as `<number>. <translation>`."
                ),
            ));
        }
        messages
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("line {i}")).collect()
    }

    fn reply_for(range: &Range<usize>) -> String {
        range
            .clone()
            .enumerate()
            .map(|(i, s)| format!("{}. T{s}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn batches_in_order_with_context() {
        let cfg = BatchConfig {
            batch_size: 2,
            context_lines: 1,
        };
        let mut plan = BatchPlan::new(&texts(5), Some("English"), "Spanish", cfg);
        let mut done = Vec::new();
        while let Some(ask) = plan.next_ask() {
            let user = &ask.messages[1].content;
            if ask.range.start == 2 {
                assert!(user.contains("Context before (do not translate):\n- line 1\n"));
                assert!(user.contains("1. line 2\n2. line 3\n"));
                assert!(user.contains("Context after (do not translate):\n- line 4\n"));
            }
            assert!(ask.messages[0]
                .content
                .contains("from English into Spanish"));
            match plan.answer(&reply_for(&ask.range)) {
                Outcome::Accepted { range, texts } => {
                    assert_eq!(range.len(), texts.len());
                    done.extend(texts);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(done, ["T0", "T1", "T2", "T3", "T4"]);
    }

    #[test]
    fn mismatch_reasks_once_then_splits_then_fails() {
        let cfg = BatchConfig {
            batch_size: 4,
            context_lines: 0,
        };
        let mut plan = BatchPlan::new(&texts(4), None, "French", cfg);
        let ask = plan.next_ask().unwrap();
        assert!(!ask.reask);
        assert_eq!(
            plan.answer("1. a\n2. b\n3. c"),
            Outcome::Reask {
                expected: 4,
                got: 3
            }
        );
        let ask = plan.next_ask().unwrap();
        assert!(ask.reask);
        assert_eq!(ask.range, 0..4);
        assert_eq!(ask.messages.len(), 4);
        assert_eq!(ask.messages[2].role, "assistant");
        assert!(ask.messages[3]
            .content
            .contains("had 3 numbered lines, but exactly 4"));
        assert_eq!(
            plan.answer("1. a"),
            Outcome::Split {
                expected: 4,
                got: 1
            }
        );
        let ask = plan.next_ask().unwrap();
        assert_eq!((ask.range.clone(), ask.reask), (0..2, false));
        assert!(matches!(
            plan.answer("1. x\n2. y"),
            Outcome::Accepted { .. }
        ));
        assert_eq!(plan.next_ask().unwrap().range, 2..4);
        assert!(matches!(plan.answer("nope"), Outcome::Reask { .. }));
        assert!(matches!(plan.answer("nope"), Outcome::Split { .. }));
        assert_eq!(plan.next_ask().unwrap().range, 2..3);
        assert!(matches!(plan.answer("1. a\n2. b"), Outcome::Reask { .. }));
        assert_eq!(
            plan.answer("1. a\n2. b"),
            Outcome::Failed { index: 2, got: 2 }
        );
    }

    #[test]
    fn line_breaks_travel_as_br() {
        let cfg = BatchConfig {
            batch_size: 5,
            context_lines: 0,
        };
        let mut plan = BatchPlan::new(&["one\ntwo".to_string()], None, "German", cfg);
        let ask = plan.next_ask().unwrap();
        assert!(ask.messages[1].content.contains("1. one <br> two\n"));
        assert_eq!(
            plan.answer("1. eins <br> zwei"),
            Outcome::Accepted {
                range: 0..1,
                texts: vec!["eins\nzwei".into()]
            }
        );
        assert!(plan.next_ask().is_none());
        assert!(BatchPlan::new(&[], None, "German", cfg)
            .next_ask()
            .is_none());
    }
}
