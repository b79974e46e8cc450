//! Recall served by condenser (issue 22), in every dialect of the registry, plain and streamed, against a
//! scripted model: one that calls `condenser_recall` when it is offered and echoes what the
//! tool answered, with a summarizer that keeps nothing of what it is sent.

use std::sync::Arc;

use futures_util::StreamExt;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::common::*;
use condenser::transport::body::ProxyBody;

const DECISION: &str = "Decision: we bind the service to port 23456 and never to 8080.";
const TOOL: &str = RECALL_TOOL;

/// What the scripted model does when the recall tool is offered and not yet answered.
#[derive(Clone)]
enum Script {
    /// Asks for every reference the summary names.
    AllRefs,
    /// Searches for the decision.
    Query,
    /// Asks for a reference nothing was archived under.
    Missing,
    /// Calls recall again on every round.
    Always,
    /// Calls one of the client's own tools and recall in the same reply.
    Mixed,
    /// Asks for the reference a cut tool output's stub names.
    ClearedRef,
    /// Calls it, then fails the continuation with a 500.
    FailedContinuation,
    /// Never calls it; streams its first event, then waits for the gate.
    Gated(Arc<Notify>),
    /// Asks for every reference, its reply typed with this media type instead.
    TypedAs(&'static str),
}

/// A conversation of 14 exchanges, the decision stated by the assistant in the second, each
/// turn about 100 tokens; the last a question.
fn body(api: Fixture, stream: bool) -> Value {
    body_deciding(api, DECISION, stream)
}

/// The same conversation, `decision` stated in it.
fn body_deciding(api: Fixture, decision: &str, stream: bool) -> Value {
    let mut turns = Vec::new();
    for t in 0..14 {
        turns.push(("user", format!("msg-u{t}. {}", filler(t, 100))));
        let said = if t == 1 {
            format!("{decision} {}", filler(t + 1000, 90))
        } else {
            format!("msg-a{t}. {}", filler(t + 1000, 100))
        };
        turns.push(("assistant", said));
    }
    turns.push(("user", "Which port do we bind the service to?".into()));
    api.body(&turns, stream)
}

/// Every `ctx:` reference the request's summary names, from its `A to B` range.
fn named_references(request: &Value) -> Vec<String> {
    let text = request.to_string();
    let Some(at) = text.find("archived verbatim as ctx:").map(|at| at + 21) else {
        return Vec::new();
    };
    let range = &text[at..];
    let end = range.find(" to ").unwrap();
    let first = &range[..end];
    let last: String = range[end + 4..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == ':' || *c == '.')
        .collect();
    let (conversation, from) = first.rsplit_once('.').unwrap();
    let to: usize = last
        .trim_end_matches([':', '.'])
        .rsplit_once('.')
        .unwrap()
        .1
        .parse()
        .unwrap();
    (from.parse::<usize>().unwrap()..=to)
        .map(|i| format!("{conversation}.{i}"))
        .collect()
}

/// The scripted model, and the summarizer that keeps nothing.
async fn scripted_model(api: Fixture, script: Script) -> MockUpstream {
    MockUpstream::start(handler(move |r| {
        let script = script.clone();
        async move {
            let request: Value = serde_json::from_slice(&r.body).unwrap();
            if is_summarizer_call(&r) {
                let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
                return json_response(200, &summary_reply(&path, &lossy_summary(&request)));
            }
            let stream = api.streams(&r);
            if let Some(answers) = api.answers(&request) {
                if matches!(script, Script::FailedContinuation) {
                    return json_response(500, &json!({"error": {"message": "model crashed"}}));
                }
                if !matches!(script, Script::Always) {
                    return api.text_reply(&format!("Recalled: {answers}"), stream, None);
                }
            }
            if !api.offers_recall(&request) {
                return api.text_reply("no recall offered", stream, None);
            }
            let recall = |args: Value| (TOOL, args);
            match script {
                Script::Gated(gate) => api.text_reply("plain answer", stream, Some(gate)),
                Script::AllRefs | Script::Always | Script::FailedContinuation => api.call_reply(
                    &[recall(json!({"refs": named_references(&request)}))],
                    stream,
                ),
                Script::TypedAs(media_type) => {
                    let mut reply = api.call_reply(
                        &[recall(json!({"refs": named_references(&request)}))],
                        stream,
                    );
                    reply.headers_mut().insert(
                        "content-type",
                        hyper::header::HeaderValue::from_static(media_type),
                    );
                    reply
                }
                Script::Query => api.call_reply(
                    &[recall(
                        json!({"query": "which port do we bind the service"}),
                    )],
                    stream,
                ),
                Script::ClearedRef => {
                    let text = request.to_string();
                    let reference = text
                        .split("condenser_recall ")
                        .nth(1)
                        .and_then(|rest| rest.split(' ').next())
                        .unwrap_or("no stub named a reference")
                        .to_string();
                    api.call_reply(&[recall(json!({"refs": [reference]}))], stream)
                }
                Script::Missing => {
                    api.call_reply(&[recall(json!({"refs": ["ctx:00000000.999"]}))], stream)
                }
                Script::Mixed => api.call_reply(
                    &[
                        ("run_shell", json!({"command": "ls"})),
                        recall(json!({"query": "port"})),
                    ],
                    stream,
                ),
            }
        }
    }))
    .await
}

/// The scripted model, and condenser in front of it with `recall_config`.
async fn scripted(api: Fixture, script: Script) -> (MockUpstream, Proxy) {
    let upstream = scripted_model(api, script).await;
    let proxy = Proxy::start(recall_config(&upstream.url())).await;
    (upstream, proxy)
}

fn recall_config(upstream: &str) -> condenser::Config {
    let mut config = Fixture::config(upstream);
    config.recall.max_rounds = 2;
    config
}

async fn ask(proxy: &Proxy, api: Fixture, stream: bool) -> reqwest::Response {
    ask_with(proxy, api, &body(api, stream), stream).await
}

/// `body` sent to `api`'s path, streamed or not, compaction forced.
async fn ask_with(proxy: &Proxy, api: Fixture, body: &Value, stream: bool) -> reqwest::Response {
    post(
        proxy,
        &api.path(stream),
        &[("x-condenser-mode", "force")],
        body,
    )
    .await
    .0
}

/// `condenser_recalls_total` for `api`'s route and `outcome`.
async fn recalls(proxy: &Proxy, api: Fixture, outcome: &str) -> Option<f64> {
    let route = api.route();
    let series = format!("condenser_recalls_total{{outcome=\"{outcome}\",route=\"{route}\"}}");
    metric(&proxy.metrics().await, &series)
}

/// The requests the scripted model got (the summarizer's aside).
fn model_requests(upstream: &MockUpstream) -> Vec<Value> {
    upstream.forwarded()
}

#[tokio::test]
async fn a_decision_in_an_evicted_assistant_message_is_recalled_verbatim_in_every_dialect() {
    for api in Fixture::all() {
        for stream in [false, true] {
            for script in [Script::AllRefs, Script::Query] {
                let (upstream, proxy) = scripted(api, script.clone()).await;
                let response = ask(&proxy, api, stream).await;
                assert_eq!(response.status(), 200, "{api:?} stream={stream}");
                assert_eq!(header(&response, "x-condenser-action"), "summarized");
                if !stream {
                    assert_eq!(header(&response, "x-condenser-recalls"), "1", "{api:?}");
                }
                let (text, raw) = api.client_text(response, stream).await;
                assert!(text.contains(DECISION), "{api:?} stream={stream}: {text}");
                assert!(
                    !raw.contains(TOOL),
                    "{api:?} stream={stream}: the tool leaked: {raw}"
                );
                let requests = model_requests(&upstream);
                assert_eq!(requests.len(), 2, "{api:?} stream={stream}");
                // The summary had lost it: it came back through recall alone.
                assert!(!requests[0].to_string().contains("port 23456"), "{api:?}");
                assert!(api.offers_recall(&requests[0]));
                assert!(api.answers(&requests[1]).unwrap().contains(DECISION));
                assert_eq!(recalls(&proxy, api, "served").await, Some(1.0), "{api:?}");
            }
        }
    }
}

/// Issue 55, 9: a reply typed `Application/JSON` got no recall served (the media type was
/// compared case-sensitively), and the client saw the `condenser_recall` call. Media types
/// compare as RFC 9110 says: the call is served.
#[tokio::test]
async fn a_reply_whose_media_type_is_written_in_capitals_has_its_recall_call_served() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let media_type = if stream {
                "Text/Event-Stream"
            } else {
                "Application/JSON; charset=UTF-8"
            };
            let (upstream, proxy) = scripted(api, Script::TypedAs(media_type)).await;
            let response = ask(&proxy, api, stream).await;
            assert_eq!(response.status(), 200, "{api:?} stream={stream}");
            let (text, raw) = api.client_text(response, stream).await;
            assert!(!raw.contains(TOOL), "{api:?} stream={stream}: {raw}");
            assert!(text.contains(DECISION), "{api:?} stream={stream}: {text}");
            assert_eq!(
                model_requests(&upstream).len(),
                2,
                "{api:?} stream={stream}"
            );
        }
    }
}

