//! An agent's session as its provider's prompt cache sees it (rules 8 and 10): tool outputs of
//! about 1,700 tokens, well over a hundred rounds, windows small and large, and two paces: a
//! model that takes its time while the summarizer keeps up, and one that answers at once
//! while the summarizer takes dozens of rounds. Every forwarded request is judged against the
//! one before it: no avoidable cache break, none over the hard limit, none waiting, the opening
//! turn verbatim before the summary, and an identifier read once in the first round still
//! there in the last request.

use std::time::Duration;

use crate::common::*;
use condenser::dialect::chat::Chat;
use condenser::dialect::stages::Dialect;
use condenser::tokens::catalog::ModelCatalog;
use condenser::tokens::counter::TokenCounter;
use serde_json::{json, Value};

const ROUNDS: usize = 130;
const TICKET: &str = "KX-7731-QZ";
/// Read once, from a file, in the first round: it must outlive every summary.
const READ_ONCE: &str = "4f9c2ab1";
const ENVIRONMENT: &str =
    "<environment_context>\n  <cwd>/work/falcon</cwd>\n  <shell>bash</shell>\n  <sandbox_mode>workspace-write</sandbox_mode>\n</environment_context>";

/// An agent's tool schemas, about 9,000 tokens (Claude Code's run to some 15,000): with them,
/// in the small window, the recent rounds the plan must keep are over the target on their
/// own, so tool outputs are cut at every step.
fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "read_file",
        "description": format!("Reads a file of the workspace. {}", filler(7, 9_000)),
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }}])
}

/// The opening turn: the environment, then the task, as Codex sends them.
fn opening() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": ENVIRONMENT}),
        json!({"role": "user", "content": format!("Ticket {TICKET}: the nightly build fails. Read the logs until you find why.")}),
    ]
}

/// Round `r`: a call to read one log, and the log, about 1,700 tokens, its lines numbered by
/// the round (`turn-r`), the first round's naming the commit to blame.
fn round(r: usize) -> [Value; 2] {
    let mut log = String::new();
    if r == 1 {
        log.push_str(&format!(
            "bisect: commit {READ_ONCE} introduced the failure\n"
        ));
    }
    for line in 0..40 {
        log.push_str(&format!(
            "turn-{r} line {line}: {}\n",
            filler(r * 41 + line, 38)
        ));
    }
    let id = format!("call_{r}");
    [
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"logs/log-{r:03}.txt\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": log}),
    ]
}

/// The least a forwarded `body` can count: its tools, the opening turn, the summary and the
/// last 6 messages (`keep_recent_messages`), which no cut takes out.
fn floor(body: &Value) -> Value {
    let messages = body["messages"].as_array().unwrap();
    let recent = messages.len().saturating_sub(6);
    let kept: Vec<&Value> = messages
        .iter()
        .enumerate()
        .filter(|(at, message)| {
            *at < opening().len()
                || *at >= recent
                || message.to_string().contains("[Context summary: ")
        })
        .map(|(_, message)| message)
        .collect();
    let mut floor = body.clone();
    floor["messages"] = json!(kept);
    floor
}

fn body(messages: &[Value]) -> Value {
    json!({"model": "gpt-4o", "max_tokens": 500, "tools": tools(), "messages": messages})
}

/// The parts a provider caches, in its order: chat's tools, then its messages.
fn cache_order(body: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!([body["tools"], body["messages"]])).unwrap()
}

struct Pace {
    /// How long the model takes to answer.
    model: Duration,
    /// How long the client's own tool takes between rounds.
    tool: Duration,
    summarizer: Duration,
}

async fn session(window: u64, pace: Pace) -> Found {
    session_on(window, pace, None).await
}

