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

pub fn feed_canonical<F: Feed>(value: &Value, out: &mut F) {
    match value {
        Value::Null => out.feed(b"n"),
        Value::Bool(true) => out.feed(b"t"),
        Value::Bool(false) => out.feed(b"f"),
        Value::Number(number) => {
            out.feed(b"#");
            let _ = write!(FmtFeed(out), "{number}");
            out.feed(b";");
        }
        Value::String(text) => {
            out.feed(b"s");
            feed_len(text.len(), out);
            out.feed(text.as_bytes());
        }
        Value::Array(items) => {
            out.feed(b"[");
            feed_len(items.len(), out);
            for item in items {
                feed_canonical(item, out);
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
                feed_canonical(item, out);
            }
        }
    }
}

/// blake3 of `seed ‖ canonical(value)`: the summary cache's prefix chain.
pub fn hash_with_seed(seed: &[u8], value: &Value) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(seed);
    feed_canonical(value, &mut hasher);
    *hasher.finalize().as_bytes()
}

/// A fast 128-bit hash of `seed ‖ canonical(value)`, for in-memory keys that need no
/// cryptographic strength (the per-message token counts).
pub fn fast_hash_with_seed(seed: &[u8], value: &Value) -> u128 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(seed);
    feed_canonical(value, &mut hasher);
    hasher.digest128()
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
