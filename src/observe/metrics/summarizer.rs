//! The summarizer's own series: its failures, its open breakers, its tokens and spend.

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge, Opts};

use super::bill::{count_billed, BillVecs, BilledTokens, SpendKind};
use super::models::{ModelLabel, ModelLabels};
use super::registering::MetricsError;
use crate::error::Refusal;
use crate::tokens::catalog::{ModelInfo, Price};

/// Why a summary was not made, as `condenser_summarizer_failures_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummarizerFailure {
    /// The summarizer answered an error status.
    Status,
    Timeout,
    /// No answer could be had: connecting or reading failed.
    Connection,
    /// An answer without its API's shape.
    Malformed,
    /// A refusal, or a summary that is none.
    Rejected,
    /// Turned away by an open breaker: no call made.
    CircuitOpen,
    /// condenser's own summary job failed.
    Internal,
}

impl SummarizerFailure {
    pub const ALL: [SummarizerFailure; 7] = [
        SummarizerFailure::Status,
        SummarizerFailure::Timeout,
        SummarizerFailure::Connection,
        SummarizerFailure::Malformed,
        SummarizerFailure::Rejected,
        SummarizerFailure::CircuitOpen,
        SummarizerFailure::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SummarizerFailure::Status => "status",
            SummarizerFailure::Timeout => "timeout",
            SummarizerFailure::Connection => "connection",
            SummarizerFailure::Malformed => "malformed",
            SummarizerFailure::Rejected => "rejected",
            SummarizerFailure::CircuitOpen => "circuit_open",
            SummarizerFailure::Internal => "internal",
        }
    }
}

/// The summarizer's direction labels: tokens it was sent, and tokens it wrote.
const SUMMARIZER_DIRECTIONS: [&str; 2] = ["input", "output"];

/// How a summary was asked, as `condenser_summaries_total` labels it: through the session's
/// own cached prefix, or as a prompt of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryVia {
    Session,
    Separate,
}

impl SummaryVia {
    pub const ALL: [SummaryVia; 2] = [SummaryVia::Session, SummaryVia::Separate];

    pub fn as_str(self) -> &'static str {
        match self {
            SummaryVia::Session => "session",
            SummaryVia::Separate => "separate",
        }
    }
}

/// What the summarizer reports of its own health, `condenser_summarizer_failures_total{reason}`
/// and `condenser_summarizer_breakers_open`, and of what it spends,
/// `condenser_summarizer_tokens_total{model,direction}`. All change at most once per summarizer
/// call, so plain Prometheus types do.
#[derive(Clone)]
pub struct SummarizerHealth {
    pub(super) failures: IntCounterVec,
    pub(super) summaries: IntCounterVec,
    /// Caller-and-upstream pairs whose breaker opened and no success has closed since.
    pub breakers_open: IntGauge,
    pub(super) tokens: IntCounterVec,
    bill: BillVecs,
    labels: Arc<ModelLabels>,
}

impl SummarizerHealth {
    /// Every failure reason, and the tokens of every model label known at start, show 0
    /// from start-up. `bill`: the series of the bill, which the requests' share.
    pub(super) fn new(
        labels: Arc<ModelLabels>,
        bill: BillVecs,
    ) -> Result<SummarizerHealth, MetricsError> {
        let health = SummarizerHealth {
            failures: IntCounterVec::new(
                Opts::new(
                    "condenser_summarizer_failures_total",
                    "Summaries not made, by reason: status, timeout, connection, malformed, rejected, circuit_open, internal.",
                ),
                &["reason"],
            )?,
            summaries: IntCounterVec::new(
                Opts::new(
                    "condenser_summaries_total",
                    "Summaries written, by how they were asked (session: through the session's own cached prefix; separate) and outcome: used, or refused by the checks before use, with the reason.",
                ),
                &["via", "outcome", "reason"],
            )?,
            breakers_open: IntGauge::new(
                "condenser_summarizer_breakers_open",
                "Summarizer circuit breakers open (per upstream and caller), until a success closes them.",
            )?,
            tokens: IntCounterVec::new(
                Opts::new(
                    "condenser_summarizer_tokens_total",
                    "Tokens of summarizer calls as the summarizer's usage reports them, by model and direction (input, output).",
                ),
                &["model", "direction"],
            )?,
            bill,
            labels,
        };
        for reason in SummarizerFailure::ALL {
            health.failures.with_label_values(&[reason.as_str()]);
        }
        for via in SummaryVia::ALL {
            health
                .summaries
                .with_label_values(&[via.as_str(), "used", ""]);
            for refusal in Refusal::ALL {
                health
                    .summaries
                    .with_label_values(&[via.as_str(), "refused", refusal.as_str()]);
            }
        }
        for label in health.labels.known() {
            health.count_tokens(label, BilledTokens::default(), None);
        }
        Ok(health)
    }

    /// Unregistered, with only the built-in `other` label: for tests of what reports to it.
    #[cfg(test)]
    pub fn standalone() -> Result<SummarizerHealth, MetricsError> {
        SummarizerHealth::new(
            Arc::new(ModelLabels::new(&[], std::iter::empty::<&str>())),
            BillVecs::new()?,
        )
    }

    /// A summary used.
    pub fn count_summary(&self, via: SummaryVia) {
        self.summaries
            .with_label_values(&[via.as_str(), "used", ""])
            .inc();
    }

    /// A summary written and refused by the checks before use.
    pub fn count_refused(&self, via: SummaryVia, refusal: Refusal) {
        self.summaries
            .with_label_values(&[via.as_str(), "refused", refusal.as_str()])
            .inc();
    }

    pub fn count_failure(&self, reason: SummarizerFailure) {
        self.failures.with_label_values(&[reason.as_str()]).inc();
    }

    /// The summarizer model's bounded label, as `Metrics::for_model` gives a request's.
    pub fn label_for(&self, model: &str, info: &ModelInfo) -> ModelLabel {
        self.labels.resolve(model, info)
    }

    /// One summarizer call's usage, and at `price` (the model's, if configured) what it
    /// cost. Counting zero shows a model's series.
    pub fn count_tokens(&self, label: ModelLabel, tokens: BilledTokens, price: Option<&Price>) {
        let model = self.labels.name(label);
        for (direction, count) in SUMMARIZER_DIRECTIONS
            .into_iter()
            .zip([tokens.prompt(), tokens.output])
        {
            self.tokens
                .with_label_values(&[model, direction])
                .inc_by(count);
        }
        count_billed(&self.bill.billed_series(model), &tokens);
        if let Some(price) = price {
            self.bill
                .spend_series(model, SpendKind::Summarizer)
                .inc_by(tokens.cost(price));
        }
    }
}
