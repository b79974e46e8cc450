//! The headers a request and its reply carry between client and upstream: which describe one
//! hop and are dropped, and which key goes upstream and in which header. Where each API takes
//! a key is its dialect's to say (`Dialect::KEY_STYLE`); the mechanics are here. (Keys kept
//! out of replies: `redact.rs`.)

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::ConfigError;

/// A configured key as a header that takes it bare (Anthropic's `x-api-key`) wants it: the
/// bearer token without `Bearer `, sensitive.
fn bare_key(bearer: &HeaderValue) -> Option<HeaderValue> {
    let bare = bearer.as_bytes().strip_prefix(b"Bearer ")?;
    let mut key = HeaderValue::from_bytes(bare).ok()?;
    key.set_sensitive(true);
    Some(key)
}

/// How an API takes a key, as its dialect declares it: the header a key goes in, the other
/// headers its callers may send one in, and the query parameter that may carry it instead.
/// A path no dialect serves takes a bearer token ([`KeyStyle::BEARER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyStyle {
    /// The header a configured key goes in, in lower case: `authorization`, as a bearer
    /// token, or one that takes it bare (Anthropic's `x-api-key`).
    pub header: &'static str,
    /// Headers its callers may send a key in instead (Azure OpenAI's `api-key`).
    pub also_in: &'static [&'static str],
    /// The query parameter its API takes a key in too (Google's `key`).
    pub query: Option<&'static str>,
}

impl KeyStyle {
    /// OpenAI's: a bearer token in `authorization`.
    pub const BEARER: KeyStyle = KeyStyle {
        header: "authorization",
        also_in: &[],
        query: None,
    };

    /// Every header a caller may send this API's key in.
    pub fn headers(self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.header).chain(self.also_in.iter().copied())
    }

    /// Puts a configured key (`Bearer …`) into `headers` this way; a key that is not a bearer
    /// token goes as it is, in `authorization`.
    pub fn insert(self, headers: &mut HeaderMap, bearer: &HeaderValue) {
        let bare = (self.header != header::AUTHORIZATION.as_str())
            .then(|| bare_key(bearer))
            .flatten();
        match bare {
            Some(key) => {
                headers.insert(HeaderName::from_static(self.header), key);
            }
            None => {
                headers.insert(header::AUTHORIZATION, bearer.clone());
            }
        }
    }

    /// The key a request's query carries, for an API that takes one there (Google's `?key=`).
    pub fn query_key(self, query: Option<&str>) -> Option<HeaderValue> {
        let parameter = self.query?;
        let (_, key) =
            url::form_urlencoded::parse(query?.as_bytes()).find(|(name, _)| name == parameter)?;
        let mut key = HeaderValue::from_str(&key).ok()?;
        key.set_sensitive(true);
        Some(key)
    }

    /// Whether a caller sent a key in this API's own way: in a header other than
    /// `authorization` (which every API's callers use), or in its query parameter.
    pub fn sent_by(self, headers: &HeaderMap, query: Option<&str>) -> bool {
        self.headers()
            .any(|name| name != header::AUTHORIZATION.as_str() && headers.contains_key(name))
            || self.query_key(query).is_some()
    }

    /// The headers that say who the caller is, when its key came in the query rather than a
    /// header: its headers with the key in this API's key header, so that a key is one caller
    /// however it was sent, and a summary asked on its behalf carries it. `None`: the headers
    /// as they are.
    pub fn caller_headers(self, headers: &HeaderMap, query: Option<&str>) -> Option<HeaderMap> {
        // Compared with the few names present rather than parsed into a name to look up:
        // saves about 220 instructions per chat request (bench/instructions.sh). Both are
        // lower case (`self.header` is a name for `HeaderName::from_static`).
        if headers.keys().any(|name| name.as_str() == self.header) {
            return None;
        }
        let key = self.query_key(query)?;
        let mut caller = headers.clone();
        caller.insert(HeaderName::from_static(self.header), key);
        Some(caller)
    }
}

/// An upstream's configured key, for a request whose client sent none of its own (in one of
/// `key_headers`, every API's, or in the query of an API that takes it there), in the style
/// of the API it is sent to.
pub fn inject_key(
    headers: &mut HeaderMap,
    query: Option<&str>,
    bearer: &HeaderValue,
    style: KeyStyle,
    key_headers: &[HeaderName],
) {
    let in_headers = key_headers.iter().any(|name| headers.contains_key(name));
    if in_headers || style.query_key(query).is_some() {
        return;
    }
    style.insert(headers, bearer);
}

