//! A provider's prompt cache, as the scripted upstreams report it when a test asks
//! (`LlmBehaviour::prompt_cache`): providers bill a prompt's cached share at about a tenth, and
//! report it in each reply's usage.

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

/// The prompt cache of one scripted upstream: each request's prompt, read in the order
/// providers cache it ([`cache_order`]), is cached as far as it repeats the previous request's,
/// counted in o200k tokens (the rule: the longest common prefix with the previous
/// request). Providers also cache only from about 1,024 tokens and in steps; that is left out,
/// so that small test prompts report a cached share. Clones share the cache.
#[derive(Clone, Default)]
pub struct PromptCache {
    previous: Arc<Mutex<String>>,
}

impl PromptCache {
    /// `request`'s prompt and the share of it cached; it is then the previous request.
    pub fn prompt(&self, request: &Value) -> CachedPrompt {
        let prompt = cache_order(request);
        let mut previous = self.previous.lock().unwrap();
        let mut common = previous
            .bytes()
            .zip(prompt.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !prompt.is_char_boundary(common) {
            common -= 1;
        }
        let counted = CachedPrompt {
            prompt_tokens: u64::from(count_text(Encoding::O200k, &prompt)),
            cached_tokens: u64::from(count_text(Encoding::O200k, &prompt[..common])),
        };
        *previous = prompt;
        counted
    }
}

/// A request's prompt in the order providers cache it: the tools, then the system prompt or
/// instructions, then the conversation (chat `messages`, Responses `input`, Anthropic
/// `messages`, Gemini `contents`), each as its JSON text. Other fields (`max_tokens`,
/// `stream`, …) are no part of the prompt.
fn cache_order(request: &Value) -> String {
    [
        "tools",
        "instructions",
        "system",
        "systemInstruction",
        "messages",
        "input",
        "contents",
    ]
    .iter()
    .filter_map(|field| request.get(field))
    .map(Value::to_string)
    .collect()
}
