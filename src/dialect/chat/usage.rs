//! How a chat completion carries usage: `usage.prompt_tokens`/`completion_tokens`, with the
//! prompt cache's share in `prompt_tokens_details.cached_tokens`, last in a body or in a
//! stream's final chunk (no count of cache writes: OpenAI bills them as input); and the
//! usage-only chunk condenser asked for on the client's behalf, kept from it.

use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem;
use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::transport::events;
use crate::transport::usage::{contains, Usage, UsageReader};

/// Chat Completions' usage.
pub struct ChatUsage;

impl UsageReader for ChatUsage {
    fn fold(&self, json: &[u8], usage: &mut Option<Usage>) {
        if let Some(found) = json_usage(json) {
            *usage = Some(found);
        }
    }

    fn relay_event(
        &self,
        event: Bytes,
        injected: bool,
        usage: &mut Option<Usage>,
    ) -> Option<Bytes> {
        // Only chunks mentioning usage are worth parsing.
        if !contains(&event, b"\"usage\"") {
            return Some(event);
        }
        let event = if injected && contains(&event, b"null") {
            let cleaned = Bytes::from(without_null_usage(&event));
            if !contains(&cleaned, b"\"usage\"") {
                return Some(cleaned);
            }
            cleaned
        } else {
            event
        };
        if let Some(chunk) = events::data(&event).and_then(|data| WithUsage::parse(&data)) {
            if let Some(found) = chunk.usage() {
                *usage = Some(found);
                let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
                if injected && usage_only {
                    return None;
                }
            }
        }
        Some(event)
    }
}

/// Just the part of a response that holds usage; the rest is skipped, not built.
#[derive(Deserialize)]
struct WithUsage {
    usage: Option<UsageFields>,
    choices: Option<Vec<IgnoredAny>>,
}

/// A usage object's counts; which of them must be written is up to the reader.
#[derive(Deserialize)]
struct UsageFields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

impl UsageFields {
    /// A stream's usage chunk: a count it leaves out is 0.
    fn lenient(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            completion_tokens: self.completion_tokens.unwrap_or(0),
            cached_tokens: self.cached(),
            cache_write_tokens: 0,
        }
    }

    /// A whole body's: a `"usage"` object without both counts is not a chat completion's.
    fn complete(&self) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: self.prompt_tokens?,
            completion_tokens: self.completion_tokens?,
            cached_tokens: self.cached(),
            cache_write_tokens: 0,
        })
    }

    fn cached(&self) -> u64 {
        self.prompt_tokens_details
            .as_ref()
            .and_then(|details| details.cached_tokens)
            .unwrap_or(0)
    }

    /// The usage object that `json` starts with, read by `serde`.
    fn read(json: &[u8]) -> Option<Usage> {
        UsageFields::deserialize(&mut serde_json::Deserializer::from_slice(json))
            .ok()?
            .complete()
    }
}

impl WithUsage {
    fn parse(bytes: &[u8]) -> Option<WithUsage> {
        serde_json::from_slice(bytes).ok()
    }

    fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().map(UsageFields::lenient)
    }
}

/// The usage of a whole JSON response. Chat completions end with it, so the last `"usage"`
/// key is read first, without scanning the completion before it. Inside a string that key's
/// quotes would be escaped, so what matches is a key or the string "usage"; anything but a
/// usage object after it falls back to reading the whole body.
fn json_usage(body: &[u8]) -> Option<Usage> {
    tail_usage(body).or_else(|| WithUsage::parse(body).and_then(|r| r.usage()))
}

const USAGE_KEY: &[u8] = b"\"usage\"";

/// Built once: on a small completion, building a searcher costs as much as the search.
static USAGE_KEY_FORWARD: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(USAGE_KEY));
static USAGE_KEY_FROM_END: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new(USAGE_KEY));

/// How far from its end a completion's usage normally sits (a few members follow it). The
/// forward search is vectorized and the reverse one is not, so this stretch is searched
/// forward, and only a body whose usage lies further back is searched in reverse.
const USAGE_TAIL_BYTES: usize = 1024;

