//! Gemini CLI on Gemini's API: `gemini -p` headless, `GOOGLE_GEMINI_BASE_URL` at condenser.
//! Each prompt first asks a flash-lite model which model should answer (`:generateContent`,
//! the router), then runs its loop on `:streamGenerateContent?alt=sse`. The scripted model
//! thinks before each call and signs the call's part (`thoughtSignature`), as Gemini 3 does,
//! and answers 400 as Gemini does when a call it made comes back without its signature.
//!
//! Gemini CLI manages its context itself too. It compresses the chat (a summary by the model,
//! checked by a second call) once the prompt upstream last reported reaches
//! `model.compressionThreshold` of the model's limit (by default half of 1,048,576 tokens):
//! the settings raise it to the whole limit, and through condenser the prompt upstream reports
//! never passes condenser's window anyway. It also masks old tool outputs (a stub pointing to
//! a file) once more than 30,000 tokens of them lie beyond the newest 50,000: 0.61.0 reads
//! those thresholds from Google's experiment flags alone (the `contextManagement` settings it
//! lists are not passed on), so the masking stays, and its requests change where it masks:
//! the judge counts those as the client's own changes. Loop detection, which asks a model
//! about the session every few rounds, is off.

use super::*;
use condenser::dialect::gemini::Gemini;

/// The model Gemini CLI 0.61.0 runs its loop on when its router picks its default, Gemini 3.1
/// Pro: its variant for clients' own tools.
const GEMINI_CLI_MODEL: &str = "gemini-3.1-pro-preview-customtools";
const GEMINI_LOOP: &str = "/v1beta/models/gemini-3.1-pro-preview-customtools:streamGenerateContent";
/// Small enough that condenser compacts between the rounds at which Gemini CLI masks.
const GEMINI_WINDOW: u64 = 60_000;

/// The round of the log a `read_file` call reads (by its path), or a `run_shell_command`
/// call (by the path its command reads).
fn call_round(part: &Value) -> Option<usize> {
    let args = &part["functionCall"]["args"];
    let path = args["file_path"].as_str().or(args["command"].as_str())?;
    let name = path.rsplit('/').next()?;
    name.strip_prefix("log-")?.get(..3)?.parse().ok()
}

/// The round a Gemini request answers: one past the call its last turn answers (the call in
/// the model turn before it).
fn gemini_round(body: &Value) -> usize {
    let turns = conversation(body);
    let turns = &turns[..turns.len() - continuation_len(turns)];
    let [.., call, answer] = turns else {
        return 0;
    };
    let answers = answer.to_string().contains("\"functionResponse\"");
    let parts = call["parts"].as_array().map_or(&[][..], Vec::as_slice);
    let round = parts.iter().find_map(call_round).filter(|_| answers);
    round.map_or(0, |round| round + 1)
}

/// The signature of the thought before the call of `round`: opaque bytes, base64.
fn signature(round: usize) -> String {
    format!("CiQBjz1rX{round:03}{}", "Qm9va2tlZXBlcg".repeat(12))
}

/// The calls in `body` whose signature is not the one the model gave them.
fn unsigned_calls(body: &Value) -> Vec<String> {
    let turns = body["contents"].as_array().map_or(&[][..], Vec::as_slice);
    turns
        .iter()
        .filter(|turn| turn["role"] == "model")
        .flat_map(|turn| turn["parts"].as_array().into_iter().flatten())
        .filter(|part| part.get("functionCall").is_some())
        .filter(|part| {
            let expected = call_round(part).map(signature);
            part["thoughtSignature"].as_str() != expected.as_deref()
        })
        .map(|part| part["functionCall"].to_string())
        .collect()
}

/// A scripted Gemini 3 that reads (`Reader`) with `read_file` until `rounds`, then ends;
/// tells Gemini CLI's router the task is complex (so its default model answers); summarizes
/// slowly and keeps nothing.
async fn scripted_gemini(reader: Arc<Reader>, rounds: usize, pace: Pace) -> MockUpstream {
    let cache = PromptCache::provider();
    MockUpstream::start(handler(move |r| {
        let (reader, cache) = (reader.clone(), cache.clone());
        async move {
            let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let path = r.path_and_query.split('?').next().unwrap_or("");
            // The model is in the path: `/v1beta/models/{model}:{method}`.
            let model = path.rsplit('/').next().and_then(|m| m.split(':').next()).unwrap_or("");
            if path.ends_with(":countTokens") {
                let counted = PromptCache::provider().prompt_of("", model, &body);
                return json_response(200, &json!({"totalTokens": counted.prompt_tokens}));
            }
            // Usage as Gemini reports it (`PromptCache::provider`), each conversation (the
            // loop, the router's, the summarizer's) against its own previous request.
            let summarizing = is_summarizer_call(&r);
            let session = if summarizing { format!("summarizer {model}") } else { model.to_string() };
            let counted = cache.prompt_of(&session, model, &body);
            let mut usage = counted.gemini_usage(20);
            usage["thoughtsTokenCount"] = json!(30);
            if summarizing {
                tokio::time::sleep(pace.summarizer).await;
                return json_response(200, &gemini_reply(json!([{"text": lossy_summary(&body)}]), usage));
            }
            if !path.ends_with(":streamGenerateContent") {
                let choice = json!({"complexity_reasoning": "a multi-step investigation", "complexity_score": 90});
                return json_response(200, &gemini_reply(json!([{"text": choice.to_string()}]), usage));
            }
            let lost = unsigned_calls(&body);
            if !lost.is_empty() {
                return json_response(400, &json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                    "message": format!("Function call is missing a thought_signature in functionCall parts: {lost:?}")}}));
            }
            tokio::time::sleep(pace.model).await;
            let round = gemini_round(&body);
            let tools = body["tools"].to_string();
            let reads = tools.contains("\"read_file\"");
            let shell = tools.contains("\"run_shell_command\"");
            let answer = match reader.play(&body, round, rounds, reads) {
                Move::Recall { id, arguments } => {
                    json!({"functionCall": {"id": id, "name": "condenser_recall", "args": arguments}})
                }
                Move::Read(log) if shell && by_shell(round) => json!({"functionCall": {"name": "run_shell_command",
                    "args": {"command": shell_read(round, &reader.path(&log)),
                        "description": "List the rows, then read the next log"}},
                    "thoughtSignature": signature(round)}),
                Move::Read(log) => json!({"functionCall": {"name": "read_file", "args": {"file_path": reader.path(&log)}},
                    "thoughtSignature": signature(round)}),
                Move::Say(text) => json!({"text": text}),
            };
            let thought = gemini_reply(json!([{"text": "Reading the next log.", "thought": true}]),
                json!({"promptTokenCount": counted.prompt_tokens}));
            gemini_sse(&[thought, gemini_reply(json!([answer]), usage)])
        }
    }))
    .await
}

