//! Makes the summary of one span of a conversation: asks the summarizer (through the session
//! when it may), by one replica however many ask, stores what comes back and archives the
//! items it replaces, for recall.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderMap;

use crate::compaction::cache::SummaryCache;
use crate::compaction::redis::unix_now;
use crate::compaction::rewrite::ArchiveScope;
use crate::compaction::session::{SessionRoute, Sessions, FORWARD_PATIENCE};
use crate::compaction::single_flight::once_across_replicas;
use crate::compaction::summarizer::{Summarizer, SummaryRequest};
use crate::compaction::summary::{Key, Summary};
use crate::compaction::summary_api::SummaryEndpoint;
use crate::compaction::summary_prompt::Evicted;
use crate::error::SummarizeError;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;
use crate::transport::upstream::Upstream;

/// Everything a summary job needs but its messages, owned, so it can outlive the request
/// that started it.
#[derive(Clone)]
pub(super) struct SpanSource {
    pub(super) upstream: Arc<Upstream>,
    pub(super) api: SummaryEndpoint,
    pub(super) model: String,
    /// The hash of the caller's identity.
    pub(super) caller: Key,
    pub(super) credentials: HeaderMap,
    pub(super) window: u64,
    /// The most the summary's text may take (`limits::summary_room`).
    pub(super) summary_tokens: u32,
    /// The request model's, in which the summary is counted.
    pub(super) encoding: Encoding,
    pub(super) head: usize,
    /// Where the conversation's items are archived.
    pub(super) archive: ArchiveScope,
    /// Set when the summary may be asked through the session (`Summarizer::through_session`).
    pub(super) session: Option<SessionRoute>,
}

/// One summary to make: messages `head..end`, folded onto `base` (a summary of
/// `head..base_end`) when there is one.
pub(super) struct SpanJob {
    pub(super) key: Key,
    pub(super) base: Option<(usize, Arc<Summary>)>,
    pub(super) source: SpanSource,
    pub(super) end: usize,
    /// The messages this job sends the summarizer, those after the base: copied from the
    /// request only when a job starts, never for a request that finds its summary on hand.
    pub(super) new_messages: Vec<Evicted>,
    /// The pinned task's identifiers, when the task lies before `end`
    /// (`summary_check::task_identifiers`).
    pub(super) task: Vec<String>,
    /// How long it waits for the request that started it to be forwarded: a summary made
    /// ahead of need can wait for it, one a request waits on cannot.
    pub(super) patience: Duration,
}

impl SpanJob {
    /// A job made ahead of need, by a request that goes on to be forwarded.
    pub(super) fn ahead(mut self) -> SpanJob {
        self.patience = FORWARD_PATIENCE;
        self
    }

    /// How long the cross-replica lock is held for this job: as long as it may take, one
    /// summarizer timeout per chunk of the span, with room.
    fn lock_hold(&self, timeout_secs: u64) -> Duration {
        let span_tokens: u64 = self.new_messages.iter().map(|m| u64::from(m.tokens)).sum();
        let chunks = span_tokens / (self.source.window / 2).max(1) + 1;
        Duration::from_secs(timeout_secs * chunks + 5)
    }
}

/// The summarizer and where what it makes lands.
pub(super) struct SummaryMaker {
    pub(super) summarizer: Summarizer,
    /// The summaries, and the items they replace archived for recall.
    pub(super) cache: SummaryCache,
    /// Each session's last forwarded request, for summaries asked through it.
    pub(super) sessions: Sessions,
    pub(super) summarize_seconds: prometheus::Histogram,
    /// Observe mode's (`Compactor::standing_in`): summaries are the summarizer's stand-in,
    /// nothing is archived.
    pub(super) stand_in: bool,
}

impl SummaryMaker {
    /// Made by one replica however many ask (`once_across_replicas`).
    pub(super) async fn make_shared_once(
        &self,
        job: &SpanJob,
    ) -> Result<Arc<Summary>, SummarizeError> {
        let hold = job.lock_hold(self.summarizer.config().timeout_secs);
        once_across_replicas(&self.cache, &job.key, hold, || {
            self.summarize_and_store(job)
        })
        .await
    }

