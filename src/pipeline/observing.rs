//! Observe mode: every request goes upstream as it came, and off its path condenser carries
//! out what `auto` would have done with it, with the one pipeline (`prepare_with`) and
//! observe mode's compactor (`Observer`): summaries made ahead, cut horizons kept, nothing
//! called. Each would-be request is written and counted as `auto` would send it, and billed
//! against the would-be request before it in its session. `condenser replay` runs a
//! recorded session through the same steps.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderMap;

use crate::compaction::limits::Limits;
use crate::compaction::plan::Mode;
use crate::compaction::rewrite::Action;
use crate::config::{ContextConfig, RecallConfig};
use crate::dialect::stages::{Dialect, Settings};
use crate::error::ProxyError;
use crate::pipeline::observer::{units, CacheBreak, Judged};
use crate::pipeline::outgoing::Outgoing;
use crate::pipeline::prepare::prepare_with;
use crate::pipeline::sent::{sent_parts, SentParts};
use crate::pipeline::sessions::{Counted, Lines, Record};
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
    /// As planned: its usable window, trigger and target.
    pub limits: Limits,
    /// The request as `auto` would have sent it.
    pub forwarded: Bytes,
}

impl Observed {
    /// Its record, as a report draws it, with what the model would have been sent when given.
    pub fn record(&self, sent: Option<SentParts>) -> Record {
        let counted = Counted {
            model: &self.model,
            received_tokens: self.received_tokens,
            forwarded_tokens: self.forwarded_tokens,
            action: self.action,
            summarized: self.summarized,
            lines: Lines::new(&self.limits),
            price: self.info.price,
        };
        Record::new(counted, self.judged, sent)
    }
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
        limits: outgoing.limits,
        forwarded: outgoing.body,
    })
}

/// Observes the request off its path, once it has been forwarded, and counts what `auto`
/// would have done with it; with the admin listener on, records it for its page.
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
        match observe::<D>(&state, (bytes.clone(), &path), &caller, settings).await {
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
                if let Some(recent) = &state.recent {
                    let sent = sent_if_shown::<D>(&state, &bytes, &observed.forwarded);
                    recent.push(observed.record(sent));
                }
            }
            Err(error) => tracing::debug!(%error, "not observed"),
        }
    });
}

/// What the model was sent, when the operator has the admin page show prompt text.
fn sent_if_shown<D: Dialect>(
    state: &AppState,
    received: &[u8],
    forwarded: &[u8],
) -> Option<SentParts> {
    state
        .config
        .admin
        .prompt_text
        .then(|| sent_parts::<D>(received, forwarded))
        .flatten()
}

/// A request condenser forwarded (not observed), as the admin page records it.
pub(super) struct Forwarded {
    model: String,
    body: Bytes,
    received_tokens: u64,
    forwarded_tokens: u64,
    action: Action,
    summarized: usize,
    lines: Lines,
    price: Option<crate::tokens::catalog::Price>,
}

impl Forwarded {
    pub(super) fn of(outgoing: &Outgoing<'_>) -> Forwarded {
        Forwarded {
            model: outgoing.model.clone(),
            body: outgoing.body.clone(),
            received_tokens: outgoing.received_tokens,
            forwarded_tokens: outgoing.forwarded_tokens,
            action: outgoing.outcome.action,
            summarized: outgoing.outcome.summarized,
            lines: Lines::new(&outgoing.limits),
            price: outgoing.info.price,
        }
    }
}

/// Records a forwarded request for the admin page, off its path: billed against its
/// session's request before it as observe mode bills a would-be one (`Observer::judge`).
pub(super) fn record<D: Dialect + 'static>(
    state: Arc<AppState>,
    received: Bytes,
    forwarded: Forwarded,
    caller: HeaderMap,
) {
    tokio::spawn(async move {
        let Some(recent) = &state.recent else {
            return;
        };
        let client = units::<D>(&received).unwrap_or_default();
        let sent_units = units::<D>(&forwarded.body).unwrap_or_default();
        let judged = state.observer.judge(
            (&caller, &forwarded.model),
            (client, sent_units),
            (forwarded.received_tokens, forwarded.forwarded_tokens),
            forwarded.summarized,
        );
        let sent = sent_if_shown::<D>(&state, &received, &forwarded.body);
        let counted = Counted {
            model: &forwarded.model,
            received_tokens: forwarded.received_tokens,
            forwarded_tokens: forwarded.forwarded_tokens,
            action: forwarded.action,
            summarized: forwarded.summarized,
            lines: forwarded.lines,
            price: forwarded.price,
        };
        recent.push(Record::new(counted, judged, sent));
    });
}
