//! Each session's last forwarded request, kept for as long as the provider keeps its prefix
//! cached (`summarizer.prompt_cache_secs`): a summary asked through it (`summarizer.via`) is
//! served that prefix from the provider's cache, and only the question and the answer are
//! billed fresh.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::compaction::summarizer::ThroughSession;
use crate::compaction::summary::Key;
use crate::compaction::summary_api::SummaryEndpoint;
use crate::transport::upstream::Upstream;

/// How long a summary made ahead of need waits for the request that started it to be
/// forwarded, to be asked through it (`Sessions::carrying`); past it, it is asked apart.
pub const FORWARD_PATIENCE: Duration = Duration::from_secs(2);
/// Room for the question appended to a session's request, besides the summary.
const SESSION_QUESTION_TOKENS: u64 = 1_000;
/// Most bytes of forwarded requests kept, over all sessions: an agent's request is up to
/// about 1 MB, so this keeps the last request of some 64 of the busiest sessions; a session
/// whose record went is summarized apart, as before.
const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// A session: its caller, and its conversation's id (`recall::conversation_id`).
pub type SessionId = (Key, String);

/// How a summary of a session may be asked through its last request: where the session's
/// requests go, and as whom.
#[derive(Clone)]
pub struct SessionRoute {
    pub session: SessionId,
    pub upstream: Arc<Upstream>,
    pub api: SummaryEndpoint,
    pub model: String,
    pub headers: HeaderMap,
}

/// What a request that reached the compactor must leave, once forwarded, for a later
/// summary to be asked through it.
pub struct SessionMark {
    pub(crate) session: SessionId,
    /// The request's prefix keys, as far as its summaries are looked up.
    pub(crate) keys: Vec<Key>,
    /// From this item on, the client's items went one for one (after the head, the pinned
    /// task and any summary).
    pub(crate) kept_from: usize,
    /// How many items the client sent.
    pub(crate) items: usize,
}

/// One session's last forwarded request.
pub struct LastForwarded {
    pub body: Bytes,
    /// Its prompt, as condenser counted it.
    pub tokens: u64,
    keys: Vec<Key>,
    kept_from: usize,
    items: usize,
}

impl LastForwarded {
    /// How many of this request's last items follow item `end`, when it can carry the
    /// question for the summary of the items before `end` whose prefix key is `key`: its
    /// items up to `end` are the summary's, and those from `end` on went one for one.
    pub fn recent_after(&self, end: usize, key: &Key) -> Option<usize> {
        let same_prefix = self.keys.get(end.checked_sub(1)?) == Some(key);
        (same_prefix && self.kept_from <= end && end < self.items).then(|| self.items - end)
    }
}

pub struct Sessions {
    last: moka::sync::Cache<SessionId, Arc<LastForwarded>>,
    recorded: Notify,
}

impl Sessions {
    /// Records live `cached_for` from the request: past it the provider's cache is cold.
    pub fn new(cached_for: Duration) -> Sessions {
        Sessions {
            last: moka::sync::Cache::builder()
                .max_capacity(MAX_BYTES)
                .weigher(|_, last: &Arc<LastForwarded>| {
                    u32::try_from(last.body.len()).unwrap_or(u32::MAX)
                })
                .time_to_live(cached_for)
                .build(),
            recorded: Notify::new(),
        }
    }

    /// `body` went upstream for the request `mark` describes, its prompt `tokens` long.
    pub fn record(&self, mark: SessionMark, body: Bytes, tokens: u64) {
        let SessionMark {
            session,
            keys,
            kept_from,
            items,
        } = mark;
        let last = LastForwarded {
            body,
            tokens,
            keys,
            kept_from,
            items,
        };
        self.last.insert(session, Arc::new(last));
        self.recorded.notify_waiters();
    }