/// Issue 55, 9: a reply condenser cannot read after offering recall was relayed with the
/// call in it. Now it is an error in the dialect's shape, and nothing of the call.
#[tokio::test]
async fn a_reply_condenser_cannot_read_after_offering_recall_is_an_error_in_the_dialects_shape() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let (_upstream, proxy) = scripted(api, Script::TypedAs("text/plain")).await;
            let response = ask(&proxy, api, stream).await;
            let what = format!("{api:?} stream={stream}");
            assert_eq!(response.status(), 502, "{what}");
            let body: Value = response.json().await.unwrap();
            assert!(!body.to_string().contains(TOOL), "{what}: {body}");
            let message = match api {
                Fixture::Messages => {
                    assert_eq!(body["type"], "error", "{what}: {body}");
                    &body["error"]["message"]
                }
                Fixture::Gemini => {
                    assert_eq!(body["error"]["code"], 502, "{what}: {body}");
                    &body["error"]["message"]
                }
                Fixture::Chat | Fixture::Responses => {
                    assert_eq!(body["error"]["code"], "upstream_error", "{what}: {body}");
                    &body["error"]["message"]
                }
            };
            assert!(
                message.as_str().unwrap().contains("recall"),
                "{what}: {body}"
            );
        }
    }
}

/// Issue 55, 9 and 10: after recall was offered, a stream event over `max_event_bytes` was
/// relayed unread, and a recall call in it with it. Now the stream ends there with an error in
/// the dialect's shape, and nothing of the call.
#[tokio::test]
async fn an_event_over_the_bound_after_offering_recall_ends_the_stream_with_an_error() {
    for api in Fixture::all() {
        let upstream = scripted_model(api, Script::AllRefs).await;
        let mut config = recall_config(&upstream.url());
        config.server.max_event_bytes = 64;
        let proxy = Proxy::start(config).await;
        let response = ask(&proxy, api, true).await;
        assert_eq!(response.status(), 200, "{api:?}");
        let raw = stream_text(response).await;
        assert!(!raw.contains(TOOL), "{api:?}: the call was relayed: {raw}");
        assert!(raw.contains("max_event_bytes"), "{api:?}: {raw}");
        assert_eq!(model_requests(&upstream).len(), 1, "{api:?}");
    }
}

