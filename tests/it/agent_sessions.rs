//! Compaction as an agent meets it: a request every fraction of a second, a summarizer that
//! takes longer than a turn. Nobody waits while the window has room; what is forwarded only
//! grows at its end between compactions, so a provider's prompt cache stays warm.

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

/// What the client is told of each turn: the cache outcome and the tokens forwarded.
struct Turn {
    cache: String,
    forwarded_tokens: u64,
}

/// A waited request is one whose summary was made while it waited.
fn waited(turn: &Turn) -> bool {
    waited_for(&turn.cache)
}

/// Whether a request told cache outcome `cache` waited for its summary.
fn waited_for(cache: &str) -> bool {
    matches!(cache, "miss" | "extended")
}

pub fn with_window(upstream: &MockUpstream, window: u64) -> condenser::Config {
    let mut config = small_window_config(&upstream.url());
    config.models.get_mut("gpt-4o").unwrap().context_window = Some(window);
    config
}

/// 8,000 tokens less `chat_body`'s 500 reserved for the reply.
const HARD_LIMIT: u64 = 7_500;

/// How far `fixture`'s growing conversation goes, and the pause between its turns (the time
/// an agent's tool call takes): to about 13,000 tokens, with a pause that grows as a round
/// does, so that each dialect has as long as chat's between the trigger and the hard limit
/// (1,500 tokens: 7 of chat's rounds, 4.7 of Responses', 3.7 of Messages', 2.1 of
/// Gemini's). Every pause is shorter than the summarizer takes.
fn growth(fixture: Fixture) -> (usize, Duration) {
    match fixture {
        Fixture::Chat => (60, Duration::from_millis(100)),
        Fixture::Responses => (40, Duration::from_millis(150)),
        Fixture::Messages => (32, Duration::from_millis(190)),
        Fixture::Gemini => (19, Duration::from_millis(325)),
    }
}

#[tokio::test]
async fn a_growing_conversation_never_waits_for_a_slower_summarizer() {
    let latency = Duration::from_millis(600);
    for fixture in Fixture::all() {
        let upstream = fixture
            .upstream(LlmBehaviour {
                summarizer_latency: latency,
                ..LlmBehaviour::default()
            })
            .await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let (rounds, pause) = growth(fixture);
        assert!(pause < latency);
        let mut turns = Vec::new();
        for t in 1..=rounds {
            let original = fixture.agent_conversation_of(t);
            let body = fixture.agent_body(&original);
            let (response, condensed) = fixture.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{fixture:?}");
            fixture.assert_valid(&original, upstream.forwarded().last().unwrap());
            turns.push(Turn {
                cache: condensed.cache,
                forwarded_tokens: condensed.forwarded_tokens.unwrap(),
            });
            tokio::time::sleep(pause).await;
        }
        let outcomes: Vec<&str> = turns.iter().map(|t| t.cache.as_str()).collect();
        assert_eq!(
            turns.iter().filter(|t| waited(t)).count(),
            0,
            "{fixture:?}: {outcomes:?}"
        );
        assert!(
            turns.iter().all(|t| t.forwarded_tokens <= HARD_LIMIT),
            "{fixture:?}: over the hard limit: {:?}",
            turns.iter().map(|t| t.forwarded_tokens).collect::<Vec<_>>()
        );
        assert!(
            outcomes.contains(&"hit"),
            "{fixture:?}: compacted along the way: {outcomes:?}"
        );
        assert!(
            !upstream.summarizer_calls().is_empty(),
            "{fixture:?}: summaries were made, in the background"
        );
    }
}

/// The rounds of `fixture`'s agent conversation that come to over the trigger (6,000
/// tokens) and under the hard limit, with one round more still under it.
fn rounds_over_the_trigger(fixture: Fixture) -> usize {
    match fixture {
        Fixture::Chat => 30,
        Fixture::Responses => 20,
        Fixture::Messages => 16,
        Fixture::Gemini => 9,
    }
}

