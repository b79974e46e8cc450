//! A request's path is clean or refused before anything is forwarded: upstreams and the
//! proxies in front of them may resolve `..`, decode `%2F` or fold `//`, and a path that
//! changes meaning on the way could leave a path-prefixed `base_url` with the operator's key.

use percent_encoding::percent_decode;

/// Why a path is not clean, as the 400 says it; `None`: clean. Every segment after the first
/// `/` is read decoded: no `.` or `..` (raw or percent-encoded), no encoded `/` or `\` and no
/// raw `\`, no empty segment, no control byte (raw or encoded).
pub fn unclean(path: &str) -> Option<&'static str> {
    let Some(segments) = path.strip_prefix('/') else {
        return Some("it does not start with /");
    };
    if segments.is_empty() {
        return None;
    }
    // Most paths hold no byte a segment is refused for (`%`, `\`, `.`, a control byte): then
    // only an empty segment can be wrong, and one pass over the path tells: 350 instructions
    // per chat request where searching each segment apart cost 529 (bench/instructions.sh).
    // The byte before the segments is the path's first `/`.
    let (mut previous, mut empty) = (b'/', false);
    let plain = segments.bytes().all(|byte| {
        empty |= byte == b'/' && previous == b'/';
        previous = byte;
        !matches!(byte, b'%' | b'\\' | b'.') && !byte.is_ascii_control()
    });
    if plain {
        // A segment is empty between two `/`, or after a last one.
        return (empty || previous == b'/').then_some("it has an empty segment");
    }
    // Split and searched as bytes: `str`'s char searchers, set up once per segment and per
    // search, cost about 300 instructions more per request (bench/instructions.sh).
    for segment in segments.as_bytes().split(|&byte| byte == b'/') {
        if segment.is_empty() {
            return Some("it has an empty segment");
        }
        // Most segments encode nothing: read as they stand, with nothing to allocate.
        if !segment.contains(&b'%') {
            if segment.contains(&b'\\') {
                return Some("it has an encoded slash or a backslash");
            }
            if segment == b"." || segment == b".." {
                return Some("it has a . or .. segment");
            }
            if segment.iter().any(u8::is_ascii_control) {
                return Some("it has a control byte");
            }
            continue;
        }
        let lower = segment.to_ascii_lowercase();
        let encodes_a_slash = lower
            .windows(3)
            .any(|escape| escape == b"%2f" || escape == b"%5c");
        if encodes_a_slash || segment.contains(&b'\\') {
            return Some("it has an encoded slash or a backslash");
        }
        let decoded: Vec<u8> = percent_decode(segment).collect();
        if decoded == b"." || decoded == b".." {
            return Some("it has a . or .. segment");
        }
        if decoded.iter().any(u8::is_ascii_control) {
            return Some("it has a control byte");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_change_meaning_on_the_way_are_unclean() {
        for clean in [
            "/",
            "/v1/models",
            "/v1/models/ft:gpt-4o-mini:org::id",
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
            "/v1/files/file-abc.jsonl",
            "/v1/a..b/...",
            "/v1/%41",
        ] {
            assert_eq!(unclean(clean), None, "{clean}");
        }
        for (unclean_path, why) in [
            ("/v1/../admin", "."),
            ("/v1/./models", "."),
            ("/v1/%2e%2E/admin", "."),
            ("/v1/.%2e/admin", "."),
            ("/v1/%2E/admin", "."),
            ("/v1beta/models/gemini-x:foo/../../internal", "."),
            ("/v1/..", "."),
            ("/v1/a%2fb", "slash"),
            ("/v1/a%2Fb", "slash"),
            ("/v1/a%5cb", "slash"),
            ("/v1/a\\b", "slash"),
            ("/v1//models", "empty"),
            ("/v1/models/", "empty"),
            ("//evil.example/v1", "empty"),
            ("//v1/models", "empty"),
            ("/v1/", "empty"),
            ("/v1/a%00b", "control"),
            ("/v1/a%0d%0aX-Injected:1", "control"),
            ("/v1/a%7f", "control"),
        ] {
            let found = unclean(unclean_path);
            assert!(
                found.is_some_and(|w| w.contains(why)),
                "{unclean_path}: {found:?}"
            );
        }
    }
}
