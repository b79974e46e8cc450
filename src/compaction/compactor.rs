//! Carries out a compaction plan: finds or makes the summary of the evicted span (longest
//! cached prefix, extension, one summarizer call per span however many ask), rewrites the
//! messages, and falls back per `on_failure` when the summarizer fails.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use hyper::header::HeaderMap;
use serde_json::Value;

use crate::compaction::cache::{prefix_keys, scope, ScopeHeaders, SummaryCache};
use crate::compaction::plan::{Limits, Mode, Split, Tier, SUMMARY_FRAMING_TOKENS};
use crate::compaction::recall;
use crate::compaction::redis::{unix_now, LockOutcome, RedisStore};
use crate::compaction::summarizer::{Evicted, Summarizer, SummaryRequest};
use crate::compaction::summary::{Key, Summary};
use crate::compaction::summary_api::SummaryEndpoint;
use crate::config::{Config, ConfigError, ContextConfig, OnFailure};
use crate::error::{ProxyError, SummarizeError};
use crate::observe::metrics::SummarizerHealth;
use crate::tokens::catalog::{ModelCatalog, ModelInfo};
use crate::tokens::counter::PromptCount;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;
use crate::transport::upstream::{Connections, Upstream};

/// Poll interval while another replica makes a summary this one needs.
const REMOTE_POLL: Duration = Duration::from_millis(100);

type SharedSummary = Shared<BoxFuture<'static, Result<Arc<Summary>, SummarizeError>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Summarized,
    Trimmed,
    /// Sent unchanged.
    Forwarded,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Summarized => "summarized",
            Action::Trimmed => "trimmed",
            Action::Forwarded => "forwarded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// A cached summary that keeps the prompt under every trigger.
    Hit,
    /// Made while the request waited.
    Miss,
    /// A cached summary extended while the request waited.
    Extended,
    /// Over a trigger: a summary on hand went now, the one the plan wants is being made.
    Stale,
    /// Over a trigger with no summary on hand: sent as it came while one is made.
    Deferred,
    None,
}

impl CacheOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Extended => "extended",
            CacheOutcome::Stale => "stale",
            CacheOutcome::Deferred => "deferred",
            CacheOutcome::None => "none",
        }
    }
}

/// Every action and cache outcome a compaction ends with but a request sent as it came with
/// no summary in the making (`Forwarded`, `None`): the series of `condenser_compactions_total`,
/// shown from start-up. A new outcome belongs here.
pub const COUNTED_OUTCOMES: [(Action, CacheOutcome); 6] = [
    (Action::Summarized, CacheOutcome::Hit),
    (Action::Summarized, CacheOutcome::Miss),
    (Action::Summarized, CacheOutcome::Extended),
    (Action::Summarized, CacheOutcome::Stale),
    (Action::Trimmed, CacheOutcome::None),
    (Action::Forwarded, CacheOutcome::Deferred),
];

/// What the request becomes, for its dialect to write out: the head, then the `pinned` task
/// prompt when there is one, then `summary` when there is one (of the items
/// `head..kept_from`), then the items from `kept_from` on, tool outputs shortened as planned.
#[derive(Debug)]
pub struct Rewrite {
    pub summary: Option<Arc<Summary>>,
    pub kept_from: usize,
    /// The task's items, kept verbatim though before `kept_from`.
    pub pinned: Option<Range<usize>>,
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    /// Time spent waiting on the summarizer (not condenser's own overhead).
    pub waited: Duration,
    /// Where the summarized items and the cleared tool outputs are archived, when the
    /// request offers recall.
    pub archive: Option<ArchiveScope>,
}

/// Where a compacted conversation's items are archived: the caller's scope, and the
/// conversation's id in it (`recall::reference`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveScope {
    pub caller: Key,
    pub conversation: String,
}

