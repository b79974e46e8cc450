//! Google's Gemini API through condenser: `generateContent` and `streamGenerateContent`
//! under `/v1beta/` and `/v1/` compacted (the model and streaming named by the path),
//! thought signatures carried verbatim, usage read from `usageMetadata`, Google's error shape
//! for everything condenser refuses, `?key=` and `x-goog-api-key` as the caller's key, the
//! rest of `/v1beta/` passed through, and the official `google-genai` SDK.

use crate::common::*;
use serde_json::{json, Value};

const GENERATE: &str = "/v1beta/models/gemini-2.5-pro:generateContent";
const STREAM: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent";
const KEY: &str = "AIza-gemini-caller-key-1";

/// The headers the caller `KEY` sends.
const AS_CALLER: [(&str, &str); 1] = [("x-goog-api-key", KEY)];

/// The model requests the upstream got (not the summarizer's), as JSON.
fn model_requests(upstream: &MockUpstream) -> Vec<(String, Value)> {
    upstream
        .recorded()
        .into_iter()
        .filter(|r| !is_summarizer_call(r) && r.path_and_query.contains(":"))
        .filter(|r| r.path_and_query.contains("enerateContent"))
        .map(|r| (r.path_and_query.clone(), r.json()))
        .collect()
}

/// A 40 MB request as its head declares it: condenser answers before the body, so the body
/// is not sent (a client still writing it would find the connection closed).
async fn declared_too_large(proxy: &Proxy, path: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: condenser\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        40 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let status: u16 = answer[9..12].parse().unwrap();
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], status, "{body}");
    (status, body["error"].clone())
}

async fn google_error(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert_eq!(error["code"], status, "{body}");
    assert!(error["message"].as_str().is_some(), "{body}");
    assert!(error["status"].as_str().is_some(), "{body}");
    (status, error.clone())
}

