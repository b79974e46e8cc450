//! Prometheus metrics (names are part of the contract) with bounded label values.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::memo::Memo;
use crate::models::{base_name, ModelInfo};
use crate::routes::Route;

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    /// Each route's `200` series, where nearly all of its requests land, resolved on first
    /// use (so it appears once counted, as any series does) rather than by hashing both
    /// labels under the vector's lock per request.
    requests_ok: [OnceLock<IntCounter>; Route::ALL.len()],
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
    /// Each label's series, so a request looks its label up once rather than per series.
    by_label: Memo<Arc<ModelSeries>>,
}

/// The per-model series of one label. Completion and ratio series are resolved on first
/// use: they appear in the exposition only once upstream has reported usage.
pub struct ModelSeries {
    pub prompt_tokens: IntCounter,
    pub forwarded_tokens: IntCounter,
    pub saved_tokens: IntCounter,
    completion_tokens: OnceLock<IntCounter>,
    token_ratio: OnceLock<Gauge>,
    label: String,
    completion_vec: IntCounterVec,
    ratio_vec: GaugeVec,
}

impl ModelSeries {
    fn new(metrics: &Metrics, label: &str) -> ModelSeries {
        ModelSeries {
            prompt_tokens: metrics.prompt_tokens.with_label_values(&[label]),
            forwarded_tokens: metrics.forwarded_tokens.with_label_values(&[label]),
            saved_tokens: metrics.saved_tokens.with_label_values(&[label]),
            completion_tokens: OnceLock::new(),
            token_ratio: OnceLock::new(),
            label: label.to_string(),
            completion_vec: metrics.completion_tokens.clone(),
            ratio_vec: metrics.token_ratio.clone(),
        }
    }

    pub fn completion_tokens(&self) -> &IntCounter {
        self.completion_tokens
            .get_or_init(|| self.completion_vec.with_label_values(&[&self.label]))
    }

    pub fn token_ratio(&self) -> &Gauge {
        self.token_ratio
            .get_or_init(|| self.ratio_vec.with_label_values(&[&self.label]))
    }
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
            // Labels are bounded by construction: configured names, families, `other`.
            by_label: Memo::new(usize::MAX),
            requests_ok: [const { OnceLock::new() }; Route::ALL.len()],
            registry,
        };
        Ok(metrics)
    }

    /// The series of a model's bounded label: a configured name, else its built-in family,
    /// else `other`.
    pub fn for_model(&self, model: &str, info: &ModelInfo) -> Arc<ModelSeries> {
        let name = base_name(model);
        let label = if self.allowed_models.contains(name.as_ref()) {
            name.as_ref()
        } else {
            info.family.as_deref().unwrap_or("other")
        };
        self.by_label
            .get_or_derive(label, || Arc::new(ModelSeries::new(self, label)))
    }

    pub fn count_request(&self, route: Route, status: StatusCode) {
        let labels = [route.name(), status.as_str()];
        match self.requests_ok.get(route as usize) {
            Some(ok) if status == StatusCode::OK => ok
                .get_or_init(|| self.requests.with_label_values(&labels))
                .inc(),
            _ => self.requests.with_label_values(&labels).inc(),
        }
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
    use crate::config::TokensConfig;
    use crate::models::ModelCatalog;
    use std::collections::BTreeMap;

    fn model_lines(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains("{model="))
            .collect::<Vec<_>>()
    }

    #[test]
    fn model_series_use_bounded_labels_and_appear_when_used() {
        let metrics = Metrics::new(&["Vendor/My-Model".to_string()]).unwrap();
        let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
        let series = |model: &str| metrics.for_model(model, &catalog.resolve(model));
        let mine = series("other-vendor/MY-MODEL");
        mine.prompt_tokens.inc_by(5);
        mine.forwarded_tokens.inc_by(3);
        mine.saved_tokens.inc_by(2);
        series("claude-3-5-sonnet").prompt_tokens.inc_by(7);
        series("anthropic/claude-opus-4").prompt_tokens.inc_by(1);
        series("some-local-model").prompt_tokens.inc();
        assert!(Arc::ptr_eq(&mine, &series("my-model")));
        assert_eq!(
            model_lines(&metrics.render()),
            [
                r#"condenser_forwarded_tokens_total{model="claude"} 0"#,
                r#"condenser_forwarded_tokens_total{model="my-model"} 3"#,
                r#"condenser_forwarded_tokens_total{model="other"} 0"#,
                r#"condenser_prompt_tokens_total{model="claude"} 8"#,
                r#"condenser_prompt_tokens_total{model="my-model"} 5"#,
                r#"condenser_prompt_tokens_total{model="other"} 1"#,
                r#"condenser_saved_tokens_total{model="claude"} 0"#,
                r#"condenser_saved_tokens_total{model="my-model"} 2"#,
                r#"condenser_saved_tokens_total{model="other"} 0"#,
            ]
        );
        mine.completion_tokens().inc_by(4);
        mine.token_ratio().set(1.5);
        let text = metrics.render();
        let lines = model_lines(&text);
        assert!(lines.contains(&r#"condenser_completion_tokens_total{model="my-model"} 4"#));
        assert!(lines.contains(&r#"condenser_token_estimate_ratio{model="my-model"} 1.5"#));
        assert_eq!(lines.len(), 11, "{lines:?}");
    }

    #[test]
    fn requests_are_counted_by_route_and_status_and_appear_when_counted() {
        let metrics = Metrics::new(&[]).unwrap();
        let request_lines = || {
            metrics
                .render()
                .lines()
                .filter(|l| l.starts_with("condenser_requests_total{"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(request_lines(), Vec::<String>::new());
        for (i, route) in Route::ALL.into_iter().enumerate() {
            assert_eq!(route as usize, i, "{route:?}");
            for _ in 0..=i {
                metrics.count_request(route, StatusCode::OK);
            }
        }
        metrics.count_request(Route::ChatCompletions, StatusCode::PAYLOAD_TOO_LARGE);
        metrics.count_request(Route::ChatCompletions, StatusCode::PAYLOAD_TOO_LARGE);
        metrics.count_request(Route::Readyz, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            request_lines(),
            [
                r#"condenser_requests_total{route="chat_completions",status="200"} 4"#,
                r#"condenser_requests_total{route="chat_completions",status="413"} 2"#,
                r#"condenser_requests_total{route="healthz",status="200"} 1"#,
                r#"condenser_requests_total{route="metrics",status="200"} 3"#,
                r#"condenser_requests_total{route="other",status="200"} 6"#,
                r#"condenser_requests_total{route="passthrough",status="200"} 5"#,
                r#"condenser_requests_total{route="readyz",status="200"} 2"#,
                r#"condenser_requests_total{route="readyz",status="503"} 1"#,
            ]
        );
    }

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
