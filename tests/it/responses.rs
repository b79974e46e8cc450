//! The OpenAI Responses API (`POST /v1/responses`) through the proxy, against a recording
//! mock upstream: compaction in the documented shape, pairs kept together, stateful and
//! small requests forwarded byte for byte, streaming relayed event by event, errors, single
//! flight, fallback, the official Python SDK, and a property over random tool conversations.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use condenser::compaction::plan::{Decision, Mode};
use condenser::compaction::rewrite::{Action, CacheOutcome, Rewrite};
use condenser::compaction::summary::Summary;
use condenser::dialect::responses::Responses;
use condenser::dialect::stages::{Dialect, Settings};
use condenser::tokens::catalog::ModelCatalog;
use condenser::tokens::counter::TokenCounter;
use condenser::tokens::encoding::Encoding;
use futures_util::StreamExt;
use proptest::prelude::*;
use serde_json::{json, Value};

async fn post(proxy: &Proxy, body: impl Into<reqwest::Body>) -> reqwest::Response {
    client()
        .post(proxy.url("/v1/responses"))
        .header("authorization", "Bearer sk-user-1")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The requests forwarded upstream; summaries are asked on the same path, in the same API.
fn responses_requests(upstream: &MockUpstream) -> Vec<Recorded> {
    upstream
        .recorded()
        .into_iter()
        .filter(|r| r.path_and_query == "/v1/responses" && !is_summarizer_call(r))
        .collect()
}

/// Head verbatim, one developer summary of N items, then the original's last items
/// verbatim; returns N.
fn assert_compacted_shape(original: &[Value], forwarded: &[Value]) -> usize {
    assert_eq!(
        forwarded[0], original[0],
        "the developer head first, verbatim"
    );
    assert_eq!(forwarded[1]["type"], "message");
    assert_eq!(forwarded[1]["role"], "developer");
    let summary = forwarded[1]["content"].as_str().unwrap();
    let n: usize = summary
        .strip_prefix("[Context summary: ")
        .and_then(|s| s.split_once(" earlier items]"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("summary prefix missing: {summary}"));
    let tail = &forwarded[2..];
    assert_eq!(
        1 + n + tail.len(),
        original.len(),
        "the summary covers what was dropped"
    );
    assert_eq!(
        tail,
        &original[original.len() - tail.len()..],
        "recent items verbatim"
    );
    assert_pairs_intact(original, forwarded);
    n
}

#[tokio::test]
async fn an_over_threshold_conversation_is_summarized_in_the_documented_shape() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let original = tool_conversation(30);
    assert_eq!(original.len(), 121);
    let sent_body = responses_body(&original);
    let response = post(&proxy, sent_body.to_string()).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert_eq!(header(&response, "x-condenser-cache"), "miss");
    let received = Condensed::of(&response).prompt_tokens.unwrap();
    let forwarded = Condensed::of(&response).forwarded_tokens.unwrap();
    let summarized = header(&response, "x-condenser-summarized-messages");
    eprintln!("120 input items after the head: received {received} tokens, forwarded {forwarded}");
    assert!(received > 6_000, "over the trigger: {received}");
    assert!(forwarded <= 3_750, "under the target: {forwarded}");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["object"], "response", "the upstream reply relayed");

    let sent = responses_requests(&upstream);
    assert_eq!(sent.len(), 1);
    let body = sent[0].json();
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "model",
            "instructions",
            "input",
            "max_output_tokens",
            "store",
            "tools"
        ]
    );
    assert_eq!(
        body["instructions"], SYSTEM_PROMPT,
        "instructions never change"
    );
    assert_eq!(without_recall_tool(&body)["tools"], sent_body["tools"]);
    let input = body["input"].as_array().unwrap();
    let n = assert_compacted_shape(&original, input);
    assert_eq!(summarized, n.to_string());
    let summary = input[1]["content"].as_str().unwrap();
    assert!(summary.contains("ORD-4411"), "{summary}");

    let calls = upstream.summarizer_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].path_and_query, "/v1/responses",
        "a Responses route summarizes in the Responses API"
    );
    assert_eq!(calls[0].headers["authorization"], "Bearer sk-user-1");
    let transcript = calls[0].json()["input"].as_str().unwrap().to_string();
    assert!(
        transcript.contains("msg-u0.") && transcript.contains("result-0."),
        "{transcript}"
    );
    assert!(
        transcript.contains("search({\"query\":\"q0\"})"),
        "calls shown: {transcript}"
    );
}

