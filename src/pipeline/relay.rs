//! Steps three and four: upstream's answer decorated with what condenser did (its
//! `x-condenser-*` headers and metrics), then relayed to the client, its usage read on the
//! way and the request logged once the reply ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::Response;

use crate::compaction::rewrite::{Action, CacheOutcome};
use crate::dialect::stages::Dialect;
use crate::observe::metrics::ModelLabel;
use crate::pipeline::outgoing::{Outcome, Outgoing};
use crate::pipeline::send::Sent;
use crate::pipeline::state::Worker;
use crate::tokens::catalog::Price;
use crate::transport::body::ProxyBody;
use crate::transport::headers::media_type_is;
use crate::transport::usage::{Usage, UsageObserver, UsageTap};

/// What condenser did, told to the client on every response; names checked at compile time
/// rather than per request.
const ACTION_HEADER: HeaderName = HeaderName::from_static("x-condenser-action");
const PROMPT_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-prompt-tokens");
const FORWARDED_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-condenser-forwarded-tokens");
const SUMMARIZED_HEADER: HeaderName = HeaderName::from_static("x-condenser-summarized-messages");
const CACHE_HEADER: HeaderName = HeaderName::from_static("x-condenser-cache");
const RETRY_HEADER: HeaderName = HeaderName::from_static("x-condenser-retry");
/// Set only when the recent part alone could not fit the hard limit: how many of its items
/// the forwarded request does not carry verbatim (rule 3).
const RECENT_SHORTENED_HEADER: HeaderName = HeaderName::from_static("x-condenser-recent-shortened");

/// Under observe: what `auto` would do with the request, by its plan as it left.
const WOULD_HEADER: HeaderName = HeaderName::from_static("x-condenser-would");
const WOULD_FORWARD_TOKENS_HEADER: HeaderName =
    HeaderName::from_static("x-condenser-would-forward-tokens");

/// When the request came and how long condenser's own work on it took.
pub(super) struct Timing {
    pub received: Instant,
    pub sent: Instant,
    pub overhead: Duration,
}

/// Step three: the answer's headers say what was done, and the metrics count it.
pub(super) fn decorate(worker: &Worker, sent: &mut Sent) -> ModelLabel {
    let metrics = &worker.state.metrics;
    let outgoing = &sent.outgoing;
    let outcome = &outgoing.outcome;
    let model_label = metrics.for_model(&outgoing.model, &outgoing.info);
    metrics
        .model(model_label)
        .count_prompt(outgoing.received_tokens, outgoing.forwarded_tokens);
    if outcome.action != Action::Forwarded || outcome.cache != CacheOutcome::None {
        metrics
            .compactions
            .with_label_values(&[outcome.action.name(), outcome.cache.name()])
            .inc();
    }
    let headers = sent.response.headers_mut();
    for (name, value) in [
        (
            ACTION_HEADER,
            HeaderValue::from_static(outcome.action.name()),
        ),
        (
            PROMPT_TOKENS_HEADER,
            decimal_value(outgoing.received_tokens),
        ),
        (
            FORWARDED_TOKENS_HEADER,
            decimal_value(outgoing.forwarded_tokens),
        ),
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
        headers.insert(name, value);
    }
    if outcome.recent_altered > 0 {
        headers.insert(
            RECENT_SHORTENED_HEADER,
            decimal_value(outcome.recent_altered as u64),
        );
    }
    if let Some(would) = outgoing.would {
        headers.insert(WOULD_HEADER, HeaderValue::from_static(would.action.name()));
        headers.insert(
            WOULD_FORWARD_TOKENS_HEADER,
            decimal_value(would.forwarded_tokens),
        );
    }
    if sent.retried {
        headers.insert(
            RETRY_HEADER,
            HeaderValue::from_static("context_length_exceeded"),
        );
    }
    model_label
}

