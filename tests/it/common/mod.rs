//! Test harness: mock upstreams and condenser itself, in-process on port 0, over real HTTP.

mod breaks;
mod dialects;
mod gemini;
mod logs;
mod prompt_cache;

pub use breaks::{cache_figures, texts, CacheFigures, Sent, Thresholds};
pub use dialects::*;
pub use gemini::*;
pub use logs::captured_logs;
pub use prompt_cache::{CachedPrompt, PromptCache};

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use condenser::transport::body::{full, ProxyBody};
use condenser::{AppState, Config, Server};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

pub type Handler = Arc<
    dyn Fn(Recorded) -> Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>> + Send + Sync,
>;

pub struct MockUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
}

impl MockUpstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// The summarizer's calls, in order.
    pub fn summarizer_calls(&self) -> Vec<Recorded> {
        self.recorded()
            .into_iter()
            .filter(is_summarizer_call)
            .collect()
    }

    /// The bodies of the requests condenser forwarded: every call but the summarizer's.
    pub fn forwarded(&self) -> Vec<Value> {
        self.recorded()
            .iter()
            .filter(|r| !is_summarizer_call(r))
            .map(Recorded::json)
            .collect()
    }

    pub async fn start(handler: Handler) -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        let seen = seen.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let recorded = Recorded {
                                method: parts.method.to_string(),
                                path_and_query: parts
                                    .uri
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default(),
                                headers: parts.headers,
                                body,
                            };
                            seen.lock().unwrap().push(recorded.clone());
                            Ok::<_, Infallible>(handler(recorded).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        MockUpstream { addr, requests }
    }
}

pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Recorded) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    Arc::new(move |r| Box::pin(f(r)))
}

pub fn json_response(status: u16, body: &Value) -> Response<ProxyBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(Bytes::from(body.to_string())))
        .unwrap()
}

/// A chat completion answering `text`, with usage.
pub fn completion(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    })
}

