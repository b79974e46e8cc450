//! Prometheus metrics (names are part of the contract) with bounded label values.
//!
//! What every request updates is sharded: each thread adds to cells of its own and a scrape
//! sums them. Atomic adds to one shared counter cost little in instructions but move its
//! cache line between cores on every request, which at full load cost about as much as a
//! tenth of a request's own work. Metrics that change rarely stay plain Prometheus types.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::tokens::catalog::{base_name, ModelInfo};

/// What served a request: its `route` label in metrics and in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Healthz,
    Readyz,
    Metrics,
    ChatCompletions,
    Responses,
    Messages,
    Passthrough,
    Other,
}

impl Route {
    /// In declaration order, so `route as usize` indexes it.
    pub const ALL: [Route; 8] = [
        Route::Healthz,
        Route::Readyz,
        Route::Metrics,
        Route::ChatCompletions,
        Route::Responses,
        Route::Messages,
        Route::Passthrough,
        Route::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Metrics => "metrics",
            Route::ChatCompletions => "chat_completions",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::Passthrough => "passthrough",
            Route::Other => "other",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: RequestCounts,
    models: ModelMetrics,
    pub compactions: IntCounterVec,
    /// Requests retried compacted after upstream's `context_length_exceeded`, by model.
    pub reactive_retries: IntCounterVec,
    pub upstream_seconds: ShardedHistogram,
    pub overhead_seconds: ShardedHistogram,
    pub summarize_seconds: Histogram,
    pub ttft_seconds: ShardedHistogram,
    pub summary_cache_entries: IntGauge,
    pub cache_errors: IntCounter,
    pub upstream_failures: UpstreamFailures,
    pub summarizer_health: SummarizerHealth,
}

/// What the summarizer reports of its own health: `condenser_summarizer_failures_total{reason}`
/// and `condenser_summarizer_breakers_open`. Both change rarely, so plain Prometheus types do.
#[derive(Clone)]
pub struct SummarizerHealth {
    failures: IntCounterVec,
    /// Caller-and-upstream pairs whose breaker opened and no success has closed since.
    pub breakers_open: IntGauge,
}

impl SummarizerHealth {
    pub fn new() -> Result<SummarizerHealth, MetricsError> {
        Ok(SummarizerHealth {
            failures: IntCounterVec::new(
                Opts::new(
                    "condenser_summarizer_failures_total",
                    "Summaries not made, by reason: status, timeout, connection, malformed, rejected, circuit_open.",
                ),
                &["reason"],
            )?,
            breakers_open: IntGauge::new(
                "condenser_summarizer_breakers_open",
                "Summarizer circuit breakers open (per upstream and caller), until a success closes them.",
            )?,
        })
    }

    /// `reason` is one of a fixed few, so the label stays bounded.
    pub fn count_failure(&self, reason: &'static str) {
        self.failures.with_label_values(&[reason]).inc();
    }
}

/// Why an upstream exchange failed, as `condenser_upstream_failures_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No connection could be made.
    Connect,
    /// No answer, or a silence within a body, past the upstream timeout.
    Timeout,
    /// A reply that breaks HTTP's rules: framing, an unrequested upgrade, an oversized head.
    Malformed,
    /// The connection closed or reset before the reply was complete.
    Reset,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Malformed => "malformed",
            FailureKind::Reset => "reset",
        }
    }
}

/// `condenser_upstream_failures_total{kind}`. Failures are rare, so a plain counter does.
#[derive(Clone)]
pub struct UpstreamFailures(IntCounterVec);

impl UpstreamFailures {
    pub fn new() -> Result<UpstreamFailures, MetricsError> {
        Ok(UpstreamFailures(IntCounterVec::new(
            Opts::new(
                "condenser_upstream_failures_total",
                "Upstream exchanges that failed, by kind: connect, timeout, malformed, reset.",
            ),
            &["kind"],
        )?))
    }

    pub fn count(&self, kind: FailureKind) {
        self.0.with_label_values(&[kind.as_str()]).inc();
    }
}

/// One shard's cell, aligned to 128 bytes: the adjacent-line prefetcher moves cache lines
/// in pairs, so cells only 64 bytes apart would still bounce between cores.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

/// A cell per shard, where the calling thread's updates go. Threads beyond the shard
/// count share cells: still exact, as every update is an atomic add, only contended again.
struct Sharded<T> {
    cells: Box<[Padded<T>]>,
}

