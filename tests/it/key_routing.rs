//! A key goes only to an upstream of its own API: each upstream says which APIs it speaks,
//! a pass-through path goes to its API's upstream (by its path, else by the caller's key),
//! and where none speaks it the answer is a 404 in that API's shape, sent nowhere.

use crate::common::*;
use condenser::config::{Config, RouteConfig};
use serde_json::{json, Value};

/// Three mock providers: the default upstream speaks OpenAI's APIs, a route Google's for
/// `gemini-*` and one Anthropic's for `claude-*`, each with its own configured key.
struct Providers {
    openai: MockUpstream,
    google: MockUpstream,
    anthropic: MockUpstream,
    proxy: Proxy,
}

async fn echo() -> MockUpstream {
    MockUpstream::start(handler(|r| async move {
        json_response(200, &json!({"path": r.path_and_query}))
    }))
    .await
}

fn route(models: &str, base_url: String, key_env: &str, api: &str) -> RouteConfig {
    RouteConfig {
        models: vec![models.into()],
        base_url,
        api_key_env: key_env.into(),
        apis: vec![api.into()],
    }
}

async fn providers() -> Providers {
    std::env::set_var("KEY_ROUTING_OPENAI_KEY", "sk-operator-openai");
    std::env::set_var("KEY_ROUTING_GOOGLE_KEY", "operator-google");
    std::env::set_var("KEY_ROUTING_ANTHROPIC_KEY", "operator-anthropic");
    let (openai, google, anthropic) = (echo().await, echo().await, echo().await);
    let mut config = config_for(&openai.url());
    config.upstream.api_key_env = "KEY_ROUTING_OPENAI_KEY".into();
    config.upstream.apis = vec!["chat".into(), "responses".into()];
    config.routes = vec![
        route("gemini-*", google.url(), "KEY_ROUTING_GOOGLE_KEY", "gemini"),
        route(
            "claude-*",
            anthropic.url(),
            "KEY_ROUTING_ANTHROPIC_KEY",
            "messages",
        ),
    ];
    let proxy = Proxy::start(config).await;
    Providers {
        openai,
        google,
        anthropic,
        proxy,
    }
}

/// Each request an upstream received: its path and the key headers it carried.
fn paths_and_keys(upstream: &MockUpstream) -> Vec<(String, Vec<(String, String)>)> {
    let recorded = upstream.recorded();
    recorded
        .iter()
        .map(|r| (r.path_and_query.clone(), keys(r)))
        .collect()
}

