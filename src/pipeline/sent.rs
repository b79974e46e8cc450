//! What the model was sent, part by part (`SentParts`): the head, the pinned task, the
//! summary, the tool outputs cut and their references, the items kept, the recent part. Read
//! from the forwarded body against the body as received, item by item, as the provider's
//! cache reads them (`observer::unit`): an item forwarded as it came is found among the
//! received ones; one that is not was written by the rewrite. Nothing of the plan is
//! decided again here; this only names what the rewrite wrote where.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::compaction::recall::REFERENCE_PREFIX;
use crate::dialect::stages::Dialect;
use crate::pipeline::observer::unit;

/// How a summary's text starts (the contract's rewrite rule 2).
const SUMMARY_MARK: &str = "[Context summary:";

/// How much of an item's text a part shows.
const EXCERPT_CHARS: usize = 120;
/// How much of a summary's text is kept: all of a summary within `max_summary_tokens`' usual
/// budget, not a runaway one.
const SUMMARY_CHARS: usize = 12_000;

/// The parts of one forwarded request, in the order they were sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentParts {
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub kind: PartKind,
    pub items: Vec<SentItem>,
}

/// What a part of a forwarded request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// The fields before the conversation (tools, system, instructions) and its leading
    /// system or developer items, as sent.
    Head,
    /// Items kept verbatim before the summary: the pinned task.
    Task,
    Summary,
    /// Tool outputs the rewrite cut, each naming its reference when recall is on.
    Cut,
    /// Items kept verbatim between the summary and the recent part (calls whose outputs are
    /// cut, say).
    Kept,
    /// The newest items, verbatim, to the end.
    Recent,
    /// The whole request, forwarded as it came.
    AsSent,
}

impl PartKind {
    pub fn name(self) -> &'static str {
        match self {
            PartKind::Head => "head",
            PartKind::Task => "task",
            PartKind::Summary => "summary",
            PartKind::Cut => "cut outputs",
            PartKind::Kept => "kept",
            PartKind::Recent => "recent part",
            PartKind::AsSent => "as sent",
        }
    }
}

/// One item of a part: where it stands, who says it, and the head of its text.
#[derive(Debug, Clone, PartialEq)]
pub struct SentItem {
    /// The field's name, for a field before the conversation; else the item's position in
    /// the forwarded conversation.
    pub at: String,
    pub role: String,
    /// Characters of text in the item.
    pub chars: usize,
    /// Its first characters (a summary's whole text).
    pub excerpt: String,
    /// The recall references it names.
    pub refs: Vec<String>,
}

/// The parts of the request `forwarded`, read against `received`, both bodies of `D`; none
/// for a body that is not a JSON object with its conversation.
pub fn sent_parts<D: Dialect>(received: &[u8], forwarded: &[u8]) -> Option<SentParts> {
    let (sent_fields, fields) = (fields_of(received)?, fields_of(forwarded)?);
    let items = |fields: &HashMap<String, &RawValue>| -> Option<Vec<Value>> {
        serde_json::from_str(fields.get(D::CONVERSATION_FIELD)?.get()).ok()
    };
    let (sent_items, items) = (items(&sent_fields)?, items(&fields)?);
    let head_fields: Vec<SentItem> = D::CACHED_BEFORE
        .iter()
        .filter_map(|name| {
            let value: Value = serde_json::from_str(fields.get(*name)?.get()).ok()?;
            Some(item(
                name.to_string(),
                name.to_string(),
                &value,
                EXCERPT_CHARS,
            ))
        })
        .collect();
    if received == forwarded {
        let mut all = head_fields;
        all.extend(items.iter().enumerate().map(|(at, v)| indexed(at, v)));
        return Some(SentParts {
            parts: vec![Part {
                kind: PartKind::AsSent,
                items: all,
            }],
        });
    }
    // Where each forwarded item stands among the received ones, when it came as it is.
    let received_at: HashMap<_, usize> = raw_units(&sent_items)
        .into_iter()
        .enumerate()
        .map(|(at, unit)| (unit, at))
        .collect();
    let found: Vec<Option<usize>> = raw_units(&items)
        .into_iter()
        .map(|unit| received_at.get(&unit).copied())
        .collect();
    // The summary: an item of its own, or a text block the dialect wrote into a head field
    // (`system`) or into a turn (the pinned task's, or the first kept one).
    let own_summary = items
        .iter()
        .position(|v| text_of(v).starts_with(SUMMARY_MARK));
    let in_field = D::CACHED_BEFORE.iter().find_map(|name| {
        let value: Value = serde_json::from_str(fields.get(*name)?.get()).ok()?;
        Some((name.to_string(), summary_in(&value)?.to_string()))
    });
    let holder = if own_summary.is_some() || in_field.is_some() {
        None
    } else {
        items
            .iter()
            .enumerate()
            .find_map(|(at, v)| Some((at, summary_in(v)?.to_string())))
    };
    // Before the model's first turn (and the summary's own item): the head and the task.
    let front_end = items
        .iter()
        .enumerate()
        .position(|(at, v)| Some(at) == own_summary || is_reply(&role_of(v)))
        .unwrap_or(items.len());
    // The recent part: the newest items, each as it came and right after the one before.
    let mut recent_start = items.len();
    while recent_start > front_end + usize::from(own_summary.is_some()) {
        let at = recent_start - 1;
        let follows = match (found[at], found.get(recent_start).copied().flatten()) {
            (Some(here), Some(next)) => here + 1 == next,
            (Some(here), None) => recent_start == items.len() && here + 1 == sent_items.len(),
            (None, _) => false,
        };
        if !follows {
            break;
        }
        recent_start = at;
    }
    let mut parts = Parts::default();
    for field in head_fields {
        parts.push(PartKind::Head, field);
    }
    if let Some((name, text)) = in_field {
        parts.push(PartKind::Summary, summary_item(name, &text));
    }
    for (at, value) in items.iter().enumerate() {
        let role = role_of(value);
        let kind = if Some(at) == own_summary {
            PartKind::Summary
        } else if at < front_end && (role == "system" || role == "developer") {
            PartKind::Head
        } else if at < front_end {
            PartKind::Task
        } else if at >= recent_start {
            PartKind::Recent
        } else if found[at].is_none() && holder.as_ref().is_none_or(|(h, _)| *h != at) {
            PartKind::Cut
        } else {
            PartKind::Kept
        };
        let chars = if kind == PartKind::Summary {
            SUMMARY_CHARS
        } else {
            EXCERPT_CHARS
        };
        parts.push(kind, item(at.to_string(), role, value, chars));
        if let Some((_, text)) = holder.as_ref().filter(|(h, _)| *h == at) {
            parts.push(PartKind::Summary, summary_item(at.to_string(), text));
        }
    }
    Some(SentParts { parts: parts.0 })
}

