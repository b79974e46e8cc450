//! A canonical byte form of JSON values (object keys sorted, compact), so equal messages hash
//! equal whatever key order a client sends.

use std::io::{self, Write};

use serde_json::Value;

pub fn write_canonical<W: Write>(value: &Value, out: &mut W) -> io::Result<()> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.write_all(b"{")?;
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                serde_json::to_writer(&mut *out, key)?;
                out.write_all(b":")?;
                write_canonical(item, out)?;
            }
            out.write_all(b"}")
        }
        Value::Array(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_canonical(item, out)?;
            }
            out.write_all(b"]")
        }
        scalar => Ok(serde_json::to_writer(out, scalar)?),
    }
}

/// blake3 of `seed ‖ canonical(value)`.
pub fn hash_with_seed(seed: &[u8], value: &Value) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(seed);
    // Writing into a hasher cannot fail.
    let _ = write_canonical(value, &mut hasher);
    *hasher.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a: Value = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"content":"hi","role":"user"}"#).unwrap();
        assert_eq!(hash_with_seed(b"s", &a), hash_with_seed(b"s", &b));
        assert_ne!(hash_with_seed(b"s", &a), hash_with_seed(b"t", &a));
        let mut out = Vec::new();
        write_canonical(&json!({"b": [1, {"d": 2, "c": "x"}], "a": null}), &mut out).unwrap();
        assert_eq!(out, br#"{"a":null,"b":[1,{"c":"x","d":2}]}"#);
    }
}
