//! Issue 55: replies scrubbed as the client reads them. A compressed reply is scrubbed
//! decoded; an SSE stream is read as the spec reads it; condenser's own error text and log
//! lines quote nothing upstream wrote.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use condenser::transport::body::full;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// The key the request carried upstream, as the mock upstream reads it.
fn key_sent(request: &Recorded) -> String {
    for name in ["x-api-key", "x-goog-api-key"] {
        if let Some(value) = request.headers.get(name) {
            return value.to_str().unwrap().to_string();
        }
    }
    request
        .headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string()
}

/// `{"error":{"message":"Incorrect API key provided: sk-FIXTURE-KEY-123"}}` as Python's
/// `brotli` module wrote it (no brotli encoder is at hand in Rust here).
const FIXTURE_KEY: &str = "sk-FIXTURE-KEY-123";
const FIXTURE_KEY_BR: &[u8] = &[
    0x1b, 0x45, 0x00, 0xf8, 0x8d, 0xd4, 0x4e, 0x77, 0xe2, 0x50, 0xa4, 0x6e, 0x4b, 0xf5, 0xac, 0x3f,
    0xa8, 0xed, 0xcd, 0x70, 0xe1, 0x58, 0x44, 0x14, 0xb4, 0x14, 0x8b, 0x49, 0x8e, 0x55, 0xb6, 0x06,
    0x1b, 0x70, 0x22, 0x10, 0x70, 0x18, 0xe8, 0x20, 0x70, 0x8f, 0x30, 0xc3, 0x15, 0x30, 0xc1, 0xa1,
    0x10, 0x07, 0x41, 0x60, 0xa7, 0xa5, 0xdc, 0x8c, 0x7a, 0x74, 0x62, 0x4e, 0xba, 0xb9, 0xd8, 0x1a,
    0xb3, 0x2b, 0x57, 0xdd, 0x1c, 0x62, 0xc2, 0xff,
];

fn encoded(coding: &str, body: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => gzip(body),
        "deflate" => {
            let mut encoder =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(body).unwrap();
            encoder.finish().unwrap()
        }
        "zstd" => {
            ruzstd::encoding::compress_to_vec(body, ruzstd::encoding::CompressionLevel::Fastest)
        }
        "br" => FIXTURE_KEY_BR.to_vec(),
        other => panic!("no {other}"),
    }
}

/// An upstream that compresses unasked: each 200 reply echoes the key it was sent, in the
/// coding the request's `x-test-coding` names, as a stream when `x-test-stream` is sent.
async fn compressing_upstream() -> MockUpstream {
    MockUpstream::start(handler(|request| async move {
        let coding = request.headers["x-test-coding"].to_str().unwrap().to_string();
        let stream = request.headers.contains_key("x-test-stream");
        let key = key_sent(&request);
        let body = if stream {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"your key: {key}\"}}}}]}}\n\ndata: [DONE]\n\n")
        } else {
            completion(&format!("your key: {key}"), 3, 1).to_string()
        };
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        Response::builder()
            .status(200)
            .header("content-type", content_type)
            .header("content-encoding", &coding)
            .body(full(Bytes::from(encoded(&coding, body.as_bytes()))))
            .unwrap()
    }))
    .await
}

/// condenser in front of `url` with a key of its own for it.
fn keyed_for(url: &str) -> condenser::Config {
    std::env::set_var("CONDENSER_TEST_HOSTILE_INJECTED_KEY", INJECTED_KEY);
    let mut config = config_for(url);
    config.upstream.api_key_env = "CONDENSER_TEST_HOSTILE_INJECTED_KEY".into();
    config
}

/// Issue 55, 1: a 2xx reply that echoed the key in a gzip body reached the client whole,
/// the key in it once decompressed (the OpenAI SDK asks for `gzip, deflate`). Now a request
/// with a key asks upstream for `identity`, and a reply that comes compressed all the same is
/// scrubbed decoded and relayed decoded, on every path, with every key and coding.
#[tokio::test]
async fn a_compressed_reply_reaches_the_client_scrubbed_and_decoded() {
    let upstream = compressing_upstream().await;
    let proxy = Proxy::start(keyed_for(&upstream.url())).await;
    let mut cases = Vec::new();
    for path in [CHAT, MESSAGES, PASSTHROUGH] {
        for coding in ["gzip", "deflate", "zstd"] {
            cases.push((path, coding, false, Some(CALLER_KEY)));
            cases.push((path, coding, false, None));
        }
        cases.push((path, "br", false, Some(FIXTURE_KEY)));
    }
    cases.push((CHAT, "gzip", true, None));
    for (i, (path, coding, stream, caller)) in cases.into_iter().enumerate() {
        let key = caller.unwrap_or(INJECTED_KEY);
        let what = format!("{path} {coding} stream={stream} key={key}");
        let mut body = request_body(path, stream);
        if path == MESSAGES {
            body = json!({"model": "claude-x", "max_tokens": 5, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]});
        }
        let mut request = client()
            .post(proxy.url(path))
            .header("accept-encoding", "gzip, deflate")
            .header("x-test-coding", coding)
            .json(&body);
        if stream {
            request = request.header("x-test-stream", "1");
        }
        if let Some(key) = caller {
            request = match path {
                MESSAGES => request.header("x-api-key", key),
                _ => request.header("authorization", format!("Bearer {key}")),
            };
        }
        let response = within(&what, request.send()).await.unwrap();
        assert_eq!(response.status(), 200, "{what}");
        let body = keyless(response, key, &what).await;
        assert!(body.contains("[redacted]"), "{what}: {body}");
        let sent = &upstream.recorded()[i];
        assert_eq!(sent.headers["accept-encoding"], "identity", "{what}");
    }
}

