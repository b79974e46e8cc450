//! Tenant isolation: summaries, breakers and credentials scoped to the caller, and no key in
//! any log line or metric.

use std::sync::Arc;

use crate::common::*;
use condenser::config::OnFailure;
use serde_json::{json, Value};

/// Sends `body` with `headers` and checks the request itself succeeded.
async fn post_as(proxy: &Proxy, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let (response, _) = post(proxy, "/v1/chat/completions", headers, body).await;
    assert_eq!(response.status(), 200, "as {headers:?}");
    response
}

/// Summarizer calls carrying `value` in header `name`.
fn summarizer_calls_with(upstream: &MockUpstream, name: &str, value: &str) -> usize {
    upstream
        .summarizer_calls()
        .iter()
        .filter(|r| r.headers.get(name).is_some_and(|v| v == value))
        .count()
}

/// A conversation over every trigger, unlike any other `tag`'s (its system prompt differs).
fn long_conversation(tag: &str) -> Value {
    let mut messages = conversation(40);
    messages[0] = json!({"role": "system", "content": format!("{SYSTEM_PROMPT} Topic: {tag}.")});
    chat_body(&messages)
}

#[tokio::test]
async fn callers_by_x_api_key_or_api_key_each_get_their_own_summaries() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let body = long_conversation("shared");
    let mut calls = 0;
    // `api-key: sk-a` is another caller than `x-api-key: sk-a`: the header's name counts.
    for name in ["x-api-key", "api-key"] {
        let first = post_as(&proxy, &body, &[(name, "sk-a")]).await;
        assert_eq!(header(&first, "x-condenser-action"), "summarized");
        assert_eq!(header(&first, "x-condenser-cache"), "miss", "{name}: sk-a");
        let other = post_as(&proxy, &body, &[(name, "sk-b")]).await;
        assert_eq!(header(&other, "x-condenser-action"), "summarized");
        assert_eq!(header(&other, "x-condenser-cache"), "miss", "{name}: sk-b");
        calls += 2;
        assert_eq!(upstream.summarizer_calls().len(), calls);
        let again = post_as(&proxy, &body, &[(name, "sk-a")]).await;
        assert_eq!(
            header(&again, "x-condenser-cache"),
            "hit",
            "{name}: sk-a again"
        );
        assert_eq!(upstream.summarizer_calls().len(), calls);
    }
    assert_eq!(summarizer_calls_with(&upstream, "x-api-key", "sk-a"), 1);
    assert_eq!(summarizer_calls_with(&upstream, "api-key", "sk-a"), 1);
}

/// A conversation over every trigger in `api`, unlike any other `tag`'s (its system prompt
/// differs).
fn long_conversation_in(api: Fixture, tag: &str) -> Value {
    let mut body = api.agent_body(&api.agent_conversation());
    api.set_system(&mut body, &format!("{SYSTEM_PROMPT} Topic: {tag}."));
    body
}

/// `body` sent to `api` as the caller of `key`, checked to have succeeded; what condenser
/// said of it.
async fn post_in(proxy: &Proxy, api: Fixture, key: &str, body: &Value) -> Condensed {
    let (response, condensed) = api.post_as(proxy, key, body, false, &[]).await;
    assert_eq!(response.status(), 200, "{api:?} as {key}");
    condensed
}

/// The header a caller of `api` sends its key `key` in: its name and value.
fn key_header(api: Fixture, key: &str) -> (&'static str, String) {
    api.key_headers(key).swap_remove(0)
}

