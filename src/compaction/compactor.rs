//! Carries out a compaction plan: finds or makes the summary of the evicted span (longest
//! cached prefix, extension, one summarizer call per span however many ask), rewrites the
//! messages, and falls back per `on_failure` when the summarizer fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::HeaderMap;
use serde_json::Value;

use crate::compaction::cache::{scope, PrefixKeys, ScopeHeaders, SummaryCache};
use crate::compaction::forms::{went, without_waiting, Form, Found, On, OnHand, SharedSummary};
use crate::compaction::horizon::{Horizon, Records, StandInRecord};
use crate::compaction::limits::{summary_room, Tier};
use crate::compaction::pace::{Pace, Paces};
use crate::compaction::plan::{Mode, Split};
use crate::compaction::redis::RedisStore;
use crate::compaction::rewrite::{as_sent, trimmed, ArchiveScope, CompactionJob, Rewrite};
use crate::compaction::rewrite::{Action, CacheOutcome};
use crate::compaction::session::{SessionMark, SessionRoute, Sessions};
use crate::compaction::shorten::Shorten;
use crate::compaction::single_flight::InFlight;
use crate::compaction::stand_in::stand_in;
use crate::compaction::summarizer::Summarizer;
use crate::compaction::summary::{Key, Summary};
use crate::compaction::summary_api::SummaryEndpoint;
use crate::compaction::summary_check::task_identifiers;
use crate::compaction::summary_maker::{SpanJob, SpanSource, SummaryMaker};
use crate::compaction::summary_prompt::Evicted;
use crate::config::{Config, ConfigError, OnFailure};
use crate::conversation::{Item, ToolCut, Views};
use crate::error::{ProxyError, SummarizeError};
use crate::observe::metrics::SummarizerHealth;
use crate::tokens::catalog::ModelCatalog;
use crate::transport::upstream::Connections;

pub struct Compactor {
    scope_headers: ScopeHeaders,
    forms: FormCounts,
    maker: SummaryMaker,
    in_flight: Arc<InFlight>,
    /// The summarizer model's window and encoding.
    catalog: Arc<ModelCatalog>,
    prefix_keys: PrefixKeys,
    paces: Paces,
}

impl Compactor {
    pub fn new(
        config: &Config,
        catalog: Arc<ModelCatalog>,
        cache_errors: prometheus::IntCounter,
        summarize_seconds: prometheus::Histogram,
        (summarizer_health, forms): (SummarizerHealth, &prometheus::IntCounterVec),
        connections: &Connections,
        configured_summary_api: Option<SummaryEndpoint>,
    ) -> Result<Compactor, ConfigError> {
        let shared = if config.cache.redis_url.is_empty() {
            None
        } else {
            Some(RedisStore::new(&config.cache, cache_errors)?)
        };
        let maker = SummaryMaker {
            summarizer: Summarizer::new(
                config.summarizer.clone(),
                connections,
                summarizer_health,
                catalog.clone(),
                configured_summary_api,
            )?,
            cache: SummaryCache::new(&config.cache, shared),
            sessions: Sessions::new(Duration::from_secs(config.summarizer.prompt_cache_secs)),
            summarize_seconds,
            stand_in: false,
        };
        Ok(Compactor {
            scope_headers: ScopeHeaders::new(&config.cache, connections.key_headers)?,
            forms: FormCounts::new(forms),
            maker,
            in_flight: Arc::default(),
            catalog,
            prefix_keys: PrefixKeys::default(),
            paces: Paces::default(),
        })
    }

    /// This compactor as observe mode's: it plans and carries out every step as `auto` does,
    /// and its summaries are the summarizer's stand-in (`Summarizer::stand_in`), made at
    /// once and calling nothing. Built on a config without Redis, its cache is its own, so
    /// would-be summaries never mix with real ones.
    pub fn standing_in(mut self) -> Compactor {
        self.maker.stand_in = true;
        self
    }

