//! Step one: the request made ready to send. Parsed and validated with errors that name the
//! problem, counted and planned (unless the dialect's raw first stage did), compacted when
//! due, and written out again only when changed.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderMap;

use crate::compaction::compactor::{self, Compactor};
use crate::compaction::limits::{summary_room, Limits};
use crate::compaction::plan::{Decision, Mode, Split};
use crate::compaction::rewrite::{Action, CompactionJob};
use crate::compaction::session::SessionMark;
use crate::config::ContextConfig;
use crate::dialect::stages::{
    count_as_sent, offers_recall, write_compaction, Counting, Dialect, Planned, Prepared, Ready,
    Settings, Would,
};
use crate::error::ProxyError;
use crate::pipeline::outgoing::{upstream_for, Outcome, Outgoing};
use crate::pipeline::recall::Recallable;
use crate::pipeline::state::AppState;
use crate::transport::upstream::Upstream;

/// A request the raw first stage may send as it came; any other, prepared in full. Under
/// observe it goes as it came, and says what `auto` would do by the plan.
pub(super) async fn prepare<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    request: (Bytes, &str),
    caller: &HeaderMap,
    settings: Settings<'_>,
    mode: Mode,
) -> Result<Outgoing<'s>, ProxyError> {
    prepare_with::<D>(state, &state.compactor, request, caller, settings, mode).await
}

/// `prepare`, its compactions carried out by `compactor`: the gateway's, or observe mode's.
pub(super) async fn prepare_with<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    compactor: &Arc<Compactor>,
    (bytes, path): (Bytes, &str),
    caller: &HeaderMap,
    settings: Settings<'_>,
    mode: Mode,
) -> Result<Outgoing<'s>, ProxyError> {
    match D::scan(counting(state), &bytes, settings, mode).await {
        Ok(ready) => as_sent::<D>(state, ready, settings, mode),
        // Boxed: the full path's future (summarizer calls included) is large, and the common
        // case should not carry its size.
        Err(planned) => {
            Box::pin(prepare_in_full::<D>(
                (state, compactor),
                (bytes, path),
                caller,
                settings,
                mode,
                planned,
            ))
            .await
        }
    }
}

/// The request once more under `force`, for the reactive retry.
pub(super) async fn prepare_forced<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    request: (Bytes, &str),
    caller: &HeaderMap,
    settings: Settings<'_>,
) -> Result<Outgoing<'s>, ProxyError> {
    Box::pin(prepare_in_full::<D>(
        (state, &state.compactor),
        request,
        caller,
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

/// Under observe, what `auto` would do with the request, by the plan.
fn would(
    state: &AppState,
    prepared: &Prepared,
    settings: Settings<'_>,
    mode: Mode,
) -> Option<Would> {
    (mode == Mode::Observe).then(|| prepared.would(&state.config, settings))
}

fn as_sent<'s, D: Dialect>(
    state: &'s AppState,
    ready: Ready,
    settings: Settings<'_>,
    mode: Mode,
) -> Result<Outgoing<'s>, ProxyError> {
    let Ready {
        model,
        prepared,
        body,
        inject_usage,
        limits,
    } = ready;
    let counted = (prepared.count.total, prepared.count.raw_total);
    let would = would(state, &prepared, settings, mode);
    let mut outgoing = Outgoing::new(
        upstream_for::<D>(state, &model)?,
        model,
        prepared,
        (body, inject_usage),
        counted,
        limits,
        Outcome::FORWARDED,
    );
    outgoing.would = would;
    Ok(outgoing)
}