#[tokio::test]
async fn a_long_conversation_is_compacted_in_its_own_api_its_signatures_kept() {
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let body = gemini_body(&gemini_conversation(20));
    let response = Fixture::Gemini
        .post_as(&proxy, KEY, &body, false, &[])
        .await
        .0;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let received: u64 = Condensed::of(&response).prompt_tokens.unwrap();
    let forwarded: u64 = Condensed::of(&response).forwarded_tokens.unwrap();
    assert!(
        forwarded < received && forwarded <= 8_000 - 500,
        "{forwarded} of {received}"
    );
    let reply: Value = response.json().await.unwrap();
    assert!(reply["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("reply to "));

    let sent = model_requests(&upstream);
    assert_eq!(sent.len(), 1);
    let (path, sent) = &sent[0];
    assert_eq!(path, GENERATE);
    assert_valid_gemini(sent);
    let turns = sent["contents"].as_array().unwrap();
    assert!(turns.len() < 81, "{} turns", turns.len());
    assert_eq!(turns.last(), body["contents"].as_array().unwrap().last());
    // The summary follows the system instruction's own part (`summary_role = "system"`),
    // and keeps the planted fact; every other field goes as it came, in its place.
    let instruction = &sent["systemInstruction"]["parts"];
    assert_eq!(instruction[0], body["systemInstruction"]["parts"][0]);
    assert!(instruction[1]["text"]
        .as_str()
        .unwrap()
        .starts_with("[Context summary: "));
    assert!(instruction[1]["text"]
        .as_str()
        .unwrap()
        .contains("ORD-4411"));
    for field in ["generationConfig", "safetySettings"] {
        assert_eq!(sent[field], body[field], "{field}");
    }
    // The client's tools as they came, then recall's, a `functionDeclarations` entry last.
    let tools = sent["tools"].as_array().unwrap();
    assert_eq!(
        tools[..tools.len() - 1],
        body["tools"].as_array().unwrap()[..]
    );
    assert_eq!(
        tools[tools.len() - 1]["functionDeclarations"][0]["name"],
        "condenser_recall"
    );
    let keys: Vec<&String> = sent.as_object().unwrap().keys().collect();
    let sent_keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(keys, sent_keys);

    // The summary was asked of the request's model in Gemini's API, with the caller's key.
    let summaries = upstream.summarizer_calls();
    assert!(!summaries.is_empty());
    for call in &summaries {
        assert_eq!(call.path_and_query, GENERATE);
        assert_eq!(call.headers["x-goog-api-key"], KEY);
    }

    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="gemini",status="200"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    let cached: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("condenser_cached_prompt_tokens_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(cached, GEMINI_CACHED_TOKENS as f64, "{metrics}");
}

#[tokio::test]
async fn under_the_trigger_a_stream_goes_byte_for_byte_and_its_usage_is_read() {
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let body = gemini_body(&gemini_conversation(1));
    let bytes = serde_json::to_vec_pretty(&body).unwrap();
    // The same path under `/v1/` is Gemini's too.
    for path in [STREAM, "/v1/models/gemini-2.5-pro:streamGenerateContent"] {
        let response = client()
            .post(proxy.url(&format!("{path}?alt=sse")))
            .header("x-goog-api-key", KEY)
            .body(bytes.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-condenser-action"), "forwarded");
        assert!(header(&response, "content-type").starts_with("text/event-stream"));
        let text = response.text().await.unwrap();
        let events: Vec<Value> = text
            .split("\r\n\r\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap())
            .collect();
        let said: String = events
            .iter()
            .filter_map(|e| e["candidates"][0]["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(said.trim(), "reply to 5 turns");
    }
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].path_and_query, format!("{STREAM}?alt=sse"));
    for request in &recorded {
        assert_eq!(request.body.as_ref(), bytes.as_slice(), "sent as it came");
    }
    let metrics = proxy.metrics().await;
    let completion: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("condenser_completion_tokens_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // Thinking is output: both counts, of both streams.
    assert_eq!(
        completion,
        2.0 * (GEMINI_OUTPUT_TOKENS + GEMINI_THOUGHT_TOKENS) as f64
    );
    let cached: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("condenser_cached_prompt_tokens_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(cached, 2.0 * GEMINI_CACHED_TOKENS as f64);
}

#[tokio::test]
async fn bad_input_gets_googles_error_shape_and_the_proxy_keeps_serving() {
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let orphan = json!({"contents": [
        {"role": "user", "parts": [{"text": "hi"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "x"}}}]}]});
    let nested = format!(
        r#"{{"contents":[{{"role":"user","parts":[{{"text":"hi"}}]}}],"x":{}{}}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    let cases: Vec<(Vec<u8>, u16, &str, &str)> = vec![
        (
            b"{\"contents\":".to_vec(),
            400,
            "INVALID_ARGUMENT",
            "not valid JSON",
        ),
        (
            br#"{"contents":"hi"}"#.to_vec(),
            400,
            "INVALID_ARGUMENT",
            "'contents'",
        ),
        (
            br#"{"contents":[{"role":"user","parts":"hi"}]}"#.to_vec(),
            400,
            "INVALID_ARGUMENT",
            "'contents[0].parts'",
        ),
        (
            br#"{"contents":[],"generationConfig":"fast"}"#.to_vec(),
            400,
            "INVALID_ARGUMENT",
            "generationConfig",
        ),
        (
            br#"{"contents":[],"generationConfig":{"maxOutputTokens":"lots"}}"#.to_vec(),
            400,
            "INVALID_ARGUMENT",
            "Invalid value at 'generationConfig': invalid type: string",
        ),
        (
            orphan.to_string().into_bytes(),
            400,
            "INVALID_ARGUMENT",
            "function response turn comes immediately after a function call turn",
        ),
        (
            nested.into_bytes(),
            400,
            "INVALID_ARGUMENT",
            "recursion limit",
        ),
    ];
    for (body, status, canonical, needle) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let response = client()
            .post(proxy.url(GENERATE))
            .header("x-goog-api-key", KEY)
            .body(body)
            .send()
            .await
            .unwrap();
        let (got, error) = google_error(response).await;
        assert_eq!(
            (got, error["status"].as_str()),
            (status, Some(canonical)),
            "{shown}: {error}"
        );
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{shown}: {error}"
        );
    }
    let (status, error) = declared_too_large(&proxy, GENERATE).await;
    assert_eq!(
        (status, error["status"].as_str()),
        (413, Some("INVALID_ARGUMENT"))
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit"),
        "{error}"
    );
    assert!(upstream.recorded().is_empty(), "nothing bad went upstream");
    // An upstream that cannot be reached is Google's UNAVAILABLE, 502.
    let nowhere = Proxy::start(gemini_config(&closed_url())).await;
    let (status, error) = google_error(
        Fixture::Gemini
            .post_as(
                &nowhere,
                KEY,
                &gemini_body(&gemini_conversation(1)),
                false,
                &[],
            )
            .await
            .0,
    )
    .await;
    assert_eq!(
        (status, error["status"].as_str()),
        (502, Some("UNAVAILABLE"))
    );
    // And the proxy keeps serving.
    let response = Fixture::Gemini
        .post_as(
            &proxy,
            KEY,
            &gemini_body(&gemini_conversation(1)),
            false,
            &[],
        )
        .await
        .0;
    assert_eq!(response.status(), 200);
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="gemini",status="400"}"#
        ),
        Some(7.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn everything_else_under_v1beta_passes_through_to_the_upstream_its_path_names() {
    let default = mock_gemini(GeminiBehaviour::default()).await;
    let routed = mock_gemini(GeminiBehaviour::default()).await;
    let mut config = gemini_config(&default.url());
    config.routes.push(condenser::config::RouteConfig {
        models: vec!["gemini-*".into()],
        base_url: routed.url(),
        api_key_env: String::new(),
        ..Default::default()
    });
    let proxy = Proxy::start(config).await;
    let count = client()
        .post(proxy.url("/v1beta/models/gemini-2.5-pro:countTokens?key=AIza-in-the-query"))
        .json(&json!({"contents": [{"parts": [{"text": "hello there"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(count.status(), 200);
    assert!(count.headers().get("x-condenser-action").is_none());
    assert!(count.json::<Value>().await.unwrap()["totalTokens"]
        .as_u64()
        .is_some());
    let embed = post(
        &proxy,
        "/v1beta/models/text-embedding-004:embedContent",
        &AS_CALLER,
        &json!({"content": {"parts": [{"text": "x"}]}}),
    )
    .await
    .0;
    assert_eq!(embed.status(), 200);
    let list = client()
        .get(proxy.url("/v1beta/models?pageSize=5"))
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    assert_eq!(
        list.json::<Value>().await.unwrap()["models"][0]["name"],
        "models/gemini-2.5-pro"
    );
    // A model in the path routes it, as the body's model routes other APIs' requests.
    let routed_paths: Vec<String> = routed
        .recorded()
        .iter()
        .map(|r| r.path_and_query.clone())
        .collect();
    assert_eq!(
        routed_paths,
        ["/v1beta/models/gemini-2.5-pro:countTokens?key=AIza-in-the-query"]
    );
    let default_paths: Vec<String> = default
        .recorded()
        .iter()
        .map(|r| r.path_and_query.clone())
        .collect();
    assert_eq!(
        default_paths,
        [
            "/v1beta/models/text-embedding-004:embedContent",
            "/v1beta/models?pageSize=5"
        ]
    );
    // Errors condenser writes there are Google's too.
    let (status, error) =
        declared_too_large(&proxy, "/v1beta/models/gemini-2.5-pro:countTokens").await;
    assert_eq!(
        (status, error["status"].as_str()),
        (413, Some("INVALID_ARGUMENT"))
    );
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="passthrough",status="200"}"#
        ),
        Some(3.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn geminis_overflow_answer_is_retried_compacted() {
    let upstream = mock_gemini(GeminiBehaviour {
        max_turns: Some(20),
    })
    .await;
    // Gemini's window as condenser knows it: the 41 turns fit, and only upstream says no.
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let response = Fixture::Gemini
        .post_as(
            &proxy,
            KEY,
            &gemini_body(&gemini_conversation(10)),
            false,
            &[],
        )
        .await
        .0;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-condenser-retry"),
        "context_length_exceeded"
    );
    let sent = model_requests(&upstream);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].1["contents"].as_array().unwrap().len(), 41);
    assert!(sent[1].1["contents"].as_array().unwrap().len() <= 20);
    assert_valid_gemini(&sent[1].1);
}

/// One summary, by whichever way the caller sends its key: `x-goog-api-key: K` and `?key=K`
/// are one caller, `?key=L` another; the summarizer is asked with the caller's own key, and
/// no key is logged.
#[tokio::test]
async fn a_key_in_the_header_or_the_query_is_one_caller_and_never_logged() {
    let logs = captured_logs();
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let body = gemini_body(&gemini_conversation(20));
    let first = Fixture::Gemini
        .post_as(&proxy, KEY, &body, false, &[])
        .await
        .0;
    assert_eq!(header(&first, "x-condenser-cache"), "miss");
    let by_query = |key: &'static str| {
        client()
            .post(proxy.url(&format!("{GENERATE}?key={key}")))
            .json(&body)
            .send()
    };
    let same = by_query(KEY).await.unwrap();
    assert_eq!(header(&same, "x-condenser-cache"), "hit");
    let other = by_query("AIza-another-caller-key").await.unwrap();
    assert_eq!(header(&other, "x-condenser-cache"), "miss");
    // Each summary is asked with the key of the caller it is for.
    let keys: Vec<String> = upstream
        .summarizer_calls()
        .iter()
        .map(|call| call.headers["x-goog-api-key"].to_str().unwrap().to_string())
        .collect();
    assert!(
        keys.iter()
            .all(|key| key == KEY || key == "AIza-another-caller-key"),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|key| key == "AIza-another-caller-key"),
        "{keys:?}"
    );
    // Forwarded as the client sent it: the key stays in the query, no header added.
    let forwarded: Vec<_> = upstream
        .recorded()
        .into_iter()
        .filter(|r| !is_summarizer_call(r))
        .collect();
    assert_eq!(
        forwarded[2].path_and_query,
        format!("{GENERATE}?key=AIza-another-caller-key")
    );
    assert!(forwarded[2].headers.get("x-goog-api-key").is_none());
    let logged = logs.text();
    assert!(logged.contains("gemini"), "the requests were logged");
    assert!(!logged.contains("AIza-"), "a key was logged");
}

#[tokio::test]
async fn a_configured_key_goes_as_x_goog_api_key_unless_the_caller_sent_one() {
    std::env::set_var("CONDENSER_TEST_GEMINI_KEY", "AIza-configured-key");
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let mut config = gemini_config(&upstream.url());
    config.upstream.api_key_env = "CONDENSER_TEST_GEMINI_KEY".into();
    let proxy = Proxy::start(config).await;
    let body = gemini_body(&gemini_conversation(1));
    let bare = client()
        .post(proxy.url(GENERATE))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 200);
    let own = client()
        .post(proxy.url(&format!("{GENERATE}?key=AIza-own-key")))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    let recorded = upstream.recorded();
    assert_eq!(recorded[0].headers["x-goog-api-key"], "AIza-configured-key");
    assert!(recorded[0].headers.get("authorization").is_none());
    assert!(recorded[1].headers.get("x-goog-api-key").is_none());
    assert!(recorded[1].path_and_query.ends_with("?key=AIza-own-key"));
}

#[tokio::test]
async fn the_google_genai_sdk_works_through_condenser() {
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let stdout = run_sdk_script("genai_sdk.py", &[&proxy.url("")], "google-genai").await;
    assert!(stdout.contains("plain: summarized"), "{stdout}");
    assert!(stdout.contains("stream: summarized"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let sent = model_requests(&upstream);
    assert_eq!(sent.len(), 2);
    // The SDK asks under `/v1/` or `/v1beta/`, as its version says: both are Gemini's.
    assert!(
        sent[0]
            .0
            .ends_with("/models/gemini-2.5-pro:generateContent"),
        "{}",
        sent[0].0
    );
    assert!(
        sent[1]
            .0
            .ends_with("/models/gemini-2.5-pro:streamGenerateContent?alt=sse"),
        "{}",
        sent[1].0
    );
    for (_, request) in &sent {
        assert_valid_gemini(request);
        assert!(request["contents"].as_array().unwrap().len() < 121);
    }
    let first = upstream
        .recorded()
        .into_iter()
        .find(|r| !is_summarizer_call(r))
        .unwrap();
    assert_eq!(first.headers["x-goog-api-key"], "AIza-sdk-test-key");
}

/// A key sent in the query is blanked from upstream's error reply, as a header's is.
#[tokio::test]
async fn a_key_in_the_query_never_comes_back_in_an_error() {
    let upstream = MockUpstream::start(handler(|r| async move {
        let key = r
            .path_and_query
            .rsplit("key=")
            .next()
            .unwrap_or("")
            .to_string();
        json_response(
            400,
            &json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
            "message": format!("API key not valid: {key}")}}),
        )
    }))
    .await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let response = client()
        .post(proxy.url(&format!("{GENERATE}?key=AIza-echoed-by-upstream")))
        .json(&gemini_body(&gemini_conversation(1)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(text.contains("API key not valid: [redacted]"), "{text}");
    assert!(!text.contains("AIza-echoed"), "{text}");
}

/// Several candidates asked for: the request goes as sent, whatever its size, as a chat
/// request with `n` above 1 does.
#[tokio::test]
async fn a_request_for_several_candidates_goes_as_sent() {
    let upstream = mock_gemini(GeminiBehaviour::default()).await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let mut body = gemini_body(&gemini_conversation(20));
    body["generationConfig"]["candidateCount"] = json!(2);
    let response = Fixture::Gemini
        .post_as(&proxy, KEY, &body, false, &[])
        .await
        .0;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "forwarded");
    assert_eq!(model_requests(&upstream)[0].1, body);
}

/// The signature the scripted Gemini gives its recall call, which it wants back verbatim.
const RECALL_SIGNATURE: &str = "CiQBVKhc-signed-recall-step";

/// The references a compacted request's summary names (`ctx:…N to ctx:…M`), every one.
fn named_references(request: &Value) -> Vec<String> {
    let text = request.to_string();
    let Some(rest) = text.split("archived verbatim as ").nth(1) else {
        return Vec::new();
    };
    let mut ends = rest.split(" to ").take(2).map(|reference| {
        let reference = reference.split(':').take(2).collect::<Vec<_>>().join(":");
        let (conversation, index) = reference.rsplit_once('.').unwrap();
        (
            conversation.to_string(),
            index
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<usize>()
                .unwrap(),
        )
    });
    let (conversation, first) = ends.next().unwrap();
    let (_, last) = ends.next().unwrap();
    (first..=last)
        .map(|i| format!("{conversation}.{i}"))
        .collect()
}

/// The recall call among a model turn's parts.
fn recall_call(turn: &Value) -> Value {
    let parts = turn["parts"].as_array().cloned().unwrap_or_default();
    parts
        .into_iter()
        .find(|part| part["functionCall"]["name"] == "condenser_recall")
        .unwrap_or(Value::Null)
}

/// A Gemini that recalls: offered `condenser_recall`, it calls it for every reference the
/// summary names, the call signed; continued, it refuses (400, as Gemini does) a model turn
/// whose call lost its signature, and answers with what it was given.
async fn recalling_gemini() -> MockUpstream {
    MockUpstream::start(handler(move |r| async move {
        let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
        let request: Value = serde_json::from_slice(&r.body).unwrap();
        if is_summarizer_call(&r) {
            return json_response(200, &summary_reply(&path, &lossy_summary(&request)));
        }
        let contents = request["contents"].as_array().unwrap();
        let last = &contents[contents.len() - 1];
        let answer = last["parts"][0]["functionResponse"].clone();
        let parts = if answer["name"] == "condenser_recall" {
            let call = recall_call(&contents[contents.len() - 2]);
            if call["thoughtSignature"] != RECALL_SIGNATURE {
                return json_response(400, &json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                    "message": "Function call is missing a thought_signature in functionCall parts."}}));
            }
            json!([{"text": format!("Recalled: {}", answer["response"]["output"].as_str().unwrap())}])
        } else if request["tools"].to_string().contains("condenser_recall") {
            json!([{"functionCall": {"name": "condenser_recall", "args": {"refs": named_references(&request)}},
                "thoughtSignature": RECALL_SIGNATURE}])
        } else {
            json!([{"text": "no recall offered"}])
        };
        let usage = json!({"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110});
        let reply = gemini_reply(parts, usage);
        if path.ends_with(":streamGenerateContent") {
            let mut opening = reply.clone();
            opening["candidates"][0]["content"]["parts"] = json!([{"text": "Let me look. "}]);
            opening["candidates"][0]
                .as_object_mut()
                .unwrap()
                .remove("finishReason");
            opening.as_object_mut().unwrap().remove("usageMetadata");
            return gemini_sse(&[opening, reply]);
        }
        json_response(200, &reply)
    }))
    .await
}

/// Recall in Gemini's API: the tool a `functionDeclarations` entry, served whole and
/// in-stream; the continuation carries the round's call with its thought signature (Gemini
/// refuses it otherwise), the answer gives back a summarized turn verbatim, and the client
/// never sees the tool.
#[tokio::test]
async fn gemini_recalls_what_its_summary_replaced_whole_and_streamed() {
    for path in [GENERATE, STREAM] {
        let upstream = recalling_gemini().await;
        let proxy = Proxy::start(gemini_config(&upstream.url())).await;
        let body = gemini_body(&gemini_conversation(20));
        let stream = path == STREAM;
        let (response, _) = Fixture::Gemini
            .post_as(&proxy, KEY, &body, stream, &[])
            .await;
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(header(&response, "x-condenser-action"), "summarized");
        let text = response.text().await.unwrap();
        assert!(!text.contains("condenser_recall"), "{path}: {text}");
        assert!(text.contains("Recalled: "), "{path}: {text}");
        assert!(
            text.contains("msg-u1. "),
            "{path}: a summarized turn, verbatim: {text}"
        );
        let sent = model_requests(&upstream);
        assert_eq!(sent.len(), 2, "{path}");
        let continuation = &sent[1].1;
        assert_valid_gemini(continuation);
        let turns = continuation["contents"].as_array().unwrap();
        let model_turn = &turns[turns.len() - 2];
        assert_eq!(model_turn["role"], "model");
        assert_eq!(
            recall_call(model_turn)["thoughtSignature"],
            RECALL_SIGNATURE
        );
        if path == STREAM {
            // The round's text reached the client, and goes back in the round's turn.
            assert!(text.contains("Let me look. "), "{text}");
            assert_eq!(model_turn["parts"][0]["text"], "Let me look. ");
        }
        let metrics = proxy.metrics().await;
        assert_eq!(
            metric(
                &metrics,
                r#"condenser_recalls_total{outcome="served",route="gemini"}"#
            ),
            Some(1.0),
            "{metrics}"
        );
    }
}

/// Issue 37: `:streamGenerateContent` without `alt=sse` (Google's REST default) streams one
/// JSON array. condenser offered recall there, read the array as a whole reply, and relayed
/// an unserved `condenser_recall` call once all of it was in. Now a compacted request there is
/// offered no recall, and the array reaches a plain REST client as upstream writes it: its
/// first element before upstream writes the rest.
#[tokio::test]
async fn gemini_array_streams_are_relayed_as_they_come_and_never_offered_recall() {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    use std::sync::Arc;

    let rest_may_go = Arc::new(tokio::sync::Notify::new());
    let gate = rest_may_go.clone();
    let upstream = MockUpstream::start(handler(move |r| {
        let gate = gate.clone();
        async move {
            let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
            if is_summarizer_call(&r) {
                let summary = lossy_summary(&r.json());
                return json_response(200, &summary_reply(&path, &summary));
            }
            let first = gemini_reply(json!([{"text": "first part. "}]), json!(null));
            let last = gemini_reply(
                json!([{"text": "last part."}]),
                json!({"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110}),
            );
            let pieces = futures_util::stream::iter([format!("[{first}")])
                .chain(futures_util::stream::once(async move {
                    gate.notified().await;
                    format!(",\r\n{last}]")
                }))
                .map(|piece| Ok::<_, condenser::transport::body::BoxError>(Frame::data(bytes::Bytes::from(piece))));
            hyper::Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(StreamBody::new(pieces).boxed_unsync())
                .unwrap()
        }
    }))
    .await;
    let proxy = Proxy::start(gemini_config(&upstream.url())).await;
    let body = gemini_body(&gemini_conversation(20));
    // Without `alt=sse`: Google's REST default, one JSON array.
    let (response, _) = post(&proxy, STREAM, &AS_CALLER, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let mut chunks = response.bytes_stream();
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("first part. ") {
        let chunk = within("the array's first element", chunks.next()).await;
        received.extend_from_slice(&chunk.unwrap().unwrap());
    }
    rest_may_go.notify_one();
    while let Some(chunk) = within("the rest of the array", chunks.next()).await {
        received.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(received).unwrap();
    let array: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(array.as_array().map(Vec::len), Some(2), "{text}");
    assert!(!text.contains("condenser_recall"), "{text}");
    let sent = model_requests(&upstream);
    assert_eq!(sent.len(), 1);
    assert!(
        !sent[0].1.to_string().contains("condenser_recall"),
        "{}",
        sent[0].1
    );
    assert!(sent[0].1.to_string().contains("[Context summary"));
}
