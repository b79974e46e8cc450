//! condenser in front of a raw TCP upstream that misbehaves on cue. Each case asserts what
//! the client gets, how many times upstream received the request, and that the next normal
//! request is served.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

mod replies;

const CHAT: &str = "/v1/chat/completions";
const PASSTHROUGH: &str = "/v1/embeddings";

/// What the upstream does with one request it has read in full.
#[derive(Clone)]
enum Act {
    /// A normal JSON answer; the connection stays open.
    Answer,
    /// These bytes in one write; the connection stays open.
    Send(Vec<u8>),
    /// These bytes in writes of `piece` bytes each.
    Trickle(Vec<u8>, usize),
    /// These bytes, then close.
    SendAndClose(Vec<u8>),
    /// These bytes, then a reset (SO_LINGER 0).
    SendAndReset(Vec<u8>),
    /// No answer; the connection stays open until condenser closes it.
    Silence,
    /// A normal answer, then upstream closes its side of the idle connection and waits for
    /// condenser to close its own.
    AnswerThenHangUp,
}

/// A request as upstream received it, and on which of its connections.
#[derive(Debug, Clone)]
struct Seen {
    connection: usize,
    request_line: String,
}

struct Hostile {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connection numbers, each sent once condenser has closed that connection.
    closed_by_condenser: mpsc::UnboundedReceiver<usize>,
}

fn answer() -> Vec<u8> {
    let body = completion("fine", 3, 1).to_string();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one request's head and Content-Length body; None once the peer has closed.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(head.lines().next().unwrap_or_default().to_string())
}

/// Waits for condenser to close the connection, discarding whatever it sends.
async fn until_closed(stream: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
}