/// Parts in the order each kind first comes; the middle's kept items and cut outputs, which
/// alternate (a call kept, its output cut), each gathered in one part.
#[derive(Default)]
struct Parts(Vec<Part>);

impl Parts {
    fn push(&mut self, kind: PartKind, item: SentItem) {
        let gathered = matches!(kind, PartKind::Cut | PartKind::Kept);
        let found = match self.0.last_mut() {
            Some(part) if part.kind == kind => Some(part),
            _ if gathered => self.0.iter_mut().find(|part| part.kind == kind),
            _ => None,
        };
        match found {
            Some(part) => part.items.push(item),
            None => self.0.push(Part {
                kind,
                items: vec![item],
            }),
        }
    }
}

/// Whether an item of `role` (`role_of`) is the model's.
fn is_reply(role: &str) -> bool {
    ["assistant", "model", "function_call", "reasoning"]
        .iter()
        .any(|reply| role.starts_with(reply))
}

/// The summary's text, where a text of `value` starts with the summary's line.
fn summary_in(value: &Value) -> Option<&str> {
    match value {
        Value::String(text) if text.trim_start().starts_with(SUMMARY_MARK) => {
            Some(text.trim_start())
        }
        Value::Array(items) => items.iter().find_map(summary_in),
        Value::Object(fields) => fields.values().find_map(summary_in),
        _ => None,
    }
}

fn summary_item(at: String, text: &str) -> SentItem {
    SentItem {
        at,
        role: "summary".into(),
        chars: text.chars().count(),
        excerpt: text.chars().take(SUMMARY_CHARS).collect(),
        refs: references(text),
    }
}

fn fields_of(body: &[u8]) -> Option<HashMap<String, &RawValue>> {
    serde_json::from_slice(body).ok()
}

fn raw_units(items: &[Value]) -> Vec<u64> {
    items
        .iter()
        .map(|value| {
            let text = value.to_string();
            serde_json::from_str::<&RawValue>(&text).map_or(0, |raw| unit(raw).hash())
        })
        .collect()
}

fn indexed(at: usize, value: &Value) -> SentItem {
    item(at.to_string(), role_of(value), value, EXCERPT_CHARS)
}

fn item(at: String, role: String, value: &Value, excerpt_chars: usize) -> SentItem {
    let text = text_of(value);
    SentItem {
        at,
        role,
        chars: text.chars().count(),
        excerpt: text.chars().take(excerpt_chars).collect(),
        refs: references(&text),
    }
}

