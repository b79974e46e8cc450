//! The live proxy agrees with replay (issue 54): each recorded agent session in
//! `tests/fixtures/sessions/` (real clients' bodies, as they sent them; its README says how
//! they were made) is sent to the live proxy request after request, in front of a scripted
//! upstream that counts as the provider does (`PromptCache::provider`: o200k's count scaled by
//! a share that moves with the content, split into uncached, cache read and cache write), so
//! that the ratio condenser learns moves from one request to the next as against the real
//! APIs. The same file goes through `condenser replay` (`cli::replay`, calling nothing),
//! which has no reply to learn a ratio from: it is told the one the live proxy learned, as a
//! user tells it (`tokens.unknown_model_margin`). Both must break the cache only where a step
//! is due (`common/breaks.rs`), and take the same summary steps, within one. The live
//! summarizer writes summaries of the size replay plans with (its budget), so that what
//! differs is how each counts. Then with a summarizer that takes five model turns, still no
//! avoidable break.
//!
//! The recordings are fixtures of this test, not tuning targets: other sessions are to be
//! tried the same way.
//!
//! Pace: the recordings were made at 0.4 s a model turn and a 2 s summarizer. Three sessions
//! of some 110 requests, each sent twice, at that pace would take over four minutes of
//! sleeping alone, so both are scaled by an eighth (50 ms a turn, 250 ms a summary): the
//! summarizer still takes five model turns, which is what decides where a summary lands.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::agent_clients::{cached_order, floor_of, task_turn, unmarked};
use crate::common::*;
use bytes::Bytes;
use condenser::cli::{replay, ReplayOptions};
use condenser::dialect::gemini::Gemini;
use condenser::dialect::messages::Messages;
use condenser::dialect::stages::Dialect;
use condenser::tokens::catalog::ModelCatalog;
use condenser::tokens::counter::TokenCounter;
use serde_json::{json, Value};

/// A model turn, scaled from the recordings' 0.4 s (see the module's note on pace).
pub const MODEL_TURN: Duration = Duration::from_millis(50);
/// The slow summarizer, scaled from the recordings' 2 s: five model turns.
const SLOW_SUMMARY: Duration = Duration::from_millis(250);
/// `keep_recent_messages` of the recordings.
const RECENT: usize = 6;

/// One recorded session and how it was run: its file, the window condenser gave its model,
/// and the API it speaks.
pub struct Recording {
    pub file: &'static str,
    pub window: u64,
    pub api: RecordedApi,
}

#[derive(Clone, Copy)]
pub enum RecordedApi {
    /// Anthropic's Messages; the model is in the body.
    Messages,
    /// Gemini's `streamGenerateContent`; the model is in the path.
    Gemini { model: &'static str },
}

impl RecordedApi {
    pub fn path(self) -> String {
        match self {
            RecordedApi::Messages => "/v1/messages".into(),
            RecordedApi::Gemini { model } => {
                format!("/v1beta/models/{model}:streamGenerateContent?alt=sse")
            }
        }
    }

    /// The body's fields in the order its provider caches them.
    fn cache_order(self) -> &'static [&'static str] {
        match self {
            RecordedApi::Messages => &["tools", "system", "messages"],
            RecordedApi::Gemini { .. } => &["tools", "systemInstruction", "contents"],
        }
    }

    fn conversation(self) -> &'static str {
        self.cache_order()[2]
    }

    /// The reply's reserve `body` asks for: Messages' `max_tokens`; else condenser's default.
    fn reserve(self, body: &Value, default: u64) -> u64 {
        match self {
            RecordedApi::Messages => body["max_tokens"].as_u64().unwrap_or(default),
            RecordedApi::Gemini { .. } => default,
        }
    }

    /// `raw`'s count as condenser makes it before it scales it.
    async fn raw_count(self, raw: &[u8], counting: &(ModelCatalog, TokenCounter)) -> u64 {
        let path = self.path();
        match self {
            RecordedApi::Messages => {
                let request = Messages::parse(raw, &path).unwrap();
                Messages::count(&request, &counting.0, &counting.1).await
            }
            RecordedApi::Gemini { .. } => {
                let request = Gemini::parse(raw, &path).unwrap();
                Gemini::count(&request, &counting.0, &counting.1).await
            }
        }
        .count
        .raw_total
    }
}

pub const CLAUDE_CODE_2_0_77: Recording = Recording {
    file: "claude-code-2.0.77.jsonl.zst",
    window: 80_000,
    api: RecordedApi::Messages,
};
const CLAUDE_CODE_2_1_332: Recording = Recording {
    file: "claude-code-2.1.332.jsonl.zst",
    window: 168_000,
    api: RecordedApi::Messages,
};
const GEMINI_CLI_0_61: Recording = Recording {
    file: "gemini-cli-0.61.jsonl.zst",
    window: 60_000,
    api: RecordedApi::Gemini {
        model: "gemini-3.1-pro-preview",
    },
};

