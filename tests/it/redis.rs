//! Replicas sharing summaries through a real `redis-server` (Debian package), started on a
//! free port.

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

fn shared_config(upstream: &str, redis: &Redis) -> condenser::Config {
    let mut config = small_window_config(upstream);
    config.cache.redis_url = redis.url();
    config.cache.redis_key_prefix = "test:".into();
    config
}

/// `body` sent as the team's caller, checked to have succeeded.
async fn post(proxy: &Proxy, body: &Value) -> reqwest::Response {
    let (response, _) = Fixture::Chat
        .post_as(proxy, "sk-team", body, false, &[])
        .await;
    assert_eq!(response.status(), 200);
    response
}

#[tokio::test]
async fn a_summary_made_by_one_replica_is_a_hit_on_the_other() {
    let redis = Redis::start().await;
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let a = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    let b = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    let body = chat_body(&conversation(40));
    let response = post(&a, &body).await;
    assert_eq!(header(&response, "x-condenser-cache"), "miss");
    let response = post(&b, &body).await;
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert_eq!(header(&response, "x-condenser-cache"), "hit");
    assert_eq!(upstream.summarizer_calls().len(), 1);
    // Both forwarded the same summary.
    let sent = upstream.forwarded();
    assert_eq!(sent[0]["messages"][1], sent[1]["messages"][1]);
}

#[tokio::test]
async fn concurrent_requests_over_both_replicas_make_one_summarizer_call() {
    let redis = Redis::start().await;
    let upstream = mock_llm(LlmBehaviour {
        summarizer_latency: Duration::from_millis(600),
        ..Default::default()
    })
    .await;
    // Other tests share this process and its cores: a Redis reply slower than the default
    // 250 ms would count as a fault, and that replica would summarize on its own.
    let mut config = shared_config(&upstream.url(), &redis);
    config.cache.redis_timeout_ms = 5_000;
    let a = Proxy::start(config.clone()).await;
    let b = Proxy::start(config).await;
    let body = chat_body(&conversation(40));
    let requests = (0..16).map(|i| {
        let proxy = if i % 2 == 0 { &a } else { &b };
        let body = &body;
        async move { header(&post(proxy, body).await, "x-condenser-action") }
    });
    let actions = futures_util::future::join_all(requests).await;
    assert!(actions.iter().all(|a| a == "summarized"), "{actions:?}");
    assert_eq!(upstream.summarizer_calls().len(), 1);
}

#[tokio::test]
async fn redis_faults_never_fail_a_request_and_it_is_used_again_once_back() {
    let mut redis = Redis::start().await;
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let a = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    let b = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    post(&a, &chat_body(&conversation(40))).await;

    redis.stop().await;
    for turns in [41, 43] {
        let response = post(&a, &chat_body(&conversation(turns))).await;
        assert_eq!(header(&response, "x-condenser-action"), "summarized");
    }
    let response = post(&b, &chat_body(&conversation(45))).await;
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let errors = metric(&a.metrics().await, "condenser_cache_errors_total").unwrap()
        + metric(&b.metrics().await, "condenser_cache_errors_total").unwrap();
    assert!(errors >= 1.0, "faults are counted: {errors}");

    redis.restart().await;
    // Reconnection is lazy and backs off for a second; keep serving until Redis is used again.
    let body = chat_body(&conversation(50));
    let mut shared = false;
    for attempt in 0..40 {
        let body = if attempt == 0 {
            body.clone()
        } else {
            chat_body(&conversation(50 + attempt))
        };
        let response = post(&a, &body).await;
        assert_eq!(response.status(), 200);
        let response = post(&b, &body).await;
        if header(&response, "x-condenser-cache") == "hit" {
            shared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        shared,
        "after Redis came back, B reuses A's summaries again"
    );
}

#[tokio::test]
async fn a_restarted_condenser_finds_its_summaries_in_redis() {
    let redis = Redis::start().await;
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let body = chat_body(&conversation(40));
    let mut first = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    assert_eq!(
        header(&post(&first, &body).await, "x-condenser-cache"),
        "miss"
    );
    first.shutdown();
    within("first instance stops", &mut first.served)
        .await
        .unwrap();

    let second = Proxy::start(shared_config(&upstream.url(), &redis)).await;
    let response = post(&second, &body).await;
    assert_eq!(header(&response, "x-condenser-cache"), "hit");
    assert_eq!(upstream.summarizer_calls().len(), 1);
    // A caller with another key does not see this team's summaries.
    let other = client()
        .post(second.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-someone-else")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&other, "x-condenser-cache"), "miss");
}
