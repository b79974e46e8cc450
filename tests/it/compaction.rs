//! Compaction through the proxy, against a recording mock LLM.

use std::time::Duration;

use crate::common::*;
use condenser::config::OnFailure;
use serde_json::{json, Value};

/// The summarizer's calls, as JSON.
fn summarizer_requests(upstream: &MockUpstream) -> Vec<Value> {
    upstream
        .summarizer_calls()
        .iter()
        .map(Recorded::json)
        .collect()
}

#[tokio::test]
async fn a_long_conversation_is_summarized_in_the_documented_shape() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let original = conversation(40);
    let response = Fixture::Chat
        .post(&proxy, &chat_body(&original), false, &[])
        .await
        .0;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    assert_eq!(header(&response, "x-condenser-cache"), "miss");
    let received: u64 = Condensed::of(&response).prompt_tokens.unwrap();
    let forwarded: u64 = Condensed::of(&response).forwarded_tokens.unwrap();
    assert!(received > 6_000, "over the trigger: {received}");
    assert!(forwarded <= 3_750, "under the target: {forwarded}");

    let sent = upstream.forwarded();
    assert_eq!(sent.len(), 1);
    let forwarded_messages = sent[0]["messages"].as_array().unwrap();
    // Each received message is encoded once (the raw path's count carries over to the full
    // path), then what was forwarded is counted for its header by its bytes: only the
    // messages it did not send as received (the summary) are encoded again.
    let rewritten = forwarded_messages
        .iter()
        .filter(|message| !original.contains(message))
        .count();
    assert!(rewritten >= 1, "the summary is new");
    assert_eq!(
        proxy.state.counter.messages_encoded(),
        (original.len() + rewritten) as u64
    );
    let n = Fixture::Chat.assert_compacted_shape(&chat_body(&original), &sent[0], 6);
    assert_eq!(
        header(&response, "x-condenser-summarized-messages"),
        n.to_string()
    );
    let summary = forwarded_messages[1]["content"].as_str().unwrap();
    assert!(
        summary.contains("ORD-4411") && summary.contains("$1,200"),
        "{summary}"
    );
    // Every other field as sent, in order.
    let as_written = without_recall_tool(&sent[0]);
    let keys: Vec<&String> = as_written.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["model", "max_tokens", "messages", "user"]);

    let calls = summarizer_requests(&upstream);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["temperature"], 0);
    assert_eq!(calls[0]["max_tokens"], 1024);
    assert_eq!(calls[0]["model"], "gpt-4o-mini");
    let transcript = calls[0]["messages"][1]["content"].as_str().unwrap();
    assert!(transcript.contains("msg-u0.") && transcript.contains(PLANTED));
    assert!(
        !transcript.contains(&format!("msg-a{}.", 39)),
        "kept messages are not summarized"
    );
    let recorded = upstream.recorded();
    let summarizer_call = recorded.iter().find(|r| is_summarizer_call(r)).unwrap();
    assert_eq!(
        summarizer_call.headers["authorization"], "Bearer sk-user-1",
        "the caller's key pays by default"
    );
}

#[tokio::test]
async fn a_grown_conversation_reuses_its_summary_and_sends_only_new_messages() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        // Its counts as the cache's second request sees them from the first.
        let proxy = api.warmed(Fixture::config(&upstream.url())).await;
        let first = api.agent_body(&api.plain_conversation(40));
        let (response, condensed) = api.post(&proxy, &first, false, &[]).await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.cache, "miss", "{api:?}");
        let covered: usize = condensed.summarized_messages.unwrap();

        // The same conversation again: served from the cache, no summarizer call.
        let (_, condensed) = api.post(&proxy, &first, false, &[]).await;
        assert_eq!(condensed.cache, "hit", "{api:?}");
        assert_eq!(summarizer_requests(&upstream).len(), 1, "{api:?}");

        // Two more turns, compaction forced: the summary is extended with only the new span.
        let grown = api.agent_body(&api.plain_conversation(42));
        let (response, condensed) = api
            .post(&proxy, &grown, false, &[("x-condenser-mode", "force")])
            .await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.action, "summarized", "{api:?}");
        assert_eq!(condensed.cache, "extended", "{api:?}");
        let calls = summarizer_requests(&upstream);
        assert_eq!(calls.len(), 2, "{api:?}");
        let prompt = summarizer_prompt(&calls[1]);
        let (existing, new) = prompt.split_once("<new_messages>").unwrap();
        assert!(
            existing.contains("<existing_summary>") && existing.contains("ORD-4411"),
            "{api:?}"
        );
        assert!(
            !new.contains("msg-u0."),
            "{api:?}: old messages are not sent again"
        );
        let now_covered: usize = condensed.summarized_messages.unwrap();
        assert_eq!(
            new.matches("### ").count(),
            now_covered - covered,
            "{api:?}: exactly the newly evicted messages"
        );
        let sent = upstream.forwarded();
        let last = sent.last().unwrap();
        assert_eq!(
            api.assert_compacted_shape(&grown, last, 6),
            now_covered,
            "{api:?}"
        );
        let summary = api.split_summary(last).0.unwrap();
        assert!(summary.contains("ORD-4411"), "{api:?}: {summary}");
    }
}