/// Issue 55, 9: `?alt=sse&alt=json` had condenser offer recall for the stream it saw while an
/// upstream that reads the last `alt` answered one JSON array, relayed with the call in it. A
/// Gemini query that repeats `alt` is refused, in Google's shape, before anything is sent.
#[tokio::test]
async fn a_gemini_query_that_repeats_alt_is_refused() {
    let (upstream, proxy) = scripted(Fixture::Gemini, Script::AllRefs).await;
    let stream_path = Fixture::Gemini.path(true);
    let count_path = stream_path.replace(":streamGenerateContent?alt=sse", ":countTokens?alt=json");
    for path in [
        format!("{stream_path}&alt=json"),
        format!("{count_path}&alt=sse"),
    ] {
        let response = ask_with_path(&proxy, &path, &body(Fixture::Gemini, true)).await;
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], 400, "{path}: {body}");
        assert_eq!(
            body["error"]["status"], "INVALID_ARGUMENT",
            "{path}: {body}"
        );
        assert!(
            body["error"]["message"].as_str().unwrap().contains("alt"),
            "{path}: {body}"
        );
    }
    assert!(upstream.recorded().is_empty());
    // One `alt` is served as before.
    let response = ask(&proxy, Fixture::Gemini, true).await;
    assert_eq!(response.status(), 200);
}

async fn ask_with_path(proxy: &Proxy, path: &str, body: &Value) -> reqwest::Response {
    post(proxy, path, &[("x-condenser-mode", "force")], body)
        .await
        .0
}

#[tokio::test]
async fn a_missing_reference_is_a_tool_error_to_the_model_and_the_client_still_gets_its_answer() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let (upstream, proxy) = scripted(api, Script::Missing).await;
            let response = ask(&proxy, api, stream).await;
            assert_eq!(response.status(), 200);
            let (text, raw) = api.client_text(response, stream).await;
            assert!(!raw.contains(TOOL), "{raw}");
            let requests = model_requests(&upstream);
            assert_eq!(requests.len(), 2, "{api:?} stream={stream}");
            let answer = api.answers(&requests[1]).unwrap();
            assert!(answer.starts_with("Error: "), "{api:?}: {answer}");
            assert!(answer.contains("ctx:00000000.999"), "{answer}");
            assert!(text.contains("ctx:00000000.999"), "{text}");
        }
    }
}

#[tokio::test]
async fn the_round_limit_holds_and_the_last_round_may_not_call_tools() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let (upstream, proxy) = scripted(api, Script::Always).await;
            let response = ask(&proxy, api, stream).await;
            assert_eq!(response.status(), 200);
            let (_, raw) = api.client_text(response, stream).await;
            assert!(!raw.contains(TOOL), "{api:?} stream={stream}: {raw}");
            let requests = model_requests(&upstream);
            // max_rounds = 2: two rounds served, then one continuation that may not call.
            assert_eq!(requests.len(), 3, "{api:?} stream={stream}");
            assert_eq!(
                api.tool_choice(&requests[2]),
                Some(&api.no_tools()),
                "{api:?}"
            );
            assert!(api.tool_choice(&requests[1]).is_none(), "{api:?}");
        }
    }
}

#[tokio::test]
async fn a_reply_that_also_calls_the_clients_tools_returns_them_and_serves_no_recall() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let (upstream, proxy) = scripted(api, Script::Mixed).await;
            let response = ask(&proxy, api, stream).await;
            assert_eq!(response.status(), 200);
            assert!(header(&response, "x-condenser-recalls").is_empty());
            let (_, raw) = api.client_text(response, stream).await;
            assert!(raw.contains("run_shell"), "{api:?} stream={stream}: {raw}");
            assert!(!raw.contains(TOOL), "{api:?} stream={stream}: {raw}");
            assert_eq!(model_requests(&upstream).len(), 1);
            assert_eq!(recalls(&proxy, api, "skipped").await, Some(1.0), "{api:?}");
        }
    }
}

#[tokio::test]
async fn a_streamed_reply_that_does_not_call_it_reaches_the_client_as_it_comes() {
    for api in Fixture::all() {
        let gate = Arc::new(Notify::new());
        let (upstream, proxy) = scripted(api, Script::Gated(gate.clone())).await;
        let response = ask(&proxy, api, true).await;
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        // The first event arrives while upstream holds back the rest of its reply.
        let first = within("the first event before the rest", body.next())
            .await
            .unwrap()
            .unwrap();
        assert!(!first.is_empty());
        gate.notify_one();
        let mut rest = String::from_utf8(first.to_vec()).unwrap();
        while let Some(chunk) = within("the rest", body.next()).await {
            rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        let text = api.streamed_text(&rest);
        assert_eq!(text, "plain answer", "{api:?}: {rest}");
        assert!(api.offers_recall(&model_requests(&upstream)[0]));
    }
}

#[tokio::test]
async fn references_stay_valid_across_a_restart_with_redis() {
    for api in Fixture::all() {
        // Each its own: the dialects' conversations are the same, and would share summaries.
        let redis = Redis::start().await;
        let upstream = scripted_model(api, Script::AllRefs).await;
        let mut config = recall_config(&upstream.url());
        config.cache.redis_url = redis.url();
        let mut first = Proxy::start(config.clone()).await;
        let response = ask(&first, api, false).await;
        assert_eq!(response.status(), 200);
        first.shutdown();
        let _ = (&mut first.served).await;
        let second = Proxy::start(config).await;
        let response = ask(&second, api, false).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-condenser-cache"),
            "hit",
            "{api:?}: the summary came from Redis"
        );
        let (text, _) = api.client_text(response, false).await;
        assert!(text.contains(DECISION), "{api:?}: {text}");
        let summaries = upstream.summarizer_calls().len();
        assert_eq!(
            summaries, 1,
            "{api:?}: the restarted proxy made no summary of its own"
        );
    }
}

