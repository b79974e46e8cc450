//! OpenAI's cookbook, in code: what one chat message, its content parts, images and tool
//! calls, a request's tool schemas and its other fields cost in tokens, in a given encoding;
//! and the encodings themselves, built on first use. `counter.rs` caches and scales these.

use std::sync::OnceLock;

use base64::Engine;
use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

use crate::tokens::encoding::Encoding;

/// Every chat message costs this much framing, and the reply is primed with as much.
const TOKENS_PER_MESSAGE: u32 = 3;
const TOKENS_PER_NAME: u32 = 1;
pub const REPLY_PRIMING: u32 = 3;
/// Framing of one entry of an assistant's `tool_calls` (not in the cookbook; measured estimate).
const TOKENS_PER_TOOL_CALL: u32 = 3;
/// An image whose size cannot be read from the request: OpenAI's cost of a 1024×1024 image at
/// high detail (4 tiles).
const DEFAULT_IMAGE_TOKENS: u32 = 765;

/// Each encoding takes tens of megabytes, so it is built by the first request that needs it
/// rather than at start: a proxy in front of one model family holds one.
pub fn bpe(encoding: Encoding) -> &'static CoreBPE {
    loaded(encoding).get_or_init(|| match encoding {
        Encoding::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
        Encoding::O200kHarmony => tiktoken_rs::o200k_harmony_singleton(),
    })
}

/// Whether `encoding` has been built in this process.
pub fn is_loaded(encoding: Encoding) -> bool {
    loaded(encoding).get().is_some()
}

/// Set once `encoding` is built; tiktoken's own singletons do not say whether they are.
fn loaded(encoding: Encoding) -> &'static OnceLock<&'static CoreBPE> {
    static CL100K: OnceLock<&CoreBPE> = OnceLock::new();
    static O200K: OnceLock<&CoreBPE> = OnceLock::new();
    static O200K_HARMONY: OnceLock<&CoreBPE> = OnceLock::new();
    match encoding {
        Encoding::Cl100k => &CL100K,
        Encoding::O200k => &O200K,
        Encoding::O200kHarmony => &O200K_HARMONY,
    }
}

/// Special-token text such as `<|endoftext|>` counts as ordinary text, as it does in a prompt.
pub fn count_text(encoding: Encoding, text: &str) -> u32 {
    u32::try_from(bpe(encoding).encode_ordinary(text).len()).unwrap_or(u32::MAX)
}

/// One message by the cookbook: framing, every string field encoded, +1 for `name`; content
/// parts, tool calls and other structured fields as documented in README.md.
pub fn count_message(encoding: Encoding, message: &Value) -> u32 {
    let Some(fields) = message.as_object() else {
        return TOKENS_PER_MESSAGE + count_json(encoding, message);
    };
    let mut tokens = TOKENS_PER_MESSAGE;
    for (key, value) in fields {
        tokens += match (key.as_str(), value) {
            (_, Value::Null) => 0,
            (_, Value::String(text)) => count_text(encoding, text),
            ("content", Value::Array(parts)) => parts.iter().map(|p| count_part(encoding, p)).sum(),
            ("tool_calls", Value::Array(calls)) => {
                calls.iter().map(|c| count_tool_call(encoding, c)).sum()
            }
            (_, other) => count_json(encoding, other),
        };
        if key == "name" {
            tokens += TOKENS_PER_NAME;
        }
    }
    tokens
}

fn count_json(encoding: Encoding, value: &Value) -> u32 {
    count_text(encoding, &value.to_string())
}

fn count_part(encoding: Encoding, part: &Value) -> u32 {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" | "input_text" | "refusal" => ["text", "refusal"]
            .iter()
            .filter_map(|k| part.get(*k).and_then(Value::as_str))
            .map(|t| count_text(encoding, t))
            .sum(),
        "image_url" | "input_image" => image_tokens(part),
        _ => count_json(encoding, part),
    }
}