/// What Gemini demands: a user turn first, every function response turn right after the call
/// turn it answers, every call but the newest answered, and every call signed as the model
/// signed it.
fn valid_gemini(body: &Value) {
    let turns = body["contents"].as_array().unwrap();
    assert_eq!(turns[0]["role"], "user", "{:#}", turns[0]);
    let count = |turn: &Value, kind: &str| {
        turn["parts"].as_array().map_or(0, |parts| {
            parts.iter().filter(|p| p.get(kind).is_some()).count()
        })
    };
    for (i, turn) in turns.iter().enumerate() {
        let answers = count(turn, "functionResponse");
        if answers > 0 {
            assert_eq!(count(&turns[i - 1], "functionCall"), answers, "turn {i}");
        }
        if count(turn, "functionCall") > 0 && i + 1 < turns.len() {
            assert_eq!(
                count(&turns[i + 1], "functionResponse"),
                count(turn, "functionCall"),
                "turn {i}"
            );
        }
    }
    assert_eq!(
        unsigned_calls(body),
        Vec::<String>::new(),
        "signatures lost"
    );
}

/// Runs Gemini CLI headless in `dir` against `base`, with `home` as its home.
async fn gemini_cli(dir: &Path, home: &Path, base: &str, prompt: &str) {
    let settings = json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "model": {"compressionThreshold": 1.0, "disableLoopDetection": true},
    });
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(home.join(".gemini/settings.json"), settings.to_string()).unwrap();
    let program = node_modules("gemini").join(".bin/gemini");
    let output = tokio::process::Command::new(&program)
        .args(["-p", prompt, "--output-format", "json"])
        .current_dir(dir)
        .env("HOME", home)
        .env("GOOGLE_GEMINI_BASE_URL", base)
        .env("GEMINI_API_KEY", "AIza-agent-test-key")
        .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{program:?}: {e} (scripts/test.sh installs it)"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("Done with"),
        "gemini exited {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A Gemini CLI session of `ROUNDS` rounds at `pace`, the question asked with the task,
/// judged whole: every body valid with its signatures, within the hard limit, none waiting,
/// no avoidable cache break, the opening turn pinned, and every identifier read still in the
/// last request.
async fn gemini_cli_session(pace: Pace) {
    let stack = Stack::start(
        Box::new(move |reader| Box::pin(scripted_gemini(reader, ROUNDS, pace))),
        (GEMINI_CLI_MODEL, GEMINI_WINDOW),
        GEMINI_LOOP,
        pace,
        false,
    )
    .await;
    let (work, home, front) = (stack.work.path(), stack.home.path(), stack.front.url());
    // Resumed (`--resume latest`), 0.61.0 sends each function response of the last rounds
    // twice, which Gemini refuses: the question goes with the task.
    gemini_cli(work, home, &front, &task_asking()).await;
    let (exchanges, _) = stack.judged::<Gemini>(&Session {
        client: format!("Gemini CLI 0.61.0 at {pace:?}"),
        reuse_held: REUSE_GOAL,
        pace,
        path: GEMINI_LOOP,
        model: GEMINI_CLI_MODEL,
        round_of: gemini_round,
        cache_order: &["tools", "systemInstruction", "contents"],
        valid: valid_gemini,
        reserve: no_reserve,
    });
    // The router's requests went through too, to their own model.
    let routed = stack
        .upstream
        .recorded()
        .iter()
        .filter(|r| r.path_and_query.contains("flash-lite:generateContent"))
        .count();
    assert!(routed >= 1, "no routing request");
    let last = exchanges.last().unwrap().body.to_string();
    for (_, id) in PLANTED {
        assert!(last.contains(id), "{id} lost by the last request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_compacts_well_through_condenser() {
    gemini_cli_session(REALISTIC).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_at_an_instant_pace_keeps_its_recent_work_whole() {
    gemini_cli_session(INSTANT).await;
}
