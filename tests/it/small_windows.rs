//! Small windows, as local models have them (1,000, 2,048 or 4,096 tokens), with the default
//! settings: a long conversation compacts wherever its last turn fits, and one that cannot
//! fit is refused with what does not fit and by how much, by the proxy and by `condenser plan`.
//! Both run over every dialect of the registry (`Fixture::all()`).

use condenser::tokens::catalog::ModelOverride;
use serde_json::{json, Value};

use crate::common::*;

/// The default settings, but for the window of `fixture`'s model.
fn with_window(fixture: Fixture, upstream: &str, window: u64) -> condenser::Config {
    let mut config = config_for(upstream);
    config.models.insert(
        fixture.model().into(),
        ModelOverride {
            context_window: Some(window),
            encoding: None,
            price: None,
        },
    );
    config
}

/// 30 turns of about 100 tokens a message, then `last` from the user, in `fixture`'s dialect.
/// The reply's reserve is half the window: the default's, as no `max_tokens` is asked, but in
/// Anthropic's API, which requires it and is asked as much.
fn long_conversation(fixture: Fixture, last: &str, window: u64) -> Value {
    let chat = conversation(30);
    let mut turns: Vec<(&str, String)> = chat[1..]
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap();
            (role, m["content"].as_str().unwrap().to_string())
        })
        .collect();
    turns.push(("user", last.to_string()));
    let mut body = fixture.body(&turns, false);
    if fixture == Fixture::Messages {
        body["max_tokens"] = json!(window / 2);
    }
    body
}

#[tokio::test]
async fn a_long_conversation_compacts_in_a_window_of_1000_2048_or_4096_tokens() {
    for fixture in Fixture::all() {
        let upstream = fixture.upstream(LlmBehaviour::default()).await;
        // The summary's room is half the target (a quarter of what the reserve leaves); recall's
        // 160-token tool only where that is at least as large.
        for (window, summary_tokens, recall) in [
            (1_000u64, 125, false),
            (2_048, 256, true),
            (4_096, 512, true),
        ] {
            let body = long_conversation(fixture, "ok?", window);
            let proxy = Proxy::start(with_window(fixture, &upstream.url(), window)).await;
            let seen = upstream.recorded().len();
            let (response, condensed) = fixture.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{fixture:?} {window}");
            assert_eq!(condensed.action, "summarized", "{fixture:?} {window}");
            let forwarded = condensed.forwarded_tokens.unwrap();
            assert!(
                forwarded <= window / 2,
                "{fixture:?} {window}: {forwarded} forwarded"
            );
            response.bytes().await.unwrap();

            let recorded = &upstream.recorded()[seen..];
            let (asked, sent): (Vec<_>, Vec<_>) =
                recorded.iter().partition(|r| is_summarizer_call(r));
            assert!(
                !asked.is_empty(),
                "{fixture:?} {window}: a summary was made"
            );
            // The summarizer is the model asked, in the same small window: every call it gets,
            // and its answer, fit that window.
            // (Gemini's asks room for its thinking besides, within its own output limit.)
            for call in asked {
                assert_eq!(fixture.model_of(call), fixture.model(), "{fixture:?}");
                assert_eq!(
                    fixture.max_output(&call.json()),
                    summary_tokens + fixture.thinking_allowance(),
                    "{fixture:?} {window}"
                );
                let prompt = fixture.count(&proxy, call).await;
                assert!(
                    prompt + summary_tokens <= window,
                    "{fixture:?} {window}: a summarizer call of {prompt} tokens"
                );
            }
            let [sent] = sent.as_slice() else {
                panic!(
                    "{fixture:?} {window}: one request upstream, not {}",
                    sent.len()
                );
            };
            let sent = sent.json();
            let sent = if recall {
                without_recall_tool(&sent)
            } else {
                assert!(sent.get("tools").is_none(), "{fixture:?} {window}: {sent}");
                sent
            };
            fixture.assert_compacted_shape(&body, &sent, 1);
            assert_eq!(
                fixture.items(&sent).last(),
                fixture.items(&body).last(),
                "{fixture:?} {window}"
            );
        }
    }
}

#[tokio::test]
async fn a_last_turn_larger_than_a_small_window_is_refused_naming_what_does_not_fit() {
    for fixture in Fixture::all() {
        let upstream = fixture.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(with_window(fixture, &upstream.url(), 1_000)).await;
        let body = long_conversation(fixture, &filler(7, 600), 1_000);
        let (response, _) = fixture.post(&proxy, &body, false, &[]).await;
        // Refused in the dialect's error shape, of the kind its provider's own too-long error
        // has.
        let (status, kind, message) = fixture.error(response).await;
        assert_eq!(status, 400, "{fixture:?}: {message}");
        let provider = hyper::Response::builder()
            .status(400)
            .body(fixture.too_long().to_string())
            .unwrap();
        let (_, provider_kind, _) = fixture.error(reqwest::Response::from(provider)).await;
        assert_eq!(kind, provider_kind, "{fixture:?}: {message}");
        for said in [
            "context window is 1000 tokens, 500 of them reserved for the response",
            "which leaves 500",
            "for the task",
            "kept for the summary",
        ] {
            assert!(message.contains(said), "{fixture:?}: {said:?} in {message}");
        }
        assert!(upstream.recorded().is_empty(), "{fixture:?}: nothing sent");

        // condenser plan says the same, and for the last turn that fits, what it would do.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("[models.\"{}\"]\ncontext_window = 1000\n", fixture.model()),
        )
        .unwrap();
        let plan = |body: Value| {
            let config = config.to_str().unwrap().to_string();
            async move {
                let args = [
                    "plan",
                    "--config",
                    &config,
                    "--api",
                    fixture.name(),
                    "--model",
                    fixture.model(),
                ];
                condenser_cli(&args, body.to_string().as_bytes()).await
            }
        };
        let refused = plan(body).await;
        let decision = refused
            .lines()
            .find(|line| line.starts_with("decision:"))
            .unwrap_or_else(|| panic!("{fixture:?}: {refused}"));
        assert!(
            decision.contains("reject with 400 context_length_exceeded")
                && decision.contains(message.split("fit: ").nth(1).unwrap()),
            "{fixture:?}: {decision}\nvs {message}"
        );
        let compacted = plan(long_conversation(fixture, "ok?", 1_000)).await;
        assert!(
            compacted.contains("decision: compact")
                && compacted.contains("with a summary of at most 125 tokens"),
            "{fixture:?}: {compacted}"
        );
    }
}
