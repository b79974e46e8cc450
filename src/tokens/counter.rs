//! Exact prompt-token counts by OpenAI's cookbook formula, cached per message so a growing
//! conversation only encodes what is new.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use xxhash_rust::xxh3;

use crate::canonical::{fast_hash_parts, fast_hash_with_seed};
use crate::conversation::{Item, Kind, Role, VALID_ROLES};
use crate::tokens::catalog::{base_name, ModelInfo};
use crate::tokens::count_cache::{random_secret, CountCache, SECRET_BYTES};
use crate::tokens::encoding::Encoding;
use crate::tokens::memo::Memo;
use crate::tokens::rules::{count_message, count_request_extras, REPLY_PRIMING};

/// Each `context_length_exceeded` raises a model's counts by this factor, up to the maximum.
const OVERFLOW_STEP: f64 = 1.1;
const OVERFLOW_MAX: f64 = 2.0;
/// Uncached text beyond this many bytes is encoded on the blocking pool, off the async workers.
const BLOCKING_THRESHOLD_BYTES: usize = 16 * 1024;
/// Messages whose counts are kept, per cache. Twice that kept idle memory over 64 MB once an
/// encoding was built.
const COUNT_CACHE_ENTRIES: usize = 100_000;
const EXTRAS_CACHE_ENTRIES: usize = 10_000;
/// Seeds that keep the key spaces of raw-byte keys apart from each other.
const RAW_MESSAGE_SEED: u64 = 0x6d65_7373_6167_6500;
/// Told apart from a message's key, whose seed is the encoding alone.
const PARTS_SEED: u8 = 0xf1;
const RAW_EXTRAS_SEED: u64 = 0x6578_7472_6173_0000;
const LEARNED_MODELS_MAX: usize = 1_000;

/// A request's prompt tokens. Each item's count and `fixed` are the encoding's, functions of
/// the bytes alone, whatever the model: they are what plans are made of, and what a cut is
/// made to, so that a form a session went with reads the same on the next request however
/// the learned ratio moved (rule 8). Only `total`, the provider's count as condenser
/// estimates it, is scaled, by `scale`: for models whose tokenizer is not known exactly, the
/// learned ratio (or the safety margin). The planner takes the scale out of the window
/// instead (`Limits`): a learned figure moves where the steps fall, never what a step made.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptCount {
    pub per_message: Vec<u32>,
    /// Reply priming, tools, tool_choice and response_format.
    pub fixed: u32,
    /// The prompt as the provider would count it: `raw_total` scaled.
    pub total: u64,
    /// The unscaled sum, what the learned ratio is measured against.
    pub raw_total: u64,
    /// What a count of the encoding's is multiplied by to estimate the provider's: 1 where
    /// the tokenizer is exact (and no overflow was seen).
    pub scale: f64,
}

/// A conversation counted from its items' raw JSON.
pub struct RawCount {
    pub count: PromptCount,
    /// What planning needs of each item.
    pub metas: Vec<Item>,
    /// Each item known by its bytes as sent and the dialect that reads them (the key its
    /// count is kept by): items alike in these are alike in every view of them.
    pub identities: Vec<u128>,
}

/// How a dialect reads its raw items: a seed that keeps its items' counts apart from other
/// dialects', and the reading of one item it has not seen (its chat view, which is counted,
/// and what planning needs of it, tokens filled in by the count; None: the raw path does not
/// read it).
pub struct RawItems {
    pub seed: u64,
    pub read: fn(&Value) -> Option<(Value, Item)>,
}

/// Chat messages, checked for a role condenser knows.
const CHAT_ITEMS: RawItems = RawItems {
    seed: RAW_MESSAGE_SEED,
    read: |message| {
        let role = message.get("role").and_then(Value::as_str)?;
        VALID_ROLES
            .contains(&role)
            .then(|| (message.clone(), message_meta(message, 0)))
    },
};

/// A request as raw JSON: each message, and the other fields that cost prompt tokens.
#[derive(Default)]
pub struct RawPrompt<'a> {
    /// Each message as written. Bytes the counter has not seen before are checked (UTF-8,
    /// JSON, a valid role) before they are counted; bytes it has were checked then.
    pub messages: &'a [&'a [u8]],
    pub tools: Option<&'a RawValue>,
    pub tool_choice: Option<&'a RawValue>,
    pub response_format: Option<&'a RawValue>,
}

