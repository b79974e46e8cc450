//! The admin listener (`[admin] listen`): on a port of its own, `GET /sessions` draws the
//! recent sessions as `condenser replay --html` draws one, in auto and in observe mode, with
//! no key and no prompt text unless the operator turns that on. Through a real server on
//! port 0.

use std::time::Duration;

use crate::agent_sessions::{agent_session, with_window};
use crate::common::*;
use crate::replay::drawn;

const ROUNDS: usize = 40;
/// Small enough that the session is summarized within `ROUNDS`.
const WINDOW: u64 = 12_000;
const KEY: &str = "sk-admin-page-secret-4242";

/// A proxy with the admin listener on port 0, its page showing prompt text or not.
async fn proxy_with_admin(upstream: &MockUpstream, prompt_text: bool) -> Proxy {
    let mut config = with_window(upstream, WINDOW);
    config.admin.listen = "127.0.0.1:0".into();
    config.admin.prompt_text = prompt_text;
    Proxy::start(config).await
}

/// The agent session's rounds sent in `mode` with a caller's key; what condenser said of
/// each.
async fn session(proxy: &Proxy, mode: &str) -> Vec<Condensed> {
    let mut said = Vec::new();
    for round in 1..=ROUNDS {
        let body = chat_body(&agent_session(round));
        let bearer = format!("Bearer {KEY}");
        let headers = [
            ("x-condenser-mode", mode),
            ("authorization", bearer.as_str()),
        ];
        let (response, condensed) = post(proxy, "/v1/chat/completions", &headers, &body).await;
        assert_eq!(response.status(), 200);
        said.push(condensed);
    }
    said
}

/// The admin page once it draws `requests` requests (each is recorded off its path).
async fn page_of(proxy: &Proxy, requests: usize) -> String {
    let url = format!("http://{}/sessions", proxy.admin.unwrap());
    within("the admin page's requests", async {
        loop {
            let response = client().get(&url).send().await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(
                header(&response, "content-type"),
                "text/html; charset=utf-8"
            );
            assert_eq!(header(&response, "cache-control"), "no-store");
            let page = response.text().await.unwrap();
            if drawn(&page).points.len() >= requests {
                return page;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn the_admin_page_draws_the_sessions_served_without_keys_or_prompt_text() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = proxy_with_admin(&upstream, false).await;
    let said = session(&proxy, "auto").await;
    let page = page_of(&proxy, ROUNDS).await;
    let drawn = drawn(&page);
    assert_eq!(drawn.sessions, 1);
    assert_eq!(drawn.points, (1..=ROUNDS).collect::<Vec<_>>());
    // A request whose summary is not the one before's is marked a summary step, where the
    // proxy's own headers say it changed.
    let summarized: Vec<usize> = said
        .iter()
        .map(|c| c.summarized_messages.unwrap_or(0))
        .collect();
    let changed: Vec<usize> = (1..ROUNDS)
        .filter(|&i| summarized[i] != summarized[i - 1] && summarized[i] > 0)
        .map(|i| i + 1)
        .collect();
    assert!(!changed.is_empty(), "never summarized: {summarized:?}");
    let summary_steps: Vec<usize> = drawn
        .steps
        .iter()
        .filter(|(kind, _)| kind == "summary_step")
        .map(|(_, request)| *request)
        .collect();
    assert_eq!(summary_steps, changed);
    // No key, no prompt text: not the task, not a tool output.
    assert!(!page.contains(KEY) && !page.contains("sk-admin"));
    assert!(!page.contains("KX-7731-QZ") && !page.contains("log-3:"));
    assert!(
        page.contains("admin.prompt_text"),
        "says why the text is not shown"
    );
    // The proxy's port does not serve it; the admin port serves nothing else.
    let on_proxy = client().get(proxy.url("/sessions")).send().await.unwrap();
    assert_eq!(on_proxy.status(), 404);
    let admin = proxy.admin.unwrap();
    let other = client()
        .get(format!("http://{admin}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let posted = client()
        .post(format!("http://{admin}/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);
}

#[tokio::test]
async fn the_admin_page_shows_prompt_text_when_asked_and_observe_modes_sessions() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = proxy_with_admin(&upstream, true).await;
    let said = session(&proxy, "observe").await;
    assert!(said.iter().all(|c| c.action == "forwarded"));
    let page = page_of(&proxy, ROUNDS).await;
    let drawn = drawn(&page);
    assert_eq!(drawn.points, (1..=ROUNDS).collect::<Vec<_>>());
    // What auto would have done: summarized, with a step where it would have stepped.
    let would_summarize = said.iter().filter(|c| c.would == "summarized").count();
    assert!(would_summarize > 0);
    assert!(page.contains("data-action=\"summarized\""));
    assert!(drawn.steps.iter().any(|(kind, _)| kind == "summary_step"));
    // Prompt text, as the operator asked: the pinned task and the summary.
    assert!(page.contains("KX-7731-QZ"));
    assert!(page.contains("data-part=\"summary\""));
    assert!(!page.contains(KEY));
}

#[tokio::test]
async fn the_admin_listener_is_never_the_proxys_port() {
    let mut config = condenser::Config::default();
    config.server.listen = "127.0.0.1:0".into();
    config.admin.listen = "127.0.0.1:0".into();
    // Port 0 twice: two ports, each its own.
    let server = condenser::Server::bind(config).await.unwrap();
    let admin = server.admin_addr().unwrap();
    assert_ne!(admin.port(), server.local_addr().port());
    let port = free_port();
    let same = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\n"
    );
    let error = condenser::Config::from_toml(&same, "t")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("admin.listen") && error.contains("proxy's port"),
        "{error}"
    );
}
