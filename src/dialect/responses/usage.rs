//! How the Responses API carries usage: `usage.input_tokens`/`output_tokens` of the response,
//! with the prompt cache's share in `input_tokens_details.cached_tokens`, in a body or in the
//! stream's `response.completed` event.

use serde::Deserialize;

use crate::transport::usage::{Usage, UsageCounts, UsageReader};

/// The Responses API's usage.
pub struct ResponsesUsage;

/// A body, with its usage at the top, or a stream event, with it in `response`
/// (`response.completed`).
#[derive(Deserialize)]
struct Reply {
    usage: Option<Counts>,
    response: Option<Response>,
}

#[derive(Deserialize)]
struct Response {
    usage: Option<Counts>,
}

/// Every count optional: an event may carry none.
#[derive(Deserialize)]
struct Counts {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    cached_tokens: Option<u64>,
}

impl UsageReader for ResponsesUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        let counts = serde_json::from_slice::<Reply>(json)
            .ok()
            .and_then(|reply| reply.usage.or_else(|| reply.response?.usage));
        if let Some(counts) = counts {
            Usage::fold(
                usage,
                UsageCounts {
                    prompt: counts.input_tokens,
                    completion: counts.output_tokens,
                    cached: counts.input_tokens_details.and_then(|d| d.cached_tokens),
                    // No such count: a write to this API's cache is billed as input.
                    cache_write: None,
                },
            );
        }
    }
}
