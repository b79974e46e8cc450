//! What a report of a session draws of each of its requests (`Record`), from `condenser
//! replay` or from traffic, and the recent sessions the admin listener shows
//! (`RecentSessions`). A record holds what the metrics and the observer's session records
//! already hold of a request (its counts, the action, the summarized items, the cache
//! break and its limits), never a key, and what the model was sent only when asked.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use crate::compaction::limits::Limits;
use crate::compaction::rewrite::Action;
use crate::pipeline::observer::{CacheBreak, Judged};
use crate::pipeline::sent::SentParts;
use crate::tokens::catalog::Price;

/// One request of a session, as a report draws it.
#[derive(Debug, Clone)]
pub struct Record {
    /// The session it belongs to (`Judged::session`).
    pub session: u64,
    pub model: String,
    /// The prompt as the client sent it.
    pub received_tokens: u64,
    /// The prompt as condenser forwarded it (or would have, in observe mode).
    pub forwarded_tokens: u64,
    /// Of the forwarded prompt, the share that repeats the request before it: read from
    /// the provider's cache.
    pub cached_tokens: u64,
    /// Of the prompt as sent, the share that repeats the client's request before it.
    pub client_cached_tokens: u64,
    pub action: Action,
    /// Items the summary in it replaces.
    pub summarized: usize,
    /// Why it does not repeat the whole of the request before it; none for the first.
    pub cache_break: Option<CacheBreak>,
    pub lines: Lines,
    /// The model's price, when `[models]` sets one.
    pub price: Option<Price>,
    /// What the model was sent, when kept.
    pub sent: Option<SentParts>,
}

/// The lines a request's prompt is drawn against, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lines {
    /// Compaction starts above it.
    pub trigger: u64,
    /// A compacted prompt aims under it.
    pub target: u64,
    /// No prompt is forwarded above it: the window less the reserve, or `max_prompt_tokens`.
    pub hard: u64,
}

impl Lines {
    /// The lines as the provider counts, as the prompt's own counts are told.
    pub fn new(limits: &Limits) -> Lines {
        Lines {
            trigger: limits.provider_tokens(limits.trigger),
            target: limits.provider_tokens(limits.target),
            hard: limits.provider_tokens(limits.hard()),
        }
    }
}

/// What a request's record is made of, besides what the model was sent.
pub struct Counted<'a> {
    pub model: &'a str,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    pub action: Action,
    pub summarized: usize,
    pub lines: Lines,
    pub price: Option<Price>,
}

impl Record {
    pub fn new(counted: Counted<'_>, judged: Judged, sent: Option<SentParts>) -> Record {
        Record {
            session: judged.session,
            model: counted.model.to_string(),
            received_tokens: counted.received_tokens,
            forwarded_tokens: counted.forwarded_tokens,
            cached_tokens: judged.cached_tokens,
            client_cached_tokens: judged.client_cached_tokens,
            action: counted.action,
            summarized: counted.summarized,
            cache_break: judged.cache_break,
            lines: counted.lines,
            price: counted.price,
            sent,
        }
    }
}

/// The requests of one session, oldest first, and whether older ones were let go.
#[derive(Debug, Clone, Default)]
pub struct Session {
    pub key: u64,
    pub records: Vec<Record>,
    /// Requests before the first kept.
    pub dropped: usize,
}

/// The last `sessions` sessions seen, each with its last `requests` requests: what the admin
/// listener's `GET /sessions` draws. Bounded both ways, so a busy gateway holds at most
/// `sessions × requests` records.
pub struct RecentSessions {
    sessions: usize,
    requests: usize,
    seen: Mutex<VecDeque<Session>>,
}

impl RecentSessions {
    pub fn new(sessions: usize, requests: usize) -> RecentSessions {
        RecentSessions {
            sessions: sessions.max(1),
            requests: requests.max(1),
            seen: Mutex::new(VecDeque::new()),
        }
    }

    /// `record` added to its session, which becomes the most recently seen.
    pub fn push(&self, record: Record) {
        // Whole after every statement: a panic elsewhere leaves it usable.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut session = match seen.iter().position(|s| s.key == record.session) {
            Some(at) => seen.remove(at).unwrap_or_default(),
            None => Session {
                key: record.session,
                ..Session::default()
            },
        };
        if session.records.len() == self.requests {
            session.records.remove(0);
            session.dropped += 1;
        }
        session.records.push(record);
        seen.push_back(session);
        while seen.len() > self.sessions {
            seen.pop_front();
        }
    }

    /// The sessions kept, the most recently seen first.
    pub fn snapshot(&self) -> Vec<Session> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(session: u64, forwarded_tokens: u64) -> Record {
        Record {
            session,
            model: "m".into(),
            received_tokens: forwarded_tokens,
            forwarded_tokens,
            cached_tokens: 0,
            client_cached_tokens: 0,
            action: Action::Forwarded,
            summarized: 0,
            cache_break: None,
            lines: Lines {
                trigger: 8,
                target: 5,
                hard: 10,
            },
            price: None,
            sent: None,
        }
    }

    #[test]
    fn the_last_sessions_are_kept_with_their_last_requests() {
        let recent = RecentSessions::new(2, 3);
        for (session, tokens) in [(1, 10), (2, 20), (1, 11), (3, 30), (1, 12), (1, 13)] {
            recent.push(record(session, tokens));
        }
        let kept = recent.snapshot();
        let keys: Vec<u64> = kept.iter().map(|s| s.key).collect();
        assert_eq!(keys, [1, 3], "session 2 was seen least recently");
        let tokens: Vec<u64> = kept[0].records.iter().map(|r| r.forwarded_tokens).collect();
        assert_eq!(tokens, [11, 12, 13]);
        assert_eq!(kept[0].dropped, 1);
    }
}