/// Rule 10: an agent's one-prompt tool loop past the hard limit in its first request,
/// nothing on hand (a session resumed through condenser, or a client new to it), its outputs
/// too short for a cut to bring it down, goes at once, its oldest rounds folded into a
/// stand-in written without a model; the model's summary is made meanwhile and replaces it
/// at the next step. A conversation of turns a person opens (each fixture's agent
/// conversation: a prompt typed before each round) has no run of rounds to fold: it waits
/// for the model's summary, as nothing instant fits.
#[tokio::test]
async fn a_conversation_past_the_hard_limit_in_one_request_goes_at_once_with_a_stand_in() {
    for fixture in Fixture::all() {
        let upstream = fixture
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_millis(300),
                ..LlmBehaviour::default()
            })
            .await;
        let proxy = fixture.warmed(Fixture::config(&upstream.url())).await;
        // Outputs of some 130 tokens, under what a cut keeps; Gemini's count twice (the
        // ratio its usage teaches), so half as many rounds pass its hard limit, and a
        // stand-in of as many lines as chat's would not fit its window.
        let rounds = match fixture {
            Fixture::Gemini => 45,
            _ => 90,
        };
        let original = tool_loop(fixture, rounds, |r| filler(r + 500, 100));
        let body = fixture.agent_body(&original);
        let (response, turn) = fixture.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{fixture:?}");
        let received = turn.prompt_tokens.unwrap();
        assert!(received > HARD_LIMIT, "{fixture:?}: {received}");
        assert!(!waited_for(&turn.cache), "{fixture:?}: {}", turn.cache);
        assert_eq!(turn.action, "summarized", "{fixture:?}");
        let forwarded = turn.forwarded_tokens.unwrap();
        assert!(forwarded <= HARD_LIMIT, "{fixture:?}: {forwarded}");
        let sent = upstream.forwarded();
        let last = sent.last().unwrap();
        fixture.assert_valid(&original, last);
        let text = last.to_string();
        assert!(
            text.contains(", a stand-in until the summary is made]"),
            "{fixture:?}: the summary line says it stands in"
        );
        assert!(
            text.contains("cat log-0.txt"),
            "{fixture:?}: a line per round"
        );
        // A person's turns past the hard limit wait for the model's summary.
        let turns = fixture.agent_conversation();
        let (response, turn) = fixture
            .post(&proxy, &fixture.agent_body(&turns), false, &[])
            .await;
        assert_eq!(response.status(), 200, "{fixture:?}");
        assert!(turn.prompt_tokens.unwrap() > HARD_LIMIT, "{fixture:?}");
        assert!(waited_for(&turn.cache), "{fixture:?}: {}", turn.cache);
    }
}

#[tokio::test]
async fn over_the_trigger_within_the_hard_limit_a_request_goes_at_once() {
    for fixture in Fixture::all() {
        let upstream = fixture
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_millis(300),
                ..LlmBehaviour::default()
            })
            .await;
        let proxy = fixture.warmed(Fixture::config(&upstream.url())).await;
        let rounds = rounds_over_the_trigger(fixture);
        let send = |rounds: usize| {
            let proxy = &proxy;
            async move {
                let body = fixture.agent_body(&fixture.agent_conversation_of(rounds));
                let (response, condensed) = fixture.post(proxy, &body, false, &[]).await;
                assert_eq!(response.status(), 200, "{fixture:?}");
                condensed
            }
        };
        // Over the trigger (6,000), under the hard limit, nothing on hand: it goes at once,
        // down to the target, its middle cut or its oldest rounds folded into a stand-in
        // (rule 10).
        let turn = send(rounds).await;
        let received = turn.prompt_tokens.unwrap();
        assert!(
            received > 6_000 && received <= HARD_LIMIT,
            "{fixture:?}: {received}"
        );
        assert!(!waited_for(&turn.cache), "{fixture:?}: {}", turn.cache);
        // Turns a person opens go as sent while their summary is made, or their middle's
        // outputs cut when that reaches the target.
        assert!(
            turn.forwarded_tokens.unwrap() <= received,
            "{fixture:?}: {:?} forwarded of {received}",
            turn.forwarded_tokens
        );
        let sent = upstream.forwarded();
        // The warming request, and this one.
        assert_eq!(sent.len(), 2, "{fixture:?}: each reached upstream once");
        fixture.assert_valid(&fixture.agent_conversation_of(rounds), &sent[1]);
        // The summary it needed was started for it; the next turn finds it, once made. It
        // waits for it only past the hard limit (less a recall round, at most a sixteenth,
        // when it offers recall), where turns a person opens have nothing instant to go with.
        let mut next = send(rounds + 1).await;
        while next.cache != "hit" {
            assert!(
                !waited_for(&next.cache)
                    || next.prompt_tokens.unwrap() > HARD_LIMIT - HARD_LIMIT / 16,
                "{fixture:?}: {}",
                next.cache
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            next = send(rounds + 1).await;
        }
    }
}

