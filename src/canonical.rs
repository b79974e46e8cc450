//! A canonical encoding of JSON values for hashing: object keys sorted, every value tagged and
//! length-prefixed, so equal messages hash equal whatever key order or escaping a client
//! sends.

use std::io::Write as _;

use serde_json::Value;

fn write_len(len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

/// How a string is read into the hash: as it is, or as it reads (`str::trim`).
type Text = fn(&str) -> &str;

fn as_sent(text: &str) -> &str {
    text
}

/// Appends the canonical encoding of `value` to `out`. It is written out and hashed at once,
/// not fed to a hasher piece by piece: a chat view is mostly short keys and tags, and a
/// hasher's update per piece cost more than the walk (blake3 and xxh3 each hash a long input
/// many times faster than the same bytes in pieces of a few bytes).
fn write_canonical(value: &Value, out: &mut Vec<u8>, text: Text) {
    match value {
        Value::Null => out.push(b'n'),
        Value::Bool(true) => out.push(b't'),
        Value::Bool(false) => out.push(b'f'),
        Value::Number(number) => {
            out.push(b'#');
            // Writing into a `Vec` cannot fail.
            let _ = write!(out, "{number}");
            out.push(b';');
        }
        Value::String(string) => {
            let string = text(string);
            out.push(b's');
            write_len(string.len(), out);
            out.extend_from_slice(string.as_bytes());
        }
        Value::Array(items) => {
            out.push(b'[');
            write_len(items.len(), out);
            for item in items {
                write_canonical(item, out, text);
            }
        }
        Value::Object(map) => {
            out.push(b'{');
            write_len(map.len(), out);
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (key, item) in entries {
                write_len(key.len(), out);
                out.extend_from_slice(key.as_bytes());
                write_canonical(item, out, text);
            }
        }
    }
}

/// `seed ‖ canonical(value)`, strings read by `text`.
fn canonical(seed: &[u8], value: &Value, text: Text) -> Vec<u8> {
    let mut written = Vec::with_capacity(seed.len() + 256);
    written.extend_from_slice(seed);
    write_canonical(value, &mut written, text);
    written
}

/// blake3 of `seed ‖ canonical(value)`, each string read as it reads (trimmed): the summary
/// cache's prefix chain. A client that sends a turn again with other surrounding whitespace
/// (Claude Code 2.0 trims some tool results live, not when it resumes a session) still finds
/// the summary of it; a summary does not depend on such whitespace.
pub fn hash_with_seed(seed: &[u8], value: &Value) -> [u8; 32] {
    *blake3::hash(&trimmed_canonical(seed, value)).as_bytes()
}

/// The bytes `hash_with_seed` hashes, for a caller that keeps its hashes by them.
pub fn trimmed_canonical(seed: &[u8], value: &Value) -> Vec<u8> {
    canonical(seed, value, str::trim)
}

/// A fast 128-bit hash of `seed ‖ canonical(value)`, for in-memory keys that need no
/// cryptographic strength (the per-message token counts).
pub fn fast_hash_with_seed(seed: &[u8], value: &Value) -> u128 {
    xxhash_rust::xxh3::xxh3_128(&canonical(seed, value, as_sent))
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
            // Each part after its length, so no two lists of parts write the same bytes.
            Some(value) => {
                let at = written.len();
                written.extend_from_slice(&[0; 8]);
                // Writing a `Value` into a `Vec` cannot fail; a failure would only cost a
                // shorter key.
                let _ = serde_json::to_writer(&mut written, value);
                let len = (written.len() - at - 8) as u64;
                written[at..at + 8].copy_from_slice(&len.to_le_bytes());
            }
            // No part writes a length of all ones.
            None => written.extend_from_slice(&u64::MAX.to_le_bytes()),
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
        let (one, minus_one, five, minus_five) = (parse("1"), parse("-1"), parse("5"), parse("-5"));
        assert_ne!(
            key(&[None, Some(&one), Some(&minus_five)]),
            key(&[Some(&minus_one), None, Some(&five)])
        );
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
