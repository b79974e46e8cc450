//! Tenant isolation: summaries, breakers and credentials scoped to the caller, and no key in
//! any log line or metric.

use std::sync::Arc;

use crate::common::*;
use condenser::config::OnFailure;
use serde_json::{json, Value};

/// Summarizer calls carrying `value` in header `name`.
fn summarizer_calls_with(upstream: &MockUpstream, name: &str, value: &str) -> usize {
    upstream
        .summarizer_calls()
        .iter()
        .filter(|r| r.headers.get(name).is_some_and(|v| v == value))
        .count()
}

/// A conversation over every trigger in `api`, unlike any other `tag`'s from its first turn
/// on: its system prompt and its first ask name the tag (a summary's key is the prefix it
/// covers, which need not hold the system prompt).
fn long_conversation_in(api: Fixture, tag: &str) -> Value {
    let mut items = api.agent_conversation();
    let ask = api.head();
    let topic = format!("Topic: {tag}.");
    let tagged = api.plain_items(&[("user", topic.clone())]);
    assert_eq!(items[ask]["role"], "user", "{api:?}: {}", items[ask]);
    items[ask] = tagged.last().unwrap().clone();
    let mut body = api.agent_body(&items);
    api.set_system(&mut body, &format!("{SYSTEM_PROMPT} {topic}"));
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

/// `body` sent to `api` with `headers` alone, checked to have succeeded; what condenser said
/// of it.
async fn post_with(
    proxy: &Proxy,
    api: Fixture,
    headers: &[(&str, String)],
    body: &Value,
) -> Condensed {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (response, condensed) = post(proxy, &api.path(false), &headers, body).await;
    assert_eq!(response.status(), 200, "{api:?} with {headers:?}");
    condensed
}

/// `key` as a caller sends it in the header `name`: a bearer token in `authorization`, bare
/// in the others.
fn key_in(name: &str, key: &str) -> String {
    if name == "authorization" {
        format!("Bearer {key}")
    } else {
        key.to_string()
    }
}

/// Every header any dialect takes a key in, from the registry.
fn registry_key_headers() -> impl Iterator<Item = &'static str> {
    condenser::dialect::key_headers()
        .iter()
        .map(|name| name.as_str())
}

#[tokio::test]
async fn callers_by_any_key_header_each_get_their_own_summaries_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let body = long_conversation_in(api, "shared");
        // A caller of its own first: a provider's reported usage calibrates how condenser
        // counts its prompts (Gemini's), and every request after it is counted alike.
        post_in(&proxy, api, "sk-warm", &body).await;
        let mut calls = 1;
        // The header's name counts: `api-key: sk-a` is another caller than `x-api-key: sk-a`.
        for name in registry_key_headers() {
            let as_caller = |key: &str| [(name, key_in(name, key))];
            let first = post_with(&proxy, api, &as_caller("sk-a"), &body).await;
            assert_eq!(first.action, "summarized", "{api:?}: {name}");
            assert_eq!(first.cache, "miss", "{api:?}: {name}: sk-a");
            let other = post_with(&proxy, api, &as_caller("sk-b"), &body).await;
            assert_eq!(other.action, "summarized", "{api:?}: {name}");
            assert_eq!(other.cache, "miss", "{api:?}: {name}: sk-b");
            calls += 2;
            assert_eq!(upstream.summarizer_calls().len(), calls, "{api:?}: {name}");
            let again = post_with(&proxy, api, &as_caller("sk-a"), &body).await;
            assert_eq!(again.cache, "hit", "{api:?}: {name}: sk-a again");
            assert_eq!(upstream.summarizer_calls().len(), calls, "{api:?}: {name}");
            // Each caller's summary paid with its own key, in the header it came in.
            for key in ["sk-a", "sk-b"] {
                let paid = summarizer_calls_with(&upstream, name, &key_in(name, key));
                assert_eq!(paid, 1, "{api:?}: {name}: {key}");
            }
        }
        let (name, value) = key_header(api, "sk-warm");
        assert_eq!(summarizer_calls_with(&upstream, name, &value), 1, "{api:?}");
    }
}