/// The window of `fixture`'s long replay of 150 rounds: chat's 32,000 tokens, and for the
/// others as much more as their rounds are larger (chat's 216 tokens, Responses' 321,
/// Messages' 410, Gemini's 702), so that every dialect reaches the trigger near round 118
/// and goes as many rounds between two moves of its summary; each move starts a new prompt,
/// and in a window of the same size Gemini's would move three times as often.
fn replay_window(fixture: Fixture) -> u64 {
    match fixture {
        Fixture::Chat => 32_000,
        Fixture::Responses => 47_500,
        Fixture::Messages => 60_800,
        Fixture::Gemini => 104_000,
    }
}

/// The prompt a provider caches of a forwarded `body`: its system prompt, where the API
/// carries one outside the conversation (a summary may go there), then its conversation.
fn prompt_of(fixture: Fixture, body: &Value) -> String {
    format!(
        "{}{}",
        fixture.system(body),
        Value::Array(fixture.items(body))
    )
}

#[tokio::test]
async fn a_long_replay_forwards_prompts_that_repeat_the_previous_ones_start() {
    for fixture in Fixture::all() {
        let upstream = fixture.upstream(LlmBehaviour::default()).await;
        let mut config = Fixture::config(&upstream.url());
        for model in config.models.values_mut() {
            model.context_window = Some(replay_window(fixture));
        }
        let proxy = Proxy::start(config).await;
        let rounds = 150;
        let mut compacted = 0;
        for t in 1..=rounds {
            let body = fixture.agent_body(&fixture.agent_conversation_of(t));
            let (response, turn) = fixture.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{fixture:?}");
            compacted += usize::from(turn.cache == "hit");
            // Let background summaries land, as the time an agent's tool call takes would.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let prompts: Vec<String> = upstream
            .forwarded()
            .iter()
            .map(|body| prompt_of(fixture, body))
            .collect();
        assert_eq!(prompts.len(), rounds, "{fixture:?}");
        let reuse = prefix_reuse(&prompts);
        println!(
            "{fixture:?}: prefix reuse over {rounds} turns: {reuse:.3}, {compacted} turns compacted"
        );
        assert!(compacted >= 20, "{fixture:?}: compaction ran: {compacted}");
        assert!(reuse >= 0.9, "{fixture:?}: prefix reuse {reuse:.3}");
    }
}

#[test]
fn prefix_reuse_is_the_repeated_share() {
    let prompts = ["abcd".to_string(), "abcdef".into(), "xbcdefgh".into()];
    let reuse = prefix_reuse(&prompts);
    assert!((reuse - (4.0 / 6.0 + 0.0) / 2.0).abs() < 1e-9, "{reuse}");
}

/// An agent's session: the system prompt, one task, then tool rounds (a call, then an output
/// of about 400 tokens), `rounds` of them.
pub fn agent_session(rounds: usize) -> Vec<Value> {
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": SYSTEM_PROMPT}),
        serde_json::json!({"role": "user", "content": "Fix ticket KX-7731-QZ: the nightly build fails."}),
    ];
    for r in 0..rounds {
        let id = format!("call_{r}");
        messages.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "shell", "arguments": format!("{{\"cmd\":\"cat log-{r}.txt\"}}")}}]}));
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": id,
            "content": format!("log-{r}: {}", filler(r + 2000, 300))}));
    }
    messages
}

