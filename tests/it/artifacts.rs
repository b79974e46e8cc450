//! Every identifier an agent saw stays in the conversation: with a summarizer that keeps
//! nothing, code carries the identifiers of the summarized messages in the summary's Artifacts
//! section, from every role, and an extended summary keeps them. And a summary made under other
//! settings is not reused.

use crate::common::*;
use condenser::tokens::encoding::Encoding;
use condenser::tokens::rules::count_text;
use serde_json::{json, Value};

/// The identifiers planted in turn `t`: in the user's text, in a tool call's arguments, in the
/// tool's result, and in the assistant's answer.
fn planted(t: usize) -> [String; 4] {
    [
        format!("ORD-{}", 7100 + t),
        format!("/srv/agent/job{t}/input.csv"),
        format!("E{}", 4100 + t),
        format!("${}", 300 + t),
    ]
}

/// One agent turn, about 400 tokens: a request, a tool call and its result, an answer.
fn agent_turn(t: usize) -> Vec<Value> {
    let [ticket, path, error, amount] = planted(t);
    let call_id = format!("call_{t}");
    vec![
        json!({"role": "user", "content": format!("Work on {ticket}. {}", filler(t, 90))}),
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": json!({"path": path}).to_string()},
        }]}),
        json!({"role": "tool", "tool_call_id": call_id,
               "content": format!("failed with {error}. {}", filler(t + 500, 90))}),
        json!({"role": "assistant", "content": format!("Budgeted {amount} for it. {}", filler(t + 900, 90))}),
    ]
}

fn agent_session(turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM_PROMPT})];
    for t in 0..turns {
        messages.extend(agent_turn(t));
    }
    messages
}

/// Sends the session compacted now (`force`) and returns the share of the summarized
/// messages' identifiers found in what was forwarded, and the ledger's size in tokens.
async fn identifiers_kept(proxy: &Proxy, upstream: &MockUpstream, turns: usize) -> (f64, usize) {
    let messages = agent_session(turns);
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-condenser-mode", "force")
        .json(&chat_body(&messages))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let summarized: usize = Condensed::of(&response).summarized_messages.unwrap();
    let forwarded = upstream
        .recorded()
        .iter()
        .rev()
        .find(|r| !is_summarizer_call(r))
        .unwrap()
        .json();
    let summary = forwarded["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        summary.contains("## Artifacts\nnone"),
        "the lossy summary is used: {summary}"
    );
    let text = forwarded["messages"].to_string();
    // Messages 1..=summarized were evicted; turn t holds messages 4t+1..4t+4.
    let evicted_turns = summarized.div_ceil(4);
    assert!(evicted_turns >= 3, "enough evicted to judge: {summarized}");
    let expected: Vec<String> = (0..evicted_turns)
        .flat_map(|t| {
            let ids = planted(t);
            // Of a partly evicted last turn, only the parts evicted count.
            let parts = (summarized - 4 * t).min(4);
            ids.into_iter().take(parts)
        })
        .collect();
    let kept = expected
        .iter()
        .filter(|id| text.contains(id.as_str()))
        .count();
    let ledger = summary
        .split("Carried verbatim")
        .nth(1)
        .map_or(0, |l| count_text(Encoding::O200k, l) as usize);
    (kept as f64 / expected.len() as f64, ledger)
}

#[tokio::test]
async fn a_lossy_summarizer_loses_no_identifier_and_an_extended_summary_keeps_them() {
    let upstream = mock_llm(LlmBehaviour {
        lossy_summarizer: true,
        ..LlmBehaviour::default()
    })
    .await;
    let config = small_window_config(&upstream.url());
    let budget = config.summarizer.max_artifact_tokens as usize;
    let proxy = Proxy::start(config).await;
    for (turns, step) in [
        (10, "first summary"),
        (12, "extended"),
        (14, "extended again"),
    ] {
        let (share, ledger) = identifiers_kept(&proxy, &upstream, turns).await;
        println!("{step}: {share:.3} of the summarized identifiers kept, ledger {ledger} tokens");
        assert!(share >= 0.95, "{step}: {share:.2} of the identifiers kept");
        assert!(ledger <= budget + 16, "{step}: ledger of {ledger} tokens");
    }
    let calls = upstream
        .recorded()
        .iter()
        .filter(|r| is_summarizer_call(r))
        .count();
    assert!(calls >= 3, "each step summarized: {calls}");
}

#[tokio::test]
async fn a_summary_made_under_other_settings_is_not_reused() {
    let redis = Redis::start().await;
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let replica = |max_summary_tokens: u32| {
        let mut config = small_window_config(&upstream.url());
        config.cache.redis_url = redis.url();
        config.summarizer.max_summary_tokens = max_summary_tokens;
        config
    };
    let send = |proxy: &Proxy| {
        client()
            .post(proxy.url("/v1/chat/completions"))
            .json(&chat_body(&conversation(40)))
            .send()
    };
    let first = Proxy::start(replica(1024)).await;
    assert_eq!(
        header(&send(&first).await.unwrap(), "x-condenser-cache"),
        "miss"
    );
    let other_budget = Proxy::start(replica(900)).await;
    assert_eq!(
        header(&send(&other_budget).await.unwrap(), "x-condenser-cache"),
        "miss",
        "another max_summary_tokens"
    );
    let same = Proxy::start(replica(1024)).await;
    assert_eq!(
        header(&send(&same).await.unwrap(), "x-condenser-cache"),
        "hit",
        "the same settings share through Redis"
    );
}

/// The commit an agent reads once, in the first round's file, and needs again at the end.
const READ_ONCE: &str = "4f9c2ab1";
/// The ticket the session's task names.
const TASK_TICKET: &str = "KX-7731-QZ";

