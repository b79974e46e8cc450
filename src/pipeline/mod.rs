//! One pipeline for every dialect, in four named steps: prepare (read → parse → count → plan
//! → (cache | summarizer) → rewrite), send (with the one reactive retry), decorate (what was
//! done, in headers and metrics) and relay (the reply, its usage read on the way). A dialect
//! supplies the stages that depend on its request's shape (`dialect::stages::Dialect`); the
//! order, the plan, the compaction and the relay are here.

pub mod directives;
pub mod observer;
pub mod observing;
mod outgoing;
mod prepare;
pub mod recall;
mod relay;
mod send;
pub mod sent;
pub mod sessions;
pub mod state;

use std::sync::Arc;
use std::time::Instant;

use hyper::{Request, Response};

use crate::compaction::plan::Mode;
use crate::dialect::stages::{Dialect, Settings};
use crate::error::ProxyError;
use crate::pipeline::directives::{mode_for, recall_for, settings_for, Directives};
use crate::pipeline::relay::Timing;
use crate::pipeline::send::Original;
use crate::pipeline::state::Worker;
use crate::transport::body::{read_body, ProxyBody};
use crate::transport::departure::ClientBody;

/// One request of dialect `D`, from its body to the relayed reply.
pub async fn handle<D: Dialect + 'static>(
    worker: &Arc<Worker>,
    request: Request<ClientBody>,
    received: Instant,
) -> Result<Response<ProxyBody>, ProxyError> {
    let state = &worker.state;
    let (parts, body) = request.into_parts();
    if let Some(why) = D::refused_query(parts.uri.query()) {
        return Err(ProxyError::invalid(why, None));
    }
    let bytes = read_body(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let work_started = Instant::now();
    let directives = Directives::of(&parts.headers);
    let settings = settings_for(&state.config, &directives)?;
    let mut recall = recall_for(&state.config, &directives);
    recall.enabled &= D::recall_reads_reply(parts.uri.path(), parts.uri.query());
    let mode = mode_for(&directives, &settings)?;
    let settings = Settings {
        context: &settings,
        recall,
    };
    // Kept for a reactive retry: a second handle on the same bytes, not a copy.
    let original = bytes.clone();
    let path = parts.uri.path();
    let caller = D::KEY_STYLE.caller_headers(&parts.headers, parts.uri.query());
    let outgoing = prepare::prepare::<D>(
        state,
        (bytes, path),
        caller.as_ref().unwrap_or(&parts.headers),
        settings,
        mode,
    )
    .await?;
    let sent = Instant::now();
    let overhead = sent
        .saturating_duration_since(work_started)
        .saturating_sub(outgoing.outcome.summarizer_wait);
    state
        .metrics
        .overhead_seconds
        .observe(overhead.as_secs_f64());
    // Observed once forwarded: its bytes are a second handle, its headers and settings the
    // few an observed request copies.
    let observed = (mode == Mode::Observe).then(|| {
        (
            (original.clone(), path.to_string()),
            caller.as_ref().unwrap_or(&parts.headers).clone(),
            (settings.context.clone(), settings.recall),
        )
    });
    // With the admin listener on, a request forwarded (not observed) is recorded for its page.
    let recorded = (mode != Mode::Observe && state.recent.is_some()).then(|| {
        (
            original.clone(),
            observing::Forwarded::of(&outgoing),
            caller.as_ref().unwrap_or(&parts.headers).clone(),
        )
    });
    let original = Original {
        bytes: original,
        headers: parts.headers,
        caller,
        path,
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |pq| pq.as_str()),
        settings,
        mode,
    };
    let mut answer = send::send::<D>(state, outgoing, original).await?;
    if let Some((request, caller, settings)) = observed {
        observing::spawn::<D>(state.clone(), request, caller, settings);
    }
    if let Some((received, forwarded, caller)) = recorded {
        observing::record::<D>(state.clone(), received, forwarded, caller);
    }
    let model_label = relay::decorate(worker, &mut answer);
    let timing = Timing {
        received,
        sent,
        overhead,
    };
    Ok(relay::relay::<D>(worker, answer, model_label, timing))
}
