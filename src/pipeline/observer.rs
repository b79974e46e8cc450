//! What observe mode keeps (`Observer`): a compactor of its own whose summaries stand in for
//! the summarizer's, at their budget (`Compactor::standing_in`), and each session's last
//! request as the provider would cache it; and how a would-be request is billed against the
//! one before it: the share that repeats it is read from the provider's cache.

use std::sync::{Arc, Mutex, PoisonError};

use hyper::header::HeaderMap;
use serde_json::value::RawValue;
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use crate::compaction::compactor::Compactor;
use crate::config::{Config, ConfigError};
use crate::dialect::stages::Dialect;
use crate::tokens::catalog::ModelCatalog;

/// Sessions whose last would-be request is kept, the least recently seen dropped first.
const SESSIONS: u64 = 10_000;

/// Observe mode's compactor, and each session's last request as the provider would cache it.
pub struct Observer {
    pub compactor: Arc<Compactor>,
    sessions: moka::sync::Cache<u64, Arc<Mutex<Session>>>,
}

impl Observer {
    /// A compactor like the gateway's, without Redis: its would-be summaries stay in a cache
    /// of its own.
    pub fn new(
        config: &Config,
        catalog: Arc<ModelCatalog>,
        metrics: &crate::observe::metrics::Metrics,
        connections: &crate::transport::upstream::Connections,
    ) -> Result<Observer, ConfigError> {
        let mut own = config.clone();
        own.cache.redis_url.clear();
        let compactor = Compactor::new(
            &own,
            catalog,
            metrics.cache_errors.clone(),
            metrics.summarize_seconds.clone(),
            // Would-be forms are not the gateway's: counted apart, never shown.
            (metrics.summarizer_health.clone(), &would_be_forms()?),
            connections,
            crate::dialect::summary_api_named(&config.summarizer.api)?,
        )?
        .standing_in();
        Ok(Observer {
            compactor: Arc::new(compactor),
            sessions: moka::sync::Cache::new(SESSIONS),
        })
    }

    /// Once the would-be summaries being made have landed.
    pub async fn settled(&self) {
        self.compactor.settled().await;
    }

    /// Bills a would-be request against its session's before it: `client` and `forwarded`
    /// are the request as sent and as `auto` would have sent it (`units`), `tokens` their
    /// counts, `summarized` the items its summary replaces. It is then the session's last.
    pub fn judge(
        &self,
        (caller, model): (&HeaderMap, &str),
        (client, forwarded): (Prompt, Prompt),
        (received_tokens, forwarded_tokens): (u64, u64),
        summarized: usize,
    ) -> Judged {
        let key = session_key(&self.compactor.caller(caller), model, &client);
        let (client, forwarded) = (client.units, forwarded.units);
        let session = self.sessions.get_with(key, Default::default);
        // A session's state is whole after every statement; a panic elsewhere leaves it usable.
        let mut session = session.lock().unwrap_or_else(PoisonError::into_inner);
        let first = session.forwarded.is_empty();
        let (repeated, cached_bytes) = common(&session.forwarded, &forwarded);
        let (client_repeated, client_cached_bytes) = common(&session.client, &client);
        let cache_break = (!first && repeated < session.forwarded.len()).then(|| {
            if client_repeated < session.client.len() {
                CacheBreak::ClientChange
            } else if summarized != session.summarized {
                CacheBreak::SummaryStep
            } else {
                CacheBreak::CutStep
            }
        });
        let judged = Judged {
            session: key,
            cached_tokens: share(forwarded_tokens, cached_bytes, &forwarded),
            client_cached_tokens: share(received_tokens, client_cached_bytes, &client),
            cache_break,
        };
        *session = Session {
            client,
            forwarded,
            summarized,
        };
        judged
    }
}

/// A would-be request against the one before it in its session.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    /// The session it belongs to (its caller, model and first item): the key a report
    /// groups requests by.
    pub session: u64,
    /// Of the would-be prompt, the share that repeats the would-be request before it.
    pub cached_tokens: u64,
    /// Of the prompt as sent, the share that repeats the request the client sent before it.
    pub client_cached_tokens: u64,
    /// Why the would-be request does not repeat the whole of the one before; none for a
    /// session's first request.
    pub cache_break: Option<CacheBreak>,
}

/// Why a would-be request does not repeat the whole of the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheBreak {
    /// The client's own request changed what it sent before.
    ClientChange,
    /// A new summary, or the first.
    SummaryStep,
    /// More tool outputs cut.
    CutStep,
}

impl CacheBreak {
    pub fn name(self) -> &'static str {
        match self {
            CacheBreak::ClientChange => "client_change",
            CacheBreak::SummaryStep => "summary_step",
            CacheBreak::CutStep => "cut_step",
        }
    }
}

/// A session's last request: as the client sent it, and as `auto` would have sent it.
#[derive(Default)]
struct Session {
    client: Vec<Unit>,
    forwarded: Vec<Unit>,
    summarized: usize,
}

/// One part of a prompt in the provider's cache order (a field before the conversation, or
/// one of its items): its hash and length, JSON whitespace and `cache_control` marks left
/// out, as a provider caches the prompt they render and not the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unit {
    hash: u64,
    bytes: u64,
}

impl Unit {
    /// What the provider's cache compares it by.
    pub(super) fn hash(&self) -> u64 {
        self.hash
    }
}

/// A prompt in its provider's cache order: its units, the first `parts` of them the fields
/// before the conversation.
#[derive(Debug, Default)]
pub struct Prompt {
    units: Vec<Unit>,
    parts: usize,
}

