//! The stand-in summary (rule 10): what a step folds the oldest middle rounds into when no
//! model's summary is on hand and cutting the middle's outputs cannot bring the prompt to the
//! target. It is written without a model, at once, from the folded items' bytes alone: one
//! line per round, its tool calls with the head of their arguments and the references
//! `condenser_recall` returns the round under, then the identifiers ledger a model's summary
//! carries (rule 11), so that what the agent read is named even before the summary is made,
//! or when the model's summary was refused. The same items always make the same text, so a
//! session that keeps it reads it the same on every request (rule 8), on every replica. The
//! model's summary replaces it at the next step.

use std::fmt::Write as _;
use std::ops::Range;

use serde_json::Value;

use crate::compaction::artifacts;
use crate::compaction::recall;
use crate::compaction::rewrite::STAND_IN_NOTE;
use crate::compaction::summary::Summary;
use crate::conversation::{content_text, Views};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;

/// What of a call's arguments, or of the model's words, its line shows: enough to tell one
/// command or file from another.
const HEAD_CHARS: usize = 80;

/// The longest message not of an agent's round a stand-in folds, written whole: a prompt
/// typed between rounds, a reminder a client adds.
pub(super) const WHOLE_MESSAGE_TOKENS: u32 = 200;

/// The stand-in for a summary of the items `span` of `messages` (their chat views), the
/// `pinned` task's items left out (they are kept verbatim before it), extending `base` (the
/// summary of the items before `span`, when there is one). References name the items in the
/// conversation `conversation`; the ledger of their identifiers takes at most `ledger_tokens`.
pub(super) fn stand_in(
    messages: &Views<'_>,
    (head, span): (usize, Range<usize>),
    pinned: Option<Range<usize>>,
    base: Option<&Summary>,
    (conversation, encoding, ledger_tokens): (&str, Encoding, u32),
) -> Summary {
    let mut text = String::new();
    if let Some(base) = base {
        text.push_str(&base.text);
        text.push('\n');
    }
    text.push_str(
        "Written without a model while the summary is made: one line per round, with the \
         references condenser_recall returns it under.",
    );
    let mut line = String::new();
    for index in span.clone() {
        if pinned.as_ref().is_some_and(|task| task.contains(&index)) {
            continue;
        }
        let Some(view) = messages.get(index) else {
            break;
        };
        let reference = recall::reference(conversation, index);
        let calls = view.get("tool_calls").and_then(Value::as_array);
        let role = view.get("role").and_then(Value::as_str).unwrap_or("item");
        match calls {
            // A round starts with the model's calls; its outputs add their references.
            Some(calls) if !calls.is_empty() => {
                flush(&mut text, &mut line);
                let named: Vec<String> = calls.iter().map(call_head).collect();
                let _ = write!(line, "- {} [{reference}", named.join("; "));
            }
            _ if !line.is_empty() && artifacts::is_tool_output(view) => {
                let _ = write!(line, ", {reference}");
            }
            _ => {
                flush(&mut text, &mut line);
                let said = content_text(view);
                // The model's words and a tool's output by their head; anyone else's whole,
                // as only a short message of theirs is folded (`WHOLE_MESSAGE_TOKENS`).
                let said = if role == "assistant" || artifacts::is_tool_output(view) {
                    one_line(&said)
                } else {
                    said.split_whitespace().collect::<Vec<_>>().join(" ")
                };
                let _ = write!(line, "- {role}: {said} [{reference}");
            }
        }
    }
    flush(&mut text, &mut line);
    let folded = span
        .clone()
        .filter(|index| !pinned.as_ref().is_some_and(|task| task.contains(index)))
        .filter_map(|index| messages.get(index));
    let text = artifacts::carry(text, None, folded, ledger_tokens, encoding);
    Summary {
        // Its line's note is counted with it, as the summary's framing counts the rest.
        tokens: count_text(encoding, &text) + count_text(encoding, STAND_IN_NOTE),
        text,
        messages: span.end - head,
        model: String::new(),
        created_at: 0,
        stand_in: true,
    }
}

/// Ends the round's line, if one is open.
fn flush(text: &mut String, line: &mut String) {
    if !line.is_empty() {
        text.push('\n');
        text.push_str(line);
        text.push(']');
        line.clear();
    }
}

/// A call as its line names it: the tool, and the head of its arguments.
fn call_head(call: &Value) -> String {
    let function = call.get("function").unwrap_or(call);
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("tool");
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    format!("{name}({})", one_line(&arguments))
}

