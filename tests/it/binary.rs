//! The `condenser` binary itself: commands, logs, and SIGTERM.

use std::collections::BTreeMap;
use std::process::Stdio;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_condenser");

fn write_config(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn run(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("CONDENSER_CONFIG")
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .await
        .unwrap();
    drop(input);
    let output = within("command", child.wait_with_output()).await.unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_config_accepts_the_shipped_file_and_names_bad_keys() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml");
    let (code, stdout, _) = run(&["check-config", shipped], None).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("trigger_ratio = 0.8"), "{stdout}");
    let dir = tempfile::tempdir().unwrap();
    let bad = write_config(&dir, "[context]\nkeep_recent = 3\n");
    let (code, _, stderr) = run(&["check-config", bad.to_str().unwrap()], None).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("keep_recent"), "{stderr}");
    let bad = write_config(&dir, "[context]\ntarget_ratio = 0.95\n");
    let (code, _, stderr) = run(&["check-config", bad.to_str().unwrap()], None).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("target_ratio"), "{stderr}");
    // Secrets: Redis's password is shown masked; credentials in an upstream URL are refused,
    // naming the key and not the password.
    let redis = write_config(
        &dir,
        "[cache]\nredis_url = \"redis://app:hunter2@cache:6379/0\"\n",
    );
    let (code, stdout, _) = run(&["check-config", redis.to_str().unwrap()], None).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("redis://app:****@cache:6379/0"), "{stdout}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    let upstream = write_config(&dir, "[upstream]\nbase_url = \"http://u:hunter2@up\"\n");
    let (code, stdout, stderr) = run(&["check-config", upstream.to_str().unwrap()], None).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("upstream.base_url"), "{stderr}");
    assert!(
        !stderr.contains("hunter2") && !stdout.contains("hunter2"),
        "{stderr}"
    );
}

