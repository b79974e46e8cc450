//! A request ready to go upstream (`Outgoing`), and what was done to it on the way
//! (`Outcome`): what prepare hands to send, and send to relay.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::compaction::limits::Limits;
use crate::compaction::rewrite::{Action, CacheOutcome};
use crate::dialect::stages::{Dialect, Prepared, Would};
use crate::error::ProxyError;
use crate::pipeline::recall::Recallable;
use crate::pipeline::state::AppState;
use crate::tokens::catalog::ModelInfo;
use crate::transport::upstream::Upstream;

/// What was done to the request, for headers, metrics and the log.
pub struct Outcome {
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    pub summarizer_wait: Duration,
    /// How many of the recent part's items went otherwise than verbatim: 0 unless the recent
    /// part alone could not fit the hard limit (`Split::recent_altered`).
    pub recent_altered: usize,
    /// What the request offered recall over, when it did.
    pub recall: Option<Recallable>,
}

impl Outcome {
    pub const FORWARDED: Outcome = Outcome {
        action: Action::Forwarded,
        cache: CacheOutcome::None,
        summarized: 0,
        summarizer_wait: Duration::ZERO,
        recent_altered: 0,
        recall: None,
    };
}

/// A request ready to go upstream, and what was done to it on the way.
pub struct Outgoing<'s> {
    pub model: String,
    pub info: ModelInfo,
    pub upstream: &'s Arc<Upstream>,
    pub body: Bytes,
    /// Usage was asked of upstream on the client's behalf, and is kept from it.
    pub inject_usage: bool,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    /// The unscaled count of what was forwarded, for the learned ratio.
    pub forwarded_raw: u64,
    /// As planned: the window less the reserve (`usable`, what upstream should have
    /// accepted), the trigger and the target.
    pub limits: Limits,
    pub outcome: Outcome,
    /// Under observe: what `auto` would do, by the plan.
    pub would: Option<Would>,
}

/// The upstream of a request of `D` for `model`: the first that speaks its API
/// (`Upstreams::for_api`). None does: 404, naming the config that would, before any work.
pub(super) fn upstream_for<'s, D: Dialect>(
    state: &'s AppState,
    model: &str,
) -> Result<&'s Arc<Upstream>, ProxyError> {
    state
        .upstreams
        .for_api(|api| api == D::NAME, Some(model))
        .ok_or(ProxyError::NoUpstreamSpeaks(D::NAME))
}

impl<'s> Outgoing<'s> {
    /// `body`: the bytes to send, and whether usage was asked for in them on the client's
    /// behalf; `forwarded`: their count, scaled and unscaled.
    pub(super) fn new(
        upstream: &'s Arc<Upstream>,
        model: String,
        prepared: Prepared,
        (body, inject_usage): (Bytes, bool),
        (forwarded_tokens, forwarded_raw): (u64, u64),
        limits: Limits,
        outcome: Outcome,
    ) -> Outgoing<'s> {
        Outgoing {
            upstream,
            model,
            info: prepared.info,
            body,
            inject_usage,
            received_tokens: prepared.count.total,
            forwarded_tokens,
            forwarded_raw,
            limits,
            outcome,
            would: None,
        }
    }
}
