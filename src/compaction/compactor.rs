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
use crate::compaction::plan::{
    advance_horizon, cuts_before, saving, summary_room, Horizon, Limits, Mode, Shorten, Split,
    Tier, SUMMARY_FRAMING_TOKENS,
};
use crate::compaction::recall;
use crate::compaction::redis::{unix_now, LockOutcome, RedisStore};
use crate::compaction::shorten::cut_item_texts;
use crate::compaction::summarizer::{Evicted, Summarizer, SummaryRequest};
use crate::compaction::summary::{Key, Summary};
use crate::compaction::summary_api::SummaryEndpoint;
use crate::config::{Config, ConfigError, ContextConfig, OnFailure};
use crate::conversation::{Item, ToolCut};
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
pub const COUNTED_OUTCOMES: [(Action, CacheOutcome); 8] = [
    (Action::Summarized, CacheOutcome::Hit),
    (Action::Summarized, CacheOutcome::Miss),
    (Action::Summarized, CacheOutcome::Extended),
    (Action::Summarized, CacheOutcome::Stale),
    (Action::Trimmed, CacheOutcome::None),
    (Action::Trimmed, CacheOutcome::Hit),
    (Action::Trimmed, CacheOutcome::Deferred),
    (Action::Forwarded, CacheOutcome::Deferred),
];

/// What the request becomes, for its dialect to write out: the head, then the `pinned` task
/// prompt when there is one, then `summary` when there is one (of the items
/// `head..kept_from`), then the items from `kept_from` on, the tool outputs in `cuts` cut.
#[derive(Debug)]
pub struct Rewrite {
    pub summary: Option<Arc<Summary>>,
    pub kept_from: usize,
    /// The task's items, kept verbatim though before `kept_from`.
    pub pinned: Option<Range<usize>>,
    /// The kept tool outputs cut: those before the session's cut horizon (`plan::cuts_before`).
    pub cuts: Vec<Shorten>,
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
            cuts: split.shorten.clone(),
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

    /// Cuts the outputs of `kept` (the items from `kept_from` on) as planned, each item's
    /// output texts found by `texts`, in `encoding`.
    pub fn cut_kept_outputs(
        &self,
        kept: &mut [Value],
        kept_from: usize,
        encoding: Encoding,
        texts: fn(&mut Value) -> Vec<&mut String>,
    ) {
        for cut in &self.cuts {
            if let Some(item) = cut
                .index
                .checked_sub(kept_from)
                .and_then(|at| kept.get_mut(at))
            {
                cut_item_texts(
                    encoding,
                    texts(item),
                    cut,
                    self.cleared_reference(cut.index).as_deref(),
                );
            }
        }
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
            .chain(self.cuts.iter().map(|cut| cut.index))
            .collect()
    }
}

pub struct CompactionJob<'a> {
    /// The conversation; at least its messages up to the plan's furthest summary end
    /// (`split.ahead`), all that keys and summaries are made of. Its length is the count's.
    pub messages: &'a [Value],
    pub count: &'a PromptCount,
    /// What the planner read of each item (its kind and tokens), which cuts are chosen by.
    pub items: &'a [Item],
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
    /// Observe mode's compactor (`standing_in`): summaries are the summarizer's stand-in,
    /// nothing is archived.
    stand_in: bool,
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
            stand_in: false,
        })
    }

    /// This compactor as observe mode's: it plans and carries out every step as `auto` does,
    /// and its summaries are the summarizer's stand-in (`Summarizer::stand_in`), made at
    /// once and calling nothing. Built on a config without Redis, its cache is its own, so
    /// would-be summaries never mix with real ones.
    pub fn standing_in(mut self) -> Compactor {
        self.stand_in = true;
        self
    }

    /// The hash of the caller's identity, as summaries and horizons are scoped by.
    pub fn caller(&self, headers: &HeaderMap) -> Key {
        self.scope_headers.caller(headers)
    }

    /// Once every summary being made has landed: what a replay waits for between
    /// requests, as the time between an agent's turns would let it.
    pub async fn settled(&self) {
        loop {
            let pending: Vec<SharedSummary> = match self.in_flight.lock() {
                Ok(in_flight) => in_flight.values().cloned().collect(),
                Err(_) => return,
            };
            if pending.is_empty() {
                return;
            }
            for summary in pending {
                let _ = summary.await;
            }
            // The job's entry goes when its task ends, just after its result is shared.
            tokio::task::yield_now().await;
        }
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
    /// The most the summary's text may take (`plan::summary_room`).
    summary_tokens: u32,
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
    /// The cut horizons earlier rewrites of this conversation recorded, by where their kept
    /// part starts (a cached summary's end, or the head), each checked against this
    /// request's items.
    horizons: HashMap<usize, Horizon>,
}