/// Who says an item: its role, or its type where it has none (a Responses item); a tool's
/// output or call named as such.
fn role_of(value: &Value) -> String {
    let role = value.get("role").and_then(Value::as_str);
    let kind = value.get("type").and_then(Value::as_str);
    let first_block = value
        .get("content")
        .or_else(|| value.get("parts"))
        .and_then(Value::as_array)
        .and_then(|blocks| blocks.first())
        .and_then(|block| {
            block.get("type").and_then(Value::as_str).or_else(|| {
                ["functionResponse", "functionCall"]
                    .into_iter()
                    .find(|k| block.get(k).is_some())
            })
        });
    match (role, kind, first_block) {
        (Some(role), _, Some(block))
            if block != "text" && block != "input_text" && block != "output_text" =>
        {
            format!("{role} ({block})")
        }
        (Some(role), _, _) => role.to_string(),
        (None, Some(kind), _) => kind.to_string(),
        (None, None, _) => "item".to_string(),
    }
}

/// Fields whose strings are no one's text: identifiers, signatures, encrypted reasoning.
const NOT_TEXT: [&str; 9] = [
    "type",
    "role",
    "id",
    "call_id",
    "tool_use_id",
    "signature",
    "thoughtSignature",
    "encrypted_content",
    "cache_control",
];

/// An item's text: its strings, in order, outside the fields that hold none, spaces
/// collapsed.
fn text_of(value: &Value) -> String {
    fn walk(value: &Value, out: &mut String) {
        match value {
            Value::String(text) => {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(text);
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Object(fields) => fields
                .iter()
                .filter(|(key, _)| !NOT_TEXT.contains(&key.as_str()))
                .for_each(|(_, v)| walk(v, out)),
            _ => {}
        }
    }
    let mut text = String::new();
    walk(value, &mut text);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The recall references (`ctx:…`) a text names, once each, in order.
fn references(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for (at, _) in text.match_indices(REFERENCE_PREFIX) {
        let tail = &text[at + REFERENCE_PREFIX.len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
            .unwrap_or(tail.len());
        let reference = format!("{REFERENCE_PREFIX}{}", tail[..end].trim_end_matches('.'));
        if end > 0 && !found.contains(&reference) {
            found.push(reference);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::chat::Chat;
    use serde_json::json;

    fn body(messages: Value) -> Vec<u8> {
        json!({"model": "m", "messages": messages})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn a_compacted_requests_parts_are_named_where_the_rewrite_put_them() {
        let output = |n: usize| json!({"role": "tool", "tool_call_id": format!("c{n}"), "content": format!("row {n} ").repeat(50)});
        let call = |n: usize| json!({"role": "assistant", "tool_calls": [{"id": format!("c{n}"), "type": "function", "function": {"name": "sh", "arguments": "{}"}}]});
        let mut received = vec![
            json!({"role": "system", "content": "rules"}),
            json!({"role": "user", "content": "Ticket KX-7731-QZ"}),
        ];
        for n in 0..6 {
            received.push(call(n));
            received.push(output(n));
        }
        let forwarded = vec![
            received[0].clone(),
            received[1].clone(),
            json!({"role": "system", "content": "[Context summary: 4 earlier messages]\n\nread logs; see ctx:ab12cd34.2 to ctx:ab12cd34.5"}),
            received[6].clone(),
            json!({"role": "tool", "tool_call_id": "c2", "content": "[ctx:ab12cd34.7]\nrow 2 [… 80 tokens removed …]"}),
            received[8].clone(),
            received[9].clone(),
            received[10].clone(),
            received[11].clone(),
            received[12].clone(),
            received[13].clone(),
        ];
        let parts = sent_parts::<Chat>(&body(json!(received)), &body(json!(forwarded))).unwrap();
        let kinds: Vec<(PartKind, usize)> = parts
            .parts
            .iter()
            .map(|p| (p.kind, p.items.len()))
            .collect();
        assert_eq!(
            kinds,
            [
                (PartKind::Head, 1),
                (PartKind::Task, 1),
                (PartKind::Summary, 1),
                (PartKind::Kept, 1),
                (PartKind::Cut, 1),
                (PartKind::Recent, 6),
            ]
        );
        assert_eq!(
            parts.parts[2].items[0].refs,
            ["ctx:ab12cd34.2", "ctx:ab12cd34.5"]
        );
        assert_eq!(parts.parts[4].items[0].refs, ["ctx:ab12cd34.7"]);
        assert_eq!(parts.parts[4].items[0].role, "tool");
        assert!(parts.parts[5].items[0].excerpt.len() <= EXCERPT_CHARS);
        // Forwarded as it came: one part.
        let same = body(json!(received));
        let parts = sent_parts::<Chat>(&same, &same).unwrap();
        assert_eq!(parts.parts.len(), 1);
        assert_eq!(parts.parts[0].kind, PartKind::AsSent);
        assert_eq!(parts.parts[0].items.len(), received.len());
    }
}