impl Hostile {
    /// Requests are answered by `script` in order, then normally.
    async fn start(script: Vec<Act>) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let (closed_tx, closed_by_condenser) = mpsc::unbounded_channel();
        let record = seen.clone();
        tokio::spawn(async move {
            for connection in 0.. {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                stream.set_nodelay(true).unwrap();
                let (seen, script, closed) = (record.clone(), script.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    while let Some(request_line) = read_request(&mut stream).await {
                        seen.lock().unwrap().push(Seen {
                            connection,
                            request_line,
                        });
                        let act = script.lock().unwrap().pop_front().unwrap_or(Act::Answer);
                        // Write errors are condenser hanging up on a reply it refused.
                        match act {
                            Act::Answer => {
                                let _ = stream.write_all(&answer()).await;
                            }
                            Act::Send(bytes) => {
                                let _ = stream.write_all(&bytes).await;
                            }
                            Act::Trickle(bytes, piece) => {
                                for chunk in bytes.chunks(piece) {
                                    if stream.write_all(chunk).await.is_err() {
                                        break;
                                    }
                                }
                            }
                            Act::SendAndClose(bytes) => {
                                let _ = stream.write_all(&bytes).await;
                                return;
                            }
                            Act::SendAndReset(bytes) => {
                                let _ = stream.write_all(&bytes).await;
                                socket2::SockRef::from(&stream)
                                    .set_linger(Some(Duration::ZERO))
                                    .unwrap();
                                return;
                            }
                            Act::Silence => break,
                            Act::AnswerThenHangUp => {
                                stream.write_all(&answer()).await.unwrap();
                                stream.shutdown().await.unwrap();
                                break;
                            }
                        }
                    }
                    until_closed(&mut stream).await;
                    let _ = closed.send(connection);
                });
            }
        });
        Hostile {
            addr,
            seen,
            closed_by_condenser,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// condenser with one worker, so consecutive requests share its upstream connection pool.
async fn condenser_before(upstream: &Hostile, timeout_secs: u64) -> Proxy {
    Proxy::start(one_worker_config(upstream, timeout_secs)).await
}

fn one_worker_config(upstream: &Hostile, timeout_secs: u64) -> condenser::Config {
    let mut config = config_for(&format!("http://{}", upstream.addr));
    config.server.workers = 1;
    config.upstream.timeout_secs = timeout_secs;
    config
}

fn request_body(path: &str, stream: bool) -> Value {
    match path {
        CHAT => {
            json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        }
        _ => json!({"model": "text-embedding-3-small", "input": "hi"}),
    }
}

async fn post(proxy: &Proxy, path: &str) -> reqwest::Response {
    within(
        "a response",
        client()
            .post(proxy.url(path))
            .json(&request_body(path, false))
            .send(),
    )
    .await
    .unwrap()
}

async fn assert_served(proxy: &Proxy, path: &str) {
    let response = post(proxy, path).await;
    assert_eq!(response.status(), 200, "{path}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "fine", "{path}");
}

async fn assert_error(response: reqwest::Response, status: u16, code: &str) {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

async fn failures(proxy: &Proxy, kind: &str) -> f64 {
    let series = format!("condenser_upstream_failures_total{{kind=\"{kind}\"}}");
    metric(&proxy.metrics().await, &series).unwrap_or(0.0)
}

/// A broken reply to the one request after a normal one: the client gets `status` and
/// `code`, upstream saw the request once, the failure is counted as `kind`, and the next
/// request is served.
async fn assert_refused(path: &str, broken: Act, status: u16, code: &str, kind: &str) {
    let upstream = Hostile::start(vec![Act::Answer, broken]).await;
    let proxy = condenser_before(&upstream, 600).await;
    assert_served(&proxy, path).await;
    assert_error(post(&proxy, path).await, status, code).await;
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(failures(&proxy, kind).await, 1.0, "{kind}");
    assert_served(&proxy, path).await;
    assert_eq!(upstream.seen().len(), 3);
}

/// RFC 9110 §9.2.2: a request upstream received whole is never sent again, whatever the
/// connection does next.
#[tokio::test]
async fn a_request_written_on_a_reused_connection_that_then_fails_is_not_sent_again() {
    let partial_head = b"HTTP/1.1 200 OK\r\ncontent-type: applic".to_vec();
    for path in [CHAT, PASSTHROUGH] {
        for (what, broken) in [
            ("close", Act::SendAndClose(Vec::new())),
            ("reset", Act::SendAndReset(Vec::new())),
            (
                "part of a head, then close",
                Act::SendAndClose(partial_head.clone()),
            ),
            (
                "part of a head, then reset",
                Act::SendAndReset(partial_head.clone()),
            ),
        ] {
            let upstream = Hostile::start(vec![Act::Answer, broken]).await;
            let proxy = condenser_before(&upstream, 600).await;
            assert_served(&proxy, path).await;
            assert_error(post(&proxy, path).await, 502, "upstream_unreachable").await;
            let seen = upstream.seen();
            assert_eq!(seen.len(), 2, "{path} {what}: {seen:?}");
            assert_eq!(seen[0].connection, seen[1].connection, "{what}: reused");
            assert!(seen[1].request_line.starts_with("POST "), "{seen:?}");
            assert_eq!(failures(&proxy, "reset").await, 1.0, "{path} {what}");
            assert_served(&proxy, path).await;
            let seen = upstream.seen();
            assert_eq!(seen.len(), 3, "{path} {what}: {seen:?}");
            assert_ne!(seen[2].connection, seen[1].connection);
        }
    }
}

#[tokio::test]
async fn malformed_chunk_sizes_are_a_broken_reply() {
    for size in ["zz", "-1", "1ffffffffffffffffff"] {
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{size}\r\n{{}}\r\n0\r\n\r\n"
        );
        for path in [CHAT, PASSTHROUGH] {
            let broken = Act::Send(reply.clone().into_bytes());
            assert_refused(path, broken, 502, "upstream_error", "malformed").await;
        }
    }
}

#[tokio::test]
async fn an_unrequested_switch_of_protocols_is_a_broken_reply() {
    let reply =
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n";
    for path in [CHAT, PASSTHROUGH] {
        let broken = Act::Send(reply.to_vec());
        assert_refused(path, broken, 502, "upstream_error", "malformed").await;
    }
}

#[tokio::test]
async fn framing_a_proxy_must_not_pass_on_is_a_broken_reply() {
    let gzip_chunked = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    let length_and_chunked = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    for reply in [&gzip_chunked[..], &length_and_chunked[..]] {
        for path in [CHAT, PASSTHROUGH] {
            let broken = Act::Send(reply.to_vec());
            assert_refused(path, broken, 502, "upstream_error", "malformed").await;
        }
    }
}

/// A response head with a padding header of `padding` bytes, and a normal answer's body.
fn answer_with_padding(padding: usize) -> Vec<u8> {
    let answer = String::from_utf8(answer()).unwrap();
    let pad = format!("x-padding: {}\r\n", "p".repeat(padding));
    answer
        .replacen("\r\n", &format!("\r\n{pad}"), 1)
        .into_bytes()
}

#[tokio::test]
async fn a_response_head_over_the_limit_is_refused_however_it_arrives() {
    let oversized = answer_with_padding(100 * 1024);
    let under_limit = answer_with_padding(60 * 1024);
    for path in [CHAT, PASSTHROUGH] {
        for broken in [
            Act::Send(oversized.clone()),
            Act::Trickle(oversized.clone(), 512),
        ] {
            assert_refused(path, broken, 502, "upstream_error", "malformed").await;
        }
        let upstream = Hostile::start(vec![
            Act::Send(under_limit.clone()),
            Act::Trickle(under_limit.clone(), 512),
        ])
        .await;
        let proxy = condenser_before(&upstream, 600).await;
        for _ in 0..2 {
            assert_served(&proxy, path).await;
        }
        assert_eq!(upstream.seen().len(), 2);
    }
}

#[tokio::test]
async fn informational_responses_before_the_reply_are_passed_over() {
    let mut reply =
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
            .to_vec();
    reply.extend(answer());
    for path in [CHAT, PASSTHROUGH] {
        let upstream = Hostile::start(vec![Act::Send(reply.clone())]).await;
        let proxy = condenser_before(&upstream, 600).await;
        assert_served(&proxy, path).await;
        assert_eq!(upstream.seen().len(), 1);
        assert_served(&proxy, path).await;
        assert_eq!(upstream.seen().len(), 2);
    }
}

/// 204 and 304 have no body whatever follows them; what does is never relayed, and never
/// read as the answer to the next request.
#[tokio::test]
async fn bodiless_statuses_with_stray_bytes_are_relayed_without_them() {
    for status in ["204 No Content", "304 Not Modified"] {
        let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\nSTRAY BODY BYTES");
        let upstream = Hostile::start(vec![Act::Answer, Act::Send(reply.into_bytes())]).await;
        let proxy = condenser_before(&upstream, 600).await;
        assert_served(&proxy, PASSTHROUGH).await;
        let response = post(&proxy, PASSTHROUGH).await;
        assert_eq!(response.status().as_str(), &status[..3]);
        assert_eq!(response.bytes().await.unwrap().len(), 0, "{status}");
        assert_eq!(upstream.seen().len(), 2);
        assert_served(&proxy, PASSTHROUGH).await;
        assert_eq!(upstream.seen().len(), 3, "{status}");
    }
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_a_timeout() {
    for path in [CHAT, PASSTHROUGH] {
        let mut upstream = Hostile::start(vec![Act::Answer, Act::Silence]).await;
        let proxy = condenser_before(&upstream, 1).await;
        assert_served(&proxy, path).await;
        assert_error(post(&proxy, path).await, 504, "upstream_timeout").await;
        assert_eq!(upstream.seen().len(), 2);
        assert_eq!(failures(&proxy, "timeout").await, 1.0);
        // The connection left waiting is closed, not kept.
        let abandoned = within(
            "the silent connection closed",
            upstream.closed_by_condenser.recv(),
        )
        .await
        .unwrap();
        assert_eq!(abandoned, upstream.seen()[1].connection);
        assert_served(&proxy, path).await;
        assert_eq!(upstream.seen().len(), 3);
    }
}

/// The sockets on this host in CLOSE_WAIT towards `port`: closed by the peer, not yet by us.
fn close_wait_towards(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| table.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields[2].rsplit(':').next().unwrap();
            u16::from_str_radix(remote_port, 16).unwrap() == port && fields[3] == "08"
        })
        .count()
}

#[tokio::test]
async fn an_idle_connection_upstream_closes_is_closed_at_once_and_not_reused() {
    let mut upstream = Hostile::start(vec![Act::AnswerThenHangUp]).await;
    let proxy = condenser_before(&upstream, 600).await;
    assert_served(&proxy, CHAT).await;
    // Upstream hung up on the idle connection; condenser closes its side with no request
    // to make it look.
    let closed = within(
        "condenser closing the idle connection",
        upstream.closed_by_condenser.recv(),
    )
    .await
    .unwrap();
    assert_eq!(closed, upstream.seen()[0].connection);
    assert_eq!(close_wait_towards(upstream.addr.port()), 0);
    assert_served(&proxy, CHAT).await;
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0].connection, seen[1].connection);
    assert_eq!(failures(&proxy, "reset").await, 0.0);
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let mut upstream = Hostile::start(Vec::new()).await;
    let mut config = one_worker_config(&upstream, 600);
    config.upstream.idle_timeout_secs = 1;
    let proxy = Proxy::start(config).await;
    assert_served(&proxy, PASSTHROUGH).await;
    let closed = within(
        "condenser closing the idle connection",
        upstream.closed_by_condenser.recv(),
    )
    .await
    .unwrap();
    assert_eq!(closed, upstream.seen()[0].connection);
    assert_served(&proxy, PASSTHROUGH).await;
    let seen = upstream.seen();
    assert_ne!(seen[0].connection, seen[1].connection);
}

