//! One pipeline for every dialect, in four named steps: prepare (read → parse → count → plan
//! → (cache | summarizer) → rewrite), send (with the one reactive retry), decorate (what was
//! done, in headers and metrics) and relay (the reply, its usage read on the way). A dialect
//! supplies the stages that depend on its request's shape (`dialect::stages::Dialect`); the
//! order, the plan, the compaction and the relay are here.

pub mod directives;
mod prepare;
pub mod recall;
mod relay;
mod send;
pub mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Request, Response};

use crate::compaction::compactor::{Action, CacheOutcome};
use crate::dialect::stages::{Dialect, Prepared};
use crate::error::ProxyError;
use crate::pipeline::directives::{mode_for, recall_for, settings_for, Directives};
use crate::pipeline::prepare::Settings;
use crate::pipeline::recall::Recallable;
use crate::pipeline::relay::Timing;
use crate::pipeline::send::Original;
use crate::pipeline::state::{AppState, Worker};
use crate::tokens::catalog::ModelInfo;
use crate::transport::body::{read_body, ProxyBody};
use crate::transport::departure::ClientBody;
use crate::transport::upstream::Upstream;

/// What was done to the request, for headers, metrics and the log.
pub struct Outcome {
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    pub summarizer_wait: Duration,
    /// What the request offered recall over, when it did.
    pub recall: Option<Recallable>,
}

impl Outcome {
    pub const FORWARDED: Outcome = Outcome {
        action: Action::Forwarded,
        cache: CacheOutcome::None,
        summarized: 0,
        summarizer_wait: Duration::ZERO,
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
    /// The window less the reserve, as planned: what upstream should have accepted.
    pub usable: u64,
    pub outcome: Outcome,
}

impl<'s> Outgoing<'s> {
    /// `body`: the bytes to send, and whether usage was asked for in them on the client's
    /// behalf; `forwarded`: their count, scaled and unscaled.
    fn new(
        state: &'s AppState,
        model: String,
        prepared: Prepared,
        (body, inject_usage): (Bytes, bool),
        (forwarded_tokens, forwarded_raw): (u64, u64),
        usable: u64,
        outcome: Outcome,
    ) -> Outgoing<'s> {
        Outgoing {
            upstream: state.upstreams.for_model(Some(&model)),
            model,
            info: prepared.info,
            body,
            inject_usage,
            received_tokens: prepared.count.total,
            forwarded_tokens,
            forwarded_raw,
            usable,
            outcome,
        }
    }
}

/// One request of dialect `D`, from its body to the relayed reply.
pub async fn handle<D: Dialect>(
    worker: &Arc<Worker>,
    request: Request<ClientBody>,
    received: Instant,
) -> Result<Response<ProxyBody>, ProxyError> {
    let state = &worker.state;
    let (parts, body) = request.into_parts();
    let bytes = read_body(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let work_started = Instant::now();
    let directives = Directives::of(&parts.headers);
    let mode = mode_for(&directives)?;
    let settings = settings_for(&state.config, &directives)?;
    let settings = Settings {
        context: &settings,
        recall: recall_for(&state.config, &directives),
    };
    // Kept for a reactive retry: a second handle on the same bytes, not a copy.
    let original = bytes.clone();
    let outgoing = prepare::prepare::<D>(state, bytes, &parts.headers, settings, mode).await?;
    let sent = Instant::now();
    let overhead = sent
        .saturating_duration_since(work_started)
        .saturating_sub(outgoing.outcome.summarizer_wait);
    state
        .metrics
        .overhead_seconds
        .observe(overhead.as_secs_f64());
    let original = Original {
        bytes: original,
        headers: parts.headers,
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |pq| pq.as_str()),
        settings,
        mode,
    };
    let mut answer = send::send::<D>(state, outgoing, original).await?;
    let model_label = relay::decorate(worker, &mut answer);
    let timing = Timing {
        received,
        sent,
        overhead,
    };
    Ok(relay::relay::<D>(worker, answer, model_label, timing))
}
