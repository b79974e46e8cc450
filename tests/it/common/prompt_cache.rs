//! A provider's prompt cache, as the scripted upstreams report it when a test asks
//! (`LlmBehaviour::prompt_cache`): providers bill a prompt's cached share at about a tenth, and
//! report it in each reply's usage.
//!
//! `PromptCache::default()` counts in o200k tokens, as OpenAI's models do. `PromptCache::
//! provider()` counts as Anthropic and Google do, whose tokenizers condenser can only estimate:
//! o200k's count scaled by a share that depends on what the prompt holds (`provider_share`),
//! so that the ratio condenser learns from usage moves from one request to the next, as it does
//! against the real APIs (issue 54).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use condenser::tokens::encoding::Encoding;
use condenser::tokens::rules::count_text;
use serde_json::Value;

/// One request's prompt as the cache reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedPrompt {
    /// The whole prompt.
    pub prompt_tokens: u64,
    /// Of it, the prefix the previous request also sent: what the provider served from cache.
    pub cached_tokens: u64,
}

impl CachedPrompt {
    /// The part of the prompt not served from the cache.
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens - self.cached_tokens
    }

    /// Anthropic's usage: `input_tokens` (uncached, after the last cache mark),
    /// `cache_creation_input_tokens` (written to the cache) and `cache_read_input_tokens`,
    /// which add up to the prompt. A body that marks its prompt for the cache (`marked`, as
    /// Claude Code marks its newest turn) has everything past the cached prefix written.
    pub fn anthropic_usage(&self, marked: bool, output_tokens: u64) -> Value {
        let written = if marked { self.uncached_tokens() } else { 0 };
        serde_json::json!({
            "input_tokens": self.uncached_tokens() - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": output_tokens,
        })
    }

    /// Gemini's `usageMetadata`: `promptTokenCount` is the whole prompt, of which
    /// `cachedContentTokenCount` was cached.
    pub fn gemini_usage(&self, output_tokens: u64) -> Value {
        serde_json::json!({
            "promptTokenCount": self.prompt_tokens,
            "cachedContentTokenCount": self.cached_tokens,
            "candidatesTokenCount": output_tokens,
            "totalTokenCount": self.prompt_tokens + output_tokens,
        })
    }

    /// Chat Completions' usage: `prompt_tokens` whole, `prompt_tokens_details.cached_tokens`.
    pub fn chat_usage(&self, output_tokens: u64) -> Value {
        serde_json::json!({
            "prompt_tokens": self.prompt_tokens, "completion_tokens": output_tokens,
            "total_tokens": self.prompt_tokens + output_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
        })
    }
}

/// The share by which a provider's count of a text exceeds o200k's, from what the text holds:
/// 1.05 for prose, rising to 1.35 as digits, symbols and non-ASCII characters make up more of
/// it (a quarter of the characters or more: numbered rows, hashes, JSON). Only the prompt's
/// strings are read, not the JSON that frames them.
pub fn provider_share(dense: usize, chars: usize) -> f64 {
    const PROSE: f64 = 1.05;
    const DENSEST: f64 = 1.35;
    const DENSE_AT: f64 = 0.25;
    let density = dense as f64 / chars.max(1) as f64;
    PROSE + (DENSEST - PROSE) * (density / DENSE_AT).min(1.0)
}

/// Of `value`'s strings, the characters that are digits, symbols or non-ASCII, and all of them.
fn density(value: &Value) -> (usize, usize) {
    match value {
        Value::String(text) => text.chars().fold((0, 0), |(dense, all), c| {
            let is_dense = c.is_ascii_digit() || c.is_ascii_punctuation() || !c.is_ascii();
            (dense + usize::from(is_dense), all + 1)
        }),
        Value::Array(items) => items.iter().map(density).fold((0, 0), add),
        Value::Object(map) => map.values().map(density).fold((0, 0), add),
        _ => (0, 0),
    }
}

