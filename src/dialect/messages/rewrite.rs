//! A compaction written into a Messages request: a user turn first, roles alternating, every
//! `tool_use` with its `tool_result`.

use serde_json::{json, Map, Value};

use crate::compaction::plan::Split;
use crate::compaction::rewrite::Rewrite;
use crate::config::SummaryRole;
use crate::dialect::messages::view::{block_type, is_user};

/// The messages a compaction leaves, starting with a user turn: the pinned task first when
/// there is one, the summary after its content (or in `system`, when so configured); else
/// the summary merged into the first kept user turn, or in a user turn of its own before a
/// kept assistant turn, or in `system` when so configured (and the kept part starts with a
/// user turn); then the kept messages, their tool results cut already
/// (`Origins::cut_outputs`). With them, each one's
/// origin: the sent message it is unchanged from, or None for one made or changed here (what
/// `spliced` writes out).
pub(super) fn compacted_messages(
    body: &mut Map<String, Value>,
    mut sent: Vec<Value>,
    split: &Split,
    rewrite: &Rewrite,
    summary: Option<String>,
    summary_role: SummaryRole,
) -> (Vec<Value>, Vec<Option<usize>>) {
    // Each step below on the messages is taken on their origins too.
    let mut sent_origins: Vec<Option<usize>> = (0..sent.len()).map(Some).collect();
    let kept_from = rewrite.kept_from.min(sent.len());
    let mut kept = sent.split_off(kept_from);
    let mut kept_origins = sent_origins.split_off(kept_from);
    if let Some(task) = rewrite.pinned.clone() {
        let mut pinned: Vec<Value> = sent.drain(task.clone()).collect();
        let mut pinned_origins: Vec<Option<usize>> = sent_origins.drain(task).collect();
        // After the turn's last user message, so the summary changes nothing before it.
        match (summary, pinned.iter().rposition(is_user)) {
            (Some(summary), _) if summary_role == SummaryRole::System => {
                append_to_system(body, summary)
            }
            (Some(summary), Some(prompt)) => {
                append_text(&mut pinned[prompt], summary);
                pinned_origins[prompt] = None;
            }
            _ => {}
        }
        pinned.append(&mut kept);
        pinned_origins.append(&mut kept_origins);
        return (
            with_head(sent, split.head, pinned),
            with_head(sent_origins, split.head, pinned_origins),
        );
    }
    let starts_with_user = kept.first().is_some_and(is_user);
    match summary {
        Some(summary) if summary_role == SummaryRole::System && starts_with_user => {
            append_to_system(body, summary);
        }
        Some(summary) if starts_with_user => {
            if let Some(first) = kept.first_mut() {
                prepend_text(first, summary);
                kept_origins[0] = None;
            }
        }
        Some(summary) => {
            kept.insert(0, user_turn(summary));
            kept_origins.insert(0, None);
        }
        // Trimmed without a summary: Anthropic's first turn must be the user's.
        None if !starts_with_user => {
            kept.insert(
                0,
                user_turn(format!("[{kept_from} earlier messages omitted]")),
            );
            kept_origins.insert(0, None);
        }
        None => {}
    }
    (
        with_head(sent, split.head, kept),
        with_head(sent_origins, split.head, kept_origins),
    )
}

/// `rest` after the conversation's leading system turns, if it opens with any: kept as the
/// head is in every dialect.
pub(super) fn with_head<T>(mut sent: Vec<T>, head: usize, mut rest: Vec<T>) -> Vec<T> {
    sent.truncate(head);
    sent.append(&mut rest);
    sent
}

pub(super) fn user_turn(text: String) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}]})
}

/// The summary as a text block before the turn's own content.
pub(super) fn prepend_text(message: &mut Value, text: String) {
    add_text_block(message, text, |blocks, block| blocks.insert(0, block));
}

/// The summary as a text block after the turn's own content (the pinned task, verbatim).
pub(super) fn append_text(message: &mut Value, text: String) {
    add_text_block(message, text, |blocks, block| blocks.push(block));
}

pub(super) fn add_text_block(message: &mut Value, text: String, place: fn(&mut Vec<Value>, Value)) {
    let Some(message) = message.as_object_mut() else {
        return;
    };
    let block = json!({"type": "text", "text": text});
    // Taken and put back in its place, so the turn's keys keep their order.
    let content = message.entry("content").or_insert(Value::Null);
    let mut blocks = match std::mem::take(content) {
        Value::Array(blocks) => blocks,
        Value::String(own) => vec![json!({"type": "text", "text": own})],
        _ => Vec::new(),
    };
    place(&mut blocks, block);
    *content = Value::Array(blocks);
}

/// After the original `system`: joined to a string, or a text block after its blocks (their
/// `cache_control` marks untouched, so a cached prefix stays cached).
pub(super) fn append_to_system(body: &mut Map<String, Value>, summary: String) {
    match body.get_mut("system") {
        Some(Value::String(system)) if !system.is_empty() => {
            system.push_str("\n\n");
            system.push_str(&summary);
        }
        Some(Value::Array(blocks)) => blocks.push(json!({"type": "text", "text": summary})),
        _ => {
            body.insert("system".into(), Value::String(summary));
        }
    }
}

/// The texts of a user turn's tool results: what a planned cut shortens.
pub(super) fn tool_result_texts(message: &mut Value) -> Vec<&mut String> {
    let Some(Value::Array(blocks)) = message.get_mut("content") else {
        return Vec::new();
    };
    let mut texts: Vec<&mut String> = Vec::new();
    for block in blocks.iter_mut() {
        if block_type(block) != "tool_result" {
            continue;
        }
        match block.get_mut("content") {
            Some(Value::String(text)) => texts.push(text),
            Some(Value::Array(parts)) => {
                texts.extend(
                    parts
                        .iter_mut()
                        .filter_map(|part| match part.get_mut("text") {
                            Some(Value::String(text)) => Some(text),
                            _ => None,
                        }),
                )
            }
            _ => {}
        }
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::shorten::cut_item_texts;
    use crate::dialect::messages::view::chat_message;
    use crate::tokens::encoding::Encoding;
    use crate::tokens::rules::count_text;

    #[test]
    fn the_summary_goes_into_system_after_the_original() {
        let mut body = json!({"system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]})
            .as_object()
            .unwrap()
            .clone();
        append_to_system(&mut body, "S".into());
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "S"}])
        );
        let mut body = json!({"system": "rules"}).as_object().unwrap().clone();
        append_to_system(&mut body, "S".into());
        assert_eq!(body["system"], "rules\n\nS");
    }

    #[test]
    fn tool_results_are_cut_in_proportion_to_the_planned_size() {
        let long = "lorem ipsum dolor sit amet ".repeat(400);
        let mut message = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": long},
            {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": long}]}]});
        let before = count_text(Encoding::O200k, &chat_message(&message).to_string());
        cut_item_texts(
            Encoding::O200k,
            tool_result_texts(&mut message),
            &crate::compaction::shorten::Shorten {
                index: 0,
                tokens: before,
                keep_tokens: 500,
            },
            None,
        );
        let a = message["content"][0]["content"].as_str().unwrap();
        let b = message["content"][1]["content"][0]["text"]
            .as_str()
            .unwrap();
        assert!(a.contains("tokens removed"), "{a}");
        assert_eq!(a, b, "equal outputs get equal shares");
        let after = count_text(Encoding::O200k, &chat_message(&message).to_string());
        assert!(after <= 500, "{after}");
    }
}
