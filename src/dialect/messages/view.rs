//! A Messages request as counting, planning and the summarizer see it: each message one
//! conversation item and one chat message.

use serde_json::{json, Map, Value};

use crate::conversation::{view_content, Item, Kind, Role};

pub(super) fn messages(body: &Map<String, Value>) -> &[Value] {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The content blocks of a message; none when its content is a string.
pub(super) fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub(super) fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

pub(super) fn has_block(message: &Value, kind: &str) -> bool {
    blocks(message).iter().any(|b| block_type(b) == kind)
}

pub(super) fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

pub(super) fn is_user(message: &Value) -> bool {
    role(message) == "user"
}

/// What the planner sees of a message: an assistant turn with `tool_use` is a call, a user
/// turn with `tool_result` answers it; a `system` turn is an instruction (pinned with the task
/// it follows); any other role is an item of its own, kept as sent.
pub(super) fn item(message: &Value, tokens: u32) -> Item {
    let (role, kind) = match role(message) {
        "user" if has_block(message, "tool_result") => (Role::User, Kind::ToolResult),
        "user" => (Role::User, Kind::Message),
        "assistant" if has_block(message, "tool_use") => (Role::Assistant, Kind::ToolCall),
        "assistant" => (Role::Assistant, Kind::Message),
        "system" => (Role::System, Kind::Message),
        _ => (Role::Other, Kind::Other),
    };
    Item::new(role, kind, tokens)
}

/// A message as a chat message: text as text, images as image parts, `tool_use` as
/// `tool_calls`, `tool_result` as text naming its call. Thinking blocks are left out:
/// Anthropic drops earlier turns' thinking from the context, and the summarizer is not to
/// restate it. Other blocks are kept whole, counted as their JSON.
pub(super) fn chat_message(message: &Value) -> Value {
    let role = role(message);
    let Some(Value::Array(content)) = message.get("content") else {
        return json!({"role": role, "content": message.get("content").cloned().unwrap_or(Value::Null)});
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for block in content {
        match block_type(block) {
            "text" => parts.push(
                json!({"type": "text", "text": block.get("text").cloned().unwrap_or_default()}),
            ),
            "image" => parts.push(image_part(block)),
            "thinking" | "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": block.get("id").cloned().unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": block.get("name").cloned().unwrap_or_default(),
                    "arguments": block.get("input").map_or_else(String::new, Value::to_string),
                },
            })),
            "tool_result" => parts.push(json!({"type": "text", "text": tool_result_text(block)})),
            _ => parts.push(block.clone()),
        }
    }
    let mut chat = json!({"role": role, "content": view_content(parts)});
    if !calls.is_empty() {
        chat["tool_calls"] = Value::Array(calls);
    }
    chat
}

/// An Anthropic image as an OpenAI image part, so it is counted as one.
pub(super) fn image_part(block: &Value) -> Value {
    let source = block.get("source");
    let field = |name: &str| {
        source
            .and_then(|s| s.get(name))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let url = match field("type") {
        "base64" => format!("data:{};base64,{}", field("media_type"), field("data")),
        _ => field("url").to_string(),
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

pub(super) fn tool_result_text(block: &Value) -> String {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .unwrap_or("");
    let error = if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        " (error)"
    } else {
        ""
    };
    // Written into one string: a tool's output runs to kilobytes, and copying it twice
    // through `format!` was 0.4M of a compacted agent request's 27M instructions.
    let mut text = format!("[tool result {id}{error}]\n");
    match block.get("content") {
        Some(Value::String(content)) => text.push_str(content),
        Some(Value::Array(parts)) => {
            for (at, part) in parts.iter().enumerate() {
                if at > 0 {
                    text.push('\n');
                }
                match part.get("text").and_then(Value::as_str) {
                    Some(part) => text.push_str(part),
                    None => {
                        text.push('[');
                        text.push_str(block_type(part));
                        text.push(']');
                    }
                }
            }
        }
        _ => {}
    }
    text
}
