//! What the summarizer is asked: the summary's sections, the question asked apart or through
//! the session, and the transcript of the messages a summary replaces, in chunks that fit.

use serde_json::Value;

use crate::conversation::content_text;
use crate::tokens::rules::shorten_middle;

/// Tool outputs are cut to this many tokens (head and end) before the summarizer sees them.
pub(super) const TOOL_OUTPUT_TOKENS: u32 = 600;
/// What a summary holds, and how it is written: the same asked apart or through the session.
macro_rules! summary_sections {
    () => {
        "Write a faithful summary with exactly \
these sections, in this order, each as a markdown heading. Under each, write \"none\" when it is empty.\n\
\n\
## Goal and constraints\nWhat the user wants and every constraint they set, quoting the user's own words where they matter.\n\
## Decisions\nWhat was decided, and why.\n\
## Facts and identifiers\nNames, numbers with units, IDs, URLs, paths, versions, dates: copied verbatim, never paraphrased.\n\
## Artifacts\nFiles, commands, code, errors and their messages that matter to the work.\n\
## Progress\nDone, in progress and pending, as the conversation's own plan marks them.\n\
## Open questions\nWhat is unresolved or waiting on the user.\n\
## Next step\nWhat the assistant was about to do.\n\
\n\
Write only the summary, no preamble. Never invent anything not in the transcript."
    };
}

/// The sections the prompt asks for, as its headings name them (`summary_check`).
pub(super) const SECTIONS: [&str; 7] = [
    "Goal and constraints",
    "Decisions",
    "Facts and identifiers",
    "Artifacts",
    "Progress",
    "Open questions",
    "Next step",
];

pub(super) const INSTRUCTIONS: &str = concat!(
    "You compress the earlier part of a conversation between a user and an AI assistant \
so the assistant can continue the work without the original messages. ",
    summary_sections!()
);

/// The turn appended to the session's own request (`summarizer.via`); `{recent}` is how many
/// of its last messages the summary leaves out.
pub(super) const SESSION_INSTRUCTIONS: &str = concat!(
    "You compress the earlier part of the conversation above so that you can continue the \
work without its messages. Cover everything above except the last {recent} messages, which stay \
as they are: the instructions, any earlier summary, and every message before those. Answer in \
text only, calling no tool. ",
    summary_sections!()
);

pub(super) const EXTEND_INSTRUCTIONS: &str = "Below are the existing summary of the conversation so far and the messages \
that came after it. Return the updated summary: the same sections, with the new messages folded in, keeping \
every fact of the existing summary that is still true. Do not summarize the summary; update it.";

/// One message as the summarizer will see it, with its token count.
#[derive(Debug, Clone)]
pub struct Evicted {
    pub message: Value,
    pub tokens: u32,
    /// A tool output its tool's policy keeps whole (`cut = "never"`), in the span too.
    pub whole: bool,
}

/// `tokens` tokens of text in every encoding: one word, each a token of its own.
pub(super) fn placeholder(tokens: u32) -> String {
    let mut text = String::from("summary");
    for _ in 1..tokens {
        text.push_str(" summary");
    }
    text
}

/// Groups messages, in order, so each group's tokens stay under the budget.
pub(super) fn chunks(messages: &[Evicted], budget: u32) -> Vec<&[Evicted]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut used = 0u64;
    for (i, m) in messages.iter().enumerate() {
        let tokens = u64::from(transcript_tokens(m, budget));
        if i > start && used + tokens > u64::from(budget) {
            out.push(&messages[start..i]);
            start = i;
            used = 0;
        }
        used += tokens;
    }
    if start < messages.len() {
        out.push(&messages[start..]);
    }
    out
}

fn is_tool_output(message: &Value) -> bool {
    matches!(
        message.get("role").and_then(Value::as_str),
        Some("tool" | "function")
    )
}

/// How much of a message the summarizer sees: tool outputs are cut short, and no message is
/// larger than one chunk.
fn keep_tokens(m: &Evicted, budget: u32) -> u32 {
    if is_tool_output(&m.message) && !m.whole {
        TOOL_OUTPUT_TOKENS.min(budget)
    } else {
        budget
    }
}

fn transcript_tokens(m: &Evicted, budget: u32) -> u32 {
    m.tokens.min(keep_tokens(m, budget) + 20)
}

pub(super) fn render_transcript(messages: &[Evicted], budget: u32) -> String {
    let mut out = String::new();
    for m in messages {
        let message = &m.message;
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        out.push_str("### ");
        out.push_str(role);
        if let Some(name) = message.get("name").and_then(Value::as_str) {
            out.push_str(&format!(" ({name})"));
        }
        out.push('\n');
        out.push_str(&shorten_middle(
            &content_text(message),
            m.tokens,
            keep_tokens(m, budget),
        ));
        out.push('\n');
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            for call in calls {
                let f = call.get("function");
                let field = |k: &str| {
                    f.and_then(|f| f.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                };
                out.push_str(&format!(
                    "→ calls {}({})\n",
                    field("name"),
                    field("arguments")
                ));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::encoding::Encoding;
    use serde_json::json;

    /// o200k_harmony is o200k's vocabulary with more special tokens, and is left to the
    /// counter's test that it is built only on first use.
    #[test]
    fn a_placeholder_is_as_long_as_its_budget_in_every_encoding() {
        for encoding in [Encoding::Cl100k, Encoding::O200k] {
            for tokens in [1, 37, 1024] {
                let text = placeholder(tokens);
                assert_eq!(
                    crate::tokens::rules::count_text(encoding, &text),
                    tokens,
                    "{encoding:?}"
                );
            }
        }
    }

    #[test]
    fn the_sections_checked_are_those_the_prompt_asks_for() {
        let asked: Vec<&str> = INSTRUCTIONS
            .lines()
            .filter_map(|line| line.strip_prefix("## "))
            .collect();
        assert_eq!(asked, SECTIONS);
        assert!(SESSION_INSTRUCTIONS.contains("## Next step\n"));
    }

    #[test]
    fn chunks_respect_the_budget_and_order() {
        let m = |t| Evicted {
            message: json!({"role": "user", "content": "x"}),
            tokens: t,
            whole: false,
        };
        let messages = vec![m(400), m(400), m(400), m(5000), m(10)];
        let groups = chunks(&messages, 1000);
        let sizes: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        assert_eq!(sizes, vec![2, 1, 1, 1]);
    }
}