#[tokio::test]
async fn callers_by_each_dialects_own_key_header_each_get_their_own_summaries() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let body = long_conversation_in(api, "shared");
        // A caller of its own first: a provider's reported usage calibrates how condenser
        // counts its prompts (Gemini's), and every request after it is counted alike.
        post_in(&proxy, api, "sk-warm", &body).await;
        let first = post_in(&proxy, api, "sk-a", &body).await;
        assert_eq!(first.action, "summarized", "{api:?}");
        assert_eq!(first.cache, "miss", "{api:?}: sk-a");
        let other = post_in(&proxy, api, "sk-b", &body).await;
        assert_eq!(other.action, "summarized", "{api:?}");
        assert_eq!(other.cache, "miss", "{api:?}: sk-b");
        assert_eq!(upstream.summarizer_calls().len(), 3, "{api:?}");
        let again = post_in(&proxy, api, "sk-a", &body).await;
        assert_eq!(again.cache, "hit", "{api:?}: sk-a again");
        assert_eq!(upstream.summarizer_calls().len(), 3, "{api:?}");
        // Each caller's summary paid with its own key, in its dialect's header.
        for key in ["sk-warm", "sk-a", "sk-b"] {
            let (name, value) = key_header(api, key);
            assert_eq!(
                summarizer_calls_with(&upstream, name, &value),
                1,
                "{api:?}: {key}"
            );
        }
    }
}

#[tokio::test]
async fn a_configured_user_header_splits_users_behind_one_injected_key() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let body = long_conversation("gateway");
    let as_user =
        |user: &'static str| [("authorization", "Bearer sk-gateway"), ("x-user-id", user)];

    // By default the one key is one caller: bob is served alice's summary.
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    post_as(&proxy, &body, &as_user("alice")).await;
    let bob = post_as(&proxy, &body, &as_user("bob")).await;
    assert_eq!(header(&bob, "x-condenser-cache"), "hit");
    assert_eq!(upstream.summarizer_calls().len(), 1);

    let mut config = small_window_config(&upstream.url());
    config.cache.scope_headers = Some(vec!["authorization".into(), "x-user-id".into()]);
    let proxy = Proxy::start(config).await;
    let alice = post_as(&proxy, &body, &as_user("alice")).await;
    assert_eq!(header(&alice, "x-condenser-cache"), "miss");
    let bob = post_as(&proxy, &body, &as_user("bob")).await;
    assert_eq!(header(&bob, "x-condenser-action"), "summarized");
    assert_eq!(header(&bob, "x-condenser-cache"), "miss");
    assert_eq!(upstream.summarizer_calls().len(), 3);
    let alice = post_as(&proxy, &body, &as_user("alice")).await;
    assert_eq!(header(&alice, "x-condenser-cache"), "hit");
    assert_eq!(upstream.summarizer_calls().len(), 3);
}

#[tokio::test]
async fn replicas_sharing_redis_keep_callers_apart() {
    for api in Fixture::all() {
        let redis = Redis::start().await;
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let replica = || {
            let mut config = Fixture::config(&upstream.url());
            config.cache.redis_url = redis.url();
            config.cache.redis_key_prefix = "tenants:".into();
            Proxy::start(config)
        };
        let (a, b) = (replica().await, replica().await);
        let body = long_conversation_in(api, "replicas");
        // A caller of its own on each replica first, so that both count the prompt alike
        // (Gemini's counts are calibrated by the usage upstream reports).
        let warm = post_in(&a, api, "sk-warm", &body).await;
        assert_eq!(warm.cache, "miss", "{api:?}");
        let warm = post_in(&b, api, "sk-warm", &body).await;
        assert_eq!(warm.cache, "hit", "{api:?}");
        let first = post_in(&a, api, "sk-one", &body).await;
        assert_eq!(first.cache, "miss", "{api:?}");
        // Another caller on the other replica does not get the first one's summary from
        // Redis...
        let other = post_in(&b, api, "sk-two", &body).await;
        assert_eq!(other.action, "summarized", "{api:?}");
        assert_eq!(other.cache, "miss", "{api:?}");
        assert_eq!(upstream.summarizer_calls().len(), 3, "{api:?}");
        // ...while the same caller does, on either replica.
        let same = post_in(&b, api, "sk-one", &body).await;
        assert_eq!(same.cache, "hit", "{api:?}");
        let same = post_in(&a, api, "sk-two", &body).await;
        assert_eq!(same.cache, "hit", "{api:?}");
        assert_eq!(upstream.summarizer_calls().len(), 3, "{api:?}");
    }
}