#[tokio::test]
async fn concurrent_identical_requests_make_one_summarizer_call_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_millis(300),
                ..Default::default()
            })
            .await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let body = api.agent_body(&api.agent_conversation());
        let replies =
            futures_util::future::join_all((0..20).map(|_| api.post(&proxy, &body, false, &[])))
                .await;
        for (response, condensed) in &replies {
            assert_eq!(response.status(), 200, "{api:?}");
            assert_eq!(condensed.action, "summarized", "{api:?}");
        }
        assert_eq!(upstream.summarizer_calls().len(), 1, "{api:?}");
        let sent = upstream.forwarded();
        assert_eq!(sent.len(), 20, "{api:?}");
        assert!(sent.windows(2).all(|pair| pair[0] == pair[1]), "{api:?}");
    }
}

#[tokio::test]
async fn a_failing_summarizer_leaves_the_request_successful_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_status: Some(500),
                ..Default::default()
            })
            .await;
        let original = api.agent_conversation();
        let body = api.agent_body(&original);

        // trim (the default): the oldest whole units go, the request succeeds.
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.action, "trimmed", "{api:?}");
        assert_eq!(condensed.cache, "none", "{api:?}");
        assert!(condensed.forwarded_tokens.unwrap() < 6_000, "{api:?}");
        assert!(!upstream.summarizer_calls().is_empty(), "{api:?}");
        let sent = upstream.forwarded()[0].clone();
        let items = api.items(&sent);
        let head = api.head();
        assert!(items.len() < original.len(), "{api:?}");
        assert_eq!(items[..head], original[..head], "{api:?}: head kept");
        // The kept tail, after the note a conversation that must open with a user turn
        // opens with.
        let tail = head + usize::from(api.is_omission_note(&items[head]));
        assert_eq!(
            items[tail..],
            original[original.len() - (items.len() - tail)..],
            "{api:?}: no summary, recent items"
        );
        assert_eq!(api.system(&sent), api.system(&body), "{api:?}");
        assert!(!sent.to_string().contains("[Context summary"), "{api:?}");
        api.assert_valid(&original, &sent);

        // forward: the original goes as sent.
        let mut config = Fixture::config(&upstream.url());
        config.context.on_failure = OnFailure::Forward;
        let proxy = Proxy::start(config).await;
        let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.action, "forwarded", "{api:?}");
        assert_eq!(
            api.items(upstream.forwarded().last().unwrap()),
            original,
            "{api:?}"
        );

        // error: a clear 502, in the dialect's shape.
        let mut config = Fixture::config(&upstream.url());
        config.context.on_failure = OnFailure::Error;
        let proxy = Proxy::start(config).await;
        let (response, _) = api.post(&proxy, &body, false, &[]).await;
        let (status, kind, message) = api.error(response).await;
        assert_eq!(status, 502, "{api:?}");
        let expected = match api {
            Fixture::Chat | Fixture::Responses => "summarizer_failed",
            Fixture::Messages => "api_error",
            Fixture::Gemini => "UNAVAILABLE",
        };
        assert_eq!(kind, expected, "{api:?}: {message}");
    }
}

