//! Carries out a compaction plan: finds or makes the summary of the evicted span (longest
//! cached prefix, extension, one summarizer call per span however many ask), rewrites the
//! messages, and falls back per `on_failure` when the summarizer fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use hyper::header::HeaderValue;
use serde_json::{json, Value};

use crate::compaction::cache::{prefix_keys, scope, Key, Summary, SummaryCache};
use crate::compaction::plan::{Limits, Mode, Split};
use crate::compaction::redis::{unix_now, LockOutcome, RedisStore};
use crate::compaction::summarizer::{
    Evicted, SummarizeError, Summarizer, SummaryRequest, PROMPT_VERSION,
};
use crate::config::{Config, ConfigError, ContextConfig, OnFailure};
use crate::error::ProxyError;
use crate::http::upstream::Upstream;
use crate::models::{ModelCatalog, ModelInfo};
use crate::tokens::counter::{count_text, shorten_middle, PromptCount};

/// Poll interval while another replica makes a summary this one needs.
const REMOTE_POLL: Duration = Duration::from_millis(100);

type SharedSummary = Shared<BoxFuture<'static, Result<Arc<Summary>, SummarizeError>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Summarized,
    Trimmed,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Summarized => "summarized",
            Action::Trimmed => "trimmed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
    Extended,
    None,
}

impl CacheOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Extended => "extended",
            CacheOutcome::None => "none",
        }
    }
}

/// The rewritten messages and how they came about.
#[derive(Debug)]
pub struct Rewrite {
    pub messages: Vec<Value>,
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    /// Time spent waiting on the summarizer (not condenser's own overhead).
    pub waited: Duration,
}

pub struct CompactionJob<'a> {
    pub messages: &'a [Value],
    pub count: &'a PromptCount,
    pub split: &'a Split,
    pub model: &'a str,
    pub info: &'a ModelInfo,
    pub upstream: &'a Arc<Upstream>,
    pub authorization: Option<&'a HeaderValue>,
    pub settings: &'a ContextConfig,
    pub mode: Mode,
    pub limits: Limits,
}

pub struct Compactor {
    cache: SummaryCache,
    summarizer: Summarizer,
    in_flight: Mutex<HashMap<Key, SharedSummary>>,
}