/// `text` on one line, its first `HEAD_CHARS` characters, an ellipsis where it went on.
fn one_line(text: &str) -> String {
    let mut words = text.split_whitespace().flat_map(|word| [" ", word]).skip(1);
    let mut line = String::new();
    let mut chars = 0;
    for piece in words.by_ref() {
        let count = piece.chars().count();
        if chars + count > HEAD_CHARS {
            line.extend(piece.chars().take(HEAD_CHARS - chars));
            line.push('…');
            return line;
        }
        chars += count;
        line.push_str(piece);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round(i: usize) -> [Value; 2] {
        [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"),
                "type": "function", "function": {"name": "Bash",
                "arguments": format!("{{\"command\": \"seq -f 'turn-{i} row %g: alpha beta gamma delta epsilon zeta eta theta' 1 100\"}}")}}]}),
            json!({"role": "tool", "tool_call_id": format!("c{i}"),
                "content": format!("release build-7f3a{i}\n{}", "row\n".repeat(500))}),
        ]
    }

    fn conversation() -> Vec<Value> {
        let mut items = vec![
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "count the rows, and remember KX-7731-QZ"}),
        ];
        for i in 0..4 {
            items.extend(round(i));
        }
        items.push(json!({"role": "user", "content": "now   the\nnext   part"}));
        items
    }

    #[test]
    fn a_stand_in_has_one_line_per_round_naming_its_tool_arguments_and_references() {
        let views = Views::made(conversation());
        let made = stand_in(
            &views,
            (1, 1..11),
            Some(1..2),
            None,
            ("abcd", Encoding::O200k, 200),
        );
        let lines: Vec<&str> = made
            .text
            .lines()
            .skip(1)
            .take_while(|line| !line.is_empty())
            .collect();
        assert_eq!(lines.len(), 5, "{}", made.text);
        assert!(lines[0].starts_with("- Bash({\"command\": \"seq -f 'turn-0 row"));
        assert!(lines[0].ends_with(&format!(
            "[{}, {}]",
            recall::reference("abcd", 2),
            recall::reference("abcd", 3)
        )));
        assert!(lines[0].contains('…'), "the arguments' head only");
        assert_eq!(
            lines[4],
            format!(
                "- user: now the next part [{}]",
                recall::reference("abcd", 10)
            )
        );
        // The task is kept verbatim before it, and of an output's text only the identifiers
        // the ledger names.
        assert!(!made.text.contains("KX-7731-QZ"));
        for i in 0..4 {
            assert!(
                made.text.contains(&format!("build-7f3a{i}")),
                "{}",
                made.text
            );
        }
        assert!(!made.text.contains("row\nrow"));
        assert!(made.stand_in);
        assert_eq!(made.messages, 10);
        assert!(made.tokens > count_text(Encoding::O200k, &made.text));
    }

    #[test]
    fn a_tool_result_in_a_user_turn_joins_its_calls_line() {
        let mut items = conversation();
        // Rounds as the Messages view writes them: the output in a user turn.
        for item in &mut items[2..10] {
            if item["role"] == "tool" {
                let text = format!("[tool result c]\n{}", item["content"].as_str().unwrap());
                *item = json!({"role": "user", "content": text});
            }
        }
        let views = Views::made(items);
        let made = stand_in(
            &views,
            (1, 2..10),
            None,
            None,
            ("abcd", Encoding::O200k, 200),
        );
        let lines: Vec<&str> = made
            .text
            .lines()
            .filter(|line| line.contains("[ctx:"))
            .collect();
        assert_eq!(lines.len(), 4, "{}", made.text);
        assert!(
            lines.iter().all(|line| line.starts_with("- Bash(")),
            "{}",
            made.text
        );
        assert!(lines[0].ends_with(&format!(
            "[{}, {}]",
            recall::reference("abcd", 2),
            recall::reference("abcd", 3)
        )));
    }

    #[test]
    fn an_output_that_opens_the_fold_is_written_by_its_head() {
        // A fold that starts at a tool's output (no call's line open): in a user turn, and in
        // the older chat API's `function` role.
        let log = "row of a long log ".repeat(100);
        for (output, head) in [
            (
                json!({"role": "user", "content": format!("[tool result c]\n{log}")}),
                "- user: [tool result c]",
            ),
            (
                json!({"role": "function", "name": "f", "content": log}),
                "- function: row of a long log",
            ),
        ] {
            let views = Views::made(vec![
                json!({"role": "system", "content": "be brief"}),
                output,
            ]);
            let made = stand_in(
                &views,
                (1, 1..2),
                None,
                None,
                ("abcd", Encoding::O200k, 200),
            );
            let line = made.text.lines().nth(1).expect("its line");
            assert!(line.starts_with(head), "{}", made.text);
            assert!(line.contains('…') && line.len() < 200, "{line}");
        }
    }

    #[test]
    fn the_same_items_make_the_same_stand_in_and_a_base_comes_first() {
        let views = Views::made(conversation());
        let make = |base: Option<&Summary>| {
            stand_in(
                &views,
                (1, 6..10),
                None,
                base,
                ("abcd", Encoding::O200k, 200),
            )
        };
        assert_eq!(make(None), make(None));
        let base = Summary::story_so_far(5);
        let extended = make(Some(&base));
        assert!(extended.text.starts_with("the story so far\n"));
        let lines = extended.text.lines().take_while(|line| !line.is_empty());
        assert_eq!(lines.count(), 4, "{}", extended.text);
    }
}
