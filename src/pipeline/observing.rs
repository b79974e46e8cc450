//! Observe mode: every request goes upstream as it came, and off its path condenser carries
//! out what `auto` would have done with it, with the one pipeline (`prepare_with`) and
//! observe mode's compactor (`Observer`): summaries made ahead, cut horizons kept, nothing
//! called. Each would-be request is written and counted as `auto` would send it, and billed
//! against the would-be request before it in its session. `condenser replay` runs a
//! recorded session through the same steps.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderMap;

use crate::compaction::plan::Mode;
use crate::compaction::rewrite::Action;
use crate::config::{ContextConfig, RecallConfig};
use crate::dialect::stages::{Dialect, Settings};
use crate::error::ProxyError;
use crate::pipeline::observer::{units, CacheBreak, Judged};
use crate::pipeline::prepare::prepare_with;
use crate::pipeline::state::AppState;

/// What `auto` would have done with one request, and what it would have been billed.
#[derive(Debug, Clone)]
pub struct Observed {
    pub model: String,
    pub info: crate::tokens::catalog::ModelInfo,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    pub action: Action,
    /// Items the would-be summary replaces.
    pub summarized: usize,
    /// Against the request before it in its session.
    pub judged: Judged,
}

/// What `auto` would have done with the request `bytes` to `path`, carried out with observe
/// mode's compactor, and billed against the session's would-be request before it.
pub async fn observe<D: Dialect>(
    state: &Arc<AppState>,
    (bytes, path): (Bytes, &str),
    caller: &HeaderMap,
    settings: Settings<'_>,
) -> Result<Observed, ProxyError> {
    let observer = &state.observer;
    let client = units::<D>(&bytes).unwrap_or_default();
    let outgoing = prepare_with::<D>(
        state,
        &observer.compactor,
        (bytes, path),
        caller,
        settings,
        Mode::Auto,
    )
    .await?;
    let forwarded = units::<D>(&outgoing.body).unwrap_or_default();
    let summarized = outgoing.outcome.summarized;
    let judged = observer.judge(
        (caller, &outgoing.model),
        (client, forwarded),
        (outgoing.received_tokens, outgoing.forwarded_tokens),
        summarized,
    );
    Ok(Observed {
        model: outgoing.model,
        info: outgoing.info,
        received_tokens: outgoing.received_tokens,
        forwarded_tokens: outgoing.forwarded_tokens,
        action: outgoing.outcome.action,
        summarized,
        judged,
    })
}

/// Observes the request off its path, once it has been forwarded, and counts what `auto`
/// would have done with it.
pub(super) fn spawn<D: Dialect + 'static>(
    state: Arc<AppState>,
    (bytes, path): (Bytes, String),
    caller: HeaderMap,
    (context, recall): (ContextConfig, RecallConfig),
) {
    tokio::spawn(async move {
        let settings = Settings {
            context: &context,
            recall,
        };
        match observe::<D>(&state, (bytes, &path), &caller, settings).await {
            Ok(observed) => {
                let metrics = &state.metrics;
                let label = metrics.for_model(&observed.model, &observed.info);
                metrics.observed.count(
                    label,
                    observed.forwarded_tokens,
                    observed.judged.cached_tokens,
                    observed.judged.cache_break.map(CacheBreak::name),
                );
                tracing::info!(
                    model = %observed.model,
                    would = observed.action.name(),
                    would_forward_tokens = observed.forwarded_tokens,
                    would_cached_tokens = observed.judged.cached_tokens,
                    prompt_tokens = observed.received_tokens,
                    cache_break = observed.judged.cache_break.map(CacheBreak::name),
                    "observed"
                );
            }
            Err(error) => tracing::debug!(%error, "not observed"),
        }
    });
}
