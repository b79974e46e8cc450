//! A request's path is clean or refused before anything is forwarded: upstreams and the
//! proxies in front of them may resolve `..`, decode `%2F` or fold `//`, and a path that
//! changes meaning on the way could leave a path-prefixed `base_url` with the operator's key.

use percent_encoding::percent_decode;

/// Why a path is not clean, as the 400 says it; `None`: clean. Every segment after the first
/// `/` is read as it stands, decoded once and decoded twice (a server behind another may
/// decode again): no dot-segment (`dot_segment`: `.` or `..`, or either with something after
/// it that a server strips, `..;`, `..%20`, `...`), no encoded `/` or `\` and no raw `\`, no
/// empty segment, no control byte, and no escape that decodes to overlong or invalid UTF-8
/// (`%c0%ae`, which a lenient decoder reads as `.`).
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
        if let Some(why) = unclean_segment(segment) {
            return Some(why);
        }
        // Most segments encode nothing: read as they stand, with nothing to allocate.
        if !segment.contains(&b'%') {
            continue;
        }
        let once: Vec<u8> = percent_decode(segment).collect();
        if std::str::from_utf8(&once).is_err() {
            return Some("it has an escape that is not UTF-8 (overlong or invalid)");
        }
        if once.contains(&b'/') {
            return Some("it has an encoded slash or a backslash");
        }
        if let Some(why) = unclean_segment(&once) {
            return Some(why);
        }
        if !once.contains(&b'%') {
            continue;
        }
        let twice: Vec<u8> = percent_decode(&once).collect();
        if std::str::from_utf8(&twice).is_err() {
            return Some("it has an escape that is not UTF-8 (overlong or invalid)");
        }
        if twice.contains(&b'/') {
            return Some("it has an encoded slash or a backslash");
        }
        if let Some(why) = unclean_segment(&twice) {
            return Some(why);
        }
    }
    None
}

/// What is wrong with one segment as read (as it stands, or decoded): a backslash, a
/// dot-segment, a control byte.
fn unclean_segment(segment: &[u8]) -> Option<&'static str> {
    if segment.contains(&b'\\') {
        return Some("it has an encoded slash or a backslash");
    }
    if dot_segment(segment) {
        return Some("it has a . or .. segment");
    }
    if segment.iter().any(u8::is_ascii_control) {
        return Some("it has a control byte");
    }
    None
}

/// Whether some server reads `segment` as `.` or `..`: it is one, or starts with `..`, or is
/// `.` followed by what is neither a letter, a digit, `-` nor `_`. Tomcat and Jetty drop a
/// segment's `;` parameters (`..;x` is `..`), Windows servers its trailing dots and spaces
/// (`... ` is `..`); a name such as `.well-known` stays clean.
fn dot_segment(segment: &[u8]) -> bool {
    match segment {
        [b'.'] | [b'.', b'.', ..] => true,
        [b'.', next, ..] => !(next.is_ascii_alphanumeric() || matches!(next, b'-' | b'_')),
        _ => false,
    }
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
            "/v1/a..b/c..",
            "/v1/%41",
            "/.well-known/x",
            "/v1/files/%25",
            "/v1/files/caf%C3%A9",
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
            // A dot-segment with something after it that a server strips.
            ("/v1beta/..;/..;/x", "."),
            ("/v1/..;jsessionid=1/admin", "."),
            ("/v1/.;/admin", "."),
            ("/v1/..%20/admin", "."),
            ("/v1/.%20/admin", "."),
            ("/v1/.../admin", "."),
            ("/v1/..%3b/admin", "."),
            // Decoded twice.
            ("/v1/%252e%252e/admin", "."),
            ("/v1/%252E/admin", "."),
            ("/v1/a%252fb", "slash"),
            ("/v1/a%255cb", "slash"),
            ("/v1/a%2500b", "control"),
            // Overlong or invalid UTF-8.
            ("/v1/%c0%ae%c0%ae/admin", "UTF-8"),
            ("/v1/%c0%af", "UTF-8"),
            ("/v1/%ff", "UTF-8"),
            ("/v1/%25c0%25ae", "UTF-8"),
        ] {
            let found = unclean(unclean_path);
            assert!(
                found.is_some_and(|w| w.contains(why)),
                "{unclean_path}: {found:?}"
            );
        }
    }
}