/// The keys of `text`'s condenser log lines (those whose target is condenser's own).
fn condenser_lines(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|line| line.contains(" condenser::") || line.contains(" condenser:"))
        .collect()
}

/// Issue 55, 3: an upstream that answered `transfer-encoding: <key>` got a 502 whose body
/// quoted the header's value, and four WARN lines with it. Neither quotes it now.
#[tokio::test]
async fn a_broken_reply_that_holds_the_key_is_a_502_that_quotes_none_of_it() {
    const KEY: &str = "sk-QUOTED-0055-transfer-coding";
    let logs = captured_logs();
    let replies = [
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: {KEY}\r\n\r\n{{}}"),
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, {KEY}\r\n\r\n{{}}"),
    ];
    let script = [CHAT, PASSTHROUGH]
        .iter()
        .flat_map(|_| {
            replies
                .iter()
                .map(|reply| Act::SendAndClose(reply.clone().into_bytes()))
        })
        .collect();
    let upstream = Hostile::start(script).await;
    let proxy = condenser_before(&upstream, 600).await;
    for path in [CHAT, PASSTHROUGH] {
        for reply in 0..replies.len() {
            let what = format!("{path}, reply {reply}");
            let response = within(
                &what,
                client()
                    .post(proxy.url(path))
                    .header("authorization", format!("Bearer {KEY}"))
                    .json(&request_body(path, false))
                    .send(),
            )
            .await
            .unwrap();
            assert_eq!(response.status(), 502, "{what}");
            let body = keyless(response, KEY, &what).await;
            assert!(body.contains("transfer-coding"), "{what}: {body}");
        }
    }
    let text = logs.text();
    let lines = condenser_lines(&text);
    assert!(
        lines.iter().any(|line| line.contains("transfer-coding")),
        "the failure is logged"
    );
    for line in lines {
        assert!(!line.contains(KEY), "{line}");
    }
}

/// An upstream over TLS that speaks HTTP/2 and answers each request with a GOAWAY whose debug
/// data is `debug`. Frames are written by hand: no server library sends debug data.
async fn goaway_upstream(debug: &'static [u8]) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let certs = CertificateDer::pem_file_iter("tests/tls/localhost.pem")
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file("tests/tls/localhost.key").unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                // The server's SETTINGS, empty.
                let _ = tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
                // The client's preface, then its frames until a HEADERS frame (a request).
                let mut preface = [0u8; 24];
                if tls.read_exact(&mut preface).await.is_err() {
                    return;
                }
                loop {
                    let mut head = [0u8; 9];
                    if tls.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let length = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let mut payload = vec![0u8; length];
                    if tls.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    if head[3] == 1 {
                        break;
                    }
                }
                let mut frames = vec![0, 0, 0, 4, 1, 0, 0, 0, 0];
                let length = 8 + debug.len();
                frames.extend_from_slice(&[
                    (length >> 16) as u8,
                    (length >> 8) as u8,
                    length as u8,
                ]);
                // GOAWAY on stream 0: last stream 0 (none processed), INTERNAL_ERROR.
                frames.extend_from_slice(&[7, 0, 0, 0, 0, 0]);
                frames.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2]);
                frames.extend_from_slice(debug);
                let _ = tls.write_all(&frames).await;
                let _ = tls.flush().await;
                let mut sink = [0u8; 1024];
                while matches!(tls.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    url
}

/// Issue 55, 3: an HTTP/2 GOAWAY whose debug data held the key came back in the 502's
/// message. Now the message says the GOAWAY and its reason, and no log line quotes the data.
#[tokio::test]
async fn an_http2_goaway_whose_debug_data_holds_the_key_is_a_502_that_quotes_none_of_it() {
    const KEY: &str = "sk-QUOTED-0055-goaway-debug";
    let logs = captured_logs();
    // condenser trusts the test CA, as an operator's SSL_CERT_FILE would make it.
    std::env::set_var("SSL_CERT_FILE", "tests/tls/ca.pem");
    let url = goaway_upstream(KEY.as_bytes()).await;
    let proxy = Proxy::start(config_for(&url)).await;
    let response = within(
        "a response",
        client()
            .post(proxy.url(CHAT))
            .header("authorization", format!("Bearer {KEY}"))
            .json(&request_body(CHAT, false))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 502);
    let body = keyless(response, KEY, "GOAWAY").await;
    assert!(body.contains("GOAWAY"), "{body}");
    let text = logs.text();
    for line in condenser_lines(&text) {
        assert!(!line.contains(KEY), "{line}");
    }
}