pub struct Proxy {
    pub addr: SocketAddr,
    /// The admin listener's, when `[admin] listen` is set.
    pub admin: Option<SocketAddr>,
    pub state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(mut config: Config) -> Proxy {
        config.server.listen = "127.0.0.1:0".into();
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr();
        let admin = server.admin_addr();
        let state = server.state();
        let (tx, rx) = oneshot::channel();
        let served = tokio::spawn(server.serve(async {
            let _ = rx.await;
        }));
        Proxy {
            addr,
            admin,
            state,
            shutdown: Some(tx),
            served,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub fn config_for(upstream: &str) -> Config {
    let mut config = Config::default();
    config.upstream.base_url = upstream.to_string();
    config
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Fails the test instead of hanging when `f` does not finish in time.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The value of a metric series, e.g. `condenser_requests_total{route="chat_completions",status="200"}`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

/// Decides, per summarizer call (e.g. by its caller's key), a status and body to answer it with.
pub type SummarizerError = Arc<dyn Fn(&Recorded) -> Option<(u16, Value)> + Send + Sync>;

/// How the mock LLM behaves: chat answers and summarizer calls.
#[derive(Clone, Default)]
pub struct LlmBehaviour {
    pub chat_latency: Duration,
    pub summarizer_latency: Duration,
    /// Summarizer calls answer this status instead of a summary.
    pub summarizer_status: Option<u16>,
    /// Summarizer calls for which this gives an answer get it instead of a summary.
    pub summarizer_error: Option<SummarizerError>,
    /// The summarizer keeps nothing of what it is sent: only code can carry identifiers.
    pub lossy_summarizer: bool,
    /// A request with more messages (input items, contents) than this is answered 400 with
    /// this body, by `mock_llm`, `mock_responses_llm`, `mock_claude` and the Gemini of
    /// `Fixture::upstream`: the model's real window is smaller than condenser was told.
    pub too_long: Option<(usize, Value)>,
    /// Replies report usage as providers do, from this cache: the prompt's tokens, and of them
    /// those it shares with the previous request as cached. Read by `mock_llm`'s chat answers
    /// and by the answers `mock_responses_llm` and `mock_claude` (through `llm`) give
    /// themselves; without it, their fixed counts and no cached tokens (Claude's: 3).
    pub prompt_cache: Option<PromptCache>,
}

/// What a summarizer that keeps nothing but the task answers (a weak model keeps the task's
/// id, and condenser refuses a summary that drops it): the asked sections, the task's
/// identifiers (`task_named`), nothing of the tools' outputs.
pub fn lossy_summary(request: &Value) -> String {
    format!(
        "{GOAL_HEADING}{}\n## Artifacts\nnone\n## Next step\nnone",
        task_named(request)
    )
}

/// The goal's heading in the mock summaries, which an extension reads its task back under.
const GOAL_HEADING: &str = "## Goal and constraints\n";

/// The pinned task as a summary names it, whichever prompt was pinned: the first identifiers
/// of each message a user typed in what the summarizer is sent (not tool results), or the
/// goal line of the summary it extends; "keep going" when none names any.
fn task_named(request: &Value) -> String {
    let mut typed: Vec<String> = Vec::new();
    if let Some((_, before)) = session_question(request) {
        for item in before.iter().filter(|item| item["role"] == "user") {
            let mut text = String::new();
            match &item["content"] {
                Value::String(said) => text.push_str(said),
                Value::Array(blocks) => blocks
                    .iter()
                    .filter(|block| matches!(block["type"].as_str(), Some("text" | "input_text")))
                    .for_each(|block| strings_of(&block["text"], &mut text)),
                _ => {}
            }
            if let Some(parts) = item["parts"].as_array() {
                parts
                    .iter()
                    .for_each(|part| strings_of(&part["text"], &mut text));
            }
            typed.push(text);
        }
    } else {
        let prompt = summarizer_prompt(request);
        if let Some(goal) = prompt.split(GOAL_HEADING).nth(1) {
            return goal.lines().next().unwrap_or("").to_string();
        }
        // A user block that carries a tool's result (Claude's tool_result turns) is no
        // prompt anyone typed.
        typed.extend(
            prompt
                .split("### user\n")
                .skip(1)
                .map(|said| said.split("\n\n### ").next().unwrap_or("").to_string())
                .filter(|said| !said.starts_with("[tool result")),
        );
    }
    let mut named: Vec<String> = Vec::new();
    for said in &typed {
        let task = json!({"role": "user", "content": said});
        for id in condenser::compaction::summary_check::task_identifiers([&task]) {
            if !named.contains(&id) {
                named.push(id);
            }
        }
    }
    match named.is_empty() {
        true => "keep going".to_string(),
        false => named.join(", "),
    }
}

/// A transcript containing this makes the mock summarizer fail.
pub const FAIL_SUMMARY: &str = "FAIL-THIS-SUMMARY";
/// A chat request with this `user` gets a 500 from the mock.
pub const ERROR_USER: &str = "make-an-error";

pub const SUMMARIZER_MARKER: &str = "You compress the earlier part";

/// Whether a summarizer's instructions are where some API puts them: a chat system message,
/// the Responses `instructions`, Anthropic's `system`, Gemini's `systemInstruction`.
fn has_summarizer_instructions(body: &Value) -> bool {
    [
        &body["messages"][0]["content"],
        &body["instructions"],
        &body["system"],
        &body["systemInstruction"]["parts"][0]["text"],
    ]
    .into_iter()
    .filter_map(Value::as_str)
    .any(|text| text.starts_with(SUMMARIZER_MARKER))
}

pub fn is_summarizer_call(r: &Recorded) -> bool {
    serde_json::from_slice::<Value>(&r.body)
        .is_ok_and(|b| has_summarizer_instructions(&b) || session_question(&b).is_some())
}

/// A summary asked through the session (`summarizer.via`): the session's own request with a
/// last user turn that asks it, in any of the four APIs. The question, and the conversation
/// before it.
pub fn session_question(request: &Value) -> Option<(&str, &[Value])> {
    let conversation = ["messages", "input", "contents"]
        .iter()
        .find_map(|field| request[field].as_array())?;
    let (last, before) = conversation.split_last()?;
    let text = [
        &last["content"],
        &last["content"][0]["text"],
        &last["parts"][0]["text"],
    ]
    .into_iter()
    .find_map(Value::as_str)?;
    text.starts_with(SUMMARIZER_MARKER)
        .then_some((text, before))
}

/// How many of the conversation's last items a summary asked through the session leaves out,
/// as its question says.
pub fn left_out(question: &str) -> usize {
    let after = question.split("except the last ").nth(1).unwrap_or("0");
    after
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Every text in `value`, a line each.
fn strings_of(value: &Value, out: &mut String) {
    match value {
        Value::String(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|item| strings_of(item, out)),
        Value::Object(fields) => fields.values().for_each(|field| strings_of(field, out)),
        _ => {}
    }
}

/// The transcript a summarizer call sends, in any of the four APIs: asked apart, its user
/// text; asked through the session, the texts of the items it covers, instructions included.
pub fn summarizer_prompt(request: &Value) -> Cow<'_, str> {
    if let Some((question, before)) = session_question(request) {
        let covered = &before[..before.len().saturating_sub(left_out(question))];
        let mut out = String::new();
        for field in ["system", "instructions", "systemInstruction"] {
            strings_of(&request[field], &mut out);
        }
        covered.iter().for_each(|item| strings_of(item, &mut out));
        return Cow::Owned(out);
    }
    Cow::Borrowed(
        [
            &request["messages"][1]["content"],
            &request["input"],
            &request["messages"][0]["content"],
            &request["contents"][0]["parts"][0]["text"],
        ]
        .into_iter()
        .find_map(Value::as_str)
        .filter(|text| !text.starts_with(SUMMARIZER_MARKER))
        .unwrap_or(""),
    )
}

/// A summarizer's answer in the API of the path it was asked on.
pub fn summary_reply(path: &str, text: &str) -> Value {
    match path {
        "/v1/responses" => json!({
            "id": "resp_summary", "object": "response", "status": "completed",
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 100, "output_tokens": 60},
        }),
        "/v1/messages" => json!({
            "id": "msg_summary", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 100, "output_tokens": 60},
        }),
        gemini if gemini.ends_with(":generateContent") => gemini_reply(
            json!([{"text": text}]),
            json!({"promptTokenCount": 100, "candidatesTokenCount": 60}),
        ),
        _ => completion(text, 100, 60),
    }
}

/// The mock summarizer keeps every line that mentions a FACT, from the existing summary and
/// the new transcript: a faithful model, deterministic.
fn mock_summary(request: &Value) -> String {
    let prompt = summarizer_prompt(request);
    let mut facts: Vec<&str> = Vec::new();
    for line in prompt.lines() {
        for piece in line.split(". ") {
            if piece.contains("FACT") && !facts.contains(&piece.trim()) {
                facts.push(piece.trim());
            }
        }
    }
    format!(
        "{GOAL_HEADING}{}\n## Facts and identifiers\n{}\n## Next step\nnone",
        task_named(request),
        facts.join("\n")
    )
}

/// An upstream that is both the chat model and the summarizer, streaming when asked.
pub async fn mock_llm(behaviour: LlmBehaviour) -> MockUpstream {
    MockUpstream::start(handler(move |r| {
        let behaviour = behaviour.clone();
        async move {
            let request: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if is_summarizer_call(&r) {
                tokio::time::sleep(behaviour.summarizer_latency).await;
                if let Some((status, body)) = behaviour.summarizer_error.as_ref().and_then(|f| f(&r)) {
                    return json_response(status, &body);
                }
                let poisoned = summarizer_prompt(&request).contains(FAIL_SUMMARY);
                if let Some(status) = behaviour.summarizer_status.or(poisoned.then_some(500)) {
                    return json_response(status, &json!({"error": {"message": "summarizer down"}}));
                }
                let path = r.path_and_query.split('?').next().unwrap_or("");
                let summary = if behaviour.lossy_summarizer {
                    lossy_summary(&request)
                } else {
                    mock_summary(&request)
                };
                return json_response(200, &summary_reply(path, &summary));
            }
            tokio::time::sleep(behaviour.chat_latency).await;
            if let Some(error) = too_long(&behaviour, &request["messages"]) {
                return json_response(400, error);
            }
            if request["user"] == ERROR_USER {
                return json_response(500, &json!({"error": {"message": "upstream broke", "type": "server_error"}}));
            }
            let reply = format!("reply to {} messages", request["messages"].as_array().map_or(0, Vec::len));
            let usage = chat_usage(behaviour.prompt_cache.as_ref(), &request);
            if request["stream"] == json!(true) {
                let mut events = String::new();
                for word in reply.split(' ') {
                    let chunk = json!({"choices": [{"index": 0, "delta": {"content": format!("{word} ")}}]});
                    events.push_str(&format!("data: {chunk}\n\n"));
                }
                if request["stream_options"]["include_usage"] == json!(true) {
                    let usage = json!({"choices": [], "usage": usage});
                    events.push_str(&format!("data: {usage}\n\n"));
                }
                events.push_str("data: [DONE]\n\n");
                return Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(full(Bytes::from(events)))
                    .unwrap();
            }
            let mut answer = completion(&reply, 11, 4);
            answer["usage"] = usage;
            json_response(200, &answer)
        }
    }))
    .await
}

/// What `mock_llm` reports of a chat answer: 11 prompt tokens and 4 completion tokens, or the
/// prompt and its cached share as `cache` counts them.
fn chat_usage(cache: Option<&PromptCache>, request: &Value) -> Value {
    match cache.map(|cache| cache.prompt(request)) {
        Some(CachedPrompt {
            prompt_tokens,
            cached_tokens,
        }) => json!({
            "prompt_tokens": prompt_tokens, "completion_tokens": 4,
            "total_tokens": prompt_tokens + 4,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        }),
        None => json!({"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}),
    }
}

const WORDS: &[&str] = &[
    "river", "engine", "garden", "signal", "copper", "window", "market", "lantern", "pilot",
    "meadow", "harbor", "canvas", "thunder", "velvet", "orbit", "cobalt", "summit", "ember",
    "prairie", "quartz",
];

/// About `words` tokens of deterministic prose.
pub fn filler(seed: usize, words: usize) -> String {
    (0..words)
        .map(|i| WORDS[(seed * 7 + i * 3 + i / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

pub const SYSTEM_PROMPT: &str = "You are a careful assistant for the Falcon project.";
pub const PLANTED: &str = "FACT: the deploy ticket is ORD-4411 and the budget is $1,200";

/// Turn `t`'s user message, about 100 tokens, tagged `msg-u{t}`; the facts are planted in turn 0.
pub fn user_turn(t: usize) -> Value {
    let planted = if t == 0 {
        format!("{PLANTED}. ")
    } else {
        String::new()
    };
    json!({"role": "user", "content": format!("msg-u{t}. {planted}{}", filler(t, 100))})
}

/// System prompt, then `turns` user/assistant pairs; facts planted in the first user turn.
pub fn conversation(turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM_PROMPT})];
    for t in 0..turns {
        messages.push(user_turn(t));
        messages.push(
            json!({"role": "assistant", "content": format!("msg-a{t}. {}", filler(t + 1000, 100))}),
        );
    }
    messages
}

/// A port that was just free: nothing listens there, until someone binds it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An upstream URL where nothing listens.
pub fn closed_url() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// Prefix reuse over consecutive prompts: the mean share of each prompt that repeats the
/// start of the one before (what a provider's prompt cache can reuse).
pub fn prefix_reuse<P: AsRef<[u8]>>(prompts: &[P]) -> f64 {
    let shares: Vec<f64> = prompts
        .windows(2)
        .map(|pair| {
            let (before, now) = (pair[0].as_ref(), pair[1].as_ref());
            let common = before.iter().zip(now).take_while(|(a, b)| a == b).count();
            common as f64 / now.len() as f64
        })
        .collect();
    shares.iter().sum::<f64>() / shares.len().max(1) as f64
}

/// The error `behaviour` answers a conversation of `items` with, when they are more than
/// its model takes (`LlmBehaviour::too_long`).
pub fn too_long<'b>(behaviour: &'b LlmBehaviour, items: &Value) -> Option<&'b Value> {
    let (limit, error) = behaviour.too_long.as_ref()?;
    (items.as_array().map_or(0, Vec::len) > *limit).then_some(error)
}

/// Anthropic's answer to a prompt longer than the model's window.
pub fn anthropic_too_long() -> Value {
    json!({"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 5868 tokens > 5000 maximum",
    }})
}

/// OpenAI's answer to a prompt longer than the model's window.
pub fn openai_too_long() -> Value {
    json!({"error": {
        "message": "This model's maximum context length is 5000 tokens. However, your messages resulted in 5868 tokens.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
    }})
}

/// A config whose gpt-4o has an 8,000-token window, so tests stay small; summaries are made
/// by gpt-4o-mini, whose window takes any span in one call.
pub fn small_window_config(upstream: &str) -> Config {
    let mut config = config_for(upstream);
    config.summarizer.model = "gpt-4o-mini".into();
    config.models.insert(
        "gpt-4o".into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(8_000),
            encoding: None,
            price: None,
        },
    );
    config
}

/// Runs `tests/sdk/SCRIPT` with `args` (a base URL first) and returns its standard output
/// once it succeeded.
pub async fn run_sdk_script(script: &str, args: &[&str], package: &str) -> String {
    let path = format!("{}/tests/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::new("python3")
        .arg(path)
        .args(args)
        .output()
        .await
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK script failed (is the {package} package installed? pip install {package})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// `body` posted to condenser's chat completions path, as it is.
pub async fn post_chat(proxy: &Proxy, body: &Value) -> reqwest::Response {
    post(proxy, "/v1/chat/completions", &[], body).await.0
}

pub fn chat_body(messages: &[Value]) -> Value {
    json!({"model": "gpt-4o", "max_tokens": 500, "messages": messages, "user": "tester"})
}

pub fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The whole body of a streamed response, read chunk by chunk as it arrives.
/// What condenser says of a request it served, in its `x-condenser-*` response headers: empty
/// or `None` where it sent none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condensed {
    /// `forwarded`, `summarized` or `trimmed`.
    pub action: String,
    /// The summary cache's outcome: `hit`, `miss`, `none`.
    pub cache: String,
    /// The prompt's tokens as the client sent it.
    pub prompt_tokens: Option<u64>,
    /// The prompt's tokens as condenser forwarded it.
    pub forwarded_tokens: Option<u64>,
    pub summarized_messages: Option<usize>,
    /// Recall calls condenser served within the request.
    pub recalls: Option<u32>,
    /// How many recent items went shortened, when the recent part alone was over the limit.
    pub recent_shortened: Option<usize>,
    /// Why condenser retried the request compacted (`context_length_exceeded`).
    pub retry: String,
    /// Under observe: what `auto` would have done, and the tokens it would have forwarded.
    pub would: String,
    pub would_forward_tokens: Option<u64>,
}

impl Condensed {
    pub fn of(response: &reqwest::Response) -> Condensed {
        Condensed {
            action: header(response, "x-condenser-action"),
            cache: header(response, "x-condenser-cache"),
            prompt_tokens: count(response, "x-condenser-prompt-tokens"),
            forwarded_tokens: count(response, "x-condenser-forwarded-tokens"),
            summarized_messages: count(response, "x-condenser-summarized-messages"),
            recalls: count(response, "x-condenser-recalls"),
            recent_shortened: count(response, "x-condenser-recent-shortened"),
            retry: header(response, "x-condenser-retry"),
            would: header(response, "x-condenser-would"),
            would_forward_tokens: count(response, "x-condenser-would-forward-tokens"),
        }
    }
}

/// The number a response header holds; a header that is not one fails the test.
fn count<N: std::str::FromStr>(response: &reqwest::Response, name: &str) -> Option<N>
where
    N::Err: std::fmt::Debug,
{
    let text = header(response, name);
    (!text.is_empty()).then(|| {
        text.parse()
            .unwrap_or_else(|e| panic!("{name}: {text:?}: {e:?}"))
    })
}

/// POSTs `body` to condenser's `path` with `headers`, and reads what condenser says of it.
pub async fn post(
    proxy: &Proxy,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (reqwest::Response, Condensed) {
    let mut request = client().post(proxy.url(path)).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let condensed = Condensed::of(&response);
    (response, condensed)
}

pub async fn stream_text(response: reqwest::Response) -> String {
    let mut text = String::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = within("stream", stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    text
}

/// A real `redis-server` (Debian package) on a free port, killed when dropped.
pub struct Redis {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Redis {
    pub async fn start() -> Redis {
        let port = free_port();
        let mut redis = Redis {
            port,
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        redis.restart().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        within("redis up", async {
            while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
            child.wait().await.unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages (`/v1/messages`): a mock Claude in front of `mock_llm`.
// ---------------------------------------------------------------------------------------

/// How the mock Claude behaves.
#[derive(Clone, Default)]
pub struct ClaudeBehaviour {
    /// The chat completions it hands to `mock_llm` (the summarizer's calls).
    pub llm: LlmBehaviour,
    /// When set, a stream sends `message_start`, then waits for one permit before the rest.
    pub stream_gate: Option<Arc<tokio::sync::Notify>>,
    /// The `input_tokens` its usage reports, `CLAUDE_INPUT_TOKENS` unless set.
    pub input_tokens: Option<u64>,
}

/// Usage of every mock Claude reply: the prompt is all three input counts.
pub const CLAUDE_INPUT_TOKENS: u64 = 11;
pub const CLAUDE_CACHE_CREATION_TOKENS: u64 = 2;
pub const CLAUDE_CACHE_READ_TOKENS: u64 = 3;
pub const CLAUDE_OUTPUT_TOKENS: u64 = 4;

/// An upstream that answers `POST /v1/messages` as Claude does (JSON, or SSE events when
/// `stream` is true) and hands every other request, and every summarizer call (which it
/// answers in the API it was asked in), to a `mock_llm` behind it; all of them are recorded
/// here.
pub async fn mock_claude(behaviour: ClaudeBehaviour) -> MockUpstream {
    let llm = mock_llm(behaviour.llm.clone()).await.url();
    let relay = client();
    MockUpstream::start(handler(move |r| {
        let behaviour = behaviour.clone();
        let llm = llm.clone();
        let relay = relay.clone();
        async move {
            if r.path_and_query != "/v1/messages" || is_summarizer_call(&r) {
                let mut relayed = relay.post(format!("{llm}{}", r.path_and_query)).body(r.body.clone());
                for (name, value) in &r.headers {
                    if name != "host" && name != "content-length" {
                        relayed = relayed.header(name, value);
                    }
                }
                let answer = relayed.send().await.unwrap();
                let status = answer.status().as_u16();
                return json_response(status, &answer.json().await.unwrap());
            }
            let request: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if let Some(error) = too_long(&behaviour.llm, &request["messages"]) {
                return json_response(400, error);
            }
            let reply = format!(
                "reply to {} messages",
                request["messages"].as_array().map_or(0, Vec::len)
            );
            let model = request["model"].clone();
            // Anthropic's input_tokens are the prompt's uncached part.
            let (input, created, read) = match &behaviour.llm.prompt_cache {
                Some(cache) => {
                    let counted = cache.prompt(&request);
                    (counted.prompt_tokens - counted.cached_tokens, 0, counted.cached_tokens)
                }
                None => (
                    behaviour.input_tokens.unwrap_or(CLAUDE_INPUT_TOKENS),
                    CLAUDE_CACHE_CREATION_TOKENS,
                    CLAUDE_CACHE_READ_TOKENS,
                ),
            };
            let usage = json!({
                "input_tokens": input,
                "cache_creation_input_tokens": created,
                "cache_read_input_tokens": read,
                "output_tokens": 1,
            });
            let message = |content: Value, stop: Value, usage: Value| {
                json!({"id": "msg_test", "type": "message", "role": "assistant", "model": model,
                    "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage})
            };
            if request["stream"] != json!(true) {
                let mut usage = usage;
                usage["output_tokens"] = json!(CLAUDE_OUTPUT_TOKENS);
                let body = message(json!([{"type": "text", "text": reply}]), json!("end_turn"), usage);
                return json_response(200, &body);
            }
            let event = |name: &str, data: Value| Bytes::from(format!("event: {name}\ndata: {data}\n\n"));
            let mut rest = vec![
                event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
                event("ping", json!({"type": "ping"})),
            ];
            for word in reply.split(' ') {
                rest.push(event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("{word} ")}})));
            }
            rest.push(event("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
            rest.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": CLAUDE_OUTPUT_TOKENS}})));
            rest.push(event("message_stop", json!({"type": "message_stop"})));
            let start = event("message_start", json!({"type": "message_start", "message": message(json!([]), Value::Null, usage)}));
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
            tokio::spawn(async move {
                if tx.send(start).await.is_err() {
                    return;
                }
                if let Some(gate) = behaviour.stream_gate {
                    gate.notified().await;
                }
                for chunk in rest {
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
            });
            let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
                .map(|chunk| Ok::<_, condenser::transport::body::BoxError>(hyper::body::Frame::data(chunk)));
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::StreamBody::new(frames).boxed_unsync())
                .unwrap()
        }
    }))
    .await
}

/// `turns` rounds of a Claude agent, each about 300 tokens: a user turn, then an assistant
/// turn calling a tool, the user turn answering it, and the assistant's reply; facts planted
/// in the first user turn. `4 * turns + 1` messages, the last a user question.
pub fn claude_conversation(turns: usize) -> Vec<Value> {
    let mut messages = Vec::new();
    for t in 0..turns {
        messages.push(user_turn(t));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("msg-c{t}. Let me look.")},
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": "lookup", "input": {"q": format!("q{t}")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": format!("msg-r{t}. {}", filler(t + 500, 100))}]}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("msg-a{t}. {}", filler(t + 1000, 100))}]}));
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    messages
}

pub const CLAUDE_SYSTEM: &str = "You are Claude, careful with the Falcon project.";

/// A config whose claude-sonnet-4-5 has an 8,000-token window; summaries by gpt-4o-mini
/// over chat completions.
pub fn claude_config(upstream: &str) -> Config {
    let mut config = small_window_config(upstream);
    config.models.insert(
        "claude-sonnet-4-5".into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(8_000),
            encoding: None,
            price: None,
        },
    );
    config
}

pub fn messages_body(messages: &[Value]) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 500, "system": CLAUDE_SYSTEM, "messages": messages})
}