/// The line after the summary that names the archive, wherever the request carries it.
fn archive_note(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => {
            let at = text.find("\n\n[The ")?;
            let end = at + text[at..].find(".]")? + 2;
            text[at..end]
                .contains("archived verbatim")
                .then(|| text[at..end].to_string())
        }
        Value::Array(items) => items.iter().find_map(archive_note),
        Value::Object(fields) => fields.values().find_map(archive_note),
        _ => None,
    }
}

/// The prompt tokens of `body` in `api`, as `condenser count` counts them.
async fn counted(api: Fixture, body: &Value) -> u32 {
    let args = ["count", "--api", api.name(), "--model", api.model(), "-"];
    let text = condenser_cli(&args, body.to_string().as_bytes()).await;
    text.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn what_recall_adds_to_a_request_is_the_tool_and_one_line_as_the_plan_counts_them() {
    for api in Fixture::all() {
        let (upstream, proxy) = scripted(api, Script::Gated(Arc::new(Notify::new()))).await;
        let response = ask(&proxy, api, false).await;
        assert_eq!(response.status(), 200);
        let forwarded = u32::try_from(Condensed::of(&response).forwarded_tokens.unwrap()).unwrap();
        let sent = model_requests(&upstream)[0].clone();
        assert_eq!(counted(api, &sent).await, forwarded, "{api:?}");
        // The same request without the tool and without the line naming the archive.
        let note = archive_note(&sent).expect("the summary names the archive");
        let escaped = serde_json::to_string(&note).unwrap();
        let escaped = &escaped[1..escaped.len() - 1];
        let plain: Value =
            serde_json::from_str(&without_recall_tool(&sent).to_string().replace(escaped, ""))
                .unwrap();
        assert!(archive_note(&plain).is_none());
        let info = proxy.state.catalog.resolve(api.model());
        let note_tokens = condenser::tokens::rules::count_text(info.encoding, &note);
        let tool_tokens = condenser::compaction::recall::tool_tokens(info.encoding);
        let added = forwarded - counted(api, &plain).await;
        // A model counted by another's encoding is counted with the safety margin on top, as
        // the summary itself is; where the line meets the summary, a token may merge.
        let margin = if info.exact {
            0.0
        } else {
            proxy.state.config.tokens.unknown_model_margin
        };
        let planned = f64::from(tool_tokens + note_tokens) * (1.0 + margin);
        assert!(
            (f64::from(added) - planned).abs() <= 2.0,
            "{api:?}: recall added {added}, planned {tool_tokens} + {note_tokens} (x {})",
            1.0 + margin
        );
    }
}

/// A tool output the size of a long log, a line in its middle that a cut leaves out.
fn long_log() -> String {
    format!(
        "{}\nMIDDLE: the flaky test is test_port_binding_23456\n{}",
        filler(3, 3_500),
        filler(4, 3_500)
    )
}

/// A task, one call of the client's tool, and its output: too long for the window, with
/// nothing before it to summarize.
fn tool_session(api: Fixture, stream: bool) -> Value {
    let task = "Read the test log and tell me which test is flaky.";
    let output = long_log();
    let model = api.model();
    let mut body = match api {
        Fixture::Chat => json!({"model": model, "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "client_1", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "client_1", "content": output}]}),
        Fixture::Responses => {
            json!({"model": model, "instructions": SYSTEM_PROMPT, "input": [
            {"role": "user", "content": task},
            {"type": "function_call", "call_id": "client_1", "name": "read_log", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "client_1", "output": output}]})
        }
        Fixture::Messages => {
            json!({"model": model, "max_tokens": 500, "system": SYSTEM_PROMPT, "messages": [
            {"role": "user", "content": task},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "client_1", "name": "read_log", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "client_1", "content": output}]}]})
        }
        Fixture::Gemini => {
            return json!({"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}, "contents": [
            {"role": "user", "parts": [{"text": task}]},
            {"role": "model", "parts": [{"functionCall": {"id": "client_1", "name": "read_log", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "client_1", "name": "read_log", "response": {"output": output}}}]}]});
        }
    };
    if stream {
        body["stream"] = json!(true);
    }
    body
}

#[tokio::test]
async fn a_cut_tool_output_names_its_reference_and_recall_gives_it_back_whole() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let upstream = scripted_model(api, Script::ClearedRef).await;
            let mut config = recall_config(&upstream.url());
            // Room for the whole log in one answer, and in the window beside the request: an
            // operator's cap of 3,000 in a 16k window, which the newest output alone passes,
            // shortens it just enough, and leaves the room (a continuation never goes past
            // the window).
            config.recall.max_tokens = 16_000;
            for model in ["gpt-4o", "claude-sonnet-4-5", GEMINI_MODEL] {
                config.models.insert(
                    model.into(),
                    condenser::tokens::catalog::ModelOverride {
                        context_window: Some(16_000),
                        encoding: None,
                        price: None,
                    },
                );
            }
            config.context.max_prompt_tokens = 3_000;
            let proxy = Proxy::start(config).await;
            let path = api.path(stream);
            let (response, _) = post(&proxy, &path, &[], &tool_session(api, stream)).await;
            assert_eq!(response.status(), 200, "{api:?} stream={stream}");
            assert_eq!(header(&response, "x-condenser-action"), "trimmed");
            let (text, raw) = api.client_text(response, stream).await;
            assert!(!raw.contains(TOOL), "{api:?} stream={stream}: {raw}");
            let requests = model_requests(&upstream);
            assert_eq!(requests.len(), 2, "{api:?} stream={stream}");
            let first = requests[0].to_string();
            assert!(
                first.contains("tokens removed; condenser_recall ctx:"),
                "{api:?}"
            );
            assert!(
                !first.contains("test_port_binding_23456"),
                "{api:?}: the cut kept it"
            );
            assert!(api.offers_recall(&requests[0]));
            let answer = api.answers(&requests[1]).unwrap();
            // The whole output, as the client sent it, in the item recall gives back.
            let escaped = serde_json::to_string(&long_log()).unwrap();
            assert!(
                answer.contains(&escaped[1..escaped.len() - 1]),
                "{api:?} stream={stream}: {}",
                &answer[..answer.len().min(300)]
            );
            assert!(text.contains("test_port_binding_23456"), "{api:?}: {text}");
            assert!(upstream.summarizer_calls().is_empty());
        }
    }
}

