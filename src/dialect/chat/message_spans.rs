//! Where each message of a chat request lies in its body, found by following quotes and
//! brackets only, without reading the messages.
//!
//! Parsing every message on every request cost a fifth of the chat path, though most
//! messages were seen before: a conversation resends its history each turn. The spans found
//! here are keyed into the token counter's cache by their exact bytes (a 128-bit hash under
//! a secret that is random per process, so unchecked bytes cannot be made to match). A
//! message found there was parsed and checked when it was first counted, so its bytes are
//! known to be valid UTF-8 and JSON; one not found there is checked and parsed then. The
//! rest of the body, with the messages taken out, still goes through `serde_json`. So a body
//! these spans come from is valid JSON whenever every message in it is, and the caller
//! checks every message one way or the other.
//!
//! Nesting is held to what `serde_json` reads, so one rule holds on both paths: a body
//! nested deeper is left to the full parse, which refuses it.
//!
//! Kept by hand (issue 21): read by `serde_json` as `&RawValue`s instead, with the nesting
//! check `serde_json` makes of no value it skips, the messages took about 70,700 instructions
//! per chat request against 62,873 with this file (`bench/instructions.sh`), 12% more:
//! `serde_json` checks every byte of every string for control characters, eight at a time,
//! where this file looks for a quote or a backslash with `memchr`.

/// Levels of arrays and objects, the body's own object counted: serde_json's recursion limit
/// (128) refuses the 128th.
pub const MAX_DEPTH: usize = 127;

/// A chat body split at its `messages` array.
pub struct Split<'a> {
    /// Each element of the array, as written (objects only), not checked to be valid JSON or
    /// UTF-8.
    pub messages: Vec<&'a [u8]>,
    /// The body with that array emptied to `[]`, everything else kept byte for byte.
    pub rest: Vec<u8>,
}

/// Finds the top-level `messages` array of a JSON object and the span of each of its
/// elements. None for anything irregular, which the caller leaves to a full parse: a body
/// that is not an object, no `messages` array, an element that is not an object, a
/// structure that does not close, or one nested deeper than `MAX_DEPTH`. Text outside the
/// array is not checked here; neither is text inside strings.
pub fn split(bytes: &[u8]) -> Option<Split<'_>> {
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut array = None;
    loop {
        at = skip_whitespace(bytes, at);
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(bytes, at)?;
        // A key written with escapes is not compared decoded: were it `messages`, the
        // caller's parse of the rest would find two.
        let key = &bytes[at + 1..key_end - 1];
        at = skip_whitespace(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(bytes, at + 1);
        if key == b"messages" && array.is_none() {
            let (end, messages) = elements(bytes, at)?;
            array = Some((at, end, messages));
            at = end;
        } else {
            at = value_end(bytes, at)?;
        }
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => break,
            _ => return None,
        }
    }
    if skip_whitespace(bytes, at + 1) != bytes.len() {
        return None;
    }
    let (start, end, messages) = array?;
    let mut rest = Vec::with_capacity(bytes.len() - (end - start) + 2);
    rest.extend_from_slice(&bytes[..start]);
    rest.extend_from_slice(b"[]");
    rest.extend_from_slice(&bytes[end..]);
    Some(Split { messages, rest })
}

/// The elements of the array opening at `at`, each an object, and where the array ends.
fn elements(bytes: &[u8], mut at: usize) -> Option<(usize, Vec<&[u8]>)> {
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    // Sized for a typical conversation: grown from empty, the list is reallocated four
    // times on the way to twenty messages.
    let mut messages = Vec::with_capacity(32);
    at = skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b']') {
        return Some((at + 1, messages));
    }
    loop {
        if bytes.get(at) != Some(&b'{') {
            return None;
        }
        // Inside the body's object and the array.
        let end = nested_end(bytes, at, MAX_DEPTH - 2)?;
        messages.push(&bytes[at..end]);
        at = skip_whitespace(bytes, end);
        match bytes.get(at) {
            Some(b',') => at = skip_whitespace(bytes, at + 1),
            Some(b']') => return Some((at + 1, messages)),
            _ => return None,
        }
    }
}