#[tokio::test]
async fn one_callers_rate_limit_never_turns_summaries_off_for_another() {
    for api in Fixture::all() {
        // The summarizer rate-limits one key and is broken for another, in whichever header
        // the dialect sends it.
        let refuse: SummarizerError = Arc::new(|r: &Recorded| {
            let key = r.headers.values().find_map(|v| {
                let v = v.to_str().ok()?;
                ["sk-limited", "sk-broken"]
                    .into_iter()
                    .find(|key| v.ends_with(key))
            })?;
            let status = if key == "sk-limited" { 429 } else { 503 };
            Some((status, json!({"error": {"message": "not now"}})))
        });
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_error: Some(refuse),
                ..Default::default()
            })
            .await;
        let mut config = Fixture::config(&upstream.url());
        config.summarizer.breaker_failures = 2;
        config.summarizer.breaker_cooldown_secs = 600;
        let proxy = Proxy::start(config).await;
        let calls_of = |key: &str| {
            let (name, value) = key_header(api, key);
            summarizer_calls_with(&upstream, name, &value)
        };

        for turn in 0..10 {
            let body = long_conversation_in(api, &format!("limited {turn}"));
            let response = post_in(&proxy, api, "sk-limited", &body).await;
            assert_eq!(response.action, "trimmed", "{api:?}");
        }
        assert_eq!(
            calls_of("sk-limited"),
            10,
            "{api:?}: a 429 is no fault of the upstream: every request still tried"
        );
        let body = long_conversation_in(api, "healthy 0");
        let response = post_in(&proxy, api, "sk-healthy", &body).await;
        assert_eq!(response.action, "summarized", "{api:?}");

        // A 5xx run still opens the breaker, for that caller.
        for turn in 0..4 {
            let body = long_conversation_in(api, &format!("broken {turn}"));
            let response = post_in(&proxy, api, "sk-broken", &body).await;
            assert_eq!(response.action, "trimmed", "{api:?}");
        }
        assert_eq!(
            calls_of("sk-broken"),
            2,
            "{api:?}: no calls for this caller once its breaker is open"
        );
        let body = long_conversation_in(api, "healthy 1");
        let response = post_in(&proxy, api, "sk-healthy", &body).await;
        assert_eq!(response.action, "summarized", "{api:?}");
        let body = long_conversation_in(api, "limited again");
        post_in(&proxy, api, "sk-limited", &body).await;
        assert_eq!(calls_of("sk-limited"), 11, "{api:?}");
    }
}

#[tokio::test]
async fn the_summarizer_call_carries_the_callers_credentials_or_only_its_own_key() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let anthropic_style = [
        ("x-api-key", "sk-ant-caller"),
        ("openai-organization", "org-caller"),
        ("openai-project", "proj-caller"),
        ("x-user-id", "alice"),
    ];
    post_as(&proxy, &long_conversation("anthropic"), &anthropic_style).await;
    let azure_style = [("api-key", "azure-caller")];
    post_as(&proxy, &long_conversation("azure"), &azure_style).await;
    let calls = upstream.summarizer_calls();
    assert_eq!(calls.len(), 2);
    let headers = &calls[0].headers;
    assert_eq!(headers["x-api-key"], "sk-ant-caller");
    assert_eq!(headers["openai-organization"], "org-caller");
    assert_eq!(headers["openai-project"], "proj-caller");
    for absent in ["authorization", "api-key", "x-user-id"] {
        assert!(!headers.contains_key(absent), "{absent} sent: {headers:?}");
    }
    assert_eq!(calls[1].headers["api-key"], "azure-caller");
    assert!(!calls[1].headers.contains_key("x-api-key"));

    std::env::set_var("CONDENSER_TENANTS_SUMMARIZER_KEY", "sk-summarizer-own");
    let mut config = small_window_config(&upstream.url());
    config.summarizer.api_key_env = "CONDENSER_TENANTS_SUMMARIZER_KEY".into();
    let proxy = Proxy::start(config).await;
    let caller = [
        ("authorization", "Bearer sk-caller"),
        ("x-api-key", "sk-ant-caller"),
        ("api-key", "azure-caller"),
        ("openai-project", "proj-caller"),
    ];
    post_as(&proxy, &long_conversation("own key"), &caller).await;
    let calls = upstream.summarizer_calls();
    assert_eq!(calls.len(), 3);
    let headers = &calls[2].headers;
    assert_eq!(headers["authorization"], "Bearer sk-summarizer-own");
    for absent in [
        "x-api-key",
        "api-key",
        "openai-project",
        "openai-organization",
    ] {
        assert!(!headers.contains_key(absent), "{absent} sent: {headers:?}");
    }
}