impl Rewrite {
    /// The head, the pinned task and the planned tail, without a summary.
    pub fn trimmed(split: &Split, waited: Duration) -> Rewrite {
        Rewrite {
            summary: None,
            kept_from: split.tail_start,
            pinned: split.pinned_before(split.tail_start),
            action: Action::Trimmed,
            cache: CacheOutcome::None,
            summarized: 0,
            waited,
            archive: None,
        }
    }

    /// The summary's text as every dialect forwards it, after the head's `head` items:
    /// `[Context summary: N earlier <unit>]`, a blank line, then the summary; with recall,
    /// a line naming the references of the items it replaces.
    pub fn summary_text(&self, head: usize, unit: &str) -> Option<String> {
        let summary = self.summary.as_ref()?;
        let mut text = format!(
            "[Context summary: {} earlier {unit}]\n\n{}",
            self.kept_from - head,
            summary.text
        );
        if let Some(archive) = &self.archive {
            text.push_str(&recall::archived_note(
                &archive.conversation,
                head..self.kept_from,
                unit,
            ));
        }
        Some(text)
    }

    /// The reference a cleared output's stub names, when the request offers recall.
    pub fn cleared_reference(&self, index: usize) -> Option<String> {
        let archive = self.archive.as_ref()?;
        Some(recall::reference(&archive.conversation, index))
    }

    /// The conversation's items this rewrite archived, which recall searches: those its
    /// summary replaces, and the tool outputs it cut.
    pub fn archived_items(&self, split: &Split) -> Vec<usize> {
        let summarized = if self.summary.is_some() {
            split.head..self.kept_from
        } else {
            0..0
        };
        summarized
            .chain(split.shorten.iter().map(|cut| cut.index))
            .collect()
    }
}

pub struct CompactionJob<'a> {
    /// The conversation; at least its messages up to the plan's furthest summary end
    /// (`split.ahead`), all that keys and summaries are made of. Its length is the count's.
    pub messages: &'a [Value],
    pub count: &'a PromptCount,
    pub split: &'a Split,
    pub model: &'a str,
    pub info: &'a ModelInfo,
    pub upstream: &'a Arc<Upstream>,
    /// The request's headers: who the caller is, and the credentials its summaries are paid with.
    pub headers: &'a HeaderMap,
    /// The request's own API, which its summaries are asked in unless `summarizer.api` says.
    pub api: SummaryEndpoint,
    pub settings: &'a ContextConfig,
    pub mode: Mode,
    pub limits: Limits,
    /// The request offers recall: its summary names the archived items.
    pub recall: bool,
}

pub struct Compactor {
    scope_headers: ScopeHeaders,
    cache: SummaryCache,
    summarizer: Summarizer,
    in_flight: Mutex<HashMap<Key, SharedSummary>>,
    /// The summarizer model's window and encoding.
    catalog: Arc<ModelCatalog>,
    summarize_seconds: prometheus::Histogram,
}

impl Compactor {
    pub fn new(
        config: &Config,
        catalog: Arc<ModelCatalog>,
        cache_errors: prometheus::IntCounter,
        summarize_seconds: prometheus::Histogram,
        summarizer_health: SummarizerHealth,
        connections: &Connections,
        configured_summary_api: Option<SummaryEndpoint>,
    ) -> Result<Compactor, ConfigError> {
        let shared = if config.cache.redis_url.is_empty() {
            None
        } else {
            Some(RedisStore::new(&config.cache, cache_errors)?)
        };
        Ok(Compactor {
            scope_headers: ScopeHeaders::new(&config.cache)?,
            cache: SummaryCache::new(&config.cache, shared),
            summarizer: Summarizer::new(
                config.summarizer.clone(),
                connections,
                summarizer_health,
                catalog.clone(),
                configured_summary_api,
            )?,
            in_flight: Mutex::new(HashMap::new()),
            catalog,
            summarize_seconds,
        })
    }

    /// The summary cache, which holds the archive too.
    pub fn cache(&self) -> &SummaryCache {
        &self.cache
    }

