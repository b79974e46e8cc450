//! `POST /v1/chat/completions`: parse, count, plan, rewrite when needed, forward, and read
//! usage on the way back.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::app::{AppState, Worker};
use crate::compaction::compactor::{self, CacheOutcome, CompactionJob, Rewrite};
use crate::compaction::plan::{self, Decision, Limits, MessageMeta, Mode, PlanInput, VALID_ROLES};
use crate::config::{Config, ContextConfig};
use crate::dialect::message_spans;
use crate::error::ProxyError;
use crate::http::body::{Gathered, ProxyBody};
use crate::http::upstream::Upstream;
use crate::models::{ModelCatalog, ModelInfo};
use crate::observe::metrics::ModelLabel;
use crate::observe::usage::{Usage, UsageObserver, UsageTap};
use crate::tokens::counter::{
    message_meta, messages, model_name, PromptCount, RawPrompt, TokenCounter,
};

/// Framing of the summary message on top of its text.
const SUMMARY_FRAMING_TOKENS: u32 = 20;

pub const MODE_HEADER: HeaderName = HeaderName::from_static("x-condenser-mode");
pub const PROFILE_HEADER: HeaderName = HeaderName::from_static("x-condenser-profile");

/// What condenser did, told to the client on every response; names checked at compile time
/// rather than per request.
const ACTION_HEADER: HeaderName = HeaderName::from_static("x-condenser-action");
const PROMPT_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-prompt-tokens");
const FORWARDED_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-forwarded-tokens");
const SUMMARIZED_HEADER: HeaderName = HeaderName::from_static("x-condenser-summarized-messages");
const CACHE_HEADER: HeaderName = HeaderName::from_static("x-condenser-cache");