/// The value of an environment variable named by an `api_key_env`, as a Bearer header.
pub fn bearer_from_env(var: &str) -> Result<Option<HeaderValue>, ConfigError> {
    if var.is_empty() {
        return Ok(None);
    }
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => HeaderValue::from_str(&format!("Bearer {key}"))
            .map(|mut v| {
                v.set_sensitive(true);
                Some(v)
            })
            .map_err(|_| {
                ConfigError::Invalid(format!("{var} holds characters not allowed in a header"))
            }),
        _ => {
            tracing::warn!(
                var,
                "api_key_env names an unset variable; requests go without a key"
            );
            Ok(None)
        }
    }
}

/// Whether a message's media type (its `Content-Type` before any parameter) is `wanted`,
/// compared as RFC 9110 §8.3.1 says: type and subtype case-insensitively (`Application/JSON`
/// is JSON).
pub fn media_type_is(headers: &HeaderMap, wanted: &str) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|value| {
        let value = value.as_bytes();
        let essence = value.split(|byte| *byte == b';').next().unwrap_or(value);
        essence.trim_ascii().eq_ignore_ascii_case(wanted.as_bytes())
    })
}

/// Whether a body is in a content coding other than `identity`: bytes a client reads only
/// once decoded.
pub fn content_coded(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|value| {
            value.as_bytes().split(|byte| *byte == b',').any(|coding| {
                let coding = coding.trim_ascii();
                !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
            })
        })
}

/// The client's headers minus hop-by-hop ones and Host (the upstream's own is set).
pub fn forwardable_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers
}

/// Headers that describe one HTTP/1.1 hop, not the message, by their lower-case names:
/// dropped from requests before they go upstream and from responses before they go to the
/// client. Matched as bytes, which is a switch on the length and one comparison: a token
/// lower-cased for it need not be checked as UTF-8 again, which cost about 70 instructions
/// per chat request (bench/instructions.sh).
fn is_hop_by_hop_name(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection"
            | b"keep-alive"
            | b"proxy-connection"
            | b"proxy-authenticate"
            | b"proxy-authorization"
            | b"te"
            | b"trailer"
            | b"transfer-encoding"
            | b"upgrade"
    )
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    is_hop_by_hop_name(name.as_str().as_bytes())
}

/// Case-insensitive, as Connection tokens are.
fn is_hop_by_hop_token(token: &str) -> bool {
    // As long as the longest hop-by-hop name, `proxy-authorization`.
    let mut lower = [0u8; 19];
    let Some(lower) = lower.get_mut(..token.len()) else {
        return false;
    };
    lower.copy_from_slice(token.as_bytes());
    lower.make_ascii_lowercase();
    is_hop_by_hop_name(lower)
}