/// `config` flattened to its keys (`section.key`, `routes[0].models`), each with its value.
/// A section that holds no key (`[models]`, `[profiles]` and, at the top, the empty list of
/// `[[routes]]`) adds none.
fn keys_of(config: &str) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, value, out);
                }
            }
            toml::Value::Array(items) if items.iter().all(toml::Value::is_table) => {
                for (i, item) in items.iter().enumerate() {
                    walk(&format!("{prefix}[{i}]"), item, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", &toml::from_str(config).unwrap(), &mut out);
    out
}

#[tokio::test]
async fn the_shipped_config_holds_every_key_check_config_prints_with_its_default() {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let empty = write_config(&dir, "");
    let (code, defaults, _) = run(&["check-config", empty.to_str().unwrap()], None).await;
    assert_eq!(code, 0);
    let (printed, listed) = (keys_of(&defaults), keys_of(&shipped));
    for (key, value) in &printed {
        assert_eq!(listed.get(key), Some(value), "{key} in config.toml");
    }
    for (key, value) in &listed {
        assert_eq!(
            printed.get(key),
            Some(value),
            "{key}: not a key condenser has"
        );
    }
    // The sections empty by default are commented examples; uncommented, every key in them is
    // one condenser takes, and prints back.
    let examples: String = shipped
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(example)
                if example.starts_with('[')
                    || example.split_once(" = ").is_some_and(|(key, _)| {
                        key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
            {
                example
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(examples.contains("\n[[routes]]"), "{examples}");
    let uncommented = write_config(&dir, &examples);
    let (code, effective, stderr) =
        run(&["check-config", uncommented.to_str().unwrap()], None).await;
    assert_eq!(code, 0, "{stderr}");
    let effective = keys_of(&effective);
    for (key, value) in keys_of(&examples) {
        assert_eq!(effective.get(&key), Some(&value), "{key}");
    }
    assert!(effective.contains_key("profiles.research.recall.enabled"));
}

#[tokio::test]
async fn check_config_warns_of_a_window_too_small_for_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(
        &["check-config", write_config(&dir, "").to_str().unwrap()],
        None,
    )
    .await;
    assert_eq!(code, 0);
    assert!(!stderr.contains("leaves less room"), "{stderr}");
    let small = write_config(
        &dir,
        "[models.\"llama-local\"]\ncontext_window = 1000\n[tokens]\ndefault_context_window = 4096\n",
    );
    let (code, stdout, stderr) = run(&["check-config", small.to_str().unwrap()], None).await;
    assert_eq!(code, 0, "valid: it compacts, in the room there is");
    assert!(stdout.contains("context_window = 1000"), "{stdout}");
    for said in [
        "models.\"llama-local\".context_window = 1000 leaves less room than the settings need",
        "reserves 500 tokens for its reply (at most half the window), not response_reserve_tokens = 4096",
        "a summary gets at most 125 tokens (half the compacted prompt's target of 250), not max_summary_tokens = 1024",
        "recall is not offered",
        "tokens.default_context_window = 4096 leaves less room",
        "a summary gets at most 512 tokens",
    ] {
        assert!(stderr.contains(said), "{said:?} in {stderr}");
    }
    assert_eq!(
        stderr.matches("recall is not offered").count(),
        1,
        "{stderr}"
    );
}

#[tokio::test]
async fn errors_name_the_file_or_the_flag_and_logs_are_plain_text_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let (code, _, stderr) = run(&["count", missing.to_str().unwrap()], None).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cannot read") && stderr.contains("missing.json"),
        "{stderr}"
    );
    let body = chat_body(&conversation(3)).to_string();
    let (code, _, stderr) = run(&["plan", "--profile", "nope"], Some(&body)).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("--profile nope: the config has no [profiles.nope] (it has: none)")
            && !stderr.contains("invalid config"),
        "{stderr}"
    );
    // No system message: no head to keep, and no line saying "keep head 0..0".
    let headless: Vec<Value> = conversation(40).into_iter().skip(1).collect();
    let (code, stdout, _) = run(
        &["plan", "--mode", "force"],
        Some(&chat_body(&headless).to_string()),
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("summarize      messages 0..") && !stdout.contains("keep head"),
        "{stdout}"
    );
    // Standard error is a pipe here, as a file or a log collector is: an unknown model's
    // warning comes without colour codes.
    let (code, _, stderr) = run(&["count", "--model", "no-such-model-7"], Some(&body)).await;
    assert_eq!(code, 0);
    assert!(
        stderr.contains("WARN") && stderr.contains("unknown model") && !stderr.contains('\u{1b}'),
        "{stderr:?}"
    );
}

/// Every form of Redis URL takes a password somewhere; check-config shows none of them.
#[tokio::test]
async fn check_config_masks_the_password_in_every_form_of_redis_url() {
    let dir = tempfile::tempdir().unwrap();
    for (url, shown) in [
        (
            "redis+unix:///run/redis.sock?db=0&pass=hunter2",
            "redis+unix:///run/redis.sock?db=0&pass=****",
        ),
        ("rediss://:hunter2@cache:6380", "rediss://:****@cache:6380"),
        ("redis://hunter2@cache", "redis://****@cache"),
    ] {
        let config = write_config(&dir, &format!("[cache]\nredis_url = \"{url}\"\n"));
        let (code, stdout, stderr) = run(&["check-config", config.to_str().unwrap()], None).await;
        assert_eq!(code, 0, "{url}: {stderr}");
        assert!(stdout.contains(shown), "{url}: {stdout}");
        assert!(
            !stdout.contains("hunter2") && !stderr.contains("hunter2"),
            "{stdout}"
        );
    }
}

#[tokio::test]
async fn count_and_plan_read_a_request_from_stdin_or_a_file() {
    let body = chat_body(&conversation(40)).to_string();
    let (code, stdout, _) = run(&["count"], Some(&body)).await;
    assert_eq!(code, 0);
    let plain: u64 = stdout.trim().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("request.json");
    std::fs::write(&file, &body).unwrap();
    let (code, stdout, _) = run(
        &[
            "count",
            "--json",
            "--model",
            "gpt-4",
            file.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_eq!(code, 0);
    let counted: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(counted["model"], "gpt-4");
    assert_eq!(counted["encoding"], "cl100k_base");
    assert_eq!(counted["messages"], 81);
    assert!(counted["prompt_tokens"].as_u64().unwrap() > 8_000);
    assert!(plain > 8_000);

    let config = write_config(&dir, "[models.\"gpt-4o\"]\ncontext_window = 8000\n");
    let (code, stdout, _) = run(
        &[
            "plan",
            "--config",
            config.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("decision: compact"), "{stdout}");
    assert!(
        stdout.contains("trigger_ratio") && stdout.contains("← over"),
        "{stdout}"
    );
    assert!(stdout.contains("summarize      messages 1.."), "{stdout}");
    let (code, stdout, _) = run(&["plan", "--mode", "off", file.to_str().unwrap()], Some("")).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("decision: forward unchanged"), "{stdout}");
    let (code, _, stderr) = run(&["count"], Some("{\"model\": 1}")).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("model"), "{stderr}");
}

#[tokio::test]
async fn count_and_plan_read_every_dialects_body_detected_or_named() {
    let text = filler(1, 40);
    let responses = json!({"model": "gpt-4o", "instructions": SYSTEM_PROMPT, "input": [
        {"role": "user", "content": text},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": text},
    ]});
    let messages = json!({"model": "gpt-4o", "max_tokens": 100, "system": SYSTEM_PROMPT,
        "messages": [{"role": "user", "content": text}]});
    let chat = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]});
    let count = |args: &'static [&'static str], body: &Value| {
        let body = body.to_string();
        async move {
            let (code, stdout, stderr) = run(args, Some(&body)).await;
            assert_eq!(code, 0, "{stderr}");
            serde_json::from_str::<Value>(&stdout).unwrap()
        }
    };
    let counted = count(&["count", "--json"], &responses).await;
    assert_eq!(counted["messages"], 3, "three input items: {counted}");
    let named = count(&["count", "--json", "--api", "responses"], &responses).await;
    assert_eq!(counted, named);
    let anthropic = count(&["count", "--json"], &messages).await;
    assert_eq!(
        anthropic["messages"], 1,
        "the system is the head, not a message"
    );
    let as_chat = count(&["count", "--json"], &chat).await;
    assert_eq!(as_chat["messages"], 2);
    // The same words as system plus user: Anthropic counts its `system` apart, chat as a
    // message; either way the prompt holds both.
    let (a, c) = (
        anthropic["prompt_tokens"].as_u64().unwrap(),
        as_chat["prompt_tokens"].as_u64().unwrap(),
    );
    assert!(a > 40 && c > 40 && a.abs_diff(c) < 10, "{a} vs {c}");
    // A chat body read as Anthropic's: its system message is an item of its own, as a
    // mid-conversation system turn is.
    let as_messages = count(&["count", "--api", "messages", "--json"], &chat).await;
    assert_eq!(as_messages["messages"], 2);
    let (code, stdout, _) = run(&["plan"], Some(&responses.to_string())).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("prompt") && stdout.contains("in 3 messages"),
        "{stdout}"
    );
    // Gemini names its model in the path: `--model` names it here. `systemInstruction` is the
    // head; a signed call and its response are two turns.
    let gemini = json!({"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}, "contents": [
        {"role": "user", "parts": [{"text": text}]},
        {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}, "thoughtSignature": "c2ln"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": text}}}]},
    ]});
    let detected = count(&["count", "--json", "--model", "gemini-2.5-pro"], &gemini).await;
    let named = count(
        &[
            "count",
            "--json",
            "--api",
            "gemini",
            "--model",
            "gemini-2.5-pro",
        ],
        &gemini,
    )
    .await;
    assert_eq!(detected, named);
    assert_eq!(named["messages"], 3, "{named}");
    assert_eq!(named["model"], "gemini-2.5-pro");
    assert!(named["prompt_tokens"].as_u64().unwrap() > 80, "{named}");
    let (code, stdout, _) = run(
        &["plan", "--api", "gemini", "--model", "gemini-2.5-pro"],
        Some(&gemini.to_string()),
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("model gemini-2.5-pro") && stdout.contains("in 3 messages"),
        "{stdout}"
    );
}