pub struct TokenCounter {
    /// Per message, keyed by its canonical form (requests handled as a JSON tree).
    cache: CountCache<u32>,
    /// Per message, keyed by its raw bytes, with what planning needs of it.
    raw_messages: CountCache<Item>,
    /// Hashes `raw_messages`' keys. A key found there vouches that the bytes were checked
    /// (see `message_spans`), so keys must not be collidable by someone who knows the hash
    /// function: the secret is random per process.
    raw_message_secret: [u8; SECRET_BYTES],
    /// Tools, tool_choice and response_format together, keyed by their raw bytes.
    raw_extras: CountCache<u32>,
    messages_encoded: AtomicU64,
    /// Smoothed ratio per model base name, as `f64` bits. A model's slot is kept when it is
    /// first seen; later observations find it without a lock and update it in one atomic
    /// step.
    learned: Memo<AtomicU64>,
    /// Per model base name, as `f64` bits: how much upstream's `context_length_exceeded`
    /// answers have raised its counts (see `observe_overflow`).
    overflow: Memo<AtomicU64>,
    unknown_margin: f64,
}

impl TokenCounter {
    pub fn new(unknown_margin: f64) -> Self {
        Self {
            cache: CountCache::new(COUNT_CACHE_ENTRIES),
            raw_messages: CountCache::new(COUNT_CACHE_ENTRIES),
            raw_message_secret: random_secret(),
            raw_extras: CountCache::new(EXTRAS_CACHE_ENTRIES),
            messages_encoded: AtomicU64::new(0),
            learned: Memo::new(LEARNED_MODELS_MAX),
            overflow: Memo::new(LEARNED_MODELS_MAX),
            unknown_margin,
        }
    }

    /// How many messages were encoded rather than found in the cache, since start.
    pub fn messages_encoded(&self) -> u64 {
        self.messages_encoded.load(Ordering::Relaxed)
    }

    /// Skipped when nothing was encoded, as for most requests: every worker adding even a
    /// zero would keep the counter's cache line moving between their cores.
    fn note_encoded(&self, messages: usize) {
        if messages > 0 {
            self.messages_encoded
                .fetch_add(messages as u64, Ordering::Relaxed);
        }
    }

    pub async fn count_request(
        &self,
        request: &Map<String, Value>,
        model: &ModelInfo,
    ) -> PromptCount {
        let fixed = REPLY_PRIMING + count_request_extras(model.encoding, request);
        self.count_messages(messages(request), fixed, model_name(request), model)
            .await
    }