impl<T: Default> Sharded<T> {
    fn new() -> Sharded<T> {
        Sharded {
            cells: (0..shard_count()).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> Sharded<T> {
    fn local(&self) -> &T {
        &self.cells[thread_shard()].0
    }

    fn cells(&self) -> impl Iterator<Item = &T> {
        self.cells.iter().map(|cell| &cell.0)
    }
}

/// Workers default to one per CPU; twice as many shards keep each worker on its own even
/// when other threads (tests', a runtime's helpers) took shards first.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| 2 * std::thread::available_parallelism().map_or(1, usize::from))
}

/// Handed out round-robin on a thread's first update, so the workers of one process,
/// started together, land on distinct shards.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % shard_count();
    }
    SHARD.with(|shard| *shard)
}

/// A shard's histogram cell holds this many finite buckets, so that its counts and sum fit
/// in fixed arrays rather than behind a pointer of their own.
const MAX_BUCKETS: usize = 15;

#[derive(Default)]
struct HistogramCell {
    /// Observations by bucket, not cumulative, so that each adds to one count; the last
    /// counts those above every bound.
    counts: [AtomicU64; MAX_BUCKETS + 1],
    /// An `f64`, as its bits.
    sum: AtomicU64,
}

struct HistogramCore {
    desc: Desc,
    bounds: Vec<f64>,
    shards: Sharded<HistogramCell>,
}

/// A histogram exposed exactly as `prometheus::Histogram` is. Clones share the counts, so
/// the registry can hold one.
#[derive(Clone)]
pub struct ShardedHistogram(Arc<HistogramCore>);

impl ShardedHistogram {
    fn new(name: &str, help: &str, bounds: Vec<f64>) -> Result<ShardedHistogram, MetricsError> {
        if bounds.len() > MAX_BUCKETS || !bounds.windows(2).all(|pair| pair[0] < pair[1]) {
            return Err(prometheus::Error::Msg(format!(
                "{name}: buckets must increase and number at most {MAX_BUCKETS}"
            ))
            .into());
        }
        Ok(ShardedHistogram(Arc::new(HistogramCore {
            desc: Desc::new(name.into(), help.into(), Vec::new(), HashMap::new())?,
            bounds,
            shards: Sharded::new(),
        })))
    }

    pub fn observe(&self, value: f64) {
        let core = &*self.0;
        let bucket = core
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(core.bounds.len());
        let cell = core.shards.local();
        cell.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // Only this thread writes this cell, unless threads outnumber shards: the exchange
        // succeeds first time.
        let _ = cell
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

impl Collector for ShardedHistogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let core = &*self.0;
        let mut counts = [0; MAX_BUCKETS + 1];
        let mut sum = 0.0;
        for cell in core.shards.cells() {
            for (total, count) in counts.iter_mut().zip(&cell.counts) {
                *total += count.load(Ordering::Relaxed);
            }
            sum += f64::from_bits(cell.sum.load(Ordering::Relaxed));
        }
        let mut cumulative = 0;
        let buckets = core
            .bounds
            .iter()
            .zip(counts)
            .map(|(bound, count)| {
                cumulative += count;
                let mut bucket = proto::Bucket::default();
                bucket.set_cumulative_count(cumulative);
                bucket.set_upper_bound(*bound);
                bucket
            })
            .collect();
        let mut histogram = proto::Histogram::default();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(counts.iter().sum());
        histogram.set_sample_sum(sum);
        let mut metric = proto::Metric::default();
        metric.set_histogram(histogram);
        vec![family(&core.desc, MetricType::HISTOGRAM, vec![metric])]
    }
}

struct RequestCore {
    /// Statuses other than `200`, rare enough to share a vector.
    others: IntCounterVec,
    /// Each route's `200`s, where nearly every request lands, by `route as usize`.
    ok: Sharded<[AtomicU64; Route::ALL.len()]>,
}

/// `condenser_requests_total`, by route and status.
#[derive(Clone)]
struct RequestCounts(Arc<RequestCore>);

impl RequestCounts {
    fn count(&self, route: Route, status: StatusCode) {
        if status == StatusCode::OK {
            self.0.ok.local()[route as usize].fetch_add(1, Ordering::Relaxed);
        } else {
            self.0
                .others
                .with_label_values(&[route.name(), status.as_str()])
                .inc();
        }
    }
}