/// The task of `tool_loop`, its first user turn.
const TASK: &str = "Fix ticket KX-7731-QZ: the nightly build fails.";

/// A one-prompt tool loop in `fixture`'s dialect: its head (chat's system message), the task
/// as the first user turn, then `rounds` tool rounds, a call (`cat log-N.txt`) and its
/// output `output(N)`. Chat's is `agent_session`'s shape, its outputs given.
fn tool_loop(fixture: Fixture, rounds: usize, output: impl Fn(usize) -> String) -> Vec<Value> {
    use serde_json::json;
    let mut items = match fixture {
        Fixture::Chat => vec![
            json!({"role": "system", "content": SYSTEM_PROMPT}),
            json!({"role": "user", "content": TASK}),
        ],
        Fixture::Responses => vec![
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}),
        ],
        Fixture::Messages => vec![json!({"role": "user", "content": TASK})],
        Fixture::Gemini => vec![json!({"role": "user", "parts": [{"text": TASK}]})],
    };
    for r in 0..rounds {
        let command = format!("cat log-{r}.txt");
        let (call, answer) = match fixture {
            Fixture::Chat => (
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{r}"), "type": "function", "function": {"name": "shell",
                     "arguments": json!({"cmd": command}).to_string()}}]}),
                json!({"role": "tool", "tool_call_id": format!("call_{r}"), "content": output(r)}),
            ),
            Fixture::Responses => (
                json!({"type": "function_call", "id": format!("fc_{r}"), "call_id": format!("call_{r}"),
                    "name": "search", "arguments": json!({"query": command}).to_string()}),
                json!({"type": "function_call_output", "call_id": format!("call_{r}"), "output": output(r)}),
            ),
            Fixture::Messages => (
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{r}"),
                    "name": "lookup", "input": {"q": command}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{r}"),
                    "content": output(r)}]}),
            ),
            Fixture::Gemini => (
                json!({"role": "model", "parts": [{"functionCall": {"id": format!("call-{r}"), "name": "lookup",
                    "args": {"q": command}}, "thoughtSignature": thought_signature(r)}]}),
                json!({"role": "user", "parts": [{"functionResponse": {"id": format!("call-{r}"), "name": "lookup",
                    "response": {"output": output(r)}}}]}),
            ),
        };
        items.push(call);
        items.push(answer);
    }
    items
}

/// How many of `tool_loop`'s first items are its head, before the task: chat's system
/// message.
fn loop_head(fixture: Fixture) -> usize {
    usize::from(fixture == Fixture::Chat)
}

/// The text of a tool output `tool_loop` wrote, in `fixture`'s dialect.
fn output_text(fixture: Fixture, item: &Value) -> String {
    let at = match fixture {
        Fixture::Chat => "/content",
        Fixture::Responses => "/output",
        Fixture::Messages => "/content/0/content",
        Fixture::Gemini => "/parts/0/functionResponse/response/output",
    };
    item.pointer(at)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{fixture:?}: no output in {item}"))
        .to_string()
}

/// The config of a window of `window` tokens for every fixture's model, counted exactly, so
/// that a ratio learned from an API's usage does not move the limits under the test.
fn exact_window(upstream: &MockUpstream, window: u64) -> condenser::Config {
    let mut config = Fixture::config(&upstream.url());
    for fixture in Fixture::all() {
        config.models.insert(
            fixture.model().into(),
            condenser::tokens::catalog::ModelOverride {
                context_window: Some(window),
                encoding: Some("o200k_base".into()),
                price: None,
            },
        );
    }
    config
}

