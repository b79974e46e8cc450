//! How Anthropic's Messages API carries usage: `usage.input_tokens` (with
//! `cache_creation_input_tokens` and `cache_read_input_tokens`, all of them prompt) and
//! `output_tokens`, in a body, or in a stream's `message_start` and then its `message_delta`
//! events. `cache_read_input_tokens` is also the share the prompt cache served, and
//! `cache_creation_input_tokens` the share written to it.

use serde::Deserialize;

use crate::transport::usage::{Usage, UsageCounts, UsageReader};

/// Anthropic's usage.
pub struct MessagesUsage;

/// A body or a stream event: the usage sits at the top (a body, `message_delta`) or in
/// `message` (`message_start`).
#[derive(Deserialize)]
struct Reply {
    usage: Option<Counts>,
    message: Option<Started>,
}

#[derive(Deserialize)]
struct Started {
    usage: Option<Counts>,
}

/// Every count optional, since a stream gives them a few at a time.
#[derive(Deserialize)]
struct Counts {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl Counts {
    /// Cache writes and reads are prompt tokens too.
    fn prompt(&self) -> Option<u64> {
        let cached = self.cache_creation_input_tokens.unwrap_or(0)
            + self.cache_read_input_tokens.unwrap_or(0);
        self.input_tokens.map(|input| input + cached)
    }
}

impl UsageReader for MessagesUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        let Ok(reply) = serde_json::from_slice::<Reply>(json) else {
            return;
        };
        let started = reply.message.and_then(|message| message.usage);
        for counts in [started, reply.usage].into_iter().flatten() {
            Usage::fold(
                usage,
                UsageCounts {
                    prompt: counts.prompt(),
                    completion: counts.output_tokens,
                    cached: counts.cache_read_input_tokens,
                    cache_write: counts.cache_creation_input_tokens,
                },
            );
        }
    }
}
