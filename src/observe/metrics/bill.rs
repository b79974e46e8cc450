//! The bill: prompt tokens by the tier their provider bills them at, and their cost.

use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, Opts};

use super::registering::MetricsError;
use crate::tokens::catalog::Price;

/// `condenser_prompt_tokens_billed_total`'s `tier` labels, in [`BilledTokens::prompt_tiers`]
/// order.
pub(super) const BILLED_TIERS: [&str; 3] = ["uncached", "cache_read", "cache_write"];

/// One reply's tokens as its provider bills them: the prompt by tier, and the output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BilledTokens {
    /// Neither served from the provider's prompt cache nor written to it.
    pub uncached: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub output: u64,
}

impl BilledTokens {
    pub fn prompt(&self) -> u64 {
        self.uncached + self.cache_read + self.cache_write
    }

    fn prompt_tiers(&self) -> [u64; 3] {
        [self.uncached, self.cache_read, self.cache_write]
    }

    /// What the tokens cost at `price` (per million tokens).
    pub fn cost(&self, price: &Price) -> f64 {
        let tiers = [
            (self.uncached, price.input),
            (self.cache_read, price.cache_read),
            (self.cache_write, price.cache_write),
            (self.output, price.output),
        ];
        tiers
            .into_iter()
            .map(|(tokens, per_million)| tokens as f64 * per_million)
            .sum::<f64>()
            / 1e6
    }
}

/// Whose calls a spend paid for: `condenser_spend_total`'s `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendKind {
    /// The clients' requests, as forwarded.
    Session,
    /// condenser's own summarizer calls.
    Summarizer,
}

impl SpendKind {
    pub(super) const ALL: [SpendKind; 2] = [SpendKind::Session, SpendKind::Summarizer];

    fn as_str(self) -> &'static str {
        match self {
            SpendKind::Session => "session",
            SpendKind::Summarizer => "summarizer",
        }
    }
}

/// The bill: `condenser_prompt_tokens_billed_total{model,tier}` for every reply upstream
/// billed (the summarizer's included), and `condenser_spend_total{model,kind}` for those of
/// a priced model.
#[derive(Clone)]
pub(super) struct BillVecs {
    pub(super) billed: IntCounterVec,
    pub(super) spend: CounterVec,
}

impl BillVecs {
    pub(super) fn new() -> Result<BillVecs, MetricsError> {
        Ok(BillVecs {
            billed: IntCounterVec::new(
                Opts::new(
                    "condenser_prompt_tokens_billed_total",
                    "Prompt tokens upstream usage reports, by tier: uncached, cache_read (served from the provider's prompt cache), cache_write (written to it). Summarizer calls included.",
                ),
                &["model", "tier"],
            )?,
            spend: CounterVec::new(
                Opts::new(
                    "condenser_spend_total",
                    "What upstream usage cost at the configured prices, in their currency, by kind: session (the clients' requests), summarizer. 0 for a model without a price.",
                ),
                &["model", "kind"],
            )?,
        })
    }

    pub(super) fn billed_series(&self, model: &str) -> [IntCounter; 3] {
        BILLED_TIERS.map(|tier| self.billed.with_label_values(&[model, tier]))
    }

    pub(super) fn spend_series(&self, model: &str, kind: SpendKind) -> Counter {
        self.spend.with_label_values(&[model, kind.as_str()])
    }
}

/// Adds `tokens` to a model's tier series.
pub(super) fn count_billed(series: &[IntCounter; 3], tokens: &BilledTokens) {
    for (counter, count) in series.iter().zip(tokens.prompt_tiers()) {
        counter.inc_by(count);
    }
}