#[tokio::test]
async fn a_failed_continuation_is_an_error_to_the_client_never_an_empty_success() {
    for api in Fixture::all() {
        for stream in [false, true] {
            let (upstream, proxy) = scripted(api, Script::FailedContinuation).await;
            let response = ask(&proxy, api, stream).await;
            let status = response.status();
            let raw = if stream {
                stream_text(response).await
            } else {
                response.text().await.unwrap()
            };
            assert!(!raw.contains(TOOL), "{api:?} stream={stream}: {raw}");
            assert_eq!(
                model_requests(&upstream).len(),
                2,
                "{api:?} stream={stream}"
            );
            if stream {
                // The stream had begun: it ends with an error event in the API's own format.
                assert_eq!(status, 200);
                // Its last event: the last `data:` line, and the line naming it, if any.
                let lines: Vec<&str> = raw.trim_end().lines().collect();
                let at = lines.iter().rposition(|l| l.starts_with("data: ")).unwrap();
                let last = lines[at.saturating_sub(1)..].join("\n");
                let data: Value = serde_json::from_str(&lines[at]["data: ".len()..]).unwrap();
                assert!(
                    lines[at + 1..].is_empty(),
                    "{api:?}: nothing after the error: {last}"
                );
                let message = match api {
                    Fixture::Chat | Fixture::Messages | Fixture::Gemini => {
                        &data["error"]["message"]
                    }
                    Fixture::Responses => &data["message"],
                };
                assert!(message.as_str().unwrap().contains("500"), "{api:?}: {last}");
                // Named events, where the API names them.
                if matches!(api, Fixture::Responses | Fixture::Messages) {
                    assert!(lines[at - 1].starts_with("event: error"), "{api:?}: {last}");
                }
            } else {
                assert_eq!(status, 500, "{api:?}: upstream's error, relayed");
            }
            assert_eq!(recalls(&proxy, api, "failed").await, Some(1.0), "{api:?}");
        }
    }
}

#[tokio::test]
async fn the_official_sdks_read_a_recalled_reply_plain_and_streamed() {
    for api in Fixture::all() {
        let (upstream, proxy) = scripted(api, Script::AllRefs).await;
        let (name, base, package) = match api {
            Fixture::Chat => ("chat", proxy.url("/v1"), "openai"),
            Fixture::Responses => ("responses", proxy.url("/v1"), "openai"),
            Fixture::Messages => ("messages", proxy.url(""), "anthropic"),
            Fixture::Gemini => ("gemini", proxy.url(""), "google-genai"),
        };
        let stdout = run_sdk_script("recall_sdk.py", &[&base, name, DECISION], package).await;
        assert!(
            stdout.contains(&format!("{name} plain: recalled")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("{name} stream: recalled")),
            "{stdout}"
        );
        assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
        // Two requests, plain and streamed, each sent on once: the model's first reply recalled.
        assert_eq!(model_requests(&upstream).len(), 4, "{api:?}");
    }
}

#[tokio::test]
async fn two_histories_that_open_alike_each_recall_their_own_items() {
    // Same head and first item, so the same references; a different decision at one of them.
    let other = "Decision: we bind the service to port 34567 and never to 9090.";
    for api in Fixture::all() {
        let (_upstream, proxy) = scripted(api, Script::AllRefs).await;
        for (decision, not) in [(DECISION, other), (other, DECISION)] {
            let response = ask_with(&proxy, api, &body_deciding(api, decision, false), false).await;
            assert_eq!(response.status(), 200);
            let (text, _) = api.client_text(response, false).await;
            assert!(text.contains(decision), "{api:?}: {text}");
            assert!(
                !text.contains(not),
                "{api:?}: another history's item: {text}"
            );
        }
    }
}

#[tokio::test]
async fn an_item_the_client_masked_since_it_was_summarized_is_recalled_as_archived() {
    // Gemini CLI replaces an older output by a stub of its own once it is far back; the
    // summary of an earlier request had archived it whole.
    let mask = "<tool_output_masked>\n[Tool output masked to preserve context window. Full \
                string saved to: /tmp/tool-outputs/read_file_1.txt]\n</tool_output_masked>";
    for api in Fixture::all() {
        let (upstream, proxy) = scripted(api, Script::Query).await;
        let response = ask_with(&proxy, api, &body_deciding(api, DECISION, false), false).await;
        assert_eq!(response.status(), 200);
        let response = ask_with(&proxy, api, &body_deciding(api, mask, false), false).await;
        assert_eq!(response.status(), 200);
        let (text, _) = api.client_text(response, false).await;
        // Only the archive holds it: the second request carries the stub, and its summary
        // keeps nothing.
        assert!(text.contains(DECISION), "{api:?}: {text}");
        let continued = model_requests(&upstream).pop().unwrap();
        let answer = api.answers(&continued).unwrap();
        assert!(!answer.contains("tool_output_masked"), "{api:?}: {answer}");
    }
}

/// The signature the scripted Claude gives its round's thinking block: Anthropic checks a
/// continued turn's thinking against it.
const SIGNATURE: &str = "EqQBCkYIBxgCKkDsigned-by-the-model";

fn thinking_block(round: u32) -> Value {
    json!({"type": "thinking", "thinking": format!("Round {round}: the port was decided early on."),
        "signature": format!("{SIGNATURE}-{round}")})
}

