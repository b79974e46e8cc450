//! The gateway over real HTTP: pass-through, byte-for-byte forwarding, streaming, errors.

use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use condenser::transport::body::{BoxError, ProxyBody};
use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

#[tokio::test]
async fn get_models_passes_through_with_query_and_headers() {
    let upstream = MockUpstream::start(handler(|r| async move {
        let mut response = json_response(
            200,
            &json!({"object": "list", "data": [{"id": "gpt-4o"}], "path": r.path_and_query}),
        );
        let headers = response.headers_mut();
        headers.insert("x-upstream", "yes".parse().unwrap());
        // Hop-by-hop on the way back: not for the client.
        headers.insert("connection", "x-up-hop".parse().unwrap());
        headers.insert("x-up-hop", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        response
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let response = client()
        .get(proxy.url("/v1/models?limit=2&after=x%20y"))
        .header("authorization", "Bearer sk-test")
        .header("x-custom", "kept")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "dropped")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-upstream"], "yes");
    for hop in ["x-up-hop", "keep-alive"] {
        assert!(response.headers().get(hop).is_none(), "{hop} relayed");
    }
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["data"][0]["id"], "gpt-4o");
    let seen = &upstream.recorded()[0];
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path_and_query, "/v1/models?limit=2&after=x%20y");
    assert_eq!(seen.headers["authorization"], "Bearer sk-test");
    assert_eq!(seen.headers["x-custom"], "kept");
    assert!(seen.headers.get("x-hop").is_none());
    assert_eq!(seen.headers["host"], upstream.addr.to_string().as_str());
    assert!(seen.headers.get("transfer-encoding").is_none());
}

/// The body the proxy answers a POST of `body` to `path` with.
async fn post_bytes(proxy: &Proxy, path: &str, body: impl Into<reqwest::Body>) -> bytes::Bytes {
    let response = client().post(proxy.url(path)).body(body).send().await;
    response.unwrap().bytes().await.unwrap()
}

#[tokio::test]
async fn embeddings_and_large_bodies_pass_through_unchanged() {
    let upstream = MockUpstream::start(handler(|r| async move {
        Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(condenser::transport::body::full(r.body))
            .unwrap()
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let embed = br#"{"model":"text-embedding-3-small","input":"hello"}"#.to_vec();
    let echoed = post_bytes(&proxy, "/v1/embeddings", embed.clone()).await;
    assert_eq!(echoed.as_ref(), embed.as_slice());
    let large: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let echoed = post_bytes(&proxy, "/v1/files", large.clone()).await;
    assert_eq!(echoed.len(), large.len());
    assert!(echoed.as_ref() == large.as_slice());
    assert_eq!(upstream.recorded()[1].path_and_query, "/v1/files");

    // A body of unknown length goes upstream chunked, whole and in order.
    let pieces: Vec<Vec<u8>> = (0..5u8)
        .map(|i| vec![b'a' + i; 1000 * (i as usize + 1)])
        .collect();
    let expected = pieces.concat();
    let stream = futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
    let echoed = post_bytes(&proxy, "/v1/uploads", reqwest::Body::wrap_stream(stream)).await;
    assert!(echoed.as_ref() == expected.as_slice());
    let seen = &upstream.recorded()[2];
    assert_eq!(seen.headers["transfer-encoding"], "chunked");
    assert!(seen.headers.get("content-length").is_none());
}

#[tokio::test]
async fn upstream_error_status_and_body_are_passed_on() {
    let error = json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
    let sent = error.clone();
    let upstream = MockUpstream::start(handler(move |_| {
        let sent = sent.clone();
        async move { json_response(429, &sent) }
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    for path in ["/v1/models", "/v1/chat/completions"] {
        let response = client()
            .post(proxy.url(path))
            .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body, error, "{path}");
    }
}

#[tokio::test]
async fn an_unchanged_chat_request_is_forwarded_byte_for_byte() {
    let upstream = MockUpstream::start(handler(|_| async {
        json_response(200, &completion("hi", 20, 2))
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    // Unusual key order, spacing, unknown fields and escapes: all must arrive as sent.
    let body = "{ \"messages\" : [{\"content\":\"caf\\u00e9 \\ud83d\\ude00\",\"role\":\"user\"}],\n \"zeta_unknown\": {\"b\":1,\"a\":[2.50,1e3]}, \"model\":\"gpt-4o\", \"temperature\": 0.70 }";
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-condenser-action"], "forwarded");
    assert_eq!(response.headers()["x-condenser-cache"], "none");
    assert_eq!(response.headers()["x-condenser-summarized-messages"], "0");
    let condensed = Condensed::of(&response);
    let prompt = condensed.prompt_tokens.unwrap();
    assert!(prompt > 5);
    assert_eq!(condensed.forwarded_tokens, Some(prompt));
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "hi");
    assert_eq!(upstream.recorded()[0].body.as_ref(), body.as_bytes());
}

/// A proxy that takes request bodies of up to 4 KiB, in front of an upstream that answers
/// every request with one completion.
async fn small_body_proxy() -> (MockUpstream, Proxy) {
    let upstream = MockUpstream::start(handler(|_| async {
        json_response(200, &completion("hi", 20, 2))
    }))
    .await;
    let mut config = config_for(&upstream.url());
    config.server.max_body_bytes = 4096;
    let proxy = Proxy::start(config).await;
    (upstream, proxy)
}

#[tokio::test]
async fn a_chunked_chat_request_arrives_whole_and_one_too_large_is_refused() {
    let (upstream, proxy) = small_body_proxy().await;
    let chunked = |parts: Vec<String>| {
        let parts = parts.into_iter().map(Ok::<_, std::io::Error>);
        reqwest::Body::wrap_stream(futures_util::stream::iter(parts))
    };
    let parts: Vec<String> = [
        r#"{"model":"gpt-4o","#,
        r#""messages":[{"role":"user","#,
        r#""content":"hello"}]}"#,
    ]
    .map(String::from)
    .to_vec();
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chunked(parts.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-condenser-action"], "forwarded");
    assert_eq!(
        upstream.recorded()[0].body.as_ref(),
        parts.concat().as_bytes()
    );
    // No Content-Length to refuse it by: the body is over the limit only once it has grown.
    let mut parts = vec![r#"{"model":"gpt-4o","messages":[{"role":"user","content":""#.to_string()];
    parts.extend((0..3).map(|_| "x".repeat(2000)));
    parts.push(r#""}]}"#.to_string());
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chunked(parts))
        .send()
        .await
        .unwrap();
    let (status, error) = error_of(response).await;
    assert_eq!(status, 413, "{error}");
    assert_eq!(error["error"]["code"], "request_too_large");
    assert_eq!(upstream.recorded().len(), 1);
}

/// An upstream that sends SSE events one at a time, each only after the test says the
/// client received the previous one.
async fn gated_stream_upstream(
    events: usize,
) -> (
    MockUpstream,
    mpsc::UnboundedSender<()>,
    mpsc::UnboundedReceiver<()>,
) {
    let (gate_tx, gate_rx) = mpsc::unbounded_channel::<()>();
    let (closed_tx, closed_rx) = mpsc::unbounded_channel::<()>();
    let gate_rx = std::sync::Arc::new(tokio::sync::Mutex::new(gate_rx));
    let upstream = MockUpstream::start(handler(move |_| {
        let gate_rx = gate_rx.clone();
        let closed_tx = closed_tx.clone();
        async move {
            let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
            tokio::spawn(async move {
                let mut gate = gate_rx.lock().await;
                for i in 0..events {
                    let chunk = json!({"choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}]});
                    if tx.send(Ok(Bytes::from(format!("data: {chunk}\n\n")))).await.is_err() {
                        let _ = closed_tx.send(());
                        return;
                    }
                    tokio::select! {
                        _ = gate.recv() => {}
                        () = tx.closed() => { let _ = closed_tx.send(()); return; }
                    }
                }
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body_from(rx))
                .unwrap()
        }
    }))
    .await;
    (upstream, gate_tx, closed_rx)
}

/// The chunks sent on `rx` as a body, relayed frame by frame as they come.
fn body_from(mut rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> ProxyBody {
    let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|chunk| chunk.map(Frame::data).map_err(BoxError::from));
    StreamBody::new(frames).boxed_unsync()
}

fn stream_request() -> String {
    json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "count"}]})
        .to_string()
}

#[tokio::test]
async fn sse_events_reach_the_client_one_by_one() {
    let (upstream, gate, _closed) = gated_stream_upstream(5).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(stream_request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-condenser-action"], "forwarded");
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    for i in 0..5 {
        // The upstream sends event i+1 only after this one arrives: a buffering proxy hangs here.
        while !text.contains(&format!("tok{i} ")) {
            let chunk = within("next event", stream.next()).await.unwrap().unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        gate.send(()).unwrap();
    }
    while let Some(chunk) = within("end of stream", stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_closes_the_upstream_request() {
    let (upstream, _gate, mut closed) = gated_stream_upstream(5).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(stream_request())
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let first = within("first event", stream.next()).await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("tok0"));
    drop(stream);
    within("upstream sees the close", closed.recv())
        .await
        .unwrap();
}

/// A client on a bare socket that has sent a streamed chat request, written by hand so the
/// test decides how the connection ends.
async fn raw_stream_request(proxy: &Proxy) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let body = stream_request();
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: condenser\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    client
}

/// A reset is no half-close: a client that resets its connection mid-stream (SO_LINGER 0, as a
/// process killed with unread bytes does) closes the upstream request at once, even on the
/// reply's first wait, where a FIN could still be a half-close.
#[tokio::test]
async fn a_client_that_resets_mid_stream_closes_the_upstream_request() {
    use tokio::io::AsyncReadExt;
    let (upstream, _gate, mut closed) = gated_stream_upstream(5).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let mut client = raw_stream_request(&proxy).await;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("tok0") {
        let mut chunk = [0u8; 1024];
        let read = within("the first event", client.read(&mut chunk))
            .await
            .unwrap();
        assert!(read > 0, "the reply ended early");
        seen.extend_from_slice(&chunk[..read]);
    }
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    within("upstream sees the close", closed.recv())
        .await
        .unwrap();
}

/// curl's `--no-buffer` with stdin closed, netcat and some SDKs shut down their write side once
/// the request is sent: that is no departure, and the streamed answer still comes in full.
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_its_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, gate, _closed) = gated_stream_upstream(3).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let mut client = raw_stream_request(&proxy).await;
    client.shutdown().await.unwrap();
    // The upstream's events come only after the half-close has reached condenser.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    let mut reply = Vec::new();
    within("the whole answer", client.read_to_end(&mut reply))
        .await
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    for i in 0..3 {
        assert!(reply.contains(&format!("tok{i} ")), "{reply}");
    }
    assert!(reply.contains("data: [DONE]"), "{reply}");
}

/// A client that leaves while its request waits on the summarizer: the request never goes
/// upstream, and is counted as 499; the summary is still made, once, and serves the next
/// request of the conversation.
#[tokio::test]
async fn a_client_that_leaves_while_its_summary_is_made_is_never_sent_upstream() {
    use tokio::io::AsyncWriteExt;
    let upstream = mock_llm(LlmBehaviour {
        summarizer_latency: Duration::from_secs(3),
        ..Default::default()
    })
    .await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let body = chat_body(&conversation(40)).to_string();
    let mut leaving = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: condenser\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    leaving.write_all(request.as_bytes()).await.unwrap();
    within("the summarizer called", async {
        while upstream.summarizer_calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(leaving);
    let cancelled = r#"condenser_requests_total{route="chat_completions",status="499"}"#;
    within("the request counted as cancelled", async {
        while metric(&proxy.metrics().await, cancelled).is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert_eq!(upstream.summarizer_calls().len(), 1);
    assert_eq!(
        upstream.forwarded().len(),
        1,
        "the first request went upstream"
    );
    assert_eq!(metric(&proxy.metrics().await, cancelled), Some(1.0));
}

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap();
    for key in ["message", "type", "param", "code"] {
        assert!(body["error"].get(key).is_some(), "{key} missing in {body}");
    }
    (status, body)
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors_and_never_reach_upstream() {
    let (upstream, proxy) = small_body_proxy().await;
    let cases: Vec<(Vec<u8>, u16, &str, &str)> = vec![
        ("{not json".into(), 400, "invalid_json", "not valid JSON"),
        // Every field the raw path reads, in order, as an array: still not an object.
        (
            r#"["gpt-4o",[{"role":"user","content":"hi"}],null,null,null,null,null,null,null,null]"#
                .into(),
            400,
            "invalid_request",
            "must be a JSON object",
        ),
        // Invalid UTF-8 in a field nothing reads.
        (
            b"{\"model\":\"gpt-4o\",\"user\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
                .to_vec(),
            400,
            "invalid_json",
            "not valid JSON",
        ),
        (
            "[1,2]".into(),
            400,
            "invalid_request",
            "must be a JSON object",
        ),
        (
            r#"{"model":"gpt-4o"}"#.into(),
            400,
            "invalid_request",
            "messages",
        ),
        (
            r#"{"model":"gpt-4o","messages":"hi"}"#.into(),
            400,
            "invalid_request",
            "messages must be an array",
        ),
        // A role that is not even text cannot be read; an unknown one is upstream's to judge.
        (
            r#"{"model":"gpt-4o","messages":[{"role":42,"content":"hi"}]}"#.into(),
            400,
            "invalid_request",
            "messages[0].role must be a string",
        ),
        (
            r#"{"messages":[{"role":"user","content":"hi"}]}"#.into(),
            400,
            "invalid_request",
            "model",
        ),
        (
            format!(
                r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "x".repeat(5000)
            )
            .into_bytes(),
            413,
            "request_too_large",
            "4096",
        ),
    ];
    for (body, status, code, needle) in cases {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body);
        let (got, error) = error_of(response).await;
        assert_eq!(got, status, "{body}: {error}");
        assert_eq!(error["error"]["code"], code, "{body}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(needle),
            "{error}"
        );
    }
    // An oversized pass-through body is refused too.
    let response = client()
        .post(proxy.url("/v1/files"))
        .body(vec![b'x'; 5000])
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(response).await.0, 413);
    // Bad headers.
    let ok_body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    for (name, value) in [
        ("x-condenser-mode", "sometimes"),
        ("x-condenser-profile", "nope"),
    ] {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .header(name, value)
            .body(ok_body)
            .send()
            .await
            .unwrap();
        let (status, error) = error_of(response).await;
        assert_eq!(status, 400, "{name}: {error}");
    }
    assert!(upstream.recorded().is_empty());
    // Still serving.
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(ok_body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = client().get(proxy.url("/nowhere")).send().await.unwrap();
    assert_eq!(error_of(response).await.0, 404);
}

/// Messages the proxy has counted are not parsed again, only located: a body that repeats
/// them in a broken array, or adds a broken message beside them, is still refused.
#[tokio::test]
async fn known_messages_in_a_broken_body_are_still_refused() {
    let (upstream, proxy) = small_body_proxy().await;
    let a = r#"{"role":"system","content":"be terse"}"#;
    let b = r#"{"role":"user","content":"is it \"up\"?"}"#;
    let body = |messages: &str| format!(r#"{{"model":"gpt-4o","messages":{messages}}}"#);
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(body(&format!("[{a},{b}]")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.recorded().len(), 1);
    let broken: Vec<Vec<u8>> = vec![
        body(&format!("[{a} {b}]")).into(),
        body(&format!("[{a},{b},]")).into(),
        body(&format!("[{a}:{b}]")).into(),
        format!(r#"{{"model":"gpt-4o","messages":[{a},{b}}}"#).into(),
        format!("{} x", body(&format!("[{a},{b}]"))).into(),
        body(&format!(
            "[{a},{b},{{\"role\":\"user\",\"content\":\"a\x01b\"}}]"
        ))
        .into(),
        [
            body(&format!("[{a},{b},")).trim_end_matches('}').as_bytes(),
            b"{\"role\":\"user\",\"content\":\"\xff\"}]}",
        ]
        .concat(),
    ];
    for sent in broken {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(sent.clone())
            .send()
            .await
            .unwrap();
        let (status, error) = error_of(response).await;
        let sent = String::from_utf8_lossy(&sent);
        assert_eq!(status, 400, "{sent}: {error}");
        assert_eq!(error["error"]["code"], "invalid_json", "{sent}: {error}");
    }
    assert_eq!(upstream.recorded().len(), 1);
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_slow_upstream_is_504() {
    let closed = closed_url();
    let proxy = Proxy::start(config_for(&closed)).await;
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    for path in ["/v1/chat/completions", "/v1/models"] {
        let response = client()
            .post(proxy.url(path))
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, error) = error_of(response).await;
        assert_eq!(status, 502, "{path}");
        assert_eq!(error["error"]["code"], "upstream_unreachable");
        // The caller is told the upstream failed, not where it is.
        let message = error["error"]["message"].as_str().unwrap();
        let address = closed.trim_start_matches("http://");
        assert!(!message.contains(address), "{message}");
    }

    let slow = MockUpstream::start(handler(|_| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        json_response(200, &completion("late", 1, 1))
    }))
    .await;
    let mut config = config_for(&slow.url());
    config.upstream.timeout_secs = 1;
    let proxy = Proxy::start(config).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    let (status, error) = error_of(response).await;
    assert_eq!(status, 504);
    assert_eq!(error["error"]["code"], "upstream_timeout");
}

/// condenser's own errors in every dialect of the registry come in that dialect's shape: a
/// body that is not JSON (never sent upstream), an upstream that cannot be reached (its
/// address not told), and one that does not answer in time.
#[tokio::test]
async fn condensers_own_errors_come_in_each_dialects_shape() {
    let slow = MockUpstream::start(handler(|_| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        json_response(200, &completion("late", 1, 1))
    }))
    .await;
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let mut request = client().post(proxy.url(&api.path(false)));
        for (name, value) in api.key_headers(CALLER_KEY) {
            request = request.header(name, value);
        }
        let response = request
            .header("content-type", "application/json")
            .body("{\"model\":")
            .send()
            .await
            .unwrap();
        let (status, kind, message) = api.error(response).await;
        assert_eq!(status, 400, "{api:?}: {message}");
        let expected = match api {
            Fixture::Chat | Fixture::Responses => "invalid_json",
            Fixture::Messages => "invalid_request_error",
            Fixture::Gemini => "INVALID_ARGUMENT",
        };
        assert_eq!(kind, expected, "{api:?}: {message}");
        assert!(upstream.recorded().is_empty(), "{api:?}");

        let body = api.body(&[("user", "hi".to_string())], false);
        let closed = closed_url();
        let proxy = Proxy::start(Fixture::config(&closed)).await;
        let (response, _) = api.post(&proxy, &body, false, &[]).await;
        let (status, kind, message) = api.error(response).await;
        assert_eq!(status, 502, "{api:?}: {message}");
        let expected = match api {
            Fixture::Chat | Fixture::Responses => "upstream_unreachable",
            Fixture::Messages => "api_error",
            Fixture::Gemini => "UNAVAILABLE",
        };
        assert_eq!(kind, expected, "{api:?}: {message}");
        // The caller is told the upstream failed, not where it is.
        let address = closed.trim_start_matches("http://");
        assert!(!message.contains(address), "{api:?}: {message}");

        let mut config = Fixture::config(&slow.url());
        config.upstream.timeout_secs = 1;
        let proxy = Proxy::start(config).await;
        let (response, _) = api.post(&proxy, &body, false, &[]).await;
        let (status, kind, message) = api.error(response).await;
        assert_eq!(status, 504, "{api:?}: {message}");
        let expected = match api {
            Fixture::Chat | Fixture::Responses => "upstream_timeout",
            Fixture::Messages => "api_error",
            Fixture::Gemini => "DEADLINE_EXCEEDED",
        };
        assert_eq!(kind, expected, "{api:?}: {message}");
    }
}

#[tokio::test]
async fn routes_pick_the_upstream_by_model_and_inject_their_key() {
    let default = MockUpstream::start(handler(|_| async {
        json_response(200, &completion("default", 1, 1))
    }))
    .await;
    let routed = MockUpstream::start(handler(|_| async {
        json_response(200, &completion("routed", 1, 1))
    }))
    .await;
    std::env::set_var("CONDENSER_TEST_ROUTE_KEY", "sk-route");
    let mut config = config_for(&default.url());
    config.routes.push(condenser::config::RouteConfig {
        models: vec!["claude-*".into()],
        base_url: routed.url(),
        api_key_env: "CONDENSER_TEST_ROUTE_KEY".into(),
        ..Default::default()
    });
    let proxy = Proxy::start(config).await;
    let send = |model: &str, auth: Option<&str>| {
        let mut request = client().post(proxy.url("/v1/chat/completions")).body(
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        );
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request.send()
    };
    let reply: Value = send("claude-sonnet-4-5", None)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "routed");
    assert_eq!(
        routed.recorded()[0].headers["authorization"],
        "Bearer sk-route"
    );
    send("claude-sonnet-4-5", Some("Bearer client-own"))
        .await
        .unwrap();
    assert_eq!(
        routed.recorded()[1].headers["authorization"],
        "Bearer client-own"
    );
    let reply: Value = send("gpt-4o", None).await.unwrap().json().await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "default");
    assert!(default.recorded()[0].headers.get("authorization").is_none());
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let upstream = MockUpstream::start(handler(|_| async {
        json_response(200, &completion("over h2", 1, 1))
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = h2
        .post(proxy.url("/v1/chat/completions"))
        .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-condenser-action"], "forwarded");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "over h2");
}

#[tokio::test]
async fn health_and_readiness() {
    let upstream = MockUpstream::start(handler(|_| async { json_response(200, &json!({})) })).await;
    let mut proxy = Proxy::start(config_for(&upstream.url())).await;
    assert_eq!(
        reqwest::get(proxy.url("/healthz")).await.unwrap().status(),
        200
    );
    assert_eq!(
        reqwest::get(proxy.url("/readyz")).await.unwrap().status(),
        200
    );
    proxy.shutdown();
    within("shutdown", &mut proxy.served).await.unwrap();
    assert!(!proxy.state.ready.load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        reqwest::get(proxy.url("/healthz")).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn a_stream_in_flight_at_shutdown_finishes() {
    let (upstream, gate, _closed) = gated_stream_upstream(3).await;
    let mut proxy = Proxy::start(config_for(&upstream.url())).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(stream_request())
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    let first = within("first event", stream.next()).await.unwrap().unwrap();
    text.push_str(std::str::from_utf8(&first).unwrap());
    proxy.shutdown();
    // Give the server the shutdown signal before the stream goes on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !proxy.served.is_finished(),
        "server must wait for the stream"
    );
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    while let Some(chunk) = within("rest of stream", stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        text.contains("tok2") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    within("drained", &mut proxy.served).await.unwrap();
}

/// Sends `head` as written on a new connection and reads until condenser closes it: the
/// status and the body. For what a client library would not send.
async fn raw_request(proxy: &Proxy, head: &[u8]) -> (u16, Bytes) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    let mut response = Vec::new();
    within("the response", stream.read_to_end(&mut response))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|line| line.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    (status, Bytes::copy_from_slice(body.as_bytes()))
}

#[tokio::test]
async fn heads_the_server_refuses_get_their_status_and_never_reach_upstream() {
    let (upstream, proxy) = small_body_proxy().await;
    // Oversized header fields: an OpenAI-shaped 431.
    let huge = format!(
        "GET /v1/models HTTP/1.1\r\nhost: condenser\r\nconnection: close\r\nx-padding: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let (status, body) = raw_request(&proxy, huge.as_bytes()).await;
    assert_eq!(status, 431);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert_eq!(error["error"]["code"], "headers_too_large", "{error}");
    assert!(error["error"]["param"].is_null(), "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("65536"),
        "{error}"
    );
    // The same over h2c, whose header list is counted against a limit of its own.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = h2
        .get(proxy.url("/v1/models"))
        .header("x-padding", "a".repeat(100_000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let (status, error) = error_of(response).await;
    assert_eq!(status, 431, "{error}");
    assert_eq!(error["error"]["code"], "headers_too_large", "{error}");
    // Conflicting lengths: hyper refuses the head before condenser sees it, with a bare 400
    // (see `server.rs`). Only the head is sent, so nothing is left unread when it closes.
    let conflicting = "POST /v1/chat/completions HTTP/1.1\r\nhost: condenser\r\n\
                       content-length: 5\r\ncontent-length: 6\r\n\r\n";
    let (status, _) = raw_request(&proxy, conflicting.as_bytes()).await;
    assert_eq!(status, 400);
    assert!(upstream.recorded().is_empty());
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="other",status="431"}"#
        ),
        Some(2.0)
    );
    // Header fields just under the limit pass.
    let response = client()
        .get(proxy.url("/v1/models"))
        .header("x-padding", "a".repeat(60_000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.recorded()[0].headers["x-padding"].len(), 60_000);
}

#[tokio::test]
async fn a_chunked_pass_through_body_is_relayed_up_to_the_limit_and_refused_past_it() {
    let (upstream, proxy) = small_body_proxy().await;
    let chunked = |parts: Vec<String>| {
        let parts = parts.into_iter().map(Ok::<_, std::io::Error>);
        reqwest::Body::wrap_stream(futures_util::stream::iter(parts))
    };
    let under: Vec<String> = (0..2).map(|_| "u".repeat(2000)).collect();
    let response = client()
        .post(proxy.url("/v1/files"))
        .body(chunked(under.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        upstream.recorded()[0].body.as_ref(),
        under.concat().as_bytes()
    );
    // No Content-Length to refuse it by: the body is over the limit only once it has grown.
    let over: Vec<String> = (0..3).map(|_| "o".repeat(2000)).collect();
    let response = client()
        .post(proxy.url("/v1/files"))
        .body(chunked(over))
        .send()
        .await
        .unwrap();
    let (status, error) = error_of(response).await;
    assert_eq!(status, 413, "{error}");
    assert_eq!(error["error"]["code"], "request_too_large", "{error}");
    assert!(
        error["error"]["message"].as_str().unwrap().contains("4096"),
        "{error}"
    );
    // Whatever upstream saw of it, it never saw all of it.
    assert!(upstream.recorded()[1..]
        .iter()
        .all(|r| r.body.len() <= 4096));
}

/// serde_json reads 127 levels and refuses a 128th; the raw path, which would forward a
/// body without building its tree, holds to the same rule.
#[tokio::test]
async fn a_body_nested_too_deep_is_refused_alike_on_every_path() {
    let (upstream, proxy) = small_body_proxy().await;
    let bodies = |levels: usize| {
        let deep = format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let message = r#"{"role":"user","content":"hi"}"#;
        let deep_message = format!(r#"{{"role":"user","content":"hi","x":{deep}}}"#);
        [
            (format!(r#""metadata":{deep}"#), message.to_string()),
            (r#""user":"u""#.to_string(), deep_message),
        ]
        .map(|(field, message)| {
            // Without stream options the raw path takes it; with them, the full path.
            [
                format!(r#"{{"model":"gpt-4o",{field},"messages":[{message}]}}"#),
                format!(
                    r#"{{"model":"gpt-4o","stream":true,"stream_options":{{"include_usage":false}},{field},"messages":[{message}]}}"#
                ),
            ]
        })
    };
    for body in bodies(200).concat() {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let (status, error) = error_of(response).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["code"], "invalid_json", "{body}");
    }
    assert!(upstream.recorded().is_empty());
    // Nested as deep as serde_json reads, on both paths: forwarded.
    for body in bodies(100).concat() {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{body}");
    }
    assert_eq!(upstream.recorded().len(), 4);
}

#[tokio::test]
async fn paths_under_a_dialect_go_where_their_model_routes_with_the_right_key() {
    let default = MockUpstream::start(handler(|_| async {
        json_response(200, &json!({"from": "default"}))
    }))
    .await;
    let routed = MockUpstream::start(handler(|_| async {
        json_response(200, &json!({"input_tokens": 12}))
    }))
    .await;
    std::env::set_var("CONDENSER_TEST_CLAUDE_KEY", "sk-ant-route");
    let mut config = config_for(&default.url());
    config.routes.push(condenser::config::RouteConfig {
        models: vec!["claude-*".into()],
        base_url: routed.url(),
        api_key_env: "CONDENSER_TEST_CLAUDE_KEY".into(),
        ..Default::default()
    });
    let proxy = Proxy::start(config).await;
    let body = r#"{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}"#;
    let reply: Value = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["input_tokens"], 12);
    let sent = routed.recorded();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body, body.as_bytes(), "byte for byte");
    assert_eq!(sent[0].headers["x-api-key"], "sk-ant-route");
    assert!(!sent[0].headers.contains_key("authorization"));
    assert!(
        default.recorded().is_empty(),
        "nothing went to the default upstream"
    );
    // A path under a dialect's whose body names no model goes to the default upstream.
    client()
        .post(proxy.url("/v1/responses/compact"))
        .body(r#"{"input": "x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(default.recorded().len(), 1);
}

/// A connection that never sends a byte is closed once the header-read timeout passes: it
/// would otherwise hold a descriptor for good.
#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    use tokio::io::AsyncReadExt;
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = config_for(&upstream.url());
    config.server.header_read_timeout_secs = 1;
    let proxy = Proxy::start(config).await;
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut buffer = [0u8; 64];
    let read = within("the server closes it", silent.read(&mut buffer)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// What the client reads when upstream answers with a head of `fields` short fields.
async fn answer_to_a_head_of(fields: usize) -> String {
    let upstream = MockUpstream::start(handler(move |_| async move {
        let mut response = Response::builder()
            .status(200)
            .header("content-type", "application/json");
        for i in 0..fields {
            response = response.header(format!("x-field-{i}"), "v");
        }
        response
            .body(condenser::transport::body::full(Bytes::from(
                completion("many fields", 1, 1).to_string(),
            )))
            .unwrap()
    }))
    .await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    // Read as bytes: the test's own HTTP client keeps hyper's limit of 100 fields.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    within("the answer", stream.read_to_string(&mut answer))
        .await
        .unwrap();
    answer
}

/// An upstream head of many short fields is relayed: the limits are the head's 64 KiB and
/// 1,024 fields, not hyper's default of 100 fields; past them it is a broken reply.
#[tokio::test]
async fn an_upstream_head_of_many_fields_within_64_kib_is_relayed() {
    let answer = answer_to_a_head_of(1_000).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-field-999: v"), "{answer}");
    let answer = answer_to_a_head_of(2_000).await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{}", &answer[..200]);
    assert!(answer.contains("upstream_error"), "{answer}");
}

/// An upstream's error that echoes the key it was sent (condenser's own `api_key_env`, or
/// the caller's) reaches the client with the key blanked out, on every path.
#[tokio::test]
async fn an_upstream_error_that_echoes_a_key_reaches_the_client_with_the_key_blanked() {
    std::env::set_var("CONDENSER_TEST_ECHOED_KEY", "sk-DEFAULT-SECRET-333");
    let upstream = MockUpstream::start(handler(|r| async move {
        let sent = ["authorization", "x-api-key"]
            .iter()
            .find_map(|name| r.headers.get(*name))
            .map(|value| value.to_str().unwrap().to_string())
            .unwrap_or_default();
        json_response(
            401,
            &json!({"error": {"message": format!("Incorrect API key provided: {sent}"),
                "type": "invalid_request_error", "code": "invalid_api_key"}}),
        )
    }))
    .await;
    let mut config = config_for(&upstream.url());
    config.upstream.api_key_env = "CONDENSER_TEST_ECHOED_KEY".into();
    let proxy = Proxy::start(config).await;
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let claude =
        r#"{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for (path, body, caller_key) in [
        ("/v1/chat/completions", chat, None),
        (
            "/v1/chat/completions",
            chat,
            Some("Bearer sk-CALLER-SECRET-444"),
        ),
        ("/v1/messages", claude, None),
        ("/v1/embeddings", chat, None),
    ] {
        let mut request = client().post(proxy.url(path)).body(body);
        if let Some(key) = caller_key {
            request = request.header("authorization", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{path}");
        let text = response.text().await.unwrap();
        // The key goes, whether sent bare or after `Bearer `.
        assert!(
            text.contains("Incorrect API key provided: [redacted]")
                || text.contains("Incorrect API key provided: Bearer [redacted]"),
            "{path}: {text}"
        );
        assert!(!text.contains("SECRET"), "{path}: {text}");
    }
}