#[tokio::test]
async fn a_stream_cut_mid_event_aborts_the_client_stream() {
    let first = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n";
    let cut = "data: {\"choices\":[{\"ind";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{cut}",
        first.len(),
        cut.len() + 40,
    );
    for path in [CHAT, PASSTHROUGH] {
        let upstream = Hostile::start(vec![
            Act::Answer,
            Act::SendAndClose(reply.clone().into_bytes()),
        ])
        .await;
        let proxy = condenser_before(&upstream, 600).await;
        assert_served(&proxy, path).await;
        let response = within(
            "the stream's head",
            client()
                .post(proxy.url(path))
                .json(&request_body(path, true))
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        let mut stream = response.bytes_stream();
        let mut received = Vec::new();
        let outcome = loop {
            match within("the stream", stream.next()).await {
                Some(Ok(bytes)) => received.extend_from_slice(&bytes),
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        };
        assert!(outcome.is_err(), "{path}: the stream ended cleanly");
        let received = String::from_utf8(received).unwrap();
        assert!(received.contains("hel"), "{received}");
        assert_eq!(upstream.seen().len(), 2);
        assert_eq!(failures(&proxy, "reset").await, 1.0);
        assert_served(&proxy, path).await;
        assert_eq!(upstream.seen().len(), 3);
    }
}

/// The keys a hostile upstream echoes: condenser's own (`upstream.api_key_env`), a route's,
/// and the caller's.
const INJECTED_KEY: &str = "sk-INJECTED-0001-secret";
const ROUTE_KEY: &str = "sk-ant-ROUTE-0002-secret";
const CALLER_KEY: &str = "sk-CALLER-0003-secret";

const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

/// condenser in front of `upstream` with a key of its own for it, and a `claude-*` route to
/// the same upstream with the route's key.
fn keyed_config(upstream: &Hostile) -> condenser::Config {
    std::env::set_var("CONDENSER_TEST_HOSTILE_INJECTED_KEY", INJECTED_KEY);
    std::env::set_var("CONDENSER_TEST_HOSTILE_ROUTE_KEY", ROUTE_KEY);
    let mut config = one_worker_config(upstream, 600);
    config.upstream.api_key_env = "CONDENSER_TEST_HOSTILE_INJECTED_KEY".into();
    config.routes.push(condenser::config::RouteConfig {
        models: vec!["claude-*".into()],
        base_url: format!("http://{}", upstream.addr),
        api_key_env: "CONDENSER_TEST_HOSTILE_ROUTE_KEY".into(),
        ..Default::default()
    });
    config
}

/// A request on `path` for `model`, with the caller's key when `caller` is set.
fn keyed_request(proxy: &Proxy, path: &str, model: &str, caller: bool) -> reqwest::RequestBuilder {
    let body = match path {
        MESSAGES => {
            json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        }
        RESPONSES => json!({"model": model, "input": "hi"}),
        CHAT => json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        _ => json!({"model": model, "input": "hi"}),
    };
    let request = client().post(proxy.url(path)).json(&body);
    match caller {
        true => request.header("authorization", format!("Bearer {CALLER_KEY}")),
        false => request,
    }
}

/// Each path with each key condenser sends on it: the one it injects (the route's for a
/// `claude-*` model, else its own) and the caller's. Pass-through reaches the route by a
/// path that names its model.
fn keyed_cases() -> Vec<(&'static str, &'static str, bool, &'static str)> {
    let mut cases = Vec::new();
    for path in [CHAT, MESSAGES, RESPONSES, PASSTHROUGH] {
        let routed = match path {
            PASSTHROUGH => "/v1/messages/count_tokens",
            _ => path,
        };
        cases.push((path, "gpt-4o", false, INJECTED_KEY));
        cases.push((routed, "claude-x", false, ROUTE_KEY));
        cases.push((path, "gpt-4o", true, CALLER_KEY));
    }
    cases
}

/// `text` with every character written as a JSON `\u` escape.
fn json_escaped(text: &str) -> String {
    text.chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect()
}

fn error_text(key_as_written: &str) -> String {
    format!(
        r#"{{"error":{{"message":"Incorrect API key provided: Bearer {key_as_written}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
    )
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body).unwrap();
    encoder.finish().unwrap()
}