    pub fn cached_entries(&self) -> u64 {
        self.cache.entries()
    }
}

/// Everything a summary job needs but its messages, owned, so it can outlive the request
/// that started it.
#[derive(Clone)]
struct SpanSource {
    upstream: Arc<Upstream>,
    api: SummaryEndpoint,
    model: String,
    /// The hash of the caller's identity.
    caller: Key,
    credentials: HeaderMap,
    window: u64,
    /// The request model's, in which the summary is counted.
    encoding: Encoding,
    head: usize,
    /// The conversation's id in the caller's archive (`recall::conversation_id`).
    conversation: String,
}

/// One summary to make: messages `head..end`, folded onto `base` (a summary of
/// `head..base_end`) when there is one.
struct SpanJob {
    key: Key,
    base: Option<(usize, Arc<Summary>)>,
    source: SpanSource,
    end: usize,
    /// The messages this job sends the summarizer, those after the base: copied from the
    /// request only when a job starts, never for a request that finds its summary on hand.
    new_messages: Vec<Evicted>,
}

/// What this request's conversation already has: summaries cached at its candidate ends,
/// and a summary being made for one of them.
struct OnHand {
    /// By end, shortest first.
    cached: Vec<(usize, Arc<Summary>)>,
    /// The latest-ending summary being made (ahead of need, or for another request).
    pending: Option<(usize, SharedSummary)>,
}

impl OnHand {
    fn exact(&self, end: usize) -> Option<Arc<Summary>> {
        self.cached
            .iter()
            .find(|(e, _)| *e == end)
            .map(|(_, s)| s.clone())
    }

    /// The latest-ending cached summary: the most compact on hand.
    fn longest(&self) -> Option<(usize, Arc<Summary>)> {
        self.cached.last().cloned()
    }

    /// The latest-ending cached summary before `end`, which a summary up to `end` extends.
    fn longest_before(&self, end: usize) -> Option<(usize, Arc<Summary>)> {
        self.cached.iter().rev().find(|(e, _)| *e < end).cloned()
    }

    /// Whether anything on hand or being made ends after `end`: the next step exists.
    fn beyond(&self, end: usize) -> bool {
        self.cached.last().is_some_and(|(e, _)| *e > end)
            || self.pending.as_ref().is_some_and(|(e, _)| *e > end)
    }
}

/// The request's prefix keys and what its summaries are made from.
struct Lookup<'r> {
    keys: Vec<Key>,
    source: SpanSource,
    messages: &'r [Value],
    counts: &'r [u32],
}

impl Lookup<'_> {
    /// Where this conversation's items are archived, for a request that offers recall.
    fn archive(&self, job: &CompactionJob<'_>) -> Option<ArchiveScope> {
        job.recall.then(|| ArchiveScope {
            caller: self.source.caller,
            conversation: self.source.conversation.clone(),
        })
    }

    /// The job that makes the summary of messages up to `end`, from `base` if given.
    fn span(&self, base: Option<(usize, Arc<Summary>)>, end: usize) -> SpanJob {
        let from = base.as_ref().map_or(self.source.head, |(e, _)| *e);
        let new_messages = self.messages[from..end]
            .iter()
            .zip(&self.counts[from..end])
            .map(|(message, &tokens)| Evicted {
                message: message.clone(),
                tokens,
            })
            .collect();
        SpanJob {
            key: self.keys[end - 1],
            base,
            source: self.source.clone(),
            end,
            new_messages,
        }
    }
}

/// Who asks, for which summarizer, and the keys of the conversation's prefixes up to the
/// plan's furthest summary end.
struct Prefix {
    caller: Key,
    summarizer_model: String,
    keys: Vec<Key>,
}

