//! Who is offered recall, and the room the plan keeps for it (issue 30): the request's own
//! profile decides, in the proxy and in `condenser plan`.

use serde_json::{json, Value};

use crate::common::*;
use condenser::cli::{plan, PlanOptions};
use condenser::compaction::plan::Mode;
use condenser::config::{Profile, RecallOverride};
use condenser::Config;

/// The profile that turns recall the other way from the config's `[recall]`.
const FLIPPED: &str = "flipped";

/// gpt-4o with an 8,000-token window, `[recall]` on or off as `enabled`, and the profile
/// `flipped` that turns it the other way.
fn flipping_config(upstream: &str, enabled: bool) -> Config {
    let mut config = small_window_config(upstream);
    config.recall.enabled = enabled;
    let flipped = Profile {
        recall: Some(RecallOverride {
            enabled: Some(!enabled),
            ..RecallOverride::default()
        }),
        ..Profile::default()
    };
    config.profiles.insert(FLIPPED.into(), flipped);
    config
}

/// A chat of 8,030 tokens, past the 7,500 usable, so that the request waits for its summary;
/// in short turns (about 30 tokens each), so that the recall reserve's 160 tokens are worth
/// more than one kept exchange and whether it is kept shows in the split.
fn long_chat() -> Value {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM_PROMPT})];
    for t in 0..125 {
        messages.push(json!({"role": "user", "content": format!("u{t}. {}", filler(t, 25))}));
        messages.push(
            json!({"role": "assistant", "content": format!("a{t}. {}", filler(t + 1000, 25))}),
        );
    }
    messages.push(json!({"role": "user", "content": "Which port do we bind the service to?"}));
    chat_body(&messages)
}

fn offers_recall(request: &Value) -> bool {
    request.to_string().contains("condenser_recall")
}

fn message_count(request: &Value) -> usize {
    request["messages"].as_array().unwrap().len()
}

/// What the model got of `body`, sent through condenser under `flipping_config(enabled)`,
/// naming `profile` when given.
async fn forwarded(enabled: bool, profile: Option<&str>, body: &Value) -> Value {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(flipping_config(&upstream.url(), enabled)).await;
    let mut request = client().post(proxy.url("/v1/chat/completions")).json(body);
    if let Some(profile) = profile {
        request = request.header("x-condenser-profile", profile);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let mut forwarded = upstream.forwarded();
    assert_eq!(forwarded.len(), 1);
    forwarded.remove(0)
}

#[tokio::test]
async fn the_proxy_keeps_room_for_recall_only_when_the_requests_profile_offers_it() {
    let body = long_chat();
    let recalling = forwarded(true, None, &body).await;
    let plain = forwarded(false, None, &body).await;
    assert!(offers_recall(&recalling) && !offers_recall(&plain));
    // The room kept for the tool and its line is room the kept turns do not get.
    assert!(
        message_count(&recalling) < message_count(&plain),
        "{} messages kept with recall, {} without",
        message_count(&recalling),
        message_count(&plain)
    );
    // A profile is planned as a config of its own settings is.
    assert_eq!(forwarded(true, Some(FLIPPED), &body).await, plain);
    assert_eq!(forwarded(false, Some(FLIPPED), &body).await, recalling);
}

#[tokio::test]
async fn condenser_plan_keeps_room_for_recall_only_when_the_profile_offers_it() {
    let body = long_chat().to_string();
    let plan_of = |enabled: bool, profile: Option<&'static str>| {
        let body = body.clone();
        async move {
            let options = PlanOptions {
                model: None,
                api: None,
                mode: Mode::Auto,
                profile,
            };
            plan(
                &flipping_config("http://127.0.0.1:9", enabled),
                &body,
                options,
            )
            .await
            .unwrap()
        }
    };
    let recalling = plan_of(true, None).await;
    let plain = plan_of(false, None).await;
    assert_ne!(recalling, plain, "the reserve changes nothing here");
    assert_eq!(plan_of(true, Some(FLIPPED)).await, plain);
    assert_eq!(plan_of(false, Some(FLIPPED)).await, recalling);
}