#[tokio::test]
async fn under_the_trigger_the_body_goes_byte_for_byte() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let bodies = [
        r#"{ "model":"gpt-4o", "zeta":1, "input":"say hello",  "alpha":{"b":2,"a":1.50} }"#
            .to_string(),
        format!(
            "{{\"model\":\"gpt-4o\",\"instructions\":\"be brief\",\"input\":{}}}",
            serde_json::to_string(&tool_conversation(2)).unwrap()
        ),
    ];
    for (i, body) in bodies.iter().enumerate() {
        let response = post(&proxy, body.clone()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-condenser-action"), "forwarded");
        assert!(Condensed::of(&response).prompt_tokens.unwrap() > 0);
        assert_eq!(
            responses_requests(&upstream)[i].body.as_ref(),
            body.as_bytes()
        );
    }
    assert!(upstream.summarizer_calls().is_empty());
}

/// Item types and roles condenser does not know (Codex sends `custom_tool_call`s,
/// `compaction` items, server-side `web_search_call`s) are opaque items: byte for byte while
/// nothing is compacted, counted, and in their place once compacted.
#[tokio::test]
async fn items_condenser_does_not_know_are_carried_in_their_place() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let unknown = [
        json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-opaque"}),
        json!({"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "eu-west-1 outage"}}),
        json!({"type": "message", "role": "critic", "content": "looks fine"}),
    ];
    let mut items = tool_conversation(30);
    let end = items.len();
    for (i, item) in unknown.iter().enumerate() {
        items.insert(end - 4 * i, item.clone());
    }
    let body = responses_body(&items).to_string();
    let response = client()
        .post(proxy.url("/v1/responses"))
        .header("x-condenser-mode", "off")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        responses_requests(&upstream)[0].body.as_ref(),
        body.as_bytes()
    );
    let response = post(&proxy, body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    let forwarded = responses_requests(&upstream)[1].json();
    let input = forwarded["input"].as_array().unwrap();
    let kept: Vec<&Value> = input.iter().filter(|i| unknown.contains(i)).collect();
    assert_eq!(kept.len(), 3, "all three in the kept tail: {input:#?}");
    let positions: Vec<usize> = unknown
        .iter()
        .map(|u| input.iter().position(|i| i == u).unwrap())
        .collect();
    assert!(
        positions[2] < positions[1] && positions[1] < positions[0],
        "in order"
    );
}

#[tokio::test]
async fn stateful_requests_and_other_responses_paths_go_as_sent_however_long() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let long = tool_conversation(30);
    for (field, value) in [
        ("previous_response_id", "resp_prev"),
        ("conversation", "conv_1"),
    ] {
        let mut body = responses_body(&long);
        body[field] = json!(value);
        let bytes = body.to_string();
        let response = post(&proxy, bytes.clone()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-condenser-action"),
            "forwarded",
            "{field}"
        );
        assert!(Condensed::of(&response).prompt_tokens.unwrap() > 6_000);
        assert_eq!(
            responses_requests(&upstream).last().unwrap().body.as_ref(),
            bytes.as_bytes()
        );
    }
    let compact = responses_body(&long).to_string();
    let response = client()
        .post(proxy.url("/v1/responses/compact"))
        .body(compact.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-condenser-action"),
        "",
        "passed through"
    );
    let recorded = upstream.recorded();
    let last = recorded.last().unwrap();
    assert_eq!(last.path_and_query, "/v1/responses/compact");
    assert_eq!(last.body.as_ref(), compact.as_bytes());
    assert!(upstream.summarizer_calls().is_empty());
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_requests_total{route="responses",status="200"}"#
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn a_stream_is_relayed_event_by_event_and_its_usage_read_at_completion() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let upstream = mock_responses_llm(LlmBehaviour::default(), Some(gate.clone())).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let mut body = responses_body(&tool_conversation(30));
    body["stream"] = json!(true);
    let response = post(&proxy, body.to_string()).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert!(header(&response, "content-type").starts_with("text/event-stream"));
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    // The mock holds everything after `response.created` until the gate opens: what arrives
    // first was relayed on its own.
    while !text.contains("\n\n") {
        let chunk = within("response.created", stream.next())
            .await
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.starts_with("event: response.created\n"), "{text}");
    assert!(!text.contains("response.output_text.delta"), "{text}");
    gate.notify_one();
    while let Some(chunk) = within("the rest", stream.next()).await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"response.created"));
    assert_eq!(events.last(), Some(&"response.completed"));
    assert!(events.contains(&"response.output_text.delta"));
    let forwarded_items = responses_requests(&upstream)[0].json()["input"]
        .as_array()
        .unwrap()
        .len();
    assert!(
        text.contains(&format!("\"text\":\"reply to {forwarded_items} items\"")),
        "{text}"
    );

    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_completion_tokens_total{model="gpt-4o"}"#
        ),
        Some(RESPONSES_STREAM_OUTPUT_TOKENS as f64),
        "usage read from response.completed"
    );
    assert!(
        metric(&metrics, r#"condenser_prompt_tokens_total{model="gpt-4o"}"#).unwrap() > 6_000.0
    );
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors_and_never_reach_upstream() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let too_long =
        json!({"model": "gpt-4o", "input": [{"role": "user", "content": filler(1, 9_000)}]})
            .to_string();
    for (body, code, param) in [
        (r#"{"model":"gpt-4o","input":"#, "invalid_json", Value::Null),
        (r#"["gpt-4o"]"#, "invalid_request", Value::Null),
        (r#"{"input":"hi"}"#, "invalid_request", json!("model")),
        (
            r#"{"model":"gpt-4o","input":42}"#,
            "invalid_request",
            json!("input"),
        ),
        // A last item larger than the window: the field named is the Responses API's own.
        (too_long.as_str(), "context_length_exceeded", json!("input")),
    ] {
        let response = post(&proxy, body.to_string()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(error["error"]["code"], code, "{body}");
        assert_eq!(error["error"]["param"], param, "{body}");
        assert!(!error["error"]["message"].as_str().unwrap().is_empty());
    }
    assert!(upstream.recorded().is_empty());
}

#[tokio::test]
async fn the_openai_python_sdk_responses_create_works_through_condenser() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let stdout = run_sdk_script("openai_responses.py", &[&proxy.url("/v1")], "openai").await;
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let sent = responses_requests(&upstream);
    assert_eq!(sent.len(), 2, "plain and streamed");
    for request in &sent {
        assert_eq!(request.headers["authorization"], "Bearer sk-sdk-test");
        let body = request.json();
        let input = body["input"].as_array().unwrap();
        assert!(input.len() < 121, "compacted: {}", input.len());
        assert!(input[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("[Context summary: "));
    }
    assert_eq!(sent[1].json()["stream"], true);
    assert_eq!(
        upstream.summarizer_calls().len(),
        1,
        "the second request reuses the summary"
    );
}

/// One random conversation segment.
#[derive(Debug, Clone)]
enum Segment {
    User(usize),
    Assistant(usize),
    Reasoning,
    /// Parallel calls, each with its output (of so many words) and when it is answered;
    /// outputs answered now come in the given order.
    Calls {
        outputs: Vec<(usize, Answer)>,
        reversed: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Now,
    Never,
    /// After the next group's calls (or at the end): apart from its call.
    Late,
}

fn segment() -> impl Strategy<Value = Segment> {
    prop_oneof![
        4 => (5usize..300).prop_map(Segment::User),
        3 => (5usize..300).prop_map(Segment::Assistant),
        1 => Just(Segment::Reasoning),
        4 => (prop::collection::vec((5usize..400, answer()), 1..4), any::<bool>())
            .prop_map(|(outputs, reversed)| Segment::Calls { outputs, reversed }),
    ]
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![16 => Just(Answer::Now), 1 => Just(Answer::Never), 1 => Just(Answer::Late)]
}

/// The conversation's items; with `orphan`, an output whose call is nowhere goes in there.
fn build(segments: &[Segment], orphan: Option<prop::sample::Index>) -> Vec<Value> {
    let mut items = vec![json!({"role": "developer", "content": "rules"})];
    let mut next_call = 0;
    let mut late = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        match segment {
            Segment::User(words) => items.push(json!({"role": "user", "content": filler(i, *words)})),
            Segment::Assistant(words) => items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": filler(i, *words)}]})),
            Segment::Reasoning => items.push(json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [], "encrypted_content": filler(i, 40)})),
            Segment::Calls { outputs, reversed } => {
                let ids: Vec<String> = outputs.iter().map(|_| { next_call += 1; format!("call_{next_call}") }).collect();
                for id in &ids {
                    items.push(json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"}));
                }
                items.append(&mut late);
                let output = |id: &String, words: usize| json!({"type": "function_call_output", "call_id": id, "output": filler(i, words)});
                let mut answers: Vec<Value> = Vec::new();
                for (id, &(words, answer)) in ids.iter().zip(outputs) {
                    match answer {
                        Answer::Now => answers.push(output(id, words)),
                        Answer::Late => late.push(output(id, words)),
                        Answer::Never => {}
                    }
                }
                if *reversed {
                    answers.reverse();
                }
                items.extend(answers);
            }
        }
    }
    items.append(&mut late);
    if let Some(at) = orphan {
        let at = 1 + at.index(items.len());
        items.insert(
            at,
            json!({"type": "function_call_output", "call_id": "call_nowhere", "output": "lost"}),
        );
    }
    items
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn compaction_never_parts_a_call_from_its_output(
        segments in prop::collection::vec(segment(), 1..40),
        force in any::<bool>(),
        orphan in prop::option::weighted(0.1, any::<prop::sample::Index>()),
    ) {
        let items = build(&segments, orphan);
        let mut config = small_window_config("http://127.0.0.1:9");
        config.models.get_mut("gpt-4o").unwrap().context_window = Some(3_000);
        let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
        let counter = TokenCounter::new(config.tokens.unknown_model_margin);
        let body = json!({"model": "gpt-4o", "instructions": "be brief", "input": items}).to_string();
        let request = Responses::parse(body.as_bytes(), Responses::PATH).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let prepared = runtime.block_on(Responses::count(&request, &catalog, &counter));
        prop_assert_eq!(prepared.metas.len(), items.len());
        if orphan.is_some() {
            prop_assert!(Responses::forward_as_sent(&request).is_some(), "an orphan output goes as sent");
            return Ok(());
        }
        let late = segments.iter().any(|segment| matches!(segment, Segment::Calls { outputs, .. } if outputs.iter().any(|(_, answer)| *answer == Answer::Late)));
        if Responses::forward_as_sent(&request).is_some() {
            prop_assert!(late, "only outputs apart from their calls go as sent");
            return Ok(());
        }
        let mode = if force { Mode::Force } else { Mode::Auto };
        let settings = Settings { context: &config.context, recall: config.recall };
        let input = prepared.plan_input(&config, settings, mode);
        let Decision::Compact { split, .. } = prepared.decide(&input) else {
            return Ok(());
        };
        // Every place the compactor may end a summary, and a trim.
        let ends = split.summary_ends.iter().map(|&end| (end, true)).chain([(split.tail_start, false)]);
        for (kept_from, summarized) in ends {
            let mut request = Responses::parse(body.as_bytes(), Responses::PATH).unwrap();
            let rewrite = Rewrite {
                summary: summarized.then(|| Arc::new(Summary {
                    text: "earlier work".into(),
                    messages: kept_from - split.head,
                    tokens: 2,
                    model: "gpt-4o-mini".into(),
                    created_at: 0,
                    stand_in: false,
                })),
                kept_from,
                pinned: split.pinned_before(kept_from),
                cuts: split.shorten.clone(),
                action: if summarized { Action::Summarized } else { Action::Trimmed },
                cache: CacheOutcome::Miss,
                summarized: kept_from - split.head,
                waited: Duration::ZERO,
                archive: None,
            };
            Responses::rewrite(&mut request, &split, &rewrite, &config.context, Encoding::O200k);
            let (sent, _, _) = Responses::outgoing_body(request, body.clone().into(), true).unwrap();
            let sent: Value = serde_json::from_slice(&sent).unwrap();
            prop_assert_eq!(&sent["instructions"], "be brief");
            let forwarded = sent["input"].as_array().unwrap();
            prop_assert_eq!(&forwarded[..split.head], &items[..split.head]);
            let pinned = split.pinned_before(kept_from).unwrap_or_default();
            let after_head = split.head + pinned.len();
            prop_assert_eq!(&forwarded[split.head..after_head], &items[pinned], "the task, verbatim, first");
            let tail_from = after_head + usize::from(summarized);
            prop_assert_eq!(forwarded.len() - tail_from, items.len() - kept_from);
            assert_pairs_intact(&items, forwarded);
        }
    }
}

/// A request under every trigger is counted from its raw bytes, as the full path counts it,
/// with every field that costs tokens; a stateful one and a string input take the full path.
#[tokio::test]
async fn under_the_trigger_a_request_is_counted_from_its_bytes_as_the_full_path_counts_it() {
    let upstream = mock_responses_llm(LlmBehaviour::default(), None).await;
    let config = small_window_config(&upstream.url());
    let proxy = Proxy::start(config.clone()).await;
    let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = TokenCounter::new(config.tokens.unknown_model_margin);
    let mut full = responses_body(&tool_conversation(3));
    full["tool_choice"] = json!("auto");
    full["text"] =
        json!({"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}});
    let mut null_instructions = full.clone();
    null_instructions["instructions"] = Value::Null;
    let stateful = json!({"model": "gpt-4o", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "more"}]});
    let string_input = json!({"model": "gpt-4o", "instructions": "be brief", "input": "hello"});
    for body in [full, null_instructions, stateful, string_input] {
        let bytes = serde_json::to_vec(&body).unwrap();
        let expected = Responses::count(
            &Responses::parse(&bytes, Responses::PATH).unwrap(),
            &catalog,
            &counter,
        )
        .await
        .count
        .total;
        for _ in 0..2 {
            let response = post(&proxy, bytes.clone()).await;
            assert_eq!(response.status(), 200);
            assert_eq!(header(&response, "x-condenser-action"), "forwarded");
            assert_eq!(
                Condensed::of(&response).prompt_tokens.unwrap(),
                expected,
                "{body}"
            );
        }
        assert_eq!(responses_requests(&upstream).last().unwrap().body, bytes);
    }
}