fn prefix(compactor: &Compactor, job: &CompactionJob<'_>) -> Prefix {
    let summarizer_model = compactor.summarizer.model_for(job.model);
    // Every key below descends from the caller's: memory, Redis, single-flight jobs and
    // cross-replica locks are all per caller.
    let caller = compactor.scope_headers.caller(job.headers);
    let scope = scope(
        &caller,
        &summarizer_model,
        &compactor.summarizer.settings_key(),
    );
    let keys = prefix_keys(&scope, &job.messages[..job.split.ahead]);
    Prefix {
        caller,
        summarizer_model,
        keys,
    }
}

/// Where a conversation's items are archived: its caller, and its id.
fn archive_scope(compactor: &Compactor, job: &CompactionJob<'_>) -> ArchiveScope {
    ArchiveScope {
        caller: compactor.scope_headers.caller(job.headers),
        conversation: recall::conversation_id(job.messages, job.split.head),
    }
}

/// The tool outputs the rewrite cuts, archived whole under the references their stubs
/// name; already archived ones cost nothing more (`SummaryCache::archive_put`).
async fn archive_cleared(compactor: &Compactor, job: &CompactionJob<'_>, archive: &ArchiveScope) {
    let cleared: Vec<(String, String)> = job
        .split
        .shorten
        .iter()
        .filter_map(|cut| {
            let item = job.messages.get(cut.index)?;
            Some((
                recall::reference(&archive.conversation, cut.index),
                item.to_string(),
            ))
        })
        .collect();
    compactor.cache.archive_put(&archive.caller, &cleared).await;
}

/// The latest-ending summary being made for one of the split's candidate ends.
fn pending(compactor: &Compactor, split: &Split, keys: &[Key]) -> Option<(usize, SharedSummary)> {
    let in_flight = compactor.in_flight.lock().ok()?;
    split
        .summary_ends
        .iter()
        .rev()
        .find_map(|&end| Some((end, in_flight.get(&keys[end - 1])?.clone())))
}

async fn lookup<'r>(
    compactor: &Arc<Compactor>,
    job: &CompactionJob<'r>,
    prefix: Prefix,
) -> (Lookup<'r>, OnHand) {
    let Prefix {
        caller,
        summarizer_model,
        keys,
    } = prefix;
    let split = job.split;
    let candidates: Vec<(usize, Key)> = split
        .summary_ends
        .iter()
        .map(|&end| (end, keys[end - 1]))
        .collect();
    let candidate_keys: Vec<Key> = candidates.iter().map(|(_, k)| *k).collect();
    let cached = compactor
        .cache
        .cached(&candidate_keys)
        .await
        .into_iter()
        .map(|(i, summary)| (candidates[i].0, summary))
        .collect();
    let pending = pending(compactor, split, &keys);
    let on_hand = OnHand { cached, pending };
    let summarizer_info = compactor.catalog.resolve(&summarizer_model);
    let api = compactor.summarizer.api_for(job.api);
    let conversation = recall::conversation_id(job.messages, split.head);
    let lookup = Lookup {
        keys,
        source: SpanSource {
            upstream: compactor.summarizer.upstream_for(job.upstream),
            model: summarizer_model,
            caller,
            api,
            credentials: compactor
                .summarizer
                .credentials_for(job.headers, api.key_style),
            window: summarizer_info.context_window,
            encoding: job.info.encoding,
            head: split.head,
            conversation,
        },
        messages: job.messages,
        counts: &job.count.per_message,
    };
    (lookup, on_hand)
}

