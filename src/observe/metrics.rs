//! Prometheus metrics (names are part of the contract) with bounded label values.
//!
//! Every metric is the prometheus crate's own type. Those every request updates are atomic
//! adds to memory every worker shares, which moves their cache lines between cores: that
//! costs no instructions, and at full load about as much as a tenth of a request's own work,
//! which a request waiting seconds on an LLM does not see.
//!
//! The families whose types have more to them than a vector each are rooms of their own:
//! `models.rs` (the per-model series under bounded labels), `bill.rs`, `summarizer.rs`,
//! `upstream.rs` (failed exchanges) and `observed.rs` (observe mode's would-be requests).

mod bill;
mod models;
mod observed;
mod registering;
mod summarizer;
mod upstream;

use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::tokens::catalog::ModelInfo;
pub use bill::BilledTokens;
use bill::{BillVecs, SpendKind};
pub use models::{ModelLabel, ModelSeries};
use models::{ModelLabels, ModelVecs};
pub use observed::ObservedSeries;
pub use registering::MetricsError;
use registering::{registered, series};
pub use summarizer::{SummarizerFailure, SummarizerHealth, SummaryVia};
pub use upstream::{FailureKind, UpstreamFailures};

/// What served a request: its `route` label in metrics and in the log. Each dialect names
/// its own (`Dialect::ROUTE`); the constants are condenser's other routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(&'static str);

impl Route {
    pub const HEALTHZ: Route = Route("healthz");
    pub const READYZ: Route = Route("readyz");
    pub const METRICS: Route = Route("metrics");
    pub const PASSTHROUGH: Route = Route("passthrough");
    pub const OTHER: Route = Route("other");
    /// The routes no dialect serves.
    const OWN: [Route; 5] = [
        Route::HEALTHZ,
        Route::READYZ,
        Route::METRICS,
        Route::PASSTHROUGH,
        Route::OTHER,
    ];

    /// A dialect's route, labelled `name`.
    pub const fn named(name: &'static str) -> Route {
        Route(name)
    }

    pub fn name(self) -> &'static str {
        self.0
    }
}

/// What became of a recall call: `condenser_recalls_total`'s `outcome` label.
pub const RECALL_OUTCOMES: [&str; 4] = ["served", "error", "skipped", "failed"];

/// Every dialect route's recall series, shown at zero before the first call.
fn with_every_recall_series(recalls: IntCounterVec, dialect_routes: &[Route]) -> IntCounterVec {
    for route in dialect_routes {
        for outcome in RECALL_OUTCOMES {
            recalls.with_label_values(&[route.name(), outcome]);
        }
    }
    recalls
}

pub struct Metrics {
    registry: Registry,
    requests: RequestCounts,
    labels: Arc<ModelLabels>,
    /// By label index.
    models: Box<[ModelSeries]>,
    pub compactions: IntCounterVec,
    /// How each compacted request found its form, by outcome (`compaction::forms::Found`).
    pub forms: IntCounterVec,
    /// Requests retried compacted after upstream's `context_length_exceeded`, by model.
    pub reactive_retries: IntCounterVec,
    /// Recall calls, by route and outcome (`RECALL_OUTCOMES`).
    pub recalls: IntCounterVec,
    pub upstream_seconds: Histogram,
    pub overhead_seconds: Histogram,
    pub summarize_seconds: Histogram,
    pub ttft_seconds: Histogram,
    pub summary_cache_entries: IntGauge,
    pub cache_errors: IntCounter,
    /// Stream events larger than `server.max_event_bytes`, relayed uninspected.
    pub uninspected_events: IntCounter,
    pub upstream_failures: UpstreamFailures,
    pub summarizer_health: SummarizerHealth,
    /// What `auto` would have done with observed requests.
    pub observed: ObservedSeries,
}

/// `condenser_requests_total`, by route and status.
struct RequestCounts {
    vec: IntCounterVec,
    /// Each route's `200`s, where nearly every request lands: condenser's own routes and
    /// the dialects', all known at start.
    ok: Vec<(Route, OnceLock<IntCounter>)>,
}

