//! Observe mode's series: what `auto` would have forwarded and billed.

use std::sync::Arc;

use prometheus::{IntCounterVec, Opts, Registry};

use super::models::{ModelLabel, ModelLabels};
use super::registering::{registered, MetricsError};

/// The tiers of the would-be bill: the share of a request that repeats the one before it
/// (`cache_read`), and the rest.
pub(super) const OBSERVED_TIERS: [&str; 2] = ["uncached", "cache_read"];

/// Why a would-be request does not repeat the whole of the one before it.
pub(super) const OBSERVED_BREAKS: [&str; 3] = ["client_change", "summary_step", "cut_step"];

/// What `auto` would have forwarded and billed, in observe mode, by model:
/// `condenser_observed_forwarded_tokens_total{model}`,
/// `condenser_observed_bill_tokens_total{model,tier}` and
/// `condenser_observed_breaks_total{model,reason}`. Counted off the request's path.
pub struct ObservedSeries {
    forwarded: IntCounterVec,
    bill: IntCounterVec,
    breaks: IntCounterVec,
    labels: Arc<ModelLabels>,
}

impl ObservedSeries {
    pub(super) fn new(
        registry: &Registry,
        labels: Arc<ModelLabels>,
    ) -> Result<ObservedSeries, MetricsError> {
        let counters = |name: &str, help: &str, names: &[&str]| {
            registered(registry, IntCounterVec::new(Opts::new(name, help), names)?)
        };
        let series = ObservedSeries {
            forwarded: counters(
                "condenser_observed_forwarded_tokens_total",
                "Observe mode: prompt tokens auto would have forwarded.",
                &["model"],
            )?,
            bill: counters(
                "condenser_observed_bill_tokens_total",
                "Observe mode: prompt tokens auto would have had billed, by tier: cache_read (the share that repeats the request before it) and uncached.",
                &["model", "tier"],
            )?,
            breaks: counters(
                "condenser_observed_breaks_total",
                "Observe mode: would-be requests that do not repeat the whole of the one before, by reason: client_change, summary_step, cut_step.",
                &["model", "reason"],
            )?,
            labels,
        };
        for label in series.labels.known() {
            series.count(label, 0, 0, None);
        }
        Ok(series)
    }

    /// One observed request: what auto would have forwarded, of it what repeats the request
    /// before, and why it does not repeat all of it, when it does not.
    pub fn count(&self, label: ModelLabel, forwarded: u64, cached: u64, cache_break: Option<&str>) {
        let model = self.labels.name(label);
        self.forwarded.with_label_values(&[model]).inc_by(forwarded);
        for (tier, tokens) in OBSERVED_TIERS
            .into_iter()
            .zip([forwarded.saturating_sub(cached), cached])
        {
            self.bill.with_label_values(&[model, tier]).inc_by(tokens);
        }
        for reason in OBSERVED_BREAKS {
            let series = self.breaks.with_label_values(&[model, reason]);
            if cache_break == Some(reason) {
                series.inc();
            }
        }
    }
}