/// Where the value starting at `at`, a field of the body's object, ends: a string, an
/// object or array, or a scalar running to the next delimiter.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => nested_end(bytes, at, MAX_DEPTH - 1),
        _ => {
            let len = bytes[at..]
                .iter()
                .position(|&b| matches!(b, b',' | b'}' | b']') || is_whitespace(b))
                .unwrap_or(bytes.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

/// Where the object or array opening at `at` closes, counting brackets outside strings;
/// None when it nests more than `max_depth` levels, itself included. A mismatched pair is
/// not noticed here: what it encloses is not valid JSON, which the caller's check of the
/// text finds.
fn nested_end(bytes: &[u8], mut at: usize, max_depth: usize) -> Option<usize> {
    let mut depth = 0usize;
    loop {
        match bytes.get(at)? {
            b'"' => {
                at = string_end(bytes, at)?;
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > max_depth {
                    return None;
                }
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

/// Just past the closing quote of the string opening at `at`.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut from = at + 1;
    loop {
        let found = from + quote_or_backslash(bytes.get(from..)?)?;
        if bytes[found] == b'"' {
            return Some(found + 1);
        }
        // An escape: whatever follows the backslash cannot close the string.
        from = found + 2;
    }
}

/// The first `"` or `\` in `text`. Most strings of a chat body are short (keys, roles), and
/// for those a call to `memchr2` costs more than its search: the first word is looked at
/// here, eight bytes at once.
fn quote_or_backslash(text: &[u8]) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let Some(word) = text.first_chunk::<8>() else {
        return memchr::memchr2(b'"', b'\\', text);
    };
    let word = u64::from_le_bytes(*word);
    // A zero byte of `word ^ c` is a byte equal to c; the lowest such sets its high bit
    // here (higher ones may be false positives, but only the lowest is used).
    let zero_byte = |x: u64| x.wrapping_sub(LOW) & !x & HIGH;
    let found =
        zero_byte(word ^ (LOW * u64::from(b'"'))) | zero_byte(word ^ (LOW * u64::from(b'\\')));
    if found != 0 {
        return Some(found.trailing_zeros() as usize / 8);
    }
    memchr::memchr2(b'"', b'\\', &text[8..]).map(|at| at + 8)
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|&b| is_whitespace(b)) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;
    use serde_json::Value;

    /// What serde_json makes of the same body: the messages as written, and the body with
    /// them taken out.
    fn serde_view(body: &str) -> Option<(Vec<String>, Value)> {
        #[derive(serde::Deserialize)]
        struct Messages<'a> {
            #[serde(borrow)]
            messages: Vec<&'a RawValue>,
        }
        let parsed: Messages = serde_json::from_str(body).ok()?;
        let mut rest: Value = serde_json::from_str(body).ok()?;
        rest["messages"] = Value::Array(Vec::new());
        Some((
            parsed
                .messages
                .iter()
                .map(|m| m.get().to_string())
                .collect(),
            rest,
        ))
    }

    fn split_view(body: &str) -> Option<(Vec<String>, Value)> {
        let split = split(body.as_bytes())?;
        let rest = serde_json::from_slice(&split.rest).ok()?;
        let messages = split.messages.iter().map(|m| String::from_utf8(m.to_vec()));
        Some((messages.collect::<Result<_, _>>().ok()?, rest))
    }

    #[test]
    fn finds_each_message_as_written() {
        let body = r#" { "model" : "gpt-4o", "tools": [{"a": "]}\"{["}], "messages" : [
            {"role":"system","content":"be \"terse\" }]"} ,
            {"role": "user", "content": [{"type": "text", "text": "hi {"}], "name": "x\\"}
        ], "n": 1, "stream": true } "#;
        let split = split(body.as_bytes()).expect("a regular body");
        assert_eq!(
            split.messages,
            [
                br#"{"role":"system","content":"be \"terse\" }]"}"#.as_slice(),
                br#"{"role": "user", "content": [{"type": "text", "text": "hi {"}], "name": "x\\"}"#,
            ]
        );
        let rest = std::str::from_utf8(&split.rest).expect("text");
        assert!(rest.contains(r#""messages" : [], "n": 1"#), "{rest}");
        assert_eq!(split_view(body), serde_view(body));
    }

    /// A body nested `depth` levels deep, its own object included, in a message or in
    /// another field.
    fn nested(depth: usize, in_message: bool) -> String {
        // The body's object, then the messages array and a message.
        let levels = if in_message { depth - 3 } else { depth - 1 };
        let value = format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        if in_message {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":{value}}}]}}"#)
        } else {
            format!(r#"{{"model":"m","meta":{value},"messages":[{{"role":"user"}}]}}"#)
        }
    }

    #[test]
    fn nesting_is_held_where_serde_json_holds_it() {
        for in_message in [false, true] {
            let deepest = nested(MAX_DEPTH, in_message);
            assert!(serde_json::from_str::<Value>(&deepest).is_ok());
            assert!(split(deepest.as_bytes()).is_some(), "{deepest}");
            let deeper = nested(MAX_DEPTH + 1, in_message);
            assert!(serde_json::from_str::<Value>(&deeper).is_err());
            assert!(split(deeper.as_bytes()).is_none(), "{deeper}");
        }
    }

    #[test]
    fn an_empty_array_has_no_messages() {
        let split = split(br#"{"messages":[ ],"model":"m"}"#).expect("regular");
        assert!(split.messages.is_empty());
        assert_eq!(split.rest, br#"{"messages":[],"model":"m"}"#);
    }

    #[test]
    fn the_first_messages_key_is_taken_and_a_second_kept_for_serde_to_refuse() {
        let plain = split(br#"{"messages":[{"a":1}],"messages":[{"b":2}]}"#).expect("regular");
        assert_eq!(plain.messages, [br#"{"a":1}"#]);
        assert_eq!(plain.rest, br#"{"messages":[],"messages":[{"b":2}]}"#);
        let escaped =
            split(br#"{"messag\u0065s":[{"b":2}],"messages":[{"a":1}]}"#).expect("regular");
        assert_eq!(escaped.messages, [br#"{"a":1}"#]);
        assert_eq!(
            escaped.rest,
            br#"{"messag\u0065s":[{"b":2}],"messages":[]}"#
        );
    }

    #[test]
    fn irregular_bodies_are_left_to_the_full_parse() {
        for body in [
            "",
            "[]",
            r#"{"model":"m"}"#,
            r#"{"messages":{}}"#,
            r#"{"messages":"[]"}"#,
            r#"{"messages":[1]}"#,
            r#"{"messages":[{"a":1} {"b":2}]}"#,
            r#"{"messages":[{"a":1},]}"#,
            r#"{"messages":[{"a":1}"#,
            r#"{"messages":[{"a":"1}]}"#,
            r#"{"messag\u0065s":[{"a":1}]}"#,
            r#"{"messages":[{"a":1}]} x"#,
            r#"{"messages":[{"a":1}]"#,
            r#"{"messages" [{"a":1}]}"#,
            r#"{"model":,"messages":[{"a":1}]}"#,
            r#"{model:1,"messages":[{"a":1}]}"#,
            r#"{"messages":[{"a":1}],}"#,
        ] {
            assert!(split(body.as_bytes()).is_none(), "{body}");
        }
    }

    /// A chat body to mutate: strings with escapes and brackets, nested content, scalars.
    const SEED_BODY: &str = r#"{"model":"gpt-4o","temperature":0.5,"messages":[{"role":"system","content":"be \"terse\" {]"},{"role":"user","content":[{"type":"text","text":"a\\b"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":[1]}"}}]}],"stream":false,"tools":[{"type":"function"}]}"#;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Whatever a mutated body looks like: when it splits, and every message and the
        /// rest are valid JSON on their own (what the caller checks), the body is valid JSON
        /// and serde_json finds the same messages and the same rest.
        #[test]
        fn a_checked_split_agrees_with_serde(
            edits in proptest::collection::vec(
                (
                    0..SEED_BODY.len(),
                    prop::sample::select(b"{}[]\",:\\ ax1\n".to_vec()),
                    0..3u8,
                ),
                1..4,
            )
        ) {
            let mut bytes = SEED_BODY.as_bytes().to_vec();
            for (at, byte, edit) in edits {
                let at = at.min(bytes.len() - 1);
                match edit {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ => { bytes.remove(at); }
                }
            }
            let Some(split) = split(&bytes) else { return Ok(()) };
            let messages_valid = split.messages.iter().all(|m| {
                std::str::from_utf8(m)
                    .is_ok_and(|m| serde_json::from_str::<Value>(m).is_ok_and(|v| v.is_object()))
            });
            let rest_valid = std::str::from_utf8(&split.rest)
                .is_ok_and(|rest| serde_json::from_str::<Value>(rest).is_ok());
            if messages_valid && rest_valid {
                let body = std::str::from_utf8(&bytes);
                let parses = body.is_ok_and(|b| serde_json::from_str::<Value>(b).is_ok());
                prop_assert!(parses, "{:?}", body);
                let body = body.unwrap_or_default();
                if let Some(expected) = serde_view(body) {
                    prop_assert_eq!(split_view(body), Some(expected), "{}", body);
                }
            }
        }
    }

    proptest! {
        /// Borrows across bytes (`#` after `"`, `]` after `\`) and bytes over 0x7f included.
        #[test]
        fn the_first_quote_or_backslash_is_found(
            text in proptest::collection::vec(
                prop::sample::select(b"\"\\#]!\x01\x00\xff\xa2a".to_vec()),
                0..24,
            )
        ) {
            let naive = text.iter().position(|&b| b == b'"' || b == b'\\');
            prop_assert_eq!(quote_or_backslash(&text), naive, "{:?}", text);
        }
    }

    #[test]
    fn the_seed_body_splits_as_serde_reads_it() {
        assert_eq!(
            split(SEED_BODY.as_bytes()).map(|s| s.messages.len()),
            Some(3)
        );
        assert_eq!(split_view(SEED_BODY), serde_view(SEED_BODY));
    }
}
