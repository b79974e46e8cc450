//! One pipeline for every dialect: read → parse → count → plan → (cache | summarizer) →
//! rewrite → forward → relay with usage. A dialect supplies the stages that depend on its
//! request's shape (`Dialect`); the order, the plan, the compaction and the relay are here.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::app::{AppState, Worker};
use crate::compaction::compactor::{self, Action, CacheOutcome, CompactionJob, Rewrite};
use crate::compaction::plan::{
    self, Decision, Limits, Mode, PlanInput, Split, SUMMARY_FRAMING_TOKENS,
};
use crate::config::{Api, Config, ContextConfig};
use crate::conversation::Item;
use crate::error::ProxyError;
use crate::observe::metrics::ModelLabel;
use crate::tokens::catalog::{ModelCatalog, ModelInfo};
use crate::tokens::counter::{PromptCount, RawItems, TokenCounter};
use crate::tokens::encoding::Encoding;
use crate::transport::body::{declared_length, full, read_body, ProxyBody};
use crate::transport::upstream::Upstream;
use crate::transport::usage::{Usage, UsageFormat, UsageObserver, UsageTap};

pub const MODE_HEADER: HeaderName = HeaderName::from_static("x-condenser-mode");
pub const PROFILE_HEADER: HeaderName = HeaderName::from_static("x-condenser-profile");

/// What condenser did, told to the client on every response; names checked at compile time
/// rather than per request.
const ACTION_HEADER: HeaderName = HeaderName::from_static("x-condenser-action");
const PROMPT_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-prompt-tokens");
const FORWARDED_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-forwarded-tokens");
const SUMMARIZED_HEADER: HeaderName = HeaderName::from_static("x-condenser-summarized-messages");
const CACHE_HEADER: HeaderName = HeaderName::from_static("x-condenser-cache");
const RETRY_HEADER: HeaderName = HeaderName::from_static("x-condenser-retry");

/// What the pipeline needs of one API. Each stage is the dialect's; their order, the plan,
/// the compaction and the relay are the pipeline's, the same for every dialect.
pub trait Dialect {
    /// The path it serves, for the log line.
    const PATH: &'static str;
    /// What its log line calls a relayed reply.
    const SERVED: &'static str;
    /// How its replies carry usage.
    const USAGE: UsageFormat;
    /// Its API, which its summaries are asked in unless `summarizer.api` says otherwise.
    const API: Api;
    /// The request field that holds the conversation, named by errors about it.
    const CONVERSATION_FIELD: &'static str;
    /// A request parsed for counting, planning and rewriting.
    type Request: Send + Sync;

    /// Stage one, for a dialect that can: a request under every trigger, counted, planned
    /// and made ready from its raw bytes without a JSON tree. `Err` hands the request on to
    /// the full stages, with the count and the plan when this made them.
    fn scan<'s>(
        _state: &'s AppState,
        _bytes: &Bytes,
        _settings: &ContextConfig,
        _mode: Mode,
    ) -> impl Future<Output = Result<Outgoing<'s>, Option<Planned>>> + Send {
        std::future::ready(Err(None))
    }

    /// The request, checked for what condenser relies on, with errors that name the problem.
    fn parse(bytes: &[u8]) -> Result<Self::Request, ProxyError>;

    fn model(request: &Self::Request) -> &str;

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send;

    /// The conversation as chat messages, one per counted item: what compaction hashes into
    /// cache keys and what the summarizer reads.
    fn conversation(request: &Self::Request) -> Cow<'_, [Value]>;

    /// Writes a compaction into the request: the head, the pinned task, the summary, the
    /// kept items, tool outputs cut as planned (in the request model's `encoding`).
    fn rewrite(
        request: &mut Self::Request,
        split: &Split,
        rewrite: &Rewrite,
        settings: &ContextConfig,
        encoding: Encoding,
    );

    /// A reason to send this request as it came, whatever its size: what the plan cannot
    /// see from the counted items alone.
    fn forward_as_sent(_request: &Self::Request) -> Option<plan::ForwardReason> {
        None
    }

    /// The body to send: `original` unless the request was rewritten or must ask upstream
    /// for usage; and whether usage was asked for on the client's behalf.
    fn outgoing_body(
        request: Self::Request,
        original: Bytes,
        rewritten: bool,
    ) -> Result<(Bytes, bool), ProxyError>;
}