/// What a provider sees of a one-prompt tool loop: the task in every request, tool rounds
/// summarized ahead of need rather than outputs cut, nobody waiting while something on hand
/// fits, and a prefix that repeats from turn to turn.
#[tokio::test]
async fn a_one_prompt_tool_loop_is_summarized_ahead_with_its_task_pinned() {
    for fixture in Fixture::all() {
        let upstream = fixture
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_millis(300),
                lossy_summarizer: true,
                ..LlmBehaviour::default()
            })
            .await;
        let window = 24_000;
        let proxy = Proxy::start(exact_window(&upstream, window)).await;
        let hard_limit = window - 500;
        let (trigger, target) = (hard_limit * 8 / 10, hard_limit / 2);
        let output = |r: usize| format!("log-{r}: {}", filler(r + 2000, 300));
        let mut actions = Vec::new();
        let mut steps = Vec::new();
        for r in 1..=120 {
            let original = tool_loop(fixture, r, output);
            let body = fixture.agent_body(&original);
            let (response, condensed) = fixture.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{fixture:?}");
            let received = condensed.prompt_tokens.unwrap();
            let forwarded = condensed.forwarded_tokens.unwrap();
            assert!(
                forwarded <= hard_limit,
                "{fixture:?} round {r}: {forwarded}"
            );
            assert!(
                !matches!(condensed.cache.as_str(), "miss" | "extended") || received > hard_limit,
                "{fixture:?}: round {r} waited with {received} tokens, under the hard limit"
            );
            fixture.assert_valid(&original, upstream.forwarded().last().unwrap());
            actions.push(condensed.action);
            steps.push((received, forwarded));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let forwarded = upstream.forwarded();
        let head = loop_head(fixture);
        let task = tool_loop(fixture, 0, output)[head].clone();
        for (r, body) in forwarded.iter().enumerate() {
            assert_eq!(
                fixture.items(body)[head],
                task,
                "{fixture:?} round {r}: the task"
            );
        }
        for (r, pair) in forwarded.windows(2).enumerate() {
            let (before, now) = (fixture.summarized(&pair[0]), fixture.summarized(&pair[1]));
            if before == now {
                continue;
            }
            // It moves only forward, only once the one in use would be over the trigger,
            // and then in one step down to about the target.
            assert!(
                now > before,
                "{fixture:?} round {}: {before:?} → {now:?}",
                r + 2
            );
            let ((received_before, forwarded_before), (received_now, forwarded_now)) =
                (steps[r], steps[r + 1]);
            let with_old = forwarded_before + (received_now - received_before);
            // The trigger fires on the compactor's estimate, which takes each cut output at
            // its nominal 256 tokens; with every output of the middle cut at a step (D15),
            // that estimate may stand a few tokens over the bytes' count (18,798 against a
            // trigger of 18,800 in one run). A step made early for want of the trigger is
            // thousands of tokens under it.
            let estimate_slack = trigger / 100;
            assert!(
                with_old + estimate_slack > trigger,
                "{fixture:?} round {}: moved at {with_old} tokens",
                r + 2
            );
            assert!(
                forwarded_now <= target + 1_000,
                "{fixture:?} round {}: {forwarded_now}",
                r + 2
            );
        }
        let summarized = actions.iter().filter(|a| *a == "summarized").count();
        assert!(summarized >= 40, "{fixture:?}: {actions:?}");
        assert!(
            !actions.iter().any(|a| a == "trimmed"),
            "{fixture:?}: {actions:?}"
        );
        let summaries = upstream.summarizer_calls().len();
        let prompts: Vec<String> = forwarded
            .iter()
            .map(|body| prompt_of(fixture, body))
            .collect();
        let reuse = prefix_reuse(&prompts);
        println!(
            "{fixture:?}: one-prompt loop, 120 rounds: prefix reuse {reuse:.3}, {summaries} summaries made"
        );
        assert!(reuse >= 0.9, "{fixture:?}: prefix reuse {reuse:.3}");
        assert!(
            summaries <= 20,
            "{fixture:?}: {summaries} summaries for 120 rounds"
        );
    }
}