/// Where the last `"usage"` in `body` starts.
fn last_usage_key(body: &[u8]) -> Option<usize> {
    let tail = body.len().saturating_sub(USAGE_TAIL_BYTES);
    match USAGE_KEY_FORWARD.find_iter(&body[tail..]).last() {
        Some(at) => Some(tail + at),
        None => USAGE_KEY_FROM_END.rfind(body),
    }
}

fn tail_usage(body: &[u8]) -> Option<Usage> {
    let at = last_usage_key(body)?;
    let value = body[at + USAGE_KEY.len()..]
        .trim_ascii_start()
        .strip_prefix(b":")?;
    plain_usage(value).or_else(|| UsageFields::read(value))
}

/// The usage object as upstreams write it, read without `serde`, which costs several times
/// more on a response's path: its two counts as plain integers, each once, and the cached
/// count in `prompt_tokens_details` when there is one, among other members that are skipped
/// (nested objects included). Anything else is `None`, and `serde` reads the object instead.
fn plain_usage(object: &[u8]) -> Option<Usage> {
    let mut prompt = None;
    let mut completion = None;
    let mut cached = None;
    // The last key read at the top: a key one deeper is a member of its value.
    let mut parent: &[u8] = b"";
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(&byte) = object.get(at) {
        at += 1;
        match byte {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(Usage {
                        prompt_tokens: prompt?,
                        completion_tokens: completion?,
                        cached_tokens: cached.unwrap_or(0),
                        cache_write_tokens: 0,
                    });
                }
            }
            b'"' => {
                let start = at;
                // A string with an escape in it is left to serde, which decodes it.
                at += memchr::memchr2(b'"', b'\\', &object[at..])?;
                if object[at] == b'\\' {
                    return None;
                }
                let text = &object[start..at];
                at += 1;
                let rest = object[at..].trim_ascii_start();
                let Some(value) = rest.strip_prefix(b":") else {
                    continue;
                };
                let slot = match (depth, text) {
                    (1, b"prompt_tokens") => &mut prompt,
                    (1, b"completion_tokens") => &mut completion,
                    (2, b"cached_tokens") if parent == b"prompt_tokens_details" => &mut cached,
                    (1, _) => {
                        parent = text;
                        continue;
                    }
                    _ => continue,
                };
                let value = value.trim_ascii_start();
                let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
                let after = value[digits..].trim_ascii_start().first();
                let leading_zero = digits > 1 && value[0] == b'0';
                if slot.is_some()
                    || digits == 0
                    || leading_zero
                    || !matches!(after, Some(b',' | b'}'))
                {
                    return None;
                }
                *slot = Some(std::str::from_utf8(&value[..digits]).ok()?.parse().ok()?);
                at = object.len() - value.len() + digits;
            }
            _ => {}
        }
    }
    None
}