/// A request counted and ready to plan, whatever its dialect; shared by the proxy and
/// `condenser plan`.
pub struct Prepared {
    pub info: ModelInfo,
    pub count: PromptCount,
    /// The conversation's items after counting, one per entry of `count.per_message`.
    pub metas: Vec<Item>,
    /// What the request reserves for the reply, when it says.
    pub requested_completion_tokens: Option<u64>,
    pub choices: u64,
}

impl Prepared {
    pub fn plan_input<'a>(
        &'a self,
        config: &Config,
        settings: &'a ContextConfig,
        mode: Mode,
    ) -> PlanInput<'a> {
        PlanInput {
            messages: &self.metas,
            fixed_tokens: self.count.fixed,
            context_window: self.info.context_window,
            requested_completion_tokens: self.requested_completion_tokens,
            settings,
            mode,
            summary_tokens: config.summarizer.max_summary_tokens + SUMMARY_FRAMING_TOKENS,
        }
    }

    /// The planner's decision, except that requests asking for several choices go as sent.
    pub fn decide(&self, input: &PlanInput) -> Decision {
        if self.choices > 1 {
            return Decision::Forward(plan::ForwardReason::SeveralChoices);
        }
        plan::plan(input)
    }
}

/// The request headers addressed to condenser, found in one pass over the few headers a
/// client sends: a hashed lookup of each of these long names costs more than the pass.
#[derive(Default)]
pub struct Directives<'a> {
    mode: Option<&'a HeaderValue>,
    profile: Option<&'a HeaderValue>,
}

impl<'a> Directives<'a> {
    /// The first value of each, as `HeaderMap::get` would find.
    pub fn of(headers: &'a HeaderMap) -> Directives<'a> {
        let mut found = Directives::default();
        for (name, value) in headers {
            if *name == MODE_HEADER {
                found.mode.get_or_insert(value);
            } else if *name == PROFILE_HEADER {
                found.profile.get_or_insert(value);
            }
        }
        found
    }
}

/// The `[context]` settings for this request, after `x-condenser-profile`: the config's own
/// unless a profile is named, since most requests name none.
pub fn settings_for<'a>(
    config: &'a Config,
    directives: &Directives,
) -> Result<Cow<'a, ContextConfig>, ProxyError> {
    match directives.profile.map(|v| v.to_str()) {
        None => Ok(Cow::Borrowed(&config.context)),
        Some(Ok(name)) => config
            .context_for(Some(name))
            .map(Cow::Owned)
            .ok_or_else(|| {
                ProxyError::invalid(format!("{PROFILE_HEADER}: no profile named {name:?}"), None)
            }),
        Some(Err(_)) => Err(ProxyError::invalid(
            format!("{PROFILE_HEADER} is not valid text"),
            None,
        )),
    }
}

pub fn mode_for(directives: &Directives) -> Result<Mode, ProxyError> {
    match directives.mode {
        None => Ok(Mode::Auto),
        Some(value) => value.to_str().ok().and_then(Mode::parse).ok_or_else(|| {
            ProxyError::invalid(format!("{MODE_HEADER} must be auto, off or force"), None)
        }),
    }
}

/// What was done to the request, for headers, metrics and the log.
pub struct Outcome {
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    pub summarizer_wait: Duration,
}

impl Outcome {
    pub const FORWARDED: Outcome = Outcome {
        action: Action::Forwarded,
        cache: CacheOutcome::None,
        summarized: 0,
        summarizer_wait: Duration::ZERO,
    };
}