/// The session's request bodies, one a line.
pub fn bodies(recording: &Recording) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sessions")
        .join(recording.file);
    let file = std::fs::File::open(&path).unwrap();
    let mut text = String::new();
    ruzstd::decoding::StreamingDecoder::new(file)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(String::from)
        .collect()
}

/// The recording's config: its model's window, the catalog's own entry otherwise (a Claude
/// or Gemini model is estimated, its counts scaled by the ratio learned from usage), and the
/// recordings' settings, which are condenser's defaults with `keep_recent_messages = 6`.
pub fn config(upstream: &str, recording: &Recording, model: &str) -> condenser::Config {
    let mut config = config_for(upstream);
    config.models.insert(
        model.into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(recording.window),
            encoding: None,
            price: None,
        },
    );
    let context = &mut config.context;
    (context.trigger_ratio, context.target_ratio) = (0.8, 0.5);
    context.precompute_ratio = 0.6;
    context.keep_recent_messages = RECENT;
    context.on_failure = condenser::config::OnFailure::Trim;
    config
}

/// What a scripted summarizer writes, given the call it answers.
pub type SummaryWriter = Arc<dyn Fn(&Value) -> String + Send + Sync>;

/// A scripted upstream that answers the session's API after a model turn, its usage counted
/// as the provider counts (`PromptCache::provider`), and summarizes in `summarizer`, writing
/// what `summary` writes.
pub async fn scripted(
    api: RecordedApi,
    summarizer: Duration,
    summary: SummaryWriter,
) -> MockUpstream {
    let cache = PromptCache::provider();
    MockUpstream::start(handler(move |r| {
        let (cache, summary) = (cache.clone(), summary.clone());
        async move {
            let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
            if is_summarizer_call(&r) {
                tokio::time::sleep(summarizer).await;
                return json_response(200, &summary_reply(&path, &summary(&body)));
            }
            tokio::time::sleep(MODEL_TURN).await;
            match api {
                RecordedApi::Messages => {
                    let model = body["model"].as_str().unwrap_or_default();
                    let marked = r.body.windows(15).any(|w| w == b"\"cache_control\"");
                    let usage = cache.prompt(&body).anthropic_usage(marked, 1);
                    messages_stream(model, usage)
                }
                RecordedApi::Gemini { model } => {
                    let usage = cache.prompt_of(model, model, &body).gemini_usage(12);
                    gemini_sse(&[gemini_reply(json!([{"text": "Next batch."}]), usage)])
                }
            }
        }
    }))
    .await
}

/// What the live proxy's summarizer writes: `lossy_summary`, filled to nine tenths of the
/// tokens it was asked for. Replay plans each step with a summary of its budget
/// (`Summarizer::stand_in`, calling nothing); a summary a few lines long lowers the live
/// floor below replay's, and the two step apart for that alone (Claude Code 2.0.77: 17 steps
/// live, 19 replayed, at one ratio). Of equal size, what differs is how each counts.
fn summary_of_its_budget(request: &Value) -> String {
    let asked = request["max_tokens"]
        .as_u64()
        .or_else(|| request["generationConfig"]["maxOutputTokens"].as_u64())
        .unwrap_or(0);
    let mut text = lossy_summary(request);
    text.push('\n');
    // " summary" is one token in o200k, as in replay's placeholder.
    for _ in 0..asked * 9 / 10 {
        text.push_str(" summary");
    }
    text
}