#[tokio::test]
async fn a_configured_user_header_splits_users_behind_one_injected_key_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let body = long_conversation_in(api, "gateway");
        let (key_name, key) = key_header(api, "sk-gateway");
        let as_user = |user: &str| [(key_name, key.clone()), ("x-user-id", user.to_string())];

        // By default the one key is one caller: bob is served alice's summary.
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        post_in(&proxy, api, "sk-warm", &body).await;
        post_with(&proxy, api, &as_user("alice"), &body).await;
        let bob = post_with(&proxy, api, &as_user("bob"), &body).await;
        assert_eq!(bob.cache, "hit", "{api:?}");
        assert_eq!(upstream.summarizer_calls().len(), 2, "{api:?}");

        let mut config = Fixture::config(&upstream.url());
        config.cache.scope_headers = Some(vec![key_name.into(), "x-user-id".into()]);
        let proxy = Proxy::start(config).await;
        post_in(&proxy, api, "sk-warm", &body).await;
        let alice = post_with(&proxy, api, &as_user("alice"), &body).await;
        assert_eq!(alice.cache, "miss", "{api:?}");
        let bob = post_with(&proxy, api, &as_user("bob"), &body).await;
        assert_eq!(bob.action, "summarized", "{api:?}");
        assert_eq!(bob.cache, "miss", "{api:?}");
        assert_eq!(upstream.summarizer_calls().len(), 5, "{api:?}");
        let alice = post_with(&proxy, api, &as_user("alice"), &body).await;
        assert_eq!(alice.cache, "hit", "{api:?}");
        assert_eq!(upstream.summarizer_calls().len(), 5, "{api:?}");
    }
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
    std::env::set_var("CONDENSER_TENANTS_SUMMARIZER_KEY", "sk-summarizer-own");
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let (key_name, key) = key_header(api, "sk-caller");
        let mut caller = vec![
            (key_name, key.clone()),
            ("openai-organization", "org-caller".to_string()),
            ("openai-project", "proj-caller".to_string()),
            ("x-user-id", "alice".to_string()),
        ];
        post_with(&proxy, api, &caller, &long_conversation_in(api, "caller")).await;
        let calls = upstream.summarizer_calls();
        assert_eq!(calls.len(), 1, "{api:?}");
        let headers = &calls[0].headers;
        assert_eq!(headers[key_name], key.as_str(), "{api:?}");
        assert_eq!(headers["openai-organization"], "org-caller", "{api:?}");
        assert_eq!(headers["openai-project"], "proj-caller", "{api:?}");
        let absent = registry_key_headers().filter(|name| *name != key_name);
        for absent in absent.chain(["x-user-id"]) {
            assert!(
                !headers.contains_key(absent),
                "{api:?}: {absent} sent: {headers:?}"
            );
        }

        // With a key of its own, the summarizer pays with it alone, whatever the caller sent.
        let mut config = Fixture::config(&upstream.url());
        config.summarizer.api_key_env = "CONDENSER_TENANTS_SUMMARIZER_KEY".into();
        let proxy = Proxy::start(config).await;
        caller.extend(registry_key_headers().map(|name| (name, key_in(name, "sk-caller"))));
        post_with(&proxy, api, &caller, &long_conversation_in(api, "own key")).await;
        let calls = upstream.summarizer_calls();
        assert_eq!(calls.len(), 2, "{api:?}");
        let headers = &calls[1].headers;
        let own = ["Bearer sk-summarizer-own", "sk-summarizer-own"];
        assert!(
            headers.values().any(|v| own.iter().any(|own| v == own)),
            "{api:?}: no own key in {headers:?}"
        );
        for (name, value) in &caller {
            assert!(
                headers.values().all(|v| v != value.as_str()),
                "{api:?}: the caller's {name} sent: {headers:?}"
            );
        }
        // The caller's own request still goes with the caller's key.
        let recorded = upstream.recorded();
        let asked = recorded.iter().rfind(|r| !is_summarizer_call(r)).unwrap();
        assert_eq!(asked.headers[key_name], key.as_str(), "{api:?}");
    }
}

