//! When upstream still finds a prompt too long (an estimated tokenizer, a window configured
//! too large), condenser compacts it as under `force` and retries once, before any byte has
//! reached the client; and counts that model's prompts higher from then on. Every test runs
//! over every dialect of the registry (`Fixture::all()`), its upstream wording "too long" as
//! its provider does (`Fixture::too_long`).

use crate::common::*;
use serde_json::Value;

/// 27 turns (55 chat messages, 5,868 tokens; 54 items in the other dialects): under the
/// precompute line of the window condenser is told (`window_configured_too_large`), so
/// condenser forwards it as sent, and over what the mock model takes (50 items).
const TURNS: usize = 27;

/// The conversation of `turns` user and assistant turns, as `fixture`'s client sends it.
fn body_of(fixture: Fixture, turns: usize) -> Value {
    fixture.agent_body(&fixture.plain_conversation(turns))
}

/// An upstream of `fixture` whose model takes at most `limit` items, answering `error` to
/// more; its usage counts prompts in o200k tokens, as condenser counts gpt-4o's (Gemini's mock
/// would otherwise report a third of the bytes, and the ratio learned from it put the 27 turns
/// over the trigger: 11,792 tokens).
async fn upstream_with_smaller_window(
    fixture: Fixture,
    error: Value,
    limit: usize,
) -> MockUpstream {
    upstream_of(fixture, Some((limit, error))).await
}

async fn upstream_of(fixture: Fixture, too_long: Option<(usize, Value)>) -> MockUpstream {
    fixture
        .upstream(LlmBehaviour {
            too_long,
            prompt_cache: Some(PromptCache::default()),
            ..LlmBehaviour::default()
        })
        .await
}

/// A window condenser is told is about twice what the model takes: the 27 turns (5,868 tokens
/// in chat's count, more in the estimates of Anthropic's and Gemini's) are planned as nothing
/// to prepare (under 0.6 of what the window leaves), and only upstream's answer says
/// otherwise.
fn window_configured_too_large(fixture: Fixture, upstream: &MockUpstream) -> condenser::Config {
    let mut config = Fixture::config(&upstream.url());
    config
        .models
        .get_mut(fixture.model())
        .unwrap()
        .context_window = Some(12_000);
    config
}

/// The retries condenser counted for `fixture`'s model.
async fn retries(fixture: Fixture, proxy: &Proxy) -> Option<f64> {
    let series = format!(
        r#"condenser_reactive_retries_total{{model="{}"}}"#,
        fixture.model()
    );
    metric(&proxy.metrics().await, &series)
}

#[tokio::test]
async fn a_prompt_upstream_finds_too_long_is_retried_once_compacted() {
    for fixture in Fixture::all() {
        let error = fixture.too_long();
        let upstream = upstream_with_smaller_window(fixture, error.clone(), 50).await;
        let proxy = fixture
            .warmed(window_configured_too_large(fixture, &upstream))
            .await;
        let seen = upstream.forwarded().len();
        let body = body_of(fixture, TURNS);
        let (response, condensed) = fixture.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{fixture:?}: {error} {condensed:?}");
        assert_eq!(
            condensed.retry, "context_length_exceeded",
            "{fixture:?}: {condensed:?}"
        );
        assert_eq!(condensed.action, "summarized", "{fixture:?}");
        let sent = upstream.forwarded()[seen..].to_vec();
        assert_eq!(
            sent.len(),
            2,
            "{fixture:?}: sent as received, then once compacted"
        );
        assert_eq!(sent[0], body, "{fixture:?}: first as received");
        assert!(fixture.items(&body).len() > 50, "{fixture:?}");
        let retried = fixture.items(&sent[1]).len();
        assert!(retried <= 50, "{fixture:?}: {retried} items retried");
        let (text, _) = fixture.client_text(response, false).await;
        assert!(text.starts_with("reply to "), "{fixture:?}: {text}");
        fixture.assert_compacted_shape(&body, &without_recall_tool(&sent[1]), 1);
        assert_eq!(
            upstream.summarizer_calls().len(),
            1,
            "{fixture:?}: one summarization"
        );
        assert_eq!(retries(fixture, &proxy).await, Some(1.0), "{fixture:?}");
    }
}

#[tokio::test]
async fn a_stream_is_retried_before_its_first_byte() {
    for fixture in Fixture::all() {
        let upstream = upstream_with_smaller_window(fixture, fixture.too_long(), 50).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let body = fixture.with_stream(body_of(fixture, TURNS), true);
        let (response, condensed) = fixture.post(&proxy, &body, true, &[]).await;
        assert_eq!(response.status(), 200, "{fixture:?}");
        assert_eq!(condensed.retry, "context_length_exceeded", "{fixture:?}");
        assert!(
            header(&response, "content-type").starts_with("text/event-stream"),
            "{fixture:?}"
        );
        let (text, raw) = fixture.client_text(response, true).await;
        assert!(text.starts_with("reply to "), "{fixture:?}: {raw}");
        fixture.assert_stream_ended(&raw);
        let sent = upstream.forwarded();
        assert_eq!(sent.len(), 2, "{fixture:?}");
        assert!(
            upstream
                .recorded()
                .iter()
                .filter(|r| !is_summarizer_call(r))
                .all(|r| fixture.streams(r)),
            "{fixture:?}: both sent as a stream"
        );
    }
}