    async fn summarize_and_store(&self, job: &SpanJob) -> Result<Arc<Summary>, SummarizeError> {
        // Another replica may have finished it while this one waited for the lock.
        if let Some(summary) = self.cache.get(&job.key).await {
            return Ok(summary);
        }
        let source = &job.source;
        let session = match &source.session {
            Some(route) => {
                let span = (job.end, &job.key);
                let room = (source.summary_tokens, source.window);
                self.sessions.through(route, span, job.patience, room).await
            }
            None => None,
        };
        let request = SummaryRequest {
            upstream: source.upstream.clone(),
            api: source.api,
            model: source.model.clone(),
            caller: source.caller,
            credentials: source.credentials.clone(),
            previous: job.base.as_ref().map(|(_, summary)| summary.text.clone()),
            messages: job.new_messages.clone(),
            task: job.task.clone(),
            window: source.window,
            max_tokens: source.summary_tokens,
            encoding: source.encoding,
            session,
        };
        let started = Instant::now();
        let text = if self.stand_in {
            self.summarizer.stand_in(&request)
        } else {
            let text = self.summarizer.summarize(request).await;
            self.summarize_seconds
                .observe(started.elapsed().as_secs_f64());
            text?
        };
        let summary = Arc::new(Summary {
            tokens: count_text(source.encoding, &text),
            text,
            messages: job.end - source.head,
            model: source.model.clone(),
            created_at: unix_now(),
            stand_in: false,
        });
        self.cache.put(job.key, summary.clone()).await;
        // A would-be summary is no news, and nothing it replaces is ever recalled.
        if self.stand_in {
            return Ok(summary);
        }
        tracing::info!(
            messages = summary.messages,
            extended_from = job.base.as_ref().map(|(e, _)| e - source.head),
            summary_tokens = summary.tokens,
            summarizer_ms = started.elapsed().as_secs_f64() * 1e3,
            "summary made"
        );
        // Archived once its summary exists, whether or not this request offers recall: a
        // later one may, and the summary it uses replaces these items.
        let from = job.end - job.new_messages.len();
        let archived: Vec<(Key, String)> = job
            .new_messages
            .iter()
            .enumerate()
            .filter_map(|(i, evicted)| {
                let slot = source.archive.slot(from + i)?;
                Some((slot, evicted.message.to_string()))
            })
            .collect();
        self.cache.archive_put(&archived).await;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, Config, SummarizerConfig};
    use crate::observe::metrics::{SummarizerHealth, UpstreamFailures};
    use crate::tokens::catalog::ModelCatalog;
    use crate::transport::upstream::Connections;
    use serde_json::json;

    const HEAD: usize = 1;
    const CALLER: Key = [7; 32];

    fn connections() -> Connections {
        let failures = UpstreamFailures::new().unwrap();
        Connections::new(&Config::default(), failures, crate::dialect::key_headers())
    }

    /// A maker whose summarizer is the stand-in, or else one whose upstream refuses.
    fn maker(stand_in: bool) -> SummaryMaker {
        let catalog = ModelCatalog::new(Default::default(), Default::default());
        let summarizer = Summarizer::new(
            SummarizerConfig::default(),
            &connections(),
            SummarizerHealth::standalone().unwrap(),
            Arc::new(catalog),
            None,
        )
        .unwrap();
        let seconds = prometheus::HistogramOpts::new("summarize_seconds", "summarizer time");
        SummaryMaker {
            summarizer,
            cache: SummaryCache::new(&CacheConfig::default(), None),
            sessions: Sessions::new(Duration::from_secs(60)),
            summarize_seconds: prometheus::Histogram::with_opts(seconds).unwrap(),
            stand_in,
        }
    }

    fn source() -> SpanSource {
        // Port 9 (discard) listens nowhere here: a real summarizer call fails at once.
        let upstream = Upstream::new(
            "http://127.0.0.1:9",
            "",
            Duration::from_secs(1),
            &connections(),
        );
        SpanSource {
            upstream: Arc::new(upstream.unwrap()),
            api: crate::dialect::named("chat").unwrap().summary,
            model: "summarizer-model".into(),
            caller: CALLER,
            credentials: HeaderMap::new(),
            window: 1_000,
            summary_tokens: 50,
            encoding: ModelCatalog::new(Default::default(), Default::default())
                .resolve("gpt-4o")
                .encoding,
            head: HEAD,
            archive: archive(),
            session: None,
        }
    }

