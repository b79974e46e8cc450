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
struct Row {
    sent: u64,
    forwarded: u64,
    action: String,
    cached: u64,
    cache_break: String,
}

fn rows(table: &str) -> Vec<Row> {
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