    /// The hash of the caller's identity, as summaries and horizons are scoped by.
    pub fn caller(&self, headers: &HeaderMap) -> Key {
        self.scope_headers.caller(headers)
    }

    /// Once every summary being made has landed: what a replay waits for between
    /// requests, as the time between an agent's turns would let it.
    pub async fn settled(&self) {
        self.in_flight.settled().await;
    }

    /// The summary cache, which holds the archive too.
    pub fn cache(&self) -> &SummaryCache {
        &self.maker.cache
    }

    pub fn cached_entries(&self) -> u64 {
        self.maker.cache.entries()
    }

    /// `body` went upstream for the request `mark` describes, its prompt `tokens` long: a
    /// later summary of the session may be asked through it.
    pub fn forwarded(&self, mark: SessionMark, body: Bytes, tokens: u64) {
        self.maker.sessions.record(mark, body, tokens);
    }
}

/// `condenser_forms_total`: a series per way a form is found (`Found`), shown from start-up.
struct FormCounts(Vec<prometheus::IntCounter>);

impl FormCounts {
    fn new(vec: &prometheus::IntCounterVec) -> FormCounts {
        FormCounts(
            Found::ALL
                .iter()
                .map(|found| vec.with_label_values(&[found.name()]))
                .collect(),
        )
    }

    fn count(&self, found: Found) {
        if let Some(counter) = self.0.get(found as usize) {
            counter.inc();
        }
    }
}

/// The request's prefix keys and what its summaries are made from.
struct Lookup<'r> {
    /// What every prefix key descends from.
    scope: Key,
    keys: Vec<Key>,
    source: SpanSource,
    messages: &'r Views<'r>,
    counts: &'r [u32],
    items: &'r [Item],
    split: &'r Split,
}