    /// The job for messages `from..end` (each `tokens` long), folded onto `base`.
    fn job(base: Option<(usize, Arc<Summary>)>, end: usize, tokens: u32) -> SpanJob {
        let from = base.as_ref().map_or(HEAD, |(e, _)| *e);
        SpanJob {
            key: [end as u8; 32],
            base,
            source: source(),
            end,
            new_messages: (from..end)
                .map(|i| Evicted {
                    message: json!({"role": "user", "content": format!("message {i}")}),
                    tokens,
                    whole: false,
                })
                .collect(),
            task: Vec::new(),
            patience: Duration::ZERO,
        }
    }

    fn summary(text: &str, messages: usize) -> Arc<Summary> {
        Arc::new(Summary {
            text: text.into(),
            messages,
            tokens: 3,
            model: "summarizer-model".into(),
            created_at: 0,
            stand_in: false,
        })
    }

    /// Where the tests' conversation of 40 items is archived.
    fn archive() -> ArchiveScope {
        ArchiveScope {
            caller: CALLER,
            conversation: "conversation".into(),
            bindings: (0..=40u8).map(|i| [i; 32]).collect(),
        }
    }

    /// What the archive holds for the span's messages `from..end`.
    async fn archived(maker: &SummaryMaker, from: usize, end: usize) -> Vec<Option<Arc<str>>> {
        let slots: Vec<Key> = (from..end).filter_map(|i| archive().slot(i)).collect();
        maker.cache.archive_get(&slots).await
    }

    #[tokio::test]
    async fn a_summary_made_is_stored_under_its_key_counting_the_span_from_the_head() {
        let maker = maker(true);
        let job = job(None, 4, 20);
        let made = maker.make_shared_once(&job).await.unwrap();
        assert_eq!(made.messages, 3);
        assert_eq!(made.model, "summarizer-model");
        assert_eq!(made.tokens, count_text(job.source.encoding, &made.text));
        let stored = maker.cache.get(&job.key).await.expect("stored");
        assert!(Arc::ptr_eq(&stored, &made));
        // The stand-in calls nothing, and what it would replace is never recalled.
        assert_eq!(maker.summarize_seconds.get_sample_count(), 0);
        assert_eq!(archived(&maker, HEAD, 4).await, vec![None, None, None]);
    }

    #[tokio::test]
    async fn an_extension_covers_its_base_too() {
        let maker = maker(true);
        let job = job(Some((3, summary("the first two", 2))), 6, 20);
        assert_eq!(job.new_messages.len(), 3);
        let made = maker.make_shared_once(&job).await.unwrap();
        assert_eq!(made.messages, 5);
    }

    #[tokio::test]
    async fn a_summary_another_replica_stored_is_taken_as_it_is() {
        let maker = maker(true);
        let job = job(None, 4, 20);
        let elsewhere = summary("made by another replica", 3);
        maker.cache.put(job.key, elsewhere.clone()).await;
        let made = maker.make_shared_once(&job).await.unwrap();
        assert!(Arc::ptr_eq(&made, &elsewhere));
    }

    #[tokio::test]
    async fn a_failed_summary_stores_and_archives_nothing() {
        let maker = maker(false);
        let job = job(None, 4, 20);
        assert!(maker.make_shared_once(&job).await.is_err());
        assert!(maker.cache.get(&job.key).await.is_none());
        assert_eq!(archived(&maker, HEAD, 4).await, vec![None, None, None]);
        assert_eq!(maker.summarize_seconds.get_sample_count(), 1);
    }

    #[test]
    fn the_lock_is_held_a_summarizer_timeout_per_half_window_of_the_span() {
        // Half the window is 500 tokens: 3 × 300 is one chunk whole and a part.
        assert_eq!(
            job(None, 4, 300).lock_hold(60),
            Duration::from_secs(2 * 60 + 5)
        );
        assert_eq!(job(None, 4, 100).lock_hold(60), Duration::from_secs(60 + 5));
        assert_eq!(
            job(None, HEAD, 0).lock_hold(60),
            Duration::from_secs(60 + 5)
        );
    }
}
