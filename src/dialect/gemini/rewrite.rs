//! A compaction written into a Gemini request: a user turn first, every `functionCall` turn
//! with the `functionResponse` turn after it, and the head (`systemInstruction`) untouched
//! unless the summary goes there.

use serde_json::{json, Map, Value};

use crate::compaction::rewrite::Rewrite;
use crate::config::SummaryRole;
use crate::dialect::gemini::view::{is_user, response_texts};
use crate::tokens::encoding::Encoding;

/// The turns a compaction leaves, starting with a user turn: the pinned task first when there
/// is one, the summary after its text (or in `systemInstruction`, when so configured); else
/// the summary before the first kept user turn's parts, or in a user turn of its own before a
/// kept model turn; then the kept turns, function responses cut as planned.
pub(super) fn compacted_contents(
    body: &mut Map<String, Value>,
    mut sent: Vec<Value>,
    rewrite: &Rewrite,
    summary: Option<String>,
    summary_role: SummaryRole,
    encoding: Encoding,
) -> Vec<Value> {
    let kept_from = rewrite.kept_from.min(sent.len());
    let mut kept = sent.split_off(kept_from);
    rewrite.cut_kept_outputs(&mut kept, kept_from, encoding, response_texts);
    let summary = match summary {
        Some(summary) if summary_role == SummaryRole::System => {
            append_to_system_instruction(body, summary);
            None
        }
        summary => summary,
    };
    if let Some(task) = rewrite.pinned.clone() {
        let mut pinned: Vec<Value> = sent.drain(task).collect();
        // After the turn's last user text, so the summary changes nothing before it.
        if let (Some(summary), Some(prompt)) =
            (summary, pinned.iter_mut().rev().find(|t| is_user(t)))
        {
            add_text_part(prompt, summary, |parts, part| parts.push(part));
        }
        pinned.append(&mut kept);
        return pinned;
    }
    let starts_with_user = kept.first().is_some_and(is_user);
    match (summary, kept.first_mut()) {
        (Some(summary), Some(first)) if starts_with_user => {
            add_text_part(first, summary, |parts, part| parts.insert(0, part));
        }
        (Some(summary), _) => kept.insert(0, user_turn(summary)),
        // Trimmed without a summary: the first turn must be the user's.
        (None, _) if !starts_with_user => kept.insert(
            0,
            user_turn(format!("[{kept_from} earlier messages omitted]")),
        ),
        (None, _) => {}
    }
    kept
}

fn user_turn(text: String) -> Value {
    json!({"role": "user", "parts": [{"text": text}]})
}

/// A text part placed among a turn's parts by `place`, the turn's keys kept in their order.
fn add_text_part(turn: &mut Value, text: String, place: fn(&mut Vec<Value>, Value)) {
    let Some(turn) = turn.as_object_mut() else {
        return;
    };
    let parts = turn.entry("parts").or_insert(Value::Null);
    let mut list = match std::mem::take(parts) {
        Value::Array(list) => list,
        _ => Vec::new(),
    };
    place(&mut list, json!({"text": text}));
    *parts = Value::Array(list);
}

/// The summary as a text part after `systemInstruction`'s own, which stay as they were.
fn append_to_system_instruction(body: &mut Map<String, Value>, summary: String) {
    match body.get_mut("systemInstruction") {
        Some(instruction @ Value::Object(_)) => {
            add_text_part(instruction, summary, |parts, part| parts.push(part));
        }
        Some(Value::String(instruction)) if !instruction.is_empty() => {
            instruction.push_str("\n\n");
            instruction.push_str(&summary);
        }
        _ => {
            body.insert(
                "systemInstruction".into(),
                json!({"parts": [{"text": summary}]}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_goes_into_the_system_instruction_after_its_own_parts() {
        let mut body =
            json!({"systemInstruction": {"role": "system", "parts": [{"text": "rules"}]}})
                .as_object()
                .unwrap()
                .clone();
        append_to_system_instruction(&mut body, "S".into());
        assert_eq!(
            body["systemInstruction"],
            json!({"role": "system", "parts": [{"text": "rules"}, {"text": "S"}]})
        );
        let mut body = Map::new();
        append_to_system_instruction(&mut body, "S".into());
        assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "S"}]}));
    }
}
