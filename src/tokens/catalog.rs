//! What condenser knows of a model: its tokenizer, its context window and, if configured,
//! its price.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::tokens::encoding::Encoding;
use crate::tokens::memo::Memo;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokensConfig {
    /// Context window assumed for a model found neither in `[models]` nor the built-in table.
    pub default_context_window: u64,
    /// Extra share added to estimates for models whose tokenizer is not known exactly.
    pub unknown_model_margin: f64,
}

impl Default for TokensConfig {
    fn default() -> Self {
        Self {
            default_context_window: 32768,
            unknown_model_margin: 0.1,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOverride {
    pub context_window: Option<u64>,
    pub encoding: Option<String>,
    pub price: Option<Price>,
}

/// What a provider charges for a million tokens of each kind, in one currency of the
/// operator's choosing. Every tier is stated: one a provider does not bill apart (OpenAI's
/// cache writes) is priced as it bills it (at `input`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// A prompt token not served from, nor written to, the provider's prompt cache.
    pub input: f64,
    pub cache_read: f64,
    pub cache_write: f64,
    pub output: f64,
}

/// Encodings by model-name prefix; the first match wins, so longer prefixes come first.
const ENCODINGS: &[(&str, Encoding)] = &[
    ("gpt-oss", Encoding::O200kHarmony),
    ("gpt-4o", Encoding::O200k),
    ("gpt-4.1", Encoding::O200k),
    ("gpt-4.5", Encoding::O200k),
    ("gpt-5", Encoding::O200k),
    ("chatgpt-4o", Encoding::O200k),
    ("o1", Encoding::O200k),
    ("o3", Encoding::O200k),
    ("o4", Encoding::O200k),
    ("gpt-4", Encoding::Cl100k),
    ("gpt-3.5", Encoding::Cl100k),
    ("gpt-35", Encoding::Cl100k),
    ("text-embedding-3", Encoding::Cl100k),
    ("text-embedding-ada", Encoding::Cl100k),
];

/// Context windows by model-name prefix (after any `provider/`); longest matching prefix wins.
/// The key is also the model's family, the bounded `model` label of metrics.
const WINDOWS: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-5", 400_000),
    ("gpt-5-chat", 128_000),
    ("gpt-4.5", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-1106", 128_000),
    ("gpt-4-0125", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("gpt-3.5-turbo-instruct", 4_096),
    ("gpt-oss", 131_072),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o1-preview", 128_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    // Anthropic
    ("claude-", 200_000),
    // Google
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-2", 1_048_576),
    ("gemini-3", 1_048_576),
    ("gemma-3", 131_072),
    // Meta
    ("llama-3.1", 131_072),
    ("llama-3.2", 131_072),
    ("llama-3.3", 131_072),
    ("llama-3-", 8_192),
    ("llama-4", 1_048_576),
    ("meta-llama-3.1", 131_072),
    ("meta-llama-3.3", 131_072),
    // Mistral
    ("mistral-large", 131_072),
    ("mistral-medium", 131_072),
    ("mistral-small", 131_072),
    ("ministral", 131_072),
    ("open-mistral-nemo", 131_072),
    ("codestral", 262_144),
    ("mixtral-8x7b", 32_768),
    ("mixtral-8x22b", 65_536),
    // DeepSeek
    ("deepseek-chat", 131_072),
    ("deepseek-reasoner", 131_072),
    ("deepseek-v3", 131_072),
    ("deepseek-r1", 131_072),
    // Qwen
    ("qwen-max", 32_768),
    ("qwen-plus", 131_072),
    ("qwen-turbo", 1_000_000),
    ("qwen2.5", 131_072),
    ("qwen3", 131_072),
    ("qwq", 131_072),
];

#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub encoding: Encoding,
    pub context_window: u64,
    /// The encoding is the model's own, so counts are exact; otherwise they are estimates.
    pub exact: bool,
    /// Built-in family (or configured name) for bounded metric labels.
    pub family: Option<Cow<'static, str>>,
    /// As `[models]` configures it; none by default.
    pub price: Option<Price>,
}

/// Clients choose model names, so the resolutions kept are bounded; names beyond are
/// resolved each time, as they were before any were kept.
const RESOLVED_MAX: usize = 1_000;

pub struct ModelCatalog {
    overrides: BTreeMap<String, ModelOverride>,
    defaults: TokensConfig,
    warned: Mutex<HashSet<String>>,
    /// By exact model string: a request's model costs one lookup rather than every prefix
    /// and override.
    resolved: Memo<ModelInfo>,
}

/// `openrouter/openai/gpt-4o` → `gpt-4o`; case-insensitive. Borrowed when already lower
/// case, as nearly every model name is, since requests look it up several times each.
pub fn base_name(model: &str) -> Cow<'_, str> {
    // A byte search: `rsplit('/')` sets up a general reverse searcher, which costs several
    // times more on names this short, and this runs on every request.
    let name = match model.bytes().rposition(|b| b == b'/') {
        Some(slash) => &model[slash + 1..],
        None => model,
    }
    .trim();
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

/// `claude-` → `claude`.
fn window_family(prefix: &'static str) -> &'static str {
    prefix.trim_end_matches('-')
}

impl ModelCatalog {
    pub fn new(overrides: BTreeMap<String, ModelOverride>, defaults: TokensConfig) -> Self {
        Self {
            overrides,
            defaults,
            warned: Mutex::new(HashSet::new()),
            resolved: Memo::new(RESOLVED_MAX),
        }
    }

    pub fn resolve(&self, model: &str) -> ModelInfo {
        self.resolved
            .get_or_derive(model, || self.resolve_uncached(model))
    }

    fn resolve_uncached(&self, model: &str) -> ModelInfo {
        let name = base_name(model);
        let known_encoding = ENCODINGS
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map(|(_, encoding)| *encoding);
        let window = WINDOWS
            .iter()
            .filter(|(prefix, _)| name.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len());
        let over = self
            .overrides
            .get(model)
            .or_else(|| self.overrides.get(name.as_ref()));
        let encoding = over
            .and_then(|o| o.encoding.as_deref())
            .and_then(Encoding::from_name)
            .or(known_encoding);
        let context_window = over
            .and_then(|o| o.context_window)
            .or(window.map(|(_, w)| *w));
        if context_window.is_none() && encoding.is_none() {
            self.warn_once(model);
        }
        ModelInfo {
            exact: encoding.is_some(),
            encoding: encoding.unwrap_or(Encoding::O200k),
            context_window: context_window.unwrap_or(self.defaults.default_context_window),
            family: if over.is_some() {
                Some(Cow::Owned(name.into_owned()))
            } else {
                window.map(|(prefix, _)| Cow::Borrowed(window_family(prefix)))
            },
            price: over.and_then(|o| o.price),
        }
    }

    /// Every family `resolve` can name: the built-in ones and the overridden models'.
    pub fn families(&self) -> impl Iterator<Item = Cow<'_, str>> {
        WINDOWS
            .iter()
            .map(|(prefix, _)| Cow::Borrowed(window_family(prefix)))
            // An override matches by the full name or by its base name, so either way the
            // family is its key's base name.
            .chain(self.overrides.keys().map(|model| base_name(model)))
    }

    fn warn_once(&self, model: &str) {
        let Ok(mut warned) = self.warned.lock() else {
            return;
        };
        if warned.len() < 10_000 && warned.insert(model.to_string()) {
            tracing::warn!(
                model,
                default_context_window = self.defaults.default_context_window,
                "unknown model: assuming o200k_base with a safety margin and the default window"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> ModelCatalog {
        ModelCatalog::new(BTreeMap::new(), TokensConfig::default())
    }

    #[test]
    fn families_resolve_to_their_encoding() {
        let c = catalog();
        let cases = [
            ("gpt-4o", Encoding::O200k),
            ("gpt-4o-2024-08-06", Encoding::O200k),
            ("openai/gpt-4o-mini", Encoding::O200k),
            ("gpt-4.1-nano-2025-04-14", Encoding::O200k),
            ("gpt-4.5-preview", Encoding::O200k),
            ("gpt-5-mini", Encoding::O200k),
            ("o1-preview", Encoding::O200k),
            ("o3-mini-2025-01-31", Encoding::O200k),
            ("o4-mini", Encoding::O200k),
            ("chatgpt-4o-latest", Encoding::O200k),
            ("gpt-4", Encoding::Cl100k),
            ("gpt-4-0613", Encoding::Cl100k),
            ("azure/gpt-4-turbo-2024-04-09", Encoding::Cl100k),
            ("gpt-3.5-turbo-0125", Encoding::Cl100k),
            ("text-embedding-3-small", Encoding::Cl100k),
            ("gpt-oss-120b", Encoding::O200kHarmony),
            ("openai/gpt-oss-20b", Encoding::O200kHarmony),
        ];
        for (model, encoding) in cases {
            let info = c.resolve(model);
            assert_eq!(info.encoding, encoding, "{model}");
            assert!(info.exact, "{model}");
        }
    }

    #[test]
    fn windows_use_the_longest_prefix() {
        let c = catalog();
        assert_eq!(c.resolve("gpt-4").context_window, 8_192);
        assert_eq!(c.resolve("gpt-4-turbo").context_window, 128_000);
        assert_eq!(c.resolve("gpt-4o-mini").context_window, 128_000);
        assert_eq!(
            c.resolve("anthropic/claude-sonnet-4-5").context_window,
            200_000
        );
        assert_eq!(c.resolve("o1-mini").context_window, 128_000);
        assert_eq!(c.resolve("o1").context_window, 200_000);
    }

    #[test]
    fn other_vendors_are_estimates() {
        let info = catalog().resolve("claude-3-5-sonnet-20241022");
        assert!(!info.exact);
        assert_eq!(info.encoding, Encoding::O200k);
        assert_eq!(info.family.as_deref(), Some("claude"));
    }

    #[test]
    fn unknown_model_gets_defaults() {
        let info = catalog().resolve("my-local-model");
        assert_eq!(
            info.context_window,
            TokensConfig::default().default_context_window
        );
        assert!(!info.exact);
        assert_eq!(info.family, None);
    }

    #[test]
    fn base_names_drop_the_provider_and_case() {
        for (model, base) in [
            ("gpt-4o", "gpt-4o"),
            ("openrouter/openai/GPT-4o ", "gpt-4o"),
            ("Anthropic/Claude-Sonnet-4-5", "claude-sonnet-4-5"),
            (" my-model", "my-model"),
            ("x/", ""),
        ] {
            assert_eq!(base_name(model), base, "{model}");
        }
        assert!(matches!(
            base_name("openai/gpt-4o"),
            Cow::Borrowed("gpt-4o")
        ));
    }

    #[test]
    fn kept_resolutions_match_fresh_ones_and_stay_bounded() {
        let overrides = BTreeMap::from([(
            "my-local-model".to_string(),
            ModelOverride {
                context_window: Some(4096),
                encoding: None,
                price: None,
            },
        )]);
        let c = ModelCatalog::new(overrides, TokensConfig::default());
        let names: Vec<String> = ["gpt-4o", "Vendor/My-Local-Model", "claude-x", "unknown"]
            .map(String::from)
            .into_iter()
            .chain((0..RESOLVED_MAX + 50).map(|i| format!("gpt-4o-{i}")))
            .collect();
        for _ in 0..2 {
            for name in &names {
                assert_eq!(c.resolve(name), c.resolve_uncached(name), "{name}");
            }
        }
        assert_eq!(c.resolved.kept(), RESOLVED_MAX);
        assert_eq!(c.resolve("gpt-4o-1049").context_window, 128_000);
        assert_eq!(
            c.warned.lock().unwrap().len(),
            1,
            "warned once, for unknown"
        );
    }

    #[test]
    fn families_name_every_family_a_resolution_can_have() {
        let overrides = BTreeMap::from(
            ["Corp/Local-Model", "plain-model", "gpt-4o-custom"]
                .map(|model| (model.to_string(), ModelOverride::default())),
        );
        let c = ModelCatalog::new(overrides, TokensConfig::default());
        let families: HashSet<String> = c.families().map(Cow::into_owned).collect();
        let models = WINDOWS
            .iter()
            .flat_map(|(prefix, _)| [prefix.to_string(), format!("Vendor/{prefix}x-1")])
            .chain(
                [
                    "Corp/Local-Model",
                    "other/PLAIN-model",
                    "gpt-4o-custom",
                    "unknown",
                ]
                .map(String::from),
            );
        let mut resolved = 0;
        for model in models {
            if let Some(family) = c.resolve(&model).family {
                assert!(families.contains(family.as_ref()), "{model}: {family}");
                resolved += 1;
            }
        }
        assert_eq!(resolved, 2 * WINDOWS.len() + 3);
    }

    #[test]
    fn overrides_win() {
        let mut overrides = BTreeMap::new();
        overrides.insert(
            "my-local-model".to_string(),
            ModelOverride {
                context_window: Some(4096),
                encoding: Some("cl100k_base".into()),
                price: None,
            },
        );
        let info = ModelCatalog::new(overrides, TokensConfig::default()).resolve("my-local-model");
        assert_eq!(info.context_window, 4096);
        assert_eq!(info.encoding, Encoding::Cl100k);
        assert!(info.exact);
        assert_eq!(info.family.as_deref(), Some("my-local-model"));
        let by_base = ModelCatalog::new(
            BTreeMap::from([("my-local-model".to_string(), ModelOverride::default())]),
            TokensConfig::default(),
        )
        .resolve("Vendor/My-Local-Model");
        assert_eq!(by_base.family.as_deref(), Some("my-local-model"));
    }
}
