//! Every failure condenser names: what a client can see (each dialect writes it in its own
//! shape), and why a summary was not made.

use hyper::header::HeaderMap;
use hyper::StatusCode;

/// nginx's status for a request whose client closed its connection before the answer.
const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(status) => status,
    Err(_) => StatusCode::BAD_REQUEST,
};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<&'static str>,
    },
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("request header fields exceed the limit of {limit} bytes")]
    HeadersTooLarge { limit: usize },
    /// The request's body did not arrive whole in time (`server.body_read_timeout_secs`).
    #[error("{0}")]
    BodyReadTimeout(String),
    #[error("this request has {tokens} prompt tokens and cannot be made to fit: {why}")]
    ContextLengthExceeded {
        tokens: u64,
        /// What does not fit, with its numbers (`compaction::plan::Shortfall`).
        why: String,
        /// The request's conversation field: `messages`, or `input` on the Responses API.
        param: &'static str,
    },
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    #[error("upstream sent a broken reply: {0}")]
    UpstreamBroken(String),
    /// An upstream error reply whose body could not be scanned for keys, so was not relayed.
    /// `kept`: its headers a client needs to back off (`Retry-After`, the rate limits).
    #[error("upstream answered {status}; its body was withheld, as {why}")]
    UpstreamReplyWithheld {
        status: StatusCode,
        why: String,
        kept: Box<HeaderMap>,
    },
    #[error("upstream did not answer within {0} seconds")]
    UpstreamTimeout(u64),
    #[error("summarizer failed: {0}")]
    SummarizerFailed(#[source] SummarizeError),
    /// A rewritten request that could not be written out: condenser's fault, never the
    /// client's.
    #[error("could not write the compacted request: {0}")]
    Rewrite(#[source] serde_json::Error),
    #[error("no route for {0}")]
    NotFound(String),
    /// No configured upstream speaks the API of the request, named by its dialect: a key
    /// never goes to another API's upstream.
    #[error(
        "no upstream speaks the {0} API here: list \"{0}\" in the apis of the [[routes]] entry or [upstream] that does"
    )]
    NoUpstreamSpeaks(&'static str),
    #[error("error reading the request body: {0}")]
    ClientBody(String),
    /// The client closed its connection while its request waited; nobody reads the answer.
    #[error("the client left while its request waited; its upstream request was cancelled")]
    ClientLeft,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SummarizeError {
    #[error("circuit open after repeated failures against {0}")]
    CircuitOpen(String),
    #[error("summarizer request failed: {0}")]
    Upstream(String),
    #[error("summarizer answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("summarizer timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("summarizer reply malformed: {0}")]
    Malformed(String),
    #[error("summary rejected: {0}")]
    Rejected(String),
    /// A summary written, and refused by the checks before use (`compaction::summary_check`).
    #[error("summary refused: {0}")]
    Refused(Refusal),
    /// condenser's own bookkeeping failed (a summary job that died, a poisoned lock): no
    /// fault of the summarizer's, so it never opens a breaker.
    #[error("summary job failed inside condenser: {0}")]
    Internal(String),
}

/// Why a summary the summarizer wrote is not used: each check of `compaction::summary_check`,
/// as `condenser_summaries_total{outcome="refused"}` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("empty")]
    Empty,
    #[error("over its budget")]
    OverBudget,
    #[error("a verbatim run of the conversation")]
    Verbatim,
    #[error("cut off at its token limit")]
    CutOff,
    #[error("the pinned task dropped")]
    TaskDropped,
    #[error("the asked sections missing")]
    NoSections,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::Empty,
        Refusal::OverBudget,
        Refusal::Verbatim,
        Refusal::CutOff,
        Refusal::TaskDropped,
        Refusal::NoSections,
    ];

    /// Its `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Empty => "empty",
            Refusal::OverBudget => "over_budget",
            Refusal::Verbatim => "verbatim",
            Refusal::CutOff => "cut_off",
            Refusal::TaskDropped => "task_dropped",
            Refusal::NoSections => "no_sections",
        }
    }
}

impl ProxyError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ProxyError::InvalidRequest {
            message: message.into(),
            param,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::InvalidJson(_)
            | ProxyError::InvalidRequest { .. }
            | ProxyError::ContextLengthExceeded { .. }
            | ProxyError::ClientBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::BodyReadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::UpstreamUnreachable(_)
            | ProxyError::UpstreamBroken(_)
            | ProxyError::SummarizerFailed(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::UpstreamReplyWithheld { status, .. } => *status,
            ProxyError::Rewrite(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::NotFound(_) | ProxyError::NoUpstreamSpeaks(_) => StatusCode::NOT_FOUND,
            ProxyError::ClientLeft => CLIENT_CLOSED_REQUEST,
        }
    }

    /// OpenAI's `type` for it.
    pub fn error_type(&self) -> &'static str {
        match self.status() {
            StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::NOT_FOUND => "invalid_request_error",
            StatusCode::INTERNAL_SERVER_ERROR => "server_error",
            _ => "upstream_error",
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::InvalidJson(_) => "invalid_json",
            ProxyError::InvalidRequest { .. } => "invalid_request",
            ProxyError::BodyTooLarge { .. } => "request_too_large",
            ProxyError::HeadersTooLarge { .. } => "headers_too_large",
            ProxyError::BodyReadTimeout(_) => "request_timeout",
            ProxyError::ContextLengthExceeded { .. } => "context_length_exceeded",
            ProxyError::UpstreamUnreachable(_) => "upstream_unreachable",
            ProxyError::UpstreamBroken(_) => "upstream_error",
            ProxyError::UpstreamTimeout(_) => "upstream_timeout",
            ProxyError::UpstreamReplyWithheld { .. } => "upstream_reply_withheld",
            ProxyError::SummarizerFailed(_) => "summarizer_failed",
            ProxyError::NotFound(_) => "not_found",
            ProxyError::NoUpstreamSpeaks(_) => "no_upstream_for_api",
            ProxyError::ClientBody(_) => "invalid_body",
            ProxyError::Rewrite(_) => "internal_error",
            ProxyError::ClientLeft => "client_closed_request",
        }
    }

    /// Headers of upstream's reply that the answer to the client carries (a withheld reply's
    /// back-off headers).
    pub fn kept_headers(&self) -> Option<&HeaderMap> {
        match self {
            ProxyError::UpstreamReplyWithheld { kept, .. } => Some(kept),
            _ => None,
        }
    }

    /// The request field at fault, when one is.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ProxyError::InvalidRequest { param, .. } => *param,
            ProxyError::ContextLengthExceeded { param, .. } => Some(param),
            _ => None,
        }
    }
}