impl Compactor {
    pub fn new(
        config: &Config,
        cache_errors: prometheus::IntCounter,
        connections: &crate::http::upstream::Connections,
    ) -> Result<Compactor, ConfigError> {
        let shared = if config.cache.redis_url.is_empty() {
            None
        } else {
            Some(RedisStore::new(&config.cache, cache_errors)?)
        };
        Ok(Compactor {
            cache: SummaryCache::new(&config.cache, shared),
            summarizer: Summarizer::new(config.summarizer.clone(), connections)?,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    pub fn cached_entries(&self) -> u64 {
        self.cache.entries()
    }
}

/// Everything a summary job needs, owned, so it can outlive the request that started it.
#[derive(Clone)]
struct SpanSource {
    upstream: Arc<Upstream>,
    model: String,
    authorization: Option<HeaderValue>,
    window: u64,
    /// The messages after the head, with their token counts.
    evictable: Arc<[Evicted]>,
    head: usize,
}

/// One summary to make: messages `head..end`, folded onto `base` (a summary of
/// `head..base_end`) when there is one.
struct SpanJob {
    key: Key,
    base: Option<(usize, Arc<Summary>)>,
    source: SpanSource,
    end: usize,
}

impl SpanJob {
    /// The messages this job sends the summarizer: those after the base.
    fn new_messages(&self) -> &[Evicted] {
        let from = self.base.as_ref().map_or(self.source.head, |(e, _)| *e);
        &self.source.evictable[from - self.source.head..self.end - self.source.head]
    }
}

/// Where the summary a request can use right now comes from.
enum Found {
    Exact(Arc<Summary>),
    /// A summary of a shorter prefix, ending before message `end`.
    Shorter(usize, Arc<Summary>),
    /// Not cached, but being made (ahead of need, or for another request), ending before `end`.
    Pending(usize, SharedSummary),
    Nothing,
}

/// The request's prefix keys and what its summaries are made from.
struct Lookup {
    keys: Vec<Key>,
    source: SpanSource,
}

impl Lookup {
    /// The job that makes the summary of messages up to `end`, from `base` if given.
    fn span(&self, base: Option<(usize, Arc<Summary>)>, end: usize) -> SpanJob {
        SpanJob {
            key: self.keys[end - 1],
            base,
            source: self.source.clone(),
            end,
        }
    }
}

async fn lookup(compactor: &Arc<Compactor>, job: &CompactionJob<'_>) -> (Lookup, Found) {
    let summarizer_model = compactor.summarizer.model_for(job.model);
    let scope = scope(
        job.authorization.map(HeaderValue::as_bytes),
        &summarizer_model,
        PROMPT_VERSION,
    );
    let split = job.split;
    let keys = prefix_keys(&scope, &job.messages[..split.tail_start]);
    // A summary may end only where a unit starts: never just before a tool message.
    let candidates: Vec<(usize, Key)> = (split.head + 1..=split.tail_start)
        .filter(|&end| {
            job.messages
                .get(end)
                .and_then(|m| m.get("role"))
                .and_then(Value::as_str)
                .is_none_or(|r| r != "tool" && r != "function")
        })
        .map(|end| (end, keys[end - 1]))
        .collect();
    let candidate_keys: Vec<Key> = candidates.iter().map(|(_, k)| *k).collect();
    let found = match compactor.cache.longest(&candidate_keys).await {
        Some((i, summary)) if candidates[i].0 == split.tail_start => Found::Exact(summary),
        Some((i, summary)) => Found::Shorter(candidates[i].0, summary),
        None => compactor
            .in_flight
            .lock()
            .ok()
            .and_then(|in_flight| {
                candidates
                    .iter()
                    .rev()
                    .find_map(|(end, key)| Some(Found::Pending(*end, in_flight.get(key)?.clone())))
            })
            .unwrap_or(Found::Nothing),
    };
    let evictable: Arc<[Evicted]> = job.messages[split.head..]
        .iter()
        .zip(&job.count.per_message[split.head..])
        .map(|(message, &tokens)| Evicted {
            message: message.clone(),
            tokens,
        })
        .collect();
    let summarizer_info = compactor.catalog.resolve(&summarizer_model);
    let lookup = Lookup {
        keys,
        source: SpanSource {
            upstream: compactor.summarizer.upstream_for(job.upstream),
            model: summarizer_model,
            authorization: compactor.summarizer.authorization_for(job.authorization),
            window: summarizer_info.context_window,
            evictable,
            head: split.head,
        },
    };
    (lookup, found)
}

/// Framing of the summary message around its text.
const SUMMARY_MESSAGE_TOKENS: u64 = 20;

/// Estimated prompt, and message count, if `summary` (ending before message `end`) is
/// forwarded with everything after it (tool outputs shortened as planned).
fn estimate_with(job: &CompactionJob<'_>, summary: &Summary, end: usize) -> (u64, usize) {
    let head: u64 = job.count.per_message[..job.split.head]
        .iter()
        .map(|&t| u64::from(t))
        .sum();
    let rest: u64 = (end..job.messages.len())
        .map(|i| {
            let cut = job.split.shorten.iter().find(|s| s.index == i);
            u64::from(cut.map_or(job.count.per_message[i], |s| s.keep_tokens))
        })
        .sum();
    let tokens = head
        + u64::from(summary.tokens)
        + SUMMARY_MESSAGE_TOKENS
        + rest
        + u64::from(job.count.fixed);
    (tokens, job.split.head + 1 + job.messages.len() - end)
}

/// Whether forwarding with `summary` would be under every trigger of this request.
fn under_triggers(job: &CompactionJob<'_>, summary: &Summary, end: usize) -> bool {
    let (tokens, messages) = estimate_with(job, summary, end);
    let s = job.settings;
    tokens <= job.limits.trigger
        && (s.max_prompt_tokens == 0 || tokens <= s.max_prompt_tokens)
        && (s.max_messages == 0 || messages <= s.max_messages)
}

/// Whether a compacted request with `summary` has grown past what compaction aims for.
fn past_target(job: &CompactionJob<'_>, summary: &Summary, end: usize) -> bool {
    let (tokens, messages) = estimate_with(job, summary, end);
    tokens > job.limits.target
        || (job.limits.message_target > 0 && messages > job.limits.message_target)
}

/// Summarizes the planned span, or uses what the cache already has, and rewrites the
/// request. `Ok(None)`: forward the original (`on_failure = forward`).
pub async fn compact(
    compactor: &Arc<Compactor>,
    job: CompactionJob<'_>,
) -> Result<Option<Rewrite>, ProxyError> {
    let split = job.split;
    if split.summarized() == 0 {
        // Only tool outputs to shorten: nothing for the summarizer.
        return Ok(Some(trimmed(&job, Duration::ZERO)));
    }
    let (lookup, found) = lookup(compactor, &job).await;
    let started = Instant::now();
    // A summary already being made is joined rather than made again.
    let (found, joined) = match found {
        Found::Pending(end, pending) => match pending.await {
            Ok(summary) if end == split.tail_start => (Found::Exact(summary), true),
            Ok(summary) => (Found::Shorter(end, summary), true),
            Err(_) => (Found::Nothing, true),
        },
        found => (found, false),
    };
    let (summary, end, cache) = match found {
        Found::Exact(summary) if joined => (Ok(summary), split.tail_start, CacheOutcome::Miss),
        Found::Exact(summary) => (Ok(summary), split.tail_start, CacheOutcome::Hit),
        Found::Shorter(end, summary)
            if job.mode == Mode::Auto && under_triggers(&job, &summary, end) =>
        {
            // Good enough now; bring it up to date in the background once it grows past
            // the target, so no request waits for the summarizer.
            if past_target(&job, &summary, end) {
                drop(start_summary(
                    compactor,
                    lookup.span(Some((end, summary.clone())), split.tail_start),
                ));
            }
            (Ok(summary), end, CacheOutcome::Hit)
        }
        Found::Shorter(end, summary) => (
            start_summary(
                compactor,
                lookup.span(Some((end, summary)), split.tail_start),
            )
            .await,
            split.tail_start,
            CacheOutcome::Extended,
        ),
        Found::Nothing | Found::Pending(..) => (
            start_summary(compactor, lookup.span(None, split.tail_start)).await,
            split.tail_start,
            CacheOutcome::Miss,
        ),
    };
    let waited = started.elapsed();
    let role = job.settings.summary_role.as_str();
    match summary {
        // A summary that came out too large to fit: without it, the plan fits.
        Ok(summary) if estimate_with(&job, &summary, end).0 > job.limits.usable => {
            tracing::warn!(
                summary_tokens = summary.tokens,
                "summary too large for the window; trimming instead"
            );
            Ok(Some(trimmed(&job, waited)))
        }
        Ok(summary) => {
            let mut messages = Vec::with_capacity(split.head + 1 + job.messages.len() - end);
            messages.extend_from_slice(&job.messages[..split.head]);
            messages.push(json!({
                "role": role,
                "content": format!(
                    "[Context summary: {} earlier messages]\n\n{}",
                    end - split.head,
                    summary.text
                ),
            }));
            messages.extend(kept_tail(&job, end));
            Ok(Some(Rewrite {
                messages,
                action: Action::Summarized,
                cache,
                summarized: end - split.head,
                waited,
            }))
        }
        Err(error) => {
            tracing::warn!(%error, on_failure = ?job.settings.on_failure, "summarizer failed");
            match job.settings.on_failure {
                OnFailure::Forward => Ok(None),
                OnFailure::Error => Err(ProxyError::SummarizerFailed(error.to_string())),
                OnFailure::Trim => Ok(Some(trimmed(&job, waited))),
            }
        }
    }
}

/// The head and the planned tail, without a summary.
fn trimmed(job: &CompactionJob<'_>, waited: Duration) -> Rewrite {
    let mut messages = job.messages[..job.split.head].to_vec();
    messages.extend(kept_tail(job, job.split.tail_start));
    Rewrite {
        messages,
        action: Action::Trimmed,
        cache: CacheOutcome::None,
        summarized: 0,
        waited,
    }
}

/// The messages from `start` on, verbatim except tool outputs the plan shortens.
fn kept_tail(job: &CompactionJob<'_>, start: usize) -> Vec<Value> {
    job.messages[start..]
        .iter()
        .enumerate()
        .map(|(offset, message)| {
            let index = start + offset;
            match job.split.shorten.iter().find(|s| s.index == index) {
                Some(cut) => {
                    let mut message = message.clone();
                    let text = crate::compaction::summarizer::content_text(&message);
                    message["content"] =
                        Value::String(shorten_middle(&text, cut.tokens, cut.keep_tokens));
                    message
                }
                None => message.clone(),
            }
        })
        .collect()
}

/// From the precompute band: make the summary the plan would need, in the background,
/// unless the cache already holds one that would do.
pub fn precompute(compactor: &Arc<Compactor>, job: CompactionJob<'_>) {
    let compactor = compactor.clone();
    // The lookup needs owned inputs to run after the request moves on.
    let messages: Vec<Value> = job.messages.to_vec();
    let count = job.count.clone();
    let split = job.split.clone();
    let model = job.model.to_string();
    let info = job.info.clone();
    let upstream = job.upstream.clone();
    let authorization = job.authorization.cloned();
    let settings = job.settings.clone();
    let limits = job.limits;
    tokio::spawn(async move {
        let job = CompactionJob {
            messages: &messages,
            count: &count,
            split: &split,
            model: &model,
            info: &info,
            upstream: &upstream,
            authorization: authorization.as_ref(),
            settings: &settings,
            mode: Mode::Auto,
            limits,
        };
        let (lookup, found) = lookup(&compactor, &job).await;
        let base = match found {
            Found::Exact(_) | Found::Pending(..) => return,
            Found::Shorter(end, summary) if under_triggers(&job, &summary, end) => return,
            Found::Shorter(end, summary) => Some((end, summary)),
            Found::Nothing => None,
        };
        let _ = start_summary(&compactor, lookup.span(base, split.tail_start)).await;
    });
}

/// The one summarizer job for `job.key`, started now unless already running. The job runs
/// on its own task, so a client that goes away strands nobody.
fn start_summary(compactor: &Arc<Compactor>, job: SpanJob) -> SharedSummary {
    let Ok(mut in_flight) = compactor.in_flight.lock() else {
        let error = SummarizeError::Upstream("summary bookkeeping poisoned".into());
        return futures_util::future::ready(Err(error)).boxed().shared();
    };
    if let Some(running) = in_flight.get(&job.key) {
        return running.clone();
    }
    let key = job.key;
    let task = tokio::spawn(make_summary(compactor.clone(), job));
    let shared = async move {
        task.await.unwrap_or_else(|e| {
            Err(SummarizeError::Upstream(format!(
                "summary task failed: {e}"
            )))
        })
    }
    .boxed()
    .shared();
    in_flight.insert(key, shared.clone());
    shared
}

async fn make_summary(
    compactor: Arc<Compactor>,
    job: SpanJob,
) -> Result<Arc<Summary>, SummarizeError> {
    // However the job ends, even by panic, it stops being the one others join.
    let _finished = InFlightEntry {
        compactor: compactor.clone(),
        key: job.key,
    };
    make_shared_once(&compactor, &job).await
}

struct InFlightEntry {
    compactor: Arc<Compactor>,
    key: Key,
}

impl Drop for InFlightEntry {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.compactor.in_flight.lock() {
            in_flight.remove(&self.key);
        }
    }
}

/// With Redis, one replica makes a given summary while the others wait for it; if the maker
/// dies its lock expires and a waiter makes it instead.
async fn make_shared_once(
    compactor: &Arc<Compactor>,
    job: &SpanJob,
) -> Result<Arc<Summary>, SummarizeError> {
    let Some(shared) = compactor.cache.shared() else {
        return summarize_and_store(compactor, job).await;
    };
    // Held for as long as the job may take: one summarizer timeout per chunk, with room.
    let span_tokens: u64 = job.new_messages().iter().map(|m| u64::from(m.tokens)).sum();
    let chunks = span_tokens / (job.source.window / 2).max(1) + 1;
    let hold = Duration::from_secs(compactor.summarizer.config().timeout_secs * chunks + 5);
    loop {
        match shared.try_lock(&job.key, hold).await {
            LockOutcome::HeldElsewhere => {
                tokio::time::sleep(REMOTE_POLL).await;
                if let Some(summary) = compactor.cache.get(&job.key).await {
                    return Ok(summary);
                }
            }
            LockOutcome::Acquired(token) => {
                let result = summarize_and_store(compactor, job).await;
                shared.unlock(&job.key, &token).await;
                return result;
            }
            LockOutcome::Unavailable => return summarize_and_store(compactor, job).await,
        }
    }
}

async fn summarize_and_store(
    compactor: &Arc<Compactor>,
    job: &SpanJob,
) -> Result<Arc<Summary>, SummarizeError> {
    // Another replica may have finished it while this one waited for the lock.
    if let Some(summary) = compactor.cache.get(&job.key).await {
        return Ok(summary);
    }
    let source = &job.source;
    let previous = job.base.as_ref().map(|(_, summary)| summary.text.clone());
    let messages = job.new_messages().to_vec();
    let started = Instant::now();
    let text = compactor
        .summarizer
        .summarize(SummaryRequest {
            upstream: source.upstream.clone(),
            model: source.model.clone(),
            authorization: source.authorization.clone(),
            previous,
            messages,
            window: source.window,
        })
        .await;
    compactor
        .summarize_seconds
        .observe(started.elapsed().as_secs_f64());
    let text = text?;
    let encoding = compactor.catalog.resolve(&source.model).encoding;
    let summary = Arc::new(Summary {
        tokens: count_text(encoding, &text),
        text,
        messages: job.end - source.head,
        model: source.model.clone(),
        prompt_version: PROMPT_VERSION,
        created_at: unix_now(),
    });
    tracing::info!(
        messages = summary.messages,
        extended_from = job.base.as_ref().map(|(e, _)| e - source.head),
        summary_tokens = summary.tokens,
        summarizer_ms = started.elapsed().as_secs_f64() * 1e3,
        "summary made"
    );
    compactor.cache.put(job.key, summary.clone()).await;
    Ok(summary)
}
