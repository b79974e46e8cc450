//! The bill at each token's price: every dialect's usage, whole and streamed, counted by tier
//! (`condenser_prompt_tokens_billed_total`) and, for a priced model, in money
//! (`condenser_spend_total`), the summarizer's apart from the session's.

use std::time::Duration;

use bytes::Bytes;
use condenser::tokens::catalog::{ModelOverride, Price};
use condenser::transport::body::full;
use hyper::Response;
use serde_json::{json, Value};

use crate::common::*;

/// What the scripted upstream reports of every reply, each in its API's shape: prompt tokens
/// not cached, read from the cache and written to it (only Anthropic counts writes apart),
/// and the reply's.
const UNCACHED: u64 = 1_200;
const CACHE_READ: u64 = 30_000;
const CACHE_WRITE: u64 = 4_000;
const OUTPUT: u64 = 250;

/// Per million tokens, as a provider lists them.
const PRICE: Price = Price {
    input: 3.0,
    cache_read: 0.3,
    cache_write: 3.75,
    output: 15.0,
};

/// One dialect as billed here: its fixture, its model (a model of its own, so that each
/// dialect's spend is its own series), and whether its usage counts cache writes apart.
struct Dialect {
    fixture: Fixture,
    model: &'static str,
    counts_writes: bool,
}

impl Dialect {
    /// Every dialect of the registry.
    fn all() -> Vec<Dialect> {
        Fixture::all()
            .into_iter()
            .map(|fixture| {
                let (model, counts_writes) = match fixture {
                    Fixture::Chat => ("gpt-4o", false),
                    Fixture::Responses => ("gpt-4.1", false),
                    Fixture::Messages => ("claude-sonnet-4-5", true),
                    Fixture::Gemini => (GEMINI_MODEL, false),
                };
                Dialect {
                    fixture,
                    model,
                    counts_writes,
                }
            })
            .collect()
    }

    /// A short conversation, forwarded as sent.
    fn request(&self, stream: bool) -> Value {
        let question = json!("What is in the readme?");
        match self.fixture {
            Fixture::Chat => json!({"model": self.model, "stream": stream,
                "messages": [{"role": "user", "content": question}]}),
            Fixture::Responses => json!({"model": self.model, "stream": stream, "store": false,
                "input": [{"role": "user", "content": question}]}),
            Fixture::Messages => json!({"model": self.model, "stream": stream, "max_tokens": 500,
                "messages": [{"role": "user", "content": question}]}),
            Fixture::Gemini => {
                json!({"contents": [{"role": "user", "parts": [{"text": question}]}]})
            }
        }
    }

