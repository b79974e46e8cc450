//! The path rule on any path: a path found clean has no segment that a server resolving dot
//! segments or decoding escapes would read differently.
#![no_main]

use condenser::server::clean_path::unclean;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if unclean(path).is_some() {
        return;
    }
    let Some(segments) = path.strip_prefix('/') else {
        panic!("clean without a leading /: {path:?}");
    };
    if segments.is_empty() {
        return;
    }
    for segment in segments.split('/') {
        assert!(!segment.is_empty(), "an empty segment in {path:?}");
        assert!(!segment.contains('\\'), "a backslash in {path:?}");
        let lower = segment.to_ascii_lowercase();
        let decoded: String = {
            let mut out = String::new();
            let bytes = lower.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                // Two hex digits exactly: `from_str_radix` alone would take `%+b` for 0x0b,
                // which no server decodes.
                let escaped = bytes
                    .get(i + 1..i + 3)
                    .filter(|hex| bytes[i] == b'%' && hex.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                match escaped {
                    Some(byte) => {
                        out.push(char::from(byte));
                        i += 3;
                    }
                    None => {
                        out.push(char::from(bytes[i]));
                        i += 1;
                    }
                }
            }
            out
        };
        assert!(
            decoded != "." && decoded != "..",
            "a dot segment in {path:?}"
        );
        assert!(
            !decoded.contains('/') && !decoded.contains('\\'),
            "an encoded slash in {path:?}"
        );
        assert!(
            !decoded.chars().any(|c| c.is_ascii_control()),
            "a control byte in {path:?}"
        );
    }
});