/// A request body's prompt in its dialect's cache order; none for a body that is not a JSON
/// object (the pipeline refused it before it got here).
pub fn units<D: Dialect>(body: &[u8]) -> Option<Prompt> {
    let fields: std::collections::HashMap<String, &RawValue> = serde_json::from_slice(body).ok()?;
    let mut units: Vec<Unit> = D::CACHED_BEFORE
        .iter()
        .filter_map(|field| fields.get(*field))
        .map(|raw| unit(raw))
        .collect();
    let parts = units.len();
    if let Some(conversation) = fields.get(D::CONVERSATION_FIELD) {
        let items: Vec<&RawValue> = serde_json::from_str(conversation.get()).ok()?;
        units.extend(items.into_iter().map(unit));
    }
    Some(Prompt { units, parts })
}

pub(super) fn unit(raw: &RawValue) -> Unit {
    let text = raw.get();
    if memchr::memmem::find(text.as_bytes(), b"\"cache_control\"").is_some() {
        if let Ok(mut value) = serde_json::from_str::<Value>(text) {
            unmark(&mut value);
            return unit_of(value.to_string().as_bytes());
        }
    }
    unit_of(text.as_bytes())
}

/// Anthropic's `cache_control` marks, which a client moves from turn to turn and which are
/// no part of the prompt, taken out.
fn unmark(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.shift_remove("cache_control");
            fields.values_mut().for_each(unmark);
        }
        Value::Array(items) => items.iter_mut().for_each(unmark),
        _ => {}
    }
}

/// The hash and length of JSON text without its whitespace outside strings: a client's
/// `", "` and a rewrite's `","` are the same prompt.
fn unit_of(json: &[u8]) -> Unit {
    let mut hasher = Xxh3::new();
    let (mut in_string, mut escaped) = (false, false);
    let mut start = 0;
    let mut bytes = 0u64;
    for (at, &byte) in json.iter().enumerate() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if byte == b'"' {
            in_string = true;
        } else if byte.is_ascii_whitespace() {
            hasher.update(&json[start..at]);
            bytes += (at - start) as u64;
            start = at + 1;
        }
    }
    hasher.update(&json[start..]);
    bytes += (json.len() - start) as u64;
    Unit {
        hash: hasher.digest(),
        bytes,
    }
}

/// How many leading units `now` shares with `before`, and their bytes.
fn common(before: &[Unit], now: &[Unit]) -> (usize, u64) {
    before
        .iter()
        .zip(now)
        .take_while(|(a, b)| a == b)
        .fold((0, 0), |(n, bytes), (_, unit)| (n + 1, bytes + unit.bytes))
}

/// The share of `tokens` that `common_bytes` of `units` are.
fn share(tokens: u64, common_bytes: u64, units: &[Unit]) -> u64 {
    let total: u64 = units.iter().map(|u| u.bytes).sum();
    (u128::from(tokens) * u128::from(common_bytes))
        .checked_div(u128::from(total))
        .map_or(0, |cached| u64::try_from(cached).unwrap_or(u64::MAX))
}

/// The session a request belongs to: its caller, its model, and what its client sends first
/// (the fields before the conversation and its first item), which a provider caches first.
fn session_key(caller: &[u8; 32], model: &str, client: &Prompt) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(caller);
    hasher.update(model.as_bytes());
    for unit in client.units.iter().take(client.parts + 1) {
        hasher.update(&unit.hash.to_le_bytes());
    }
    hasher.digest()
}

/// A `condenser_forms_total` of observe mode's own, registered nowhere.
fn would_be_forms() -> Result<prometheus::IntCounterVec, ConfigError> {
    prometheus::IntCounterVec::new(
        prometheus::Opts::new("would_be_forms", "unshown"),
        &["outcome"],
    )
    .map_err(|error| ConfigError::Invalid(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::messages::Messages;

    #[test]
    fn a_unit_is_the_prompt_not_its_whitespace_nor_its_cache_marks() {
        assert_eq!(
            unit_of(br#"{"a": [1, 2], "b": "x"}"#),
            unit_of(br#"{"a":[1,2],"b":"x"}"#)
        );
        assert_eq!(unit_of(br#"{"a":[1,2],"b":"x"}"#).bytes, 19);
        // Inside a string, a space is the prompt's, and an escaped quote ends nothing.
        assert_ne!(unit_of(br#""a b""#), unit_of(br#""ab""#));
        assert_ne!(unit_of(br#"["a\" b"]"#), unit_of(br#"["a\"b"]"#));
        let marked = br#"{"model":"m","system":[{"type":"text","text":"rules","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}"#;
        let unmarked = br#"{"model":"m","system":[{"type":"text","text":"rules"}],"messages":[{"role":"user","content":"hi"}]}"#;
        let (marked, unmarked) = (
            units::<Messages>(marked).unwrap(),
            units::<Messages>(unmarked).unwrap(),
        );
        assert_eq!(marked.units, unmarked.units);
        assert_eq!((marked.parts, marked.units.len()), (1, 2));
    }

    #[test]
    fn the_cached_share_is_the_leading_units_repeated() {
        let unit = |hash, bytes| Unit { hash, bytes };
        let before = [unit(1, 10), unit(2, 30), unit(3, 60)];
        let now = [unit(1, 10), unit(2, 30), unit(4, 40), unit(5, 20)];
        assert_eq!(common(&before, &now), (2, 40));
        // 40 of 100 bytes: 40% of the prompt's tokens.
        assert_eq!(share(2_000, 40, &now), 800);
        assert_eq!(share(2_000, 0, &[]), 0);
    }
}
