//! How a session's summaries keep up with it, counted in its own requests: how much its
//! prompt grows from one request to the next, and how many requests a summary made ahead
//! took to be on hand. The precompute line is a share of the window; a session whose
//! summarizer is slow for its pace needs the next summary started sooner, or the form in use
//! reaches the hard limit first and a cut step lands above the target a request before the
//! summary does (two cache breaks where one would do).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::compaction::session::SessionId;
use crate::compaction::summary::Key;

/// How long a session's pace is kept after its last request: past it, a session resumed is
/// measured afresh.
const KEPT_FOR: Duration = Duration::from_secs(3600);
/// Most sessions whose pace is kept (a record is some hundred bytes with its key).
const MAX_SESSIONS: u64 = 100_000;

/// What a session's requests have shown so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// The session's requests that reached the compactor.
    requests: u64,
    /// The client's prompt at the latest of them.
    tokens: u64,
    /// How much the client's prompt grew from the request before it: 0 when it did not.
    growth: u64,
    /// The request that started the summary being made (its key), while it is being made.
    started: Option<(u64, Key)>,
    /// How many requests the last two summaries took to be made: from the one that started
    /// each to the first that found it made.
    lags: [u64; 2],
}

impl Pace {
    /// Whether the next summary is due at this request, though its form (`tokens`) is under
    /// the precompute line: started at the next request, by the longer of the session's last
    /// two lags, it would be on hand with less than a request to spare before the prompt,
    /// growing as it has, passes `hard`; started now, it is on hand in time. A session whose
    /// summaries cannot keep up either way is left to the precompute line.
    pub fn summary_due(&self, tokens: u64, hard: u64) -> bool {
        let lag = self.lags[0].max(self.lags[1]);
        if lag == 0 || self.growth == 0 {
            return false;
        }
        // The requests after this one that the prompt, growing as it has, fits under `hard`
        // with half a request's growth to spare: a request's growth moves by a few dozen
        // tokens, and a Codex session's fifth request after a step came within 30 of the line.
        let fit = hard.saturating_sub(tokens + self.growth / 2) / self.growth;
        // A summary started at request `i` after this one goes with request `i + lag`: the
        // requests before it go without it, and must fit.
        let in_time_now = lag <= fit + 1;
        let spare_next = lag < fit;
        in_time_now && !spare_next
    }

    /// This pace once a request of `tokens` comes, `running` whether the summary of a key is
    /// still being made.
    fn seen(mut self, tokens: u64, running: impl Fn(&Key) -> bool) -> Pace {
        self.requests += 1;
        self.growth = tokens.saturating_sub(self.tokens);
        self.tokens = tokens;
        if let Some((started, _)) = self.started.filter(|(_, key)| !running(key)) {
            self.lags = [self.requests - started, self.lags[0]];
            self.started = None;
        }
        self
    }
}

/// Every recent session's pace.
pub struct Paces {
    sessions: moka::sync::Cache<SessionId, Arc<Mutex<Pace>>>,
}

impl Default for Paces {
    fn default() -> Paces {
        Paces {
            sessions: moka::sync::Cache::builder()
                .max_capacity(MAX_SESSIONS)
                .time_to_idle(KEPT_FOR)
                .build(),
        }
    }
}

impl Paces {
    /// A request of `session` came with a prompt of `tokens`, `running` whether the summary
    /// of a key is still being made: its pace as it stands now.
    pub fn seen(&self, session: &SessionId, tokens: u64, running: impl Fn(&Key) -> bool) -> Pace {
        let record = self.sessions.get_with_by_ref(session, Arc::default);
        let mut pace = record
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *pace = pace.seen(tokens, running);
        *pace
    }

    /// The session's request `pace` described started the summary of `key`: the first
    /// started while none is being made is timed.
    pub fn started(&self, session: &SessionId, pace: Pace, key: Key) {
        if let Some(record) = self.sessions.get(session) {
            let mut now = record
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if now.started.is_none() {
                now.started = Some((pace.requests, key));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> SessionId {
        ([7; 32], "conversation".into())
    }

    /// A session that grew by `growth` a request, whose last summaries took `lags` requests.
    fn pace(growth: u64, lags: [u64; 2]) -> Pace {
        Pace {
            requests: 10,
            tokens: 50_000,
            growth,
            started: None,
            lags,
        }
    }

    #[test]
    fn a_summary_is_due_early_only_when_the_next_request_would_leave_no_spare_request() {
        // A step landed at 12,800 under a hard line at 21,650, the prompt growing 1,764 a
        // request: the 5th request after it comes within 30 tokens of the line, so 4 fit
        // with half a request to spare.
        let (tokens, hard) = (12_800, 21_650);
        // 4 or 5 requests to be on hand: started at the next request, it would come with
        // the 5th or 6th, no request to spare; started now, with the 4th or 5th.
        assert!(pace(1_764, [5, 4]).summary_due(tokens, hard));
        assert!(pace(1_764, [4, 5]).summary_due(tokens, hard));
        assert!(pace(1_764, [4, 4]).summary_due(tokens, hard));
        // 3: started at the next request, it comes with the 4th, a request to spare.
        assert!(!pace(1_764, [3, 3]).summary_due(tokens, hard));
        // 6 or more: too late even started now; the precompute line decides, as before.
        assert!(!pace(1_764, [6, 4]).summary_due(tokens, hard));
        assert!(!pace(1_764, [30, 30]).summary_due(tokens, hard));
        // Nothing measured yet, or a prompt that did not grow: the precompute line decides.
        assert!(!pace(1_764, [0, 0]).summary_due(tokens, hard));
        assert!(!pace(0, [5, 5]).summary_due(tokens, hard));
        // Far from the hard line, nothing is due yet.
        assert!(!pace(1_764, [5, 5]).summary_due(2_000, hard));
    }

    #[test]
    fn a_lag_is_counted_from_the_request_that_started_the_summary_to_the_first_that_found_it_made()
    {
        let paces = Paces::default();
        let session = session();
        let (made, running) = ([1; 32], [2; 32]);
        let made_or_not = |key: &Key| *key == running;
        let mut pace = paces.seen(&session, 1_000, made_or_not);
        assert_eq!((pace.requests, pace.growth), (1, 1_000));
        pace = paces.seen(&session, 2_500, made_or_not);
        assert_eq!(pace.growth, 1_500);
        paces.started(&session, pace, running);
        // Another start while it is being made is not timed.
        let later = paces.seen(&session, 4_000, made_or_not);
        paces.started(&session, later, made);
        for tokens in [5_500, 7_000] {
            pace = paces.seen(&session, tokens, made_or_not);
        }
        assert_eq!(pace.lags, [0, 0]);
        // Started at request 2, found made at request 6.
        pace = paces.seen(&session, 8_500, |_| false);
        assert_eq!((pace.lags, pace.started), ([4, 0], None));
        // A client that sent less (a session rewritten) grew by nothing.
        pace = paces.seen(&session, 3_000, |_| false);
        assert_eq!((pace.growth, pace.lags), (0, [4, 0]));
        // Another session has its own pace.
        let other = paces.seen(&([8; 32], "conversation".into()), 9_000, |_| false);
        assert_eq!(other.requests, 1);
    }
}
