//! How Anthropic's Messages API carries usage: `usage.input_tokens` (with
//! `cache_creation_input_tokens` and `cache_read_input_tokens`, all of them prompt) and
//! `output_tokens`, in a body, or in a stream's `message_start` and then its `message_delta`
//! events.

use serde::Deserialize;

use crate::transport::usage::{Usage, UsageReader};

/// Anthropic's usage.
pub struct MessagesUsage;

/// A body or a stream event: the usage sits at the top (a body, `message_delta`) or in
/// `message` (`message_start`).
#[derive(Deserialize)]
struct Reply {
    usage: Option<Counts>,
    message: Option<Box<Reply>>,
}

/// Every count optional, since a stream gives them a few at a time.
#[derive(Deserialize)]
struct Counts {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl Reply {
    fn fold_into(&self, usage: &mut Option<Usage>) {
        if let Some(message) = &self.message {
            message.fold_into(usage);
        }
        if let Some(counts) = &self.usage {
            let prompt = counts.input_tokens.map(|input| {
                input
                    + counts.cache_creation_input_tokens.unwrap_or(0)
                    + counts.cache_read_input_tokens.unwrap_or(0)
            });
            Usage::fold(usage, prompt, counts.output_tokens);
        }
    }
}

impl UsageReader for MessagesUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        if let Ok(reply) = serde_json::from_slice::<Reply>(json) {
            reply.fold_into(usage);
        }
    }
}