    /// The prompt tiers this dialect's usage reports: a cache write is input to the others.
    fn tiers(&self) -> [(&'static str, u64); 3] {
        if self.counts_writes {
            [
                ("uncached", UNCACHED),
                ("cache_read", CACHE_READ),
                ("cache_write", CACHE_WRITE),
            ]
        } else {
            [
                ("uncached", UNCACHED + CACHE_WRITE),
                ("cache_read", CACHE_READ),
                ("cache_write", 0),
            ]
        }
    }

    /// One reply's cost at [`PRICE`].
    fn cost(&self) -> f64 {
        let [(_, uncached), (_, read), (_, write)] = self.tiers();
        (uncached as f64 * PRICE.input
            + read as f64 * PRICE.cache_read
            + write as f64 * PRICE.cache_write
            + OUTPUT as f64 * PRICE.output)
            / 1e6
    }
}

/// The usage every reply reports, in the shape of `path`'s API.
fn usage(path: &str) -> Value {
    let prompt = UNCACHED + CACHE_READ + CACHE_WRITE;
    if path.starts_with("/v1/chat") {
        json!({"prompt_tokens": prompt, "completion_tokens": OUTPUT, "total_tokens": prompt + OUTPUT,
            "prompt_tokens_details": {"cached_tokens": CACHE_READ}})
    } else if path.starts_with("/v1/responses") {
        json!({"input_tokens": prompt, "output_tokens": OUTPUT, "total_tokens": prompt + OUTPUT,
            "input_tokens_details": {"cached_tokens": CACHE_READ}})
    } else if path.starts_with("/v1/messages") {
        // `input_tokens` leaves out what the cache read and what it wrote.
        json!({"input_tokens": UNCACHED, "cache_read_input_tokens": CACHE_READ,
            "cache_creation_input_tokens": CACHE_WRITE, "output_tokens": OUTPUT})
    } else {
        json!({"promptTokenCount": prompt, "cachedContentTokenCount": CACHE_READ,
            "candidatesTokenCount": OUTPUT, "totalTokenCount": prompt + OUTPUT})
    }
}

/// An SSE body of `events`, each a name (none: `""`) and its data.
fn sse(events: &[(&str, &str)]) -> Response<condenser::transport::body::ProxyBody> {
    let text: String = events
        .iter()
        .map(|(name, data)| match *name {
            "" => format!("data: {data}\n\n"),
            name => format!("event: {name}\ndata: {data}\n\n"),
        })
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(full(Bytes::from(text)))
        .unwrap()
}

/// Answers every API's request with the same usage, whole or streamed as asked.
async fn scripted_upstream() -> MockUpstream {
    MockUpstream::start(handler(|r: Recorded| async move {
        let path = r.path_and_query.clone();
        let request = r.json();
        let stream = request["stream"] == json!(true) || path.contains("stream");
        let usage = usage(&path);
        if path.starts_with("/v1/chat") {
            if !stream {
                let mut answer = completion("It says hello.", 0, 0);
                answer["usage"] = usage;
                return json_response(200, &answer);
            }
            return sse(&[
                ("", &json!({"choices": [{"index": 0, "delta": {"content": "It says hello."}}]}).to_string()),
                ("", &json!({"choices": [], "usage": usage}).to_string()),
                ("", "[DONE]"),
            ]);
        }
        if path.starts_with("/v1/responses") {
            let mut reply = responses_reply("It says hello.", "completed", Some(OUTPUT));
            reply["usage"] = usage;
            if !stream {
                return json_response(200, &reply);
            }
            return sse(&[
                ("response.created", &json!({"type": "response.created", "response": {"usage": null}}).to_string()),
                ("response.output_text.delta", &json!({"type": "response.output_text.delta", "delta": "It says hello."}).to_string()),
                ("response.completed", &json!({"type": "response.completed", "response": reply}).to_string()),
            ]);
        }
        if path.starts_with("/v1/messages") {
            if !stream {
                return json_response(200, &json!({"id": "msg_1", "type": "message", "role": "assistant",
                    "content": [{"type": "text", "text": "It says hello."}], "stop_reason": "end_turn",
                    "usage": usage}));
            }
            let mut started = usage.clone();
            started["output_tokens"] = json!(1);
            return sse(&[
                ("message_start", &json!({"type": "message_start", "message": {"id": "msg_1", "usage": started}}).to_string()),
                ("content_block_delta", &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "It says hello."}}).to_string()),
                ("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": OUTPUT}}).to_string()),
                ("message_stop", &json!({"type": "message_stop"}).to_string()),
            ]);
        }
        let reply = gemini_reply(json!([{"text": "It says hello."}]), usage);
        if !stream {
            return json_response(200, &reply);
        }
        // Every event carries the counts so far; the last one's are the reply's.
        let first = gemini_reply(
            json!([{"text": "It says"}]),
            json!({"promptTokenCount": UNCACHED + CACHE_READ + CACHE_WRITE}),
        );
        sse(&[("", &first.to_string()), ("", &reply.to_string())])
    }))
    .await
}

fn priced(window: u64) -> ModelOverride {
    ModelOverride {
        context_window: Some(window),
        encoding: None,
        price: Some(PRICE),
    }
}

/// A series' value, 0 when it is not there.
fn value(metrics: &str, series: &str) -> f64 {
    metric(metrics, series).unwrap_or(0.0)
}

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() < 1e-9
}