/// Estimated prompt, and message count, if `summary` (ending before message `end`) is
/// forwarded with everything after it (the task pinned, tool outputs shortened as planned).
fn estimate_with(
    (job, lookup): (&CompactionJob<'_>, &Lookup),
    summary: &Summary,
    end: usize,
) -> (u64, usize) {
    let pinned = job.split.pinned_before(end).unwrap_or_default();
    let head: u64 = job.count.per_message[..job.split.head]
        .iter()
        .chain(&job.count.per_message[pinned.clone()])
        .map(|&t| u64::from(t))
        .sum();
    let items = job.count.per_message.len();
    let rest: u64 = (end..items)
        .map(|i| {
            let cut = job.split.shorten.iter().find(|s| s.index == i);
            u64::from(cut.map_or(job.count.per_message[i], |s| s.keep_tokens))
        })
        .sum();
    let tokens = head
        + u64::from(summary.tokens)
        + u64::from(SUMMARY_FRAMING_TOKENS)
        + recall_tokens(job, lookup, end)
        + rest
        + u64::from(job.count.fixed);
    (tokens, job.split.head + pinned.len() + 1 + items - end)
}

/// Where forwarding with `summary` (ending before message `end`) would stand.
/// What recall adds to a request forwarded with a summary ending before `end`: the tool,
/// and the line naming the summarized items' references, counted as written.
fn recall_tokens(job: &CompactionJob<'_>, lookup: &Lookup, end: usize) -> u64 {
    if !job.recall {
        return 0;
    }
    let note = recall::archived_note(&lookup.source.conversation, job.split.head..end, "messages");
    let encoding = job.info.encoding;
    u64::from(recall::tool_tokens(encoding) + count_text(encoding, &note))
}

fn tier_with(on: (&CompactionJob<'_>, &Lookup), summary: &Summary, end: usize) -> Tier {
    let job = on.0;
    let (tokens, messages) = estimate_with(on, summary, end);
    job.limits.tier(job.settings, tokens, messages)
}

/// Carries the plan out and says how the request goes: rewritten with a summary, trimmed,
/// or as sent. In `auto` mode a request waits for the summarizer only when nothing on hand
/// fits the hard limit; under `force` it always goes with the summary the plan wants.
pub async fn compact(
    compactor: &Arc<Compactor>,
    job: CompactionJob<'_>,
) -> Result<Rewrite, ProxyError> {
    let mut rewrite = carried_out(compactor, &job).await?;
    let cuts = rewrite.action != Action::Forwarded && !job.split.shorten.is_empty();
    if job.recall && cuts {
        let archive = rewrite
            .archive
            .get_or_insert_with(|| archive_scope(compactor, &job));
        archive_cleared(compactor, &job, archive).await;
    }
    Ok(rewrite)
}

/// The plan carried out, with what is on hand or made now.
async fn carried_out(
    compactor: &Arc<Compactor>,
    job: &CompactionJob<'_>,
) -> Result<Rewrite, ProxyError> {
    let split = job.split;
    if split.summarized() == 0 {
        // Only tool outputs to shorten: nothing for the summarizer.
        return Ok(trimmed(job, Duration::ZERO));
    }
    let (lookup, on_hand) = lookup(compactor, job, prefix(compactor, job)).await;
    if job.mode == Mode::Auto {
        if let Some(rewrite) = without_waiting(compactor, job, &lookup, &on_hand) {
            return Ok(rewrite);
        }
    }
    let wanted = split.tail_start;
    let started = Instant::now();
    let (summary, cache) = match (on_hand.exact(wanted), on_hand.pending.clone()) {
        (Some(summary), _) => (Ok(summary), CacheOutcome::Hit),
        (None, Some((end, pending))) if end == wanted => (pending.await, CacheOutcome::Miss),
        (None, _) => {
            let base = on_hand.longest_before(wanted);
            let cache = if base.is_some() {
                CacheOutcome::Extended
            } else {
                CacheOutcome::Miss
            };
            (
                start_summary(compactor, lookup.span(base, wanted)).await,
                cache,
            )
        }
    };
    let waited = started.elapsed();
    match summary {
        // A summary that came out too large to fit: without it, the plan fits.
        Ok(summary) if tier_with((job, &lookup), &summary, wanted) == Tier::Hard => {
            tracing::warn!(
                summary_tokens = summary.tokens,
                "summary too large for the window; trimming instead"
            );
            Ok(trimmed(job, waited))
        }
        Ok(summary) => Ok(summarized((job, &lookup), summary, wanted, cache, waited)),
        Err(error) => {
            // An open breaker logged its opening once; each request it turns away is no news.
            if matches!(error, SummarizeError::CircuitOpen(_)) {
                tracing::debug!(%error, on_failure = ?job.settings.on_failure, "summarizer skipped");
            } else {
                tracing::warn!(%error, on_failure = ?job.settings.on_failure, "summarizer failed");
            }
            match job.settings.on_failure {
                OnFailure::Forward => Ok(as_sent(CacheOutcome::None, waited)),
                OnFailure::Error => Err(ProxyError::SummarizerFailed(error)),
                OnFailure::Trim => Ok(trimmed(job, waited)),
            }
        }
    }
}

/// The request as it may go now, with what is on hand, if anything fits the hard limit. The
/// summary in use stays while it keeps the prompt under every trigger, so that what is
/// forwarded only grows at its end between compactions (and a provider's prompt cache stays
/// warm): the shortest summary on hand that does so is that summary. Past the precompute
/// line the next step is made ahead; over a trigger, the plan's summary is made while the
/// request goes with the most compact one on hand, or as sent.
fn without_waiting(
    compactor: &Arc<Compactor>,
    job: &CompactionJob<'_>,
    lookup: &Lookup,
    on_hand: &OnHand,
) -> Option<Rewrite> {
    // The summary to make for `end`, extending the longest on hand that ends before it;
    // unless one is being made already, whose end the conversation has not yet outgrown:
    // a step started on every turn would never be used.
    let make = |end: usize| {
        if on_hand.exact(end).is_none() && on_hand.pending.is_none() {
            drop(start_summary(
                compactor,
                lookup.span(on_hand.longest_before(end), end),
            ));
        }
    };
    let steady = on_hand
        .cached
        .iter()
        .map(|(end, summary)| (*end, summary, tier_with((job, lookup), summary, *end)))
        .find(|(_, _, tier)| *tier <= Tier::Precompute);
    if let Some((end, summary, tier)) = steady {
        if tier == Tier::Precompute && !on_hand.beyond(end) {
            make(job.split.ahead);
        }
        return Some(summarized(
            (job, lookup),
            summary.clone(),
            end,
            CacheOutcome::Hit,
            Duration::ZERO,
        ));
    }
    let fits_now = on_hand
        .longest()
        .filter(|(end, summary)| tier_with((job, lookup), summary, *end) < Tier::Hard);
    let as_sent_fits = job
        .limits
        .tier(job.settings, job.count.total, job.count.per_message.len())
        < Tier::Hard;
    if fits_now.is_none() && !as_sent_fits {
        return None;
    }
    make(job.split.tail_start);
    Some(match fits_now {
        Some((end, summary)) => summarized(
            (job, lookup),
            summary,
            end,
            CacheOutcome::Stale,
            Duration::ZERO,
        ),
        None => as_sent(CacheOutcome::Deferred, Duration::ZERO),
    })
}

fn summarized(
    (job, lookup): (&CompactionJob<'_>, &Lookup),
    summary: Arc<Summary>,
    end: usize,
    cache: CacheOutcome,
    waited: Duration,
) -> Rewrite {
    Rewrite {
        summary: Some(summary),
        kept_from: end,
        pinned: job.split.pinned_before(end),
        action: Action::Summarized,
        cache,
        summarized: end - job.split.head,
        waited,
        archive: lookup.archive(job),
    }
}

/// The request unchanged: while its summary is made, or when the summarizer failed and
/// `on_failure = forward`.
fn as_sent(cache: CacheOutcome, waited: Duration) -> Rewrite {
    Rewrite {
        summary: None,
        kept_from: 0,
        pinned: None,
        action: Action::Forwarded,
        cache,
        summarized: 0,
        waited,
        archive: None,
    }
}

fn trimmed(job: &CompactionJob<'_>, waited: Duration) -> Rewrite {
    Rewrite::trimmed(job.split, waited)
}

/// From the precompute band: make the summary the plan would need, in the background,
/// unless what is on hand would do.
pub fn precompute(compactor: &Arc<Compactor>, job: CompactionJob<'_>) {
    let prefix = prefix(compactor, &job);
    // The step is being made already (the common case in the precompute band): nothing to
    // copy, nothing to start.
    if pending(compactor, job.split, &prefix.keys).is_some() {
        return;
    }
    let compactor = compactor.clone();
    // The lookup needs owned inputs to run after the request moves on: of the messages, only
    // those a summary may hold.
    let messages: Vec<Value> = job.messages[..job.split.ahead].to_vec();
    let count = job.count.clone();
    let split = job.split.clone();
    let model = job.model.to_string();
    let info = job.info.clone();
    let upstream = job.upstream.clone();
    let headers = job.headers.clone();
    let api = job.api;
    let settings = job.settings.clone();
    let limits = job.limits;
    let recall = job.recall;
    tokio::spawn(async move {
        let job = CompactionJob {
            messages: &messages,
            count: &count,
            split: &split,
            model: &model,
            info: &info,
            upstream: &upstream,
            headers: &headers,
            api,
            settings: &settings,
            mode: Mode::Auto,
            limits,
            recall,
        };
        let (lookup, on_hand) = lookup(&compactor, &job, prefix).await;
        let ready = on_hand.pending.is_some()
            || on_hand.cached.iter().any(|(end, summary)| {
                tier_with((&job, &lookup), summary, *end) <= Tier::Precompute
            });
        // Made for when the trigger fires: by then it brings the prompt to the target.
        if !ready {
            let base = on_hand.longest_before(split.ahead);
            let _ = start_summary(&compactor, lookup.span(base, split.ahead)).await;
        }
    });
}

/// The one summarizer job for `job.key`, started now unless already running. The job runs
/// on its own task, so a client that goes away strands nobody.
fn start_summary(compactor: &Arc<Compactor>, job: SpanJob) -> SharedSummary {
    let Ok(mut in_flight) = compactor.in_flight.lock() else {
        let error = SummarizeError::Internal("summary bookkeeping poisoned".into());
        return futures_util::future::ready(Err(error)).boxed().shared();
    };
    if let Some(running) = in_flight.get(&job.key) {
        return running.clone();
    }
    let key = job.key;
    let task = tokio::spawn(make_summary(compactor.clone(), job));
    let shared = async move {
        task.await.unwrap_or_else(|e| {
            Err(SummarizeError::Internal(format!(
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
    let span_tokens: u64 = job.new_messages.iter().map(|m| u64::from(m.tokens)).sum();
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
    let messages = job.new_messages.clone();
    let started = Instant::now();
    let text = compactor
        .summarizer
        .summarize(SummaryRequest {
            upstream: source.upstream.clone(),
            api: source.api,
            model: source.model.clone(),
            caller: source.caller,
            credentials: source.credentials.clone(),
            previous,
            messages,
            window: source.window,
            encoding: source.encoding,
        })
        .await;
    compactor
        .summarize_seconds
        .observe(started.elapsed().as_secs_f64());
    let text = text?;
    let summary = Arc::new(Summary {
        tokens: count_text(source.encoding, &text),
        text,
        messages: job.end - source.head,
        model: source.model.clone(),
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
    // Archived once its summary exists, whether or not this request offers recall: a later
    // one may, and the summary it uses replaces these items.
    let from = job.end - job.new_messages.len();
    let archived: Vec<(String, String)> = job
        .new_messages
        .iter()
        .enumerate()
        .map(|(i, evicted)| {
            let reference = recall::reference(&source.conversation, from + i);
            (reference, evicted.message.to_string())
        })
        .collect();
    compactor.cache.archive_put(&source.caller, &archived).await;
    Ok(summary)
}
