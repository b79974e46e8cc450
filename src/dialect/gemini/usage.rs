//! How Google's Gemini API carries usage: `usageMetadata` in a body, and in each event of a
//! stream, every count so far (the last event's are the reply's). `promptTokenCount` is the
//! whole prompt, `cachedContentTokenCount` the share its cache served; the reply is
//! `candidatesTokenCount` and the thinking before it, `thoughtsTokenCount`.

use serde::Deserialize;

use crate::transport::usage::{Usage, UsageCounts, UsageReader};

/// Gemini's usage.
pub struct GeminiUsage;

/// A body, or one event's data; `streamGenerateContent` without `alt=sse` answers an array
/// of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Reply {
    One(Chunk),
    Many(Vec<Chunk>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    usage_metadata: Option<Counts>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Counts {
    prompt_token_count: Option<u64>,
    cached_content_token_count: Option<u64>,
    candidates_token_count: Option<u64>,
    thoughts_token_count: Option<u64>,
}

impl Counts {
    /// Thinking is billed as output.
    fn completion(&self) -> Option<u64> {
        match (self.candidates_token_count, self.thoughts_token_count) {
            (None, None) => None,
            (reply, thoughts) => Some(reply.unwrap_or(0) + thoughts.unwrap_or(0)),
        }
    }
}

impl UsageReader for GeminiUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        let chunks = match serde_json::from_slice::<Reply>(json) {
            Ok(Reply::One(chunk)) => vec![chunk],
            Ok(Reply::Many(chunks)) => chunks,
            Err(_) => return,
        };
        for counts in chunks.into_iter().filter_map(|chunk| chunk.usage_metadata) {
            Usage::fold(
                usage,
                UsageCounts {
                    prompt: counts.prompt_token_count,
                    completion: counts.completion(),
                    cached: counts.cached_content_token_count,
                    // No such count: a write to this API's cache is billed as input.
                    cache_write: None,
                },
            );
        }
    }

    fn usage_key(&self) -> &'static [u8] {
        b"\"usageMetadata\""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn usage_is_read_from_a_body_an_array_and_a_streams_last_event() {
        let body = br#"{"candidates":[],"usageMetadata":{"promptTokenCount":1200,"cachedContentTokenCount":1000,"candidatesTokenCount":30,"thoughtsTokenCount":12,"totalTokenCount":1242}}"#;
        assert_eq!(
            GeminiUsage.body_usage(body),
            Some(Usage {
                prompt_tokens: 1200,
                completion_tokens: 42,
                cached_tokens: 1000,
                cache_write_tokens: 0
            })
        );
        let array = br#"[{"usageMetadata":{"promptTokenCount":9}},{"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":4}}]"#;
        assert_eq!(
            GeminiUsage.body_usage(array),
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 4,
                cached_tokens: 0,
                cache_write_tokens: 0
            })
        );
        let mut usage = None;
        for event in [
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"usage\"}]}}],\"usageMetadata\":{\"promptTokenCount\":50,\"candidatesTokenCount\":1}}\r\n\r\n",
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"!\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":50,\"cachedContentTokenCount\":32,\"candidatesTokenCount\":7}}\r\n\r\n",
        ] {
            let relayed = GeminiUsage.relay_event(Bytes::from_static(event.as_bytes()), false, &mut usage);
            assert_eq!(relayed.as_deref(), Some(event.as_bytes()));
        }
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 50,
                completion_tokens: 7,
                cached_tokens: 32,
                cache_write_tokens: 0
            })
        );
        assert_eq!(GeminiUsage.body_usage(b"{\"candidates\":[]}"), None);
    }
}