impl RequestCounts {
    /// `route`'s `200` series, shown at 0 until its first request.
    fn show(&self, route: Route) {
        if let Some((_, cell)) = self.ok.iter().find(|(known, _)| *known == route) {
            series(cell, &self.vec, &[route.name(), "200"]);
        }
    }

    fn count(&self, route: Route, status: StatusCode) {
        let ok = (status == StatusCode::OK)
            .then(|| self.ok.iter().find(|(known, _)| *known == route))
            .flatten();
        match ok {
            Some((_, cell)) => series(cell, &self.vec, &[route.name(), "200"]).inc(),
            None => self
                .vec
                .with_label_values(&[route.name(), status.as_str()])
                .inc(),
        }
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

impl Metrics {
    /// `families` are every family the model catalog can resolve to: with the configured
    /// names and `other`, all the `model` labels there can be. `dialect_routes` are the
    /// registered dialects' routes, whose series are known before their first request.
    ///
    /// Every counter the shipped dashboard and alert rules read shows from start-up, at 0
    /// for each label value known then: a series that appears only with its first event
    /// hides, until then, whether it is zero or missing, and a rate over it starts late.
    pub fn new<F: AsRef<str>>(
        configured_models: &[String],
        families: impl IntoIterator<Item = F>,
        dialect_routes: impl IntoIterator<Item = Route>,
    ) -> Result<Metrics, MetricsError> {
        let dialect_routes: Vec<Route> = dialect_routes.into_iter().collect();
        let registry = Registry::new();
        let counters = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels)?,
            )
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            registered(
                &registry,
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?,
            )
        };
        let requests = RequestCounts {
            vec: counters(
                "condenser_requests_total",
                "Requests served, by route and HTTP status.",
                &["route", "status"],
            )?,
            ok: Route::OWN
                .into_iter()
                .chain(dialect_routes.iter().copied())
                .map(|route| (route, OnceLock::new()))
                .collect(),
        };
        // The routes of model traffic, which the alert rules read.
        for route in dialect_routes.iter().chain([&Route::PASSTHROUGH]) {
            requests.show(*route);
        }
        let bill = BillVecs::new()?;
        registered(&registry, bill.billed.clone())?;
        registered(&registry, bill.spend.clone())?;
        let vecs = ModelVecs::new(&registry, bill.clone())?;
        let labels = Arc::new(ModelLabels::new(configured_models, families));
        let models: Box<[ModelSeries]> = labels
            .names
            .iter()
            .map(|label| ModelSeries::new(label.clone(), vecs.clone()))
            .collect();
        let summarizer_health = SummarizerHealth::new(labels.clone(), bill)?;
        registered(&registry, summarizer_health.failures.clone())?;
        registered(&registry, summarizer_health.summaries.clone())?;
        registered(&registry, summarizer_health.breakers_open.clone())?;
        registered(&registry, summarizer_health.tokens.clone())?;
        let reactive_retries = counters(
            "condenser_reactive_retries_total",
            "Requests retried once, compacted, after upstream answered that the prompt was too long.",
            &["model"],
        )?;
        // Counting zero shows a series; the learned ratio has no value before a reply's
        // usage, so its gauge waits for one.
        for label in labels.known() {
            let series = &models[label.0];
            series.count_prompt(0, 0);
            series.count_completion(0);
            series.count_cached(0);
            series.count_bill(&BilledTokens::default(), None);
            // Spend too, priced or not: the dashboard's spend panel reads it before any
            // price is configured, and an unpriced model's stays at 0.
            for kind in SpendKind::ALL {
                series.vecs.bill.spend_series(series.label(), kind);
            }
            reactive_retries.with_label_values(&[labels.name(label)]);
        }
        let observed = ObservedSeries::new(&registry, labels.clone())?;
        Ok(Metrics {
            requests,
            labels,
            models,
            compactions: counters(
                "condenser_compactions_total",
                "Chat requests compacted, by action (summarized, trimmed) and summary cache outcome.",
                &["action", "cache"],
            )?,
            forms: counters(
                "condenser_forms_total",
                "Compacted requests by how they found the form they went with: kept (the form in use), stepped (to a new summary), cut (more of the middle's outputs cut), stand_in (rounds folded into a stand-in summary), as_sent. stepped near the request rate means the form in use is not found.",
                &["outcome"],
            )?,
            reactive_retries,
            recalls: with_every_recall_series(counters(
                "condenser_recalls_total",
                "Recall calls, by route and outcome: served, error (a tool error to the model), skipped (the reply also called the client's tools), failed (the continuation upstream failed).",
                &["route", "outcome"],
            )?, &dialect_routes),
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
            summary_cache_entries: registered(
                &registry,
                IntGauge::new(
                    "condenser_summary_cache_entries",
                    "Summaries held in the in-memory cache.",
                )?,
            )?,
            cache_errors: registered(
                &registry,
                IntCounter::new(
                    "condenser_cache_errors_total",
                    "Faults of the shared (Redis) summary cache.",
                )?,
            )?,
            uninspected_events: registered(
                &registry,
                IntCounter::new(
                    "condenser_uninspected_events_total",
                    "Stream events larger than server.max_event_bytes, relayed as they came without being read.",
                )?,
            )?,
            upstream_failures: {
                let failures = UpstreamFailures::new()?;
                registered(&registry, failures.0.clone())?;
                failures
            },
            summarizer_health,
            observed,
            registry,
        })
    }

    /// A model's bounded label (`ModelLabels::resolve`).
    pub fn for_model(&self, model: &str, info: &ModelInfo) -> ModelLabel {
        self.labels.resolve(model, info)
    }

    pub fn model(&self, label: ModelLabel) -> &ModelSeries {
        &self.models[label.0]
    }

    /// A priced model's spend, of both kinds, at 0 until its first reply.
    pub fn show_spend(&self, label: ModelLabel) {
        let series = self.model(label);
        for kind in SpendKind::ALL {
            series.vecs.bill.spend_series(series.label(), kind);
        }
    }

    pub fn count_request(&self, route: Route, status: StatusCode) {
        self.requests.count(route, status);
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
    use super::bill::BILLED_TIERS;
    use super::observed::{OBSERVED_BREAKS, OBSERVED_TIERS};
    use super::*;
    use crate::tokens::catalog::{ModelCatalog, Price};
    use crate::tokens::catalog::{ModelOverride, TokensConfig};
    use std::collections::BTreeMap;

    fn catalog() -> ModelCatalog {
        ModelCatalog::new(BTreeMap::new(), TokensConfig::default())
    }

    /// What the state is built with.
    fn dialect_routes() -> impl Iterator<Item = Route> {
        crate::dialect::DIALECTS.iter().map(|wire| wire.route)
    }

    const CHAT: Route = <crate::dialect::chat::Chat as crate::dialect::stages::Dialect>::ROUTE;

    fn model_lines(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains("{model="))
            .collect::<Vec<_>>()
    }

    fn lines_of<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(metric)).collect()
    }

    #[test]
    fn model_series_use_bounded_labels_and_show_the_known_ones_from_start() {
        let overrides =
            BTreeMap::from([("Corp/Local-Model".to_string(), ModelOverride::default())]);
        let catalog = ModelCatalog::new(overrides, TokensConfig::default());
        let metrics = Metrics::new(
            &["Vendor/My-Model".to_string()],
            catalog.families(),
            dialect_routes(),
        )
        .unwrap();
        let label = |model: &str| metrics.for_model(model, &catalog.resolve(model));
        let mine = label("other-vendor/MY-MODEL");
        assert_eq!(mine, label("my-model"));
        assert_ne!(label("Corp/Local-Model"), label("some-local-model"));
        // The configured name and `other` show from start-up; no family does.
        let known = |metric: &str| {
            [
                format!(r#"{metric}{{model="my-model"}} 0"#),
                format!(r#"{metric}{{model="other"}} 0"#),
            ]
        };
        let mut at_start: Vec<String> = [
            "condenser_cached_prompt_tokens_total",
            "condenser_completion_tokens_total",
            "condenser_forwarded_tokens_total",
            "condenser_prompt_tokens_total",
            "condenser_reactive_retries_total",
            "condenser_saved_tokens_total",
        ]
        .into_iter()
        .flat_map(known)
        .collect();
        for model in ["my-model", "other"] {
            for tier in BILLED_TIERS {
                at_start.push(format!(
                    r#"condenser_prompt_tokens_billed_total{{model="{model}",tier="{tier}"}} 0"#
                ));
            }
            for tier in OBSERVED_TIERS {
                at_start.push(format!(
                    r#"condenser_observed_bill_tokens_total{{model="{model}",tier="{tier}"}} 0"#
                ));
            }
            for reason in OBSERVED_BREAKS {
                at_start.push(format!(
                    r#"condenser_observed_breaks_total{{model="{model}",reason="{reason}"}} 0"#
                ));
            }
            at_start.push(format!(
                r#"condenser_observed_forwarded_tokens_total{{model="{model}"}} 0"#
            ));
        }
        at_start.sort();
        assert_eq!(model_lines(&metrics.render()), at_start);
        metrics.model(mine).count_prompt(5, 3);
        metrics.model(label("claude-3-5-sonnet")).count_prompt(7, 7);
        metrics
            .model(label("anthropic/claude-opus-4"))
            .count_prompt(1, 1);
        metrics.model(label("some-local-model")).count_prompt(1, 0);
        metrics.model(label("Corp/Local-Model")).count_prompt(2, 5);
        let text = metrics.render();
        let counted: Vec<&str> = model_lines(&text)
            .into_iter()
            .filter(|l| {
                ["forwarded", "prompt", "saved"]
                    .iter()
                    .any(|m| l.starts_with(&format!("condenser_{m}_tokens_total")))
            })
            .collect();
        assert_eq!(
            counted,
            [
                r#"condenser_forwarded_tokens_total{model="claude"} 8"#,
                r#"condenser_forwarded_tokens_total{model="local-model"} 5"#,
                r#"condenser_forwarded_tokens_total{model="my-model"} 3"#,
                r#"condenser_forwarded_tokens_total{model="other"} 0"#,
                r#"condenser_prompt_tokens_total{model="claude"} 8"#,
                r#"condenser_prompt_tokens_total{model="local-model"} 2"#,
                r#"condenser_prompt_tokens_total{model="my-model"} 5"#,
                r#"condenser_prompt_tokens_total{model="other"} 1"#,
                r#"condenser_saved_tokens_total{model="claude"} 0"#,
                r#"condenser_saved_tokens_total{model="local-model"} 0"#,
                r#"condenser_saved_tokens_total{model="my-model"} 2"#,
                r#"condenser_saved_tokens_total{model="other"} 1"#,
            ]
        );
        metrics.model(mine).count_completion(4);
        metrics.model(label("claude-x")).count_completion(0);
        metrics.model(mine).count_cached(3);
        metrics.model(mine).set_token_ratio(1.5);
        let text = metrics.render();
        let lines = model_lines(&text);
        assert!(lines.contains(&r#"condenser_completion_tokens_total{model="my-model"} 4"#));
        assert!(lines.contains(&r#"condenser_completion_tokens_total{model="claude"} 0"#));
        assert!(lines.contains(&r#"condenser_cached_prompt_tokens_total{model="my-model"} 3"#));
        assert!(lines.contains(&r#"condenser_token_estimate_ratio{model="my-model"} 1.5"#));
        // The 30 known from start (12 of them observe mode's), 2 families × 3 prompt series,
        // claude's completion, the ratio.
        assert_eq!(lines.len(), 38, "{lines:?}");
    }

    #[test]
    fn the_bill_counts_every_reply_by_tier_and_prices_it_by_kind() {
        let catalog = catalog();
        let metrics = Metrics::new(
            &["priced".to_string()],
            catalog.families(),
            dialect_routes(),
        )
        .unwrap();
        let label = metrics.for_model("priced", &catalog.resolve("priced"));
        let value = |series: &str| -> Option<f64> {
            let text = metrics.render();
            let line = lines_of(&text, &format!("{series} ")).pop()?.to_string();
            line.rsplit(' ').next()?.parse().ok()
        };
        let spend = |kind: &str| {
            value(&format!(
                r#"condenser_spend_total{{kind="{kind}",model="priced"}}"#
            ))
        };
        let billed = |tier: &str| {
            value(&format!(
                r#"condenser_prompt_tokens_billed_total{{model="priced",tier="{tier}"}}"#
            ))
        };
        // Tiers show for a known label from start-up, and spend, before a price is known.
        assert_eq!(billed("cache_write"), Some(0.0));
        metrics.show_spend(label);
        assert_eq!(
            (spend("session"), spend("summarizer")),
            (Some(0.0), Some(0.0))
        );

        let price = Price {
            input: 3.0,
            cache_read: 0.3,
            cache_write: 3.75,
            output: 15.0,
        };
        let tokens = BilledTokens {
            uncached: 1_000,
            cache_read: 100_000,
            cache_write: 20_000,
            output: 2_000,
        };
        // 0.003 + 0.03 + 0.075 + 0.03
        let cost = 0.138;
        assert!((tokens.cost(&price) - cost).abs() < 1e-12);
        let series = metrics.model(label);
        series.count_bill(&tokens, Some(&price));
        series.count_bill(&tokens, Some(&price));
        // A model without a price: its tokens are billed all the same, at no known cost.
        series.count_bill(&tokens, None);
        metrics
            .summarizer_health
            .count_tokens(label, tokens, Some(&price));
        let near = |got: Option<f64>, want: f64| got.is_some_and(|got| (got - want).abs() < 1e-9);
        assert!(near(spend("session"), 2.0 * cost), "{:?}", spend("session"));
        assert!(near(spend("summarizer"), cost), "{:?}", spend("summarizer"));
        assert_eq!(billed("uncached"), Some(4_000.0));
        assert_eq!(billed("cache_read"), Some(400_000.0));
        assert_eq!(billed("cache_write"), Some(80_000.0));
        let input = r#"condenser_summarizer_tokens_total{direction="input",model="priced"}"#;
        assert_eq!(value(input), Some(121_000.0));
    }

    #[test]
    fn a_token_ratio_reads_back_whether_new_unchanged_or_changed() {
        let catalog = catalog();
        let metrics = Metrics::new(&[], catalog.families(), dialect_routes()).unwrap();
        let series = metrics.model(metrics.for_model("gpt-4o", &catalog.resolve("gpt-4o")));
        let ratio = || lines_of(&metrics.render(), "condenser_token_estimate_ratio{").join("\n");
        assert_eq!(ratio(), "");
        // Zero has the bits of a cell never set: it must appear all the same.
        series.set_token_ratio(0.0);
        assert_eq!(
            ratio(),
            r#"condenser_token_estimate_ratio{model="gpt-4o"} 0"#
        );
        for value in [1.25, 1.25, 0.75, 0.75, 1.25] {
            series.set_token_ratio(value);
            assert_eq!(
                ratio(),
                format!(r#"condenser_token_estimate_ratio{{model="gpt-4o"}} {value}"#)
            );
        }
    }

    #[test]
    fn requests_are_counted_by_route_and_status_and_model_routes_show_from_start() {
        let metrics = Metrics::new(&[], catalog().families(), dialect_routes()).unwrap();
        let request_lines = || {
            metrics
                .render()
                .lines()
                .filter(|l| l.starts_with("condenser_requests_total{"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        // The routes of model traffic, which the alert rules read, at 0.
        let mut at_start: Vec<String> = dialect_routes()
            .chain([Route::PASSTHROUGH])
            .map(|route| {
                format!(
                    r#"condenser_requests_total{{route="{}",status="200"}} 0"#,
                    route.name()
                )
            })
            .collect();
        at_start.sort();
        assert_eq!(request_lines(), at_start);
        let mut expected = vec![
            r#"condenser_requests_total{route="chat_completions",status="413"} 2"#.to_string(),
            r#"condenser_requests_total{route="readyz",status="503"} 1"#.to_string(),
            r#"condenser_requests_total{route="unregistered",status="200"} 1"#.to_string(),
        ];
        let known: Vec<Route> = Route::OWN.into_iter().chain(dialect_routes()).collect();
        for (i, route) in known.into_iter().enumerate() {
            for _ in 0..=i {
                metrics.count_request(route, StatusCode::OK);
            }
            expected.push(format!(
                r#"condenser_requests_total{{route="{}",status="200"}} {}"#,
                route.name(),
                i + 1
            ));
        }
        metrics.count_request(CHAT, StatusCode::PAYLOAD_TOO_LARGE);
        metrics.count_request(CHAT, StatusCode::PAYLOAD_TOO_LARGE);
        metrics.count_request(Route::READYZ, StatusCode::SERVICE_UNAVAILABLE);
        metrics.count_request(Route::named("unregistered"), StatusCode::OK);
        expected.sort();
        assert_eq!(request_lines(), expected);
    }

    #[test]
    fn updates_from_many_threads_are_all_exposed() {
        const THREADS: u64 = 8;
        const ROUNDS: u64 = 1_000;
        const SMALL: f64 = 1.0 / 4096.0;
        let catalog = catalog();
        let metrics =
            Metrics::new(&["mine".to_string()], catalog.families(), dialect_routes()).unwrap();
        let info = catalog.resolve("mine");
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (metrics, info) = (&metrics, &info);
                scope.spawn(move || {
                    for round in 0..ROUNDS {
                        let series = metrics.model(metrics.for_model("mine", info));
                        series.count_prompt(10, 7);
                        series.count_completion(thread);
                        metrics.count_request(CHAT, StatusCode::OK);
                        if round % 100 == 0 {
                            metrics.count_request(CHAT, StatusCode::BAD_GATEWAY);
                        }
                        // Powers of two: their sums are exact in any order.
                        metrics.overhead_seconds.observe(SMALL);
                        metrics
                            .overhead_seconds
                            .observe(if round % 2 == 0 { 0.5 } else { 0.0 });
                    }
                });
            }
        });
        let text = metrics.render();
        let n = THREADS * ROUNDS;
        for (metric, value) in [
            (r#"condenser_prompt_tokens_total{model="mine"}"#, 10 * n),
            (r#"condenser_forwarded_tokens_total{model="mine"}"#, 7 * n),
            (r#"condenser_saved_tokens_total{model="mine"}"#, 3 * n),
            (
                r#"condenser_completion_tokens_total{model="mine"}"#,
                ROUNDS * (0..THREADS).sum::<u64>(),
            ),
            (
                r#"condenser_requests_total{route="chat_completions",status="200"}"#,
                n,
            ),
            (
                r#"condenser_requests_total{route="chat_completions",status="502"}"#,
                n / 100,
            ),
            (r#"condenser_overhead_seconds_bucket{le="0.00005"}"#, n / 2),
            (r#"condenser_overhead_seconds_bucket{le="0.0002"}"#, n / 2),
            (
                r#"condenser_overhead_seconds_bucket{le="0.0004"}"#,
                3 * n / 2,
            ),
            (r#"condenser_overhead_seconds_bucket{le="0.25"}"#, 3 * n / 2),
            (r#"condenser_overhead_seconds_bucket{le="+Inf"}"#, 2 * n),
            ("condenser_overhead_seconds_count", 2 * n),
        ] {
            assert_eq!(lines_of(&text, metric), [format!("{metric} {value}")]);
        }
        let sum = SMALL * n as f64 + 0.5 * (n / 2) as f64;
        assert_eq!(
            lines_of(&text, "condenser_overhead_seconds_sum"),
            [format!("condenser_overhead_seconds_sum {sum}")]
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
