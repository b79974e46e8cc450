//! `condenser replay FILE`: a recorded session's request bodies, one a line, and per request
//! what condenser would forward, each cache break and why, and the bill against the session
//! as sent; calling nothing.

use serde_json::{json, Value};

use crate::common::*;

const ROUNDS: usize = 60;

/// What a Claude Code request of round `rounds` holds: a system prompt and tools marked for
/// the cache, the task, then tool rounds (thinking, a `Read`, its output); the newest block
/// marked, as Claude Code moves its mark to the end on every turn.
fn claude_code_body(rounds: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Ticket KX-7731-QZ: the nightly build fails. Find out why."}]})];
    for r in 0..rounds {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": filler(r, 30), "signature": format!("sig{r}")},
            {"type": "tool_use", "id": format!("toolu_{r}"), "name": "Read",
             "input": {"file_path": format!("/src/log-{r:03}.txt")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{r}"), "content": filler(r + 500, 400)}]}));
    }
    let last = messages.len() - 1;
    messages[last]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    json!({
        "model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": messages,
        "system": [{"type": "text", "text": filler(1, 800), "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": filler(2, 100),
                   "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}],
    })
}

/// What a Codex request of round `rounds` holds: its developer instructions, the task, then
/// reasoning, a call and its output each round.
fn codex_body(rounds: usize) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": filler(1, 800)}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Ticket KX-7731-QZ: the nightly build fails."}]}),
    ];
    for r in 0..rounds {
        input.push(
            json!({"type": "reasoning", "id": format!("rs_{r}"), "summary": [],
                          "encrypted_content": format!("gAAAA{r}")}),
        );
        input.push(
            json!({"type": "function_call", "call_id": format!("call_{r}"), "name": "exec_command",
                          "arguments": format!("{{\"cmd\":\"cat log-{r:03}.txt\"}}")}),
        );
        input.push(
            json!({"type": "function_call_output", "call_id": format!("call_{r}"),
                          "output": filler(r + 500, 400)}),
        );
    }
    json!({
        "model": "gpt-5-codex", "input": input, "store": false,
        "tools": [{"type": "function", "name": "exec_command", "description": filler(2, 100),
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
    })
}

/// The replay of `bodies` (one a line) under a 30,000-token window for both models.
async fn replay(bodies: impl Iterator<Item = Value>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        // Replay calls nothing, but plans as the gateway would: an upstream that speaks the
        // session's API (a host of no known provider speaks every API).
        "[upstream]\nbase_url = \"http://127.0.0.1:9\"\n\
         [models.\"claude-sonnet-4-5\"]\ncontext_window = 30000\n\
         [models.\"gpt-5-codex\"]\ncontext_window = 30000\n",
    )
    .unwrap();
    let lines: String = bodies.map(|body| format!("{body}\n")).collect();
    let config = config.to_str().unwrap();
    condenser_cli(&["--config", config, "replay", "-"], lines.as_bytes()).await
}

/// One request's row: sent, forwarded, action, summarized, cached, and the break's reason.
pub struct Row {
    sent: u64,
    forwarded: u64,
    action: String,
    cached: u64,
    cache_break: String,
}

pub fn rows(table: &str) -> Vec<Row> {
    table
        .lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Row {
                sent: fields[1].parse().unwrap(),
                forwarded: fields[2].parse().unwrap(),
                action: fields[3].to_string(),
                cached: fields[5].parse().unwrap(),
                cache_break: fields[6..].join(" "),
            }
        })
        .collect()
}

/// The billed figure of the totals line that starts with `label`.
fn billed(table: &str, label: &str) -> f64 {
    let line = table
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap();
    let after = line.split("billed").nth(1).unwrap();
    after.split_whitespace().next().unwrap().parse().unwrap()
}

fn assert_table(table: &str) {
    let rows = rows(table);
    assert_eq!(rows.len(), ROUNDS, "{table}");
    assert_eq!(rows[0].cache_break, "(first request)");
    assert_eq!(rows[0].cached, 0);
    assert!(rows.iter().any(|r| r.action == "summarized"), "{table}");
    assert!(rows.iter().all(|r| r.forwarded <= r.sent));
    // The client only appends: every break is condenser's, and each one says which step.
    let breaks: Vec<&str> = rows
        .iter()
        .skip(1)
        .map(|r| r.cache_break.as_str())
        .filter(|b| !b.is_empty())
        .collect();
    assert!(breaks.contains(&"summary_step"), "{table}");
    assert!(
        breaks
            .iter()
            .all(|b| *b == "summary_step" || *b == "cut_step"),
        "{breaks:?}"
    );
    // A request that breaks nothing repeats the whole of the one before it: about that much
    // of it is cached (a share of its bytes, in its tokens).
    for (i, pair) in rows.windows(2).enumerate() {
        let (before, now) = (&pair[0], &pair[1]);
        if now.cache_break.is_empty() {
            assert!(
                now.cached * 10 >= before.forwarded * 9 && now.cached < now.forwarded,
                "request {}: {} cached after {}",
                i + 2,
                now.cached,
                before.forwarded
            );
        }
    }
    let steps = breaks.iter().filter(|b| **b == "summary_step").count();
    assert!(table.contains(&format!("cache breaks: {steps} summary steps")));
    // Billed: every token at most once, a cached one at a tenth.
    let sent: u64 = rows.iter().map(|r| r.sent).sum();
    let forwarded: u64 = rows.iter().map(|r| r.forwarded).sum();
    let cached: u64 = rows.iter().map(|r| r.cached).sum();
    let with_condenser = billed(table, "with condenser");
    assert!((with_condenser - (forwarded as f64 - 0.9 * cached as f64)).abs() < 1.0);
    assert!(
        billed(table, "as sent") < sent as f64 * 0.5,
        "the session as sent caches too"
    );
}