#[tokio::test]
async fn no_key_is_logged_at_any_level_nor_shown_in_metrics() {
    let logs = captured_logs();
    const SECRETS: [&str; 3] = [
        "sk-log-authorization-0001",
        "sk-ant-log-x-api-key-0002",
        "azure-log-api-key-0003",
    ];
    let caller = |project: &'static str| {
        [
            ("authorization", "Bearer sk-log-authorization-0001"),
            ("x-api-key", "sk-ant-log-x-api-key-0002"),
            ("api-key", "azure-log-api-key-0003"),
            ("openai-project", project),
        ]
    };
    // The summarizer refuses one project echoing every credential it got, as some gateways
    // do, and is broken for another.
    let refuse: SummarizerError =
        Arc::new(
            |r: &Recorded| match r.headers.get("openai-project")?.to_str().ok()? {
                "proj-refused" => {
                    let echoed: Vec<_> = r.headers.values().map(|v| v.to_str().unwrap()).collect();
                    Some((
                        401,
                        json!({"error": {"message": format!("refused: {echoed:?}")}}),
                    ))
                }
                "proj-broken" => Some((500, json!({"error": {"message": "down"}}))),
                _ => None,
            },
        );
    let upstream = mock_llm(LlmBehaviour {
        summarizer_error: Some(refuse),
        ..Default::default()
    })
    .await;
    let mut config = small_window_config(&upstream.url());
    config.context.on_failure = OnFailure::Error;
    config.summarizer.breaker_failures = 1;
    let proxy = Proxy::start(config).await;

    let made = post_as(&proxy, &long_conversation("logged"), &caller("proj-ok")).await;
    assert_eq!(header(&made, "x-condenser-action"), "summarized");
    let mut refused = client()
        .post(proxy.url("/v1/chat/completions"))
        .json(&long_conversation("refused"));
    for (name, value) in caller("proj-refused") {
        refused = refused.header(name, value);
    }
    let refused = refused.send().await.unwrap();
    assert_eq!(refused.status(), 502);
    let answer = refused.text().await.unwrap();
    assert!(answer.contains("[redacted]"), "{answer}");
    let mut broken = client()
        .post(proxy.url("/v1/chat/completions"))
        .json(&long_conversation("broken"));
    for (name, value) in caller("proj-broken") {
        broken = broken.header(name, value);
    }
    assert_eq!(broken.send().await.unwrap().status(), 502);
    let metrics = proxy.metrics().await;

    let logs = logs.text();
    // The lines that could have carried a key were written, and at the levels below info too.
    for line in [
        "summary made",
        "summarizer failed",
        "[redacted]",
        "summarizer circuit open",
        "caller=",
        "DEBUG",
    ] {
        assert!(logs.contains(line), "{line:?} not logged:\n{logs}");
    }
    for secret in SECRETS {
        assert!(!logs.contains(secret), "{secret} logged:\n{logs}");
        assert!(!metrics.contains(secret), "{secret} in metrics");
        assert!(!answer.contains(secret), "{secret} answered: {answer}");
    }
}
