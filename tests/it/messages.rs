//! Anthropic Messages (`POST /v1/messages`) through condenser, over HTTP against a recording
//! mock Claude whose summarizer calls go to chat completions on the same upstream.

use std::sync::Arc;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// The requests forwarded to Claude; summaries are asked on the same path, in the same API.
fn claude_requests(upstream: &MockUpstream) -> Vec<Value> {
    upstream
        .recorded()
        .iter()
        .filter(|r| r.path_and_query == "/v1/messages" && !is_summarizer_call(r))
        .map(Recorded::json)
        .collect()
}

/// Where the summary went, and the kept messages after it.
#[derive(Debug, PartialEq)]
enum Placement {
    /// Prepended to the first kept turn, a user turn.
    MergedIntoUserTurn,
    /// A user turn of its own, before a kept assistant turn.
    OwnUserTurn,
    /// After the original `system`.
    System,
}

/// What the summary line of a stand-in says (rule 10).
const STAND_IN: &str = ", a stand-in until the summary is made]";

/// One over-threshold request: the 121-message agent conversation, tool pairs included.
/// Checks what every compaction must be (valid messages, the summary with the planted fact,
/// the kept tail verbatim, every other field as sent) and returns where the summary went.
async fn compact_once(
    summary_role: condenser::config::SummaryRole,
    force_keeping: Option<usize>,
    system: Value,
) -> (Placement, Value) {
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let mut config = claude_config(&upstream.url());
    config.context.summary_role = summary_role;
    if let Some(keep) = force_keeping {
        config.context.keep_recent_messages = keep;
    }
    let proxy = Proxy::start(config).await;
    let original = claude_conversation(30);
    assert_eq!(original.len(), 121);
    let mut body = messages_body(&original);
    body["system"] = system.clone();
    // Force keeps only the required recent messages: the kept part starts where
    // `keep_recent_messages` puts it.
    let force = [("x-condenser-mode", "force")];
    let mode: &[(&str, &str)] = if force_keeping.is_some() { &force } else { &[] };
    // Unforced, nothing on hand, it goes at once with a stand-in while the model's summary
    // is made (rule 10): sent again, it goes with the model's summary once made.
    let (response, condensed) = loop {
        let (response, condensed) = Fixture::Messages
            .post_as(&proxy, "sk-ant-test", &body, false, mode)
            .await;
        let stood_in = claude_requests(&upstream)
            .last()
            .is_some_and(|sent| sent.to_string().contains(STAND_IN));
        if !stood_in {
            break (response, condensed);
        }
        response.bytes().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(response.status(), 200);
    assert_eq!(condensed.action, "summarized");
    let received: u64 = condensed.prompt_tokens.unwrap();
    let forwarded: u64 = condensed.forwarded_tokens.unwrap();
    eprintln!("received {received} tokens, forwarded {forwarded}");
    assert!(forwarded < received, "{received} → {forwarded}");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["type"], "message");

    let sent = claude_requests(&upstream);
    assert_eq!(upstream.summarizer_calls().len(), 1);
    let call = upstream
        .recorded()
        .into_iter()
        .find(is_summarizer_call)
        .unwrap();
    assert_eq!(
        call.path_and_query, "/v1/messages",
        "a Claude route summarizes in Claude's API"
    );
    assert_eq!(call.headers["x-api-key"], "sk-ant-test");
    let mut sent = sent.into_iter().next_back().unwrap();
    let messages = sent["messages"].as_array().unwrap().clone();
    assert!(messages.len() < original.len());
    assert_valid_messages(&messages);
    // Every other field as sent.
    let mut rest = without_recall_tool(&sent).as_object().unwrap().clone();
    rest.remove("messages");
    rest.remove("system");
    let mut expected = body.as_object().unwrap().clone();
    expected.remove("messages");
    expected.remove("system");
    assert_eq!(rest, expected);

    let is_summary = |text: &Value| {
        let text = text.as_str().unwrap_or("");
        text.starts_with("[Context summary: ") && text.contains("ORD-4411")
    };
    // A kept turn's own content may be a string: then the summary was not put there.
    let first = messages[0]["content"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let placement = if sent["system"] != system {
        assert!(
            !Value::Array(messages.clone())
                .to_string()
                .contains("[Context summary"),
            "the summary is in system only"
        );
        Placement::System
    } else if first.len() == 1 && is_summary(&first[0]["text"]) {
        Placement::OwnUserTurn
    } else {
        assert!(is_summary(&first[0]["text"]), "{first:?}");
        Placement::MergedIntoUserTurn
    };
    let kept = match placement {
        Placement::System | Placement::MergedIntoUserTurn => messages.len(),
        Placement::OwnUserTurn => messages.len() - 1,
    };
    let tail = &original[original.len() - kept..];
    match placement {
        Placement::System => assert_eq!(messages, tail),
        Placement::OwnUserTurn => {
            assert_eq!(tail[0]["role"], "assistant");
            assert_eq!(messages[1..], *tail);
        }
        Placement::MergedIntoUserTurn => {
            assert_eq!(tail[0]["role"], "user");
            assert_eq!(
                first[1..],
                [json!({"type": "text", "text": tail[0]["content"]})],
                "the kept turn's own text follows the summary"
            );
            assert_eq!(messages[1..], tail[1..]);
        }
    }
    sent.as_object_mut().unwrap().remove("messages");
    (placement, sent["system"].clone())
}

#[tokio::test]
async fn with_summary_role_user_the_summary_is_merged_into_the_first_kept_user_turn() {
    let system = json!(CLAUDE_SYSTEM);
    let (placement, sent_system) = compact_once(
        condenser::config::SummaryRole::User,
        Some(5),
        system.clone(),
    )
    .await;
    assert_eq!(placement, Placement::MergedIntoUserTurn);
    assert_eq!(sent_system, system, "system is never changed");
}

/// Unforced, the kept part starts where the plan's summary ends, a user or an assistant turn:
/// the summary opens the conversation as a user turn of its own before an assistant turn, or
/// merged into the user turn kept (`compact_once` checks each against what was kept), and
/// `system` is never changed.
#[tokio::test]
async fn an_unforced_summary_opens_the_conversation_as_a_user_turn() {
    let system = json!(CLAUDE_SYSTEM);
    let (placement, sent_system) =
        compact_once(condenser::config::SummaryRole::User, None, system.clone()).await;
    assert_ne!(placement, Placement::System);
    assert_eq!(sent_system, system);
}

#[tokio::test]
async fn with_summary_role_system_the_summary_follows_the_original_system() {
    let blocks =
        json!([{"type": "text", "text": CLAUDE_SYSTEM, "cache_control": {"type": "ephemeral"}}]);
    let (placement, sent_system) = compact_once(
        condenser::config::SummaryRole::System,
        Some(5),
        blocks.clone(),
    )
    .await;
    assert_eq!(placement, Placement::System);
    let sent_system = sent_system.as_array().unwrap();
    assert_eq!(sent_system.len(), 2);
    assert_eq!(
        sent_system[0], blocks[0],
        "the original block, cache_control kept"
    );
    let summary = sent_system[1]["text"].as_str().unwrap();
    assert!(summary.starts_with("[Context summary: ") && summary.contains("ORD-4411"));

    let (placement, sent_system) = compact_once(
        condenser::config::SummaryRole::System,
        Some(5),
        json!(CLAUDE_SYSTEM),
    )
    .await;
    assert_eq!(placement, Placement::System);
    let text = sent_system.as_str().unwrap();
    assert!(
        text.starts_with(&format!("{CLAUDE_SYSTEM}\n\n[Context summary: ")),
        "{text}"
    );
}

#[tokio::test]
async fn under_the_trigger_the_body_is_forwarded_byte_for_byte() {
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let sent = "{ \"messages\" : [{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \\u00e9\"}]}],\n \"model\":\"claude-sonnet-4-5\", \"max_tokens\":64, \"x_unknown\": 1.50 }";
    let response = client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .body(sent)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "forwarded");
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].body, sent.as_bytes());
    for (name, value) in [
        ("x-api-key", "sk-ant-test"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "prompt-caching-2024-07-31"),
    ] {
        assert_eq!(recorded[0].headers[name], value);
    }
}