impl Lookup<'_> {
    /// Where this conversation's items are archived.
    fn archive(&self) -> ArchiveScope {
        self.source.archive.clone()
    }

    /// Where this conversation's cut horizons are recorded, and checked.
    fn records<'a>(&'a self, compactor: &'a Compactor, job: &CompactionJob<'_>) -> Records<'a> {
        Records {
            cache: &compactor.maker.cache,
            caller: self.source.caller,
            scope: self.scope,
            keys: &self.keys,
            messages: self.messages,
            fixed: job.count.fixed,
        }
    }

    /// The key of the summary of messages up to `end`.
    fn key(&self, end: usize) -> Key {
        self.keys[end - 1]
    }

    /// The key a stand-in of the messages `from..end` is kept under, apart from the model's
    /// summary of the same messages, which replaces it: the prefix keys of both ends, as a
    /// stand-in to the same end extends the head or a model's summary of what comes first.
    fn stand_in_key(&self, went: &StandInRecord) -> Option<Key> {
        let key = |end: usize| self.keys.get(end.checked_sub(1)?);
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"condenser stand-in text v2");
        hasher.update(key(went.end)?);
        if let Some(from) = key(went.from) {
            hasher.update(from);
        }
        Some(*hasher.finalize().as_bytes())
    }

    /// The identifiers ledger's budget in this conversation's summaries, and its stand-ins.
    fn ledger_tokens(&self, compactor: &Compactor) -> u32 {
        let summarizer = &compactor.maker.summarizer;
        summarizer.ledger_tokens(self.source.summary_tokens, self.source.window)
    }

    /// The text of the stand-in `record` names: as kept, else written again from the
    /// items, which make the same text (`stand_in`); None when the model's summary it
    /// extended is no longer on hand.
    async fn stand_in(
        &self,
        compactor: &Compactor,
        job: &CompactionJob<'_>,
        on_hand: &OnHand,
        record: StandInRecord,
    ) -> Option<Arc<Summary>> {
        let key = self.stand_in_key(&record)?;
        let cache = &compactor.maker.cache;
        if let Some(summary) = cache.get(&key).await.filter(|summary| summary.stand_in) {
            return Some(summary);
        }
        let base = match record.from > job.split.head {
            true => Some(on_hand.exact(record.from)?),
            false => None,
        };
        let summary = Arc::new(stand_in(
            job.messages,
            (job.split.head, record.from..record.end),
            job.split.pinned_before(record.end),
            base.as_deref(),
            (
                &self.source.archive.conversation,
                job.info.encoding,
                self.ledger_tokens(compactor),
            ),
        ));
        cache.put(key, summary.clone()).await;
        Some(summary)
    }

    /// Keeps a stand-in a request went with, and archives the items it folded, for recall.
    async fn keep_stand_in(
        &self,
        compactor: &Compactor,
        job: &CompactionJob<'_>,
        went: StandInRecord,
        summary: &Arc<Summary>,
    ) {
        let Some(key) = self.stand_in_key(&went) else {
            return;
        };
        let cache = &compactor.maker.cache;
        cache.put(key, summary.clone()).await;
        if compactor.maker.stand_in {
            return;
        }
        let pinned = job.split.pinned_before(went.end).unwrap_or_default();
        let folded: Vec<(Key, ViewText)> = (went.from..went.end)
            .filter(|index| !pinned.contains(index))
            .filter_map(|index| {
                Some((
                    self.source.archive.slot(index)?,
                    ViewText(self.messages, index),
                ))
            })
            .collect();
        cache.archive_put(&folded).await;
    }

    /// The job that makes the summary of messages up to `end`, from `base` if given.
    fn span(&self, base: Option<(usize, Arc<Summary>)>, end: usize) -> SpanJob {
        let from = base.as_ref().map_or(self.source.head, |(e, _)| *e);
        let new_messages = self
            .messages
            .range(from..end)
            .zip(&self.counts[from..end])
            .zip(&self.items[from..end])
            .map(|((message, &tokens), item)| Evicted {
                message: message.clone(),
                tokens,
                whole: item.cut == ToolCut::Never,
            })
            .collect();
        let task = self
            .split
            .pinned_before(end)
            .map(|task| task_identifiers(self.messages.range(task)))
            .unwrap_or_default();
        SpanJob {
            key: self.key(end),
            base,
            source: self.source.clone(),
            end,
            new_messages,
            task,
            patience: Duration::ZERO,
        }
    }

    /// What the request leaves for a later summary, once forwarded with its items from
    /// `kept_from` on one for one; none when no summary is asked through the session.
    fn mark(&self, kept_from: usize) -> Option<SessionMark> {
        let route = self.source.session.as_ref()?;
        Some(SessionMark {
            session: route.session.clone(),
            keys: self.keys.clone(),
            kept_from,
            items: self.messages.len(),
        })
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
    let summarizer_model = compactor.maker.summarizer.model_for(job.model);
    let max_summary_tokens = compactor.maker.summarizer.config().max_summary_tokens;
    let summary_tokens = summary_room(&job.limits, max_summary_tokens, job.recall).summary_tokens;
    // Every key below descends from the caller's: memory, Redis, single-flight jobs and
    // cross-replica locks are all per caller.
    let caller = compactor.scope_headers.caller(job.headers);
    let scope = scope(
        &caller,
        &summarizer_model,
        &compactor
            .maker
            .summarizer
            .settings_key(summary_tokens, &job.settings.tools),
    );
    let ahead = job.split.ahead;
    let identities = job
        .identities
        .get(..ahead)
        .filter(|_| job.identities.len() == job.messages.len());
    let keys = compactor.prefix_keys.keys(
        &scope,
        (job.messages, ahead),
        identities.unwrap_or_default(),
    );
    Prefix {
        caller,
        summarizer_model,
        scope,
        summary_tokens,
        keys,
    }
}

/// Where a conversation's items are archived: its caller, its id, and what each item is
/// bound to.
fn archive_scope(compactor: &Compactor, job: &CompactionJob<'_>) -> ArchiveScope {
    ArchiveScope::new(
        compactor.scope_headers.caller(job.headers),
        &compactor.prefix_keys,
        (job.messages, job.items, job.identities),
        job.split.head,
    )
}

