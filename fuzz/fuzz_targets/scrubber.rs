//! The key scrub on any text and key: no key written raw survives it, and text without the
//! key comes back as it was.
#![no_main]

use condenser::transport::upstream::blank_credentials;
use hyper::header::HeaderValue;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&length, rest)) = data.split_first() else {
        return;
    };
    let length = usize::from(length % 24) + 8;
    if rest.len() < length {
        return;
    }
    let (key, text) = rest.split_at(length);
    // A key is a header value's visible characters, without spaces (one would start a scheme).
    if !key.iter().all(|byte| byte.is_ascii_graphic()) {
        return;
    }
    let Ok(value) = HeaderValue::from_bytes(key) else {
        return;
    };
    let blanked = blank_credentials(text, &[value]);
    let found = |haystack: &[u8]| haystack.windows(key.len()).any(|window| window == key);
    if !found(text) && !text.contains(&b'\\') {
        assert_eq!(&blanked[..], text, "text without the key changed");
    }
    // What blanking leaves cannot hold the key raw, unless `[redacted]` itself made it up
    // with its neighbours.
    if found(&blanked) {
        assert!(
            blanked.windows(10).any(|window| window == b"[redacted]"),
            "the key survived: {key:?} in {blanked:?}"
        );
    }
});