/// A request the raw path counted and planned, for the full path to finish without
/// counting or planning it again.
pub struct Planned {
    pub prepared: Prepared,
    pub decision: Decision,
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

/// How a dialect's raw first stage counts: its items (`RawItems`), and the parts besides
/// them that cost tokens, kept under `parts_seed` and counted by `fixed` once parsed.
pub struct RawStage {
    pub items: RawItems,
    pub parts_seed: u64,
    pub fixed: fn(Encoding, &[Option<Value>]) -> u32,
}

/// What a raw first stage read of a request, without a JSON tree: its model, its items as
/// written, the parts besides them that cost tokens, and the reply's reserve.
pub struct RawRequest<'a> {
    pub model: Cow<'a, str>,
    pub items: Vec<&'a RawValue>,
    pub parts: Vec<Option<&'a RawValue>>,
    pub requested_completion_tokens: Option<u64>,
}

/// The rest of a raw first stage, the same for every dialect that has one: the request
/// counted from its bytes (each item, and the parts besides them, counted once ever) and
/// planned; sent as it came when the plan forwards it, else handed on to the full path with
/// its count and plan. `Err(None)`: an item or part the stage cannot read.
pub async fn forward_raw<'s>(
    state: &'s AppState,
    bytes: &Bytes,
    stage: &RawStage,
    request: RawRequest<'_>,
    settings: &ContextConfig,
    mode: Mode,
) -> Result<Outgoing<'s>, Option<Planned>> {
    let info = state.catalog.resolve(&request.model);
    let encoding = info.encoding;
    let fixed = state
        .counter
        .count_raw_parts(encoding, stage.parts_seed, &request.parts, |parsed| {
            (stage.fixed)(encoding, &parsed)
        })
        .ok_or(None)?;
    let raw: Vec<&[u8]> = request
        .items
        .iter()
        .map(|item| item.get().as_bytes())
        .collect();
    let (count, metas) = state
        .counter
        .count_raw_items(&raw, &stage.items, fixed, &request.model, &info)
        .await
        .ok_or(None)?;
    let prepared = Prepared {
        info,
        count,
        metas,
        requested_completion_tokens: request.requested_completion_tokens,
        choices: 1,
    };
    let input = prepared.plan_input(&state.config, settings, mode);
    let decision = prepared.decide(&input);
    if !matches!(decision, Decision::Forward(_)) {
        return Err(Some(Planned { prepared, decision }));
    }
    let usable = Limits::new(&input).usable;
    let model = request.model.into_owned();
    Ok(Outgoing {
        upstream: state.upstreams.for_model(Some(&model)),
        model,
        info: prepared.info,
        body: bytes.clone(),
        inject_usage: false,
        received_tokens: prepared.count.total,
        forwarded_tokens: prepared.count.total,
        forwarded_raw: prepared.count.raw_total,
        usable,
        outcome: Outcome::FORWARDED,
    })
}