    /// Counts a conversation given as chat messages, which is how every dialect presents
    /// its items, each cached by its canonical form; `fixed` is what the request costs
    /// besides them (reply priming, instructions, tools), already counted.
    pub async fn count_messages(
        &self,
        messages: &[Value],
        fixed: u32,
        model_name: &str,
        model: &ModelInfo,
    ) -> PromptCount {
        let encoding = model.encoding;
        let seed = [encoding as u8];
        let mut per_message = Vec::with_capacity(messages.len());
        let mut misses = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let key = fast_hash_with_seed(&seed, message);
            match self.cache.get(key) {
                Some(tokens) => per_message.push(tokens),
                None => {
                    per_message.push(0);
                    misses.push((index, key));
                }
            }
        }
        let missed: Vec<&Value> = misses.iter().map(|(i, _)| &messages[*i]).collect();
        let counted = count_off_loop(encoding, &missed).await;
        self.note_encoded(misses.len());
        for ((index, key), tokens) in misses.into_iter().zip(counted) {
            per_message[index] = tokens;
            self.cache.insert(key, tokens);
        }
        self.scaled(per_message, fixed, model_name, model)
    }

    /// The tokens of a request's parts other than its messages (instructions, tools,
    /// `tool_choice`), as `count` counts them, kept by the parts' canonical hash: an agent
    /// sends the same tens of thousands of tokens of system prompt and tool schemas with
    /// every request, and encoding them took most of condenser's time on its requests.
    pub fn count_parts(
        &self,
        encoding: Encoding,
        parts: &[Option<&Value>],
        count: impl FnOnce() -> u32,
    ) -> u32 {
        let key = fast_hash_parts(&[PARTS_SEED, encoding as u8], parts);
        if let Some(tokens) = self.cache.get(key) {
            return tokens;
        }
        let tokens = count();
        self.cache.insert(key, tokens);
        tokens
    }

    /// Counts a chat request from its raw JSON, keyed by bytes, so a message seen before is
    /// neither parsed nor encoded. Also returns what planning needs of each message. None
    /// when a message is not a valid chat message: the caller then takes the full path,
    /// which names the problem.
    pub async fn count_raw(
        &self,
        prompt: &RawPrompt<'_>,
        model_name: &str,
        model: &ModelInfo,
    ) -> Option<RawCount> {
        let fixed = REPLY_PRIMING + self.count_raw_extras(prompt, model.encoding)?;
        self.count_raw_items(prompt.messages, &CHAT_ITEMS, fixed, model_name, model)
            .await
    }

    /// Counts a conversation from its items' raw JSON, keyed by their bytes and the dialect,
    /// so an item seen before is neither parsed nor encoded; `fixed` is what the request
    /// costs besides them. Returns what planning needs of each item too. None when `items`
    /// cannot read one of them.
    pub async fn count_raw_items(
        &self,
        raw: &[&[u8]],
        items: &RawItems,
        fixed: u32,
        model_name: &str,
        model: &ModelInfo,
    ) -> Option<RawCount> {
        let encoding = model.encoding;
        // Xor-ed into the hash rather than given as xxh3's seed, which derives a new secret
        // on every call for messages over 240 bytes.
        let seed = u128::from(items.seed | encoding as u64);
        let mut metas = Vec::with_capacity(raw.len());
        let mut identities = Vec::with_capacity(raw.len());
        let mut misses = Vec::new();
        for (index, bytes) in raw.iter().enumerate() {
            let key = xxh3::xxh3_128_with_secret(bytes, &self.raw_message_secret) ^ seed;
            identities.push(key);
            match self.raw_messages.get(key) {
                Some(meta) => metas.push(meta),
                None => {
                    metas.push(Item::new(Role::Other, Kind::Other, 0));
                    misses.push((index, key));
                }
            }
        }
        let mut views = Vec::with_capacity(misses.len());
        let mut read = Vec::with_capacity(misses.len());
        for (index, _) in &misses {
            let text = std::str::from_utf8(raw[*index]).ok()?;
            let item: Value = serde_json::from_str(text).ok()?;
            let (view, meta) = (items.read)(&item)?;
            views.push(view);
            read.push(meta);
        }
        let counted = count_off_loop(encoding, &views.iter().collect::<Vec<_>>()).await;
        for (((index, key), mut meta), tokens) in misses.iter().zip(read).zip(counted) {
            meta.tokens = tokens;
            self.raw_messages.insert(*key, meta);
            metas[*index] = meta;
        }
        self.note_encoded(misses.len());
        let count = self.scaled(
            metas.iter().map(|meta| meta.tokens).collect(),
            fixed,
            model_name,
            model,
        );
        Some(RawCount {
            count,
            metas,
            identities,
        })
    }

    /// The tokens of a request's raw parts other than its items, each part as `count` counts
    /// it parsed (given its index in `parts`), kept by its own bytes, its index and `seed`
    /// (one per dialect): an agent's tool schemas are counted once though the system prompt
    /// beside them changes. The part at `summed`, when an array, is counted as the sum of its
    /// elements, each kept by its own bytes: what `count` must count it as, so that a system
    /// prompt with a summary block appended costs only the summary (3.9M instructions for an
    /// agent's prompt counted afresh). Absent parts cost nothing; None when a part is not JSON.
    pub fn count_raw_parts(
        &self,
        encoding: Encoding,
        (seed, summed): (u64, Option<usize>),
        parts: &[Option<&str>],
        count: impl Fn(usize, Value) -> u32,
    ) -> Option<u32> {
        let mut tokens = 0;
        for (index, raw) in parts.iter().enumerate() {
            let Some(raw) = raw else { continue };
            let elements = (summed == Some(index))
                .then(|| serde_json::from_str::<Vec<&RawValue>>(raw).ok())
                .flatten();
            let Some(elements) = elements else {
                tokens += self
                    .count_raw_part(encoding, seed, index as u64, raw, |part| count(index, part))?;
                continue;
            };
            // Elements kept apart from whole parts with the same bytes, which count otherwise.
            let slot = index as u64 | 1 << 32;
            for element in elements {
                tokens += self.count_raw_part(encoding, seed, slot, element.get(), |element| {
                    count(index, Value::Array(vec![element]))
                })?;
            }
        }
        Some(tokens)
    }

    /// One part (or element) of `count_raw_parts`, kept by its bytes and `slot`.
    fn count_raw_part(
        &self,
        encoding: Encoding,
        seed: u64,
        slot: u64,
        raw: &str,
        count: impl FnOnce(Value) -> u32,
    ) -> Option<u32> {
        // As for items, the seed is xor-ed in rather than given to xxh3.
        let key = xxh3::xxh3_128_with_secret(raw.as_bytes(), &self.raw_message_secret)
            ^ ((u128::from(slot) << 64) | u128::from(seed | encoding as u64));
        if let Some(counted) = self.raw_extras.get(key) {
            return Some(counted);
        }
        let parsed: Value = serde_json::from_str(raw).ok()?;
        let counted = count(parsed);
        self.raw_extras.insert(key, counted);
        Some(counted)
    }

    fn count_raw_extras(&self, prompt: &RawPrompt, encoding: Encoding) -> Option<u32> {
        const FIELDS: [&str; 3] = ["tools", "tool_choice", "response_format"];
        let parts = [prompt.tools, prompt.tool_choice, prompt.response_format]
            .map(|part| part.map(RawValue::get));
        self.count_raw_parts(encoding, (RAW_EXTRAS_SEED, None), &parts, |index, value| {
            let field = FIELDS.get(index).map_or("", |field| *field);
            let extras = Map::from_iter([(field.to_string(), value)]);
            count_request_extras(encoding, &extras)
        })
    }

    /// The counts as they stand, and their total scaled to the provider's count.
    fn scaled(
        &self,
        per_message: Vec<u32>,
        fixed: u32,
        model_name: &str,
        model: &ModelInfo,
    ) -> PromptCount {
        let raw_total = per_message.iter().map(|&t| u64::from(t)).sum::<u64>() + u64::from(fixed);
        let scale = self.scale(model_name, model);
        PromptCount {
            per_message,
            fixed,
            total: scaled_tokens(raw_total, scale),
            raw_total,
            scale,
        }
    }

    /// The factor applied to raw counts: 1 where the tokenizer is exact, else what upstream
    /// usage taught us, else the configured safety margin.
    fn scale(&self, model_name: &str, model: &ModelInfo) -> f64 {
        let name = base_name(model_name);
        let overflow = self
            .overflow
            .read(&name, |factor| {
                f64::from_bits(factor.load(Ordering::Relaxed))
            })
            .unwrap_or(1.0);
        if model.exact {
            return overflow;
        }
        overflow
            * self
                .learned_ratio(&name)
                .unwrap_or(1.0 + self.unknown_margin)
    }

    /// Upstream said a prompt did not fit that condenser counted as `counted` tokens, within
    /// the `usable` it allows: a tokenizer estimated low, or a window configured too large.
    /// Every later count for the model is raised so that a prompt like it would count as
    /// reaching the limit (by a tenth at least, to twice at most), and its requests compact
    /// in time; returns the factor now applied.
    pub fn observe_overflow(&self, model: &str, counted: u64, usable: u64) -> f64 {
        let name = base_name(model);
        let needed = (usable as f64 / counted.max(1) as f64).max(OVERFLOW_STEP);
        let bump = |bits: u64| (f64::from_bits(bits) * needed).min(OVERFLOW_MAX);
        let raise = |factor: &AtomicU64| {
            let (Ok(before) | Err(before)) =
                factor.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some(bump(bits).to_bits())
                });
            bump(before)
        };
        self.overflow
            .read_or_keep(&name, || AtomicU64::new(1.0f64.to_bits()), raise)
            .unwrap_or(1.0)
    }

    fn learned_ratio(&self, model_base_name: &str) -> Option<f64> {
        self.learned.read(model_base_name, |ratio| {
            f64::from_bits(ratio.load(Ordering::Relaxed))
        })
    }

    /// Records upstream's `usage.prompt_tokens` against our unscaled estimate; returns the
    /// smoothed real/estimated ratio for the model.
    pub fn observe_usage(&self, model: &str, raw_estimate: u64, actual: u64) -> Option<f64> {
        if raw_estimate == 0 || actual == 0 {
            return None;
        }
        // Outliers (cached-token accounting, a misreporting upstream) must not make every
        // estimate absurd.
        let sample = (actual as f64 / raw_estimate as f64).clamp(0.5, 2.0);
        let name = base_name(model);
        if let Some(smoothed) = self.learned.read(&name, |ratio| smooth(ratio, sample)) {
            return Some(smoothed);
        }
        // The first sample is the ratio as it stands, unless another response's was kept
        // first: then this one is smoothed into that.
        let first = |ratio: &AtomicU64| {
            if ratio.load(Ordering::Relaxed) == sample.to_bits() {
                sample
            } else {
                smooth(ratio, sample)
            }
        };
        self.learned
            .read_or_keep(&name, || AtomicU64::new(sample.to_bits()), first)
    }
}