// ---------------------------------------------------------------------------------------
// OpenAI Responses API (issue 17 step 2): a mock `/v1/responses` in front of `mock_llm`.
// ---------------------------------------------------------------------------------------

/// Output tokens the mock reports in a Responses reply: plain, and at a stream's completion.
pub const RESPONSES_OUTPUT_TOKENS: u64 = 5;
pub const RESPONSES_STREAM_OUTPUT_TOKENS: u64 = 7;

/// A Responses reply saying `text`, as the API writes one (`status` completed, with usage).
pub fn responses_reply(text: &str, status: &str, output_tokens: Option<u64>) -> Value {
    json!({
        "id": "resp_test",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-4o",
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "metadata": {},
        "parallel_tool_calls": true,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "output": if output_tokens.is_some() { json!([{
            "type": "message", "id": "msg_test", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]
        }]) } else { json!([]) },
        "usage": output_tokens.map(|output| json!({
            "input_tokens": 11,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 11 + output
        })),
    })
}

fn responses_event(kind: &str, sequence: usize, mut fields: Value) -> Bytes {
    fields["type"] = json!(kind);
    fields["sequence_number"] = json!(sequence);
    Bytes::from(format!("event: {kind}\ndata: {fields}\n\n"))
}

/// An upstream that answers `/v1/responses` itself (`reply to N items`, streaming typed
/// events when asked) and hands every other path (the summarizer's chat completions) to a
/// `mock_llm` with `behaviour`. Everything it receives is recorded here. With a `gate`, a
/// stream sends `response.created`, then waits for the gate before the rest.
pub async fn mock_responses_llm(
    behaviour: LlmBehaviour,
    gate: Option<Arc<tokio::sync::Notify>>,
) -> MockUpstream {
    let cache = behaviour.prompt_cache.clone();
    let limit = behaviour.clone();
    let chat = mock_llm(behaviour).await.url();
    let http = client();
    MockUpstream::start(handler(move |r| {
        let chat = chat.clone();
        let http = http.clone();
        let gate = gate.clone();
        let cache = cache.clone();
        let limit = limit.clone();
        async move {
            if r.path_and_query != "/v1/responses" || is_summarizer_call(&r) {
                let mut forwarded = http.post(format!("{chat}{}", r.path_and_query)).body(r.body.clone());
                for (name, value) in &r.headers {
                    if name != "host" && name != "content-length" {
                        forwarded = forwarded.header(name, value);
                    }
                }
                let answer = forwarded.send().await.unwrap();
                let status = answer.status().as_u16();
                let body: Value = answer.json().await.unwrap();
                return json_response(status, &body);
            }
            let request: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if let Some(error) = too_long(&limit, &request["input"]) {
                return json_response(400, error);
            }
            let items = match &request["input"] {
                Value::Array(items) => items.len(),
                Value::String(_) => 1,
                _ => 0,
            };
            let text = format!("reply to {items} items");
            let counted = cache.map(|cache| cache.prompt(&request));
            // The fixed input count, or the prompt and its cached share.
            let reply = move |text: &str, output: u64| {
                let mut reply = responses_reply(text, "completed", Some(output));
                if let Some(counted) = counted {
                    reply["usage"]["input_tokens"] = json!(counted.prompt_tokens);
                    reply["usage"]["input_tokens_details"]["cached_tokens"] = json!(counted.cached_tokens);
                    reply["usage"]["total_tokens"] = json!(counted.prompt_tokens + output);
                }
                reply
            };
            if request["stream"] != json!(true) {
                return json_response(200, &reply(&text, RESPONSES_OUTPUT_TOKENS));
            }
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
            tokio::spawn(async move {
                let created = json!({"response": responses_reply("", "in_progress", None)});
                let _ = tx.send(Ok(responses_event("response.created", 0, created))).await;
                if let Some(gate) = gate {
                    gate.notified().await;
                }
                let mut sequence = 1;
                for word in text.split_inclusive(' ') {
                    let delta = json!({"item_id": "msg_test", "output_index": 0, "content_index": 0, "delta": word});
                    let _ = tx.send(Ok(responses_event("response.output_text.delta", sequence, delta))).await;
                    sequence += 1;
                }
                let done = json!({"item_id": "msg_test", "output_index": 0, "content_index": 0, "text": text});
                let _ = tx.send(Ok(responses_event("response.output_text.done", sequence, done))).await;
                let completed = json!({"response": reply(&text, RESPONSES_STREAM_OUTPUT_TOKENS)});
                let _ = tx.send(Ok(responses_event("response.completed", sequence + 1, completed))).await;
            });
            let mut rx = rx;
            let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
                .map(|chunk| chunk.map(hyper::body::Frame::data).map_err(condenser::transport::body::BoxError::from));
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::StreamBody::new(frames).boxed_unsync())
                .unwrap()
        }
    }))
    .await
}

/// A compacted request as its client wrote it, but for the recall tool condenser offers
/// (docs/design.md, rewrite rule 9): checked to be the last of its tools, and taken out with the
/// `tools` it alone made.
pub fn without_recall_tool(body: &Value) -> Value {
    let mut body = body.clone();
    let tools = body["tools"]
        .as_array_mut()
        .expect("a compacted request offers recall");
    let last = tools.pop().unwrap();
    // A chat function, a Responses or Messages tool, or a Gemini `functionDeclarations` entry
    // of its own.
    let name = last
        .pointer("/function/name")
        .or(last.pointer("/name"))
        .or(last
            .pointer("/functionDeclarations")
            .filter(|declared| declared.as_array().is_some_and(|d| d.len() == 1))
            .and_then(|declared| declared.pointer("/0/name")));
    assert_eq!(
        name,
        Some(&json!("condenser_recall")),
        "recall is the last tool: {last}"
    );
    if tools.is_empty() {
        body.as_object_mut().unwrap().remove("tools");
    }
    body
}

/// Runs the condenser binary with `args`, the body on its standard input.
pub async fn condenser_cli(args: &[&str], body: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_condenser"))
        .args(args)
        .env_remove("CONDENSER_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}