#[tokio::test]
async fn replay_prints_a_claude_code_sessions_table() {
    assert_table(&replay((1..=ROUNDS).map(claude_code_body)).await);
}

#[tokio::test]
async fn replay_prints_a_codex_sessions_table() {
    assert_table(&replay((1..=ROUNDS).map(codex_body)).await);
}

/// The config of the recordings in tests/fixtures/sessions (their README): each model's
/// window in the recording, its settings, and Claude Opus's price, so that its page shows
/// money.
const RECORDED: &str = "[upstream]\nbase_url = \"http://127.0.0.1:9\"\n\
    [context]\ntrigger_ratio = 0.8\ntarget_ratio = 0.5\nprecompute_ratio = 0.6\n\
    keep_recent_messages = 6\non_failure = \"trim\"\n\
    [models.\"claude-sonnet-4-5-20250929\"]\ncontext_window = 80000\n\
    [models.\"claude-opus-5-5\"]\ncontext_window = 168000\n\
    price = { input = 5.0, cache_read = 0.5, cache_write = 6.25, output = 25.0 }\n\
    [models.\"gemini-3.1-pro-preview\"]\ncontext_window = 60000\n";

pub fn recorded_session(name: &str) -> String {
    format!(
        "{}/tests/fixtures/sessions/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `condenser replay FILE --html OUT` under `config`, with `args` besides: the table it
/// prints, and the page it writes.
pub async fn replay_html(config: &str, file: &str, args: &[&str]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let out = dir.path().join("out.html");
    let mut all = vec![
        "--config",
        config_path.to_str().unwrap(),
        "replay",
        file,
        "--html",
        out.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let table = condenser_cli(&all, b"").await;
    (table, std::fs::read_to_string(&out).unwrap())
}

/// Of a page, each point's request and each step's (kind, request), as the page says.
pub struct Drawn {
    pub sessions: usize,
    pub points: Vec<usize>,
    pub steps: Vec<(String, usize)>,
}

pub fn drawn(html: &str) -> Drawn {
    let point = regex::Regex::new(r#"<circle class="point" data-request="(\d+)""#).unwrap();
    let step =
        regex::Regex::new(r#"<g class="step" data-step="(\w+)" data-request="(\d+)""#).unwrap();
    Drawn {
        sessions: html.matches("<section class=\"session\"").count(),
        points: point
            .captures_iter(html)
            .map(|c| c[1].parse().unwrap())
            .collect(),
        steps: step
            .captures_iter(html)
            .map(|c| (c[1].to_string(), c[2].parse().unwrap()))
            .collect(),
    }
}

/// A page that loads nothing: no script, no element that fetches (a request's text is
/// escaped, so its quotes and brackets cannot make one), links only within the page, and a
/// style that imports nothing.
pub fn assert_offline(html: &str) {
    for fetches in [
        "<script", "<link", "<img", "<iframe", "<object", "<embed", " src=\"",
    ] {
        assert!(!html.contains(fetches), "{fetches}");
    }
    let links = regex::Regex::new(r#"href="([^"]*)""#).unwrap();
    for link in links.captures_iter(html) {
        assert!(
            link[1].starts_with('#'),
            "a link out of the page: {}",
            &link[1]
        );
    }
    let style = html
        .split("<style>")
        .nth(1)
        .and_then(|s| s.split("</style>").next())
        .unwrap();
    assert!(!style.contains("url(") && !style.contains("@import"));
}

/// Where replay's table puts a cache break: its kind and request number.
pub fn table_steps(table: &str) -> Vec<(String, usize)> {
    rows(table)
        .iter()
        .enumerate()
        .filter(|(_, row)| !row.cache_break.is_empty() && !row.cache_break.starts_with('('))
        .map(|(i, row)| (row.cache_break.clone(), i + 1))
        .collect()
}

/// The table and page of the recorded Claude Code 2.1.332 session, replayed once for the
/// tests that read them (a replay of its 111 requests takes some 25 s of a debug build).
pub async fn recorded_claude_code_page() -> &'static (String, String) {
    static PAGE: tokio::sync::OnceCell<(String, String)> = tokio::sync::OnceCell::const_new();
    PAGE.get_or_init(|| async {
        let file = recorded_session("claude-code-2.1.332.jsonl.zst");
        replay_html(RECORDED, &file, &[]).await
    })
    .await
}

#[tokio::test]
async fn replay_draws_a_recorded_session_read_from_zstd_as_one_offline_page() {
    let (table, html) = recorded_claude_code_page().await;
    let requests = rows(table).len();
    assert!(requests >= 110, "{table}");
    let page = drawn(html);
    assert_eq!(page.sessions, 1);
    assert_eq!(page.points, (1..=requests).collect::<Vec<_>>());
    let steps = table_steps(table);
    assert!(
        steps.iter().any(|(kind, _)| kind == "summary_step"),
        "{table}"
    );
    assert_eq!(page.steps, steps);
    // Offline and small, under 1 MB.
    assert_offline(html);
    assert!(html.len() < 1_000_000, "{} bytes", html.len());
    // What the model was sent, collapsed, for every request: the summarized ones with their
    // summary, the task pinned, the recent part.
    assert_eq!(html.matches("<details class=\"request\"").count(), requests);
    assert!(!html.contains("<details open"));
    for part in ["summary", "task", "recent part"] {
        assert!(html.contains(&format!("data-part=\"{part}\"")), "{part}");
    }
    assert!(
        html.contains("KX-7731-QZ"),
        "the task's id is in the pinned task"
    );
    // The bill by tier, in money (Opus is priced in the config).
    for tier in ["cached", "written", "uncached", "output"] {
        assert!(html.contains(&format!("data-tier=\"{tier}\"")), "{tier}");
    }
    assert!(html.contains("in money"));
}

#[tokio::test]
async fn replay_draws_a_session_of_each_api() {
    let config = Fixture::config("http://127.0.0.1:9").to_toml();
    for fixture in Fixture::all() {
        let rounds = fixture.agent_rounds();
        let lines: String = (1..=rounds)
            .map(|r| {
                let body = fixture.agent_body(&fixture.agent_conversation_of(r));
                format!("{body}\n")
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("session.jsonl");
        std::fs::write(&file, lines).unwrap();
        let (table, html) = replay_html(
            &config,
            file.to_str().unwrap(),
            &["--model", fixture.model(), "--api", fixture.name()],
        )
        .await;
        let page = drawn(&html);
        assert_eq!(page.points.len(), rounds, "{}: {table}", fixture.name());
        assert_eq!(page.steps, table_steps(&table), "{}", fixture.name());
        assert!(!page.steps.is_empty(), "{}: {table}", fixture.name());
        assert!(
            html.contains("data-part=\"summary\""),
            "{}: a summary is shown",
            fixture.name()
        );
    }
}

#[tokio::test]
async fn replay_draws_interleaved_conversations_one_chart_each() {
    // A main conversation, and side requests of another model between its turns, as Claude
    // Code's Haiku calls come: each its own session.
    let lines: String = (1..=ROUNDS)
        .flat_map(|r| {
            let mut side = claude_code_body(r.min(3));
            side["model"] = json!("gpt-5-codex");
            [claude_code_body(r), side]
        })
        .map(|body| format!("{body}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("interleaved.jsonl");
    std::fs::write(&file, lines).unwrap();
    let config = "[upstream]\nbase_url = \"http://127.0.0.1:9\"\n\
         [models.\"claude-sonnet-4-5\"]\ncontext_window = 30000\n\
         [models.\"gpt-5-codex\"]\ncontext_window = 30000\n";
    let (table, html) = replay_html(config, file.to_str().unwrap(), &[]).await;
    let page = drawn(&html);
    assert_eq!(page.sessions, 2, "{table}");
    // The main conversation's points are the odd lines, in order; the side's the even ones.
    let odd: Vec<usize> = (0..ROUNDS).map(|i| 2 * i + 1).collect();
    let even: Vec<usize> = (0..ROUNDS).map(|i| 2 * i + 2).collect();
    assert_eq!(page.points, [odd, even].concat());
    assert!(
        page.steps.iter().all(|(_, line)| line % 2 == 1),
        "{:?}",
        page.steps
    );
    assert!(!page.steps.is_empty());
}

/// README's first command, on a fresh clone: `condenser replay FILE --html OUT` under the
/// shipped `config.toml`, of a Claude Code session, which the shipped upstream (OpenAI's host)
/// does not speak. Replay calls nothing, so the session is planned all the same.
#[tokio::test]
async fn replay_of_a_claude_session_needs_no_route_for_its_api() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("replay.html");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_condenser"))
        .args([
            "replay",
            &recorded_session("claude-code-2.1.332.jsonl.zst"),
            "--html",
        ])
        .arg(&page)
        .env_remove("CONDENSER_CONFIG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(rows(&table).len() >= 110, "{table}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(drawn(&html).sessions, 1);
}