impl OnHand {
    fn exact(&self, end: usize) -> Option<Arc<Summary>> {
        self.cached
            .iter()
            .find(|(e, _)| *e == end)
            .map(|(_, s)| s.clone())
    }

    /// The latest-ending cached summary before `end`, which a summary up to `end` extends.
    fn longest_before(&self, end: usize) -> Option<(usize, Arc<Summary>)> {
        self.cached.iter().rev().find(|(e, _)| *e < end).cloned()
    }
}

/// The request's prefix keys and what its summaries are made from.
struct Lookup<'r> {
    /// What every prefix key descends from.
    scope: Key,
    keys: Vec<Key>,
    source: SpanSource,
    messages: &'r [Value],
    counts: &'r [u32],
    items: &'r [Item],
    /// The cut horizon of the latest kept part on record, which a step made now keeps.
    carried: Option<Horizon>,
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
            .zip(&self.items[from..end])
            .map(|((message, &tokens), item)| Evicted {
                message: message.clone(),
                tokens,
                whole: item.cut == ToolCut::Never,
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
    scope: Key,
    summary_tokens: u32,
    keys: Vec<Key>,
}

fn prefix(compactor: &Compactor, job: &CompactionJob<'_>) -> Prefix {
    let summarizer_model = compactor.summarizer.model_for(job.model);
    let max_summary_tokens = compactor.summarizer.config().max_summary_tokens;
    let summary_tokens = summary_room(&job.limits, max_summary_tokens, job.recall).summary_tokens;
    // Every key below descends from the caller's: memory, Redis, single-flight jobs and
    // cross-replica locks are all per caller.
    let caller = compactor.scope_headers.caller(job.headers);
    let scope = scope(
        &caller,
        &summarizer_model,
        &compactor.summarizer.settings_key(summary_tokens),
    );
    let keys = prefix_keys(&scope, &job.messages[..job.split.ahead]);
    Prefix {
        caller,
        summarizer_model,
        scope,
        summary_tokens,
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
async fn archive_cleared(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    archive: &ArchiveScope,
    cuts: &[Shorten],
) {
    if compactor.stand_in {
        return;
    }
    let cleared: Vec<(String, String)> = cuts
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
        scope,
        summary_tokens,
        keys,
    } = prefix;
    let split = job.split;
    let candidates: Vec<(usize, Key)> = split
        .summary_ends
        .iter()
        .map(|&end| (end, keys[end - 1]))
        .collect();
    let candidate_keys: Vec<Key> = candidates.iter().map(|(_, k)| *k).collect();
    let cached: Vec<(usize, Arc<Summary>)> = compactor
        .cache
        .cached(&candidate_keys)
        .await
        .into_iter()
        .map(|(i, summary)| (candidates[i].0, summary))
        .collect();
    let pending = pending(compactor, split, &keys);
    let on_hand = OnHand {
        cached,
        pending,
        horizons: HashMap::new(),
    };
    let summarizer_info = compactor.catalog.resolve(&summarizer_model);
    let api = compactor.summarizer.api_for(job.api);
    let conversation = recall::conversation_id(job.messages, split.head);
    let lookup = Lookup {
        scope,
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
            summary_tokens,
            encoding: job.info.encoding,
            head: split.head,
            conversation,
        },
        messages: job.messages,
        counts: &job.count.per_message,
        items: job.items,
        carried: None,
    };
    (lookup, on_hand)
}

/// Where the kept part starting at `start` anchors its cut horizon: the key of the prefix
/// before it (the scope's, for a conversation with no head), and what the request's parts
/// besides its conversation cost. Those parts (tools, system) come first in a provider's
/// cache, so requests that differ in them share no cached prefix, and an agent's side
/// requests over the same conversation (without tools, another system) must not move the
/// cuts of its loop.
fn anchor(scope: &Key, keys: &[Key], start: usize, fixed: u32) -> Key {
    let prefix = start
        .checked_sub(1)
        .and_then(|at| keys.get(at))
        .unwrap_or(scope);
    let mut hasher = blake3::Hasher::new();
    hasher.update(prefix);
    hasher.update(&fixed.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// What a horizon record says: the horizon (where every output is cut, and where those of
/// tools cut first are), and the hash of the prefix up to its reach, so that a conversation
/// whose items before it changed does not take another's cuts.
fn horizon_record(horizon: Horizon, prefix: &Key) -> String {
    format!(
        "{} {} {} {}",
        horizon.all,
        horizon.first,
        horizon.cleared,
        blake3::Hash::from_bytes(*prefix).to_hex()
    )
}

/// The horizon a record names (its three marks, before the prefix's hash).
fn recorded_horizon(record: &str) -> Option<Horizon> {
    let mut marks = record.split(' ').map(|mark| mark.parse::<usize>().ok());
    Some(Horizon {
        all: marks.next()??,
        first: marks.next()??,
        cleared: marks.next()??,
    })
}

/// What a horizon record checks the items up to `horizon` by, for the kept part after
/// `anchor`: the anchor with the conversation's prefix key up to the horizon. The keys made
/// for the summary lookup reach the plan's furthest summary end, so only the items past it
/// are hashed here, not every item from each kept part's start again (which was a hash of
/// most of the conversation per summary on hand).
fn horizon_prefix(anchor: &Key, lookup: &Lookup<'_>, horizon: usize) -> Option<Key> {
    let up_to = match horizon.checked_sub(1) {
        None => lookup.scope,
        Some(last) => match lookup.keys.get(last) {
            Some(key) => *key,
            None => {
                let made = lookup.keys.len();
                let from = lookup.keys.last().unwrap_or(&lookup.scope);
                *prefix_keys(from, lookup.messages.get(made..horizon)?).last()?
            }
        },
    };
    let mut hasher = blake3::Hasher::new();
    hasher.update(anchor);
    hasher.update(&up_to);
    Some(*hasher.finalize().as_bytes())
}

/// The cut horizons recorded for the kept parts starting at `starts`, kept where the
/// request's items up to the horizon are those the record was made on.
async fn recorded_horizons(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    lookup: &Lookup<'_>,
    on_hand: &OnHand,
) -> HashMap<usize, Horizon> {
    let starts: Vec<usize> = std::iter::once(job.split.head)
        .chain(on_hand.cached.iter().map(|(end, _)| *end))
        .collect();
    let fixed = job.count.fixed;
    let anchors: Vec<Key> = starts
        .iter()
        .map(|&start| anchor(&lookup.scope, &lookup.keys, start, fixed))
        .collect();
    let records = compactor
        .cache
        .horizons(&lookup.source.caller, &anchors)
        .await;
    starts
        .iter()
        .zip(&anchors)
        .zip(records)
        .filter_map(|((&start, anchor), record)| {
            let record = record?;
            let horizon = recorded_horizon(&record)?;
            let prefix = horizon_prefix(anchor, lookup, horizon.reach())?;
            let marks = [horizon.all, horizon.first, horizon.cleared];
            (marks.iter().all(|&mark| mark >= start)
                && *record == *horizon_record(horizon, &prefix))
            .then_some((start, horizon))
        })
        .collect()
}

/// Records the cut horizon a rewrite went with, unless it is the one on record already.
async fn record_horizon(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    (lookup, on_hand): (&Lookup<'_>, &OnHand),
    form: &Form,
) {
    // A request as sent has nothing to keep; one already on record, nothing to add.
    let unchanged = form.summary.is_none() && form.horizon == Horizon::at(form.end);
    if unchanged || on_hand.horizons.get(&form.end) == Some(&form.horizon) {
        return;
    }
    let anchor = anchor(&lookup.scope, &lookup.keys, form.end, job.count.fixed);
    let Some(prefix) = horizon_prefix(&anchor, lookup, form.horizon.reach()) else {
        return;
    };
    compactor
        .cache
        .horizon_put(
            &lookup.source.caller,
            &anchor,
            &horizon_record(form.horizon, &prefix),
        )
        .await;
}

/// A way the request can go: the items from `end` on kept after `summary` (of the items
/// `head..end`), or from the head with no summary; the kept tool outputs before `horizon`
/// cut; and where that stands against the request's limits.
#[derive(Clone)]
struct Form {
    end: usize,
    summary: Option<Arc<Summary>>,
    horizon: Horizon,
    tier: Tier,
}

/// A request and what its conversation has on hand.
type On<'a, 'r> = (&'a CompactionJob<'r>, &'a Lookup<'r>);

impl Form {
    fn at(on: On<'_, '_>, summary: Option<Arc<Summary>>, end: usize, horizon: Horizon) -> Form {
        let (job, _) = on;
        // No horizon reaches into the recent part, whatever an earlier request recorded
        // (rule 3: a client that resends fewer items, or keeps fewer recent ones, gets them
        // whole).
        let horizon = horizon.within(job.split.recent_start.max(end));
        let (tokens, messages) = estimate(on, summary.as_deref(), end, horizon);
        Form {
            end,
            summary,
            horizon,
            tier: job.limits.tier(job.settings, tokens, messages),
        }
    }

    /// With the horizon the conversation recorded for this kept part, if any: what the
    /// request before it sent.
    fn recorded(
        on: On<'_, '_>,
        on_hand: &OnHand,
        summary: Option<Arc<Summary>>,
        end: usize,
    ) -> Option<Form> {
        let horizon = *on_hand.horizons.get(&end)?;
        Some(Form::at(on, summary, end, horizon))
    }

    /// Taken up now for the first time: its outputs cut, oldest first, down to the target.
    /// What was cut before stays cut (rule 8: nothing cut is restored), from the conversation's
    /// latest recorded horizon on.
    fn fresh(on: On<'_, '_>, summary: Option<Arc<Summary>>, end: usize) -> Form {
        let (_, lookup) = on;
        let start = Horizon::at(end);
        let carried = lookup.carried.map_or(start, |cut| Horizon {
            all: cut.all.max(end),
            first: cut.first.max(end),
            cleared: cut.cleared.max(end),
        });
        Form::at(on, summary, end, carried).stepped(on)
    }

    /// Its horizon moved on, in one step, so that the prompt comes down to the target.
    fn stepped(self, on: On<'_, '_>) -> Form {
        let (job, _) = on;
        let (tokens, _) = estimate(on, self.summary.as_deref(), self.end, self.horizon);
        let horizon = advance_horizon(
            job.items,
            self.horizon,
            tokens,
            (job.limits.target, job.limits.hard(job.settings)),
            job.split.recent_start,
        );
        Form::at(on, self.summary, self.end, horizon)
    }

    fn cuts(&self, job: &CompactionJob<'_>) -> Vec<Shorten> {
        form_cuts(job, self.end, self.horizon)
    }
}

/// The outputs a form keeping the items from `end` on cuts: those of the middle before
/// `horizon`, and the recent ones the plan shortens only when the recent part alone cannot
/// fit the hard limit.
fn form_cuts(job: &CompactionJob<'_>, end: usize, horizon: Horizon) -> Vec<Shorten> {
    let mut cuts = cuts_before(job.items, end, horizon);
    cuts.extend(
        job.split
            .recent_cuts()
            .filter(|cut| cut.index >= end)
            .copied(),
    );
    cuts
}

/// Estimated prompt, and message count, of a request forwarded with `summary` (ending before
/// message `end`) and everything after it (the task pinned), the outputs before `horizon`
/// cut; or, with no summary, whole but for those cuts.
fn estimate(
    (job, lookup): On<'_, '_>,
    summary: Option<&Summary>,
    end: usize,
    horizon: Horizon,
) -> (u64, usize) {
    let cuts = saving(&form_cuts(job, end, horizon));
    let items = job.count.per_message.len();
    let Some(summary) = summary else {
        let tool = if job.recall && cuts > 0 {
            u64::from(recall::tool_tokens(job.info.encoding))
        } else {
            0
        };
        return (job.count.total + tool - cuts, items);
    };
    let pinned = job.split.pinned_before(end).unwrap_or_default();
    let head: u64 = job.count.per_message[..job.split.head]
        .iter()
        .chain(&job.count.per_message[pinned.clone()])
        .map(|&t| u64::from(t))
        .sum();
    let rest: u64 = job.count.per_message[end..]
        .iter()
        .map(|&t| u64::from(t))
        .sum();
    let tokens = head
        + u64::from(summary.tokens)
        + u64::from(SUMMARY_FRAMING_TOKENS)
        + recall_tokens(job, lookup, end)
        + rest
        + u64::from(job.count.fixed)
        - cuts;
    (tokens, job.split.head + pinned.len() + 1 + items - end)
}

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

/// Carries the plan out and says how the request goes: rewritten with a summary, trimmed,
/// or as sent. In `auto` mode a request waits for the summarizer only when nothing on hand,
/// nor cutting tool outputs, makes it fit the hard limit; under `force` it always goes with
/// the summary the plan wants.
pub async fn compact(
    compactor: &Arc<Compactor>,
    job: CompactionJob<'_>,
) -> Result<Rewrite, ProxyError> {
    let mut rewrite = carried_out(compactor, &job).await?;
    if job.recall && !rewrite.cuts.is_empty() {
        let archive = rewrite
            .archive
            .get_or_insert_with(|| archive_scope(compactor, &job));
        archive_cleared(compactor, &job, archive, &rewrite.cuts).await;
    }
    Ok(rewrite)
}

/// The plan carried out, with what is on hand or made now.
async fn carried_out(
    compactor: &Arc<Compactor>,
    job: &CompactionJob<'_>,
) -> Result<Rewrite, ProxyError> {
    let split = job.split;
    let (lookup, mut on_hand) = lookup(compactor, job, prefix(compactor, job)).await;
    // Only a request that goes now needs the cuts on record; one made ahead does not.
    on_hand.horizons = recorded_horizons(compactor, job, &lookup, &on_hand).await;
    let mut lookup = lookup;
    lookup.carried = on_hand
        .horizons
        .iter()
        .max_by_key(|(start, _)| **start)
        .map(|(_, horizon)| *horizon);
    let on = (job, &lookup);
    if job.mode == Mode::Auto {
        if let Some((form, cache)) = without_waiting(compactor, on, &on_hand) {
            record_horizon(compactor, job, (&lookup, &on_hand), &form).await;
            return Ok(went(on, form, cache, Duration::ZERO));
        }
    }
    if split.summarized() == 0 {
        // Only tool outputs to cut, and not even all of them fit: nothing for the
        // summarizer to do either.
        return Ok(trimmed(job, Duration::ZERO));
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
        Ok(summary) => {
            let form = Form::fresh(on, Some(summary), wanted);
            // A summary that came out too large to fit: without it, the plan fits.
            if form.tier == Tier::Hard {
                tracing::warn!(
                    summary_tokens = form.summary.as_ref().map(|s| s.tokens),
                    "summary too large for the window; trimming instead"
                );
                return Ok(trimmed(job, waited));
            }
            record_horizon(compactor, job, (&lookup, &on_hand), &form).await;
            Ok(went(on, form, cache, waited))
        }
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

/// How the request may go now, with what is on hand, if anything fits the hard limit; no
/// request waits while something does (rule 10). What the request before it sent stays
/// (rule 8): the form in use is the latest kept part with a recorded cut horizon, and it
/// goes unchanged while it keeps the prompt under every trigger. Past the precompute line
/// the next step is made ahead. Over the trigger the next step is taken when one on hand
/// brings the prompt down to the target in one step; else the form in use goes on, while
/// the plan's summary is made. Over the hard limit, with no step on hand that fits, the form
/// in use cuts its oldest whole tool outputs, in one step to the target, and the summary
/// takes over when it lands.
fn without_waiting(
    compactor: &Arc<Compactor>,
    on: On<'_, '_>,
    on_hand: &OnHand,
) -> Option<(Form, CacheOutcome)> {
    let (job, lookup) = on;
    let split = job.split;
    // The summary to make for `end`, extending the longest on hand that ends before it;
    // unless one is being made already, whose end the conversation has not yet outgrown:
    // a step started on every turn would never be used.
    let make = |end: usize| {
        if end > split.head && on_hand.exact(end).is_none() && on_hand.pending.is_none() {
            drop(start_summary(
                compactor,
                lookup.span(on_hand.longest_before(end), end),
            ));
        }
    };
    // Past the precompute line, counted on what is forwarded, the next step is made unless
    // one on hand or in the making would take over: a summary that ends later but would
    // itself leave the prompt past the line covers too little, and is extended.
    let make_ahead_from = |form: &Form| {
        let ready = on_hand
            .pending
            .as_ref()
            .is_some_and(|(end, _)| *end > form.end)
            || on_hand.cached.iter().any(|(end, summary)| {
                *end > form.end
                    && Form::fresh(on, Some(summary.clone()), *end).tier < Tier::Precompute
            });
        if form.tier == Tier::Precompute && !ready {
            make(split.ahead);
        }
    };
    let in_use = on_hand
        .cached
        .iter()
        .rev()
        .find_map(|(end, summary)| Form::recorded(on, on_hand, Some(summary.clone()), *end))
        .or_else(|| Form::recorded(on, on_hand, None, split.head));
    if let Some(form) = in_use.as_ref().filter(|form| form.tier <= Tier::Precompute) {
        make_ahead_from(form);
        return Some((form.clone(), CacheOutcome::Hit));
    }
    // The next steps on hand: summaries ending after the one in use, shortest first, each
    // with its outputs cut afresh.
    let after = in_use.as_ref().map(|form| form.end);
    let steps: Vec<Form> = on_hand
        .cached
        .iter()
        .filter(|(end, _)| after.is_none_or(|after| *end > after))
        .map(|(end, summary)| Form::fresh(on, Some(summary.clone()), *end))
        .collect();
    if let Some(step) = steps.iter().find(|form| form.tier <= Tier::Precompute) {
        make_ahead_from(step);
        return Some((step.clone(), CacheOutcome::Hit));
    }
    let as_sent = Form::at(on, None, split.head, Horizon::at(split.head));
    let current = in_use.unwrap_or(as_sent);
    if current.tier < Tier::Hard {
        make(split.tail_start);
        return Some((current, CacheOutcome::Stale));
    }
    // Over the hard limit: the longest step on hand that fits, else the form in use with
    // more of its outputs cut.
    let instant = steps
        .into_iter()
        .rev()
        .find(|form| form.tier < Tier::Hard)
        .or_else(|| Some(current.stepped(on)).filter(|form| form.tier < Tier::Hard))?;
    make(split.tail_start);
    Some((instant, CacheOutcome::Stale))
}

/// The rewrite a form makes: with its summary, or cut only, or as sent when it changes
/// nothing (the cache outcome then says the request went as it came: `deferred`).
fn went(on: On<'_, '_>, form: Form, cache: CacheOutcome, waited: Duration) -> Rewrite {
    let (job, lookup) = on;
    let cuts = form.cuts(job);
    let Some(summary) = form.summary else {
        // No summary on hand yet: the request went without one while it is made.
        let cache = if cache == CacheOutcome::Stale {
            CacheOutcome::Deferred
        } else {
            cache
        };
        if cuts.is_empty() {
            return as_sent(cache, waited);
        }
        return Rewrite {
            summary: None,
            kept_from: job.split.head,
            pinned: None,
            cuts,
            action: Action::Trimmed,
            cache,
            summarized: 0,
            waited,
            archive: None,
        };
    };
    Rewrite {
        summary: Some(summary),
        kept_from: form.end,
        pinned: job.split.pinned_before(form.end),
        cuts,
        action: Action::Summarized,
        cache,
        summarized: form.end - job.split.head,
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
        cuts: Vec::new(),
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
    let items = job.items.to_vec();
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
            items: &items,
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
                Form::fresh((&job, &lookup), Some(summary.clone()), *end).tier <= Tier::Precompute
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
    let request = SummaryRequest {
        upstream: source.upstream.clone(),
        api: source.api,
        model: source.model.clone(),
        caller: source.caller,
        credentials: source.credentials.clone(),
        previous: job.base.as_ref().map(|(_, summary)| summary.text.clone()),
        messages: job.new_messages.clone(),
        window: source.window,
        max_tokens: source.summary_tokens,
        encoding: source.encoding,
    };
    let started = Instant::now();
    let text = if compactor.stand_in {
        compactor.summarizer.stand_in(&request)
    } else {
        let text = compactor.summarizer.summarize(request).await;
        compactor
            .summarize_seconds
            .observe(started.elapsed().as_secs_f64());
        text?
    };
    let summary = Arc::new(Summary {
        tokens: count_text(source.encoding, &text),
        text,
        messages: job.end - source.head,
        model: source.model.clone(),
        created_at: unix_now(),
    });
    compactor.cache.put(job.key, summary.clone()).await;
    // A would-be summary is no news, and nothing it replaces is ever recalled.
    if compactor.stand_in {
        return Ok(summary);
    }
    tracing::info!(
        messages = summary.messages,
        extended_from = job.base.as_ref().map(|(e, _)| e - source.head),
        summary_tokens = summary.tokens,
        summarizer_ms = started.elapsed().as_secs_f64() * 1e3,
        "summary made"
    );
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
