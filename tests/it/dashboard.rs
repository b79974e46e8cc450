//! The operators' dashboard and alert rules in deploy/, checked against a real Prometheus:
//! it scrapes condenser while traffic compacts, hits the cache (condenser's and the provider's
//! prompt cache), fails the summarizer and is retried, and every panel's query must then
//! return data. promtool checks the rules and runs their unit tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const DASHBOARD: &str = "deploy/grafana/condenser.json";
const RULES: &str = "deploy/prometheus/alerts.yml";
const RULE_TESTS: &str = "deploy/prometheus/alerts.test.yml";

/// What the dashboard's variables read as with every instance and model selected, and the
/// rate window Grafana would choose for a 1 s scrape interval, with room.
const SUBSTITUTIONS: [(&str, &str); 5] = [
    ("$__rate_interval", "1m"),
    ("$__range", "5m"),
    ("$instance", ".*"),
    ("$model", ".*"),
    ("${datasource}", "prometheus"),
];

/// The caller whose summaries the mock summarizer refuses with a 500.
const FAILING_CALLER: &str = "sk-summaries-fail";
/// Its `authorization` header, as the mock summarizer reads it.
const FAILING_KEY: &str = "Bearer sk-summaries-fail";

/// What the mock summarizer answers [`FAILING_KEY`]: no other test's summarizer says it.
const SUMMARIZER_DOWN: &str = "the dashboard's summarizer is down";

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Fails, never skips, without the tools: scripts/test.sh installs them.
fn tool(name: &str) -> &str {
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "`{name}` is not installed: this test needs a real Prometheus. Install Debian's \
         `prometheus` package (it brings `promtool`), as scripts/test.sh does."
    );
    name
}

