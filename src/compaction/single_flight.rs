//! One summarizer job per summary, however many requests need it: in this replica, the jobs
//! in flight, which a request joins while one runs and which a job leaves however it ends;
//! across replicas, with Redis, a lock that lets one make it while the others wait.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::FutureExt;

use crate::compaction::cache::SummaryCache;
use crate::compaction::forms::SharedSummary;
use crate::compaction::plan::Split;
use crate::compaction::redis::LockOutcome;
use crate::compaction::summary::{Key, Summary};
use crate::error::SummarizeError;

/// Poll interval while another replica makes a summary this one needs.
const REMOTE_POLL: Duration = Duration::from_millis(100);

/// The summaries being made in this replica, by key.
#[derive(Default)]
pub struct InFlight(Mutex<HashMap<Key, SharedSummary>>);

impl InFlight {
    /// Once every summary being made has landed.
    pub async fn settled(&self) {
        loop {
            let pending: Vec<SharedSummary> = match self.0.lock() {
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

    /// The latest-ending summary being made for one of the split's candidate ends.
    pub fn pending(&self, split: &Split, keys: &[Key]) -> Option<(usize, SharedSummary)> {
        let in_flight = self.0.lock().ok()?;
        split
            .summary_ends
            .iter()
            .rev()
            .find_map(|&end| Some((end, in_flight.get(&keys[end - 1])?.clone())))
    }

    /// Whether the summary of `key` is being made in this replica.
    pub fn running(&self, key: &Key) -> bool {
        self.0
            .lock()
            .is_ok_and(|in_flight| in_flight.contains_key(key))
    }

    /// The one job for `key`, started now with what `make` makes unless already running. The
    /// job runs on its own task, so a client that goes away strands nobody.
    pub fn start<Made>(self: &Arc<Self>, key: Key, make: impl FnOnce() -> Made) -> SharedSummary
    where
        Made: Future<Output = Result<Arc<Summary>, SummarizeError>> + Send + 'static,
    {
        let Ok(mut in_flight) = self.0.lock() else {
            let error = SummarizeError::Internal("summary bookkeeping poisoned".into());
            return futures_util::future::ready(Err(error)).boxed().shared();
        };
        if let Some(running) = in_flight.get(&key) {
            return running.clone();
        }
        // However the job ends, even by panic, it stops being the one others join.
        let finished = InFlightEntry {
            in_flight: self.clone(),
            key,
        };
        let made = make();
        let task = tokio::spawn(async move {
            let _finished = finished;
            made.await
        });
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
}

struct InFlightEntry {
    in_flight: Arc<InFlight>,
    key: Key,
}

impl Drop for InFlightEntry {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.in_flight.0.lock() {
            in_flight.remove(&self.key);
        }
    }
}

/// With Redis, one replica makes a given summary while the others wait for it; if the maker
/// dies its lock, held for `hold`, expires and a waiter makes it instead. Without Redis, or
/// with Redis unreachable, this replica makes it.
pub async fn once_across_replicas<Made>(
    cache: &SummaryCache,
    key: &Key,
    hold: Duration,
    make: impl FnOnce() -> Made,
) -> Result<Arc<Summary>, SummarizeError>
where
    Made: Future<Output = Result<Arc<Summary>, SummarizeError>>,
{
    let Some(shared) = cache.shared() else {
        return make().await;
    };
    loop {
        match shared.try_lock(key, hold).await {
            LockOutcome::HeldElsewhere => {
                tokio::time::sleep(REMOTE_POLL).await;
                if let Some(summary) = cache.get(key).await {
                    return Ok(summary);
                }
            }
            LockOutcome::Acquired(token) => {
                let result = make().await;
                shared.unlock(key, &token).await;
                return result;
            }
            LockOutcome::Unavailable => return make().await,
        }
    }
}
