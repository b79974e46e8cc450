//! A Responses request as counting, planning and the summarizer see it: each input item one
//! conversation item and one chat message.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::dialect::request::present;

use crate::conversation::{view_content, Item, Kind, Role};

/// The input as items: a string is one user message.
pub(super) fn input_items(body: &Map<String, Value>) -> Cow<'_, [Value]> {
    match body.get("input") {
        Some(Value::Array(items)) => Cow::Borrowed(items),
        Some(Value::String(text)) => Cow::Owned(vec![json!({"role": "user", "content": text})]),
        _ => Cow::Borrowed(&[]),
    }
}

pub(super) fn item_type(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(kind) => kind,
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

/// Client-side tool calls (`function_call`, `custom_tool_call`, `computer_call`,
/// `local_shell_call`, …) carry a `call_id` that their `…_call_output` answers.
/// Server-side ones (`web_search_call`, …) have no output item and are kept as other items.
pub(super) fn is_tool_call(kind: &str, item: &Value) -> bool {
    kind.ends_with("_call") && item.get("call_id").is_some()
}

pub(super) fn is_tool_output(kind: &str) -> bool {
    kind.ends_with("_call_output")
}

pub(super) fn call_id(item: &Value) -> Option<&str> {
    item.get("call_id").and_then(Value::as_str)
}

/// One input item as a chat message, and its role and kind: what the raw stage counts.
pub(super) fn item_view(item: &Value) -> (Value, Item) {
    (chat_view(item), item_meta(item))
}

/// One input item's role and kind, with no chat message made.
pub(super) fn item_meta(item: &Value) -> Item {
    Head::of(item).meta()
}

/// What an input item's role and kind, and its pairing with a call, are read from: its type
/// (`item_type`), role and call id.
pub(super) struct Head<'a> {
    kind: Cow<'a, str>,
    role: Option<Cow<'a, str>>,
    /// Present (a client-side call or output), and its id when a string.
    call_id: Option<Option<Cow<'a, str>>>,
}

impl<'a> Head<'a> {
    pub(super) fn of(item: &'a Value) -> Head<'a> {
        Head {
            kind: Cow::Borrowed(item_type(item)),
            role: item.get("role").and_then(Value::as_str).map(Cow::Borrowed),
            call_id: item.get("call_id").map(|id| id.as_str().map(Cow::Borrowed)),
        }
    }

    /// Read from an item's bytes as sent, without its tree: a planned request's pairing
    /// check reads every item's head, and its items' trees took 8.6M instructions of an
    /// agent-sized request (`bench/instruction_budget.sh`). None when a field read is not
    /// what `of` reads it as (the caller parses the item then).
    pub(super) fn read(bytes: &'a [u8]) -> Option<Head<'a>> {
        #[derive(serde::Deserialize)]
        struct Fields<'a> {
            #[serde(rename = "type", default, deserialize_with = "present", borrow)]
            kind: Option<&'a RawValue>,
            #[serde(default, deserialize_with = "present", borrow)]
            role: Option<&'a RawValue>,
            #[serde(default, deserialize_with = "present", borrow)]
            call_id: Option<&'a RawValue>,
        }
        let fields: Fields<'a> = serde_json::from_slice(bytes).ok()?;
        // As `Value::as_str` reads a field: a string, else none.
        let text = |raw: &'a RawValue| serde_json::from_str::<Cow<'a, str>>(raw.get()).ok();
        let role = fields.role.and_then(text);
        let kind = match (fields.kind.and_then(text), fields.role) {
            (Some(kind), _) => kind,
            (None, Some(_)) => Cow::Borrowed("message"),
            (None, None) => Cow::Borrowed(""),
        };
        Some(Head {
            kind,
            role,
            call_id: fields.call_id.map(text),
        })
    }

    /// Itself, holding what it borrowed: to be kept past the request it was read from.
    pub(super) fn into_owned(self) -> Head<'static> {
        let owned = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
        Head {
            kind: owned(self.kind),
            role: self.role.map(owned),
            call_id: self.call_id.map(|id| id.map(owned)),
        }
    }

