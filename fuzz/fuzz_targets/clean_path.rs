//! The path rule on any path: a path found clean has no segment that a server resolving dot
//! segments or decoding escapes would read differently, decoded once or twice (a server behind
//! another decodes again), with a segment's `;` parameters dropped (Tomcat, Jetty) or its
//! trailing dots and spaces (Windows), and no escape that is not UTF-8 (an overlong `.`).
#![no_main]

use condenser::server::clean_path::unclean;
use libfuzzer_sys::fuzz_target;

/// `%XX` escapes decoded, two hex digits exactly: `from_str_radix` alone would take `%+b` for
/// 0x0b, which no server decodes.
fn decoded(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 3)
            .filter(|hex| bytes[i] == b'%' && hex.iter().all(u8::is_ascii_hexdigit))
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether a lenient server reads `segment` as `.` or `..`: its `;` parameters dropped, then
/// its trailing spaces and dots, a segment of dots alone is one.
fn read_as_dot_segment(segment: &[u8]) -> bool {
    let kept = segment.split(|&b| b == b';').next().unwrap_or_default();
    let end = kept
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(0, |last| last + 1);
    let kept = &kept[..end];
    !kept.is_empty() && kept.iter().all(|&b| b == b'.')
}

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
        let once = decoded(segment.as_bytes());
        let twice = decoded(&once);
        for (reading, bytes) in [("as sent", segment.as_bytes()), ("decoded once", &once), ("decoded twice", &twice)] {
            assert!(
                std::str::from_utf8(bytes).is_ok(),
                "not UTF-8 {reading} in {path:?}"
            );
            assert!(
                !read_as_dot_segment(bytes),
                "a dot segment {reading} in {path:?}"
            );
            assert!(
                !bytes.contains(&b'/') && !bytes.contains(&b'\\'),
                "a slash or backslash {reading} in {path:?}"
            );
            assert!(
                !bytes.iter().any(u8::is_ascii_control),
                "a control byte {reading} in {path:?}"
            );
        }
    }
});