/// The key headers a recorded request carried, by name and value.
fn keys(seen: &Recorded) -> Vec<(String, String)> {
    ["authorization", "x-api-key", "x-goog-api-key"]
        .iter()
        .filter_map(|name| {
            let value = seen.headers.get(*name)?.to_str().ok()?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

#[tokio::test]
async fn each_path_goes_to_its_apis_upstream_with_the_callers_key_or_that_upstreams_own() {
    let p = providers().await;
    let get = |path: &str, header: Option<(&str, &str)>| {
        let mut request = client().get(p.proxy.url(path));
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    // The three: each reached the default (OpenAI) upstream.
    let sent = get("/v1beta/models", Some(("x-goog-api-key", "client-google")));
    assert_eq!(sent.await.unwrap().status(), 200);
    let sent = client()
        .post(p.proxy.url("/v1beta/cachedContents?key=client-query"))
        .body("{}")
        .send();
    assert_eq!(sent.await.unwrap().status(), 200);
    let sent = get(
        "/v1/messages/batches",
        Some(("x-api-key", "client-anthropic")),
    );
    assert_eq!(sent.await.unwrap().status(), 200);
    // A path all three providers share goes by the caller's key.
    let sent = get("/v1/models", Some(("x-api-key", "client-anthropic")));
    assert_eq!(sent.await.unwrap().status(), 200);
    let sent = get("/v1/models", Some(("x-goog-api-key", "client-google")));
    assert_eq!(sent.await.unwrap().status(), 200);
    let sent = get(
        "/v1/models",
        Some(("authorization", "Bearer client-openai")),
    );
    assert_eq!(sent.await.unwrap().status(), 200);
    // Keyless callers get the key of the upstream their API's path reached, in its style.
    for path in ["/v1beta/models", "/v1/messages/batches", "/v1/files"] {
        assert_eq!(get(path, None).await.unwrap().status(), 200, "{path}");
    }

    let google = paths_and_keys(&p.google);
    let pair = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
    assert_eq!(
        google,
        [
            (
                "/v1beta/models".to_string(),
                pair("x-goog-api-key", "client-google")
            ),
            (
                "/v1beta/cachedContents?key=client-query".to_string(),
                vec![]
            ),
            (
                "/v1/models".to_string(),
                pair("x-goog-api-key", "client-google")
            ),
            (
                "/v1beta/models".to_string(),
                pair("x-goog-api-key", "operator-google")
            ),
        ]
    );
    let anthropic = paths_and_keys(&p.anthropic);
    assert_eq!(
        anthropic,
        [
            (
                "/v1/messages/batches".to_string(),
                pair("x-api-key", "client-anthropic")
            ),
            (
                "/v1/models".to_string(),
                pair("x-api-key", "client-anthropic")
            ),
            (
                "/v1/messages/batches".to_string(),
                pair("x-api-key", "operator-anthropic")
            ),
        ]
    );
    let openai = paths_and_keys(&p.openai);
    assert_eq!(
        openai,
        [
            (
                "/v1/models".to_string(),
                pair("authorization", "Bearer client-openai")
            ),
            (
                "/v1/files".to_string(),
                pair("authorization", "Bearer sk-operator-openai")
            ),
        ]
    );
}

#[tokio::test]
async fn a_model_route_serves_only_its_own_api_and_other_apis_of_that_model_go_to_theirs() {
    let p = providers().await;
    // A chat request for a gemini model: the Gemini route does not speak chat.
    let response = post_chat(
        &p.proxy,
        &json!({"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(p.openai.recorded().len(), 1);
    // Gemini's own request for it goes to its route, and so does its countTokens under /v1/.
    for path in [
        "/v1beta/models/gemini-2.5-pro:generateContent",
        "/v1/models/gemini-2.5-pro:countTokens",
    ] {
        let response = client()
            .post(p.proxy.url(path))
            .body(json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let google = p.google.recorded();
    assert_eq!(google.len(), 2);
    assert!(google
        .iter()
        .all(|r| keys(r) == [("x-goog-api-key".to_string(), "operator-google".to_string())]));
}

/// Only the default upstream, speaking OpenAI's APIs: Gemini's and Anthropic's paths have no
/// upstream.
async fn openai_only() -> (MockUpstream, Proxy) {
    std::env::set_var("KEY_ROUTING_ONLY_KEY", "sk-operator-only");
    let openai = echo().await;
    let mut config: Config = config_for(&openai.url());
    config.upstream.api_key_env = "KEY_ROUTING_ONLY_KEY".into();
    config.upstream.apis = vec!["chat".into(), "responses".into()];
    let proxy = Proxy::start(config).await;
    (openai, proxy)
}

#[tokio::test]
async fn where_no_upstream_speaks_the_api_the_answer_is_404_in_its_shape_naming_the_config() {
    let (openai, proxy) = openai_only().await;
    let gemini_body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let claude_body = json!({"model": "claude-x", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    let cases = [
        ("GET", "/v1beta/models", None, "gemini"),
        ("POST", "/v1beta/cachedContents?key=k", None, "gemini"),
        (
            "POST",
            "/v1beta/models/gemini-2.5-pro:generateContent",
            Some(&gemini_body),
            "gemini",
        ),
        ("GET", "/v1/messages/batches", None, "messages"),
        ("POST", "/v1/messages", Some(&claude_body), "messages"),
        (
            "POST",
            "/v1/messages/count_tokens",
            Some(&claude_body),
            "messages",
        ),
    ];
    for (method, path, body, api) in cases {
        let mut request = client().request(method.parse().unwrap(), proxy.url(path));
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let error: Value = response.json().await.unwrap();
        let message = match api {
            "gemini" => {
                assert_eq!(error["error"]["status"], "NOT_FOUND", "{path}: {error}");
                &error["error"]["message"]
            }
            _ => {
                assert_eq!(error["type"], "error", "{path}: {error}");
                &error["error"]["message"]
            }
        };
        let message = message.as_str().unwrap();
        assert!(
            message.contains(&format!("\"{api}\"")) && message.contains("apis"),
            "{path}: {message}"
        );
    }
    // A caller's Anthropic key on a shared path is not sent to OpenAI's upstream either.
    let response = client()
        .get(proxy.url("/v1/models"))
        .header("x-api-key", "client-anthropic")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(openai.recorded().len(), 0);
}

#[tokio::test]
async fn an_openai_fine_tune_id_is_a_model_not_a_gemini_method() {
    std::env::set_var("KEY_ROUTING_FT_KEY", "sk-operator-ft");
    let (openai, tuned) = (echo().await, echo().await);
    let mut config = config_for(&openai.url());
    config.upstream.apis = vec!["chat".into()];
    config.routes = vec![route("ft:*", tuned.url(), "KEY_ROUTING_FT_KEY", "chat")];
    let proxy = Proxy::start(config).await;
    let path = "/v1/models/ft:gpt-4o-mini:org::id";
    let response = client().get(proxy.url(path)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = tuned.recorded();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path_and_query, path);
    assert_eq!(
        keys(&seen[0]),
        [(
            "authorization".to_string(),
            "Bearer sk-operator-ft".to_string()
        )]
    );
    assert!(openai.recorded().is_empty());

    // condenser's own errors on that path are OpenAI's shape.
    let mut config = config_for(&closed_url());
    config.upstream.apis = vec!["chat".into()];
    let proxy = Proxy::start(config).await;
    let response = client().get(proxy.url(path)).send().await.unwrap();
    assert_eq!(response.status(), 502);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "upstream_unreachable", "{error}");
    assert!(error["error"].get("status").is_none(), "{error}");
}

/// A provider's host is recognised however it is written: in capitals, or with the trailing
/// dot of a fully qualified name. `https://API.OPENAI.COM` speaks OpenAI's APIs only, so an
/// Anthropic or Gemini request (and its key) is not sent there but answered 404, before any
/// connection is tried (issue 55, item 7).
#[tokio::test]
async fn a_providers_host_in_capitals_or_with_a_trailing_dot_speaks_only_its_apis() {
    let gemini_body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let claude_body = json!({"model": "claude-x", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    for base_url in [
        "https://API.OPENAI.COM",
        "https://api.openai.com.",
        "https://Api.OpenAI.com./v1",
    ] {
        let mut config = config_for(base_url);
        // Were it tried, a connection would fail fast here (no network): a 502 or 504.
        config.upstream.timeout_secs = 2;
        let proxy = Proxy::start(config).await;
        for (path, body, api) in [
            ("/v1/messages", &claude_body, "messages"),
            (
                "/v1beta/models/gemini-2.5-pro:generateContent",
                &gemini_body,
                "gemini",
            ),
        ] {
            let response = client()
                .post(proxy.url(path))
                .header("x-api-key", "sk-ant-caller")
                .header("x-goog-api-key", "AIza-caller")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 404, "{base_url} {path}");
            let error: Value = response.json().await.unwrap();
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(&format!("\"{api}\"")),
                "{base_url} {path}: {error}"
            );
        }
    }
}