/// A session at `pace` in a window of `window` tokens; with `shared`, over two replicas
/// sharing that Redis, each request sent to the other one.
async fn session_on(window: u64, pace: Pace, shared: Option<&Redis>) -> Found {
    let upstream = mock_llm(LlmBehaviour {
        chat_latency: pace.model,
        summarizer_latency: pace.summarizer,
        lossy_summarizer: true,
        ..LlmBehaviour::default()
    })
    .await;
    let mut config = small_window_config(&upstream.url());
    config.models.get_mut("gpt-4o").unwrap().context_window = Some(window);
    let hard_limit = window - 500;
    if let Some(redis) = shared {
        config.cache.redis_url = redis.url();
    }
    let replicas = if shared.is_some() { 2 } else { 1 };
    let mut proxies = Vec::new();
    for _ in 0..replicas {
        proxies.push(Proxy::start(config.clone()).await);
    }
    let mut messages = opening();
    let mut sent = Vec::new();
    let mut waits = Vec::new();
    for r in 0..ROUNDS {
        let request = body(&messages);
        let response = client()
            .post(proxies[r % replicas].url("/v1/chat/completions"))
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "round {r}");
        let cache = header(&response, "x-condenser-cache");
        if matches!(cache.as_str(), "miss" | "extended") {
            waits.push(r);
        }
        sent.push(Sent {
            client: cache_order(&request),
            task: Vec::new(),
            forwarded: Vec::new(),
            received_tokens: Condensed::of(&response).prompt_tokens.unwrap(),
            forwarded_tokens: Condensed::of(&response).forwarded_tokens.unwrap(),
            floor_tokens: 0,
            // gpt-4o's tokenizer is exact: nothing is scaled.
            scale: 1.0,
        });
        response.bytes().await.unwrap();
        messages.extend(round(r));
        tokio::time::sleep(pace.tool).await;
    }
    let forwarded: Vec<Value> = upstream
        .recorded()
        .iter()
        .filter(|r| !is_summarizer_call(r))
        .map(|r| r.json())
        .collect();
    assert_eq!(
        forwarded.len(),
        ROUNDS,
        "each request reached upstream once"
    );
    let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = TokenCounter::new(config.tokens.unknown_model_margin);
    for (request, body) in sent.iter_mut().zip(&forwarded) {
        request.forwarded = cache_order(body);
        let floor = serde_json::to_vec(&floor(body)).unwrap();
        let parsed = Chat::parse(&floor, "/v1/chat/completions").unwrap();
        request.floor_tokens = Chat::count(&parsed, &catalog, &counter).await.count.total;
    }
    for (r, (request, body)) in sent.iter().zip(&forwarded).enumerate() {
        assert!(
            request.forwarded_tokens <= hard_limit,
            "round {r}: {} over {hard_limit}",
            request.forwarded_tokens
        );
        // The opening turn, verbatim, right after the head and before any summary.
        assert_eq!(
            &body["messages"].as_array().unwrap()[..3],
            &opening()[..],
            "round {r}"
        );
    }
    assert_eq!(waits, Vec::<usize>::new(), "requests that waited");
    let last = forwarded.last().unwrap().to_string();
    assert!(
        last.contains(READ_ONCE),
        "read once in round 1, lost by the last request"
    );
    assert!(last.contains(TICKET));
    let context = &config.context;
    let share = |ratio: f64| (hard_limit as f64 * ratio) as u64;
    let limits = Thresholds {
        hard_limit,
        trigger: share(context.trigger_ratio),
        target: share(context.target_ratio),
    };
    let figures = cache_figures(&sent, limits);
    eprintln!(
        "window {window}: {} requests, {} summary steps, {} cut steps, {} client changes, \
         {} tool arrivals, prefix reuse {:.3}, billed {:.0} against {:.0} sent whole, {} summaries made",
        sent.len(),
        figures.summary_steps,
        figures.cut_steps,
        figures.client_changes,
        figures.tool_arrivals,
        figures.reuse,
        figures.billed,
        figures.billed_whole,
        upstream.summarizer_calls().len(),
    );
    assert_eq!(figures.avoidable, Vec::new(), "avoidable cache breaks");
    assert!(figures.summary_steps > 0, "the session was summarized");
    // How the proxies found each request's form: a step to a new summary only at the steps
    // the judge saw (and the first, which it counts with the tools' arrival), never near
    // the request rate, which is a form in use not found from one request to the next.
    let mut found = Found::default();
    for proxy in &proxies {
        let metrics = proxy.metrics().await;
        let count = |outcome: &str| {
            let series = format!("condenser_forms_total{{outcome=\"{outcome}\"}}");
            metric(&metrics, &series).unwrap_or_else(|| panic!("{series}"))
        };
        found.stepped += count("stepped");
        found.kept += count("kept");
        found.went_on += count("cut") + count("stand_in");
    }
    let steps = (figures.summary_steps + figures.tool_arrivals) as f64;
    assert!(
        found.stepped <= steps,
        "{} requests stepped, {steps} steps",
        found.stepped
    );
    assert!(
        found.kept > found.stepped,
        "{} requests kept the form in use",
        found.kept
    );
    found
}

/// How the proxies found the forms of a session's requests (`condenser_forms_total`).
#[derive(Debug, Default)]
struct Found {
    /// Stepped to a summary on hand.
    stepped: f64,
    /// Kept the form in use.
    kept: f64,
    /// Went on over the trigger without the summary being made: the middle's outputs cut,
    /// or its oldest rounds folded into a stand-in (rule 10).
    went_on: f64,
}

/// The model takes its time (a tenth of a second a turn) and the summarizer keeps up.
const PATIENT: Pace = Pace {
    model: Duration::from_millis(100),
    tool: Duration::from_millis(0),
    summarizer: Duration::from_millis(300),
};

/// The model answers at once; the summarizer takes dozens of rounds.
const HURRIED: Pace = Pace {
    model: Duration::from_millis(0),
    tool: Duration::from_millis(10),
    summarizer: Duration::from_millis(1_500),
};

#[tokio::test]
async fn a_small_window_at_a_patient_pace_breaks_the_cache_only_at_steps() {
    session(32_000, PATIENT).await;
}

#[tokio::test]
async fn a_small_window_at_a_hurried_pace_never_waits_and_breaks_only_at_steps() {
    let found = session(32_000, HURRIED).await;
    assert!(
        found.went_on > 0.0,
        "no request went on while its summary was made: {found:?}"
    );
}

#[tokio::test]
async fn a_large_window_at_either_pace_breaks_the_cache_only_at_steps() {
    session(128_000, PATIENT).await;
    session(128_000, HURRIED).await;
}

/// Two replicas behind a load balancer that sends each request to the other: the cuts one
/// made are the ones the other keeps (the horizon is recorded in Redis beside the archive),
/// and the summaries one made serve the other.
#[tokio::test]
async fn two_replicas_sharing_redis_cut_and_summarize_alike() {
    let redis = Redis::start().await;
    let found = session_on(32_000, HURRIED, Some(&redis)).await;
    assert!(
        found.went_on > 0.0,
        "no request went on while its summary was made: {found:?}"
    );
}