/// `caller`: the headers that say who the caller is and carry its key, for the summary cache's
/// scope and the summarizer's credentials.
async fn prepare_in_full<'s, D: Dialect>(
    (state, compactor): (&'s Arc<AppState>, &Arc<Compactor>),
    (bytes, path): (Bytes, &str),
    caller: &HeaderMap,
    all_settings: Settings<'_>,
    mode: Mode,
    planned: Option<Planned>,
) -> Result<Outgoing<'s>, ProxyError> {
    let settings = all_settings.context;
    let (mut request, planned) = match planned {
        Some(Planned {
            prepared,
            decision,
            sent,
        }) => (
            D::parse_planned(&bytes, path, sent)?,
            Some((prepared, decision)),
        ),
        None => (D::parse(&bytes, path)?, None),
    };
    let model = D::model(&request).to_string();
    let upstream = upstream_for::<D>(state, &model)?;
    let (mut prepared, decision) = match planned {
        Some((prepared, decision)) => (prepared, Some(decision)),
        None => (
            D::count(&request, &state.catalog, &state.counter).await,
            None,
        ),
    };
    // Every request's outputs take their tools' policies, whichever stage counted them; a plan
    // the raw stage made knew no tool's policy, and is made again with them.
    let applied = prepared.apply_tool_policies(&D::conversation(&request), &settings.tools);
    let decision = decision.filter(|_| !applied);
    let input = prepared.plan_input(&state.config, all_settings, mode);
    let decision = match D::forward_as_sent(&request) {
        Some(reason) => Decision::Forward(reason),
        None => decision.unwrap_or_else(|| prepared.decide(&input)),
    };

    let (outcome, rewritten, mark) = match &decision {
        Decision::Forward(_) => (Outcome::FORWARDED, false, None),
        Decision::Reject {
            tokens, shortfall, ..
        } => {
            return Err(ProxyError::ContextLengthExceeded {
                tokens: *tokens,
                why: shortfall.to_string(),
                param: D::CONVERSATION_FIELD,
            })
        }
        Decision::Precompute(split) | Decision::Compact { split, .. } => {
            let limits = Limits::new(&input);
            // In a window too small for the tool beside a summary, recall is not offered.
            let room = summary_room(
                &limits,
                state.config.summarizer.max_summary_tokens,
                all_settings.recall.enabled,
            );
            let recall = offers_recall::<D>(&mut request, room.recall);
            let job = Job {
                upstream,
                compactor,
                split,
                prepared: &prepared,
                model: &model,
                headers: caller,
                settings,
                mode,
                limits: if recall {
                    limits.with_recall_round()
                } else {
                    limits
                },
                recall,
            };
            let precompute = matches!(decision, Decision::Precompute(_));
            compacted::<D>(&mut request, job, precompute).await?
        }
    };
    let limits = Limits::new(&input);
    let would = would(state, &prepared, all_settings, mode);
    let (body, inject_usage, layout) = D::outgoing_body(request, bytes, rewritten)?;
    // Only a rewrite changes the prompt.
    let forwarded = if rewritten {
        let sent = (&body, layout.as_ref());
        let count = count_as_sent::<D>(counting(state), sent, path, all_settings).await?;
        (count.total, count.raw_total)
    } else {
        (prepared.count.total, prepared.count.raw_total)
    };
    if let Some(mark) = mark {
        compactor.forwarded(mark, body.clone(), forwarded.0);
    }
    let body = (body, inject_usage);
    let mut outgoing = Outgoing::new(upstream, model, prepared, body, forwarded, limits, outcome);
    outgoing.would = would;
    Ok(outgoing)
}

/// What carrying out a split needs of the request besides its tree.
struct Job<'a, 's> {
    upstream: &'s Arc<Upstream>,
    compactor: &'a Arc<Compactor>,
    split: &'a Split,
    prepared: &'a Prepared,
    model: &'a str,
    headers: &'a HeaderMap,
    settings: &'a ContextConfig,
    mode: Mode,
    limits: Limits,
    /// The request may offer recall.
    recall: bool,
}

/// The split carried out: its summary made ahead (`precompute`, the request going as it
/// came), or the request compacted and rewritten. Returns what was done, whether the
/// request was rewritten, and what it leaves, once forwarded, for a later summary to be asked
/// through it.
async fn compacted<D: Dialect>(
    request: &mut D::Request,
    job: Job<'_, '_>,
    precompute: bool,
) -> Result<(Outcome, bool, Option<SessionMark>), ProxyError> {
    let Job {
        upstream,
        compactor,
        split,
        prepared,
        model,
        headers,
        settings,
        mode,
        limits,
        recall,
    } = job;
    let conversation = D::conversation(request);
    let job = CompactionJob {
        messages: &conversation,
        count: &prepared.count,
        items: &prepared.metas,
        identities: &prepared.identities,
        split,
        model,
        info: &prepared.info,
        upstream,
        headers,
        api: D::SUMMARY_ENDPOINT,
        settings,
        mode,
        limits,
        recall,
    };
    if precompute {
        let mark = compactor::precompute(compactor, job);
        return Ok((Outcome::FORWARDED, false, mark));
    }
    let (rewrite, mark) = compactor::compact(compactor, job).await?;
    drop(conversation);
    let rewritten = rewrite.action != Action::Forwarded;
    let offered = rewritten
        .then(|| write_compaction::<D>(request, split, &rewrite, settings, prepared.info.encoding))
        .flatten();
    let recall = match (offered, &rewrite.archive) {
        (Some(wire), Some(archive)) => Some(Recallable {
            archive: archive.clone(),
            archived: rewrite.archived_items(split),
            wire,
        }),
        _ => None,
    };
    let outcome = Outcome {
        action: rewrite.action,
        cache: rewrite.cache,
        summarized: rewrite.summarized,
        summarizer_wait: rewrite.waited,
        recent_altered: split.recent_altered(rewrite.kept_from, &rewrite.cuts),
        recall,
    };
    Ok((outcome, rewritten, mark))
}
