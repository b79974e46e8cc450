//! Step two: the prepared request sent upstream, and sent once more, compacted, when upstream
//! finds the prompt too long (`ReactiveRetry`).

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{self, HeaderMap};
use hyper::{Method, Response};

use crate::compaction::plan::Mode;
use crate::compaction::rewrite::{Action, CacheOutcome};
use crate::dialect::stages::{Dialect, Settings};
use crate::error::ProxyError;
use crate::pipeline::outgoing::Outgoing;
use crate::pipeline::prepare::prepare_forced;
use crate::pipeline::recall::{Destination, Recall, Recallable};
use crate::pipeline::state::AppState;
use crate::transport::body::{declared_length, full, read_body, ProxyBody};

/// An upstream's answer that a prompt is too long is a small error body; more is relayed
/// as it is.
const MAX_ERROR_REPLY_BYTES: usize = 64 * 1024;

/// What was sent (the retry's request, when there was one) and upstream's answer to it.
pub(super) struct Sent<'s> {
    pub outgoing: Outgoing<'s>,
    pub response: Response<ProxyBody>,
    pub retried: bool,
    /// Recall calls served for it, counted as its reply goes by, when it offered recall.
    pub recalls: Option<Arc<AtomicU32>>,
}

/// The request as the client sent it, for a retry to prepare again.
pub(super) struct Original<'a> {
    pub bytes: Bytes,
    pub headers: HeaderMap,
    /// The headers that say who the caller is, when not `headers` themselves: they with the
    /// key its query carried (`KeyStyle::caller_headers`).
    pub caller: Option<HeaderMap>,
    pub path: &'a str,
    pub path_and_query: &'a str,
    pub settings: Settings<'a>,
    pub mode: Mode,
}

/// When a request is sent again: once, compacted, after upstream answered that its prompt
/// is too long; never for a request the client asked not to compact, nor for one whose
/// client already waited for a summary (at most one summarizer wait per request).
struct ReactiveRetry {
    armed: bool,
}

impl ReactiveRetry {
    /// Armed only for a request upstream may find too long: one past half the window, or
    /// counted by an estimate. Its headers must then be kept for the retry, and a copy of
    /// every request's headers cost ~1,500 instructions (`bench/instructions.sh`).
    fn for_request(mode: Mode, outgoing: &Outgoing) -> ReactiveRetry {
        ReactiveRetry {
            armed: !matches!(mode, Mode::Off | Mode::Observe)
                && (!outgoing.info.exact
                    || outgoing.forwarded_tokens > outgoing.limits.provider_usable() / 2),
        }
    }

    /// The headers to send: a copy while a retry, or recall's continuations (`keep`), may
    /// still need them.
    fn headers_to_send(&self, headers: &mut HeaderMap, keep: bool) -> HeaderMap {
        let mut sent = if self.armed || keep {
            headers.clone()
        } else {
            std::mem::take(headers)
        };
        // Compression is refused so usage and recall calls can be read from the response: an
        // absent header would accept any coding (RFC 9110 §12.5.3). (The body's length,
        // which a rewrite changes, is framed by the upstream hop.)
        sent.insert(
            header::ACCEPT_ENCODING,
            header::HeaderValue::from_static("identity"),
        );
        sent
    }

    /// Whether this answer may be an upstream's "too long" for a request that may be retried:
    /// one of the statuses they answer it with, and a declared body small enough to read
    /// before relaying it.
    fn may_apply(&self, outgoing: &Outgoing, response: &Response<ProxyBody>) -> bool {
        let waited_already = matches!(
            outgoing.outcome.cache,
            CacheOutcome::Miss | CacheOutcome::Extended
        );
        let small = declared_length(response.headers())
            .is_some_and(|len| len <= MAX_ERROR_REPLY_BYTES as u64);
        self.armed
            && !waited_already
            && small
            && matches!(response.status().as_u16(), 400 | 413 | 422)
    }
}