impl Collector for RequestCounts {
    fn desc(&self) -> Vec<&Desc> {
        self.0.others.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.0.others.collect();
        let mut ok = [0; Route::ALL.len()];
        for cell in self.0.ok.cells() {
            for (total, count) in ok.iter_mut().zip(cell) {
                *total += count.load(Ordering::Relaxed);
            }
        }
        if let Some(requests) = families.first_mut() {
            // A `200` series appears once counted, as any series of the vector does.
            for (route, count) in Route::ALL.into_iter().zip(ok) {
                if count > 0 {
                    requests.mut_metric().push(counter(
                        &[("route", route.name()), ("status", "200")],
                        count,
                    ));
                }
            }
        }
        families
    }
}

/// A model's bounded label: cheap to resolve per request and to keep for its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLabel(usize);

#[derive(Default)]
struct TokenCell {
    prompt: AtomicU64,
    forwarded: AtomicU64,
    saved: AtomicU64,
    completion: AtomicU64,
    /// The series appear once counted, zero or not, and stay.
    prompt_counted: AtomicBool,
    completion_counted: AtomicBool,
}

/// A cell's counts, summed over shards.
#[derive(Default)]
struct TokenTotals {
    prompt: u64,
    forwarded: u64,
    saved: u64,
    completion: u64,
    prompt_counted: bool,
    completion_counted: bool,
}

#[derive(Default)]
struct RatioCell {
    /// An `f64`, as its bits.
    value: AtomicU64,
    set: AtomicBool,
}

/// The series of one `model` label.
pub struct ModelSeries {
    label: Box<str>,
    tokens: Sharded<TokenCell>,
    /// A gauge, so not shardable, but rewritten only when it changes; padded so that its
    /// writes leave the fields above, read by every request, shared.
    ratio: Padded<RatioCell>,
}

impl ModelSeries {
    fn new(label: Box<str>) -> ModelSeries {
        ModelSeries {
            label,
            tokens: Sharded::new(),
            ratio: Padded::default(),
        }
    }

    /// The `model` label value of this series.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Prompt tokens received and forwarded, and the difference as saved.
    pub fn count_prompt(&self, received: u64, forwarded: u64) {
        let cell = self.tokens.local();
        cell.prompt.fetch_add(received, Ordering::Relaxed);
        cell.forwarded.fetch_add(forwarded, Ordering::Relaxed);
        cell.saved
            .fetch_add(received.saturating_sub(forwarded), Ordering::Relaxed);
        cell.prompt_counted.store(true, Ordering::Release);
    }

    pub fn count_completion(&self, tokens: u64) {
        let cell = self.tokens.local();
        cell.completion.fetch_add(tokens, Ordering::Relaxed);
        cell.completion_counted.store(true, Ordering::Release);
    }

    /// Leaves the cell untouched when the ratio is unchanged, as it mostly is once
    /// smoothed, so that every core can keep its copy of the line.
    pub fn set_token_ratio(&self, ratio: f64) {
        let cell = &self.ratio.0;
        let bits = ratio.to_bits();
        if !cell.set.load(Ordering::Relaxed) || cell.value.load(Ordering::Relaxed) != bits {
            cell.value.store(bits, Ordering::Relaxed);
            cell.set.store(true, Ordering::Release);
        }
    }

    fn token_ratio(&self) -> Option<f64> {
        let cell = &self.ratio.0;
        cell.set
            .load(Ordering::Acquire)
            .then(|| f64::from_bits(cell.value.load(Ordering::Relaxed)))
    }

    fn token_totals(&self) -> TokenTotals {
        let mut totals = TokenTotals::default();
        for cell in self.tokens.cells() {
            // The flags first: a count they publish is then read too.
            totals.prompt_counted |= cell.prompt_counted.load(Ordering::Acquire);
            totals.completion_counted |= cell.completion_counted.load(Ordering::Acquire);
            totals.prompt += cell.prompt.load(Ordering::Relaxed);
            totals.forwarded += cell.forwarded.load(Ordering::Relaxed);
            totals.saved += cell.saved.load(Ordering::Relaxed);
            totals.completion += cell.completion.load(Ordering::Relaxed);
        }
        totals
    }
}

struct ModelDescs {
    prompt: Desc,
    forwarded: Desc,
    saved: Desc,
    completion: Desc,
    ratio: Desc,
}