/// Step four: the answer relayed, its usage read on the way (and kept from the client when
/// condenser asked for it), the request counted and logged when it ends.
pub(super) fn relay<D: Dialect>(
    worker: &Arc<Worker>,
    sent: Sent,
    model_label: ModelLabel,
    timing: Timing,
) -> Response<ProxyBody> {
    let Sent {
        outgoing,
        response,
        recalls,
        ..
    } = sent;
    let Outgoing {
        model,
        info,
        inject_usage,
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        outcome,
        ..
    } = outgoing;
    let upstream_time = timing.sent.elapsed();
    worker
        .state
        .metrics
        .upstream_seconds
        .observe(upstream_time.as_secs_f64());
    let (mut head, upstream_body) = response.into_parts();
    let is_sse = media_type_is(&head.headers, "text/event-stream");
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
        price: info.price,
        estimated: !info.exact,
        stream: is_sse,
        received: timing.received,
        status: head.status.as_u16(),
        received_tokens,
        forwarded_tokens,
        forwarded_raw,
        outcome,
        upstream_time,
        overhead: timing.overhead,
        recalls,
    };
    let body = if is_sse {
        // Removing the usage chunk changes the length; the relay is chunked anyway.
        head.headers.remove(header::CONTENT_LENGTH);
        UsageTap::sse(
            upstream_body,
            D::USAGE,
            observer,
            inject_usage,
            worker.state.events.clone(),
        )
        .boxed_unsync()
    } else {
        UsageTap::json(upstream_body, D::USAGE, observer).boxed_unsync()
    };
    Response::from_parts(head, body)
}

/// One allocation, where `HeaderValue::from(u64)` makes two (a buffer, then a shared
/// handle for it).
fn decimal_value(n: u64) -> HeaderValue {
    // Digits are always a valid value; the fallback only restates that without a panic.
    HeaderValue::from_bytes(itoa::Buffer::new().format(n).as_bytes()).unwrap_or_else(|_| n.into())
}

/// Counts and logs a relayed reply once it ends, with the usage read from it.
struct Observer {
    worker: Arc<Worker>,
    path: &'static str,
    /// What the log line calls the reply (`Dialect::SERVED`).
    served: &'static str,
    model: String,
    model_label: ModelLabel,
    /// The model's, as configured: what its usage costs.
    price: Option<Price>,
    /// The model's tokenizer is only estimated: its usage teaches condenser its ratio.
    estimated: bool,
    stream: bool,
    received: Instant,
    status: u16,
    received_tokens: u64,
    forwarded_tokens: u64,
    forwarded_raw: u64,
    outcome: Outcome,
    upstream_time: Duration,
    overhead: Duration,
    recalls: Option<Arc<AtomicU32>>,
}

impl Observer {
    fn recalls(&self) -> u32 {
        self.recalls
            .as_ref()
            .map_or(0, |served| served.load(Ordering::Relaxed))
    }
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
        let cached = usage.map_or(0, |u| u.cached_tokens);
        if let Some(usage) = usage {
            let state = &self.worker.state;
            let series = state.metrics.model(self.model_label);
            series.count_completion(usage.completion_tokens);
            // After recall, summed over the rounds: each round's prompt was sent and cached
            // on its own.
            series.count_cached(usage.cached_tokens);
            series.count_bill(&usage.billed(), self.price.as_ref());
            // After recall, the prompt usage is summed over rounds that were not all counted.
            // An exact encoding is never scaled, so a ratio learned for it would be a figure
            // nothing uses, shown on the dashboard as if it were.
            let learn = self.estimated && self.recalls() == 0;
            if let Some(ratio) = learn
                .then(|| {
                    state.counter.observe_usage(
                        &self.model,
                        self.forwarded_raw,
                        usage.prompt_tokens,
                    )
                })
                .flatten()
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
            cached_tokens = cached,
            cache_write_tokens = usage.map_or(0, |u| u.cache_write_tokens),
            action = self.outcome.action.name(),
            cache = self.outcome.cache.name(),
            summarized_messages = self.outcome.summarized,
            recent_shortened = self.outcome.recent_altered,
            recalls = self.recalls(),
            upstream_ms = self.upstream_time.as_secs_f64() * 1e3,
            summarizer_ms = self.outcome.summarizer_wait.as_secs_f64() * 1e3,
            overhead_ms = self.overhead.as_secs_f64() * 1e3,
            "{}",
            self.served
        );
    }
}