#[tokio::test]
async fn no_key_is_logged_at_any_level_nor_shown_in_metrics_in_every_dialect() {
    let logs = captured_logs();
    // One secret per header any dialect takes a key in.
    let secrets: Vec<(&str, String)> = registry_key_headers()
        .map(|name| (name, format!("sk-log-{name}-0001")))
        .collect();
    let caller = |project: &str| {
        let mut headers: Vec<(&str, String)> = secrets
            .iter()
            .map(|(name, secret)| (*name, key_in(name, secret)))
            .collect();
        headers.push(("openai-project", project.to_string()));
        headers
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
    let mut answers = String::new();
    let mut metrics = String::new();
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_error: Some(refuse.clone()),
                ..Default::default()
            })
            .await;
        let mut config = Fixture::config(&upstream.url());
        config.context.on_failure = OnFailure::Error;
        config.summarizer.breaker_failures = 1;
        let proxy = Proxy::start(config).await;

        let made = post_with(
            &proxy,
            api,
            &caller("proj-ok"),
            &long_conversation_in(api, "logged"),
        )
        .await;
        assert_eq!(made.action, "summarized", "{api:?}");
        let send = |project: &'static str, tag: &'static str| {
            let headers = caller(project);
            let body = long_conversation_in(api, tag);
            let proxy = &proxy;
            async move {
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                post(proxy, &api.path(false), &headers, &body).await.0
            }
        };
        let refused = send("proj-refused", "refused").await;
        let (status, _, message) = api.error(refused).await;
        assert_eq!(status, 502, "{api:?}: {message}");
        assert!(message.contains("[redacted]"), "{api:?}: {message}");
        answers.push_str(&message);
        let broken = send("proj-broken", "broken").await;
        assert_eq!(broken.status(), 502, "{api:?}");
        metrics.push_str(&proxy.metrics().await);
    }

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
    for (name, secret) in &secrets {
        assert!(
            !logs.contains(secret.as_str()),
            "{name}'s {secret} logged:\n{logs}"
        );
        assert!(
            !metrics.contains(secret.as_str()),
            "{name}'s {secret} in metrics"
        );
        assert!(
            !answers.contains(secret.as_str()),
            "{name}'s {secret} answered: {answers}"
        );
    }
}

/// A summarizer of its own (`summarizer.base_url`) is another party: it never gets a key a
/// caller sent for its upstream, in any header or in Gemini's `?key=`, whatever the dialect;
/// only its own `api_key_env` (issue 55, item 4).
#[tokio::test]
async fn a_dedicated_summarizer_never_gets_a_callers_key_only_its_own() {
    std::env::set_var("CONDENSER_TENANTS_DEDICATED_KEY", "sk-dedicated-own");
    let secret = "sk-caller-secret-55";
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let summarizer = mock_llm(LlmBehaviour::default()).await;
        for own_key in ["", "CONDENSER_TENANTS_DEDICATED_KEY"] {
            let mut config = Fixture::config(&upstream.url());
            config.summarizer.base_url = summarizer.url();
            config.summarizer.api = "chat".into();
            config.summarizer.model = "gpt-4o-mini".into();
            config.summarizer.api_key_env = own_key.into();
            let proxy = Proxy::start(config).await;
            let body = long_conversation_in(api, &format!("dedicated {own_key}"));
            // Every key header a dialect takes, and Gemini's key in the query.
            let mut request = client()
                .post(proxy.url(&format!("{}?key={secret}", api.path(false))))
                .json(&body);
            for name in registry_key_headers() {
                request = request.header(name, key_in(name, secret));
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{api:?}");
            let calls = summarizer.summarizer_calls();
            assert!(!calls.is_empty(), "{api:?}: no summary asked");
            for call in &calls {
                assert!(
                    !call.path_and_query.contains(secret),
                    "{api:?}: {}",
                    call.path_and_query
                );
                for (name, value) in &call.headers {
                    assert!(
                        !value.to_str().unwrap_or("").contains(secret),
                        "{api:?}: the caller's key in {name}"
                    );
                }
            }
            let last = &calls.last().unwrap().headers;
            match own_key {
                "" => assert!(
                    registry_key_headers().all(|name| !last.contains_key(name)),
                    "{api:?}: {last:?}"
                ),
                _ => assert_eq!(last["authorization"], "Bearer sk-dedicated-own", "{api:?}"),
            }
            // The caller's own request still reaches its upstream with its key.
            let asked = upstream.recorded();
            let asked = asked.iter().rfind(|r| !is_summarizer_call(r)).unwrap();
            assert!(
                asked
                    .headers
                    .values()
                    .any(|v| v.to_str().unwrap_or("").contains(secret))
                    || asked.path_and_query.contains(secret),
                "{api:?}"
            );
        }
    }
}
