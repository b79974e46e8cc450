//! The per-model series, under bounded `model` labels known at start-up.

use std::collections::HashMap;
use std::sync::OnceLock;

use prometheus::{Counter, Gauge, GaugeVec, IntCounter, IntCounterVec, Opts, Registry};

use super::bill::{count_billed, BillVecs, BilledTokens, SpendKind};
use super::registering::{registered, series, MetricsError};
use crate::tokens::catalog::{base_name, ModelInfo, Price};

/// A model's bounded label: cheap to resolve per request and to keep for its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLabel(pub(super) usize);

/// The vectors of the per-model series, labelled by `model`.
#[derive(Clone)]
pub(super) struct ModelVecs {
    prompt: IntCounterVec,
    forwarded: IntCounterVec,
    saved: IntCounterVec,
    completion: IntCounterVec,
    cached: IntCounterVec,
    ratio: GaugeVec,
    pub(super) bill: BillVecs,
}

impl ModelVecs {
    /// The vectors of the per-model series, registered in `registry` (the bill's apart).
    pub(super) fn new(registry: &Registry, bill: BillVecs) -> Result<ModelVecs, MetricsError> {
        let counter = |name: &str, help: &str| {
            registered(
                registry,
                IntCounterVec::new(Opts::new(name, help), &["model"])?,
            )
        };
        Ok(ModelVecs {
            prompt: counter(
                "condenser_prompt_tokens_total",
                "Prompt tokens as received from clients.",
            )?,
            forwarded: counter(
                "condenser_forwarded_tokens_total",
                "Prompt tokens as sent upstream.",
            )?,
            saved: counter(
                "condenser_saved_tokens_total",
                "Prompt tokens removed by compaction (received - forwarded).",
            )?,
            completion: counter(
                "condenser_completion_tokens_total",
                "Completion tokens reported by upstream usage.",
            )?,
            cached: counter(
                "condenser_cached_prompt_tokens_total",
                "Prompt tokens upstream usage reports served from the provider's prompt cache.",
            )?,
            ratio: registered(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "condenser_token_estimate_ratio",
                        "Upstream-reported prompt tokens over condenser's own count, smoothed.",
                    ),
                    &["model"],
                )?,
            )?,
            bill,
        })
    }
}

/// Prompt tokens received, forwarded and saved: counted together, so they appear together.
struct PromptSeries {
    prompt: IntCounter,
    forwarded: IntCounter,
    saved: IntCounter,
}

/// The series of one `model` label.
pub struct ModelSeries {
    label: Box<str>,
    pub(super) vecs: ModelVecs,
    prompt: OnceLock<PromptSeries>,
    completion: OnceLock<IntCounter>,
    cached: OnceLock<IntCounter>,
    ratio: OnceLock<Gauge>,
    billed: OnceLock<[IntCounter; 3]>,
    spend: OnceLock<Counter>,
}

impl ModelSeries {
    /// The series of the label `label`, each made on its first update.
    pub(super) fn new(label: Box<str>, vecs: ModelVecs) -> ModelSeries {
        ModelSeries {
            label,
            vecs,
            prompt: OnceLock::new(),
            completion: OnceLock::new(),
            cached: OnceLock::new(),
            ratio: OnceLock::new(),
            billed: OnceLock::new(),
            spend: OnceLock::new(),
        }
    }

    /// The `model` label value of this series.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Prompt tokens received and forwarded, and the difference as saved.
    pub fn count_prompt(&self, received: u64, forwarded: u64) {
        let labels = [self.label.as_ref()];
        let series = self.prompt.get_or_init(|| PromptSeries {
            prompt: self.vecs.prompt.with_label_values(&labels),
            forwarded: self.vecs.forwarded.with_label_values(&labels),
            saved: self.vecs.saved.with_label_values(&labels),
        });
        series.prompt.inc_by(received);
        series.forwarded.inc_by(forwarded);
        series.saved.inc_by(received.saturating_sub(forwarded));
    }

    pub fn count_completion(&self, tokens: u64) {
        series(&self.completion, &self.vecs.completion, &[&self.label]).inc_by(tokens);
    }

    pub fn count_cached(&self, tokens: u64) {
        series(&self.cached, &self.vecs.cached, &[&self.label]).inc_by(tokens);
    }

    /// A reply's prompt tokens by tier, and at `price` (its model's, if configured) what the
    /// reply cost.
    pub fn count_bill(&self, tokens: &BilledTokens, price: Option<&Price>) {
        let billed = self
            .billed
            .get_or_init(|| self.vecs.bill.billed_series(&self.label));
        count_billed(billed, tokens);
        if let Some(price) = price {
            self.spend_series().inc_by(tokens.cost(price));
        }
    }

    fn spend_series(&self) -> &Counter {
        self.spend
            .get_or_init(|| self.vecs.bill.spend_series(&self.label, SpendKind::Session))
    }

    /// Leaves the gauge untouched when the ratio is unchanged, as it mostly is once
    /// smoothed, so that every core can keep its copy of the line.
    pub fn set_token_ratio(&self, ratio: f64) {
        let gauge = series(&self.ratio, &self.vecs.ratio, &[&self.label]);
        if gauge.get().to_bits() != ratio.to_bits() {
            gauge.set(ratio);
        }
    }
}

/// The bounded `model` labels, all known at start: configured names, families, `other`. A
/// request resolves its label without a lock or an allocation.
pub struct ModelLabels {
    /// Configured names, each its own label.
    configured: HashMap<Box<str>, ModelLabel>,
    /// Every label by name.
    labels: HashMap<Box<str>, ModelLabel>,
    other: ModelLabel,
    /// By label index.
    pub(super) names: Box<[Box<str>]>,
}

impl ModelLabels {
    /// `families` are every family the model catalog can resolve to: with the `configured`
    /// names and `other`, all the `model` labels there can be.
    pub fn new<F: AsRef<str>>(
        configured: &[String],
        families: impl IntoIterator<Item = F>,
    ) -> ModelLabels {
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
        ModelLabels {
            configured,
            labels,
            other,
            names: names.into(),
        }
    }

    /// A model's label: a configured name, else its family, else `other` (as is a family
    /// unknown at start, which `ModelCatalog::families` rules out).
    pub fn resolve(&self, model: &str, info: &ModelInfo) -> ModelLabel {
        // With no name configured (the default) the base name is not worked out: saves about
        // 170 instructions per chat request (bench/instructions.sh).
        let configured = (!self.configured.is_empty())
            .then(|| self.configured.get(base_name(model).as_ref()))
            .flatten();
        if let Some(label) = configured {
            return *label;
        }
        info.family
            .as_deref()
            .and_then(|family| self.labels.get(family))
            .copied()
            .unwrap_or(self.other)
    }

    pub(super) fn name(&self, label: ModelLabel) -> &str {
        &self.names[label.0]
    }

    /// The labels whose series show from start-up: those the operator named, and `other`.
    /// A family's show once a request of it is counted, or the dashboard would list every
    /// family the catalog knows.
    pub(super) fn known(&self) -> impl Iterator<Item = ModelLabel> + '_ {
        self.configured.values().copied().chain([self.other])
    }
}