fn add(a: (usize, usize), b: (usize, usize)) -> (usize, usize) {
    (a.0 + b.0, a.1 + b.1)
}

/// How a cache counts a prompt's tokens.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
enum Counting {
    /// o200k's count, as OpenAI's models count.
    #[default]
    O200k,
    /// As Anthropic and Google count: o200k's, scaled by `provider_share` of the request's
    /// prompt (for a model of theirs; any other counts as o200k).
    Provider,
}

/// One piece of a prompt in cache order (the tools, the system prompt, one conversation item),
/// counted once: agents resend the same items every turn.
#[derive(Clone, Copy)]
struct Piece {
    tokens: u64,
    dense: usize,
    chars: usize,
}

/// The prompt cache of one scripted upstream: each request's prompt, read in the order
/// providers cache it ([`cache_order`]), is cached as far as it repeats the previous request's
/// of its session, counted as the cache counts (the rule: the longest common prefix
/// with the previous request). Providers also cache only from about 1,024 tokens and in steps;
/// that is left out, so that small test prompts report a cached share. Clones share the cache.
#[derive(Clone, Default)]
pub struct PromptCache {
    counting: Counting,
    /// The previous prompt of each session (by the key the upstream gives it).
    previous: Arc<Mutex<HashMap<String, String>>>,
    /// Pieces counted before, by their text.
    pieces: Arc<Mutex<HashMap<String, Piece>>>,
}

impl PromptCache {
    /// A cache that counts as Anthropic and Google do for their models (see `Counting`).
    pub fn provider() -> PromptCache {
        PromptCache {
            counting: Counting::Provider,
            ..PromptCache::default()
        }
    }

    /// `request`'s prompt and the share of it cached; it is then the previous request.
    pub fn prompt(&self, request: &Value) -> CachedPrompt {
        let model = request["model"].as_str().unwrap_or("");
        self.prompt_of(model, model, request)
    }