struct ModelCore {
    /// Configured names, each its own label.
    configured: HashMap<Box<str>, ModelLabel>,
    /// Every label by name: configured names, families, `other`. All are known at start,
    /// so a request resolves its label without a lock or an allocation.
    labels: HashMap<Box<str>, ModelLabel>,
    other: ModelLabel,
    /// By label index.
    series: Box<[ModelSeries]>,
    descs: ModelDescs,
}

/// The per-model series, their series appearing once counted.
#[derive(Clone)]
struct ModelMetrics(Arc<ModelCore>);

impl ModelMetrics {
    fn new<F: AsRef<str>>(
        configured: &[String],
        families: impl IntoIterator<Item = F>,
    ) -> Result<ModelMetrics, MetricsError> {
        let mut names: Vec<Box<str>> = Vec::new();
        let mut labels: HashMap<Box<str>, ModelLabel> = HashMap::new();
        let mut intern = |name: &str| {
            *labels.entry(name.into()).or_insert_with(|| {
                names.push(name.into());
                ModelLabel(names.len() - 1)
            })
        };
        let configured = configured
            .iter()
            .map(|model| {
                let name = base_name(model);
                (Box::from(name.as_ref()), intern(&name))
            })
            .collect();
        for family in families {
            intern(family.as_ref());
        }
        let other = intern("other");
        let desc = |name: &str, help: &str| {
            Desc::new(
                name.into(),
                help.into(),
                vec!["model".into()],
                HashMap::new(),
            )
        };
        let descs = ModelDescs {
            prompt: desc(
                "condenser_prompt_tokens_total",
                "Prompt tokens as received from clients.",
            )?,
            forwarded: desc(
                "condenser_forwarded_tokens_total",
                "Prompt tokens as sent upstream.",
            )?,
            saved: desc(
                "condenser_saved_tokens_total",
                "Prompt tokens removed by compaction (received - forwarded).",
            )?,
            completion: desc(
                "condenser_completion_tokens_total",
                "Completion tokens reported by upstream usage.",
            )?,
            ratio: desc(
                "condenser_token_estimate_ratio",
                "Upstream-reported prompt tokens over condenser's own count, smoothed.",
            )?,
        };
        Ok(ModelMetrics(Arc::new(ModelCore {
            configured,
            labels,
            other,
            series: names.into_iter().map(ModelSeries::new).collect(),
            descs,
        })))
    }
}

impl Collector for ModelMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let d = &self.0.descs;
        vec![&d.prompt, &d.forwarded, &d.saved, &d.completion, &d.ratio]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (mut prompt, mut forwarded, mut saved, mut completion, mut ratio) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for series in self.0.series.iter() {
            let labels = [("model", series.label.as_ref())];
            let totals = series.token_totals();
            if totals.prompt_counted {
                prompt.push(counter(&labels, totals.prompt));
                forwarded.push(counter(&labels, totals.forwarded));
                saved.push(counter(&labels, totals.saved));
            }
            if totals.completion_counted {
                completion.push(counter(&labels, totals.completion));
            }
            if let Some(value) = series.token_ratio() {
                let mut gauge = proto::Gauge::default();
                gauge.set_value(value);
                let mut metric = labelled(&labels);
                metric.set_gauge(gauge);
                ratio.push(metric);
            }
        }
        let d = &self.0.descs;
        vec![
            family(&d.prompt, MetricType::COUNTER, prompt),
            family(&d.forwarded, MetricType::COUNTER, forwarded),
            family(&d.saved, MetricType::COUNTER, saved),
            family(&d.completion, MetricType::COUNTER, completion),
            family(&d.ratio, MetricType::GAUGE, ratio),
        ]
    }
}

fn family(desc: &Desc, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

/// Labels in name order, as a Prometheus vector orders them.
fn labelled(labels: &[(&str, &str)]) -> proto::Metric {
    proto::Metric::from_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name((*name).to_string());
                pair.set_value((*value).to_string());
                pair
            })
            .collect(),
    )
}