/// Claude Code 2.1 sends `system` turns among its messages; condenser is never stricter than
/// Anthropic, so they go byte for byte while nothing is compacted, and in their place after.
#[tokio::test]
async fn system_turns_among_the_messages_are_carried_in_their_place() {
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let reminder = json!({"role": "system", "content": "<system-reminder>ticket KX-7731-QZ</system-reminder>"});
    let send = |body: Vec<u8>, mode: &'static str| {
        client()
            .post(proxy.url("/v1/messages"))
            .header("x-api-key", "sk-ant-test")
            .header("x-condenser-mode", mode)
            .body(body)
            .send()
    };
    let small = serde_json::to_vec(&messages_body(&[
        json!({"role": "user", "content": "hi"}),
        reminder.clone(),
    ]))
    .unwrap();
    let mut long = claude_conversation(30);
    long.insert(long.len() - 1, reminder.clone());
    let long = serde_json::to_vec(&messages_body(&long)).unwrap();
    // First, while the model's count is still the estimate (the mock's usage lowers it).
    let response = send(long.clone(), "auto").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let forwarded = claude_requests(&upstream).pop().unwrap();
    let messages = forwarded["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[messages.len() - 2], reminder, "kept in its place");
    assert_eq!(messages.iter().filter(|m| **m == reminder).count(), 1);
    for (body, mode) in [(&small, "auto"), (&long, "off")] {
        let response = send(body.clone(), mode).await.unwrap();
        assert_eq!(response.status(), 200, "{mode}");
        assert_eq!(header(&response, "x-condenser-action"), "forwarded");
        assert_eq!(&upstream.recorded().last().unwrap().body, body, "{mode}");
    }
}