/// The names the Connection header lists as hop-by-hop too, as written; a value that is not
/// text is skipped whole.
fn connection_listed(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Drops the headers that describe one hop, not the message, removing them in the map's
/// order (which decides the order of those left). The two common shapes allocate nothing:
/// no hop-by-hop header at all, and a Connection header alone (most clients send
/// `Connection: keep-alive`) that lists no other header present.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let fixed = headers.keys().filter(|name| is_hop_by_hop(name)).count();
    if fixed == 0 {
        return;
    }
    let lone_connection = fixed == 1
        && headers.contains_key(header::CONNECTION)
        && !connection_listed(headers)
            .any(|token| !is_hop_by_hop_token(token) && headers.contains_key(token));
    if lone_connection {
        headers.remove(header::CONNECTION);
        return;
    }
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            is_hop_by_hop(name)
                || connection_listed(headers).any(|token| token.eq_ignore_ascii_case(name.as_str()))
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A style like Anthropic's: bare, in a header of its own.
    const BARE: KeyStyle = KeyStyle {
        header: "x-api-key",
        also_in: &[],
        query: None,
    };
    /// A style like Google's: bare in its header, or in the query's `key`.
    const BARE_OR_QUERY: KeyStyle = KeyStyle {
        header: "x-goog-api-key",
        also_in: &[],
        query: Some("key"),
    };
    /// Every API's key headers, as the dialects' would be.
    const KEY_HEADERS: [HeaderName; 4] = [
        header::AUTHORIZATION,
        HeaderName::from_static("api-key"),
        HeaderName::from_static("x-api-key"),
        HeaderName::from_static("x-goog-api-key"),
    ];

    #[test]
    fn a_configured_key_goes_as_each_api_wants_it_unless_the_caller_sent_one() {
        let bearer = HeaderValue::from_static("Bearer sk-configured");
        let injected_with_query =
            |style: KeyStyle, client: &[(&'static str, &'static str)], query: Option<&str>| {
                let mut headers = HeaderMap::new();
                for (name, value) in client {
                    headers.insert(*name, HeaderValue::from_static(value));
                }
                inject_key(&mut headers, query, &bearer, style, &KEY_HEADERS);
                headers
            };
        let injected = |style, client: &[(&'static str, &'static str)]| {
            injected_with_query(style, client, None)
        };
        let google = injected(BARE_OR_QUERY, &[]);
        assert_eq!(google["x-goog-api-key"], "sk-configured");
        assert!(google["x-goog-api-key"].is_sensitive());
        assert_eq!(google.len(), 1);
        // Google's key in the query is the caller's own; elsewhere a `key` means nothing.
        let in_query = Some("alt=sse&key=AIza-mine");
        assert!(injected_with_query(BARE_OR_QUERY, &[], in_query).is_empty());
        assert_eq!(
            injected_with_query(KeyStyle::BEARER, &[], in_query).len(),
            1
        );
        assert_eq!(
            injected(BARE_OR_QUERY, &[("x-goog-api-key", "mine")]).len(),
            1
        );
        let anthropic = injected(BARE, &[]);
        assert_eq!(anthropic["x-api-key"], "sk-configured");
        assert!(anthropic["x-api-key"].is_sensitive());
        assert!(!anthropic.contains_key(header::AUTHORIZATION));
        let openai = injected(KeyStyle::BEARER, &[]);
        assert_eq!(openai[header::AUTHORIZATION], "Bearer sk-configured");
        assert!(!openai.contains_key("x-api-key"));
        for (style, own) in [
            (BARE, ("authorization", "Bearer mine")),
            (KeyStyle::BEARER, ("x-api-key", "mine")),
            (KeyStyle::BEARER, ("api-key", "mine")),
        ] {
            let headers = injected(style, &[own]);
            assert_eq!(headers.len(), 1, "the caller's own key alone: {headers:?}");
        }
    }

    #[test]
    fn a_key_in_the_query_is_the_callers_as_if_it_came_in_its_apis_header() {
        let headers = HeaderMap::new();
        let caller = BARE_OR_QUERY.caller_headers(&headers, Some("key=AIza%2Fk&alt=sse"));
        let caller = caller.unwrap();
        assert_eq!(caller["x-goog-api-key"], "AIza/k");
        assert!(caller["x-goog-api-key"].is_sensitive());
        assert!(BARE_OR_QUERY
            .caller_headers(&headers, Some("alt=sse"))
            .is_none());
        assert!(BARE.caller_headers(&headers, Some("key=k")).is_none());
        let mut sent = HeaderMap::new();
        sent.insert("x-goog-api-key", HeaderValue::from_static("header-key"));
        assert!(BARE_OR_QUERY.caller_headers(&sent, Some("key=k")).is_none());
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop,,"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("x-other-hop"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_bytes(b"x-kept, caf\xe9").unwrap(),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("x-other-hop", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("proxy"));
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            h.append(name, HeaderValue::from_static("1"));
        }
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.append("x-kept", HeaderValue::from_static("2"));
        let out = forwardable_headers(h);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["x-kept"], "{out:?}");
        assert_eq!(out.get_all("x-kept").iter().count(), 2);
    }

    #[test]
    fn each_hop_by_hop_header_is_dropped_without_a_connection_header() {
        for name in [
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("1"));
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.keys().collect::<Vec<_>>(), ["content-type"], "{name}");
        }
    }

    #[test]
    fn a_lone_connection_header_is_dropped_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        h.insert("x-request-id", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "x-request-id"]);

        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, not a name, X-Hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("317"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["content-length"]);
    }

    #[test]
    fn the_headers_left_keep_the_order_of_removing_in_map_order() {
        let mut h = HeaderMap::new();
        for name in [
            "a",
            "te",
            "b",
            "connection",
            "c",
            "x-hop",
            "d",
            "upgrade",
            "e",
        ] {
            h.insert(name, HeaderValue::from_static("x-hop"));
        }
        let mut expected = h.clone();
        for name in ["te", "connection", "x-hop", "upgrade"] {
            expected.remove(name);
        }
        strip_hop_by_hop(&mut h);
        assert!(h.iter().eq(expected.iter()), "{h:?}");
    }

    #[test]
    fn headers_without_hop_by_hop_ones_are_left_as_they_are() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
        h.insert("x-keep-alive-ish", HeaderValue::from_static("1"));
        h.append("x-keep-alive-ish", HeaderValue::from_static("2"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }
}
