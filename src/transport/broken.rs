//! Replies hyper parsed that a proxy must still not pass on, and which failure kind an
//! error counts as.

use std::io;

use hyper::header;
use hyper::http::response::Parts;
use hyper::StatusCode;

use crate::observe::metrics::FailureKind;
use crate::transport::body::UpstreamSilent;

/// What makes a parsed response head one a proxy must not pass on: an upgrade condenser
/// never asks for (hop-by-hop `Upgrade` headers are not forwarded), and framing that
/// RFC 9112 §6.1 lets a recipient reject, which hyper reads some meaning into.
pub fn broken_head(head: &Parts) -> Option<String> {
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        return Some("101 Switching Protocols to a request that asked for no upgrade".into());
    }
    let values = head.headers.get_all(header::TRANSFER_ENCODING);
    values.iter().next()?;
    if head.headers.contains_key(header::CONTENT_LENGTH) {
        return Some("both Content-Length and Transfer-Encoding".into());
    }
    let mut codings = values
        .iter()
        .flat_map(|v| v.as_bytes().split(|byte| *byte == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    match (codings.next(), codings.next()) {
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => None,
        // Not quoted: upstream's text may hold the key it was sent (issue 55).
        _ => Some("a transfer-coding other than chunked".into()),
    }
}

/// Which `condenser_upstream_failures_total` kind an error is.
pub fn failure_kind(error: &(dyn std::error::Error + 'static)) -> FailureKind {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<UpstreamSilent>() {
            return FailureKind::Timeout;
        }
        if let Some(hyper_error) = e.downcast_ref::<hyper::Error>() {
            if hyper_error.is_parse() {
                return FailureKind::Malformed;
            }
            if hyper_error.is_timeout() {
                return FailureKind::Timeout;
            }
        }
        // hyper's body decoders report bad framing (a chunk size that is not one) this way.
        if let Some(io_error) = e.downcast_ref::<io::Error>() {
            if matches!(
                io_error.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput
            ) {
                return FailureKind::Malformed;
            }
        }
        cause = e.source();
    }
    FailureKind::Reset
}

/// The innermost cause, which says what happened (the outer ones say where), in words that
/// quote nothing upstream wrote: an HTTP/2 error says its reason code, not the debug data of
/// upstream's GOAWAY, which may hold the key it was sent (issue 55). This text reaches the
/// client's 502 and the log.
pub fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    match cause.downcast_ref::<h2::Error>() {
        Some(http2) => http2_error(http2),
        None => cause.to_string(),
    }
}

/// An HTTP/2 error as its kind and reason code say it.
fn http2_error(error: &h2::Error) -> String {
    let what = if error.is_go_away() {
        "HTTP/2 connection closed (GOAWAY)"
    } else if error.is_reset() {
        "HTTP/2 stream reset"
    } else {
        "HTTP/2 error"
    };
    match error.reason() {
        Some(reason) => format!("{what}: {reason}"),
        None => what.to_string(),
    }
}
