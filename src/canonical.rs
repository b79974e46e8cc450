//! A canonical encoding of JSON values for hashing: object keys sorted, every value tagged and
//! length-prefixed, fed straight into a hasher without serializing, so equal messages hash
//! equal whatever key order or escaping a client sends.

use std::fmt::Write as _;

use serde_json::Value;

/// Anything bytes can be fed into.
pub trait Feed {
    fn feed(&mut self, bytes: &[u8]);
}

impl Feed for blake3::Hasher {
    fn feed(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Feed for xxhash_rust::xxh3::Xxh3 {
    fn feed(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// Lets numbers be written with `write!` straight into the hasher.
struct FmtFeed<'a, F: Feed>(&'a mut F);

impl<F: Feed> std::fmt::Write for FmtFeed<'_, F> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.feed(s.as_bytes());
        Ok(())
    }
}

fn feed_len<F: Feed>(len: usize, out: &mut F) {
    out.feed(&(len as u64).to_le_bytes());
}

/// How a string is read into the hash: as it is, or as it reads (`str::trim`).
pub type Text = fn(&str) -> &str;

fn as_sent(text: &str) -> &str {
    text
}

pub fn feed_canonical<F: Feed>(value: &Value, out: &mut F, text: Text) {
    match value {
        Value::Null => out.feed(b"n"),
        Value::Bool(true) => out.feed(b"t"),
        Value::Bool(false) => out.feed(b"f"),
        Value::Number(number) => {
            out.feed(b"#");
            let _ = write!(FmtFeed(out), "{number}");
            out.feed(b";");
        }
        Value::String(string) => {
            let string = text(string);
            out.feed(b"s");
            feed_len(string.len(), out);
            out.feed(string.as_bytes());
        }
        Value::Array(items) => {
            out.feed(b"[");
            feed_len(items.len(), out);
            for item in items {
                feed_canonical(item, out, text);
            }
        }
        Value::Object(map) => {
            out.feed(b"{");
            feed_len(map.len(), out);
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (key, item) in entries {
                feed_len(key.len(), out);
                out.feed(key.as_bytes());
                feed_canonical(item, out, text);
            }
        }
    }
}

/// blake3 of `seed ‖ canonical(value)`, each string read as it reads (trimmed): the summary
/// cache's prefix chain. A client that sends a turn again with other surrounding whitespace
/// (Claude Code 2.0 trims some tool results live, not when it resumes a session) still finds
/// the summary of it; a summary does not depend on such whitespace.
pub fn hash_with_seed(seed: &[u8], value: &Value) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(seed);
    feed_canonical(value, &mut hasher, str::trim);
    *hasher.finalize().as_bytes()
}

/// A fast 128-bit hash of `seed ‖ canonical(value)`, for in-memory keys that need no
/// cryptographic strength (the per-message token counts).
pub fn fast_hash_with_seed(seed: &[u8], value: &Value) -> u128 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(seed);
    feed_canonical(value, &mut hasher, as_sent);
    hasher.digest128()
}

/// The fast hash of several values in turn (absent ones told apart from null): the key of
/// a request's parts other than its messages. Each is hashed as it serializes, keys in the
/// order sent, not canonically: an agent's tool schemas and system prompt run to tens of
/// kilobytes of small objects, and sorting each object's keys for the canonical form took
/// 1.2 ms a request (`bench/agent_replay.sh`), against 0.1 ms written out. The same parts
/// sent in another key order only miss the cache and are counted again, to the same count.
pub fn fast_hash_parts(seed: &[u8], parts: &[Option<&Value>]) -> u128 {
    let mut written = seed.to_vec();
    for part in parts {
        match part {
            Some(value) => {
                // Writing a `Value` into a `Vec` cannot fail; a failure would only cost a
                // shorter key.
                let _ = serde_json::to_writer(&mut written, value);
                written.push(b';');
            }
            None => written.push(b'-'),
        }
    }
    xxhash_rust::xxh3::xxh3_128(&written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn key_order_and_escaping_do_not_change_the_hash() {
        let a = parse(r#"{"role":"user","content":"caf\u00e9"}"#);
        let b = parse(r#"{"content":"café","role":"user"}"#);
        assert_eq!(hash_with_seed(b"s", &a), hash_with_seed(b"s", &b));
        assert_eq!(fast_hash_with_seed(b"s", &a), fast_hash_with_seed(b"s", &b));
        assert_ne!(hash_with_seed(b"s", &a), hash_with_seed(b"t", &a));
    }

    #[test]
    fn summary_keys_read_strings_as_they_read_and_counts_as_sent() {
        let live = serde_json::json!({"role": "user", "content": "1\u{2192} log"});
        let resumed = serde_json::json!({"role": "user", "content": "     1\u{2192} log\n"});
        assert_eq!(hash_with_seed(b"s", &live), hash_with_seed(b"s", &resumed));
        assert_ne!(
            fast_hash_with_seed(b"s", &live),
            fast_hash_with_seed(b"s", &resumed),
            "whitespace is counted"
        );
    }

    #[test]
    fn parts_hash_apart_when_they_differ_or_are_absent() {
        let tools = parse(r#"[{"name":"a"}]"#);
        let other = parse(r#"[{"name":"b"}]"#);
        let null = Value::Null;
        let key = |parts: &[Option<&Value>]| fast_hash_parts(b"s", parts);
        assert_eq!(key(&[Some(&tools), None]), key(&[Some(&tools), None]));
        assert_ne!(key(&[Some(&tools), None]), key(&[Some(&other), None]));
        assert_ne!(key(&[Some(&tools), None]), key(&[None, Some(&tools)]));
        assert_ne!(key(&[None]), key(&[Some(&null)]));
        assert_ne!(
            fast_hash_parts(b"s", &[None]),
            fast_hash_parts(b"t", &[None])
        );
    }

    #[test]
    fn different_values_hash_differently() {
        let values = [
            r#"{"a":"bc"}"#,
            r#"{"ab":"c"}"#,
            r#"{"a":["b","c"]}"#,
            r#"{"a":["bc"]}"#,
            r#"{"a":1}"#,
            r#"{"a":"1"}"#,
            r#"{"a":null}"#,
            r#"{"a":true}"#,
            r#"{"a":{}}"#,
            r#"{"a":[]}"#,
        ];
        let hashes: std::collections::HashSet<u128> = values
            .iter()
            .map(|v| fast_hash_with_seed(b"", &parse(v)))
            .collect();
        assert_eq!(hashes.len(), values.len());
    }
}
