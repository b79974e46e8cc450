//! A request body is read against a clock (`server.body_read_timeout_secs`): a client that
//! declares a large body and stalls gets 408 in its path's dialect shape, and its connection
//! is closed with what it sent; a large body that keeps up the least rate is read whole.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a client that sends `path`'s head declaring 16 MiB, and 32 KiB of it, then nothing,
/// is answered: the status, the body, and how long until the connection was closed.
async fn stalled(proxy: &Proxy, path: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let mut socket = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        16 << 20
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&[b' '; 32 << 10]).await.unwrap();
    // Read to the end: the answer, then the connection closed by condenser.
    let mut answer = Vec::new();
    within(path, socket.read_to_end(&mut answer)).await.unwrap();
    let closed = started.elapsed();
    let text = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an answer");
    let status = head[9..12].parse().unwrap();
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    (status, serde_json::from_str(body).unwrap(), closed)
}

#[tokio::test]
async fn a_stalled_body_gets_408_in_its_dialects_shape_and_its_connection_closed() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = config_for(&upstream.url());
    config.server.body_read_timeout_secs = 1;
    let proxy = Proxy::start(config).await;
    // Compacted chat, Anthropic's path, and a pass-through body streamed upstream as it
    // comes, all at once: each is cut at its own deadline.
    let (chat, messages, passed) = tokio::join!(
        stalled(&proxy, "/v1/chat/completions"),
        stalled(&proxy, "/v1/messages"),
        stalled(&proxy, "/v1/files"),
    );
    for (path, (status, body, closed)) in [
        ("chat", &chat),
        ("messages", &messages),
        ("pass-through", &passed),
    ] {
        assert_eq!(*status, 408, "{path}: {body}");
        assert!(
            *closed >= Duration::from_secs(1) && *closed < Duration::from_secs(15),
            "{path}: {closed:?}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("not received in time"), "{path}: {body}");
    }
    assert_eq!(chat.1["error"]["code"], "request_timeout");
    assert_eq!(passed.1["error"]["code"], "request_timeout");
    assert_eq!(messages.1["type"], "error");
    assert_eq!(messages.1["error"]["type"], "timeout_error");
    // Nothing went upstream but what the pass-through had relayed of its body.
    assert!(upstream
        .recorded()
        .iter()
        .all(|r| r.path_and_query == "/v1/files"));
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="chat_completions",status="408"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_large_body_that_keeps_up_the_least_rate_is_read_past_the_timeout() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = config_for(&upstream.url());
    config.server.body_read_timeout_secs = 1;
    let proxy = Proxy::start(config).await;
    // 512 KiB in 16 pieces, one each 120 ms: about 2 s in all, at some 270 KiB a second,
    // over the least rate (64 KiB a second) all along.
    let mut body =
        br#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}"#.to_vec();
    body.resize(512 << 10, b' ');
    let mut socket = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let started = Instant::now();
    socket.write_all(head.as_bytes()).await.unwrap();
    for piece in body.chunks(body.len() / 16) {
        socket.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    let mut answer = Vec::new();
    within("the answer", socket.read_to_end(&mut answer))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the body took longer than the timeout"
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