/// The tool outputs the rewrite cuts, archived whole under the references their stubs
/// name; already archived ones cost nothing more (`SummaryCache::archive_put`), not even
/// their views: a compacted agent request cuts most of its outputs, archived before, and
/// making their views took 1.5M of its 22M instructions.
async fn archive_cleared(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    archive: &ArchiveScope,
    cuts: &[Shorten],
) {
    if compactor.maker.stand_in {
        return;
    }
    let cleared: Vec<(Key, ViewText)> = cuts
        .iter()
        .filter(|cut| cut.index < job.messages.len())
        .filter_map(|cut| Some((archive.slot(cut.index)?, ViewText(job.messages, cut.index))))
        .collect();
    compactor.maker.cache.archive_put(&cleared).await;
}

/// An item's view as JSON text, made when written.
struct ViewText<'v>(&'v Views<'v>, usize);

impl std::fmt::Display for ViewText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get(self.1) {
            Some(view) => view.fmt(f),
            None => Ok(()),
        }
    }
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
        .maker
        .cache
        .cached(&candidate_keys)
        .await
        .into_iter()
        .map(|(i, summary)| (candidates[i].0, summary))
        .collect();
    let pending = compactor.in_flight.pending(split, &keys);
    let on_hand = OnHand {
        cached,
        pending,
        horizons: HashMap::new(),
        carried: None,
        stand_in: None,
        pace: Pace::default(),
    };
    let summarizer_info = compactor.catalog.resolve(&summarizer_model);
    let api = compactor.maker.summarizer.api_for(job.api);
    let archive = ArchiveScope::new(
        caller,
        &compactor.prefix_keys,
        (job.messages, job.items, job.identities),
        split.head,
    );
    let session = session_route(compactor, job, caller, || archive.conversation.clone());
    let lookup = Lookup {
        scope,
        keys,
        source: SpanSource {
            upstream: compactor.maker.summarizer.upstream_for(job.upstream),
            model: summarizer_model,
            caller,
            api,
            credentials: compactor
                .maker
                .summarizer
                .credentials_for(job.headers, job.api),
            window: compactor
                .maker
                .summarizer
                .window(summarizer_info.context_window),
            summary_tokens,
            encoding: job.info.encoding,
            head: split.head,
            archive,
            session,
        },
        messages: job.messages,
        counts: &job.count.per_message,
        items: job.items,
        split: job.split,
    };
    (lookup, on_hand)
}

/// How a summary of `job`'s session may be asked through its last request, if it may; the
/// conversation's id is only worked out then.
fn session_route(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    caller: Key,
    conversation: impl FnOnce() -> String,
) -> Option<SessionRoute> {
    let summarizer = &compactor.maker.summarizer;
    if compactor.maker.stand_in || !summarizer.through_session(job.model, job.api) {
        return None;
    }
    Some(SessionRoute {
        session: (caller, conversation()),
        upstream: job.upstream.clone(),
        api: job.api,
        model: job.model.to_string(),
        headers: summarizer.session_headers(job.headers, job.api),
    })
}