#[tokio::test]
async fn a_second_failure_is_passed_on() {
    for fixture in Fixture::all() {
        // Nothing compacted fits a model that takes three items.
        let upstream = upstream_with_smaller_window(fixture, fixture.too_long(), 3).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let (response, condensed) = fixture
            .post(&proxy, &body_of(fixture, TURNS), false, &[])
            .await;
        assert_eq!(response.status(), 400, "{fixture:?}");
        assert_eq!(condensed.retry, "context_length_exceeded", "{fixture:?}");
        let reply: Value = response.json().await.unwrap();
        assert_eq!(
            reply,
            fixture.too_long(),
            "{fixture:?}: upstream's own error"
        );
        assert_eq!(
            upstream.forwarded().len(),
            2,
            "{fixture:?}: one retry, no more"
        );
    }
}

/// `response` is upstream's refusal `expected`, relayed as it came: a 400, not retried, and
/// the request sent upstream once.
async fn assert_relayed_untried(
    fixture: Fixture,
    response: reqwest::Response,
    condensed: &Condensed,
    expected: &Value,
    upstream: &MockUpstream,
) {
    assert_eq!(response.status(), 400, "{fixture:?}");
    assert!(
        response.headers().get("x-condenser-retry").is_none(),
        "{fixture:?}: {}",
        condensed.retry
    );
    let reply: Value = response.json().await.unwrap();
    assert_eq!(&reply, expected, "{fixture:?}");
    assert_eq!(upstream.forwarded().len(), 1, "{fixture:?}");
}

#[tokio::test]
async fn a_request_sent_with_compaction_off_is_not_retried() {
    for fixture in Fixture::all() {
        let upstream = upstream_with_smaller_window(fixture, fixture.too_long(), 50).await;
        let proxy = Proxy::start(window_configured_too_large(fixture, &upstream)).await;
        let (response, condensed) = fixture
            .post(
                &proxy,
                &body_of(fixture, TURNS),
                false,
                &[("x-condenser-mode", "off")],
            )
            .await;
        assert_relayed_untried(
            fixture,
            response,
            &condensed,
            &fixture.too_long(),
            &upstream,
        )
        .await;
    }
}

#[tokio::test]
async fn a_prompt_far_inside_a_window_counted_exactly_is_not_retried() {
    for fixture in Fixture::all() {
        // Five turns, about 1,100 tokens of an 8,000-token window, in the model's own
        // encoding (o200k, told for the models whose tokenizer condenser does not know): an
        // upstream that finds them too long disagrees about more than counting.
        let upstream = upstream_with_smaller_window(fixture, fixture.too_long(), 3).await;
        let mut config = Fixture::config(&upstream.url());
        let model = config.models.get_mut(fixture.model()).unwrap();
        model.encoding.get_or_insert_with(|| "o200k_base".into());
        let proxy = Proxy::start(config).await;
        let (response, condensed) = fixture.post(&proxy, &body_of(fixture, 5), false, &[]).await;
        assert_relayed_untried(
            fixture,
            response,
            &condensed,
            &fixture.too_long(),
            &upstream,
        )
        .await;
    }
}

#[tokio::test]
async fn an_error_that_is_not_about_length_is_passed_on_untried() {
    for fixture in Fixture::all() {
        let other = fixture.not_about_length();
        let upstream = upstream_with_smaller_window(fixture, other.clone(), 50).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let (response, condensed) = fixture
            .post(&proxy, &body_of(fixture, TURNS), false, &[])
            .await;
        assert_relayed_untried(fixture, response, &condensed, &other, &upstream).await;
    }
}

#[tokio::test]
async fn after_a_retry_the_next_request_is_compacted_ahead_of_time() {
    for fixture in Fixture::all() {
        let upstream = upstream_with_smaller_window(fixture, fixture.too_long(), 50).await;
        let proxy = fixture
            .warmed(window_configured_too_large(fixture, &upstream))
            .await;
        let next_turn = body_of(fixture, TURNS + 1);
        // Counted by a condenser that has not been told the window is smaller.
        let plain = upstream_of(fixture, None).await;
        let untold = fixture
            .warmed(window_configured_too_large(fixture, &plain))
            .await;
        let before = fixture
            .post(&untold, &next_turn, false, &[])
            .await
            .1
            .prompt_tokens
            .unwrap();
        let first = fixture
            .post(&proxy, &body_of(fixture, TURNS), false, &[])
            .await
            .1;
        assert_eq!(first.retry, "context_length_exceeded", "{fixture:?}");
        let sent = upstream.forwarded().len();
        // The conversation one turn on: now counted higher, over the trigger, and compacted
        // before it is sent.
        let (next, condensed) = fixture.post(&proxy, &next_turn, false, &[]).await;
        assert_eq!(next.status(), 200, "{fixture:?}");
        assert!(
            next.headers().get("x-condenser-retry").is_none(),
            "{fixture:?}"
        );
        assert_eq!(condensed.action, "summarized", "{fixture:?}");
        let counted = condensed.prompt_tokens.unwrap();
        assert!(
            counted > before * 11 / 10,
            "{fixture:?}: {before} then {counted}"
        );
        assert_eq!(
            upstream.forwarded().len(),
            sent + 1,
            "{fixture:?}: the next request went once"
        );
        assert_eq!(retries(fixture, &proxy).await, Some(1.0), "{fixture:?}");
    }
}