#[tokio::test]
async fn a_span_larger_than_the_summarizer_window_is_folded_in_chunks() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let mut config = Fixture::config(&upstream.url());
        // The request's own model summarizes: its 8,000-token window cannot take the span at
        // once.
        config.summarizer.model = String::new();
        let proxy = Proxy::start(config).await;
        let body = api.agent_body(&api.plain_conversation(40));
        let (_, condensed) = api.post(&proxy, &body, false, &[]).await;
        assert_eq!(condensed.action, "summarized", "{api:?}");
        let recorded = upstream.summarizer_calls();
        let calls: Vec<Value> = recorded.iter().map(Recorded::json).collect();
        assert!(calls.len() >= 2, "{api:?}: {} calls", calls.len());
        let first = summarizer_prompt(&calls[0]);
        assert!(
            first.contains("msg-u0.") && !first.contains("<existing_summary>"),
            "{api:?}"
        );
        let second = summarizer_prompt(&calls[1]);
        let (existing, new) = second.split_once("<new_messages>").unwrap();
        assert!(
            existing.contains("ORD-4411"),
            "{api:?}: folded in order onto the first chunk's summary"
        );
        assert!(!new.contains("msg-u0."), "{api:?}");
        assert!(
            recorded.iter().all(|c| api.model_of(c) == api.model()),
            "{api:?}: the request's own model"
        );
    }
}

#[tokio::test]
async fn repeated_failures_open_the_circuit_breaker_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_status: Some(503),
                ..Default::default()
            })
            .await;
        let mut config = Fixture::config(&upstream.url());
        config.summarizer.breaker_failures = 2;
        config.summarizer.breaker_cooldown_secs = 600;
        let proxy = Proxy::start(config).await;
        // Five requests, each a conversation of its own (its system prompt).
        for more in 0..5 {
            let mut body = api.agent_body(&api.agent_conversation());
            api.set_system(&mut body, &format!("{SYSTEM_PROMPT} Conversation {more}."));
            let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{api:?}");
            assert_eq!(
                condensed.action, "trimmed",
                "{api:?} +{more}: {condensed:?}"
            );
        }
        assert_eq!(
            upstream.summarizer_calls().len(),
            2,
            "{api:?}: no calls while the breaker is open"
        );
    }
}

#[tokio::test]
async fn a_streamed_request_is_compacted_and_still_streams() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let body = api.with_stream(api.agent_body(&api.plain_conversation(40)), true);
        let (response, condensed) = api.post(&proxy, &body, true, &[]).await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.action, "summarized", "{api:?}");
        assert!(
            header(&response, "content-type").starts_with("text/event-stream"),
            "{api:?}"
        );
        let (text, raw) = api.client_text(response, true).await;
        assert!(text.contains("reply "), "{api:?}: {raw}");
        api.assert_stream_ended(&raw);
        let recorded = upstream.recorded();
        let sent: Vec<&Recorded> = recorded.iter().filter(|r| !is_summarizer_call(r)).collect();
        assert_eq!(sent.len(), 1, "{api:?}");
        assert!(api.streams(sent[0]), "{api:?}: streamed upstream too");
        api.assert_compacted_shape(&body, &sent[0].json(), 6);
        if api == Fixture::Chat {
            // Chat streams carry usage only when asked: condenser asks, and takes it out.
            assert!(
                !raw.contains("\"usage\""),
                "the usage chunk condenser asked for is removed"
            );
            assert_eq!(sent[0].json()["stream_options"]["include_usage"], true);
        }
    }
}

#[tokio::test]
async fn a_last_message_larger_than_the_window_is_refused_in_every_dialect() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let turns = [
            ("user", "msg-u0. hello".to_string()),
            ("assistant", "msg-a0. hi".to_string()),
            ("user", filler(1, 9_000)),
        ];
        let (response, _) = api.post(&proxy, &api.body(&turns, false), false, &[]).await;
        let (status, kind, message) = api.error(response).await;
        assert_eq!(status, 400, "{api:?}: {message}");
        let expected = match api {
            Fixture::Chat | Fixture::Responses => "context_length_exceeded",
            Fixture::Messages => "invalid_request_error",
            Fixture::Gemini => "INVALID_ARGUMENT",
        };
        assert_eq!(kind, expected, "{api:?}: {message}");
        assert!(upstream.recorded().is_empty(), "{api:?}");
    }
}

#[tokio::test]
async fn a_last_message_larger_than_the_window_is_refused() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let mut messages = conversation(2);
    messages.push(json!({"role": "user", "content": filler(1, 9_000)}));
    let response = Fixture::Chat
        .post(&proxy, &chat_body(&messages), false, &[])
        .await
        .0;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "context_length_exceeded");
    assert_eq!(error["error"]["param"], "messages");
    assert!(upstream.recorded().is_empty());
}

