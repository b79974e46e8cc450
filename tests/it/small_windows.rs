//! Small windows, as local models have them (1,000, 2,048 or 4,096 tokens), with the default
//! settings: a long conversation compacts wherever its last turn fits, and one that cannot
//! fit is refused with what does not fit and by how much, by the proxy and by `condenser plan`.

use condenser::tokens::catalog::ModelOverride;
use condenser::tokens::counter::TokenCounter;
use serde_json::{json, Value};

use crate::common::*;

/// The default settings, but for gpt-4o's window.
fn with_window(upstream: &str, window: u64) -> condenser::Config {
    let mut config = config_for(upstream);
    config.models.insert(
        "gpt-4o".into(),
        ModelOverride {
            context_window: Some(window),
            encoding: None,
            price: None,
        },
    );
    config
}

/// 30 turns of about 100 tokens a message, then `last` from the user; no `max_tokens`, so
/// the reserve is the default's, at most half the window.
fn long_conversation(last: &str) -> Value {
    let mut messages = conversation(30);
    messages.push(json!({"role": "user", "content": last}));
    json!({"model": "gpt-4o", "messages": messages})
}

#[tokio::test]
async fn a_long_conversation_compacts_in_a_window_of_1000_2048_or_4096_tokens() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let body = long_conversation("ok?");
    // The summary's room is half the target (a quarter of what the reserve leaves); recall's
    // 160-token tool only where that is at least as large.
    for (window, summary_tokens, recall) in [
        (1_000u64, 125, false),
        (2_048, 256, true),
        (4_096, 512, true),
    ] {
        let proxy = Proxy::start(with_window(&upstream.url(), window)).await;
        let seen = upstream.recorded().len();
        let response = post_chat(&proxy, &body).await;
        assert_eq!(response.status(), 200, "{window}");
        assert_eq!(
            header(&response, "x-condenser-action"),
            "summarized",
            "{window}"
        );
        let forwarded: u64 = Condensed::of(&response).forwarded_tokens.unwrap();
        assert!(forwarded <= window / 2, "{window}: {forwarded} forwarded");
        response.bytes().await.unwrap();

        let recorded = &upstream.recorded()[seen..];
        let (asked, sent): (Vec<_>, Vec<_>) = recorded.iter().partition(|r| is_summarizer_call(r));
        assert!(!asked.is_empty(), "{window}: a summary was made");
        // The summarizer is gpt-4o too, in the same small window: every call it gets, and its
        // answer, fit that window.
        let info = proxy.state.catalog.resolve("gpt-4o");
        for call in asked {
            let call = call.json();
            assert_eq!(call["max_tokens"], summary_tokens, "{window}");
            let prompt = TokenCounter::new(0.0)
                .count_request(call.as_object().unwrap(), &info)
                .await
                .total;
            assert!(
                prompt + summary_tokens <= window,
                "{window}: a summarizer call of {prompt} tokens"
            );
        }
        let [sent] = sent.as_slice() else {
            panic!("{window}: one request upstream, not {}", sent.len());
        };
        let sent = sent.json();
        let sent = if recall {
            without_recall_tool(&sent)
        } else {
            assert!(sent.get("tools").is_none(), "{window}: {sent}");
            sent
        };
        let messages = sent["messages"].as_array().unwrap();
        assert_eq!(messages[0]["content"], SYSTEM_PROMPT, "{window}");
        assert!(
            messages[1]["content"]
                .as_str()
                .unwrap()
                .starts_with("[Context summary: "),
            "{window}: {sent}"
        );
        assert_eq!(messages.last(), body["messages"].as_array().unwrap().last());
    }
}

#[tokio::test]
async fn a_last_turn_larger_than_a_small_window_is_refused_naming_what_does_not_fit() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(with_window(&upstream.url(), 1_000)).await;
    let body = long_conversation(&filler(7, 600));
    let response = post_chat(&proxy, &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "context_length_exceeded");
    let message = error["error"]["message"].as_str().unwrap();
    for said in [
        "context window is 1000 tokens, 500 of them reserved for the response",
        "which leaves 500",
        "for the task",
        "kept for the summary",
    ] {
        assert!(message.contains(said), "{said:?} in {message}");
    }
    assert!(upstream.recorded().is_empty(), "nothing sent");

    // condenser plan says the same, and for the last turn that fits, what it would do.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[models.\"gpt-4o\"]\ncontext_window = 1000\n").unwrap();
    let plan = |body: Value| {
        let config = config.to_str().unwrap().to_string();
        async move { condenser_cli(&["plan", "--config", &config], body.to_string().as_bytes()).await }
    };
    let refused = plan(body).await;
    let decision = refused
        .lines()
        .find(|line| line.starts_with("decision:"))
        .unwrap();
    assert!(
        decision.contains("reject with 400 context_length_exceeded")
            && decision.contains(message.split("fit: ").nth(1).unwrap()),
        "{decision}\nvs {message}"
    );
    let compacted = plan(long_conversation("ok?")).await;
    assert!(
        compacted.contains("decision: compact")
            && compacted.contains("with a summary of at most 125 tokens"),
        "{compacted}"
    );
}
