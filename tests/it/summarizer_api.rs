//! The summarizer is asked in the API its upstream speaks: `summarizer.api`, or by default the
//! dialect of the request's route; its reply's usage is counted, read the way of that API.

use crate::common::*;
use serde_json::Value;

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
