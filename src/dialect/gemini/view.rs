//! A Gemini request as counting, planning and the summarizer see it: each turn of `contents`
//! one conversation item and one chat message. A `model` turn with `functionCall` parts is a
//! call; the `user` turn after it with the `functionResponse` parts is its answer, and the
//! two are one unit. Thoughts and their signatures are the model's own and left out of the
//! view; the turns themselves keep them verbatim.

use serde_json::{json, Map, Value};

use crate::conversation::{view_content, Item, Kind, Role};
use crate::error::ProxyError;

pub(super) fn contents(body: &Map<String, Value>) -> &[Value] {
    body.get("contents")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The parts of a turn.
pub(super) fn parts(turn: &Value) -> &[Value] {
    turn.get("parts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub(super) fn role(turn: &Value) -> &str {
    turn.get("role").and_then(Value::as_str).unwrap_or("")
}

pub(super) fn has_part(turn: &Value, kind: &str) -> bool {
    parts(turn).iter().any(|part| part.get(kind).is_some())
}

/// A user turn: Gemini reads a turn without a role as the user's.
pub(super) fn is_user(turn: &Value) -> bool {
    matches!(role(turn), "user" | "")
}

/// What the planner sees of a turn: a `model` turn with `functionCall` parts is a call, a
/// turn with `functionResponse` parts answers it (the user's, or `function` as older
/// clients wrote it); any other role is an item of its own, kept as sent.
pub(super) fn item(turn: &Value, tokens: u32) -> Item {
    let (role, kind) = match role(turn) {
        _ if has_part(turn, "functionResponse") => (Role::User, Kind::ToolResult),
        "model" if has_part(turn, "functionCall") => (Role::Assistant, Kind::ToolCall),
        "model" => (Role::Assistant, Kind::Message),
        "user" | "" => (Role::User, Kind::Message),
        _ => (Role::Other, Kind::Other),
    };
    Item::new(role, kind, tokens)
}

/// Checks what condenser relies on of `contents`, in Google's words where it has them: an
/// array of turns, each an object whose `parts` is an array of objects, and every turn of
/// function responses right after a turn of as many calls.
pub(super) fn check_contents(contents: &Value) -> Result<(), ProxyError> {
    let Value::Array(turns) = contents else {
        return Err(invalid(
            "Invalid value at 'contents': must be an array of Content",
        ));
    };
    let mut calls_before = 0;
    for (at, turn) in turns.iter().enumerate() {
        let Value::Object(fields) = turn else {
            return Err(invalid(format!(
                "Invalid value at 'contents[{at}]': must be a Content object"
            )));
        };
        match fields.get("parts") {
            Some(Value::Array(parts)) if parts.iter().all(Value::is_object) => {}
            Some(_) => {
                return Err(invalid(format!(
                    "Invalid value at 'contents[{at}].parts': must be an array of Part objects"
                )))
            }
            None => {}
        }
        let count = |kind| parts(turn).iter().filter(|p| p.get(kind).is_some()).count();
        let responses = count("functionResponse");
        if responses > 0 && calls_before == 0 {
            return Err(invalid(format!(
                "Please ensure that function response turn comes immediately after a function call turn (contents[{at}])."
            )));
        }
        if responses > 0 && responses != calls_before {
            return Err(invalid(format!(
                "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn (contents[{at}])."
            )));
        }
        calls_before = count("functionCall");
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> ProxyError {
    ProxyError::invalid(message, Some("contents"))
}

/// Each turn as a chat message: text as text, `inlineData` as an image part, `functionCall`
/// as `tool_calls`, `functionResponse` as text naming its function. Thoughts are left out
/// (Gemini drops them from the context, and the summarizer is not to restate them); other
/// parts are kept whole, counted as their JSON.
pub(super) fn as_chat(turns: &[Value]) -> Vec<Value> {
    turns.iter().map(chat_message).collect()
}

pub(super) fn chat_message(turn: &Value) -> Value {
    let role = match role(turn) {
        "model" => "assistant",
        "" => "user",
        other => other,
    };
    let mut content = Vec::new();
    let mut calls = Vec::new();
    for part in parts(turn) {
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(text) = part.get("text") {
            content.push(json!({"type": "text", "text": text}));
        } else if let Some(data) = part.get("inlineData") {
            content.push(image_part(data));
        } else if let Some(call) = part.get("functionCall") {
            calls.push(json!({
                "id": call.get("id").or_else(|| call.get("name")).cloned().unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": call.get("name").cloned().unwrap_or_default(),
                    "arguments": call.get("args").map_or_else(String::new, Value::to_string),
                },
            }));
        } else if let Some(response) = part.get("functionResponse") {
            content.push(json!({"type": "text", "text": response_text(response)}));
        } else {
            let mut other = part.clone();
            if let Some(fields) = other.as_object_mut() {
                fields.remove("thoughtSignature");
            }
            content.push(other);
        }
    }
    let mut chat = json!({"role": role, "content": view_content(content)});
    if !calls.is_empty() {
        chat["tool_calls"] = Value::Array(calls);
    }
    chat
}

/// Inline data as an OpenAI image part, so it is counted as one.
fn image_part(data: &Value) -> Value {
    let field = |name: &str| data.get(name).and_then(Value::as_str).unwrap_or("");
    let url = format!("data:{};base64,{}", field("mimeType"), field("data"));
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// A function's response as the summarizer reads it: its name, then the texts of its
/// response (Gemini CLI answers `{"output": "…"}`), or its JSON when it has none.
fn response_text(response: &Value) -> String {
    let name = response.get("name").and_then(Value::as_str).unwrap_or("");
    let body = response.get("response");
    let texts: Vec<&str> = body
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|fields| fields.values().filter_map(Value::as_str))
        .collect();
    let body = if texts.is_empty() {
        body.map_or_else(String::new, Value::to_string)
    } else {
        texts.join("\n")
    };
    format!("[tool result {name}]\n{body}")
}

/// The texts of a turn's function responses (the string fields of each `response`): what a
/// planned cut shortens.
pub(super) fn response_texts(turn: &mut Value) -> Vec<&mut String> {
    let Some(Value::Array(parts)) = turn.get_mut("parts") else {
        return Vec::new();
    };
    parts
        .iter_mut()
        .filter_map(|part| {
            part.get_mut("functionResponse")?
                .get_mut("response")?
                .as_object_mut()
        })
        .flat_map(|fields| fields.values_mut())
        .filter_map(|value| match value {
            Value::String(text) => Some(text),
            _ => None,
        })
        .collect()
}