/// Anthropic's rule with thinking on: the assistant turn whose `tool_use` the last user turn
/// answers opens with the round's thinking block, signed as it was given.
fn opens_with_signed_thinking(request: &Value) -> Result<(), String> {
    let messages = request["messages"].as_array().ok_or("no messages")?;
    let at = messages.len().checked_sub(2).ok_or("no assistant turn")?;
    let first = &messages[at]["content"][0];
    if *first == thinking_block(1) {
        return Ok(());
    }
    Err(format!(
        "messages.{at}.content.0.type: Expected `thinking` or `redacted_thinking`, but found \
         `{}`. When `thinking` is enabled, a final `assistant` message must start with a \
         thinking block",
        first["type"]
    ))
}

/// A Messages reply of `blocks`, whole or streamed block by block as Anthropic streams them.
fn messages_reply(blocks: Vec<Value>, stop: &str, stream: bool) -> Response<ProxyBody> {
    if !stream {
        return json_response(
            200,
            &json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                "content": blocks, "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 100, "output_tokens": 10}}),
        );
    }
    let mut events = vec![message_start()];
    for (index, block) in blocks.iter().enumerate() {
        let (start, deltas) = match block["type"].as_str() {
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            Some("text") => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
            _ => {
                let mut start = block.clone();
                start["input"] = json!({});
                let input = block["input"].to_string();
                (
                    start,
                    vec![json!({"type": "input_json_delta", "partial_json": input})],
                )
            }
        };
        events.push(anthropic_event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            events.push(anthropic_event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(anthropic_event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(message_end(stop));
    events.push(anthropic_event(
        "message_stop",
        json!({"type": "message_stop"}),
    ));
    sse_response(events, None)
}

/// A Claude that thinks before every answer, as with extended or adaptive thinking: it
/// recalls whenever condenser offers the tool, and refuses a continuation that does not open
/// with its round's signed thinking, as Anthropic does.
async fn thinking_claude() -> MockUpstream {
    MockUpstream::start(handler(move |r| async move {
        let request: Value = serde_json::from_slice(&r.body).unwrap();
        if is_summarizer_call(&r) {
            return json_response(200, &summary_reply("/v1/messages", &lossy_summary(&request)));
        }
        assert!(request["thinking"]["type"] != "disabled", "{}", request["thinking"]);
        let stream = request["stream"] == json!(true);
        if let Some(answers) = Fixture::Messages.answers(&request) {
            if let Err(message) = opens_with_signed_thinking(&request) {
                return json_response(
                    400,
                    &json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
                );
            }
            let text = json!({"type": "text", "text": format!("Recalled: {answers}")});
            return messages_reply(vec![thinking_block(2), text], "end_turn", stream);
        }
        if !Fixture::Messages.offers_recall(&request) {
            let text = json!({"type": "text", "text": "no recall offered"});
            return messages_reply(vec![thinking_block(1), text], "end_turn", stream);
        }
        let call = json!({"type": "tool_use", "id": "call_think", "name": TOOL,
            "input": {"refs": named_references(&request)}});
        messages_reply(vec![thinking_block(1), call], "tool_use", stream)
    }))
    .await
}

/// With extended or adaptive thinking, a continued assistant turn must open with the round's
/// signed thinking: the continuation carries the round whole, so a thinking request is
/// offered recall like any other, and recalls what its summary dropped.
#[tokio::test]
async fn a_thinking_request_recalls_and_its_continuation_opens_with_the_signed_thinking() {
    for thinking in [
        json!({"type": "enabled", "budget_tokens": 1024}),
        json!({"type": "adaptive"}),
    ] {
        for stream in [false, true] {
            let upstream = thinking_claude().await;
            let proxy = Proxy::start(recall_config(&upstream.url())).await;
            let mut body = body(Fixture::Messages, stream);
            body["thinking"] = thinking.clone();
            let response = ask_with(&proxy, Fixture::Messages, &body, stream).await;
            assert_eq!(response.status(), 200);
            assert_eq!(header(&response, "x-condenser-action"), "summarized");
            let (text, raw) = Fixture::Messages.client_text(response, stream).await;
            let label = format!("{thinking} stream={stream}");
            assert!(text.contains(DECISION), "{label}: {text}");
            assert!(!raw.contains(TOOL), "{label}: {raw}");
            // The client gets both rounds' thinking, signed as the model signed it.
            for round in ["1", "2"] {
                assert!(
                    raw.contains(&format!("{SIGNATURE}-{round}")),
                    "{label}: {raw}"
                );
            }
            let requests = model_requests(&upstream);
            assert_eq!(requests.len(), 2, "{label}");
            assert!(Fixture::Messages.offers_recall(&requests[0]));
            assert!(archive_note(&requests[0]).is_some());
            assert_eq!(opens_with_signed_thinking(&requests[1]), Ok(()), "{label}");
            assert_eq!(
                recalls(&proxy, Fixture::Messages, "served").await,
                Some(1.0)
            );
        }
    }
}

/// The official `anthropic` SDK with thinking on reads a recalled reply, plain and streamed,
/// with its own accumulator: both rounds' signed thinking, then the answer.
#[tokio::test]
async fn the_anthropic_sdk_with_thinking_reads_a_recalled_reply_plain_and_streamed() {
    let upstream = thinking_claude().await;
    let proxy = Proxy::start(recall_config(&upstream.url())).await;
    let stdout = run_sdk_script(
        "recall_sdk.py",
        &[&proxy.url(""), "messages-thinking", DECISION],
        "anthropic",
    )
    .await;
    for label in ["plain", "stream"] {
        assert!(
            stdout.contains(&format!("messages-thinking {label}: recalled")),
            "{stdout}"
        );
    }
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let requests = model_requests(&upstream);
    assert_eq!(requests.len(), 4);
    for continuation in [&requests[1], &requests[3]] {
        assert_eq!(opens_with_signed_thinking(continuation), Ok(()));
    }
}

/// The tokens `with_four_thousand_usable` leaves a request of `Fixture::body`'s.
const FOUR_THOUSAND_USABLE: u64 = 4_000;

/// `config` with 4,000 tokens usable in every API: a Messages request of `Fixture::body`'s
/// reserves its `max_tokens` (500) of a 4,500 window, the others half the 8,000 window.
fn with_four_thousand_usable(config: &mut condenser::Config) {
    config.models.insert(
        "claude-sonnet-4-5".into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(4_500),
            encoding: None,
            price: None,
        },
    );
}

/// Three recall calls over three rounds, each asking for every archived item: together the
/// answers are more than the window has room for. They share the request's one budget, so
/// no continuation goes past the window (the answer that would not fit is cut, and says so).
#[tokio::test]
async fn a_requests_recall_answers_share_one_budget_and_no_continuation_passes_the_window() {
    for api in Fixture::all() {
        let upstream = scripted_model(api, Script::Always).await;
        let mut config = recall_config(&upstream.url());
        config.recall.max_rounds = 3;
        with_four_thousand_usable(&mut config);
        let usable = FOUR_THOUSAND_USABLE;
        let proxy = Proxy::start(config).await;
        let response = ask(&proxy, api, false).await;
        assert_eq!(response.status(), 200, "{api:?}");
        let requests = model_requests(&upstream);
        assert!(requests.len() >= 2, "{api:?}: no continuation");
        let mut answered = 0;
        for (round, request) in requests.iter().enumerate().skip(1) {
            let tokens = u64::from(counted(api, request).await);
            assert!(
                tokens <= usable,
                "{api:?}: continuation {round} is {tokens} of {usable}"
            );
            answered += api.answers(request).map_or(0, |answer| answer.len());
        }
        // Three whole answers would not fit: the room ran out before the round limit, the
        // last continuation told the model to answer, and its answer was cut or refused.
        let whole = api.answers(&requests[1]).unwrap_or_default().len();
        assert!(answered < 3 * whole, "{api:?}: {answered} bytes answered");
        let last = requests.last().unwrap();
        let choice = api.tool_choice(last);
        assert_eq!(choice, Some(&api.no_tools()), "{api:?}: {choice:?}");
        let said = api.answers(last).unwrap_or_default();
        assert!(
            said.contains("left") || said.contains("over the budget"),
            "{api:?}: {said}"
        );
    }
}

/// A Responses API that stores what it answers, as OpenAI does unless `store` is false: a
/// request chains on a stored response by `previous_response_id`, and is refused when that
/// response ends in a function call its input does not answer.
async fn storing_responses() -> MockUpstream {
    let stored: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
    MockUpstream::start(handler(move |r| {
        let stored = stored.clone();
        async move {
            let request: Value = serde_json::from_slice(&r.body).unwrap();
            if is_summarizer_call(&r) {
                return json_response(200, &summary_reply("/v1/responses", &lossy_summary(&request)));
            }
            let mut stored = stored.lock().unwrap();
            let text = |text: String| {
                json!([{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}])
            };
            let output = if let Some(previous) = request["previous_response_id"].as_str() {
                let index: usize = previous["resp_".len()..].parse().unwrap();
                let input = request["input"].as_array().cloned().unwrap_or_default();
                let unanswered = stored[index - 1]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|item| item["type"] == "function_call")
                    .find(|call| {
                        !input.iter().any(|item| {
                            item["type"] == "function_call_output" && item["call_id"] == call["call_id"]
                        })
                    })
                    .cloned();
                if let Some(call) = unanswered {
                    let message = format!("No tool output found for function call {}.", call["call_id"].as_str().unwrap());
                    return json_response(400, &json!({"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": null}}));
                }
                text("chained".into())
            } else if let Some(answers) = Fixture::Responses.answers(&request) {
                text(format!("Recalled: {answers}"))
            } else if Fixture::Responses.offers_recall(&request) {
                json!([{"type": "function_call", "id": "fc_1", "call_id": "call_store", "name": TOOL,
                    "arguments": json!({"refs": named_references(&request)}).to_string(), "status": "completed"}])
            } else {
                text("no recall offered".into())
            };
            stored.push(output.clone());
            let id = format!("resp_{}", stored.len());
            json_response(200, &json!({"id": id, "object": "response", "status": "completed",
                "output": output, "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}}))
        }
    }))
    .await
}

/// A stored reply that condenser continued: the client gets the id of the last round, which
/// upstream stored with the recall call answered, so a later request chains on it. (The first
/// round's stored response ends in condenser's unanswered call: chaining on it is refused.)
#[tokio::test]
async fn a_stored_response_that_recalled_is_one_a_later_request_can_chain_on() {
    let upstream = storing_responses().await;
    let proxy = Proxy::start(recall_config(&upstream.url())).await;
    let response = ask(&proxy, Fixture::Responses, false).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-recalls"), "1");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["id"], "resp_2", "{reply}");
    assert!(reply.to_string().contains(DECISION));
    let chain = |previous: &str| {
        json!({"model": "gpt-4o", "previous_response_id": previous,
            "input": [{"role": "user", "content": "Thanks. Which port again?"}]})
    };
    let chained = client()
        .post(proxy.url("/v1/responses"))
        .json(&chain(reply["id"].as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(chained.status(), 200);
    let chained: Value = chained.json().await.unwrap();
    assert_eq!(chained["output"][0]["content"][0]["text"], "chained");
    let on_the_first_round = client()
        .post(proxy.url("/v1/responses"))
        .json(&chain("resp_1"))
        .send()
        .await
        .unwrap();
    assert_eq!(on_the_first_round.status(), 400);
}

/// An agent reading logs of 300 to 700 tokens at once in each API, its summarizer slow, the model
/// calling recall whenever it is offered: many requests go with their middle cut up near the
/// hard limit. Each that offers recall keeps room for the model's call to be answered, so the
/// client always gets an answer, never a reply with the call taken out and nothing left.
#[tokio::test]
async fn every_request_that_offers_recall_has_room_to_answer_the_call() {
    for api in Fixture::all() {
        let upstream = MockUpstream::start(handler(move |r| async move {
            let request: Value = serde_json::from_slice(&r.body).unwrap();
            if is_summarizer_call(&r) {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                let path = r.path_and_query.split('?').next().unwrap_or("").to_string();
                return json_response(200, &summary_reply(&path, &lossy_summary(&request)));
            }
            let reply = if let Some(answers) = api.answers(&request) {
                api.text_reply(&format!("Recalled: {answers}"), false, None)
            } else if api.offers_recall(&request) {
                let query = json!({"query": "which log said what"});
                api.call_reply(&[(TOOL, query)], false)
            } else {
                api.text_reply("read on", false, None)
            };
            api.reporting_usage(reply, &request).await
        }))
        .await;
        let mut config = Fixture::config(&upstream.url());
        with_four_thousand_usable(&mut config);
        // The trigger near the hard limit: under it a request goes as it grew, so the session
        // rides up where the room is short (at 0.8, a stand-in brings each request over the
        // trigger down to the target, and none come near the hard limit).
        config.context.trigger_ratio = 0.95;
        let proxy = api.warmed(config).await;
        let ask = [("user", "Read the logs one by one and report.".to_string())];
        let opening = api.body(&ask, false);
        let mut items = api.items(&opening);
        let (mut offered, mut tight) = (0, 0);
        for round in 0..72 {
            let words = 200 + round * 97 % 300;
            items.extend(api.tool_round(round, "read_log", &filler(round, words)));
            let body = api.with_items(opening.clone(), &items);
            let before = model_requests(&upstream).len();
            let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{api:?}: round {round}");
            let forwarded = condensed.forwarded_tokens.unwrap();
            assert!(
                forwarded <= FOUR_THOUSAND_USABLE,
                "{api:?}: round {round}, {forwarded} forwarded"
            );
            let (said, reply) = api.client_text(response, false).await;
            if model_requests(&upstream)
                .get(before)
                .is_some_and(|sent| api.offers_recall(sent))
            {
                offered += 1;
                tight += usize::from(FOUR_THOUSAND_USABLE - forwarded < 600);
                assert!(
                    said.starts_with("Recalled: "),
                    "{api:?}: round {round}, {forwarded} forwarded: {reply}"
                );
            } else {
                assert_eq!(said, "read on", "{api:?}: round {round}");
            }
        }
        // The session went where the room is short, and recall was offered all along.
        assert!(offered >= 55, "{api:?}: {offered} requests offered recall");
        assert!(
            tight >= 3,
            "{api:?}: {tight} requests within 600 tokens of the hard limit"
        );
    }
}

/// The conversation of `body_deciding`, its model's first reply `first_reply` (what the
/// model wrote differs from one history to the next: a reply, a tool call's id).
fn body_opening(api: Fixture, first_reply: &str, decision: &str) -> Value {
    let body = body_deciding(api, decision, false);
    let mut items = api.items(&body);
    let at = items
        .iter()
        .position(|item| matches!(item["role"].as_str(), Some("assistant" | "model")))
        .unwrap();
    let replaced = api.plain_items(&[("user", "x".into()), ("assistant", first_reply.into())]);
    items[at] = replaced[replaced.len() - 1].clone();
    api.with_items(body, &items)
}

/// Two keyless callers whose conversations open alike, one system prompt and one first
/// message: where condenser injects the operator's key every caller is keyless. B masks the
/// item where A's decision was, as a client that masks its older outputs does; A's archived
/// decision is not B's to recall, and the two histories share no reference. A still recalls
/// its own (issue 55, item 5).
#[tokio::test]
async fn a_keyless_history_never_recalls_what_another_that_opened_alike_archived() {
    let mask = "<tool_output_masked>\n[Tool output masked to preserve context window.]\n</tool_output_masked>";
    for api in Fixture::all() {
        let (upstream, proxy) = scripted(api, Script::Query).await;
        let a = |decision| body_opening(api, "msg-a0. Looking at the service now.", decision);
        let b = body_opening(api, "msg-a0. Let me check the configuration first.", mask);
        // A: its decision taken out by a summary, archived; recalled while the item is whole.
        let response = ask_with(&proxy, api, &a(DECISION), false).await;
        assert_eq!(response.status(), 200, "{api:?}");
        let (text, _) = api.client_text(response, false).await;
        assert!(text.contains("23456"), "{api:?}: {text}");
        let a_references = named_references(&model_requests(&upstream)[0]);
        // B, keyless too, with the decision's item masked: nothing of A's comes back.
        let response = ask_with(&proxy, api, &b, false).await;
        assert_eq!(response.status(), 200, "{api:?}");
        let (text, _) = api.client_text(response, false).await;
        assert!(
            !text.contains("23456"),
            "{api:?}: A's item recalled by B: {text}"
        );
        let b_request = model_requests(&upstream)
            .into_iter()
            .rfind(|request| api.answers(request).is_none())
            .unwrap();
        let b_references = named_references(&b_request);
        assert!(!b_references.is_empty(), "{api:?}");
        assert!(
            a_references.iter().all(|r| !b_references.contains(r)),
            "{api:?}: shared references {a_references:?} {b_references:?}"
        );
        // A, its item masked since: recalled from the archive, as its own.
        let response = ask_with(&proxy, api, &a(mask), false).await;
        assert_eq!(response.status(), 200, "{api:?}");
        let (text, _) = api.client_text(response, false).await;
        assert!(text.contains(DECISION), "{api:?}: {text}");
    }
}