/// Starts the binary with JSON logs; returns it, its address and its log lines.
async fn serve(
    upstream: &str,
    dir: &tempfile::TempDir,
) -> (Child, String, mpsc::UnboundedReceiver<Value>) {
    serve_as(Command::new(BIN), "", upstream, dir).await
}

/// Starts the binary by `command` (which runs it with the arguments it is given), with
/// `server` settings added to the shipped ones.
async fn serve_as(
    mut command: Command,
    server: &str,
    upstream: &str,
    dir: &tempfile::TempDir,
) -> (Child, String, mpsc::UnboundedReceiver<Value>) {
    let config = write_config(
        dir,
        &format!("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_secs = 20\n{server}"),
    );
    let mut child = command
        .args([
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            upstream,
            "--log-format",
            "json",
        ])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let parsed: Value = serde_json::from_str(&line)
                .unwrap_or_else(|_| panic!("log line is not JSON: {line}"));
            if tx.send(parsed).is_err() {
                return;
            }
        }
    });
    let addr = loop {
        let line = within("listening line", rx.recv()).await.unwrap();
        if line["message"] == "condenser listening" {
            break line["addr"].as_str().unwrap().to_string();
        }
    };
    (child, addr, rx)
}

#[tokio::test]
async fn one_json_log_line_per_request_without_prompt_or_key() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr, mut logs) = serve(&upstream.url(), &dir).await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "my secret plan is PINEAPPLE-42"}]});
    let response = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-very-secret-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    let line = loop {
        let line = within("request log line", logs.recv()).await.unwrap();
        if line["message"] == "chat completion" {
            break line;
        }
    };
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["model"], "gpt-4o");
    assert_eq!(line["status"], 200);
    assert_eq!(line["action"], "forwarded");
    assert_eq!(line["completion_tokens"], 4);
    for field in [
        "prompt_tokens",
        "forwarded_tokens",
        "upstream_ms",
        "overhead_ms",
        "path",
        "method",
    ] {
        assert!(line.get(field).is_some(), "{field} missing from {line}");
    }
    let text = line.to_string();
    assert!(
        !text.contains("PINEAPPLE") && !text.contains("sk-very-secret"),
        "{text}"
    );
    child.kill().await.unwrap();
}