/// One request of dialect `D`, from its body to the relayed reply.
pub async fn handle<D: Dialect>(
    worker: &Arc<Worker>,
    request: Request<Incoming>,
    received: Instant,
) -> Result<Response<ProxyBody>, ProxyError> {
    let state = &worker.state;
    let (mut parts, body) = request.into_parts();
    let bytes = read_body(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let work_started = Instant::now();
    let directives = Directives::of(&parts.headers);
    let mode = mode_for(&directives)?;
    let settings = settings_for(&state.config, &directives)?;
    // Kept for a reactive retry: a second handle on the same bytes, not a copy.
    let original = bytes.clone();
    let outgoing = match D::scan(state, &bytes, &settings, mode).await {
        Ok(outgoing) => outgoing,
        // Boxed: the full path's future (summarizer calls included) is large, and the common
        // case should not carry its size.
        Err(planned) => {
            Box::pin(prepare::<D>(
                state,
                bytes,
                &parts.headers,
                &settings,
                mode,
                planned,
            ))
            .await?
        }
    };
    let metrics = &state.metrics;
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let sent = Instant::now();
    let overhead = sent
        .saturating_duration_since(work_started)
        .saturating_sub(outgoing.outcome.summarizer_wait);
    metrics.overhead_seconds.observe(overhead.as_secs_f64());
    // A retry needs the request's headers again, so a copy is kept, but only of a request
    // upstream may find too long: one past half the window, or counted by an estimate. A copy
    // of every request's headers cost ~1,500 instructions (`bench/instructions.sh`).
    let may_retry = mode != Mode::Off
        && (!outgoing.info.exact || outgoing.forwarded_tokens > outgoing.usable / 2);
    let mut outgoing = outgoing;
    let mut retried = false;
    let response = loop {
        let response = outgoing
            .upstream
            .send(
                Method::POST,
                path_and_query,
                upstream_headers(if may_retry && !retried {
                    parts.headers.clone()
                } else {
                    std::mem::take(&mut parts.headers)
                }),
                full(outgoing.body.clone()),
            )
            .await?;
        // One retry, and only for a request whose summary the client has not yet waited for
        // (at most one summarizer wait per request), nor one the client asked not to compact.
        let waited_already = matches!(
            outgoing.outcome.cache,
            CacheOutcome::Miss | CacheOutcome::Extended
        );
        if retried || waited_already || !may_retry || !may_say_too_long(&response) {
            break response;
        }
        let (head, body) = response.into_parts();
        // Upstream's reply broke off: its fault, not the client's.
        let reply = read_body(body, &head.headers, MAX_ERROR_REPLY_BYTES)
            .await
            .map_err(|e| ProxyError::UpstreamBroken(e.to_string()))?;
        let relay = |head, reply| Response::from_parts(head, full(reply));
        if !says_context_length_exceeded(&reply) {
            break relay(head, reply);
        }
        // Learned whether or not a retry follows, and before the retry is counted.
        let factor = state.counter.observe_overflow(
            &outgoing.model,
            outgoing.forwarded_tokens,
            outgoing.usable,
        );
        let compacted = Box::pin(prepare::<D>(
            state,
            original.clone(),
            &parts.headers,
            &settings,
            Mode::Force,
            None,
        ))
        .await;
        // Nothing to compact, or compaction failed: upstream's own answer is the truest.
        let Some(compacted) = compacted
            .ok()
            .filter(|c| c.outcome.action != Action::Forwarded)
        else {
            break relay(head, reply);
        };
        let label = metrics.for_model(&outgoing.model, &outgoing.info);
        metrics
            .reactive_retries
            .with_label_values(&[metrics.model(label).label()])
            .inc();
        tracing::info!(
            model = %outgoing.model,
            count_factor = factor,
            "upstream found the prompt too long; retrying it compacted"
        );
        outgoing = compacted;
        retried = true;
    };
    let Outgoing {
        model,
        info,
        upstream: _,
        body: _,
        inject_usage,
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        usable: _,
        outcome,
    } = outgoing;
    let model_label = metrics.for_model(&model, &info);
    metrics
        .model(model_label)
        .count_prompt(received_tokens, forwarded_tokens);
    if outcome.action != Action::Forwarded || outcome.cache != CacheOutcome::None {
        metrics
            .compactions
            .with_label_values(&[outcome.action.name(), outcome.cache.name()])
            .inc();
    }
    let upstream_time = sent.elapsed();
    metrics
        .upstream_seconds
        .observe(upstream_time.as_secs_f64());

    let (mut head, upstream_body) = response.into_parts();
    let status = head.status;
    let response_headers = &mut head.headers;
    for (name, value) in [
        (
            ACTION_HEADER,
            HeaderValue::from_static(outcome.action.name()),
        ),
        (PROMPT_TOKENS_HEADER, decimal_value(received_tokens)),
        (FORWARDED_TOKENS_HEADER, decimal_value(forwarded_tokens)),
        // Nothing summarized, as for every forwarded request: no buffer to format it in.
        (
            SUMMARIZED_HEADER,
            match outcome.summarized {
                0 => HeaderValue::from_static("0"),
                n => decimal_value(n as u64),
            },
        ),
        (CACHE_HEADER, HeaderValue::from_static(outcome.cache.name())),
    ] {
        response_headers.insert(name, value);
    }
    if retried {
        response_headers.insert(
            RETRY_HEADER,
            HeaderValue::from_static("context_length_exceeded"),
        );
    }
    let is_sse = response_headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if inject_usage && !is_sse {
        // The body is not a stream, so its length is unchanged and may stand.
        tracing::debug!("stream requested but upstream answered without SSE");
    }
    let observer = Observer {
        worker: worker.clone(),
        path: D::PATH,
        served: D::SERVED,
        model,
        model_label,
        stream: is_sse,
        received,
        status: status.as_u16(),
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        outcome,
        upstream_time,
        overhead,
    };
    let body = if is_sse {
        // Removing the usage chunk changes the length; the relay is chunked anyway.
        response_headers.remove(header::CONTENT_LENGTH);
        UsageTap::sse(upstream_body, observer, inject_usage)
            .reading(D::USAGE)
            .boxed_unsync()
    } else {
        UsageTap::json(upstream_body, observer)
            .reading(D::USAGE)
            .boxed_unsync()
    };
    Ok(Response::from_parts(head, body))
}

/// Every request the raw stage does not forward: parsed, validated with errors that name the
/// problem, counted and planned (unless the raw stage did), compacted when due, and written
/// out again only when changed.
async fn prepare<'s, D: Dialect>(
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
    let received_tokens = prepared.count.total;
    // Only a rewrite changes the prompt.
    let (forwarded_tokens, forwarded_raw) = if rewritten {
        let count = D::count(&request, &state.catalog, &state.counter)
            .await
            .count;
        (count.total, count.raw_total)
    } else {
        (prepared.count.total, prepared.count.raw_total)
    };
    let (body, inject_usage) = D::outgoing_body(request, bytes, rewritten)?;
    Ok(Outgoing {
        model,
        info: prepared.info,
        upstream,
        body,
        inject_usage,
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        usable,
        outcome,
    })
}