    /// `request`'s prompt to `model` (which an API may name in the path rather than the body),
    /// and the share of it cached, against the previous prompt of `session`; it is then
    /// `session`'s previous request.
    pub fn prompt_of(&self, session: &str, model: &str, request: &Value) -> CachedPrompt {
        let pieces = cache_order(request);
        let prompt: String = pieces.concat();
        let mut previous = self.previous.lock().unwrap();
        let before = previous.get(session).map_or("", String::as_str);
        let mut common = before
            .bytes()
            .zip(prompt.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !prompt.is_char_boundary(common) {
            common -= 1;
        }
        // The pieces wholly cached, and the cached start of the one the prefix ends in.
        let (mut tokens, mut cached) = (0, 0);
        let (mut dense, mut chars) = (0, 0);
        let mut at = 0;
        for piece in &pieces {
            let counted = self.piece(piece);
            tokens += counted.tokens;
            (dense, chars) = (dense + counted.dense, chars + counted.chars);
            let end = at + piece.len();
            if end <= common {
                cached += counted.tokens;
            } else if at < common {
                cached += u64::from(count_text(Encoding::O200k, &piece[..common - at]));
            }
            at = end;
        }
        let share = match self.counting {
            Counting::Provider if counts_as_a_provider(model) => provider_share(dense, chars),
            _ => 1.0,
        };
        let scaled = |tokens: u64| (tokens as f64 * share).round() as u64;
        let counted = CachedPrompt {
            prompt_tokens: scaled(tokens),
            cached_tokens: scaled(cached),
        };
        previous.insert(session.to_string(), prompt);
        counted
    }

    fn piece(&self, text: &str) -> Piece {
        if let Some(piece) = self.pieces.lock().unwrap().get(text) {
            return *piece;
        }
        let (dense, chars) = serde_json::from_str(text).map_or((0, 0), |value| density(&value));
        let piece = Piece {
            tokens: u64::from(count_text(Encoding::O200k, text)),
            dense,
            chars,
        };
        self.pieces.lock().unwrap().insert(text.to_string(), piece);
        piece
    }
}

/// Whether `model` is one whose provider counts otherwise than o200k: Anthropic's and Google's.
fn counts_as_a_provider(model: &str) -> bool {
    let name = condenser::tokens::catalog::base_name(model);
    name.starts_with("claude") || name.starts_with("gemini")
}

/// A request's prompt in the order providers cache it: the tools, then the system prompt or
/// instructions, then the conversation (chat `messages`, Responses `input`, Anthropic
/// `messages`, Gemini `contents`), each as its JSON text, the conversation item by item. Other
/// fields (`max_tokens`, `stream`, …) are no part of the prompt, nor are Anthropic's
/// `cache_control` marks, which Claude Code moves to the newest turn every time.
fn cache_order(request: &Value) -> Vec<String> {
    let mut pieces = Vec::new();
    for field in ["tools", "instructions", "system", "systemInstruction"] {
        if let Some(value) = request.get(field) {
            pieces.push(unmarked(value).to_string());
        }
    }
    for field in ["messages", "input", "contents"] {
        match request.get(field) {
            Some(Value::Array(items)) => {
                pieces.extend(items.iter().map(|item| unmarked(item).to_string()));
            }
            Some(value) => pieces.push(value.to_string()),
            None => {}
        }
    }
    pieces
}

/// `value` without its `cache_control` marks.
fn unmarked(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| *key != "cache_control")
                .map(|(key, value)| (key.clone(), unmarked(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(unmarked).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claude(messages: &[&str]) -> Value {
        let messages: Vec<Value> = messages
            .iter()
            .map(|text| json!({"role": "user", "content": text}))
            .collect();
        json!({"model": "claude-opus-5-5", "system": "Be brief.", "messages": messages})
    }

    #[test]
    fn a_provider_counts_digits_and_symbols_dearer_than_prose() {
        let prose = "The build failed because the linker ran out of memory on the runner. ";
        let rows: String = (1..=40)
            .map(|n| format!("turn-3 row {n}: alpha beta — {}\n", n * 7919))
            .collect();
        let (p, r) = (density(&json!(prose)), density(&json!(rows)));
        assert!(provider_share(p.0, p.1) < 1.1, "{p:?}");
        assert!(provider_share(r.0, r.1) > 1.25, "{r:?}");
        // Against one cache, the learned ratio of a session moves as its content does.
        let cache = PromptCache::provider();
        let exact = PromptCache::default();
        let ratio = |text: &str| {
            let body = claude(&[prose, text]);
            cache.prompt(&body).prompt_tokens as f64 / exact.prompt(&body).prompt_tokens as f64
        };
        let (first, second) = (ratio(prose), ratio(&rows));
        assert!(
            first > 1.04 && first < second && second < 1.36,
            "{first} {second}"
        );
    }

    #[test]
    fn the_cached_share_is_the_prefix_repeated_by_the_same_session() {
        let cache = PromptCache::provider();
        let first = cache.prompt(&claude(&["one two three", "four"]));
        assert_eq!(first.cached_tokens, 0);
        // Another session's request in between does not move this one's.
        let other =
            json!({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]});
        cache.prompt(&other);
        let second = cache.prompt(&claude(&["one two three", "four", "five six"]));
        assert!(
            second.cached_tokens >= first.prompt_tokens - 2,
            "{first:?} {second:?}"
        );
        assert!(second.cached_tokens < second.prompt_tokens);
        // A change in the middle caches only what comes before it.
        let third = cache.prompt(&claude(&["one two three", "FOUR", "five six"]));
        assert!(third.cached_tokens < second.cached_tokens, "{third:?}");
        let usage = third.anthropic_usage(true, 1);
        let sum = [
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .iter()
        .map(|field| usage[field].as_u64().unwrap())
        .sum::<u64>();
        assert_eq!(sum, third.prompt_tokens);
    }
}
