//! The summarizer is asked in the API its upstream speaks: `summarizer.api`, or by default the
//! dialect of the request's route; its reply's usage is counted, read the way of that API.

use crate::common::*;
use condenser::config::Via;
use std::sync::Arc;

use serde_json::{json, Value};

/// A chat conversation over the trigger, with its summaries asked in `api`: the summarizer
/// call goes to that API's path, in its shape, and its reply becomes the summary.
async fn summarized_through(api: &str, path: &str) -> (Value, Recorded) {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = small_window_config(&upstream.url());
    config.summarizer.api = api.to_string();
    let proxy = Proxy::start(config).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-api-key", "sk-ant-caller")
        .json(&chat_body(&conversation(40)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-condenser-action"),
        "summarized",
        "{api}"
    );
    let recorded = upstream.recorded();
    let call = recorded
        .iter()
        .find(|r| is_summarizer_call(r))
        .unwrap_or_else(|| panic!("no summarizer call through {api}"))
        .clone();
    assert_eq!(call.path_and_query, path);
    let forwarded = recorded
        .iter()
        .find(|r| !is_summarizer_call(r))
        .unwrap()
        .json();
    // Each summarizer reply's usage (100 in, 60 out in every API) is counted under the
    // summarizer model's label: gpt-4o-mini's family. A call made ahead may still be in flight.
    within("summarizer tokens counted", async {
        loop {
            let calls = upstream.summarizer_calls().len() as f64;
            let metrics = proxy.metrics().await;
            let tokens = |direction: &str| {
                let series = format!(
                    r#"condenser_summarizer_tokens_total{{direction="{direction}",model="gpt-4o"}}"#
                );
                metric(&metrics, &series)
            };
            if (tokens("input"), tokens("output")) == (Some(100.0 * calls), Some(60.0 * calls)) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    (forwarded, call)
}

fn summary_of(forwarded: &Value) -> String {
    forwarded["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_summary_can_be_asked_in_anthropic_messages() {
    let (forwarded, call) = summarized_through("messages", "/v1/messages").await;
    let body = call.json();
    assert!(body["system"]
        .as_str()
        .unwrap()
        .starts_with(SUMMARIZER_MARKER));
    assert_eq!(body["messages"][0]["role"], "user");
    assert!(body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains(PLANTED));
    assert_eq!(body["max_tokens"], 1024);
    assert_eq!(call.headers["anthropic-version"], "2023-06-01");
    assert_eq!(call.headers["x-api-key"], "sk-ant-caller");
    let summary = summary_of(&forwarded);
    assert!(summary.starts_with("[Context summary: "), "{summary}");
    assert!(summary.contains("ORD-4411"), "{summary}");
}

#[tokio::test]
async fn a_summary_can_be_asked_in_the_responses_api() {
    let (forwarded, call) = summarized_through("responses", "/v1/responses").await;
    let body = call.json();
    assert!(body["instructions"]
        .as_str()
        .unwrap()
        .starts_with(SUMMARIZER_MARKER));
    assert!(body["input"].as_str().unwrap().contains(PLANTED));
    assert_eq!(body["max_output_tokens"], 1024);
    assert_eq!(body["store"], false);
    assert!(!call.headers.contains_key("anthropic-version"));
    assert!(summary_of(&forwarded).contains("ORD-4411"));
}

/// Gemini names the model in the path: the summarizer's, `gpt-4o-mini` here.
#[tokio::test]
async fn a_summary_can_be_asked_in_gemini() {
    let (forwarded, call) =
        summarized_through("gemini", "/v1beta/models/gpt-4o-mini:generateContent").await;
    let body = call.json();
    assert!(body["systemInstruction"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(SUMMARIZER_MARKER));
    assert_eq!(body["contents"][0]["role"], "user");
    assert!(body["contents"][0]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .contains(PLANTED));
    assert!(
        body["generationConfig"]["maxOutputTokens"]
            .as_u64()
            .unwrap()
            > 1024
    );
    assert!(body.get("model").is_none());
    assert!(summary_of(&forwarded).contains("ORD-4411"));
}

#[tokio::test]
async fn by_default_a_chat_route_summarizes_in_chat_completions() {
    let (forwarded, call) = summarized_through("", "/v1/chat/completions").await;
    assert!(call.json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .starts_with(SUMMARIZER_MARKER));
    assert!(summary_of(&forwarded).contains("ORD-4411"));
}

/// A chat session grown one turn a request, in an 8,000-token window, its summaries asked by
/// the session's own model (`summarizer.via = "auto"`, the default): each request waits for
/// the summaries started before it to land, as an agent's tool time would let them.
async fn grown_session(
    behaviour: LlmBehaviour,
    configure: impl FnOnce(&mut condenser::Config),
) -> (Proxy, MockUpstream) {
    let upstream = mock_llm(behaviour).await;
    let mut config = small_window_config(&upstream.url());
    config.summarizer.model = String::new();
    configure(&mut config);
    let proxy = Proxy::start(config).await;
    for turns in 4..40 {
        let mut messages = conversation(turns);
        messages.push(user_turn(turns));
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth("sk-caller")
            .json(&chat_body(&messages))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "turn {turns}");
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    (proxy, upstream)
}

/// `condenser_summaries_total{via,outcome="used"}`.
async fn summaries_via(proxy: &Proxy, via: &str) -> f64 {
    let metrics = proxy.metrics().await;
    metric(
        &metrics,
        &format!(r#"condenser_summaries_total{{outcome="used",reason="",via="{via}"}}"#),
    )
    .unwrap()
}

/// Issue 40, item 1: a summary is asked as the session's last request, byte for byte up to
/// its end (so the provider serves it from its cache), with one user turn appended that asks
/// for the summary of all but the recent items, and the caller's key. The summary it gives is
/// the one later requests carry.
#[tokio::test]
async fn a_summary_made_ahead_is_asked_through_the_sessions_own_request() {
    let (proxy, upstream) = grown_session(LlmBehaviour::default(), |_| ()).await;
    let recorded = upstream.recorded();
    let asks: Vec<(usize, Value)> = recorded
        .iter()
        .enumerate()
        .filter(|(_, r)| is_summarizer_call(r))
        .map(|(at, r)| (at, r.json()))
        .collect();
    assert!(!asks.is_empty(), "no summary asked");
    for (at, ask) in &asks {
        let (question, before) = session_question(ask).expect("asked through the session");
        assert_eq!(recorded[*at].headers["authorization"], "Bearer sk-caller");
        // The session's request it was asked through: sent just before, the same but for
        // the turn appended and the answer's cap.
        let session = recorded[..*at]
            .iter()
            .rev()
            .filter(|r| !is_summarizer_call(r))
            .map(Recorded::json)
            .find(|sent| sent["messages"].as_array().map(Vec::as_slice) == Some(before))
            .expect("a request the session sent, byte for byte");
        assert_eq!(ask["model"], session["model"]);
        assert!(ask.get("stream").is_none());
        assert_eq!(ask["max_tokens"], 1024);
        // It leaves out the recent part, and covers the rest.
        let recent = left_out(question);
        assert!(
            recent >= 6 && recent < before.len(),
            "{recent} of {}",
            before.len()
        );
    }
    // Every summary was asked that way, and the summary later requests carry holds what the
    // asks covered: the fact planted in the first turn.
    assert_eq!(summaries_via(&proxy, "session").await, asks.len() as f64);
    assert_eq!(summaries_via(&proxy, "separate").await, 0.0);
    let last = upstream.forwarded().pop().unwrap();
    let summary = last["messages"][1]["content"].as_str().unwrap_or_default();
    assert!(summary.starts_with("[Context summary: "), "{last}");
    assert!(summary.contains("ORD-4411"), "{summary}");
}

/// A reply to a summary asked through the session that calls one of the session's tools is
/// no summary: it is asked again apart, and that one is used. Under `via = "separate"` no
/// summary goes through the session at all.
#[tokio::test]
async fn a_summary_through_the_session_that_calls_a_tool_is_asked_apart() {
    let call = json!({"id": "chatcmpl-tool", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "bash", "arguments": "{}"}}]}}]});
    let behaviour = LlmBehaviour {
        summarizer_error: Some(Arc::new(move |r: &Recorded| {
            session_question(&r.json())
                .is_some()
                .then(|| (200, call.clone()))
        })),
        ..Default::default()
    };
    let (proxy, upstream) = grown_session(behaviour, |_| ()).await;
    let asks: Vec<Value> = upstream
        .summarizer_calls()
        .iter()
        .map(Recorded::json)
        .collect();
    let through = asks
        .iter()
        .filter(|a| session_question(a).is_some())
        .count();
    let apart = asks.len() - through;
    // Each asked apart once more: a span folded in pieces is one summary of several calls.
    assert!(
        through > 0 && apart >= through,
        "{through} through the session, {apart} apart"
    );
    assert_eq!(summaries_via(&proxy, "separate").await, through as f64);
    assert_eq!(summaries_via(&proxy, "session").await, 0.0);
    let last = upstream.forwarded().pop().unwrap();
    assert!(last["messages"][1]["content"]
        .as_str()
        .unwrap_or_default()
        .contains("ORD-4411"));

    let (proxy, upstream) = grown_session(LlmBehaviour::default(), |config| {
        config.summarizer.via = Via::Separate
    })
    .await;
    let asks = upstream.summarizer_calls();
    assert!(!asks.is_empty());
    assert!(asks.iter().all(|a| session_question(&a.json()).is_none()));
    let made = summaries_via(&proxy, "separate").await;
    assert!(
        made > 0.0 && made <= asks.len() as f64,
        "{made} of {} calls",
        asks.len()
    );
}

/// Under `auto`, a summary goes through the session only while its cache is warm and the
/// summarizer is the session's own model: a cold cache (`prompt_cache_secs = 0`) or another
/// model asks apart. `via = "session"` asks through the session whatever the model, in the
/// session's own.
#[tokio::test]
async fn a_cold_cache_or_another_model_asks_apart_unless_via_is_session() {
    let through = |upstream: &MockUpstream| {
        let asks: Vec<Value> = upstream
            .summarizer_calls()
            .iter()
            .map(Recorded::json)
            .collect();
        assert!(!asks.is_empty(), "no summary asked");
        let through: Vec<&Value> = asks
            .iter()
            .filter(|a| session_question(a).is_some())
            .collect();
        (
            through.len(),
            asks.len(),
            through.first().map(|a| a["model"].clone()),
        )
    };
    let (_, cold) = grown_session(LlmBehaviour::default(), |config| {
        config.summarizer.prompt_cache_secs = 0
    })
    .await;
    let (none, asked, _) = through(&cold);
    assert_eq!(none, 0, "{asked} asked, {none} through a cold session");
    let (_, other) = grown_session(LlmBehaviour::default(), |config| {
        config.summarizer.model = "gpt-4o-mini".into()
    })
    .await;
    let (none, asked, _) = through(&other);
    assert_eq!(
        none, 0,
        "{asked} asked, {none} through the session by another model"
    );
    let (_, forced) = grown_session(LlmBehaviour::default(), |config| {
        config.summarizer.model = "gpt-4o-mini".into();
        config.summarizer.via = Via::Session;
    })
    .await;
    let (all, asked, model) = through(&forced);
    assert_eq!(all, asked, "under via = session, all through the session");
    assert_eq!(model, Some(json!("gpt-4o")));
}