/// Once usage is requested, OpenAI adds `"usage":null` to every chunk; a client that did not
/// ask for usage gets its chunks without it.
fn without_null_usage(event: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(event);
    [
        ",\"usage\":null",
        ", \"usage\": null",
        "\"usage\":null,",
        "\"usage\": null, ",
    ]
    .iter()
    .fold(text.into_owned(), |t, pattern| t.replace(pattern, ""))
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_usage_is_read_from_the_end_unless_the_end_is_a_string() {
        let plain = br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},"system_fingerprint":"fp"}"#;
        let found = json_usage(plain).unwrap();
        assert_eq!((found.prompt_tokens, found.completion_tokens), (3, 4));
        // The last "usage" is a string value, or a nested key of another shape: the whole
        // body is read instead.
        for tricky in [
            &br#"{"usage":{"prompt_tokens":3,"completion_tokens":4},"meta":{"kind":"usage"}}"#[..],
            br#"{"usage":{"prompt_tokens":3,"completion_tokens":4},"meta":{"usage":"n/a"}}"#,
        ] {
            let found = json_usage(tricky).unwrap();
            assert_eq!((found.prompt_tokens, found.completion_tokens), (3, 4));
        }
        assert_eq!(json_usage(br#"{"choices":[]}"#), None);
    }

    #[test]
    fn the_last_usage_key_is_found_near_the_end_or_further_back() {
        let usage = br#""usage":{"prompt_tokens":3,"completion_tokens":4}"#;
        for (before, after) in [
            (0, 0),
            (10, 10),
            (5_000, 10),
            (10, 5_000),
            (5_000, USAGE_TAIL_BYTES - 30),
        ] {
            let body = [
                &br#"{"a":""#[..],
                &vec![b'x'; before],
                br#"","usage":{"prompt_tokens":1,"completion_tokens":1},"#,
                usage,
                br#","b":""#,
                &vec![b'y'; after],
                br#""}"#,
            ]
            .concat();
            let at = last_usage_key(&body).unwrap();
            assert_eq!(&body[at..at + usage.len()], usage, "{before}/{after}");
            assert_eq!(
                json_usage(&body),
                Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 4,
                    cached_tokens: 0,
                    cache_write_tokens: 0,
                }),
                "{before}/{after}"
            );
        }
        // The key straddling the edge of the searched tail: it starts 3 bytes before it.
        let filler = USAGE_TAIL_BYTES + 4 - (1 + usage.len() + 6 + 2);
        let body = [
            &b"{"[..],
            usage,
            br#","b":""#,
            &vec![b'y'; filler],
            br#""}"#,
        ]
        .concat();
        assert_eq!(body.len() - USAGE_TAIL_BYTES, 4);
        assert_eq!(last_usage_key(&body), Some(1));
        assert_eq!(last_usage_key(br#"{"choices":[]}"#), None);
    }

    /// The plain reader against `serde` on the shapes upstreams send and on ones it must
    /// leave to `serde`: where it reads a usage, `serde` reads the same.
    #[test]
    fn plain_usage_agrees_with_serde() {
        let serde = |object: &str| UsageFields::read(object.as_bytes());
        let read = [
            r#"{"prompt_tokens":120,"completion_tokens":18,"total_tokens":138}"#,
            r#"{ "completion_tokens" : 7 , "prompt_tokens" : 0 }"#,
            r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"accepted_prediction_tokens":0}}"#,
            r#"{"x":{"prompt_tokens":1,"completion_tokens":2},"prompt_tokens":3,"completion_tokens":4}"#,
            r#"{"note":"a } and a { and \"quotes\"","prompt_tokens":5,"completion_tokens":6}"#,
            r#"{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}"#,
            r#"{"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":1920},"completion_tokens_details":{"cached_tokens":7},"prompt_tokens":2006,"completion_tokens":300}"#,
            r#"{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":null}}"#,
            r#"{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":null}"#,
        ];
        for object in read {
            let plain = if object.contains('\\') {
                None
            } else {
                plain_usage(object.as_bytes())
            };
            assert_eq!(plain.or_else(|| serde(object)), serde(object), "{object}");
            assert!(serde(object).is_some(), "{object}");
        }
        assert_eq!(
            plain_usage(read[3].as_bytes()),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                cached_tokens: 0,
                cache_write_tokens: 0,
            }),
            "nested counts are not the response's"
        );
        // The cached count is the prompt's, wherever it stands among the members.
        for object in &read[5..7] {
            let usage = plain_usage(object.as_bytes());
            assert_eq!(usage.map(|u| u.cached_tokens), Some(1920), "{object}");
        }
        assert_eq!(serde(read[7]).map(|u| u.cached_tokens), Some(0));
        assert_eq!(serde(read[8]).map(|u| u.cached_tokens), Some(0));
        for object in [
            r#"{"prompt_tokens":1.5,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":01,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1}"#,
            r#"{"prompt_tokens":"1","completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"completion_tokens":99999999999999999999999}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2"#,
            r#"{"pro\u006dpt_tokens":1,"completion_tokens":2}"#,
        ] {
            assert_eq!(plain_usage(object.as_bytes()), None, "{object}");
        }
        // What serde makes of those, the tap still gets: the plain reader only steps aside.
        let escaped = br#"{"pro\u006dpt_tokens":1,"completion_tokens":2}"#;
        assert_eq!(
            tail_usage(&[&b"{\"usage\":"[..], escaped, b"}"].concat()),
            serde(std::str::from_utf8(escaped).unwrap())
        );
    }
}