/// Each dialect's usage, from a whole reply and from a stream, is counted by tier, and priced
/// at its model's price as the session's spend.
#[tokio::test]
async fn every_dialects_usage_is_billed_by_tier_whole_and_streamed_and_priced() {
    let upstream = scripted_upstream().await;
    let mut config = config_for(&upstream.url());
    let dialects = Dialect::all();
    for dialect in &dialects {
        config.models.insert(dialect.model.into(), priced(200_000));
    }
    let proxy = Proxy::start(config).await;
    let start = proxy.metrics().await;
    for dialect in &dialects {
        let model = dialect.model;
        // Priced: both kinds of spend show from start-up.
        for kind in ["session", "summarizer"] {
            let series = format!(r#"condenser_spend_total{{kind="{kind}",model="{model}"}}"#);
            assert_eq!(metric(&start, &series), Some(0.0), "{series}");
        }
        for (round, stream) in [false, true].into_iter().enumerate() {
            let path = dialect.fixture.path(stream);
            let (response, _) = dialect
                .fixture
                .post(&proxy, &dialect.request(stream), stream, &[])
                .await;
            assert_eq!(response.status(), 200, "{path}");
            let text = stream_text(response).await;
            assert!(text.contains("hello"), "{path}: {text}");
            let replies = (round + 1) as f64;
            let spend = format!(r#"condenser_spend_total{{kind="session",model="{model}"}}"#);
            // Counted once the relay ends, which may be just after the client has it all.
            let metrics = within("the reply billed", async {
                loop {
                    let metrics = proxy.metrics().await;
                    if near(value(&metrics, &spend), replies * dialect.cost()) {
                        return metrics;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            for (tier, tokens) in dialect.tiers() {
                let series = format!(
                    r#"condenser_prompt_tokens_billed_total{{model="{model}",tier="{tier}"}}"#
                );
                assert_eq!(
                    metric(&metrics, &series),
                    Some(replies * tokens as f64),
                    "{path}, stream {stream}: {series}"
                );
            }
            let summarizer =
                format!(r#"condenser_spend_total{{kind="summarizer",model="{model}"}}"#);
            assert_eq!(metric(&metrics, &summarizer), Some(0.0));
        }
    }
}

/// The summarizer's calls are billed under their own model's price as `kind="summarizer"`,
/// apart from the session's requests, and their tokens counted by tier with the rest.
#[tokio::test]
async fn summarizer_calls_are_spent_apart_from_the_session() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = small_window_config(&upstream.url());
    config.models.get_mut("gpt-4o").unwrap().price = Some(PRICE);
    // The summarizer's model, cheaper.
    let mini = Price {
        input: 0.15,
        cache_read: 0.075,
        cache_write: 0.15,
        output: 0.6,
    };
    config.models.insert(
        "gpt-4o-mini".into(),
        ModelOverride {
            price: Some(mini),
            ..priced(128_000)
        },
    );
    let proxy = Proxy::start(config).await;
    let response = post_chat(&proxy, &chat_body(&conversation(45))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-condenser-action"), "summarized");
    stream_text(response).await;
    // `mock_llm` reports 100 prompt tokens and 60 output of each summary, 11 and 4 of each
    // answer.
    let summary_cost = (100.0 * mini.input + 60.0 * mini.output) / 1e6;
    let answer_cost = (11.0 * PRICE.input + 4.0 * PRICE.output) / 1e6;
    let series = |kind: &str, model: &str| {
        format!(r#"condenser_spend_total{{kind="{kind}",model="{model}"}}"#)
    };
    // Summaries may still be made ahead after the answer: each call is read with the metrics.
    let (metrics, calls) = within("the answer and the summaries billed", async {
        loop {
            let calls = upstream.summarizer_calls().len() as f64;
            let metrics = proxy.metrics().await;
            let spent = |kind: &str, model: &str| value(&metrics, &series(kind, model));
            if near(spent("session", "gpt-4o"), answer_cost)
                && near(spent("summarizer", "gpt-4o-mini"), calls * summary_cost)
            {
                return (metrics, calls);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(calls >= 1.0);
    let spent = |kind: &str, model: &str| value(&metrics, &series(kind, model));
    assert_eq!(spent("summarizer", "gpt-4o"), 0.0);
    assert_eq!(spent("session", "gpt-4o-mini"), 0.0);
    let uncached = |model: &str| {
        value(
            &metrics,
            &format!(r#"condenser_prompt_tokens_billed_total{{model="{model}",tier="uncached"}}"#),
        )
    };
    assert_eq!(uncached("gpt-4o-mini"), calls * 100.0);
    assert_eq!(uncached("gpt-4o"), 11.0);
}
