//! Observe mode: every request goes as it came, and what `auto` would have forwarded and
//! billed is counted off the request's path. Driven through one agent session in observe
//! mode and again in auto mode, its figures are auto's.

use std::sync::Arc;
use std::time::Duration;

use crate::agent_sessions::{agent_session, with_window};
use crate::common::*;

const ROUNDS: usize = 180;
const WINDOW: u64 = 24_000;

/// A summarizer that writes up to its budget, as one of a long span does: each summary is
/// `max_tokens` words long, one token each.
fn full_length_summaries() -> LlmBehaviour {
    let answer: SummarizerError = Arc::new(|r: &Recorded| {
        let request = r.json();
        let budget = request["max_completion_tokens"]
            .as_u64()
            .or(request["max_tokens"].as_u64())
            .unwrap();
        // In the asked shape, with the task (condenser refuses a summary without them),
        // filled out to its budget.
        let shape = lossy_summary(&request);
        let words = (budget as usize).saturating_sub(shape.split_whitespace().count() + 30);
        let text = format!("{shape}\n## Progress\n{}", vec!["summary"; words].join(" "));
        let path = r.path_and_query.split('?').next().unwrap_or("");
        Some((200, summary_reply(path, &text)))
    });
    LlmBehaviour {
        summarizer_error: Some(answer),
        ..LlmBehaviour::default()
    }
}

/// Round `round` of the agent session sent in `mode`, checked to have succeeded; what
/// condenser said of it.
async fn send(proxy: &Proxy, round: usize, mode: &str) -> Condensed {
    let body = chat_body(&agent_session(round));
    let headers = [("x-condenser-mode", mode)];
    let (response, condensed) = post(proxy, "/v1/chat/completions", &headers, &body).await;
    assert_eq!(response.status(), 200);
    condensed
}

/// The sum of every series of `name`, whatever its labels, that `filter` keeps.
fn total(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `n` requests were observed: each adds its would-be prompt to the total.
async fn observed(proxy: &Proxy, before: f64) -> f64 {
    within("the observation", async {
        loop {
            let now = total(
                &proxy.state.metrics.render(),
                "condenser_observed_forwarded_tokens_total",
                "",
            );
            if now > before {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// The forwarded prompts' bill, as a provider charges it: each prompt's share that repeats
/// the start of the one before (its `messages` as JSON, by bytes) at a tenth.
fn billed(prompts: &[(String, u64)]) -> f64 {
    let mut bill = 0.0;
    let mut before = "";
    for (prompt, tokens) in prompts {
        let common = before
            .bytes()
            .zip(prompt.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let cached = *tokens as f64 * common as f64 / prompt.len() as f64;
        bill += *tokens as f64 - 0.9 * cached;
        before = prompt;
    }
    bill
}

/// How many requests took a new summary: its first line changed.
fn summary_steps(prompts: &[(String, u64)]) -> usize {
    let line = |prompt: &str| {
        prompt
            .find("[Context summary: ")
            .map(|at| prompt[at..].split(']').next().unwrap_or("").to_string())
    };
    prompts
        .windows(2)
        .filter(|pair| line(&pair[0].0) != line(&pair[1].0) && line(&pair[1].0).is_some())
        .count()
}

fn within_5_percent(what: &str, observed: f64, auto: f64) {
    assert!(
        (observed - auto).abs() <= auto * 0.05,
        "{what}: observe says {observed}, auto did {auto}"
    );
}

#[tokio::test]
async fn observe_reports_what_auto_then_does_on_the_same_session() {
    // Observed: forwarded as sent, nothing summarized.
    let upstream = mock_llm(full_length_summaries()).await;
    let proxy = Proxy::start(with_window(&upstream, WINDOW)).await;
    let mut seen = 0.0;
    let mut would = Vec::new();
    for round in 1..=ROUNDS {
        let reply = send(&proxy, round, "observe").await;
        seen = observed(&proxy, seen).await;
        would.push((reply.would, reply.would_forward_tokens));
    }
    let recorded = upstream.recorded();
    assert!(!recorded.iter().any(is_summarizer_call), "nothing called");
    for (round, request) in recorded.iter().enumerate() {
        assert_eq!(
            request.json(),
            chat_body(&agent_session(round + 1)),
            "forwarded as sent"
        );
    }
    assert!(would.iter().all(|(w, n)| !w.is_empty() && n.is_some()));
    assert!(
        would.iter().any(|(w, _)| w == "summarized"),
        "by the plan, auto would summarize: {would:?}"
    );
    let metrics = proxy.state.metrics.render();
    let observed_forwarded = total(&metrics, "condenser_observed_forwarded_tokens_total", "");
    let uncached = total(
        &metrics,
        "condenser_observed_bill_tokens_total",
        "tier=\"uncached\"",
    );
    let cache_read = total(
        &metrics,
        "condenser_observed_bill_tokens_total",
        "tier=\"cache_read\"",
    );
    let observed_steps = total(
        &metrics,
        "condenser_observed_breaks_total",
        "reason=\"summary_step\"",
    );
    assert_eq!(uncached + cache_read, observed_forwarded);

    // Then auto on the same session.
    let upstream = mock_llm(full_length_summaries()).await;
    let proxy = Proxy::start(with_window(&upstream, WINDOW)).await;
    let mut forwarded = Vec::new();
    for round in 1..=ROUNDS {
        forwarded.push(send(&proxy, round, "auto").await.forwarded_tokens.unwrap());
        // Let a summary made ahead land, as an agent's tool call would.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let prompts: Vec<(String, u64)> = upstream
        .recorded()
        .iter()
        .filter(|r| !is_summarizer_call(r))
        .map(|r| r.json()["messages"].to_string())
        .zip(forwarded.iter().copied())
        .collect();
    let auto_forwarded: u64 = forwarded.iter().sum();
    let auto_steps = summary_steps(&prompts);
    let auto_bill = billed(&prompts);
    let observed_bill = uncached + 0.1 * cache_read;
    println!(
        "forwarded: observe {observed_forwarded}, auto {auto_forwarded}; summary steps: observe \
         {observed_steps}, auto {auto_steps}; bill: observe {observed_bill:.0}, auto {auto_bill:.0}"
    );
    assert!(auto_steps >= 3, "the session compacts: {auto_steps}");
    within_5_percent("forwarded", observed_forwarded, auto_forwarded as f64);
    within_5_percent("summary steps", observed_steps, auto_steps as f64);
    within_5_percent("bill", observed_bill, auto_bill);
}

#[tokio::test]
async fn observe_is_a_mode_of_the_config_and_the_header_overrides_it() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = with_window(&upstream, WINDOW);
    config.context.mode = condenser::config::Mode::Observe;
    let proxy = Proxy::start(config).await;
    let body = chat_body(&agent_session(100));
    let (_, condensed) = post(&proxy, "/v1/chat/completions", &[], &body).await;
    assert_eq!(condensed.action, "forwarded");
    assert_eq!(condensed.would, "summarized");
    let would = condensed.would_forward_tokens.unwrap();
    let received = condensed.prompt_tokens.unwrap();
    assert!(would < received / 2, "{would} of {received}");
    // The header still decides: auto compacts.
    let auto = [("x-condenser-mode", "auto")];
    let (response, condensed) = post(&proxy, "/v1/chat/completions", &auto, &body).await;
    assert_ne!(condensed.action, "forwarded");
    assert!(response.headers().get("x-condenser-would").is_none());
}