fn count_tool_call(encoding: Encoding, call: &Value) -> u32 {
    let function = call.get("function");
    let text = |k: &str| {
        function
            .and_then(|f| f.get(k))
            .and_then(Value::as_str)
            .map(|t| count_text(encoding, t))
            .unwrap_or(0)
    };
    TOKENS_PER_TOOL_CALL + text("name") + text("arguments")
}

/// OpenAI's tile rule: low detail is 85 tokens; otherwise fit in 2048×2048, scale the short
/// side to 768, and pay 170 per 512-pixel tile plus 85.
fn image_tokens(part: &Value) -> u32 {
    let image = part.get("image_url").unwrap_or(part);
    let detail = image
        .get("detail")
        .and_then(Value::as_str)
        .unwrap_or("auto");
    if detail == "low" {
        return 85;
    }
    let url = image
        .get("url")
        .and_then(Value::as_str)
        .or_else(|| image.as_str())
        .unwrap_or("");
    match image_size(url) {
        Some((w, h)) => tile_tokens(w, h),
        None => DEFAULT_IMAGE_TOKENS,
    }
}

pub fn tile_tokens(width: u32, height: u32) -> u32 {
    if width == 0 || height == 0 {
        return 85;
    }
    let (mut w, mut h) = (f64::from(width), f64::from(height));
    if w.max(h) > 2048.0 {
        let s = 2048.0 / w.max(h);
        w *= s;
        h *= s;
    }
    if w.min(h) > 768.0 {
        let s = 768.0 / w.min(h);
        w *= s;
        h *= s;
    }
    let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
    170 * tiles as u32 + 85
}

/// Width and height from the header of a base64 PNG or GIF data URL.
fn image_size(url: &str) -> Option<(u32, u32)> {
    let payload = url.strip_prefix("data:")?.split_once(";base64,")?.1;
    let head = &payload.as_bytes()[..payload.len().min(44)];
    let head = &head[..head.len() / 4 * 4];
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head)
        .ok()?;
    let be = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let le16 = |at: usize| -> Option<u32> {
        Some(u32::from(u16::from_le_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some((be(16)?, be(20)?))
    } else if bytes.starts_with(b"GIF8") {
        Some((le16(6)?, le16(8)?))
    } else {
        None
    }
}

/// Tools by the cookbook's `num_tokens_for_tools`; `tool_choice` and `response_format` encoded
/// as their JSON text.
pub fn count_request_extras(encoding: Encoding, request: &Map<String, Value>) -> u32 {
    let mut tokens = 0;
    if let Some(Value::Array(tools)) = request.get("tools") {
        tokens += count_tools(encoding, tools);
    }
    for key in ["tool_choice", "response_format"] {
        match request.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(choice)) if key == "tool_choice" => {
                tokens += count_text(encoding, choice)
            }
            Some(Value::Object(format)) if key == "response_format" => {
                if let Some(schema) = format.get("json_schema") {
                    tokens += count_json(encoding, schema);
                }
            }
            Some(other) => tokens += count_json(encoding, other),
        }
    }
    tokens
}

struct ToolConstants {
    func_init: i64,
    prop_init: i64,
    prop_key: i64,
    enum_init: i64,
    enum_item: i64,
    func_end: i64,
}

fn tool_constants(encoding: Encoding) -> ToolConstants {
    let func_init = match encoding {
        Encoding::Cl100k => 10,
        Encoding::O200k | Encoding::O200kHarmony => 7,
    };
    ToolConstants {
        func_init,
        prop_init: 3,
        prop_key: 3,
        enum_init: -3,
        enum_item: 3,
        func_end: 12,
    }
}