    /// Itself, borrowed from where it is kept.
    pub(super) fn borrowed(&self) -> Head<'_> {
        Head {
            kind: Cow::Borrowed(&self.kind),
            role: self.role.as_deref().map(Cow::Borrowed),
            call_id: self
                .call_id
                .as_ref()
                .map(|id| id.as_deref().map(Cow::Borrowed)),
        }
    }

    pub(super) fn meta(&self) -> Item {
        let (role, kind) = match &*self.kind {
            "message" => {
                let role = Role::parse(self.role.as_deref().unwrap_or("user"));
                let kind = if role == Role::Other {
                    Kind::Other
                } else {
                    Kind::Message
                };
                (role, kind)
            }
            "reasoning" => (Role::Assistant, Kind::Reasoning),
            _ if self.is_call() => (Role::Assistant, Kind::ToolCall),
            _ if is_tool_output(&self.kind) => (Role::Tool, Kind::ToolResult),
            _ => (Role::Other, Kind::Other),
        };
        Item::new(role, kind, 0)
    }

    /// A client-side tool call (`is_tool_call`).
    pub(super) fn is_call(&self) -> bool {
        self.kind.ends_with("_call") && self.call_id.is_some()
    }

    pub(super) fn is_output(&self) -> bool {
        is_tool_output(&self.kind)
    }

    pub(super) fn call_id(&self) -> Option<&str> {
        self.call_id.as_ref()?.as_deref()
    }
}

/// One input item as a chat message. It carries only what the model reads (no item ids or
/// statuses), so it is counted the way chat is.
pub(super) fn chat_view(item: &Value) -> Value {
    let kind = item_type(item);
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
            json!({"role": role, "content": chat_content(item.get("content"))})
        }
        "reasoning" => {
            let summary: Vec<&str> = item
                .get("summary")
                .and_then(Value::as_array)
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            let mut message = json!({"role": "assistant", "content": summary.join("\n")});
            // Opaque, but sent and paid for: counted as its text.
            if let Some(encrypted) = item.get("encrypted_content").filter(|v| !v.is_null()) {
                message["encrypted_content"] = encrypted.clone();
            }
            message
        }
        _ if is_tool_call(kind, item) => {
            let text = |field: &str| item.get(field).and_then(Value::as_str);
            let arguments = match kind {
                "function_call" => text("arguments").unwrap_or("").to_string(),
                "custom_tool_call" => text("input").unwrap_or("").to_string(),
                _ => item.to_string(),
            };
            json!({
                "role": "assistant",
                "tool_calls": [{
                    "id": call_id(item).unwrap_or(""),
                    "type": "function",
                    "function": {"name": text("name").unwrap_or(kind), "arguments": arguments},
                }],
            })
        }
        _ if is_tool_output(kind) => {
            let content = match item.get("output") {
                Some(Value::String(text)) => Value::String(text.clone()),
                Some(Value::Array(_)) => chat_content(item.get("output")),
                Some(other) => Value::String(other.to_string()),
                None => Value::String(String::new()),
            };
            json!({
                "role": "tool",
                "tool_call_id": call_id(item).unwrap_or(""),
                "content": content,
            })
        }
        _ => json!({"role": "assistant", "content": format!("[{kind}] {item}")}),
    }
}

/// Message content as chat writes it: a string as it is, parts with their text as text
/// parts and images as image parts, anything else as sent.
pub(super) fn chat_content(content: Option<&Value>) -> Value {
    let Some(Value::Array(parts)) = content else {
        return content.cloned().unwrap_or(Value::Null);
    };
    let part = |part: &Value| {
        let text = |field: &str| part.get(field).and_then(Value::as_str);
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                json!({"type": "text", "text": text("text").unwrap_or("")})
            }
            Some("refusal") => json!({"type": "text", "text": text("refusal").unwrap_or("")}),
            Some("input_image") => {
                let mut image = json!({"url": part.get("image_url").unwrap_or(&Value::Null)});
                if let Some(detail) = part.get("detail") {
                    image["detail"] = detail.clone();
                }
                json!({"type": "image_url", "image_url": image})
            }
            _ => part.clone(),
        }
    };
    view_content(parts.iter().map(part).collect())
}