#[tokio::test]
async fn tool_calls_stay_with_their_results() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let original = api.parallel_calls_conversation(45);
        let body = api.agent_body(&original);
        let (_, condensed) = api.post(&proxy, &body, false, &[]).await;
        assert_eq!(condensed.action, "summarized", "{api:?}");
        let sent = upstream.forwarded();
        api.assert_calls_answered(&original, &sent[0]);
        api.assert_compacted_shape(&body, &sent[0], 6);
    }
}

/// The turns of `api`'s growing conversation, and the time its model takes to reply to each
/// (which not every dialect's mock takes itself): chat's from 15 turns (3,300 tokens) to 60
/// (13,000) at 150 ms a turn. Gemini's turns are counted twice as large (the ratio its usage
/// teaches condenser), so it starts at half as many turns, each twice as long (shorter still
/// than the summarizer takes: as long as chat's between the trigger and the hard limit), and
/// goes on as many turns past the trigger as chat.
fn growing_turns(api: Fixture) -> (std::ops::Range<usize>, Duration) {
    match api {
        Fixture::Chat | Fixture::Responses | Fixture::Messages => {
            (15..60, Duration::from_millis(150))
        }
        Fixture::Gemini => (8..36, Duration::from_millis(300)),
    }
}

/// A conversation that grows one turn at a time past the trigger, with a slow summarizer:
/// the summary is made ahead of need, so no request ever waits for it.
#[tokio::test]
async fn a_conversation_growing_turn_by_turn_never_waits_for_the_summarizer() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_millis(400),
                ..Default::default()
            })
            .await;
        let proxy = api.warmed(Fixture::config(&upstream.url())).await;
        let mut outcomes = Vec::new();
        let (growth, reply_time) = growing_turns(api);
        assert!(reply_time < Duration::from_millis(400));
        for turns in growth {
            let body = api.agent_body(&api.plain_conversation(turns));
            let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{api:?}");
            outcomes.push((condensed.action, condensed.cache));
            tokio::time::sleep(reply_time).await;
        }
        let blocked = outcomes
            .iter()
            .filter(|(_, cache)| cache == "miss" || cache == "extended")
            .count();
        let summarized = outcomes
            .iter()
            .filter(|(action, _)| action == "summarized")
            .count();
        assert!(summarized > 20, "{api:?}: {outcomes:?}");
        assert_eq!(blocked, 0, "{api:?}: {outcomes:?}");
        assert!(!summarizer_requests(&upstream).is_empty(), "{api:?}");
    }
}

/// The bar: 200 turns replayed through condenser never exceed the window, keep the
/// system prompt and recent messages, keep the planted facts, and send the summarizer each
/// message about once.
#[tokio::test]
async fn two_hundred_turns_replayed() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                chat_latency: Duration::from_millis(5),
                ..Default::default()
            })
            .await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let mut turns: Vec<(&str, String)> = Vec::new();
        for t in 0..200 {
            turns.push((
                "user",
                user_turn(t)["content"].as_str().unwrap().to_string(),
            ));
            let items = api.plain_items(&turns);
            let body = api.agent_body(&items);
            let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{api:?} turn {t}");
            let forwarded: u64 = condensed.forwarded_tokens.unwrap();
            assert!(
                forwarded <= 7_500,
                "{api:?} turn {t}: {forwarded} tokens exceed the usable window"
            );
            let (reply, _) = api.client_text(response, false).await;
            assert!(reply.starts_with("reply "), "{api:?} turn {t}: {reply}");
            turns.push((
                "assistant",
                format!("msg-a{t}. {reply} {}", filler(t + 500, 100)),
            ));

            let sent = upstream.forwarded();
            let last = sent.last().unwrap();
            let (summary, rest) = api.split_summary(last);
            let kept = api.items(&rest);
            let head = api.head_of(&items);
            assert_eq!(kept[..head], items[..head], "{api:?} turn {t}: the head");
            assert_eq!(
                api.system(&rest),
                api.system(&body),
                "{api:?} turn {t}: the system prompt"
            );
            assert_eq!(
                kept.last(),
                items.last(),
                "{api:?} turn {t}: the newest message is kept"
            );
            if let Some(summary) = summary {
                assert!(
                    summary.contains("ORD-4411") && summary.contains("$1,200"),
                    "{api:?} turn {t}: {summary}"
                );
                assert!(
                    kept.len() >= head + 6,
                    "{api:?} turn {t}: recent messages kept"
                );
            }
        }
        // How often did each message reach the summarizer?
        let mut sent_counts = std::collections::HashMap::<String, usize>::new();
        for call in summarizer_requests(&upstream) {
            let prompt = summarizer_prompt(&call);
            let span = prompt
                .split_once("<new_messages>")
                .map_or(&prompt[..], |(_, new)| new);
            for line in span.lines() {
                if let Some(tag) = line.split('.').next().filter(|w| w.starts_with("msg-")) {
                    *sent_counts.entry(tag.to_string()).or_default() += 1;
                }
            }
        }
        let total: usize = sent_counts.values().sum();
        let max = sent_counts.values().copied().max().unwrap_or(0);
        assert!(
            sent_counts.len() > 250,
            "{api:?}: most of the conversation was summarized: {}",
            sent_counts.len()
        );
        let average = total as f64 / sent_counts.len() as f64;
        assert!(
            average <= 1.2 && max <= 2,
            "{api:?}: each message about once: average {average}, max {max}"
        );
    }
}