/// Records the cut horizon a rewrite went with, unless it is the one on record already.
async fn record_horizon(
    compactor: &Compactor,
    job: &CompactionJob<'_>,
    (lookup, on_hand): (&Lookup<'_>, &OnHand),
    form: &Form,
) {
    if let Some(went) = form.stand_in_record() {
        if on_hand.stand_in.as_ref().map(|(record, _)| record) == Some(&went) {
            return;
        }
        if let Some(summary) = &form.summary {
            lookup.keep_stand_in(compactor, job, went, summary).await;
        }
        lookup
            .records(compactor, job)
            .record_stand_in(job.split.head, went)
            .await;
        return;
    }
    // A request as sent has nothing to keep; one already on record, nothing to add.
    let unchanged = form.summary.is_none() && form.horizon == Horizon::at(form.end);
    if unchanged || on_hand.horizons.get(&form.end) == Some(&form.horizon) {
        return;
    }
    lookup
        .records(compactor, job)
        .record(form.end, form.horizon)
        .await;
}

/// Carries the plan out and says how the request goes: rewritten with a summary, trimmed,
/// or as sent. In `auto` mode a request waits for the summarizer only when nothing on hand,
/// nor cutting tool outputs, makes it fit the hard limit; under `force` it always goes with
/// the summary the plan wants.
///
/// With the rewrite comes what the request leaves, once forwarded, for a later summary to be
/// asked through it ([`Compactor::forwarded`]).
pub async fn compact(
    compactor: &Arc<Compactor>,
    job: CompactionJob<'_>,
) -> Result<(Rewrite, Option<SessionMark>), ProxyError> {
    let (lookup, on_hand) = lookup(compactor, &job, prefix(compactor, &job)).await;
    let mut rewrite = carried_out(compactor, &job, &lookup, on_hand).await?;
    // A later summary is asked through this request only if it shows every item before the
    // summary's end: one for one, or in its own summary. Trimmed past the head (the
    // summarizer failed), it shows no trace of what it dropped.
    let kept_from = match rewrite.action {
        Action::Forwarded => Some(0),
        Action::Summarized => Some(rewrite.kept_from),
        Action::Trimmed => Some(rewrite.kept_from).filter(|&from| from <= job.split.head),
    };
    let mark = kept_from.and_then(|from| lookup.mark(from));
    drop(lookup);
    if job.recall && !rewrite.cuts.is_empty() {
        let archive = rewrite
            .archive
            .get_or_insert_with(|| archive_scope(compactor, &job));
        archive_cleared(compactor, &job, archive, &rewrite.cuts).await;
    }
    Ok((rewrite, mark))
}

/// The plan carried out, with what is on hand or made now.
async fn carried_out(
    compactor: &Arc<Compactor>,
    job: &CompactionJob<'_>,
    lookup: &Lookup<'_>,
    mut on_hand: OnHand,
) -> Result<Rewrite, ProxyError> {
    let split = job.split;
    let session = (
        lookup.source.caller,
        lookup.source.archive.conversation.clone(),
    );
    on_hand.pace = compactor.paces.seen(&session, job.count.raw_total, |key| {
        compactor.in_flight.running(key)
    });
    // Only a request that goes now needs the cuts on record; one made ahead does not.
    let starts: Vec<usize> = std::iter::once(split.head)
        .chain(on_hand.cached.iter().map(|(end, _)| *end))
        .collect();
    let (horizons, stand_in) = lookup
        .records(compactor, job)
        .recorded(&starts, split.head)
        .await;
    on_hand.horizons = horizons;
    on_hand.stand_in = match stand_in {
        Some(record) => lookup
            .stand_in(compactor, job, &on_hand, record)
            .await
            .map(|summary| (record, summary)),
        None => None,
    };
    on_hand.carried = on_hand
        .horizons
        .iter()
        .map(|(start, horizon)| (*start, *horizon))
        .chain(
            on_hand
                .stand_in
                .as_ref()
                .map(|(record, _)| (record.end, record.horizon)),
        )
        .max_by_key(|(start, _)| *start)
        .map(|(_, horizon)| horizon);
    let archive = lookup.archive();
    let on = On {
        job,
        on_hand: &on_hand,
        archive: &archive,
        ledger_tokens: lookup.ledger_tokens(compactor),
    };
    if job.mode == Mode::Auto {
        let choice = without_waiting(on);
        if let Some(end) = choice.make {
            let key = lookup.key(end);
            compactor.paces.started(&session, on_hand.pace, key);
            let span = || lookup.span(on_hand.longest_before(end), end).ahead();
            drop(start_summary(compactor, key, span));
        }
        if let Some((form, cache, found)) = choice.went {
            compactor.forms.count(found);
            record_horizon(compactor, job, (lookup, &on_hand), &form).await;
            return Ok(went(on, form, cache, Duration::ZERO));
        }
    }
    if split.summarized() == 0 {
        // Only tool outputs to cut, and not even all of them fit: nothing for the
        // summarizer to do either.
        compactor.forms.count(Found::Cut);
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
            let span = || lookup.span(base, wanted);
            (
                start_summary(compactor, lookup.key(wanted), span).await,
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
                compactor.forms.count(Found::Cut);
                return Ok(trimmed(job, waited));
            }
            compactor.forms.count(Found::Stepped);
            record_horizon(compactor, job, (lookup, &on_hand), &form).await;
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
                OnFailure::Forward => {
                    compactor.forms.count(Found::AsSent);
                    Ok(as_sent(CacheOutcome::None, waited))
                }
                OnFailure::Error => Err(ProxyError::SummarizerFailed(error)),
                OnFailure::Trim => {
                    compactor.forms.count(Found::Cut);
                    Ok(trimmed(job, waited))
                }
            }
        }
    }
}