/// The hard limit holds on the bytes forwarded, and `condenser plan` says what they count:
/// a request trimmed because the summarizer failed, its tool outputs cut, forwards exactly
/// what the plan printed, and `condenser count` of the forwarded body agrees.
#[tokio::test]
async fn condenser_plan_tells_the_trimmed_prompt_the_proxy_forwards() {
    let upstream = mock_llm(LlmBehaviour {
        summarizer_status: Some(500),
        ..LlmBehaviour::default()
    })
    .await;
    let config = with_window(&upstream, 16_000);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("condenser.toml");
    std::fs::write(&config_path, config.to_toml()).unwrap();
    let proxy = Proxy::start(config).await;
    let mut messages = agent_session(60);
    // The last three outputs, the recent part, cannot fit the hard limit even alone: they
    // are shortened, the newest last.
    for message in messages.iter_mut().rev().step_by(2).take(3) {
        message["content"] = Value::String(filler(7, 5_500));
    }
    let body = serde_json::to_vec(&chat_body(&messages)).unwrap();
    let config_arg = config_path.to_str().unwrap();
    let plan = condenser_cli(&["--config", config_arg, "plan", "-"], &body).await;
    assert!(plan.contains("keep task      messages 1..2"), "{plan}");
    assert!(plan.contains("shorten"), "{plan}");
    let planned: u64 = plan
        .lines()
        .find_map(|l| {
            l.strip_prefix("forwarded = ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{plan}"));

    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let condensed = Condensed::of(&response);
    assert_eq!(condensed.action, "trimmed");
    assert!(condensed.recent_shortened.is_some());
    let forwarded = condensed.forwarded_tokens.unwrap();
    assert_eq!(forwarded, planned);
    assert!(forwarded <= 16_000 - 500, "{forwarded}");
    let sent = upstream
        .recorded()
        .into_iter()
        .rfind(|r| !is_summarizer_call(r))
        .unwrap();
    let recount = condenser_cli(&["--config", config_arg, "count", "-"], &sent.body).await;
    assert_eq!(recount.trim(), forwarded.to_string());
}

/// Claude Code's shape of the same loop on the Messages API: tool results in user turns, the
/// summary in `system` after the original. The task stays the first turn, the forwarded
/// messages stay valid, and the prompt repeats from turn to turn.
#[tokio::test]
async fn a_claude_code_shaped_tool_loop_keeps_its_task_and_its_prefix() {
    let upstream = mock_claude(ClaudeBehaviour {
        llm: LlmBehaviour {
            summarizer_latency: Duration::from_millis(300),
            lossy_summarizer: true,
            ..LlmBehaviour::default()
        },
        ..ClaudeBehaviour::default()
    })
    .await;
    let mut config = claude_config(&upstream.url());
    // Counted exactly, so the learned ratio does not move the limits under the test.
    config.models.insert(
        "claude-sonnet-4-5".into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(24_000),
            encoding: Some("o200k_base".into()),
            price: None,
        },
    );
    let proxy = Proxy::start(config).await;
    let task = serde_json::json!({"role": "user", "content": "Fix ticket KX-7731-QZ."});
    let mut messages = vec![task.clone()];
    let mut prompts = Vec::new();
    for r in 0..100 {
        let id = format!("toolu_{r}");
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": format!("cat log-{r}")}}]}));
        messages.push(serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": format!("log-{r}: {}", filler(r, 300))}]}));
        let (response, condensed) = Fixture::Messages
            .post_as(&proxy, "sk-ant-test", &messages_body(&messages), false, &[])
            .await;
        assert_eq!(response.status(), 200);
        let received = condensed.prompt_tokens.unwrap();
        let forwarded = condensed.forwarded_tokens.unwrap();
        assert!(forwarded <= 24_000 - 500, "round {r}: {forwarded}");
        assert!(
            !matches!(condensed.cache.as_str(), "miss" | "extended") || received > 24_000 - 500,
            "round {r} waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in upstream
        .recorded()
        .iter()
        .filter(|r| r.path_and_query == "/v1/messages" && !is_summarizer_call(r))
    {
        let body = r.json();
        let sent = body["messages"].as_array().unwrap();
        assert_eq!(sent[0], task, "the task first, verbatim");
        for pair in sent.windows(2) {
            assert_ne!(pair[0]["role"], pair[1]["role"], "roles alternate");
        }
        prompts.push(body.to_string());
    }
    let summarized = prompts
        .iter()
        .filter(|p| p.contains("[Context summary: "))
        .count();
    assert!(
        summarized >= 30,
        "{summarized} of {} summarized",
        prompts.len()
    );
    let reuse = prefix_reuse(&prompts);
    println!("Claude Code shaped loop, 100 rounds: prefix reuse {reuse:.3}");
    assert!(reuse >= 0.9, "prefix reuse {reuse:.3}");
}

/// An agent whose own head (system prompt and tools) is a third of what is usable, reading
/// outputs of about 1,700 tokens for 110 rounds at once while the summarizer takes 4 s:
/// every request carries the client's last six messages verbatim, the newest output whole,
/// within the hard limit, and none waits.
#[tokio::test]
async fn an_agent_with_a_large_head_sees_its_recent_work_whole_in_every_request() {
    for fixture in Fixture::all() {
        let upstream = fixture
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_secs(4),
                lossy_summarizer: true,
                ..LlmBehaviour::default()
            })
            .await;
        let window = 30_500;
        let mut config = exact_window(&upstream, window);
        config.context.keep_recent_messages = 6;
        let proxy = Proxy::start(config).await;
        let hard_limit = window - 500;
        let system = filler(1, 7_400);
        let head = loop_head(fixture);
        let mut summarized = 0;
        for r in 0..110 {
            let output =
                |r: usize| format!("log-{r}: {}\nnext-step: token-{r}", filler(r + 3000, 1_280));
            let items = tool_loop(fixture, r + 1, output);
            let mut body = fixture.agent_body(&items);
            fixture.set_system(&mut body, &system);
            let items = fixture.items(&body);
            let (response, condensed) = fixture.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{fixture:?}");
            let forwarded = condensed.forwarded_tokens.unwrap();
            assert!(
                forwarded <= hard_limit,
                "{fixture:?} round {r}: {forwarded}"
            );
            assert!(
                !matches!(condensed.cache.as_str(), "miss" | "extended"),
                "{fixture:?}: round {r} waited"
            );
            assert_eq!(condensed.recent_shortened, None, "{fixture:?}");
            summarized += usize::from(condensed.action == "summarized");
            let sent_body = upstream.forwarded().pop().unwrap();
            fixture.assert_valid(&items, &sent_body);
            let sent = fixture.items(&sent_body);
            // The large head whole: chat's system message first; elsewhere the system prompt,
            // which Messages' summary follows in `system`.
            if head == 1 {
                assert_eq!(sent[0], items[0], "{fixture:?}");
            } else {
                assert!(
                    fixture.system(&sent_body).to_string().contains(&system),
                    "{fixture:?} round {r}: the system prompt"
                );
            }
            // The items after the head and the task.
            let recent = 6.min(items.len() - head - 1);
            assert_eq!(
                sent[sent.len() - recent..],
                items[items.len() - recent..],
                "{fixture:?} round {r}: the last six messages verbatim"
            );
            assert!(output_text(fixture, &sent[sent.len() - 1])
                .ends_with(&format!("next-step: token-{r}")));
        }
        // How many requests went with a summary depends on how fast the machine runs the
        // rounds against the 4 s summarizer; that summaries took over at all does not.
        assert!(
            summarized > 0,
            "{fixture:?}: no request went with a summary"
        );
    }
}