#[tokio::test]
async fn sigterm_lets_a_stream_in_flight_finish() {
    let upstream = mock_llm(LlmBehaviour {
        chat_latency: std::time::Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr, mut logs) = serve(&upstream.url(), &dir).await;
    let body =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let request = tokio::spawn(async move {
        let response = client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let mut text = String::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        text
    });
    // Wait until the request is in flight (upstream has it), then SIGTERM.
    within("request reaches upstream", async {
        while upstream.recorded().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let pid = child.id().unwrap().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let text = within("stream after SIGTERM", request).await.unwrap();
    assert!(
        text.contains("reply") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let exit = within("exit after drain", child.wait()).await.unwrap();
    assert!(exit.success(), "{exit:?}");
    let mut drained = false;
    // The channel closes once the exited process's stderr is read to its end.
    while let Some(line) = within("log lines", logs.recv()).await {
        drained |= line["message"] == "drained";
    }
    assert!(drained, "the server said it drained");
}

/// condenser with one worker, run under the shell's `ulimits`, 16 clients holding a
/// connection to it (two descriptors each, beside 64 it keeps for itself); and what a 17th
/// client asking for `/healthz` gets.
struct Crowded {
    seventeenth: reqwest::Response,
    held: Vec<tokio::net::TcpStream>,
    addr: String,
    child: Child,
    /// What condenser needs for as long as it runs: its upstream, its config's folder, and
    /// its log lines read.
    _upstream: MockUpstream,
    _dir: tempfile::TempDir,
    _logs: mpsc::UnboundedReceiver<Value>,
}

async fn crowded(ulimits: &str) -> Crowded {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut limited = Command::new("sh");
    limited.args(["-c", &format!("{ulimits} && exec \"$0\" \"$@\""), BIN]);
    let (child, addr, logs) = serve_as(limited, "workers = 1\n", &upstream.url(), &dir).await;
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // A request on each held connection would wait for its upstream; one answered shows they
    // were all accepted before the next client comes.
    let mut last = held.pop().unwrap();
    last.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tokio::io::AsyncReadExt::read_exact(&mut last, &mut answer)
        .await
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    held.push(last);
    let seventeenth = client()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    Crowded {
        seventeenth,
        held,
        addr,
        child,
        _upstream: upstream,
        _dir: dir,
        _logs: logs,
    }
}

/// Run with an open-files limit of 96, condenser serves 16 client connections: the 17th
/// client gets a clear 503 at once, and once the others leave, the next is served.
#[tokio::test]
async fn a_client_past_the_open_files_limit_gets_a_clear_503_and_the_next_is_served() {
    let mut crowded = crowded("ulimit -n 96").await;
    let refused = crowded.seventeenth;
    assert_eq!(refused.status(), 503);
    assert_eq!(header(&refused, "retry-after"), "1");
    let error: Value = refused.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("16 connections") && message.contains("open-files limit"),
        "{message}"
    );
    drop(crowded.held);
    let addr = &crowded.addr;
    let served = within("a place freed", async {
        loop {
            let response = client()
                .get(format!("http://{addr}/healthz"))
                .send()
                .await
                .unwrap();
            if response.status() == 200 {
                break response;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(served.status(), 200);
    crowded.child.kill().await.unwrap();
}

/// Started with a soft open-files limit of 96 under a hard one of 400, condenser raises the
/// soft limit to the hard one: the 17th client, whom 96 descriptors would refuse (the test
/// above), is served.
#[tokio::test]
async fn the_soft_open_files_limit_is_raised_to_the_hard_one_at_start_up() {
    let mut crowded = crowded("ulimit -S -n 96 && ulimit -H -n 400").await;
    assert_eq!(
        crowded.seventeenth.status(),
        200,
        "the 17th client was refused"
    );
    drop(crowded.held);
    crowded.child.kill().await.unwrap();
}

/// The allocator asks for no transparent huge pages: with them (mimalloc's default, honoured
/// on hosts whose THP setting is "madvise"), a 2 MiB page stayed resident while any block in
/// it was live, and 9,000 open streams peaked at 614.5 MB resident instead of 425.0 MB
/// (bench/streams.sh). The advice shows as the `hg` flag of a mapping in smaps.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_server_asks_for_no_huge_pages() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (child, _addr, _logs) = serve(&upstream.url(), &dir).await;
    let pid = child.id().unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let advised: Vec<&str> = smaps
        .lines()
        .filter(|line| line.starts_with("VmFlags:"))
        .filter(|line| line.split_whitespace().any(|flag| flag == "hg"))
        .collect();
    assert!(smaps.contains("VmFlags:"), "smaps without flags: {smaps}");
    assert!(
        advised.is_empty(),
        "mappings advised for huge pages: {advised:?}"
    );
}

/// An HTTPS upstream on port 0 with the test CA's certificate for localhost, offering
/// `offered` by ALPN, as a provider's API does; it answers a chat completion and sends, for
/// each request, the protocol ALPN settled on and the HTTP version the request came in.
async fn tls_upstream(offered: &[&[u8]]) -> (String, mpsc::UnboundedReceiver<(String, String)>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let certs = CertificateDer::pem_file_iter("tests/tls/localhost.pem")
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file("tests/tls/localhost.key").unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    config.alpn_protocols = offered.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let alpn = tls
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_else(|| "none".into());
                let answer = hyper::service::service_fn(move |request: hyper::Request<_>| {
                    let _ = tx.send((alpn.clone(), format!("{:?}", request.version())));
                    async move {
                        let _ = http_body_util::BodyExt::collect(request.into_body()).await;
                        Ok::<_, std::convert::Infallible>(json_response(
                            200,
                            &completion("hello over TLS", 10, 3),
                        ))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), answer)
                .await;
            });
        }
    });
    (url, rx)
}

/// condenser, as shipped and run, speaks HTTP/2 to a TLS upstream that offers it by ALPN
/// beside HTTP/1.1, as providers' APIs do (the spec: HTTP/2 by default where offered); and
/// HTTP/1.1 to one that offers only that.
#[tokio::test]
async fn the_binary_speaks_http2_to_a_tls_upstream_that_offers_it_by_alpn() {
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/ca.pem");
    for (offered, alpn, version) in [
        (&[&b"h2"[..], b"http/1.1"][..], "h2", "HTTP/2.0"),
        (&[&b"http/1.1"[..]][..], "http/1.1", "HTTP/1.1"),
    ] {
        let (upstream, mut seen) = tls_upstream(offered).await;
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(BIN);
        command.env("SSL_CERT_FILE", ca);
        let (mut child, addr, _logs) = serve_as(command, "", &upstream, &dir).await;
        let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
        let response = client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "hello over TLS");
        let (settled, arrived) = within("the upstream's request", seen.recv()).await.unwrap();
        assert_eq!(
            (settled.as_str(), arrived.as_str()),
            (alpn, version),
            "offered {offered:?}"
        );
        child.kill().await.unwrap();
    }
}

/// check-config says which APIs each upstream speaks (a provider's host however written) and
/// whose key pays for summaries, and warns of a dedicated summarizer with no key (issue 55,
/// items 4 and 7).
#[tokio::test]
async fn check_config_says_what_each_upstream_speaks_and_whose_key_a_summarizer_uses() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        &dir,
        "[upstream]\nbase_url = \"https://API.OPENAI.COM.\"\n\
         [[routes]]\nmodels = [\"claude-*\"]\nbase_url = \"http://127.0.0.1:4000\"\n\
         [[routes]]\nmodels = [\"gemini-*\"]\nbase_url = \"http://127.0.0.1:4001\"\napis = [\"gemini\"]\n\
         [summarizer]\nbase_url = \"http://127.0.0.1:11434\"\napi = \"chat\"\n",
    );
    let (code, stdout, stderr) = run(&["check-config", config.to_str().unwrap()], None).await;
    assert_eq!(code, 0, "{stderr}");
    for said in [
        "# upstream https://API.OPENAI.COM. speaks: chat, responses (its host's)",
        "# routes[0] http://127.0.0.1:4000 speaks: any API",
        "# routes[1] http://127.0.0.1:4001 speaks: gemini\n",
        "# summarizer key: none (http://127.0.0.1:11434 is a dedicated summarizer, and a caller's key never goes to one)",
    ] {
        assert!(stdout.contains(said), "{said:?} in {stdout}");
    }
    assert!(
        stderr.contains("has no summarizer.api_key_env: summaries are asked with no key"),
        "{stderr}"
    );
    // What it prints is still a configuration that reads back.
    let printed = write_config(&dir, &stdout);
    let (code, _, stderr) = run(&["check-config", printed.to_str().unwrap()], None).await;
    assert_eq!(code, 0, "{stderr}");

    let own = write_config(
        &dir,
        "[summarizer]\nbase_url = \"http://127.0.0.1:11434\"\napi_key_env = \"SUMMARIZER_KEY\"\n",
    );
    let (code, stdout, stderr) = run(&["check-config", own.to_str().unwrap()], None).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("# summarizer key: its own, from $SUMMARIZER_KEY; never a caller's"),
        "{stdout}"
    );
    assert!(!stderr.contains("no summarizer.api_key_env"), "{stderr}");
    let (_, stdout, _) = run(
        &["check-config", write_config(&dir, "").to_str().unwrap()],
        None,
    )
    .await;
    assert!(
        stdout.contains("# summarizer key: the caller's, as a summary goes to the upstream the caller's request went to"),
        "{stdout}"
    );
}