/// From the precompute band: make the summary the plan would need, in the background,
/// unless what is on hand would do. The request goes as sent: what it leaves for a later
/// summary comes back ([`Compactor::forwarded`]).
pub fn precompute(compactor: &Arc<Compactor>, job: CompactionJob<'_>) -> Option<SessionMark> {
    let prefix = prefix(compactor, &job);
    let session = (
        prefix.caller,
        ArchiveScope::conversation_id(
            &compactor.prefix_keys,
            (job.messages, job.items, job.identities),
            job.split.head,
        ),
    );
    let mark = session_route(compactor, &job, prefix.caller, || session.1.clone()).map(|route| {
        SessionMark {
            session: route.session,
            keys: prefix.keys.clone(),
            kept_from: 0,
            items: job.messages.len(),
        }
    });
    let pace = compactor.paces.seen(&session, job.count.raw_total, |key| {
        compactor.in_flight.running(key)
    });
    // The step is being made already (the common case in the precompute band): nothing to
    // copy, nothing to start.
    if compactor
        .in_flight
        .pending(job.split, &prefix.keys)
        .is_some()
    {
        return mark;
    }
    let compactor = compactor.clone();
    // The lookup needs owned inputs to run after the request moves on: of the messages, only
    // those a summary may hold.
    let messages = Views::made(
        job.messages
            .range(0..job.split.ahead)
            .cloned()
            .collect::<Vec<Value>>(),
    );
    let count = job.count.clone();
    let items = job.items.to_vec();
    let identities = job.identities[..job.split.ahead.min(job.identities.len())].to_vec();
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
            identities: &identities,
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
        let archive = lookup.archive();
        let on = On {
            job: &job,
            on_hand: &on_hand,
            archive: &archive,
            ledger_tokens: lookup.ledger_tokens(&compactor),
        };
        let ready = on_hand.pending.is_some()
            || on_hand.cached.iter().any(|(end, summary)| {
                Form::fresh(on, Some(summary.clone()), *end).tier <= Tier::Precompute
            });
        // Made for when the trigger fires: by then it brings the prompt to the target.
        if !ready {
            let key = lookup.key(split.ahead);
            compactor.paces.started(&session, pace, key);
            let base = on_hand.longest_before(split.ahead);
            let span = || lookup.span(base, split.ahead).ahead();
            let _ = start_summary(&compactor, key, span).await;
        }
    });
    mark
}

/// The one summarizer job for `key`, started now unless already running; its messages are
/// copied (`span`) only when it starts.
fn start_summary(
    compactor: &Arc<Compactor>,
    key: Key,
    span: impl FnOnce() -> SpanJob,
) -> SharedSummary {
    let compactor = compactor.clone();
    let in_flight = compactor.in_flight.clone();
    in_flight.start(key, move || {
        let job = span();
        async move { compactor.maker.make_shared_once(&job).await }
    })
}
