//! Who is offered recall, and the room the plan keeps for it (issue 30): the request's own
//! profile decides, in the proxy and in `condenser plan`, in every dialect of the registry
//! (`Fixture::all()`); a chat request asking for several choices (`n` > 1) is neither
//! compacted nor offered it, on any path.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::common::*;
use condenser::cli::{plan, PlanOptions};
use condenser::compaction::plan::Mode;
use condenser::config::{Profile, RecallOverride};
use condenser::transport::body::full;
use condenser::Config;

/// The profile that turns recall the other way from the config's `[recall]`.
const FLIPPED: &str = "flipped";

/// Every fixture's model with an 8,000-token window, `[recall]` on or off as `enabled`, and
/// the profile `flipped` that turns it the other way.
fn flipping_config(upstream: &str, enabled: bool) -> Config {
    let mut config = Fixture::config(upstream);
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

/// A conversation of 8,030 tokens (in chat's count), past the 7,500 usable, so that the
/// request waits for its summary; in short turns (about 30 tokens each), so that the recall
/// reserve's 160 tokens are worth more than one kept exchange and whether it is kept shows in
/// the split. In `fixture`'s dialect, as its tests send it.
fn long_conversation(fixture: Fixture) -> Value {
    short_turns(fixture, 125)
}

fn long_chat() -> Value {
    long_conversation(Fixture::Chat)
}

/// `turns` exchanges of about 30 tokens a message, and a question, in `fixture`'s dialect.
fn short_turns(fixture: Fixture, turns: usize) -> Value {
    let mut said: Vec<(&str, String)> = Vec::new();
    for t in 0..turns {
        said.push(("user", format!("u{t}. {}", filler(t, 25))));
        said.push(("assistant", format!("a{t}. {}", filler(t + 1000, 25))));
    }
    said.push(("user", "Which port do we bind the service to?".into()));
    fixture.agent_body(&fixture.plain_items(&said))
}

/// The system prompt, `turns` exchanges of about 30 tokens a message, and a question.
fn chat_of_short_turns(turns: usize) -> Value {
    short_turns(Fixture::Chat, turns)
}

fn offers_recall(request: &Value) -> bool {
    request.to_string().contains("condenser_recall")
}

/// What the model got of `body`, sent in `fixture`'s dialect through condenser under
/// `flipping_config(enabled)`, naming `profile` when given.
async fn forwarded(fixture: Fixture, enabled: bool, profile: Option<&str>, body: &Value) -> Value {
    let upstream = fixture.upstream(LlmBehaviour::default()).await;
    let proxy = Proxy::start(flipping_config(&upstream.url(), enabled)).await;
    let headers: Vec<(&str, &str)> = profile
        .map(|profile| ("x-condenser-profile", profile))
        .into_iter()
        .collect();
    let (response, condensed) = fixture.post(&proxy, body, false, &headers).await;
    assert_eq!(response.status(), 200, "{fixture:?}");
    assert_eq!(condensed.action, "summarized", "{fixture:?}");
    let mut forwarded = upstream.forwarded();
    assert_eq!(forwarded.len(), 1, "{fixture:?}");
    forwarded.remove(0)
}

#[tokio::test]
async fn the_proxy_keeps_room_for_recall_only_when_the_requests_profile_offers_it() {
    for fixture in Fixture::all() {
        let body = long_conversation(fixture);
        let recalling = forwarded(fixture, true, None, &body).await;
        let plain = forwarded(fixture, false, None, &body).await;
        assert!(
            fixture.offers_recall(&recalling) && !fixture.offers_recall(&plain),
            "{fixture:?}"
        );
        assert_eq!(
            without_recall_tool(&recalling)["tools"],
            body["tools"],
            "{fixture:?}"
        );
        // The room kept for the tool and its line is room the kept turns do not get.
        let kept = |request: &Value| fixture.items(request).len();
        assert!(
            kept(&recalling) < kept(&plain),
            "{fixture:?}: {} items kept with recall, {} without",
            kept(&recalling),
            kept(&plain)
        );
        // A profile is planned as a config of its own settings is.
        assert_eq!(
            forwarded(fixture, true, Some(FLIPPED), &body).await,
            plain,
            "{fixture:?}"
        );
        assert_eq!(
            forwarded(fixture, false, Some(FLIPPED), &body).await,
            recalling,
            "{fixture:?}"
        );
    }
}

#[tokio::test]
async fn condenser_plan_keeps_room_for_recall_only_when_the_profile_offers_it() {
    for fixture in Fixture::all() {
        let body = long_conversation(fixture).to_string();
        let plan_of = |enabled: bool, profile: Option<&'static str>| {
            let body = body.clone();
            async move {
                let options = PlanOptions {
                    model: Some(fixture.model()),
                    api: Some(fixture.wire().api),
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
        assert_ne!(
            recalling, plain,
            "{fixture:?}: the reserve changes nothing here"
        );
        assert_eq!(plan_of(true, Some(FLIPPED)).await, plain, "{fixture:?}");
        assert_eq!(
            plan_of(false, Some(FLIPPED)).await,
            recalling,
            "{fixture:?}"
        );
    }
}

// The tests below stay on chat: several choices (`n` > 1) exist only in Chat Completions.

/// The model, answering a chat request with as many choices as it asks (`n`), plain or
/// streamed, or that its prompt is too long when it has more messages than `window`; and
/// the summarizer.
async fn choosing_model(window: Option<usize>) -> MockUpstream {
    MockUpstream::start(handler(move |r| async move {
        if is_summarizer_call(&r) {
            let request: Value = serde_json::from_slice(&r.body).unwrap();
            let summary = lossy_summary(&request);
            return json_response(200, &summary_reply("/v1/chat/completions", &summary));
        }
        let request = r.json();
        let n = request["n"].as_u64().unwrap_or(1);
        let messages = request["messages"].as_array().map_or(0, Vec::len);
        if window.is_some_and(|window| messages > window) {
            return json_response(400, &openai_too_long());
        }
        let text = |i: u64| format!("choice {i}");
        if request["stream"] != json!(true) {
            let choices: Vec<Value> = (0..n)
                .map(|i| json!({"index": i, "message": {"role": "assistant", "content": text(i)}, "finish_reason": "stop"}))
                .collect();
            let mut reply = completion("", 11, 4);
            reply["choices"] = json!(choices);
            return json_response(200, &reply);
        }
        let mut events = String::new();
        for i in 0..n {
            let chunk = json!({"object": "chat.completion.chunk", "choices": [{"index": i, "delta": {"role": "assistant", "content": text(i)}, "finish_reason": "stop"}]});
            events.push_str(&format!("data: {chunk}\n\n"));
        }
        events.push_str("data: [DONE]\n\n");
        hyper::Response::builder()
            .header("content-type", "text/event-stream")
            .body(full(Bytes::from(events)))
            .unwrap()
    }))
    .await
}

/// `body` asking for `n` choices, as bytes.
fn choosing(mut body: Value, n: u64) -> Bytes {
    body["n"] = json!(n);
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// `body`'s bytes posted to condenser's chat path, under `mode` when given.
async fn post_bytes(proxy: &Proxy, body: &Bytes, mode: Option<&str>) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.clone());
    if let Some(mode) = mode {
        request = request.header("x-condenser-mode", mode);
    }
    request.send().await.unwrap()
}

/// What the model was sent, past the first `from` requests, the summarizer's aside.
fn model_requests(upstream: &MockUpstream, from: usize) -> Vec<Bytes> {
    upstream
        .recorded()
        .into_iter()
        .filter(|r| !is_summarizer_call(r))
        .skip(from)
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn a_request_for_several_choices_goes_as_it_came_without_recall_and_gets_them_all() {
    let upstream = choosing_model(None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    // One choice: compacted, and offered recall.
    let one = choosing(long_chat(), 1);
    let response = post_bytes(&proxy, &one, None).await;
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let sent = model_requests(&upstream, 0);
    assert!(offers_recall(&serde_json::from_slice(&sent[0]).unwrap()));

    let two = choosing(long_chat(), 2);
    for mode in [None, Some("force")] {
        let before = model_requests(&upstream, 0).len();
        let response = post_bytes(&proxy, &two, mode).await;
        assert_eq!(response.status(), 200, "{mode:?}");
        assert_eq!(header(&response, "x-condenser-action"), "forwarded");
        let reply: Value = response.json().await.unwrap();
        let texts: Vec<&str> = reply["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|choice| choice["message"]["content"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["choice 0", "choice 1"], "{mode:?}");
        assert_eq!(
            model_requests(&upstream, before),
            std::slice::from_ref(&two),
            "{mode:?}"
        );
    }
}

#[tokio::test]
async fn a_streamed_request_for_several_choices_the_full_path_takes_is_not_compacted() {
    let upstream = choosing_model(None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    // A stream that leaves usage out: the raw first stage hands it to the full path, which
    // asks for usage on the client's behalf, and so rewrites `stream_options` alone.
    let mut body = long_chat();
    body["n"] = json!(2);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": false});
    let sent = Bytes::from(serde_json::to_vec(&body).unwrap());
    let response = post_bytes(&proxy, &sent, None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "forwarded");
    let streamed = stream_text(response).await;
    for i in 0..2 {
        assert!(streamed.contains(&format!("\"index\":{i}")), "{streamed}");
        assert!(streamed.contains(&format!("choice {i}")), "{streamed}");
    }
    let forwarded = model_requests(&upstream, 0);
    assert_eq!(forwarded.len(), 1);
    let forwarded: Value = serde_json::from_slice(&forwarded[0]).unwrap();
    assert!(!offers_recall(&forwarded));
    assert_eq!(forwarded["messages"], body["messages"]);
    assert_eq!(forwarded["n"], json!(2));
    assert!(upstream.summarizer_calls().is_empty());
}

/// A chat of 5,790 tokens in 182 messages: under the 6,000-token trigger, so it goes as sent
/// (its summary made ahead of need); over what the model takes (150 messages), so it comes
/// back too long, and the retry counts it afresh on the full path.
const UNDER_THE_TRIGGER: usize = 90;

/// `body` sent to a fresh condenser in front of a model that takes at most 150 messages:
/// the model, and condenser's answer.
async fn too_long_for_the_model(body: &Bytes) -> (MockUpstream, reqwest::Response) {
    let upstream = choosing_model(Some(150)).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let response = post_bytes(&proxy, body, None).await;
    (upstream, response)
}

#[tokio::test]
async fn a_too_long_answer_to_several_choices_is_relayed_not_retried_compacted() {
    let one = choosing(chat_of_short_turns(UNDER_THE_TRIGGER), 1);
    let (upstream, response) = too_long_for_the_model(&one).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert_eq!(
        model_requests(&upstream, 0).len(),
        2,
        "one choice: retried, compacted"
    );

    let two = choosing(chat_of_short_turns(UNDER_THE_TRIGGER), 2);
    let (upstream, response) = too_long_for_the_model(&two).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error, openai_too_long());
    assert_eq!(model_requests(&upstream, 0), [two]);
    assert!(upstream.summarizer_calls().is_empty());
}
