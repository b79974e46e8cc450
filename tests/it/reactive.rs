//! When upstream still finds a prompt too long (an estimated tokenizer, a window configured
//! too large), condenser compacts it as under `force` and retries once, before any byte has
//! reached the client; and counts that model's prompts higher from then on.

use crate::common::*;
use serde_json::{json, Value};

fn anthropic_too_long() -> Value {
    json!({"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 5868 tokens > 5000 maximum",
    }})
}

/// 27 turns (55 messages, 5,868 tokens): under the 6,000-token trigger, so condenser forwards
/// it as sent, and over what the mock model takes (50 messages).
const TURNS: usize = 27;

async fn upstream_with_smaller_window(error: Value, limit: usize) -> MockUpstream {
    mock_llm(LlmBehaviour {
        too_long: Some((limit, error)),
        ..LlmBehaviour::default()
    })
    .await
}

/// A window condenser is told is about twice what the model takes: the 27 turns are planned
/// as nothing to prepare (under 0.6 of 10,500 usable tokens), and only upstream's answer says
/// otherwise.
fn window_configured_too_large(upstream: &MockUpstream) -> condenser::Config {
    let mut config = small_window_config(&upstream.url());
    config.models.get_mut("gpt-4o").unwrap().context_window = Some(11_000);
    config
}

#[tokio::test]
async fn a_prompt_upstream_finds_too_long_is_retried_once_compacted() {
    for error in [openai_too_long(), anthropic_too_long()] {
        let upstream = upstream_with_smaller_window(error.clone(), 50).await;
        let proxy = Proxy::start(window_configured_too_large(&upstream)).await;
        let response = post_chat(&proxy, &chat_body(&conversation(TURNS))).await;
        assert_eq!(response.status(), 200, "{error}");
        assert_eq!(
            header(&response, "x-condenser-retry"),
            "context_length_exceeded"
        );
        assert_eq!(header(&response, "x-condenser-action"), "summarized");
        let reply: Value = response.json().await.unwrap();
        assert!(reply["choices"][0]["message"]["content"].is_string());
        let sent = upstream.forwarded();
        assert_eq!(sent.len(), 2, "sent as received, then once compacted");
        assert_eq!(sent[0]["messages"].as_array().unwrap().len(), 55);
        assert!(sent[1]["messages"].as_array().unwrap().len() <= 50);
        let summaries = upstream
            .recorded()
            .iter()
            .filter(|r| is_summarizer_call(r))
            .count();
        assert_eq!(summaries, 1, "one summarization");
        let metrics = proxy.metrics().await;
        assert_eq!(
            metric(
                &metrics,
                r#"condenser_reactive_retries_total{model="gpt-4o"}"#
            ),
            Some(1.0)
        );
    }
}

#[tokio::test]
async fn a_stream_is_retried_before_its_first_byte() {
    let upstream = upstream_with_smaller_window(openai_too_long(), 50).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let mut body = chat_body(&conversation(TURNS));
    body["stream"] = json!(true);
    let response = post_chat(&proxy, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-condenser-retry"),
        "context_length_exceeded"
    );
    assert!(header(&response, "content-type").starts_with("text/event-stream"));
    let text = stream_text(response).await;
    assert!(text.contains("reply"), "{text}");
    assert_eq!(upstream.forwarded().len(), 2);
}

#[tokio::test]
async fn a_second_failure_is_passed_on() {
    // Nothing compacted fits a model that takes three messages.
    let upstream = upstream_with_smaller_window(openai_too_long(), 3).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let response = post_chat(&proxy, &chat_body(&conversation(TURNS))).await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        header(&response, "x-condenser-retry"),
        "context_length_exceeded"
    );
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply, openai_too_long(), "upstream's own error");
    assert_eq!(upstream.forwarded().len(), 2, "one retry, no more");
}

#[tokio::test]
async fn a_request_sent_with_compaction_off_is_not_retried() {
    let upstream = upstream_with_smaller_window(openai_too_long(), 50).await;
    let proxy = Proxy::start(window_configured_too_large(&upstream)).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-condenser-mode", "off")
        .json(&chat_body(&conversation(TURNS)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.headers().get("x-condenser-retry").is_none());
    assert_eq!(upstream.forwarded().len(), 1);
}

#[tokio::test]
async fn a_prompt_far_inside_a_window_counted_exactly_is_not_retried() {
    // Five turns, about 1,100 tokens of an 8,000-token window, in gpt-4o's own encoding: an
    // upstream that finds them too long disagrees about more than counting.
    let upstream = upstream_with_smaller_window(openai_too_long(), 3).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let response = post_chat(&proxy, &chat_body(&conversation(5))).await;
    assert_eq!(response.status(), 400);
    assert!(response.headers().get("x-condenser-retry").is_none());
    assert_eq!(upstream.forwarded().len(), 1);
}

#[tokio::test]
async fn an_error_that_is_not_about_length_is_passed_on_untried() {
    let other = json!({"error": {"message": "bad temperature", "type": "invalid_request_error",
                                 "param": "temperature", "code": "invalid_value"}});
    let upstream = upstream_with_smaller_window(other.clone(), 50).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let response = post_chat(&proxy, &chat_body(&conversation(TURNS))).await;
    assert_eq!(response.status(), 400);
    assert!(response.headers().get("x-condenser-retry").is_none());
    assert_eq!(response.json::<Value>().await.unwrap(), other);
    assert_eq!(upstream.forwarded().len(), 1);
}

#[tokio::test]
async fn after_a_retry_the_next_request_is_compacted_ahead_of_time() {
    let upstream = upstream_with_smaller_window(openai_too_long(), 50).await;
    let proxy = Proxy::start(window_configured_too_large(&upstream)).await;
    let next_turn = chat_body(&conversation(TURNS + 1));
    // Counted by a condenser that has not been told the window is smaller.
    let untold = Proxy::start(window_configured_too_large(
        &mock_llm(LlmBehaviour::default()).await,
    ))
    .await;
    let before = Condensed::of(&post_chat(&untold, &next_turn).await)
        .prompt_tokens
        .unwrap();
    let first = post_chat(&proxy, &chat_body(&conversation(TURNS))).await;
    assert_eq!(
        header(&first, "x-condenser-retry"),
        "context_length_exceeded"
    );
    let sent = upstream.forwarded().len();
    // The conversation one turn on: now counted higher, over the trigger, and compacted
    // before it is sent.
    let next = post_chat(&proxy, &next_turn).await;
    assert_eq!(next.status(), 200);
    assert!(next.headers().get("x-condenser-retry").is_none());
    assert_eq!(header(&next, "x-condenser-action"), "summarized");
    let counted: u64 = Condensed::of(&next).prompt_tokens.unwrap();
    assert!(counted > before * 11 / 10, "{before} then {counted}");
    assert_eq!(
        upstream.forwarded().len(),
        sent + 1,
        "the next request went once"
    );
    let learned = metric(
        &proxy.metrics().await,
        r#"condenser_reactive_retries_total{model="gpt-4o"}"#,
    );
    assert_eq!(learned, Some(1.0));
}
