//! What an operator reads from `/metrics` agrees with what the requests did, and what the
//! dashboard and alert rules read is there from start-up.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::common::*;
use futures_util::StreamExt;
use serde_json::json;

/// Parses the Prometheus text format strictly enough to catch a malformed exposition:
/// every sample is `name{labels} value`, every name was declared by `# TYPE`.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut declared = HashSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            declared.insert(parts.next().unwrap().to_string());
            assert!(
                matches!(parts.next(), Some("counter" | "gauge" | "histogram")),
                "{line}"
            );
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
            .unwrap_or(name);
        assert!(declared.contains(family), "undeclared {name}");
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{line}"
            );
        }
        samples.insert(series.to_string(), value);
    }
    samples
}

/// The path the chat requests here go to.
const CHAT: &str = "/v1/chat/completions";

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no series {series}"))
}

#[tokio::test]
async fn counters_agree_with_a_known_sequence_of_requests() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(small_window_config(&upstream.url())).await;
    let mut received_total = 0;
    let mut forwarded_total = 0;
    let mut expect =
        |(response, condensed): (reqwest::Response, Condensed), action: &str, status: u16| {
            assert_eq!(response.status(), status);
            assert_eq!(condensed.action, action);
            received_total += condensed.prompt_tokens.unwrap();
            forwarded_total += condensed.forwarded_tokens.unwrap();
            response
        };
    let small = chat_body(&conversation(1));
    let long = chat_body(&conversation(40));
    let mut poisoned_messages = conversation(40);
    poisoned_messages[1]["content"] = json!(format!(
        "{FAIL_SUMMARY} {}",
        poisoned_messages[1]["content"].as_str().unwrap()
    ));
    let poisoned = chat_body(&poisoned_messages);
    let mut streamed = small.clone();
    streamed["stream"] = json!(true);
    let mut failing = small.clone();
    failing["user"] = json!(ERROR_USER);

    expect(post(&proxy, CHAT, &[], &small).await, "forwarded", 200)
        .bytes()
        .await
        .unwrap();
    let r = expect(post(&proxy, CHAT, &[], &long).await, "summarized", 200);
    assert_eq!(header(&r, "x-condenser-cache"), "miss");
    r.bytes().await.unwrap();
    let r = expect(post(&proxy, CHAT, &[], &long).await, "summarized", 200);
    assert_eq!(header(&r, "x-condenser-cache"), "hit");
    r.bytes().await.unwrap();
    expect(post(&proxy, CHAT, &[], &poisoned).await, "trimmed", 200)
        .bytes()
        .await
        .unwrap();
    let r = expect(post(&proxy, CHAT, &[], &streamed).await, "forwarded", 200);
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        chunk.unwrap();
    }
    expect(post(&proxy, CHAT, &[], &failing).await, "forwarded", 500)
        .bytes()
        .await
        .unwrap();

    let samples = parse_exposition(&proxy.metrics().await);
    let m = |series: &str| value(&samples, series);
    assert_eq!(
        m(r#"condenser_requests_total{route="chat_completions",status="200"}"#),
        5.0
    );
    assert_eq!(
        m(r#"condenser_requests_total{route="chat_completions",status="500"}"#),
        1.0
    );
    assert_eq!(
        m(r#"condenser_compactions_total{action="summarized",cache="miss"}"#),
        1.0
    );
    assert_eq!(
        m(r#"condenser_compactions_total{action="summarized",cache="hit"}"#),
        1.0
    );
    assert_eq!(
        m(r#"condenser_compactions_total{action="trimmed",cache="none"}"#),
        1.0
    );
    let prompt = m(r#"condenser_prompt_tokens_total{model="gpt-4o"}"#);
    let forwarded = m(r#"condenser_forwarded_tokens_total{model="gpt-4o"}"#);
    let saved = m(r#"condenser_saved_tokens_total{model="gpt-4o"}"#);
    assert_eq!(prompt, received_total as f64);
    assert_eq!(forwarded, forwarded_total as f64);
    assert_eq!(saved, prompt - forwarded);
    assert!(saved > 10_000.0, "{saved}");
    // The mock reports 4 completion tokens per answer, streams included; the 500 has none.
    assert_eq!(
        m(r#"condenser_completion_tokens_total{model="gpt-4o"}"#),
        20.0
    );
    assert_eq!(m("condenser_upstream_seconds_count"), 6.0);
    assert_eq!(m("condenser_overhead_seconds_count"), 6.0);
    assert_eq!(m("condenser_summarize_seconds_count"), 2.0);
    assert_eq!(m("condenser_ttft_seconds_count"), 1.0);
    assert_eq!(m("condenser_summary_cache_entries"), 1.0);
    assert_eq!(m("condenser_cache_errors_total"), 0.0);
    // gpt-4o's encoding is exact: never scaled, so no ratio is learned or shown for it.
    assert!(
        !samples
            .keys()
            .any(|s| s.starts_with("condenser_token_estimate_ratio")),
        "{samples:?}"
    );
    // Overhead buckets reach down to 50 µs and up to 250 ms.
    assert!(samples.contains_key(r#"condenser_overhead_seconds_bucket{le="0.00005"}"#));
    assert!(samples.contains_key(r#"condenser_overhead_seconds_bucket{le="0.25"}"#));
    assert!(samples.contains_key(r#"condenser_upstream_seconds_bucket{le="80"}"#));
    assert!(samples.contains_key(r#"condenser_ttft_seconds_bucket{le="10"}"#));
}

#[tokio::test]
async fn usage_is_requested_without_disturbing_the_rest_of_the_body() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let post = |body: &'static str| {
        client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body)
            .send()
    };
    // No stream options: the field is spliced in first and every other byte stays.
    let plain = "  {\"model\":\"gpt-4o\", \"stream\":true,\"zeta\":[1.50],\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9\"}]}";
    stream_text(post(plain).await.unwrap()).await;
    let sent = upstream.recorded()[0].body.clone();
    assert_eq!(
        String::from_utf8_lossy(&sent),
        format!(
            "  {{\"stream_options\":{{\"include_usage\":true}},{}",
            &plain[3..]
        )
    );
    // Stream options that say no, or null: rewritten to ask, other options kept.
    for (body, kept) in [
        (
            r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false,"x":1},"messages":[{"role":"user","content":"hi"}]}"#,
            Some(1),
        ),
        (
            r#"{"model":"gpt-4o","stream":true,"stream_options":null,"messages":[{"role":"user","content":"hi"}]}"#,
            None,
        ),
    ] {
        let text = stream_text(post(body).await.unwrap()).await;
        assert!(!text.contains("\"usage\""), "{text}");
        let sent = upstream.recorded().last().unwrap().json();
        assert_eq!(sent["stream_options"]["include_usage"], true, "{body}");
        assert_eq!(sent["stream_options"]["x"].as_i64(), kept, "{body}");
    }
}

#[tokio::test]
async fn usage_is_requested_for_streams_and_hidden_from_clients_that_did_not_ask() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let without =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let (response, _) = post(&proxy, CHAT, &[], &without).await;
    let text = stream_text(response).await;
    assert!(!text.contains("\"usage\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let sent = upstream.recorded()[0].json();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let samples = parse_exposition(&proxy.metrics().await);
    assert_eq!(
        value(
            &samples,
            r#"condenser_completion_tokens_total{model="gpt-4o"}"#
        ),
        4.0
    );

    let with = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(with)
        .send()
        .await
        .unwrap();
    let text = stream_text(response).await;
    assert!(
        text.contains("\"usage\""),
        "the client asked for usage and keeps it: {text}"
    );
    assert_eq!(
        upstream.recorded()[1].body.as_ref(),
        with.as_bytes(),
        "nothing to change: sent as is"
    );
    let samples = parse_exposition(&proxy.metrics().await);
    assert_eq!(
        value(
            &samples,
            r#"condenser_completion_tokens_total{model="gpt-4o"}"#
        ),
        8.0
    );
}

#[tokio::test]
async fn invented_model_names_do_not_blow_up_cardinality() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let mut config = config_for(&upstream.url());
    config.metrics.models = vec!["my-fine-tune".into()];
    let proxy = Proxy::start(config).await;
    let mut names: Vec<String> = (0..1000).map(|i| format!("invented-model-{i}")).collect();
    names.extend(["gpt-4o-2024-08-06", "claude-sonnet-4-5", "my-fine-tune"].map(String::from));
    let requests = names.iter().map(|name| {
        let body = json!({"model": name, "messages": [{"role": "user", "content": "hi"}]});
        let proxy = &proxy;
        async move {
            let (response, condensed) = post(proxy, CHAT, &[], &body).await;
            assert!(condensed.prompt_tokens.is_some() && condensed.forwarded_tokens.is_some());
            response.bytes().await.unwrap()
        }
    });
    futures_util::stream::iter(requests)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let samples = parse_exposition(&proxy.metrics().await);
    let labels: HashSet<&str> = samples
        .keys()
        .filter_map(|k| k.strip_prefix("condenser_prompt_tokens_total{model=\""))
        .map(|k| k.trim_end_matches("\"}"))
        .collect();
    assert_eq!(
        labels,
        HashSet::from(["other", "gpt-4o", "claude", "my-fine-tune"])
    );
    assert_eq!(
        value(
            &samples,
            r#"condenser_requests_total{route="chat_completions",status="200"}"#
        ),
        1003.0
    );
}

/// The routes and the route labels come from the dialect registry: each registered dialect's
/// path is compacted in its pipeline and counted under its label, whose recall series show
/// from start-up. A dialect the server or the metrics did not take from the registry fails.
#[tokio::test]
async fn every_registered_dialect_is_served_at_its_path_and_counted_under_its_label() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let at_start = parse_exposition(&proxy.metrics().await);
    for wire in condenser::dialect::DIALECTS {
        let route = wire.route.name();
        let served = format!(r#"condenser_recalls_total{{outcome="served",route="{route}"}}"#);
        assert_eq!(value(&at_start, &served), 0.0);
        // Not JSON: the dialect's pipeline refuses it, where a pass-through would forward it.
        // Where it compacts is where it asks a summary (a model's path, in Gemini's API).
        let path = (wire.summary.path)("gpt-4o");
        let response = client()
            .post(proxy.url(&path))
            .header("content-type", "application/json")
            .body("{")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path}");
    }
    assert!(upstream.recorded().is_empty());
    let samples = parse_exposition(&proxy.metrics().await);
    for wire in condenser::dialect::DIALECTS {
        let route = wire.route.name();
        let refused = format!(r#"condenser_requests_total{{route="{route}",status="400"}}"#);
        assert_eq!(value(&samples, &refused), 1.0);
    }
}

/// The sum of every series of `name`, whatever its labels.
fn total(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .map(|(_, value)| value)
        .sum()
}

/// What the provider's cache served, as each dialect's upstream reports it (chat
/// `prompt_tokens_details.cached_tokens`, Responses `input_tokens_details.cached_tokens`,
/// Anthropic `cache_read_input_tokens`, Gemini `cachedContentTokenCount`), is counted from
/// whole replies and from streams: each request's share, replayed from what condenser
/// forwarded, is what the counter grows by.
#[tokio::test]
async fn cached_prompt_tokens_are_counted_in_every_dialect_whole_and_streamed() {
    for api in Fixture::all() {
        let behaviour = LlmBehaviour {
            prompt_cache: Some(PromptCache::default()),
            ..LlmBehaviour::default()
        };
        let upstream = api.upstream(behaviour).await;
        let proxy = Proxy::start(Fixture::config(&upstream.url())).await;
        let replay = PromptCache::default();
        let mut expected = 0.0;
        for (turns, stream) in [(2, false), (3, true), (4, false), (5, true)] {
            let body = api.with_stream(api.agent_body(&api.agent_conversation_of(turns)), stream);
            let (response, _) = api.post(&proxy, &body, stream, &[]).await;
            assert_eq!(response.status(), 200, "{api:?}");
            stream_text(response).await;
            let forwarded = upstream.forwarded();
            let cached = replay.prompt(forwarded.last().unwrap()).cached_tokens;
            if turns > 2 {
                assert!(cached > 0, "{api:?}: the previous prompt repeats");
            }
            expected += cached as f64;
            // Counted once the relay ends, which may be just after the client has it all.
            within("cached tokens counted", async {
                while total(
                    &parse_exposition(&proxy.metrics().await),
                    "condenser_cached_prompt_tokens_total",
                ) != expected
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await;
        }
    }
}

/// Names the dashboard or the alert rules read: every `condenser_…` word in them.
fn metric_names_read_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("condenser_"))
        .map(String::from)
        .collect()
}

/// Every counter (and histogram) the shipped dashboard and alert rules read is there at
/// start-up, its known label values at 0: a series that appears with its first event leaves
/// its panel empty and its alert blind until then. A new panel reading a series that is not
/// shown from the start fails here.
#[tokio::test]
async fn every_series_the_dashboard_and_alerts_read_is_there_from_start_up() {
    let upstream = closed_url();
    let mut config = small_window_config(&upstream);
    config.metrics.models = vec!["my-fine-tune".into()];
    // Spend is shown for priced models only.
    config.models.get_mut("gpt-4o").unwrap().price = Some(condenser::tokens::catalog::Price {
        input: 2.5,
        cache_read: 1.25,
        cache_write: 2.5,
        output: 10.0,
    });
    let proxy = Proxy::start(config).await;
    let samples = parse_exposition(&proxy.metrics().await);
    let read = |path: &str| {
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
            .unwrap()
    };
    let mut names = metric_names_read_in(&read("deploy/grafana/condenser.json"));
    names.extend(metric_names_read_in(&read("deploy/prometheus/alerts.yml")));
    assert!(names.len() >= 15, "{names:?}");
    // A gauge of what upstream's usage said, which has no value before the first reply.
    names.remove("condenser_token_estimate_ratio");
    for name in &names {
        assert!(
            samples.keys().any(|series| {
                // A histogram's series are its family's name with a suffix.
                let family = series.split('{').next().unwrap_or_default();
                ["", "_bucket", "_count", "_sum"]
                    .iter()
                    .any(|suffix| family.strip_suffix(suffix) == Some(name))
            }),
            "{name} is read by the dashboard or the alerts but not there at start-up"
        );
    }
    let at_zero = |series: String| {
        assert_eq!(
            samples.get(&series),
            Some(&0.0),
            "{series} is not there at 0"
        )
    };
    for model in ["my-fine-tune", "other"] {
        for name in [
            "condenser_prompt_tokens_total",
            "condenser_forwarded_tokens_total",
            "condenser_saved_tokens_total",
            "condenser_completion_tokens_total",
            "condenser_cached_prompt_tokens_total",
            "condenser_reactive_retries_total",
        ] {
            at_zero(format!(r#"{name}{{model="{model}"}}"#));
        }
        for tier in ["uncached", "cache_read", "cache_write"] {
            at_zero(format!(
                r#"condenser_prompt_tokens_billed_total{{model="{model}",tier="{tier}"}}"#
            ));
        }
    }
    for kind in ["session", "summarizer"] {
        at_zero(format!(
            r#"condenser_spend_total{{kind="{kind}",model="gpt-4o"}}"#
        ));
    }
    // The configured summarizer model's family too (gpt-4o-mini's).
    for model in ["my-fine-tune", "other", "gpt-4o"] {
        for direction in ["input", "output"] {
            at_zero(format!(
                r#"condenser_summarizer_tokens_total{{direction="{direction}",model="{model}"}}"#
            ));
        }
    }
    for reason in [
        "status",
        "timeout",
        "connection",
        "malformed",
        "rejected",
        "circuit_open",
        "internal",
    ] {
        at_zero(format!(
            r#"condenser_summarizer_failures_total{{reason="{reason}"}}"#
        ));
    }
    for kind in ["connect", "timeout", "malformed", "reset"] {
        at_zero(format!(
            r#"condenser_upstream_failures_total{{kind="{kind}"}}"#
        ));
    }
    for (action, cache) in [
        ("summarized", "hit"),
        ("summarized", "miss"),
        ("summarized", "extended"),
        ("summarized", "stale"),
        ("trimmed", "none"),
        ("forwarded", "deferred"),
    ] {
        at_zero(format!(
            r#"condenser_compactions_total{{action="{action}",cache="{cache}"}}"#
        ));
    }
    let routes = condenser::dialect::DIALECTS
        .iter()
        .map(|wire| wire.route.name());
    for route in routes.chain(["passthrough"]) {
        at_zero(format!(
            r#"condenser_requests_total{{route="{route}",status="200"}}"#
        ));
    }
}