#[tokio::test]
async fn requests_for_several_choices_are_forwarded_as_sent() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let mut body = chat_body(&conversation(40));
    body["n"] = json!(2);
    let response = Fixture::Chat
        .post(&proxy, &body, false, &[("x-condenser-mode", "force")])
        .await
        .0;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "forwarded");
    assert_eq!(upstream.forwarded()[0], body);
    assert!(summarizer_requests(&upstream).is_empty());
}

#[tokio::test]
async fn a_huge_newest_output_alone_over_the_hard_limit_is_shortened_just_enough_and_said() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let items = api.one_call("read", &filler(3, 20_000));
        let body = api.agent_body(&items);
        let (response, condensed) = api.post(&proxy, &body, false, &[]).await;
        assert_eq!(response.status(), 200, "{api:?}");
        assert_eq!(condensed.action, "trimmed", "{api:?}");
        assert_eq!(
            header(&response, "x-condenser-recent-shortened"),
            "1",
            "{api:?}"
        );
        let forwarded: u64 = condensed.forwarded_tokens.unwrap();
        // The window (8,000) less max_tokens (500): the newest output keeps all it can, its
        // middle out, rather than being cut down to the target (3,750). OpenAI's tokenizer
        // counts it exactly, to within 500 of that; the others' estimates keep a margin.
        assert_eq!(api.max_output(&body), 500, "{api:?}");
        assert!(
            forwarded <= 7_500 && forwarded > 3_750 * 3 / 2,
            "{api:?}: {forwarded}"
        );
        if matches!(api, Fixture::Chat | Fixture::Responses) {
            assert!(forwarded >= 7_000, "{api:?}: {forwarded}");
        }
        let sent = upstream.forwarded()[0].clone();
        let kept = api.items(&sent);
        assert_eq!(kept.len(), items.len(), "{api:?}");
        assert_eq!(
            kept[..2],
            items[..2],
            "{api:?}: the ask and the call as sent"
        );
        assert_eq!(api.system(&sent), api.system(&body), "{api:?}");
        let cut = kept[2].to_string();
        assert!(cut.contains("tokens removed"), "{api:?}: {}", &cut[..200]);
        assert!(cut.len() < items[2].to_string().len(), "{api:?}");
        api.assert_valid(&items, &sent);
        assert!(summarizer_requests(&upstream).is_empty(), "{api:?}");
    }
}

#[tokio::test]
async fn a_callers_refused_key_does_not_trip_the_breaker_for_everyone() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_status: Some(401),
                ..Default::default()
            })
            .await;
        let mut config = Fixture::config(&upstream.url());
        config.summarizer.breaker_failures = 2;
        let proxy = Proxy::start(config).await;
        let rounds = api.agent_rounds();
        for rounds in rounds..rounds + 5 {
            let body = api.agent_body(&api.agent_conversation_of(rounds));
            let (_, condensed) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(condensed.action, "trimmed", "{api:?}: {rounds} rounds");
        }
        assert_eq!(
            summarizer_requests(&upstream).len(),
            5,
            "{api:?}: every request still tried"
        );
    }
}