/// Round `r`'s tool output: a log of about 1,800 tokens whose every line carries counters
/// (`turn-r`, a request number, a line of `src/worker.rs`), headed by the round's build hash:
/// the bulk a long session piles up. The first round's also names the last good commit, once.
fn round_output(r: usize) -> String {
    let mut log = String::new();
    if r == 1 {
        log.push_str(&format!("Last good build: commit {READ_ONCE}.\n"));
    }
    let build = blake3::hash(format!("build {r}").as_bytes()).to_hex();
    log.push_str(&format!("Build {}:\n", &build[..10]));
    for line in 0..30 {
        log.push_str(&format!(
            "turn-{r} req-{:05} src/worker.rs:{} {}\n",
            r * 30 + line,
            100 + line * 5,
            filler(r * 31 + line, 45)
        ));
    }
    log
}

/// A multi-prompt agent session: the task, then tool rounds (a file read and its log), with a
/// second prompt after the third round, so the task itself is summarized like any history.
fn long_agent_session(rounds: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": format!("Fix ticket {TASK_TICKET}: the nightly build fails.")}),
    ];
    for r in 1..=rounds {
        let id = format!("call_{r}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": "read_file", "arguments": json!({"path": format!("logs/round-{r}.log")}).to_string()},
        }]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": round_output(r)}));
        if r == 3 {
            messages.push(json!({"role": "assistant", "content": "The logs repeat; reading on."}));
            messages
                .push(json!({"role": "user", "content": "Keep going until the build is green."}));
        }
    }
    messages
}

/// After 110 rounds whose tool outputs are bulk counters, over many summary extensions, the
/// ledger (at its default budget) still carries what the task named and a commit read once in
/// the first round: the bulk is a few runs, not hundreds of entries pushing them out.
#[tokio::test]
async fn a_long_session_keeps_the_tasks_ticket_and_a_commit_read_once_among_counter_bulk() {
    let upstream = mock_llm(LlmBehaviour {
        lossy_summarizer: true,
        ..LlmBehaviour::default()
    })
    .await;
    let mut config = small_window_config(&upstream.url());
    config.models.get_mut("gpt-4o").unwrap().context_window = Some(32_000);
    let budget = config.summarizer.max_artifact_tokens as usize;
    assert_eq!(budget, 512, "the default budget");
    let proxy = Proxy::start(config).await;
    let rounds = 110;
    for r in 1..=rounds {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .json(&chat_body(&long_agent_session(r)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "round {r}");
        // Let background summaries land, as the time an agent's tool call takes would.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let output_tokens = count_text(Encoding::O200k, &round_output(2));
    assert!(
        output_tokens >= 1_500,
        "tool outputs of {output_tokens} tokens"
    );
    let extensions = upstream
        .summarizer_calls()
        .iter()
        .filter(|r| summarizer_prompt(&r.json()).contains("<existing_summary>"))
        .count();
    assert!(extensions >= 5, "{extensions} summary extensions");
    let last = upstream.forwarded().pop().unwrap();
    let summary = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|text| text.starts_with("[Context summary: "))
        .unwrap_or_else(|| panic!("the last request is compacted: {last}"))
        .to_string();
    let ledger = summary[summary.find("Carried verbatim").unwrap()..]
        .split("\n\n")
        .next()
        .unwrap();
    let ledger_tokens = count_text(Encoding::O200k, ledger);
    println!(
        "{rounds} rounds, {extensions} extensions, tool outputs of {output_tokens} tokens, \
         ledger of {ledger_tokens} tokens:\n{ledger}"
    );
    // The task's ticket in the summary (a summary that keeps no prompt's identifier is
    // refused), the commit read once in the ledger.
    assert!(
        summary.contains(TASK_TICKET),
        "{TASK_TICKET} lost from the summary:\n{summary}"
    );
    assert!(
        ledger.contains(READ_ONCE),
        "{READ_ONCE} lost from the ledger:\n{ledger}"
    );
    assert!(
        ledger_tokens as usize <= budget + 64,
        "a ledger of {ledger_tokens} tokens"
    );
    assert!(
        ledger.contains("more left out"),
        "what did not fit is counted:\n{ledger}"
    );
}

/// Claude Code's tool results travel in user turns (the Messages API has no tool role); the
/// ledger still ranks what they hold as tool output, below what the assistant said.
#[tokio::test]
async fn a_messages_tool_result_ranks_as_a_tool_output_not_as_the_users() {
    let upstream = mock_claude(ClaudeBehaviour {
        llm: LlmBehaviour {
            lossy_summarizer: true,
            ..LlmBehaviour::default()
        },
        ..ClaudeBehaviour::default()
    })
    .await;
    let proxy = Proxy::start(claude_config(&upstream.url())).await;
    let build = |r: u8| blake3::hash(&[r]).to_hex()[..10].to_string();
    let mut messages =
        vec![json!({"role": "user", "content": format!("Fix ticket {TASK_TICKET}.")})];
    for r in 0..10 {
        let id = format!("toolu_{r}");
        let said = if r == 2 {
            "Budget code ORD-4411 applies."
        } else {
            "Reading on."
        };
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": said},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "cat build.log"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": format!("build {} ok", build(r))}]}));
    }
    let response = client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("x-condenser-mode", "force")
        .json(&messages_body(&messages))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let sent = upstream
        .recorded()
        .into_iter()
        .rfind(|r| r.path_and_query == "/v1/messages" && !is_summarizer_call(r))
        .unwrap()
        .json()
        .to_string();
    let ledger = &sent[sent.find("Carried verbatim").unwrap()..];
    let said = ledger.find("ORD-4411").unwrap();
    let read = ledger.find(&build(0)).unwrap();
    assert!(said < read, "the assistant's before the tool's: {ledger}");
}