pub fn count_tools(encoding: Encoding, tools: &[Value]) -> u32 {
    if tools.is_empty() {
        return 0;
    }
    let c = tool_constants(encoding);
    let text = |t: &str| i64::from(count_text(encoding, t));
    let str_of = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let mut total: i64 = 0;
    for tool in tools {
        let Some(function) = tool.get("function") else {
            total += i64::from(count_json(encoding, tool));
            continue;
        };
        total += c.func_init;
        let name = str_of(function.get("name"));
        let description = str_of(function.get("description"));
        total += text(&format!("{name}:{}", without_final_period(&description)));
        let properties = function
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        if let Some(properties) = properties.filter(|p| !p.is_empty()) {
            total += c.prop_init;
            for (key, property) in properties {
                total += c.prop_key;
                if let Some(Value::Array(items)) = property.get("enum") {
                    total += c.enum_init;
                    for item in items {
                        total += c.enum_item;
                        total += match item {
                            Value::String(s) => text(s),
                            other => text(&other.to_string()),
                        };
                    }
                }
                let kind = match property.get("type") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                let description = str_of(property.get("description"));
                total += text(&format!(
                    "{key}:{kind}:{}",
                    without_final_period(&description)
                ));
            }
        }
    }
    total += c.func_end;
    u32::try_from(total.max(0)).unwrap_or(u32::MAX)
}

/// The cookbook drops one trailing period from descriptions.
fn without_final_period(text: &str) -> &str {
    text.strip_suffix('.').unwrap_or(text)
}

/// Shortens `text` to about `keep_tokens` tokens, keeping its head and end and saying in the
/// middle how many tokens were removed. Cuts on characters, in proportion, so it never splits
/// a character and costs no second encoding.
pub fn shorten_middle(text: &str, tokens: u32, keep_tokens: u32) -> String {
    if tokens <= keep_tokens || tokens == 0 {
        return text.to_string();
    }
    let chars = text.chars().count();
    let keep_chars = (chars as u64 * u64::from(keep_tokens) / u64::from(tokens)) as usize;
    let head = keep_chars / 2;
    let tail = keep_chars - head;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(chars.saturating_sub(tail))
        .map_or(text.len(), |(i, _)| i);
    format!(
        "{}\n[… {} tokens removed …]\n{}",
        &text[..head_end],
        tokens - keep_tokens,
        &text[tail_start.max(head_end)..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn png_size_is_read_from_a_data_url() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&2048u32.to_be_bytes());
        png.extend_from_slice(&4096u32.to_be_bytes());
        png.extend_from_slice(&[8, 6, 0, 0, 0]);
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&png)
        );
        assert_eq!(image_size(&url), Some((2048, 4096)));
        let part = json!({"type": "image_url", "image_url": {"url": url}});
        assert_eq!(count_part(Encoding::O200k, &part), 1105);
        let low =
            json!({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}});
        assert_eq!(count_part(Encoding::O200k, &low), 85);
    }

    #[test]
    fn odd_data_urls_do_not_panic() {
        for url in [
            "data:image/png;base64,aaaé",
            "data:;base64,",
            "data:image/png;base64,é",
            "data:x",
        ] {
            assert_eq!(image_size(url), None, "{url}");
        }
        let long = format!("data:image/png;base64,{}", "é".repeat(40));
        assert_eq!(image_size(&long), None);
    }

    #[test]
    fn tiles_follow_openai_examples() {
        // OpenAI's documented examples: 1024×1024 → 765, 2048×4096 → 1105.
        assert_eq!(tile_tokens(1024, 1024), 765);
        assert_eq!(tile_tokens(2048, 4096), 1105);
    }

    #[test]
    fn shortening_keeps_both_ends() {
        let text = format!("{}{}", "a".repeat(1000), "z".repeat(1000));
        let short = shorten_middle(&text, 400, 100);
        assert!(short.starts_with("aaaa") && short.ends_with("zzzz"));
        assert!(short.contains("[… 300 tokens removed …]"));
        assert!(short.len() < 700);
        assert_eq!(shorten_middle("tiny", 1, 10), "tiny");
    }
}