/// Checks what condenser relies on; everything else is left for upstream to judge.
pub fn parse_request(bytes: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
    let Value::Object(body) = value else {
        return Err(ProxyError::invalid(
            "request body must be a JSON object",
            None,
        ));
    };
    match body.get("model") {
        Some(Value::String(_)) => {}
        None => {
            return Err(ProxyError::invalid(
                "you must provide a model parameter",
                Some("model"),
            ))
        }
        Some(_) => return Err(ProxyError::invalid("model must be a string", Some("model"))),
    }
    let messages = match body.get("messages") {
        Some(Value::Array(messages)) => messages,
        None => {
            return Err(ProxyError::invalid(
                "missing required parameter: messages",
                Some("messages"),
            ))
        }
        Some(_) => {
            return Err(ProxyError::invalid(
                "messages must be an array",
                Some("messages"),
            ))
        }
    };
    if messages.is_empty() {
        return Err(ProxyError::invalid(
            "messages must contain at least one message",
            Some("messages"),
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        let Some(message) = message.as_object() else {
            return Err(ProxyError::invalid(
                format!("messages[{i}] must be an object"),
                Some("messages"),
            ));
        };
        match message.get("role") {
            Some(Value::String(role)) if VALID_ROLES.contains(&role.as_str()) => {}
            Some(Value::String(role)) => {
                return Err(ProxyError::invalid(
                    format!(
                        "messages[{i}].role {role:?} is not one of {}",
                        VALID_ROLES.join(", ")
                    ),
                    Some("messages"),
                ))
            }
            _ => {
                return Err(ProxyError::invalid(
                    format!("messages[{i}].role is missing or not a string"),
                    Some("messages"),
                ))
            }
        }
    }
    Ok(body)
}

fn message_metas(messages: &[Value], counts: &[u32]) -> Vec<MessageMeta> {
    messages
        .iter()
        .zip(counts)
        .map(|(message, &tokens)| message_meta(message, tokens))
        .collect()
}

fn requested_completion_tokens(body: &Map<String, Value>) -> Option<u64> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
}

/// A request counted and ready to plan; shared by the proxy and `condenser plan`.
pub struct Prepared {
    pub info: ModelInfo,
    pub count: PromptCount,
    pub metas: Vec<MessageMeta>,
    requested_completion_tokens: Option<u64>,
    choices: u64,
}

impl Prepared {
    pub async fn new(
        body: &Map<String, Value>,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> Prepared {
        let info = catalog.resolve(model_name(body));
        let count = counter.count_request(body, &info).await;
        let metas = message_metas(messages(body), &count.per_message);
        Prepared {
            info,
            count,
            metas,
            requested_completion_tokens: requested_completion_tokens(body),
            choices: body.get("n").and_then(Value::as_u64).unwrap_or(1),
        }
    }

    /// Counted from raw JSON; None when the request must take the full path.
    async fn scanned(
        request: &Scanned<'_>,
        messages: &[&[u8]],
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> Option<Prepared> {
        if messages.is_empty() {
            return None;
        }
        let info = catalog.resolve(&request.model);
        let prompt = RawPrompt {
            messages,
            tools: request.tools,
            tool_choice: request.tool_choice,
            response_format: request.response_format,
        };
        let (count, metas) = counter.count_raw(&prompt, &request.model, &info).await?;
        Some(Prepared {
            info,
            count,
            metas,
            requested_completion_tokens: request.max_completion_tokens.or(request.max_tokens),
            choices: request.n.unwrap_or(1),
        })
    }

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

/// The fields of a chat request that counting and planning read, deserialized without
/// building a JSON tree. Anything irregular (a missing or mistyped field, a duplicate key)
/// fails this and sends the request down the full path, which names the problem.
#[derive(Deserialize)]
struct Scanned<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    /// Emptied by `message_spans::split`, which found the messages; declared so that a
    /// second `messages` key is refused rather than ignored.
    #[serde(rename = "messages")]
    _messages: serde::de::IgnoredAny,
    n: Option<u64>,
    stream: Option<bool>,
    /// Present even when null, which the raw path leaves to the full one.
    #[serde(borrow, default, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    max_completion_tokens: Option<u64>,
    max_tokens: Option<u64>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    response_format: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(value).map(Some)
}

/// `stream_options.include_usage` asked for upstream on behalf of a client that did not:
/// spliced in as the first key, the rest of the body kept byte for byte.
const INCLUDE_USAGE_FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// `open`: where the body's opening brace is.
fn with_usage_requested(body: &[u8], open: usize) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + INCLUDE_USAGE_FIELD.len());
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(INCLUDE_USAGE_FIELD);
    out.extend_from_slice(&body[open + 1..]);
    Bytes::from(out)
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

/// The body as one `Bytes`. A small body with a Content-Length arrives as one frame and is
/// returned as it came, with no copy or buffer list; only a body in several frames is joined.
/// Reading stops once the body says it has ended, without waiting for its channel to close.
async fn read_body<B>(body: B, headers: &HeaderMap, limit: usize) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut body = Limited::new(body, limit);
    let mut gathered = Gathered::Empty;
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ProxyError::BodyTooLarge { limit }
            } else {
                ProxyError::ClientBody(e.to_string())
            }
        })?;
        // Trailers are not part of the body.
        if let Some(data) = frame.data_ref() {
            gathered.push(data);
        }
    }
    Ok(gathered.into_bytes())
}

/// What was done to the request, for headers, metrics and the log.
struct Outcome {
    action: &'static str,
    cache: CacheOutcome,
    summarized: usize,
    summarizer_wait: Duration,
}

impl Outcome {
    const FORWARDED: Outcome = Outcome {
        action: "forwarded",
        cache: CacheOutcome::None,
        summarized: 0,
        summarizer_wait: Duration::ZERO,
    };
}