/// `tokens` of the encoding's as the provider counts them, by `scale`.
pub fn scaled_tokens(tokens: u64, scale: f64) -> u64 {
    if scale == 1.0 {
        return tokens;
    }
    (tokens as f64 * scale).ceil() as u64
}

/// Moves a learned ratio a fifth of the way to `sample`, as one atomic step so concurrent
/// observations are all applied; returns the new ratio.
fn smooth(ratio: &AtomicU64, sample: f64) -> f64 {
    let step = |bits: u64| 0.8 * f64::from_bits(bits) + 0.2 * sample;
    let (Ok(before) | Err(before)) =
        ratio.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some(step(bits).to_bits())
        });
    step(before)
}

/// Counts messages, on the blocking pool when there is enough new text to stall an event
/// loop (each worker's loop serves all of its connections, streams included).
async fn count_off_loop(encoding: Encoding, messages: &[&Value]) -> Vec<u32> {
    let count_here = || -> Vec<u32> {
        messages
            .iter()
            .map(|message| count_message(encoding, message))
            .collect()
    };
    let new_text: usize = messages.iter().map(|message| text_bytes(message)).sum();
    if new_text <= BLOCKING_THRESHOLD_BYTES {
        return count_here();
    }
    let owned: Vec<Value> = messages.iter().map(|message| (*message).clone()).collect();
    let counted = tokio::task::spawn_blocking(move || {
        owned
            .iter()
            .map(|message| count_message(encoding, message))
            .collect()
    })
    .await;
    // No blocking pool (the runtime is shutting down): count here rather than not at all.
    counted.unwrap_or_else(|_| count_here())
}