#[tokio::test]
async fn the_message_trigger_holds_on_every_turn() {
    for api in Fixture::all() {
        let upstream = api.upstream(LlmBehaviour::default()).await;
        let mut config = Fixture::config(&upstream.url());
        config.context.max_messages = 20;
        config.context.keep_recent_messages = 4;
        let proxy = Proxy::start(config).await;
        let mut turns: Vec<(&str, String)> = Vec::new();
        for t in 0..40 {
            turns.push(("user", format!("msg-u{t}. short question")));
            let body = api.body(&turns, false);
            let response = api.post(&proxy, &body, false, &[]).await.0;
            assert_eq!(response.status(), 200, "{api:?}");
            let sent = upstream.forwarded();
            // Chat's system message is one of its messages; the others carry the system
            // prompt outside theirs, and 20 holds of what they forward all the same.
            let forwarded = api.items(sent.last().unwrap()).len();
            assert!(
                forwarded <= 20,
                "{api:?} turn {t}: {forwarded} messages forwarded"
            );
            turns.push(("assistant", format!("msg-a{t}. short answer")));
            // Let background summaries land, as the time a user takes to reply would.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!upstream.summarizer_calls().is_empty(), "{api:?}");
    }
}

/// `[[context.tools]]` with `cut = "never"` for `Read`: an agent's `Read` output in the middle
/// stays whole in every request while the cuts of its `shell` outputs, before and after it,
/// move on; and what the summarizer is sent holds it whole too.
#[tokio::test]
async fn a_read_output_stays_whole_under_never_cut_while_the_cut_middle_moves() {
    for api in Fixture::all() {
        let upstream = api
            .upstream(LlmBehaviour {
                summarizer_latency: Duration::from_secs(5),
                ..LlmBehaviour::default()
            })
            .await;
        let mut config = Fixture::config(&upstream.url());
        config.models.get_mut(api.model()).unwrap().context_window = Some(16_500);
        config.context.keep_recent_messages = 2;
        config.context.tools = vec![condenser::config::ToolPolicy {
            names: vec!["Re?d".into()],
            cut: condenser::conversation::ToolCut::Never,
        }];
        let proxy = Proxy::start(config).await;
        let read_at = 3;
        let tool = |r: usize| if r == read_at { "Read" } else { "shell" };
        let mut items = api.plain_items(&[("user", "Fix ticket KX-7731-QZ.".to_string())]);
        let opening = items.len();
        let mut cut_sets = Vec::new();
        for r in 0..24 {
            let output = format!("output {r}: {}", filler(r + 500, 1_100));
            items.extend(api.tool_round(r, tool(r), &output));
            let body = api.agent_body(&items);
            let (response, _) = api.post(&proxy, &body, false, &[]).await;
            assert_eq!(response.status(), 200, "{api:?} round {r}");
            let sent = api.items(&upstream.forwarded().pop().unwrap());
            if r >= read_at {
                let read = &items[opening + 1 + 2 * read_at];
                assert_eq!(api.output_round(read), Some(read_at), "{api:?}");
                if sent.iter().any(|m| api.output_round(m) == Some(read_at)) {
                    assert!(
                        sent.contains(read),
                        "{api:?} round {r}: the Read output whole: {:.600}",
                        sent.iter()
                            .find(|m| api.output_round(m) == Some(read_at))
                            .unwrap()
                    );
                }
            }
            let cut: Vec<usize> = sent
                .iter()
                .filter(|m| m.to_string().contains("tokens removed"))
                .filter_map(|m| api.output_round(m))
                .collect();
            cut_sets.push(cut);
        }
        let cut_rounds: std::collections::BTreeSet<usize> =
            cut_sets.iter().flatten().copied().collect();
        assert!(
            cut_rounds.iter().any(|&r| r < read_at) && cut_rounds.iter().any(|&r| r > read_at),
            "{api:?}: shell outputs on both sides of it are cut: {cut_sets:?}"
        );
        assert!(
            !cut_rounds.contains(&read_at),
            "{api:?}: never the Read output: {cut_sets:?}"
        );
        assert!(
            cut_sets
                .windows(2)
                .any(|w| !w[0].is_empty() && w[1].len() > w[0].len()),
            "{api:?}: the cut middle moves: {cut_sets:?}"
        );
        // The summarizer, once asked, sees the Read output whole and the shell outputs cut.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let asked = summarizer_requests(&upstream);
        assert!(!asked.is_empty(), "{api:?}: a summary was asked");
        let read_text = format!("output {read_at}: {}", filler(read_at + 500, 1_100));
        assert!(
            asked
                .iter()
                .any(|body| body.to_string().contains(&read_text)),
            "{api:?}: the summarizer got the Read output whole"
        );
    }
}