/// A reply with `status`, `headers` (each line ending in CRLF) and `body`, framed by its length.
fn with_length(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

/// Every way found to slip `key` past a scan of small, declared-length error bodies, each
/// with what the reply must show instead (`[redacted]` where the key stood, or nothing of it).
fn leaks(key: &str) -> Vec<(&'static str, Act)> {
    let text = error_text(key);
    let split = text.find(key).unwrap() + key.len() / 2;
    let (first, second) = text.split_at(split);
    let chunked = format!(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len()
    );
    let event = format!("event: error\ndata: {text}\n\n");
    let sse = format!(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n0\r\n\r\n",
        event.len()
    );
    let close_delimited = format!(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{text}"
    );
    let padded = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: Bearer {key}","padding":"{}"}}}}"#,
        "p".repeat(100 * 1024)
    );
    let compressed = gzip(text.as_bytes());
    let echoing_headers = format!("www-authenticate: Bearer realm=\"{key}\"\r\nx-echo-key: {key}\r\ncontent-type: application/json\r\n");
    let answer_body = completion("fine", 3, 1).to_string();
    vec![
        ("chunked, split across two chunks", Act::Send(chunked.into_bytes())),
        ("server-sent events", Act::Send(sse.into_bytes())),
        ("close-delimited", Act::SendAndClose(close_delimited.into_bytes())),
        (
            "declared length over 64 KiB",
            Act::Send(with_length("401 Unauthorized", "content-type: application/json\r\n", padded.as_bytes())),
        ),
        (
            "gzip",
            Act::Send(with_length(
                "401 Unauthorized",
                "content-type: application/json\r\ncontent-encoding: gzip\r\n",
                &compressed,
            )),
        ),
        (
            "JSON \\u escapes",
            Act::Send(with_length(
                "401 Unauthorized",
                "content-type: application/json\r\n",
                error_text(&json_escaped(key)).as_bytes(),
            )),
        ),
        (
            "headers of an error",
            Act::Send(with_length(
                "401 Unauthorized",
                &echoing_headers,
                br#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            )),
        ),
        (
            "headers of a success",
            Act::Send(with_length("200 OK", &echoing_headers, answer_body.as_bytes())),
        ),
    ]
}

/// Nothing of `key` in the reply, raw or escaped, in a header's name or value or its body;
/// the body as the client got it.
async fn keyless(response: reqwest::Response, key: &str, what: &str) -> String {
    for (name, value) in response.headers() {
        assert!(
            !name.as_str().contains(&key.to_ascii_lowercase()),
            "{what}: header {name}"
        );
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(!value.contains(key), "{what}: {name}: {value}");
    }
    assert!(
        response.headers().get("content-encoding").is_none(),
        "{what}"
    );
    let body = within("the reply's body", response.bytes()).await.unwrap();
    let body = String::from_utf8_lossy(&body).into_owned();
    for written in [key.to_string(), json_escaped(key)] {
        assert!(!body.contains(&written), "{what}: {body:.300}");
    }
    body
}

/// Issue 28: keys reached clients in every framing but a small declared length. Each leak,
/// on each path, with each key condenser sends: none reaches the client, and the key's place
/// in an error body reads `[redacted]`.
#[tokio::test]
async fn no_key_reaches_the_client_whatever_the_framing_of_the_reply() {
    let cases = keyed_cases();
    let script: Vec<Act> = cases
        .iter()
        .flat_map(|(_, _, _, key)| leaks(key).into_iter().map(|(_, act)| act))
        .collect();
    let upstream = Hostile::start(script).await;
    let proxy = Proxy::start(keyed_config(&upstream)).await;
    let mut requests = 0;
    for (path, model, caller, key) in cases {
        for (leak, _) in leaks(key) {
            let what = format!("{path} {model} caller={caller}, {leak}");
            let response = within(&what, keyed_request(&proxy, path, model, caller).send())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = keyless(response, key, &what).await;
            requests += 1;
            assert_eq!(upstream.seen().len(), requests, "{what}: sent once");
            if leak.starts_with("headers") {
                assert_eq!(
                    status,
                    if leak.ends_with("success") { 200 } else { 401 },
                    "{what}"
                );
                continue;
            }
            assert_eq!(status, 401, "{what}: {body:.300}");
            assert!(body.contains("Bearer [redacted]"), "{what}: {body:.300}");
        }
    }
}

/// An error body too large to scan whole is never relayed: condenser answers upstream's status
/// with its own error in the shape of the path's API, saying the body was withheld. Declared or
/// not, compressed or not.
#[tokio::test]
async fn an_error_body_over_the_bound_is_withheld_in_the_dialects_shape() {
    let huge = format!(
        r#"{{"error":{{"message":"Bearer {INJECTED_KEY}","padding":"{}"}}}}"#,
        "p".repeat(300 * 1024)
    );
    let chunked = {
        let mut reply = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for piece in huge.as_bytes().chunks(16 * 1024) {
            reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            reply.extend_from_slice(piece);
            reply.extend_from_slice(b"\r\n");
        }
        reply.extend_from_slice(b"0\r\n\r\n");
        reply
    };
    let forms = [
        with_length(
            "429 Too Many Requests",
            "content-type: application/json\r\n",
            huge.as_bytes(),
        ),
        chunked,
        // Small on the wire, over the bound once decoded.
        with_length(
            "429 Too Many Requests",
            "content-type: application/json\r\ncontent-encoding: gzip\r\n",
            &gzip(huge.as_bytes()),
        ),
    ];
    let paths = [CHAT, MESSAGES, RESPONSES, PASSTHROUGH];
    let script = paths
        .iter()
        .flat_map(|_| forms.iter().cloned().map(Act::Send))
        .collect();
    let upstream = Hostile::start(script).await;
    let proxy = Proxy::start(keyed_config(&upstream)).await;
    for path in paths {
        for form in 0..forms.len() {
            let what = format!("{path}, form {form}");
            let response = within(&what, keyed_request(&proxy, path, "gpt-4o", false).send())
                .await
                .unwrap();
            assert_eq!(response.status(), 429, "{what}");
            let body: Value =
                serde_json::from_str(&keyless(response, INJECTED_KEY, &what).await).unwrap();
            let message = match path {
                MESSAGES => {
                    assert_eq!(body["type"], "error", "{what}: {body}");
                    assert_eq!(body["error"]["type"], "rate_limit_error", "{what}: {body}");
                    body["error"]["message"].as_str().unwrap().to_string()
                }
                _ => {
                    assert_eq!(
                        body["error"]["code"], "upstream_reply_withheld",
                        "{what}: {body}"
                    );
                    body["error"]["message"].as_str().unwrap().to_string()
                }
            };
            assert!(
                message.contains("429") && message.contains("withheld"),
                "{what}: {message}"
            );
        }
    }
    assert_eq!(upstream.seen().len(), paths.len() * forms.len());
}

/// A client on a bare socket that has sent `method path` with `body` (none when empty),
/// written by hand so the test decides how the connection ends.
async fn raw_request(proxy: &Proxy, method: &str, path: &str, body: &str) -> TcpStream {
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let framing = match body.is_empty() {
        true => String::new(),
        false => format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ),
    };
    let request = format!("{method} {path} HTTP/1.1\r\nhost: condenser\r\n{framing}\r\n{body}");
    client.write_all(request.as_bytes()).await.unwrap();
    client
}

/// Issue 28: an abandoned request ran until upstream answered, and was billed. A client that
/// leaves while its request waits on upstream (a FIN after the request, or a reset), streamed
/// or not, intercepted or passed through, has the upstream request closed at once, long
/// before the upstream would have answered; each is counted as 499.
#[tokio::test]
async fn a_client_that_leaves_while_upstream_thinks_cancels_the_upstream_request() {
    let chat = |stream| request_body(CHAT, stream).to_string();
    let embeddings = request_body(PASSTHROUGH, false).to_string();
    let cases = [
        ("POST", CHAT, chat(false), "FIN"),
        ("POST", CHAT, chat(true), "FIN"),
        ("POST", CHAT, chat(false), "reset"),
        ("POST", CHAT, chat(true), "reset"),
        ("POST", PASSTHROUGH, embeddings, "FIN"),
        ("GET", "/v1/models", String::new(), "FIN"),
    ];
    let mut upstream = Hostile::start(vec![Act::Silence; cases.len()]).await;
    let proxy = condenser_before(&upstream, 600).await;
    for (i, (method, path, body, how)) in cases.iter().enumerate() {
        let what = format!("{method} {path} {body:.40} {how}");
        let client = raw_request(&proxy, method, path, body).await;
        // Upstream has the request, and would answer in 3 s.
        within("upstream has the request", async {
            while upstream.seen().len() <= i {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if *how == "reset" {
            socket2::SockRef::from(&client)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(client);
        let left = std::time::Instant::now();
        let closed = within(&what, upstream.closed_by_condenser.recv())
            .await
            .unwrap();
        let noticed = left.elapsed();
        eprintln!("{what}: upstream saw the close {noticed:?} after the client left");
        assert_eq!(closed, upstream.seen()[i].connection, "{what}");
        assert!(noticed < Duration::from_secs(1), "{what}: {noticed:?}");
    }
    let metrics = proxy.metrics().await;
    for (route, cancelled) in [("chat_completions", 4.0), ("passthrough", 2.0)] {
        let series = format!(r#"condenser_requests_total{{route="{route}",status="499"}}"#);
        assert_eq!(metric(&metrics, &series), Some(cancelled), "{metrics}");
    }
    assert_served(&proxy, CHAT).await;
}

/// A 200 reply, chunked, in pieces of 7 bytes so that a key is always split.
fn chunked_success(content_type: &str, body: &str, trailers: &str) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for piece in body.as_bytes().chunks(7) {
        reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        reply.extend_from_slice(piece);
        reply.extend_from_slice(b"\r\n");
    }
    reply.extend_from_slice(format!("0\r\n{trailers}\r\n").as_bytes());
    reply
}

/// The success event that comes before each error: it must reach the client byte for byte.
const SUCCESS_EVENT: &str =
    "data: {\"choices\":[{\"delta\":{\"content\":\"error-free text\"}}]}\n\n";

/// Errors inside 200 replies, as each API sends them, each echoing `key`.
fn errors_in_success(key: &str) -> Vec<(&'static str, String, &'static str)> {
    let escaped = json_escaped(key);
    let sse = "text/event-stream";
    vec![
        (
            "Anthropic's event: error",
            format!("{SUCCESS_EVENT}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"bad key {key}\"}}}}\n\n"),
            sse,
        ),
        (
            "OpenAI's data: {\"error\"}",
            format!("{SUCCESS_EVENT}data: {{\"error\":{{\"message\":\"Bearer {escaped}\",\"code\":\"x\"}}}}\n\n"),
            sse,
        ),
        (
            "Responses' response.failed",
            format!("{SUCCESS_EVENT}event: response.failed\ndata: {{\"type\":\"response.failed\",\"response\":{{\"error\":{{\"message\":\"{key}\"}}}}}}\r\n\r\n"),
            sse,
        ),
        // Issue 55: three shapes read as no error, the key relayed: lines ended by a bare CR,
        // one object over two `data:` lines, and a key written with escapes.
        (
            "an event whose lines end in a bare CR",
            format!("{SUCCESS_EVENT}event: error\rdata: {{\"type\":\"error\",\"error\":{{\"message\":\"{key}\"}}}}\r\r"),
            sse,
        ),
        (
            "one object over two data lines",
            format!("{SUCCESS_EVENT}data: {{\"error\":\ndata: {{\"message\":\"bad key {key}\"}}}}\n\n"),
            sse,
        ),
        (
            "an escaped \"error\"",
            format!("{SUCCESS_EVENT}data: {{\"\\u0065rror\":{{\"message\":\"bad key {key}\"}}}}\n\n"),
            sse,
        ),
        (
            "Gemini's error in its JSON array",
            format!("[{{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"hi\"}}]}}}}]}},\n{{\"error\":{{\"code\":500,\"message\":\"{key}\",\"status\":\"INTERNAL\"}}}}]"),
            "application/json",
        ),
    ]
}

/// Issue 37: an upstream that echoed the key in an error event of a 200 stream, or in an
/// error object of a 200 body, had it relayed. On every path, with every key condenser sends,
/// the key is masked there, and the success event before it arrives as it was sent.
#[tokio::test]
async fn no_key_reaches_the_client_in_an_error_inside_a_success_reply() {
    let cases = keyed_cases();
    let script: Vec<Act> = cases
        .iter()
        .flat_map(|(_, _, _, key)| {
            errors_in_success(key)
                .into_iter()
                .map(|(_, body, content_type)| Act::Send(chunked_success(content_type, &body, "")))
        })
        .collect();
    let upstream = Hostile::start(script).await;
    let proxy = Proxy::start(keyed_config(&upstream)).await;
    for (path, model, caller, key) in cases {
        for (error, sent, _) in errors_in_success(key) {
            let what = format!("{path} {model} caller={caller}, {error}");
            let response = within(&what, keyed_request(&proxy, path, model, caller).send())
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{what}");
            let body = keyless(response, key, &what).await;
            assert!(body.contains(&"*".repeat(key.len())), "{what}: {body}");
            if sent.starts_with(SUCCESS_EVENT) {
                assert!(body.starts_with(SUCCESS_EVENT), "{what}: {body}");
            }
        }
    }
}

type Http2Sender = hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// A client speaking HTTP/2 to condenser (prior knowledge, no TLS).
async fn http2_client(proxy: &Proxy) -> Http2Sender {
    let socket = TcpStream::connect(proxy.addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(socket),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    sender
}

/// The POST of `path`'s request body, for `http2_client`.
fn http2_post(proxy: &Proxy, path: &str) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    hyper::Request::post(proxy.url(path))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            request_body(path, false).to_string(),
        )))
        .unwrap()
}

/// Issue 37: trailers of a 2xx body passed as they came, and an HTTP/2 client read the key
/// back from one. Now they lose it as headers do.
#[tokio::test]
async fn no_key_reaches_an_http2_client_in_a_trailer() {
    use http_body_util::BodyExt;
    let body = completion("fine", 3, 1).to_string();
    let trailers = format!("x-echo-key: {INJECTED_KEY}\r\nx-kept: yes\r\n");
    let upstream = Hostile::start(vec![Act::Send(chunked_success(
        "application/json",
        &body,
        &trailers,
    ))])
    .await;
    let proxy = Proxy::start(keyed_config(&upstream)).await;
    let mut sender = http2_client(&proxy).await;
    let response = within(
        "a response",
        sender.send_request(http2_post(&proxy, PASSTHROUGH)),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let collected = within("the body", response.into_body().collect())
        .await
        .unwrap();
    let trailers = collected.trailers().cloned().expect("trailers relayed");
    assert_eq!(trailers["x-kept"], "yes");
    assert_eq!(trailers["x-echo-key"], "[redacted]");
    assert_eq!(collected.to_bytes(), body.as_bytes());
}

/// Issue 37: a stream's pending event was rescanned on every chunk and held without bound.
/// An event over `server.max_event_bytes` reaches the client whole, as sent, without being
/// read, and is counted; the events after it are read again (the usage of the last one).
#[tokio::test]
async fn an_event_over_the_bound_is_relayed_uninspected_and_counted() {
    let big = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(200 * 1024)
    );
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":11,\"total_tokens\":18}}\n\ndata: [DONE]\n\n";
    let stream = format!("{big}{usage}");
    let upstream = Hostile::start(vec![Act::Send(chunked_success(
        "text/event-stream",
        &stream,
        "",
    ))])
    .await;
    let mut config = one_worker_config(&upstream, 600);
    config.server.max_event_bytes = 64 * 1024;
    let proxy = Proxy::start(config).await;
    let response = within(
        "a response",
        client()
            .post(proxy.url(CHAT))
            .json(&json!({"model": "gpt-4o", "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hi"}]}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let body = within("the stream", response.bytes()).await.unwrap();
    assert!(body == stream.as_bytes(), "the stream changed on the way");
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(&metrics, "condenser_uninspected_events_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_completion_tokens_total{model="gpt-4o"}"#
        ),
        Some(11.0),
        "{metrics}"
    );
}

/// Issue 37: a withheld error reply lost the headers that tell a client when to try again.
#[tokio::test]
async fn a_withheld_error_reply_keeps_retry_after_and_the_rate_limit_headers() {
    let huge = format!(
        r#"{{"error":{{"message":"Bearer {INJECTED_KEY}","padding":"{}"}}}}"#,
        "p".repeat(300 * 1024)
    );
    let headers = format!(
        "content-type: application/json\r\nretry-after: 7\r\nx-ratelimit-remaining-requests: 0\r\nanthropic-ratelimit-requests-reset: 2026-01-01T00:00:00Z\r\nx-echo-key: {INJECTED_KEY}\r\n"
    );
    let reply = with_length("429 Too Many Requests", &headers, huge.as_bytes());
    let upstream = Hostile::start(vec![Act::Send(reply.clone()), Act::Send(reply)]).await;
    let proxy = Proxy::start(keyed_config(&upstream)).await;
    for path in [CHAT, PASSTHROUGH] {
        let response = within(path, keyed_request(&proxy, path, "gpt-4o", false).send())
            .await
            .unwrap();
        assert_eq!(response.status(), 429, "{path}");
        for (name, value) in [
            ("retry-after", "7"),
            ("x-ratelimit-remaining-requests", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:00Z"),
        ] {
            assert_eq!(header(&response, name), value, "{path}: {name}");
        }
        assert!(response.headers().get("x-echo-key").is_none(), "{path}");
        let body = keyless(response, INJECTED_KEY, path).await;
        assert!(body.contains("withheld"), "{path}: {body}");
    }
}

/// Issue 37: an HTTP/2 client that reset its stream while its request waited was not counted
/// as 499 (hyper drops the request's work; there is no socket to watch per stream). Its
/// upstream request is closed too.
#[tokio::test]
async fn an_http2_clients_stream_reset_is_counted_as_499() {
    let mut upstream = Hostile::start(vec![Act::Silence, Act::Silence]).await;
    let proxy = condenser_before(&upstream, 600).await;
    let mut sender = http2_client(&proxy).await;
    for (i, path) in [CHAT, PASSTHROUGH].into_iter().enumerate() {
        let waiting = tokio::spawn(sender.send_request(http2_post(&proxy, path)));
        within("upstream has the request", async {
            while upstream.seen().len() <= i {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        // Dropping the response future resets the stream.
        waiting.abort();
        let closed = within(path, upstream.closed_by_condenser.recv())
            .await
            .unwrap();
        assert_eq!(closed, upstream.seen()[i].connection, "{path}");
    }
    let metrics = proxy.metrics().await;
    for route in ["chat_completions", "passthrough"] {
        let series = format!(r#"condenser_requests_total{{route="{route}",status="499"}}"#);
        assert_eq!(metric(&metrics, &series), Some(1.0), "{route}: {metrics}");
    }
}