/// An upstream's answer that a prompt is too long is a small error body; more is relayed
/// as it is.
const MAX_ERROR_REPLY_BYTES: usize = 64 * 1024;

/// Whether a reply may be an upstream's `context_length_exceeded`: one of the statuses they
/// answer it with, and a declared body small enough to read before relaying it.
fn may_say_too_long<B>(response: &Response<B>) -> bool {
    let small =
        declared_length(response.headers()).is_some_and(|len| len <= MAX_ERROR_REPLY_BYTES as u64);
    small && matches!(response.status().as_u16(), 400 | 413 | 422)
}

/// Whether an error reply says the prompt did not fit, as OpenAI (`context_length_exceeded`),
/// Anthropic ("prompt is too long", "input length and `max_tokens` exceed context limit"), vLLM ("maximum context length") and llama.cpp
/// (`exceed_context_size_error`, "exceeds the available context size") say it.
fn says_context_length_exceeded(reply: &[u8]) -> bool {
    let text = String::from_utf8_lossy(reply).to_ascii_lowercase();
    [
        "context_length_exceeded",
        "prompt is too long",
        "exceed context limit",
        "maximum context length",
        "exceed_context_size",
        "exceeds the available context size",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}

/// One allocation, where `HeaderValue::from(u64)` makes two (a buffer, then a shared
/// handle for it).
fn decimal_value(n: u64) -> HeaderValue {
    // Digits are always a valid value; the fallback only restates that without a panic.
    HeaderValue::from_bytes(itoa::Buffer::new().format(n).as_bytes()).unwrap_or_else(|_| n.into())
}

/// The client's headers for upstream: compression is refused so usage can be read from the
/// response. (The body's length, which a rewrite changes, is framed by the upstream hop.)
fn upstream_headers(mut headers: HeaderMap) -> HeaderMap {
    headers.remove(header::ACCEPT_ENCODING);
    headers
}

/// Counts and logs a relayed reply once it ends, with the usage read from it.
struct Observer {
    worker: Arc<Worker>,
    path: &'static str,
    /// What the log line calls the reply (`Dialect::SERVED`).
    served: &'static str,
    model: String,
    model_label: ModelLabel,
    stream: bool,
    received: Instant,
    status: u16,
    received_tokens: u64,
    forwarded_tokens: u64,
    forwarded_raw: u64,
    outcome: Outcome,
    upstream_time: Duration,
    overhead: Duration,
}

impl UsageObserver for Observer {
    fn first_bytes(&mut self) {
        if self.stream {
            self.worker
                .state
                .metrics
                .ttft_seconds
                .observe(self.received.elapsed().as_secs_f64());
        }
    }

    fn finished(&mut self, usage: Option<Usage>) {
        let completion = usage.map_or(0, |u| u.completion_tokens);
        if let Some(usage) = usage {
            let state = &self.worker.state;
            let series = state.metrics.model(self.model_label);
            series.count_completion(usage.completion_tokens);
            if let Some(ratio) =
                state
                    .counter
                    .observe_usage(&self.model, self.forwarded_raw, usage.prompt_tokens)
            {
                series.set_token_ratio(ratio);
            }
        }
        tracing::info!(
            method = "POST",
            path = self.path,
            model = %self.model,
            status = self.status,
            stream = self.stream,
            prompt_tokens = self.received_tokens,
            forwarded_tokens = self.forwarded_tokens,
            completion_tokens = completion,
            action = self.outcome.action.name(),
            cache = self.outcome.cache.name(),
            summarized_messages = self.outcome.summarized,
            upstream_ms = self.upstream_time.as_secs_f64() * 1e3,
            summarizer_ms = self.outcome.summarizer_wait.as_secs_f64() * 1e3,
            overhead_ms = self.overhead.as_secs_f64() * 1e3,
            "{}",
            self.served
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_mode_follow_the_headers_and_name_their_problems() {
        let mut config = Config::default();
        config.profiles.insert(
            "lean".into(),
            crate::config::Profile {
                max_messages: Some(7),
                ..Default::default()
            },
        );
        let mut headers = HeaderMap::new();
        let settings = settings_for(&config, &Directives::of(&headers)).unwrap();
        assert!(matches!(settings, Cow::Borrowed(s) if std::ptr::eq(s, &config.context)));
        assert_eq!(mode_for(&Directives::of(&headers)).unwrap(), Mode::Auto);
        headers.insert("x-condenser-profile", HeaderValue::from_static("lean"));
        headers.insert("x-condenser-mode", HeaderValue::from_static("Force"));
        assert_eq!(
            settings_for(&config, &Directives::of(&headers))
                .unwrap()
                .max_messages,
            7
        );
        assert_eq!(mode_for(&Directives::of(&headers)).unwrap(), Mode::Force);
        let message = |error: ProxyError| error.to_string();
        headers.insert("x-condenser-profile", HeaderValue::from_static("nope"));
        headers.insert("x-condenser-mode", HeaderValue::from_static("sometimes"));
        assert_eq!(
            message(settings_for(&config, &Directives::of(&headers)).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-profile: no profile named \"nope\"",
                None
            ))
        );
        assert_eq!(
            message(mode_for(&Directives::of(&headers)).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-mode must be auto, off or force",
                None
            ))
        );
        headers.insert(
            "x-condenser-profile",
            HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        assert_eq!(
            message(settings_for(&config, &Directives::of(&headers)).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-profile is not valid text",
                None
            ))
        );
    }

    #[test]
    fn every_upstreams_way_of_saying_too_long_is_recognized() {
        for reply in [
            r#"{"error":{"code":"context_length_exceeded","message":"..."}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"}"#,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 48058 + 32000 > 80000, decrease input length or `max_tokens` and try again"}}"#,
        ] {
            assert!(says_context_length_exceeded(reply.as_bytes()), "{reply}");
        }
        assert!(!says_context_length_exceeded(
            br#"{"error":{"code":"invalid_value","message":"temperature too high"}}"#
        ));
    }
}