fn counter(labels: &[(&str, &str)], value: u64) -> proto::Metric {
    let mut counter = proto::Counter::default();
    counter.set_value(value as f64);
    let mut metric = labelled(labels);
    metric.set_counter(counter);
    metric
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
    /// `families` are every family the model catalog can resolve to: with the configured
    /// names and `other`, all the `model` labels there can be.
    pub fn new<F: AsRef<str>>(
        configured_models: &[String],
        families: impl IntoIterator<Item = F>,
    ) -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let register = |collector: Box<dyn Collector>| registry.register(collector);
        let sharded_histogram =
            |name: &str, help: &str, buckets: Vec<f64>| -> Result<ShardedHistogram, MetricsError> {
                let h = ShardedHistogram::new(name, help, buckets)?;
                register(Box::new(h.clone()))?;
                Ok(h)
            };
        let requests = RequestCounts(Arc::new(RequestCore {
            others: IntCounterVec::new(
                Opts::new(
                    "condenser_requests_total",
                    "Requests served, by route and HTTP status.",
                ),
                &["route", "status"],
            )?,
            ok: Sharded::new(),
        }));
        register(Box::new(requests.clone()))?;
        let models = ModelMetrics::new(configured_models, families)?;
        register(Box::new(models.clone()))?;
        let metrics = Metrics {
            requests,
            models,
            compactions: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "condenser_compactions_total",
                        "Chat requests compacted, by action (summarized, trimmed) and summary cache outcome.",
                    ),
                    &["action", "cache"],
                )?;
                register(Box::new(c.clone()))?;
                c
            },
            reactive_retries: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "condenser_reactive_retries_total",
                        "Requests retried once, compacted, after upstream answered that the prompt was too long.",
                    ),
                    &["model"],
                )?;
                register(Box::new(c.clone()))?;
                c
            },
            upstream_seconds: sharded_histogram(
                "condenser_upstream_seconds",
                "Time from sending a request upstream to its response head.",
                doubling(0.01, 14, 80.0),
            )?,
            overhead_seconds: sharded_histogram(
                "condenser_overhead_seconds",
                "Proxy time outside upstream and summarizer calls: parse, count, plan, rewrite, cache.",
                doubling(0.000_05, 13, 0.25),
            )?,
            summarize_seconds: {
                let h = Histogram::with_opts(
                    HistogramOpts::new(
                        "condenser_summarize_seconds",
                        "Summarizer calls, each including any chunked folding.",
                    )
                    .buckets(doubling(0.01, 14, 80.0)),
                )?;
                register(Box::new(h.clone()))?;
                h
            },
            ttft_seconds: sharded_histogram(
                "condenser_ttft_seconds",
                "Time to the first streamed byte of a chat completion, from the request's arrival.",
                doubling(0.001, 14, 10.0),
            )?,
            summary_cache_entries: {
                let g = IntGauge::new(
                    "condenser_summary_cache_entries",
                    "Summaries held in the in-memory cache.",
                )?;
                register(Box::new(g.clone()))?;
                g
            },
            cache_errors: {
                let c = IntCounter::new(
                    "condenser_cache_errors_total",
                    "Faults of the shared (Redis) summary cache.",
                )?;
                register(Box::new(c.clone()))?;
                c
            },
            upstream_failures: {
                let failures = UpstreamFailures::new()?;
                register(Box::new(failures.0.clone()))?;
                failures
            },
            summarizer_health: {
                let health = SummarizerHealth::new()?;
                register(Box::new(health.failures.clone()))?;
                register(Box::new(health.breakers_open.clone()))?;
                health
            },
            registry,
        };
        Ok(metrics)
    }

    /// A model's bounded label: a configured name, else its family, else `other` (as is a
    /// family unknown at start, which `ModelCatalog::families` rules out).
    pub fn for_model(&self, model: &str, info: &ModelInfo) -> ModelLabel {
        let core = &*self.models.0;
        if let Some(label) = core.configured.get(base_name(model).as_ref()) {
            return *label;
        }
        info.family
            .as_deref()
            .and_then(|family| core.labels.get(family))
            .copied()
            .unwrap_or(core.other)
    }

    pub fn model(&self, label: ModelLabel) -> &ModelSeries {
        &self.models.0.series[label.0]
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
    use super::*;
    use crate::tokens::catalog::ModelCatalog;
    use crate::tokens::catalog::{ModelOverride, TokensConfig};
    use std::collections::BTreeMap;

    fn catalog() -> ModelCatalog {
        ModelCatalog::new(BTreeMap::new(), TokensConfig::default())
    }

    fn model_lines(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains("{model="))
            .collect::<Vec<_>>()
    }

    fn lines_of<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(metric)).collect()
    }

    #[test]
    fn model_series_use_bounded_labels_and_appear_when_used() {
        let overrides =
            BTreeMap::from([("Corp/Local-Model".to_string(), ModelOverride::default())]);
        let catalog = ModelCatalog::new(overrides, TokensConfig::default());
        let metrics = Metrics::new(&["Vendor/My-Model".to_string()], catalog.families()).unwrap();
        let label = |model: &str| metrics.for_model(model, &catalog.resolve(model));
        let mine = label("other-vendor/MY-MODEL");
        assert_eq!(mine, label("my-model"));
        assert_ne!(label("Corp/Local-Model"), label("some-local-model"));
        assert_eq!(model_lines(&metrics.render()), Vec::<&str>::new());
        metrics.model(mine).count_prompt(5, 3);
        metrics.model(label("claude-3-5-sonnet")).count_prompt(7, 7);
        metrics
            .model(label("anthropic/claude-opus-4"))
            .count_prompt(1, 1);
        metrics.model(label("some-local-model")).count_prompt(1, 0);
        metrics.model(label("Corp/Local-Model")).count_prompt(2, 5);
        assert_eq!(
            model_lines(&metrics.render()),
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
        metrics.model(mine).set_token_ratio(1.5);
        let text = metrics.render();
        let lines = model_lines(&text);
        assert!(lines.contains(&r#"condenser_completion_tokens_total{model="my-model"} 4"#));
        assert!(lines.contains(&r#"condenser_completion_tokens_total{model="claude"} 0"#));
        assert!(lines.contains(&r#"condenser_token_estimate_ratio{model="my-model"} 1.5"#));
        assert_eq!(lines.len(), 15, "{lines:?}");
    }

    #[test]
    fn a_token_ratio_reads_back_whether_new_unchanged_or_changed() {
        let catalog = catalog();
        let metrics = Metrics::new(&[], catalog.families()).unwrap();
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
    fn requests_are_counted_by_route_and_status_and_appear_when_counted() {
        let metrics = Metrics::new(&[], catalog().families()).unwrap();
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
                r#"condenser_requests_total{route="messages",status="200"} 6"#,
                r#"condenser_requests_total{route="metrics",status="200"} 3"#,
                r#"condenser_requests_total{route="other",status="200"} 8"#,
                r#"condenser_requests_total{route="passthrough",status="200"} 7"#,
                r#"condenser_requests_total{route="readyz",status="200"} 2"#,
                r#"condenser_requests_total{route="readyz",status="503"} 1"#,
                r#"condenser_requests_total{route="responses",status="200"} 5"#,
            ]
        );
    }

    #[test]
    fn updates_from_many_threads_are_all_exposed() {
        const THREADS: u64 = 8;
        const ROUNDS: u64 = 1_000;
        const SMALL: f64 = 1.0 / 4096.0;
        let catalog = catalog();
        let metrics = Metrics::new(&["mine".to_string()], catalog.families()).unwrap();
        let info = catalog.resolve("mine");
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (metrics, info) = (&metrics, &info);
                scope.spawn(move || {
                    for round in 0..ROUNDS {
                        let series = metrics.model(metrics.for_model("mine", info));
                        series.count_prompt(10, 7);
                        series.count_completion(thread);
                        metrics.count_request(Route::ChatCompletions, StatusCode::OK);
                        if round % 100 == 0 {
                            metrics.count_request(Route::ChatCompletions, StatusCode::BAD_GATEWAY);
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
    fn sharded_histograms_expose_what_prometheus_histograms_do() {
        let buckets = doubling(0.001, 14, 10.0);
        let ours = ShardedHistogram::new("h", "Help.", buckets.clone()).unwrap();
        let theirs =
            Histogram::with_opts(HistogramOpts::new("h", "Help.").buckets(buckets)).unwrap();
        for value in [
            0.0,
            0.001,
            0.0011,
            0.3,
            9.99,
            10.0,
            10.5,
            1e9,
            -1.0,
            0.1 + 0.2,
        ] {
            ours.observe(value);
            theirs.observe(value);
        }
        let text = |families: Vec<MetricFamily>| {
            let mut out = Vec::new();
            TextEncoder::new().encode(&families, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text(ours.collect()), text(theirs.collect()));
        assert!(
            ShardedHistogram::new("h", "Help.", doubling(0.001, MAX_BUCKETS + 1, 1e9)).is_err()
        );
        assert!(ShardedHistogram::new("h", "Help.", vec![1.0, 1.0]).is_err());
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
