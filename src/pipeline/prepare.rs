//! Step one: the request made ready to send. Parsed and validated with errors that name the
//! problem, counted and planned (unless the dialect's raw first stage did), compacted when
//! due, and written out again only when changed.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderMap;

use crate::compaction::compactor::{self, Action, CompactionJob};
use crate::compaction::plan::{Decision, Limits, Mode};
use crate::config::ContextConfig;
use crate::dialect::stages::{Counting, Dialect, Planned, Ready};
use crate::error::ProxyError;
use crate::pipeline::state::AppState;
use crate::pipeline::{Outcome, Outgoing};

/// A request the raw first stage may send as it came; any other, prepared in full.
pub(super) async fn prepare<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    bytes: Bytes,
    headers: &HeaderMap,
    settings: &ContextConfig,
    mode: Mode,
) -> Result<Outgoing<'s>, ProxyError> {
    match D::scan(counting(state), &bytes, settings, mode).await {
        Ok(ready) => Ok(as_sent(state, ready)),
        // Boxed: the full path's future (summarizer calls included) is large, and the common
        // case should not carry its size.
        Err(planned) => {
            Box::pin(prepare_in_full::<D>(
                state, bytes, headers, settings, mode, planned,
            ))
            .await
        }
    }
}

/// The request once more under `force`, for the reactive retry.
pub(super) async fn prepare_forced<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    bytes: Bytes,
    headers: &HeaderMap,
    settings: &ContextConfig,
) -> Result<Outgoing<'s>, ProxyError> {
    Box::pin(prepare_in_full::<D>(
        state,
        bytes,
        headers,
        settings,
        Mode::Force,
        None,
    ))
    .await
}

fn counting(state: &AppState) -> Counting<'_> {
    Counting {
        config: &state.config,
        catalog: &state.catalog,
        counter: &state.counter,
    }
}

fn as_sent(state: &AppState, ready: Ready) -> Outgoing<'_> {
    let Ready {
        model,
        prepared,
        body,
        inject_usage,
        usable,
    } = ready;
    let counted = (prepared.count.total, prepared.count.raw_total);
    Outgoing::new(
        state,
        model,
        prepared,
        (body, inject_usage),
        counted,
        usable,
        Outcome::FORWARDED,
    )
}

async fn prepare_in_full<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    bytes: Bytes,
    headers: &HeaderMap,
    settings: &ContextConfig,
    mode: Mode,
    planned: Option<Planned>,
) -> Result<Outgoing<'s>, ProxyError> {
    let mut request = D::parse(&bytes)?;
    let model = D::model(&request).to_string();
    let upstream = state.upstreams.for_model(Some(&model));
    let (prepared, decision) = match planned {
        Some(Planned { prepared, decision }) => (prepared, Some(decision)),
        None => (
            D::count(&request, &state.catalog, &state.counter).await,
            None,
        ),
    };
    let input = prepared.plan_input(&state.config, settings, mode);
    let decision = match D::forward_as_sent(&request) {
        Some(reason) => Decision::Forward(reason),
        None => decision.unwrap_or_else(|| prepared.decide(&input)),
    };

    let mut outcome = Outcome::FORWARDED;
    let mut rewritten = false;
    match &decision {
        Decision::Forward(_) => {}
        Decision::Reject { tokens, limit } => {
            return Err(ProxyError::ContextLengthExceeded {
                tokens: *tokens,
                limit: *limit,
                param: D::CONVERSATION_FIELD,
            })
        }
        Decision::Precompute(split) | Decision::Compact { split, .. } => {
            let conversation = D::conversation(&request);
            let job = CompactionJob {
                messages: &conversation,
                count: &prepared.count,
                split,
                model: &model,
                info: &prepared.info,
                upstream,
                headers,
                api: D::API,
                settings,
                mode,
                limits: Limits::new(&input),
            };
            if matches!(decision, Decision::Precompute(_)) {
                compactor::precompute(&state.compactor, job);
            } else {
                let rewrite = compactor::compact(&state.compactor, job).await?;
                drop(conversation);
                if rewrite.action != Action::Forwarded {
                    D::rewrite(
                        &mut request,
                        split,
                        &rewrite,
                        settings,
                        prepared.info.encoding,
                    );
                    rewritten = true;
                }
                outcome = Outcome {
                    action: rewrite.action,
                    cache: rewrite.cache,
                    summarized: rewrite.summarized,
                    summarizer_wait: rewrite.waited,
                };
            }
        }
    }
    let usable = Limits::new(&input).usable;
    // Only a rewrite changes the prompt.
    let forwarded = if rewritten {
        let count = D::count(&request, &state.catalog, &state.counter)
            .await
            .count;
        (count.total, count.raw_total)
    } else {
        (prepared.count.total, prepared.count.raw_total)
    };
    let body = D::outgoing_body(request, bytes, rewritten)?;
    Ok(Outgoing::new(
        state, model, prepared, body, forwarded, usable, outcome,
    ))
}