/// A Prometheus process, stopped when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` every second, with condenser's alert rules loaded.
    async fn start(targets: &[String]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: condenser\n    static_configs:\n      - targets: {targets}\n",
            rules = repo_path(RULES).display(),
            targets = json!(targets),
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", prometheus.url);
        within("prometheus ready", async {
            while !client()
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        prometheus
    }

    /// `data.result` of an instant query; a query Prometheus refuses fails the test.
    async fn query(&self, query: &str) -> Vec<Value> {
        let reply: Value = client()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(reply["status"], "success", "{query}: {reply}");
        reply["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `query` returns data: Prometheus has scraped what it is about.
    async fn wait_for(&self, query: &str) {
        within(query, async {
            while !has_data(&self.query(query).await) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
    }

    /// The values of a label among the series `selector` matches, as a dashboard variable reads them.
    async fn label_values(&self, label: &str, selector: &str) -> Vec<Value> {
        let reply: Value = client()
            .get(format!("{}/api/v1/label/{label}/values", self.url))
            .query(&[("match[]", selector)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        reply["data"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every panel's title with each of its queries, variables substituted.
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(!panels.is_empty(), "the dashboard has no panels");
    panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap().to_string();
            let targets = panel["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "panel {title:?} has no query");
            targets.iter().map(move |target| {
                let mut expr = target["expr"].as_str().unwrap().to_string();
                for (variable, value) in SUBSTITUTIONS {
                    expr = expr.replace(variable, value);
                }
                assert!(!expr.contains('$'), "{title:?}: unknown variable in {expr}");
                (title.clone(), expr)
            })
        })
        .collect()
}

/// Whether any series has a value a panel can draw (a ratio of nothing is NaN).
fn has_data(result: &[Value]) -> bool {
    result
        .iter()
        .filter_map(|series| series["value"][1].as_str())
        .any(|value| value.parse::<f64>().is_ok_and(|v| !v.is_nan()))
}

/// Answers, compacts, retries when the mock model (50 messages at most) finds a prompt too
/// long, fails every summary asked for by [`FAILING_KEY`], and reports what its prompt cache
/// served.
async fn upstream() -> MockUpstream {
    mock_llm(LlmBehaviour {
        too_long: Some((50, openai_too_long())),
        prompt_cache: Some(PromptCache::default()),
        summarizer_error: Some(Arc::new(|r: &Recorded| {
            (r.headers.get("authorization")?.to_str().ok()? == FAILING_KEY)
                .then(|| (500, json!({"error": {"message": SUMMARIZER_DOWN}})))
        })),
        ..LlmBehaviour::default()
    })
    .await
}

/// As in tests/it/reactive.rs: condenser is told gpt-4o's window is 11,000 tokens, so 27 turns
/// go as sent and only upstream's answer says they are too long. The session's model and the
/// summarizer's are priced, so the bill's panels have spend to show.
fn config(upstream: &str) -> condenser::Config {
    let mut config = small_window_config(upstream);
    let price = condenser::tokens::catalog::Price {
        input: 2.5,
        cache_read: 1.25,
        cache_write: 2.5,
        output: 10.0,
    };
    let session = config.models.get_mut("gpt-4o").unwrap();
    session.context_window = Some(11_000);
    session.price = Some(price);
    config.models.insert(
        "gpt-4o-mini".into(),
        condenser::tokens::catalog::ModelOverride {
            context_window: Some(128_000),
            encoding: None,
            price: Some(price),
        },
    );
    config.summarizer.breaker_failures = 2;
    config
}

/// `body` sent to the chat path by the caller of `key`; what condenser said of it.
async fn send(proxy: &Proxy, body: &Value, key: &str) -> (reqwest::Response, Condensed) {
    Fixture::Chat.post_as(proxy, key, body, false, &[]).await
}

/// One round of traffic: compacts and waits, hits the cache, is retried when upstream finds
/// the prompt too long (the first time: condenser then counts gpt-4o's prompts higher), streams,
/// fails upstream, and fails the summarizer. Each round is a new caller, so it summarizes anew.
async fn traffic_round(proxy: &Proxy, unreachable: &Proxy, round: usize) {
    let caller = format!("sk-round-{round}");
    let long = chat_body(&conversation(45));
    let (_, waited) = send(proxy, &long, &caller).await;
    assert_eq!(waited.action, "summarized");
    let (_, again) = send(proxy, &long, &caller).await;
    assert_eq!(again.cache, "hit");
    let (retried, condensed) = send(proxy, &chat_body(&conversation(27)), &caller).await;
    assert_eq!(retried.status(), 200);
    if round == 0 {
        assert_eq!(condensed.retry, "context_length_exceeded");
    }
    let mut streamed = chat_body(&conversation(2));
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let text = stream_text(send(proxy, &streamed, &caller).await.0).await;
    assert!(text.contains("reply"), "{text}");
    let mut broken = chat_body(&conversation(1));
    broken["user"] = json!(ERROR_USER);
    assert_eq!(send(proxy, &broken, &caller).await.0.status(), 500);
    // A model whose tokenizer is only estimated: its usage teaches the ratio the dashboard
    // shows (exact encodings have none).
    let mut estimated = chat_body(&conversation(1));
    estimated["model"] = json!("claude-sonnet-4-5");
    assert_eq!(send(proxy, &estimated, &caller).await.0.status(), 200);
    let (failed, _) = send(unreachable, &chat_body(&conversation(1)), &caller).await;
    assert_eq!(failed.status(), 502);
    for turns in [44, 46, 47, 48] {
        let body = chat_body(&conversation(turns + round));
        let (response, condensed) = send(proxy, &body, FAILING_CALLER).await;
        assert_eq!(response.status(), 200, "on_failure = trim");
        assert_ne!(condensed.action, "summarized");
    }
}

/// Two rounds, Prometheus scraping between them: a counter's series appears on its first
/// count, and only a second sample gives it a rate.
async fn drive_traffic(proxy: &Proxy, unreachable: &Proxy, prometheus: &Prometheus) {
    traffic_round(proxy, unreachable, 0).await;
    prometheus
        // Counted, not only present: every series exists from start-up at 0, and the second
        // round must come after a scrape that saw the first, or an increase reads 0 over 0.
        .wait_for("sum(condenser_summarizer_failures_total) > 0 and sum(condenser_upstream_failures_total) > 0 and sum(condenser_prompt_tokens_total) > 0")
        .await;
    traffic_round(proxy, unreachable, 1).await;
    let metrics = proxy.metrics().await;
    assert_eq!(
        metric(&metrics, "condenser_summarizer_breakers_open"),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            r#"condenser_summarizer_failures_total{reason="circuit_open"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn every_dashboard_panel_shows_data_from_a_real_prometheus() {
    let logs = captured_logs();
    let upstream = upstream().await;
    let proxy = Proxy::start(config(&upstream.url())).await;
    // A replica whose upstream refuses connections: upstream failures by kind.
    let closed = closed_url();
    let unreachable = Proxy::start(config(&closed)).await;
    let prometheus =
        Prometheus::start(&[proxy.addr.to_string(), unreachable.addr.to_string()]).await;

    // Both scraped once: histograms then have samples from before the traffic.
    prometheus.wait_for("count(up == 1) == 2").await;
    drive_traffic(&proxy, &unreachable, &prometheus).await;

    // The failing caller's breaker opened in the first round and turned away every request of
    // the second: logged once, not once per request.
    // This test's lines at INFO and above: its breaker's name its upstream, its failures its
    // summarizer's reply.
    let logged = logs.text();
    let ours = |line: &&str| {
        matches!(
            line.split_whitespace().nth(1),
            Some("INFO" | "WARN" | "ERROR")
        ) && (line.contains(&upstream.url()) || line.contains(SUMMARIZER_DOWN))
    };
    let lines = |text: &str| {
        logged
            .lines()
            .filter(ours)
            .filter(|l| l.contains(text))
            .count()
    };
    assert_eq!(lines("summarizer circuit open"), 1, "{logged}");
    assert_eq!(lines("circuit open after repeated failures"), 0, "{logged}");
    assert!(lines("summarizer failed") >= 2, "{logged}");

    // A hit rate of 0 is data too: the provider's cache must have served some of it.
    prometheus
        .wait_for("sum(condenser_cached_prompt_tokens_total) > 0")
        .await;
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_path(DASHBOARD)).unwrap()).unwrap();
    let mut waiting = panel_queries(&dashboard);
    // Rates need two scrapes after the traffic; a panel that never shows data fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !waiting.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        for (title, query) in waiting {
            if !has_data(&prometheus.query(&query).await) {
                still.push((title, query));
            }
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        waiting.is_empty(),
        "panels that never showed data: {waiting:#?}"
    );
    if let Ok(png) = std::env::var("CONDENSER_DASHBOARD_PNG") {
        // README's picture of the dashboard, drawn from this traffic.
        let status = Command::new("python3")
            .arg(repo_path("deploy/render_dashboard.py"))
            .args([&prometheus.url, &png])
            .status()
            .unwrap();
        assert!(status.success(), "deploy/render_dashboard.py failed");
    }
    let instances = prometheus
        .label_values("instance", "condenser_requests_total")
        .await;
    assert_eq!(instances.len(), 2, "{instances:?}");
    let models = prometheus
        .label_values("model", "condenser_prompt_tokens_total")
        .await;
    assert!(models.contains(&json!("gpt-4o")), "{models:?}");
    // Prometheus loaded the rules it was given: every alert is there, none broken.
    let rules: Value = client()
        .get(format!("{}/api/v1/rules", prometheus.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let loaded = rules["data"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(loaded.len(), 7, "{rules}");
    for rule in loaded {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
}

fn promtool(args: &[&str]) -> String {
    let output = Command::new(tool("promtool"))
        .args(args)
        .current_dir(repo_path("deploy/prometheus"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_and_each_fires_only_when_it_should() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    // Every alert has a unit test that fires it; each test's other instance must not fire.
    let rules = std::fs::read_to_string(repo_path(RULES)).unwrap();
    let tests = std::fs::read_to_string(repo_path(RULE_TESTS)).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 7);
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
    }
    let tested = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // A rule that lists routes lists every dialect's: a new API's traffic counts in each.
    let lists: Vec<&str> = rules
        .split("route=~\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(lists.len(), 3, "{rules}");
    for list in lists {
        let routes: Vec<&str> = list.split('|').collect();
        for wire in condenser::dialect::DIALECTS {
            assert!(
                routes.contains(&wire.route.name()),
                "{list} lacks {}",
                wire.route.name()
            );
        }
    }
}

/// Every metric name the dashboard's queries and the alert rules read, as each file spells it.
fn series_read_by(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("condenser_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// Each series the dashboard or an alert rule reads is on /metrics from start-up, before any
/// traffic and with no price configured (`condenser_spend_total` included): a panel or rule
/// over a series that appears only with its first event cannot tell zero from missing
/// (issue 55). The one exception is a learned ratio, which has no value to show before a
/// reply's usage teaches it.
#[tokio::test]
async fn every_series_the_dashboard_and_the_rules_read_shows_from_start_up() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let metrics = proxy.metrics().await;
    let shown: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let mut read = std::collections::BTreeSet::new();
    for file in [DASHBOARD, RULES] {
        read.extend(series_read_by(
            &std::fs::read_to_string(repo_path(file)).unwrap(),
        ));
    }
    assert!(read.contains("condenser_spend_total"), "{read:?}");
    let learned = "condenser_token_estimate_ratio";
    let missing: Vec<&String> = read
        .iter()
        .filter(|name| name.as_str() != learned)
        .filter(|name| {
            // A histogram's name alone reads its series (`histogram_quantile` over `_bucket`).
            !["", "_bucket", "_count", "_sum"]
                .iter()
                .any(|suffix| shown.contains(format!("{name}{suffix}").as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not on /metrics at start-up: {missing:?}"
    );
    assert_eq!(
        metric(
            &metrics,
            r#"condenser_spend_total{kind="session",model="other"}"#
        ),
        Some(0.0),
        "{metrics}"
    );
}