/// A chat request's messages; none when the field is missing or not an array.
pub fn messages(request: &Map<String, Value>) -> &[Value] {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn model_name(request: &Map<String, Value>) -> &str {
    request.get("model").and_then(Value::as_str).unwrap_or("")
}

/// What the planner needs of one chat message, given its token count.
pub fn message_meta(message: &Value, tokens: u32) -> Item {
    let role = Role::parse(message.get("role").and_then(Value::as_str).unwrap_or(""));
    let calls_tools = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|calls| !calls.is_empty())
        || message.get("function_call").is_some_and(|c| !c.is_null());
    let kind = match role {
        Role::Tool => Kind::ToolResult,
        Role::Other => Kind::Other,
        _ if calls_tools => Kind::ToolCall,
        _ => Kind::Message,
    };
    Item::new(role, kind, tokens)
}

fn text_bytes(message: &Value) -> usize {
    match message {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(text_bytes).sum(),
        Value::Object(map) => map.values().map(text_bytes).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::rules::*;

    /// No other unit test counts with o200k_harmony, so it is still unbuilt here until this
    /// test uses it.
    #[test]
    fn an_encoding_is_built_on_first_use_not_at_start() {
        let _counter = TokenCounter::new(1.0);
        assert!(!is_loaded(Encoding::O200kHarmony));
        assert!(count_text(Encoding::O200kHarmony, "hello world") > 0);
        assert!(is_loaded(Encoding::O200kHarmony));
    }

    /// The ratio after each observation, computed as the smoothing is specified.
    fn smoothed(samples: &[f64]) -> Vec<f64> {
        let mut ratio = None;
        samples
            .iter()
            .map(|&s| *ratio.insert(ratio.map_or(s, |r: f64| 0.8 * r + 0.2 * s)))
            .collect()
    }

    #[test]
    fn each_counter_keys_raw_messages_with_its_own_random_secret() {
        let (one, two) = (random_secret(), random_secret());
        assert_ne!(one, two);
        assert!(
            one.windows(8).any(|w| w != &one[..8]),
            "not one word repeated"
        );
    }

    #[test]
    fn an_overflow_raises_later_counts_to_the_limit_within_bounds() {
        let counter = TokenCounter::new(0.1);
        let exact = ModelInfo {
            encoding: Encoding::O200k,
            context_window: 8_000,
            exact: true,
            family: None,
            price: None,
        };
        let plain = |counter: &TokenCounter| counter.scale("gpt-4o", &exact);
        assert_eq!(plain(&counter), 1.0);
        assert!((counter.observe_overflow("gpt-4o", 5_000, 6_000) - 1.2).abs() < 1e-9);
        assert!((plain(&counter) - 1.2).abs() < 1e-9);
        assert!(
            (counter.observe_overflow("gpt-4o", 6_000, 6_000) - 1.32).abs() < 1e-9,
            "a tenth at least"
        );
        assert_eq!(
            counter.observe_overflow("gpt-4o", 1_000, 6_000),
            2.0,
            "twice at most"
        );
        assert_eq!(counter.scale("gpt-4o-mini", &exact), 1.0, "per model");
    }

    #[test]
    fn learned_ratio_smooths_each_observation_per_base_name() {
        let counter = TokenCounter::new(0.1);
        assert_eq!(counter.observe_usage("claude-x", 0, 10), None);
        assert_eq!(counter.observe_usage("claude-x", 10, 0), None);
        let observed: Vec<f64> = [
            ("claude-x", 100, 120),
            ("Anthropic/Claude-X", 100, 1_000),
            ("claude-x ", 100, 10),
            ("vendor/claude-x", 90, 100),
        ]
        .iter()
        .map(|&(model, raw, actual)| counter.observe_usage(model, raw, actual).unwrap())
        .collect();
        // Samples are clamped to [0.5, 2].
        assert_eq!(observed, smoothed(&[1.2, 2.0, 0.5, 100.0 / 90.0]));
        assert_eq!(counter.learned_ratio("claude-x"), observed.last().copied());
        let unknown = ModelInfo {
            encoding: Encoding::O200k,
            context_window: 1_000,
            exact: false,
            family: None,
            price: None,
        };
        assert_eq!(counter.scale("Claude-X", &unknown), observed[3]);
        assert_eq!(counter.scale("other-model", &unknown), 1.1);
    }

    #[tokio::test]
    async fn a_learned_ratio_scales_the_total_and_never_an_items_count() {
        let counter = TokenCounter::new(0.1);
        let estimated = ModelInfo {
            encoding: Encoding::O200k,
            context_window: 100_000,
            exact: false,
            family: None,
            price: None,
        };
        let messages = [
            serde_json::json!({"role": "user", "content": "the rows of turn 7, one to a hundred"}),
            serde_json::json!({"role": "tool", "tool_call_id": "a", "content": "row 1\nrow 2\n".repeat(40)}),
        ];
        let before = counter
            .count_messages(&messages, 30, "claude-x", &estimated)
            .await;
        counter.observe_usage("claude-x", 100, 135);
        let after = counter
            .count_messages(&messages, 30, "claude-x", &estimated)
            .await;
        // What plans and cuts are made of is the bytes' count, whatever was learned.
        assert_eq!(
            (&before.per_message, before.fixed, before.raw_total),
            (&after.per_message, after.fixed, after.raw_total)
        );
        assert_eq!((before.scale, after.scale), (1.1, 1.35));
        assert_eq!(after.total, (after.raw_total as f64 * 1.35).ceil() as u64);
        assert!(after.total > before.total);
    }

    #[test]
    fn learned_models_are_bounded_but_known_ones_keep_learning() {
        let counter = TokenCounter::new(0.1);
        for i in 0..LEARNED_MODELS_MAX {
            assert_eq!(counter.observe_usage(&format!("m{i}"), 10, 10), Some(1.0));
        }
        assert_eq!(counter.observe_usage("one-too-many", 10, 20), None);
        assert_eq!(counter.learned_ratio("one-too-many"), None);
        assert_eq!(
            counter.observe_usage("m7", 10, 20),
            smoothed(&[1.0, 2.0]).last().copied()
        );
    }

    #[test]
    fn concurrent_observations_are_all_applied() {
        const EACH: usize = 30;
        let counter = TokenCounter::new(0.1);
        counter.observe_usage("m", 10, 5);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..EACH {
                        counter.observe_usage("m", 10, 20);
                    }
                });
            }
        });
        // The same sample each time, so the order does not matter, only that none is lost.
        let mut samples = vec![0.5];
        samples.extend([2.0; 2 * EACH]);
        assert_eq!(
            counter.learned_ratio("m"),
            smoothed(&samples).last().copied()
        );
    }
}