    /// The summary of the items before `end` (prefix key `key`) asked through the session's
    /// last request, if that request holds them as the client sent them and leaves room in
    /// `window` for the question and an answer of `summary_tokens`.
    pub async fn through(
        &self,
        route: &SessionRoute,
        span: (usize, &Key),
        patience: Duration,
        (summary_tokens, window): (u32, u64),
    ) -> Option<ThroughSession> {
        let (last, recent) = self.carrying(&route.session, span, patience).await?;
        let room = last.tokens + SESSION_QUESTION_TOKENS + u64::from(summary_tokens);
        (room <= window).then(|| ThroughSession {
            upstream: route.upstream.clone(),
            api: route.api,
            model: route.model.clone(),
            headers: route.headers.clone(),
            forwarded: last.body.clone(),
            recent,
        })
    }

    /// The session's last request if it can carry the summary of the items before `end`
    /// (prefix key `key`), with how many items follow them. A summary made ahead of need was
    /// started by a request not yet forwarded: it waits up to `patience` for that request.
    async fn carrying(
        &self,
        session: &SessionId,
        (end, key): (usize, &Key),
        patience: Duration,
    ) -> Option<(Arc<LastForwarded>, usize)> {
        let deadline = Instant::now() + patience;
        loop {
            // Armed before the look, so that a record made in between still wakes it.
            let recorded = self.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            if let Some(last) = self.last.get(session) {
                if let Some(recent) = last.recent_after(end, key) {
                    return Some((last, recent));
                }
            }
            tokio::time::timeout_at(deadline, recorded).await.ok()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(keys: &[u8], kept_from: usize, items: usize) -> SessionMark {
        SessionMark {
            session: ([1; 32], "conversation".into()),
            keys: keys.iter().map(|k| [*k; 32]).collect(),
            kept_from,
            items,
        }
    }

    #[tokio::test]
    async fn a_request_carries_a_summary_that_ends_where_it_went_one_for_one() {
        let sessions = Sessions::new(Duration::from_secs(300));
        let session = ([1; 32], "conversation".to_string());
        sessions.record(
            mark(&[10, 11, 12, 13], 2, 8),
            Bytes::from_static(b"{}"),
            100,
        );
        let carrying = |end: usize, key: u8| {
            let sessions = &sessions;
            let session = &session;
            async move {
                sessions
                    .carrying(session, (end, &[key; 32]), Duration::ZERO)
                    .await
                    .map(|(_, recent)| recent)
            }
        };
        // Items 0..3 are the summary's, 3..8 went one for one: 5 follow.
        assert_eq!(carrying(3, 12).await, Some(5));
        // Another conversation's prefix, or one before what went one for one: not carried.
        assert_eq!(carrying(3, 99).await, None);
        assert_eq!(carrying(1, 10).await, None);
        // Past the keys it knows: not carried.
        assert_eq!(carrying(5, 13).await, None);
    }

    #[tokio::test]
    async fn a_summary_made_ahead_waits_for_the_request_that_started_it() {
        let sessions = Arc::new(Sessions::new(Duration::from_secs(300)));
        let session = ([1; 32], "conversation".to_string());
        sessions.record(mark(&[10, 11], 0, 4), Bytes::from_static(b"{}"), 100);
        let waiting = {
            let (sessions, session) = (sessions.clone(), session.clone());
            tokio::spawn(async move {
                sessions
                    .carrying(&session, (3, &[12; 32]), Duration::from_secs(30))
                    .await
                    .map(|(last, recent)| (last.tokens, recent))
            })
        };
        tokio::task::yield_now().await;
        sessions.record(mark(&[10, 11, 12], 0, 6), Bytes::from_static(b"{}"), 200);
        assert_eq!(waiting.await.unwrap(), Some((200, 3)));
        // Nothing comes: it gives up at its patience.
        let none = sessions
            .carrying(&session, (4, &[13; 32]), Duration::from_millis(1))
            .await;
        assert!(none.is_none());
    }
}