/// A request ready to go upstream, and what was done to it on the way.
struct Outgoing<'s> {
    model: String,
    info: ModelInfo,
    upstream: &'s Arc<Upstream>,
    body: Bytes,
    /// `stream_options.include_usage` was asked for on the client's behalf.
    inject_usage: bool,
    received_tokens: u64,
    forwarded_tokens: u64,
    /// The unscaled count of what was forwarded, for the learned ratio.
    forwarded_raw: u64,
    outcome: Outcome,
}

pub async fn handle(
    worker: &Arc<Worker>,
    request: Request<Incoming>,
    received: Instant,
) -> Result<Response<ProxyBody>, ProxyError> {
    let state = &worker.state;
    let (parts, body) = request.into_parts();
    let bytes = read_body(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let work_started = Instant::now();
    let directives = Directives::of(&parts.headers);
    let mode = mode_for(&directives)?;
    let settings = settings_for(&state.config, &directives)?;
    let outgoing = match scan(state, &bytes, &settings, mode).await {
        Ok(outgoing) => outgoing,
        // Boxed: the full path's future (summarizer calls included) is large, and the common
        // case should not carry its size.
        Err(counted) => {
            Box::pin(prepare_fully(
                state,
                bytes,
                &parts.headers,
                &settings,
                mode,
                counted,
            ))
            .await?
        }
    };
    let Outgoing {
        model,
        info,
        upstream,
        body: send_bytes,
        inject_usage,
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        outcome,
    } = outgoing;
    let metrics = &state.metrics;
    let model_label = metrics.for_model(&model, &info);
    metrics
        .model(model_label)
        .count_prompt(received_tokens, forwarded_tokens);
    if outcome.action != "forwarded" {
        metrics
            .compactions
            .with_label_values(&[outcome.action, outcome.cache.name()])
            .inc();
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let headers = upstream_headers(parts.headers);
    let sent = Instant::now();
    let overhead = sent
        .saturating_duration_since(work_started)
        .saturating_sub(outcome.summarizer_wait);
    metrics.overhead_seconds.observe(overhead.as_secs_f64());
    let response = upstream
        .send(
            Method::POST,
            path_and_query,
            headers,
            crate::http::body::full(send_bytes),
        )
        .await?;
    let upstream_time = sent.elapsed();
    metrics
        .upstream_seconds
        .observe(upstream_time.as_secs_f64());

    let (mut head, upstream_body) = response.into_parts();
    let status = head.status;
    let response_headers = &mut head.headers;
    for (name, value) in [
        (ACTION_HEADER, HeaderValue::from_static(outcome.action)),
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
    let is_sse = response_headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if inject_usage && !is_sse {
        // The body is not a stream, so its length is unchanged and may stand.
        tracing::debug!("stream requested but upstream answered without SSE");
    }
    let observer = ChatObserver {
        worker: worker.clone(),
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
        UsageTap::sse(upstream_body, observer, inject_usage).boxed_unsync()
    } else {
        UsageTap::json(upstream_body, observer).boxed_unsync()
    };
    Ok(Response::from_parts(head, body))
}

/// The common case, a request under every trigger, handled from its raw JSON without
/// building a tree. Otherwise the full path finishes the request: with the count when the
/// raw path made one (for compaction, a rejection, a rewrite of stream options), without
/// when the request was not read (the full path then validates it and names any problem).
async fn scan<'s>(
    state: &'s AppState,
    bytes: &Bytes,
    settings: &ContextConfig,
    mode: Mode,
) -> Result<Outgoing<'s>, Option<Prepared>> {
    // The derived reader would also take a JSON array for the struct, and skips the fields
    // it does not read without checking their text; the full path rejects both.
    let Some(open) = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&at| bytes[at] == b'{')
    else {
        return Err(None);
    };
    // The messages are checked as they are counted (`TokenCounter::count_raw`), the rest
    // of the body here.
    let Some(split) = message_spans::split(bytes) else {
        return Err(None);
    };
    let Ok(rest) = std::str::from_utf8(&split.rest) else {
        return Err(None);
    };
    let Ok(request) = serde_json::from_str::<Scanned>(rest) else {
        return Err(None);
    };
    let Some(prepared) =
        Prepared::scanned(&request, &split.messages, &state.catalog, &state.counter).await
    else {
        return Err(None);
    };
    let input = prepared.plan_input(&state.config, settings, mode);
    if !matches!(prepared.decide(&input), Decision::Forward(_)) {
        return Err(Some(prepared));
    }
    let wants_usage = |options: &RawValue| {
        serde_json::from_str::<Value>(options.get())
            .ok()
            .and_then(|options| options.get("include_usage").and_then(Value::as_bool))
            == Some(true)
    };
    let (body, inject_usage) = match (request.stream == Some(true), request.stream_options) {
        (false, _) => (bytes.clone(), false),
        (true, Some(options)) if wants_usage(options) => (bytes.clone(), false),
        (true, None) => (with_usage_requested(bytes, open), true),
        (true, Some(_)) => return Err(Some(prepared)),
    };
    let model = request.model.into_owned();
    Ok(Outgoing {
        upstream: state.upstreams.for_model(Some(&model)),
        model,
        info: prepared.info,
        body,
        inject_usage,
        received_tokens: prepared.count.total,
        forwarded_tokens: prepared.count.total,
        forwarded_raw: prepared.count.raw_total,
        outcome: Outcome::FORWARDED,
    })
}