pub(super) async fn send<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    mut outgoing: Outgoing<'s>,
    mut original: Original<'_>,
) -> Result<Sent<'s>, ProxyError> {
    let mut retry = ReactiveRetry::for_request(original.mode, &outgoing);
    let mut retried = false;
    loop {
        let response = outgoing
            .upstream
            .send(
                Method::POST,
                original.path_and_query,
                D::KEY_STYLE,
                retry.headers_to_send(&mut original.headers, outgoing.outcome.recall.is_some()),
                full(outgoing.body.clone()),
            )
            .await?;
        if !retry.may_apply(&outgoing, &response) {
            return served_recall::<D>(state, outgoing, response, original, retried).await;
        }
        retry.armed = false;
        let (head, body) = response.into_parts();
        // Upstream's reply broke off: its fault, not the client's.
        let reply = read_body(body, &head.headers, MAX_ERROR_REPLY_BYTES)
            .await
            .map_err(|e| ProxyError::UpstreamBroken(e.to_string()))?;
        let as_answered = |outgoing, head, reply| Sent {
            outgoing,
            response: Response::from_parts(head, full(reply)),
            retried,
            recalls: None,
        };
        if !says_context_length_exceeded(&reply) {
            return Ok(as_answered(outgoing, head, reply));
        }
        // Learned whether or not a retry follows, and before the retry is counted.
        let factor = state.counter.observe_overflow(
            &outgoing.model,
            outgoing.forwarded_tokens,
            outgoing.limits.provider_usable(),
        );
        let compacted = prepare_forced::<D>(
            state,
            (original.bytes.clone(), original.path),
            original.caller.as_ref().unwrap_or(&original.headers),
            original.settings,
        )
        .await;
        // Nothing to compact, or compaction failed: upstream's own answer is the truest.
        let Some(compacted) = compacted
            .ok()
            .filter(|c| c.outcome.action != Action::Forwarded)
        else {
            return Ok(as_answered(outgoing, head, reply));
        };
        let metrics = &state.metrics;
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
    }
}

/// Upstream's answer, with the recall calls in it served when the request offered recall.
async fn served_recall<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    mut outgoing: Outgoing<'s>,
    response: Response<ProxyBody>,
    original: Original<'_>,
    retried: bool,
) -> Result<Sent<'s>, ProxyError> {
    let Some(offered) = outgoing.outcome.recall.take() else {
        return Ok(Sent {
            outgoing,
            response,
            retried,
            recalls: None,
        });
    };
    // Boxed: serving recall is most of a request's future (6 of its 9 KB), which hyper keeps
    // at full size for a connection's whole life, and only a request that offers recall
    // needs it.
    Box::pin(serve_offered::<D>(
        state, offered, outgoing, response, original, retried,
    ))
    .await
}

/// `served_recall` for a request that offered recall.
async fn serve_offered<'s, D: Dialect>(
    state: &'s Arc<AppState>,
    offered: Recallable,
    outgoing: Outgoing<'s>,
    response: Response<ProxyBody>,
    mut original: Original<'_>,
    retried: bool,
) -> Result<Sent<'s>, ProxyError> {
    let destination = Destination {
        upstream: outgoing.upstream,
        path_and_query: original.path_and_query,
        headers: ReactiveRetry { armed: false }.headers_to_send(&mut original.headers, false),
    };
    let recall = Recall::new::<D>(
        state,
        offered,
        destination,
        (outgoing.body.clone(), original.bytes.clone()),
        (original.settings.recall, outgoing.info.encoding),
        (
            outgoing
                .limits
                .provider_usable()
                .saturating_sub(outgoing.forwarded_tokens),
            match outgoing.forwarded_raw {
                0 => 1.0,
                raw => outgoing.forwarded_tokens as f64 / raw as f64,
            },
        ),
    );
    let recalls = recall.served.clone();
    let response = recall.serve(response).await?;
    Ok(Sent {
        outgoing,
        response,
        retried,
        recalls: Some(recalls),
    })
}

/// Whether an error reply says the prompt did not fit, as OpenAI (`context_length_exceeded`),
/// Anthropic ("prompt is too long", "input length and `max_tokens` exceed context limit"),
/// Gemini ("The input token count … exceeds the maximum number of tokens allowed"), vLLM
/// ("maximum context length") and llama.cpp (`exceed_context_size_error`, "exceeds the
/// available context size") say it.
fn says_context_length_exceeded(reply: &[u8]) -> bool {
    let text = String::from_utf8_lossy(reply).to_ascii_lowercase();
    [
        "context_length_exceeded",
        "prompt is too long",
        "exceed context limit",
        "maximum context length",
        "exceed_context_size",
        "exceeds the available context size",
        "exceeds the maximum number of tokens allowed",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_upstreams_way_of_saying_too_long_is_recognized() {
        for reply in [
            r#"{"error":{"code":"context_length_exceeded","message":"..."}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"}"#,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 48058 + 32000 > 80000, decrease input length or `max_tokens` and try again"}}"#,
            r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
        ] {
            assert!(says_context_length_exceeded(reply.as_bytes()), "{reply}");
        }
        assert!(!says_context_length_exceeded(
            br#"{"error":{"code":"invalid_value","message":"temperature too high"}}"#
        ));
    }
}
