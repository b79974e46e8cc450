//! How the Responses API carries usage: `usage.input_tokens`/`output_tokens` of the response,
//! in a body or in the stream's `response.completed` event.

use serde::Deserialize;

use crate::transport::usage::{Usage, UsageReader};

/// The Responses API's usage.
pub struct ResponsesUsage;

/// A body or a stream event: the usage sits at the top (a body) or in `response`
/// (`response.completed`).
#[derive(Deserialize)]
struct Reply {
    usage: Option<Counts>,
    response: Option<Box<Reply>>,
}

/// Every count optional: an event may carry none.
#[derive(Deserialize)]
struct Counts {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl Reply {
    fn fold_into(&self, usage: &mut Option<Usage>) {
        if let Some(response) = &self.response {
            response.fold_into(usage);
        }
        if let Some(counts) = &self.usage {
            Usage::fold(usage, counts.input_tokens, counts.output_tokens);
        }
    }
}

impl UsageReader for ResponsesUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        if let Ok(reply) = serde_json::from_slice::<Reply>(json) {
            reply.fold_into(usage);
        }
    }
}