/// Every request the raw path does not forward: parsed into a tree, validated with errors
/// that name the problem, counted (unless the raw path did), planned, compacted when due,
/// and re-serialized only when changed.
async fn prepare_fully<'s>(
    state: &'s Arc<AppState>,
    bytes: Bytes,
    headers: &HeaderMap,
    settings: &ContextConfig,
    mode: Mode,
    counted: Option<Prepared>,
) -> Result<Outgoing<'s>, ProxyError> {
    let mut body = parse_request(&bytes)?;
    let model = model_name(&body).to_string();
    let upstream = state.upstreams.for_model(Some(&model));
    let prepared = match counted {
        Some(prepared) => prepared,
        None => Prepared::new(&body, &state.catalog, &state.counter).await,
    };
    let input = prepared.plan_input(&state.config, settings, mode);
    let decision = prepared.decide(&input);

    let mut outcome = Outcome::FORWARDED;
    let mut rewritten: Option<Vec<Value>> = None;
    match &decision {
        Decision::Forward(_) => {}
        Decision::Reject { tokens, limit } => {
            return Err(ProxyError::ContextLengthExceeded {
                tokens: *tokens,
                limit: *limit,
            })
        }
        Decision::Precompute(split) | Decision::Compact { split, .. } => {
            let job = CompactionJob {
                messages: messages(&body),
                count: &prepared.count,
                split,
                model: &model,
                info: &prepared.info,
                upstream,
                authorization: headers.get(header::AUTHORIZATION),
                settings,
                mode,
                limits: Limits::new(&input),
            };
            if matches!(decision, Decision::Precompute(_)) {
                compactor::precompute(state, job);
            } else if let Some(Rewrite {
                messages,
                action,
                cache,
                summarized,
                waited,
            }) = compactor::compact(state, job).await?
            {
                outcome = Outcome {
                    action: action.name(),
                    cache,
                    summarized,
                    summarizer_wait: waited,
                };
                rewritten = Some(messages);
            }
        }
    }

    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let client_wants_usage = body
        .get("stream_options")
        .and_then(|options| options.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    let inject_usage = stream && !client_wants_usage;
    let received_tokens = prepared.count.total;
    let (send_bytes, forwarded_tokens, forwarded_raw) = if rewritten.is_none() && !inject_usage {
        (bytes, prepared.count.total, prepared.count.raw_total)
    } else {
        // Only new messages change the prompt; stream options do not.
        let (total, raw) = match rewritten {
            Some(messages) => {
                body.insert("messages".into(), Value::Array(messages));
                let count = state.counter.count_request(&body, &prepared.info).await;
                (count.total, count.raw_total)
            }
            None => (prepared.count.total, prepared.count.raw_total),
        };
        if inject_usage {
            request_usage_in_stream(&mut body);
        }
        let bytes = Bytes::from(
            serde_json::to_vec(&body).map_err(|e| ProxyError::InvalidJson(e.to_string()))?,
        );
        (bytes, total, raw)
    };
    Ok(Outgoing {
        model,
        info: prepared.info,
        upstream,
        body: send_bytes,
        inject_usage,
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        outcome,
    })
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

/// `stream_options.include_usage = true`, keeping any other stream options.
fn request_usage_in_stream(body: &mut Map<String, Value>) {
    let options = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Some(options) = options.as_object_mut() {
        options.insert("include_usage".into(), Value::Bool(true));
    }
}

struct ChatObserver {
    worker: Arc<Worker>,
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

impl UsageObserver for ChatObserver {
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
            path = crate::http::routes::CHAT_COMPLETIONS,
            model = %self.model,
            status = self.status,
            stream = self.stream,
            prompt_tokens = self.received_tokens,
            forwarded_tokens = self.forwarded_tokens,
            completion_tokens = completion,
            action = self.outcome.action,
            cache = self.outcome.cache.name(),
            summarized_messages = self.outcome.summarized,
            upstream_ms = self.upstream_time.as_secs_f64() * 1e3,
            summarizer_ms = self.outcome.summarizer_wait.as_secs_f64() * 1e3,
            overhead_ms = self.overhead.as_secs_f64() * 1e3,
            "chat completion"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

    fn frames(parts: &[&'static str]) -> Frames {
        parts
            .iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes()))))
            .collect()
    }

    async fn read(frames: Frames, limit: usize) -> Result<Bytes, ProxyError> {
        let body = StreamBody::new(stream::iter(frames));
        read_body(body, &HeaderMap::new(), limit).await
    }

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

    #[tokio::test]
    async fn one_frame_is_returned_as_it_came() {
        let sent = Bytes::from(r#"{"model":"gpt-4o"}"#.to_string());
        let got = read_body(Full::new(sent.clone()), &HeaderMap::new(), 100)
            .await
            .unwrap();
        assert_eq!(got, sent);
        assert_eq!(got.as_ptr(), sent.as_ptr(), "copied");
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_left_out() {
        let mut sent = frames(&["", "{\"a\":", "", "1", "}"]);
        sent.push(Ok(Frame::trailers(HeaderMap::new())));
        assert_eq!(read(sent, 100).await.unwrap(), "{\"a\":1}");
        assert_eq!(read(frames(&["", "x"]), 100).await.unwrap(), "x");
        assert_eq!(read(Vec::new(), 100).await.unwrap(), "");
    }

    #[tokio::test]
    async fn the_limit_holds_for_declared_and_for_grown_bodies() {
        let too_large = |result: Result<Bytes, ProxyError>| {
            matches!(result, Err(ProxyError::BodyTooLarge { limit: 8 }))
        };
        assert_eq!(
            read(frames(&["1234", "5678"]), 8).await.unwrap(),
            "12345678"
        );
        assert!(too_large(read(frames(&["1234", "5678", "9"]), 8).await));
        assert!(too_large(read(frames(&["123456789"]), 8).await));
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        let small = Full::new(Bytes::from_static(b"1"));
        assert!(too_large(read_body(small, &declared, 8).await));
    }

    #[tokio::test]
    async fn client_body_errors_are_reported_as_such() {
        let mut sent = frames(&["12"]);
        sent.push(Err(std::io::Error::other("connection reset")));
        match read(sent, 100).await {
            Err(ProxyError::ClientBody(message)) => assert_eq!(message, "connection reset"),
            other => panic!("{other:?}"),
        }
    }
}
