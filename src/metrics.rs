//! Prometheus metrics (names are part of the contract) with bounded label values.

use std::collections::HashSet;

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::models::{base_name, ModelInfo};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub compactions: IntCounterVec,
    pub prompt_tokens: IntCounterVec,
    pub forwarded_tokens: IntCounterVec,
    pub saved_tokens: IntCounterVec,
    pub completion_tokens: IntCounterVec,
    pub upstream_seconds: Histogram,
    pub overhead_seconds: Histogram,
    pub summarize_seconds: Histogram,
    pub ttft_seconds: Histogram,
    pub summary_cache_entries: IntGauge,
    pub cache_errors: IntCounter,
    pub token_ratio: GaugeVec,
    allowed_models: HashSet<String>,
}

/// `start`, `start × 2`, … for `count` buckets, then `last`.
fn doubling(start: f64, count: usize, last: f64) -> Vec<f64> {
    let mut buckets: Vec<f64> = (0..count)
        .map(|i| start * f64::powi(2.0, i as i32))
        .collect();
    buckets.retain(|b| *b < last);
    buckets.push(last);
    buckets
}

#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    pub fn new(allowed_models: &[String]) -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let counter_vec =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, MetricsError> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let histogram =
            |name: &str, help: &str, buckets: Vec<f64>| -> Result<Histogram, MetricsError> {
                let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        let model = &["model"];
        let metrics = Metrics {
            requests: counter_vec(
                "condenser_requests_total",
                "Requests served, by route and HTTP status.",
                &["route", "status"],
            )?,
            compactions: counter_vec(
                "condenser_compactions_total",
                "Chat requests compacted, by action (summarized, trimmed) and summary cache outcome.",
                &["action", "cache"],
            )?,
            prompt_tokens: counter_vec(
                "condenser_prompt_tokens_total",
                "Prompt tokens as received from clients.",
                model,
            )?,
            forwarded_tokens: counter_vec(
                "condenser_forwarded_tokens_total",
                "Prompt tokens as sent upstream.",
                model,
            )?,
            saved_tokens: counter_vec(
                "condenser_saved_tokens_total",
                "Prompt tokens removed by compaction (received - forwarded).",
                model,
            )?,
            completion_tokens: counter_vec(
                "condenser_completion_tokens_total",
                "Completion tokens reported by upstream usage.",
                model,
            )?,
            upstream_seconds: histogram(
                "condenser_upstream_seconds",
                "Time from sending a request upstream to its response head.",
                doubling(0.01, 14, 80.0),
            )?,
            overhead_seconds: histogram(
                "condenser_overhead_seconds",
                "Proxy time outside upstream and summarizer calls: parse, count, plan, rewrite, cache.",
                doubling(0.000_05, 13, 0.25),
            )?,
            summarize_seconds: histogram(
                "condenser_summarize_seconds",
                "Summarizer calls, each including any chunked folding.",
                doubling(0.01, 14, 80.0),
            )?,
            ttft_seconds: histogram(
                "condenser_ttft_seconds",
                "Time to the first streamed byte of a chat completion, from the request's arrival.",
                doubling(0.001, 14, 10.0),
            )?,
            summary_cache_entries: {
                let g = IntGauge::new(
                    "condenser_summary_cache_entries",
                    "Summaries held in the in-memory cache.",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            cache_errors: {
                let c = IntCounter::new(
                    "condenser_cache_errors_total",
                    "Faults of the shared (Redis) summary cache.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            token_ratio: {
                let g = GaugeVec::new(
                    Opts::new(
                        "condenser_token_estimate_ratio",
                        "Upstream-reported prompt tokens over condenser's own count, smoothed.",
                    ),
                    model,
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            allowed_models: allowed_models
                .iter()
                .map(|m| base_name(m).into_owned())
                .collect(),
            registry,
        };
        Ok(metrics)
    }

    /// A bounded label for a model: a configured name, else its built-in family, else `other`.
    pub fn model_label(&self, model: &str, info: &ModelInfo) -> String {
        let name = base_name(model);
        if self.allowed_models.contains(name.as_ref()) {
            return name.into_owned();
        }
        info.family.as_deref().unwrap_or("other").to_string()
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_span_the_documented_ranges() {
        let b = doubling(0.000_05, 13, 0.25);
        assert_eq!(b.first().copied(), Some(0.000_05));
        assert_eq!(b.last().copied(), Some(0.25));
        let b = doubling(0.01, 14, 80.0);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(b.last().copied(), Some(80.0));
    }
}