/// A streamed Messages reply of one line of text, with `usage`.
fn messages_stream(
    model: &str,
    usage: Value,
) -> hyper::Response<condenser::transport::body::ProxyBody> {
    let message = json!({"id": "msg_live", "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage});
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": message}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Next batch."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 3}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let text: String = events
        .iter()
        .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
        .collect();
    hyper::Response::builder()
        .header("content-type", "text/event-stream")
        .body(condenser::transport::body::full(Bytes::from(text)))
        .unwrap()
}

/// One recorded body sent to the live proxy as its client sent it, with the key headers of
/// either API.
pub async fn send(proxy: &Proxy, api: RecordedApi, body: &str) -> reqwest::Response {
    client()
        .post(proxy.url(&api.path()))
        .header("content-type", "application/json")
        .header("x-api-key", "sk-ant-live-replay")
        .header("anthropic-version", "2023-06-01")
        .header("x-goog-api-key", "AIza-live-replay")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// What condenser told the client of one request: the prompt as received and as forwarded,
/// in its (scaled) count.
struct Told {
    received: u64,
    forwarded: u64,
}

/// The session sent to the live proxy request after request, each after the reply to the
/// one before; every request judged (`cache_figures`) against the thresholds of the first.
async fn live(
    recording: &Recording,
    bodies: &[String],
    summarizer: Duration,
    counting: &(ModelCatalog, TokenCounter),
) -> (CacheFigures, f64) {
    let api = recording.api;
    let upstream = scripted(api, summarizer, Arc::new(summary_of_its_budget)).await;
    let first: Value = serde_json::from_str(&bodies[0]).unwrap();
    let model = match api {
        RecordedApi::Messages => first["model"].as_str().unwrap().to_string(),
        RecordedApi::Gemini { model } => model.to_string(),
    };
    let config = config(&upstream.url(), recording, &model);
    let proxy = Proxy::start(config.clone()).await;
    let mut told = Vec::new();
    for (at, body) in bodies.iter().enumerate() {
        let response = send(&proxy, api, body).await;
        assert_eq!(response.status(), 200, "request {at}");
        let condensed = Condensed::of(&response);
        told.push(Told {
            received: condensed.prompt_tokens.unwrap(),
            forwarded: condensed.forwarded_tokens.unwrap(),
        });
        response.bytes().await.unwrap();
    }
    let recorded = upstream.recorded();
    let forwarded: Vec<&Recorded> = recorded.iter().filter(|r| !is_summarizer_call(r)).collect();
    assert_eq!(forwarded.len(), bodies.len(), "each request forwarded once");
    let limits = thresholds(recording, &first, &config);
    let (order, conversation) = (api.cache_order(), api.conversation());
    let mut sent = Vec::new();
    for ((body, told), upstream) in bodies.iter().zip(&told).zip(&forwarded) {
        let client: Value = serde_json::from_str(body).unwrap();
        let forwarded = upstream.json();
        assert!(
            told.forwarded <= limits.hard_limit,
            "{} forwarded tokens over the hard limit {}",
            told.forwarded,
            limits.hard_limit
        );
        let scale = told.forwarded as f64 / api.raw_count(&upstream.body, counting).await as f64;
        let floor = floor_of(&forwarded, conversation, RECENT);
        let items = unmarked(&client[conversation]);
        sent.push(Sent {
            client: cached_order(&client, order),
            task: serde_json::to_vec(task_turn(items.as_array().unwrap())).unwrap(),
            forwarded: cached_order(&forwarded, order),
            received_tokens: told.received,
            forwarded_tokens: told.forwarded,
            floor_tokens: (api.raw_count(&floor, counting).await as f64 * scale) as u64,
            scale,
        });
    }
    let figures = cache_figures(&sent, limits);
    let summaries = upstream.summarizer_calls().len();
    eprintln!(
        "{} live, summarizer {summarizer:?}: {} requests, {summaries} summaries made, {} summary \
         steps, {} cut steps, {} client changes, {} avoidable breaks, prefix reuse {:.3}, billed \
         {:.0} against {:.0} sent whole ({:.2})",
        recording.file,
        figures.pairs + 1,
        figures.summary_steps,
        figures.cut_steps,
        figures.client_changes,
        figures.avoidable.len(),
        figures.reuse,
        figures.billed,
        figures.billed_whole,
        figures.billed / figures.billed_whole,
    );
    for (at, what) in figures.avoidable.iter().take(5) {
        eprintln!("  avoidable break at request {at}: {what}");
    }
    // The ratio the proxy learned from usage, over the session: the median of the scales
    // its requests were counted with (it moves with what the prompt holds).
    let mut scales: Vec<f64> = sent.iter().map(|request| request.scale).collect();
    scales.sort_by(f64::total_cmp);
    let learned = scales.get(scales.len() / 2).copied().unwrap_or(1.0);
    (figures, learned)
}

/// The thresholds condenser measures the session's requests against: the window less the
/// reply's reserve (at most half the window), and the trigger and target shares of it.
pub fn thresholds(recording: &Recording, first: &Value, config: &condenser::Config) -> Thresholds {
    let context = &config.context;
    let reserve = recording
        .api
        .reserve(first, context.response_reserve_tokens)
        .min(recording.window / 2);
    let usable = recording.window - reserve;
    let share = |ratio: f64| (usable as f64 * ratio) as u64;
    Thresholds {
        hard_limit: usable,
        trigger: share(context.trigger_ratio),
        target: share(context.target_ratio),
    }
}

/// One row of replay's table: the prompt as sent and as condenser would forward it (its
/// counts, which replay, learning no ratio, scales alike throughout), and the break it names.
struct Replayed {
    sent: u64,
    forwarded: u64,
    cache_break: String,
}

/// What `condenser replay` makes of the session: its table's rows, and its summary steps.
async fn replayed(recording: &Recording, bodies: &[String], ratio: f64) -> (Vec<Replayed>, usize) {
    let (model, api) = match recording.api {
        RecordedApi::Messages => (None, None),
        RecordedApi::Gemini { model } => (Some(model), None),
    };
    let first: Value = serde_json::from_str(&bodies[0]).unwrap();
    let named = model.map_or_else(
        || first["model"].as_str().unwrap().to_string(),
        String::from,
    );
    // Replay calls nothing, but plans as the gateway would; it learns no ratio from usage,
    // and is told the one the live proxy learned, as a user tells it (the margin an
    // estimated model's counts are scaled by until a reply teaches a ratio).
    let mut config = config("http://127.0.0.1:9", recording, &named);
    config.tokens.unknown_model_margin = ratio - 1.0;
    let options = ReplayOptions {
        model,
        api,
        profile: None,
    };
    let table = replay(&config, &bodies.join("\n"), options)
        .await
        .unwrap()
        .table;
    let rows: Vec<Replayed> = table
        .lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Replayed {
                sent: fields[1].parse().unwrap(),
                forwarded: fields[2].parse().unwrap(),
                cache_break: fields[6..].join(" "),
            }
        })
        .collect();
    assert_eq!(rows.len(), bodies.len(), "{table}");
    let steps = table
        .lines()
        .find_map(|line| line.strip_prefix("cache breaks: "))
        .and_then(|line| line.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary steps in {table}"));
    (rows, steps)
}

/// Replay's cut steps that were not due: a step starts from over the trigger (the form
/// before it grown by what the client added) and lands under it, so that the next request
/// needs none (as `cache_figures` judges a live session; replay gives no bodies to judge
/// by bytes, and names a client's change and a summary step itself).
fn replay_avoidable(rows: &[Replayed], limits: Thresholds) -> Vec<usize> {
    let mut avoidable = Vec::new();
    for (at, pair) in rows.windows(2).enumerate() {
        let (before, now) = (&pair[0], &pair[1]);
        if now.cache_break != "cut_step" {
            continue;
        }
        let grown = before.forwarded + now.sent.saturating_sub(before.sent);
        let from_trigger = grown > limits.trigger - limits.trigger / 100;
        let rolling = before.cache_break == "cut_step";
        if !from_trigger || now.forwarded >= limits.trigger || rolling {
            avoidable.push(at + 1);
        }
    }
    avoidable
}

/// The recording live with a summarizer that answers at once and replayed: both without an
/// avoidable break and with the same summary steps, within one; then live with a slow
/// summarizer, still without one.
async fn agrees_with_replay(recording: Recording) {
    let bodies = bodies(&recording);
    assert!(bodies.len() > 100, "{} requests", bodies.len());
    let first: Value = serde_json::from_str(&bodies[0]).unwrap();
    let limits = thresholds(&recording, &first, &config_for(""));
    // Counts as condenser makes them before it scales them, kept across both runs.
    let unscaled = config_for("");
    let counting = (
        ModelCatalog::new(unscaled.models, unscaled.tokens.clone()),
        TokenCounter::new(unscaled.tokens.unknown_model_margin),
    );
    let (instant, learned) = live(&recording, &bodies, Duration::ZERO, &counting).await;
    let (slow, _) = live(&recording, &bodies, SLOW_SUMMARY, &counting).await;
    let (rows, replay_steps) = replayed(&recording, &bodies, learned).await;
    let replay_breaks = replay_avoidable(&rows, limits);
    eprintln!(
        "{} replayed at the learned ratio {learned:.3}: {replay_steps} summary steps, {} cut \
         steps, avoidable at {replay_breaks:?}",
        recording.file,
        rows.iter().filter(|r| r.cache_break == "cut_step").count(),
    );
    assert_eq!(
        replay_breaks,
        Vec::<usize>::new(),
        "replay's avoidable breaks"
    );
    assert_eq!(
        instant.avoidable,
        Vec::new(),
        "live avoidable breaks, the summarizer instant"
    );
    // Issue 54: one step apart at most. Replay is told one ratio throughout, while the live
    // proxy starts from the margin and learns it request by request.
    assert!(
        instant.summary_steps.abs_diff(replay_steps) <= 1,
        "live took {} summary steps, replay {replay_steps}",
        instant.summary_steps
    );
    assert_eq!(
        slow.avoidable,
        Vec::new(),
        "live avoidable breaks, the summarizer slow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_2_0_77_live_agrees_with_replay() {
    agrees_with_replay(CLAUDE_CODE_2_0_77).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_2_1_332_live_agrees_with_replay() {
    agrees_with_replay(CLAUDE_CODE_2_1_332).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_0_61_live_agrees_with_replay() {
    agrees_with_replay(GEMINI_CLI_0_61).await;
}
