//! The summarizer's circuit breakers, one per upstream and caller: enough failures in a row
//! turn summarizing off for that pair for a while, and a success turns it back on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::compaction::summary::{hex, Key};
use crate::config::SummarizerConfig;
use crate::error::SummarizeError;
use crate::observe::metrics::SummarizerHealth;

/// An upstream's base URL and a caller's identity hash.
pub type BreakerKey = (String, Key);

#[derive(Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    /// Opened and not closed by a success since, half-open included: its opening was
    /// logged and counted, and only its closing is news.
    opened: bool,
}

pub struct Breakers {
    /// Consecutive failures that open a breaker.
    threshold: u32,
    cooldown: Duration,
    /// Only upstream-and-caller pairs with failures since their last success.
    open: Mutex<HashMap<BreakerKey, Breaker>>,
    health: SummarizerHealth,
}

impl Breakers {
    pub fn new(config: &SummarizerConfig, health: SummarizerHealth) -> Breakers {
        Breakers {
            threshold: config.breaker_failures,
            cooldown: Duration::from_secs(config.breaker_cooldown_secs),
            open: Mutex::new(HashMap::new()),
            health,
        }
    }

    /// Whether a summary may be asked of this upstream for this caller.
    pub fn check(&self, key: &BreakerKey) -> Result<(), SummarizeError> {
        let Ok(mut breakers) = self.open.lock() else {
            return Ok(());
        };
        let Some(breaker) = breakers.get_mut(key) else {
            return Ok(());
        };
        match breaker.open_until {
            Some(until) if Instant::now() < until => {
                Err(SummarizeError::CircuitOpen(key.0.clone()))
            }
            Some(_) => {
                // Half-open: let this one try; one more failure re-opens at once.
                breaker.open_until = None;
                breaker.failures = self.threshold.saturating_sub(1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A summary's outcome: a success closes the breaker, enough failures open it.
    pub fn record(&self, key: &BreakerKey, success: bool) {
        let Ok(mut breakers) = self.open.lock() else {
            return;
        };
        let caller = &hex(&key.1)[..16];
        if success {
            // A healthy pair keeps no entry, so the map holds only callers seeing faults.
            if breakers.remove(key).is_some_and(|breaker| breaker.opened) {
                self.health.breakers_open.dec();
                tracing::info!(
                    upstream = key.0,
                    caller,
                    "summarizer circuit closed: summaries are made again"
                );
            }
            return;
        }
        let breaker = breakers.entry(key.clone()).or_default();
        breaker.failures += 1;
        if breaker.failures >= self.threshold.max(1) && breaker.open_until.is_none() {
            let cooldown = self.cooldown;
            breaker.open_until = Some(Instant::now() + cooldown);
            if breaker.opened {
                // A half-open try failed: still the same outage, already logged.
                tracing::debug!(upstream = key.0, caller, "summarizer circuit open again");
            } else {
                breaker.opened = true;
                self.health.breakers_open.inc();
                tracing::warn!(
                    upstream = key.0,
                    caller,
                    failures = breaker.failures,
                    cooldown_secs = cooldown.as_secs(),
                    "summarizer circuit open: compaction falls back until a summary succeeds"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects what `tracing` writes on this thread while `f` runs.
    fn logs_of(f: impl FnOnce()) -> String {
        let logs = tempfile::NamedTempFile::new().unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(logs.reopen().unwrap())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        std::fs::read_to_string(logs.path()).unwrap()
    }

    #[test]
    fn a_breaker_logs_and_counts_its_opening_and_its_closing_once_each() {
        let config = SummarizerConfig {
            breaker_failures: 2,
            // Half-open at once, so the test needs no clock.
            breaker_cooldown_secs: 0,
            ..SummarizerConfig::default()
        };
        let health = SummarizerHealth::standalone().unwrap();
        let breakers = Breakers::new(&config, health.clone());
        let key = ("http://llm.test".to_string(), [7; 32]);
        let outage = logs_of(|| {
            // Two failures open it; each half-open try fails again, as in a long outage.
            for _ in 0..20 {
                breakers.check(&key).unwrap();
                breakers.record(&key, false);
            }
        });
        let lines: Vec<&str> = outage.lines().collect();
        assert_eq!(lines.len(), 1, "{outage}");
        assert!(lines[0].contains("WARN"), "{outage}");
        assert!(lines[0].contains("summarizer circuit open"), "{outage}");
        assert_eq!(health.breakers_open.get(), 1);
        let recovery = logs_of(|| {
            breakers.check(&key).unwrap();
            breakers.record(&key, true);
            breakers.check(&key).unwrap();
            breakers.record(&key, true);
        });
        let lines: Vec<&str> = recovery.lines().collect();
        assert_eq!(lines.len(), 1, "{recovery}");
        assert!(lines[0].contains("INFO"), "{recovery}");
        assert!(lines[0].contains("summarizer circuit closed"), "{recovery}");
        assert_eq!(health.breakers_open.get(), 0);
        // One failure short of the threshold opens nothing and logs nothing.
        let blip = logs_of(|| breakers.record(&key, false));
        assert_eq!(blip, "");
        assert_eq!(health.breakers_open.get(), 0);
    }

    #[test]
    fn the_breaker_opens_for_one_caller_of_an_upstream_only() {
        let config = SummarizerConfig::default();
        let breakers = Breakers::new(&config, SummarizerHealth::standalone().unwrap());
        let upstream = "http://llm.test".to_string();
        let (a, b) = ((upstream.clone(), [1; 32]), (upstream, [2; 32]));
        for _ in 0..config.breaker_failures {
            assert!(breakers.check(&a).is_ok());
            breakers.record(&a, false);
        }
        assert!(matches!(
            breakers.check(&a),
            Err(SummarizeError::CircuitOpen(_))
        ));
        assert!(breakers.check(&b).is_ok());
        breakers.record(&b, true);
        assert_eq!(
            breakers.open.lock().unwrap().len(),
            1,
            "a healthy caller keeps no entry"
        );
    }
}