#[tokio::test]
async fn count_tokens_passes_through() {
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let sent = messages_body(&claude_conversation(30)).to_string();
    let response = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .body(sent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-condenser-action").is_none());
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].path_and_query, "/v1/messages/count_tokens");
    assert_eq!(recorded[0].body, sent.as_bytes());
}

#[tokio::test]
async fn a_stream_is_relayed_event_by_event_and_its_usage_read() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let upstream = mock_claude(ClaudeBehaviour {
        stream_gate: Some(gate.clone()),
        ..Default::default()
    })
    .await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let mut body = messages_body(&[user_turn(0)]);
    body["stream"] = json!(true);
    let (response, condensed) = Fixture::Messages.post(&proxy, &body, true, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(condensed.action, "forwarded");
    let forwarded_tokens = condensed.forwarded_tokens;
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    // The rest is held upstream until the first event has reached the client.
    while !text.contains("\n\n") {
        let chunk = within("message_start", stream.next())
            .await
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(!text.contains("content_block"), "{text}");
    gate.notify_one();
    while let Some(chunk) = within("rest of the stream", stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        events,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let metrics = proxy.metrics().await;
    let series = |name: &str| format!("{name}{{model=\"claude-sonnet-4-5\"}}");
    assert_eq!(
        metric(&metrics, &series("condenser_completion_tokens_total")),
        Some(CLAUDE_OUTPUT_TOKENS as f64),
        "{metrics}"
    );
    // Usage told of a prompt (input, cache creation and cache read together) under half the
    // estimate of this ~120-token one: the learned ratio, which only a read usage sets, sits
    // at its floor.
    let usage_prompt =
        CLAUDE_INPUT_TOKENS + CLAUDE_CACHE_CREATION_TOKENS + CLAUDE_CACHE_READ_TOKENS;
    let estimated: u64 = forwarded_tokens.unwrap();
    assert!(usage_prompt * 2 < estimated, "{estimated}");
    assert_eq!(
        metric(&metrics, &series("condenser_token_estimate_ratio")),
        Some(0.5),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "condenser_requests_total{route=\"messages\",status=\"200\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
}

async fn anthropic_error(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["message"].as_str().is_some(), "{body}");
    (status, body["error"].clone())
}

#[tokio::test]
async fn errors_come_in_anthropics_shape_without_calling_upstream() {
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let send = |body: &'static str| client().post(proxy.url("/v1/messages")).body(body).send();
    let (status, error) = anthropic_error(send("{\"model\":").await.unwrap()).await;
    assert_eq!(
        (status, error["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    let (status, error) = anthropic_error(
        send(r#"{"model":"claude-sonnet-4-5","max_tokens":5}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert_eq!(error["message"], "messages: Field required");
    assert!(upstream.recorded().is_empty());

    // An upstream that cannot be reached is Anthropic's api_error, 502.
    let nowhere = closed_url();
    let unreachable = Proxy::start(claude_config(&nowhere)).await;
    let body = messages_body(&[json!({"role": "user", "content": "hi"})]);
    let (response, _) = Fixture::Messages
        .post(&unreachable, &body, false, &[])
        .await;
    let (status, error) = anthropic_error(response).await;
    assert_eq!((status, error["type"].as_str()), (502, Some("api_error")));
}

#[tokio::test]
async fn the_anthropic_python_sdk_works_through_condenser() {
    // Usage tells of more prompt than estimated, as Claude's tokenizer does: learned, it keeps
    // the second request over the trigger too.
    let upstream = mock_claude(ClaudeBehaviour {
        input_tokens: Some(20_000),
        ..Default::default()
    })
    .await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let stdout = run_sdk_script("anthropic_sdk.py", &[&proxy.url("")], "anthropic").await;
    assert!(stdout.contains("plain: summarized"), "{stdout}");
    assert!(stdout.contains("stream: summarized"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let sent = claude_requests(&upstream);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1]["stream"], true);
    for request in &sent {
        assert_valid_messages(request["messages"].as_array().unwrap());
        assert!(request["messages"].as_array().unwrap().len() < 121);
    }
    let recorded = upstream.recorded();
    let first = recorded
        .iter()
        .find(|r| r.path_and_query == "/v1/messages" && !is_summarizer_call(r))
        .unwrap();
    // The SDK's key reaches upstream as it sent it (`x-api-key`, or a bearer token in SDKs
    // from 2.x on).
    let key = |name: &str| {
        first
            .headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert!(
        key("x-api-key").as_deref() == Some("sk-ant-sdk-test")
            || key("authorization").as_deref() == Some("Bearer sk-ant-sdk-test"),
        "{:?}",
        first.headers
    );
    assert!(first.headers.contains_key("anthropic-version"));
}

/// An agent's request under every trigger is counted from its raw bytes: the same count as
/// the full path's, and the messages it has seen before neither parsed nor encoded again.
#[tokio::test]
async fn under_the_trigger_a_request_is_counted_from_its_bytes_as_the_full_path_counts_it() {
    use condenser::dialect::messages::Messages;
    use condenser::dialect::stages::Dialect;
    let upstream = mock_claude(ClaudeBehaviour::default()).await;
    let mut config = claude_config(&upstream.url());
    config.models.get_mut("claude-sonnet-4-5").unwrap().encoding = Some("o200k_base".into());
    let proxy = Proxy::start(config.clone()).await;
    let catalog =
        condenser::tokens::catalog::ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = condenser::tokens::counter::TokenCounter::new(config.tokens.unknown_model_margin);
    let mut body = messages_body(&claude_conversation(3));
    body["tools"] = json!([{"name": "lookup", "description": "Looks a thing up.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {"type": "web_search_20250305", "name": "web_search"}]);
    body["tool_choice"] = json!({"type": "auto"});
    body["system"] =
        json!([{"type": "text", "text": CLAUDE_SYSTEM, "cache_control": {"type": "ephemeral"}}]);
    let mut without_system = body.clone();
    without_system["system"] = Value::Null;
    for body in [body, without_system] {
        let bytes = serde_json::to_vec(&body).unwrap();
        let full = Messages::count(
            &Messages::parse(&bytes, Messages::PATH).unwrap(),
            &catalog,
            &counter,
        )
        .await
        .count
        .total;
        for attempt in 0..2 {
            let encoded = proxy.state.counter.messages_encoded();
            let response = Fixture::Messages.post(&proxy, &body, false, &[]).await.0;
            assert_eq!(response.status(), 200);
            assert_eq!(header(&response, "x-condenser-action"), "forwarded");
            let counted: u64 = Condensed::of(&response).prompt_tokens.unwrap();
            assert_eq!(counted, full, "{body}");
            if attempt == 1 {
                assert_eq!(
                    proxy.state.counter.messages_encoded(),
                    encoded,
                    "seen before"
                );
            }
        }
        assert_eq!(upstream.recorded().last().unwrap().body, bytes);
    }
}

/// Every error condenser writes on Anthropic's paths is in Anthropic's shape: the 431 for
/// oversized headers, and its own errors on the paths under `/v1/messages/`.
#[tokio::test]
async fn condensers_own_errors_under_the_messages_paths_take_anthropics_shape() {
    let nowhere = closed_url();
    let proxy = Proxy::start(claude_config(&nowhere)).await;
    let huge = "x".repeat(70 * 1024);
    let response = client()
        .post(proxy.url("/v1/messages"))
        .header("x-padding", huge)
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, error) = anthropic_error(response).await;
    assert_eq!(status, 431);
    assert!(
        error["message"].as_str().unwrap().contains("header"),
        "{error}"
    );
    let response = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .body(r#"{"model":"claude-sonnet-4-5","messages":[]}"#)
        .send()
        .await
        .unwrap();
    let (status, error) = anthropic_error(response).await;
    assert_eq!((status, error["type"].as_str()), (502, Some("api_error")));
}
