//! Counts must equal OpenAI's tiktoken on every fixture in `tests/fixtures/tokens/`, in this
//! checkout and in a clone of the repository standing alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use condenser::dialect::chat::message_spans;
use condenser::tokens::catalog::TokensConfig;
use condenser::tokens::catalog::{ModelCatalog, ModelInfo};
use condenser::tokens::counter::{RawCount, RawPrompt, TokenCounter};
use condenser::tokens::encoding::Encoding;
use condenser::tokens::rules::count_text;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The repository's root: this checkout's.
fn checkout() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fixture of the repository at `root`, one JSON value a line.
fn fixture(root: &Path, name: &str) -> Vec<Value> {
    let path = root.join("tests/fixtures/tokens").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_text_fixture_matches_tiktoken() {
    texts_match_tiktoken(&checkout());
}

#[tokio::test]
async fn every_chat_request_fixture_matches_the_cookbook() {
    requests_match_the_cookbook(&checkout()).await;
}

/// A newcomer clones the repository and runs its tests, with nothing beside it: the clone
/// holds its fixtures, and no file in it reads from outside the repository. The fixture
/// checks then run on the clone's own files (the test binary is this one: the counting code
/// is the same, only where the data is read from differs, so nothing is built twice).
#[tokio::test]
async fn a_clone_standing_alone_holds_its_token_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let clone = dir.path().join("condenser");
    let source = format!("file://{}", checkout().display());
    let cloned = Command::new("git")
        .args(["clone", "--quiet", "--depth", "1", &source])
        .arg(&clone)
        .status()
        .unwrap();
    assert!(cloned.success(), "git clone {source}");
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&clone)
        .output()
        .unwrap();
    assert!(listed.status.success());
    // Written in two parts, so this file does not name it.
    let outside = ["..", "shared"].join("/");
    let reading_outside: Vec<&str> = listed
        .stdout
        .split(|&b| b == 0)
        .filter_map(|name| std::str::from_utf8(name).ok())
        .filter(|name| !name.is_empty())
        .filter(|name| {
            std::fs::read(clone.join(name)).is_ok_and(|bytes| {
                bytes
                    .windows(outside.len())
                    .any(|w| w == outside.as_bytes())
            })
        })
        .collect();
    assert!(
        reading_outside.is_empty(),
        "files that name {outside}: {reading_outside:?}"
    );
    texts_match_tiktoken(&clone);
    requests_match_the_cookbook(&clone).await;
}

fn texts_match_tiktoken(root: &Path) {
    let cases = fixture(root, "texts.jsonl");
    assert!(cases.len() > 300);
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let encoding = Encoding::from_name(case["encoding"].as_str().unwrap()).unwrap();
        let got = count_text(encoding, case["text"].as_str().unwrap());
        let want = case["tokens"].as_u64().unwrap();
        if u64::from(got) != want {
            wrong.push(format!(
                "line {}: {} got {got} want {want}",
                i + 1,
                encoding.name()
            ));
        }
    }
    assert!(wrong.is_empty(), "{} mismatches: {:?}", wrong.len(), wrong);
}

async fn requests_match_the_cookbook(root: &Path) {
    let cases = fixture(root, "messages.jsonl");
    assert!(cases.len() >= 60);
    let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
    let counter = TokenCounter::new(0.1);
    let raw_counter = TokenCounter::new(0.1);
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let model = case["model"].as_str().unwrap();
        let info = catalog.resolve(model);
        assert_eq!(
            info.encoding.name(),
            case["encoding"].as_str().unwrap(),
            "{model}"
        );
        let mut request = Map::new();
        for key in ["model", "messages", "tools"] {
            if let Some(v) = case.get(key) {
                request.insert(key.to_string(), v.clone());
            }
        }
        let got = counter.count_request(&request, &info).await.total;
        let want = case["prompt_tokens"].as_u64().unwrap();
        if got != want {
            wrong.push(format!(
                "line {} ({model}, tools: {}): got {got} want {want}",
                i + 1,
                case.get("tools").is_some()
            ));
        }
        // The proxy's raw path: counted from the JSON text, then again from its cache.
        // Located as the proxy locates them in a request body.
        let body = serde_json::json!({ "messages": request["messages"] }).to_string();
        let split = message_spans::split(body.as_bytes()).unwrap();
        let tools_json = request.get("tools").map(Value::to_string);
        let prompt = RawPrompt {
            messages: &split.messages,
            tools: tools_json
                .as_deref()
                .map(|t| serde_json::from_str(t).unwrap()),
            ..RawPrompt::default()
        };
        let mut encoded = Vec::new();
        for pass in ["uncached", "cached"] {
            let RawCount { count, metas, .. } =
                raw_counter.count_raw(&prompt, model, &info).await.unwrap();
            encoded.push(raw_counter.messages_encoded());
            if count.total != want || metas.len() != prompt.messages.len() {
                wrong.push(format!(
                    "line {} ({model}, raw, {pass}): got {} want {want}",
                    i + 1,
                    count.total
                ));
            }
        }
        assert_eq!(
            encoded[0],
            encoded[1],
            "line {}: the second pass encodes nothing",
            i + 1
        );
    }
    assert!(wrong.is_empty(), "{} mismatches: {:?}", wrong.len(), wrong);
}

#[tokio::test]
async fn a_conversation_grown_by_one_message_encodes_one_message() {
    let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
    let counter = TokenCounter::new(0.1);
    let info = catalog.resolve("gpt-4o");
    let mut messages: Vec<Value> = (0..50)
        .map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message number {i} about the weather")}))
        .collect();
    let request = |messages: &Vec<Value>| {
        let mut map = Map::new();
        map.insert("model".into(), Value::from("gpt-4o"));
        map.insert("messages".into(), Value::Array(messages.clone()));
        map
    };
    let first = counter.count_request(&request(&messages), &info).await;
    assert_eq!(counter.messages_encoded(), 50);
    messages.push(serde_json::json!({"role": "user", "content": "and one more"}));
    let grown = counter.count_request(&request(&messages), &info).await;
    assert_eq!(
        counter.messages_encoded(),
        51,
        "only the new message is encoded"
    );
    assert_eq!(grown.per_message[..50], first.per_message[..]);
    assert_eq!(grown.total, first.total + u64::from(grown.per_message[50]));
    // Key order does not defeat the cache; a different encoding does not share it.
    let reordered: Vec<Value> = messages
        .iter()
        .map(|m| serde_json::json!({"content": m["content"], "role": m["role"]}))
        .collect();
    counter.count_request(&request(&reordered), &info).await;
    assert_eq!(counter.messages_encoded(), 51);
    counter
        .count_request(&request(&messages), &catalog.resolve("gpt-4"))
        .await;
    assert_eq!(counter.messages_encoded(), 102);
}

#[tokio::test]
async fn estimates_for_unknown_tokenizers_carry_a_margin_then_learn() {
    let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
    let counter = TokenCounter::new(0.1);
    let info = catalog.resolve("claude-sonnet-4-5");
    assert!(!info.exact);
    let mut request = Map::new();
    request.insert("model".into(), Value::from("claude-sonnet-4-5"));
    request.insert(
        "messages".into(),
        serde_json::json!([{"role": "user", "content": "hello there, how are you today?"}]),
    );
    let count = counter.count_request(&request, &info).await;
    assert!(count.total > count.raw_total, "margin applied: {count:?}");
    // Upstream says the real count is twice ours: future estimates follow.
    counter.observe_usage("claude-sonnet-4-5", count.raw_total, count.raw_total * 2);
    let learned = counter.count_request(&request, &info).await;
    assert!(learned.total >= count.raw_total * 2, "{learned:?}");
    // Exact encodings never scale.
    let exact = catalog.resolve("gpt-4o");
    counter.observe_usage("gpt-4o", 10, 20);
    request.insert("model".into(), Value::from("gpt-4o"));
    let c = counter.count_request(&request, &exact).await;
    assert_eq!(c.total, c.raw_total);
}

async fn count_raw_total(counter: &TokenCounter, messages: &[Value], info: &ModelInfo) -> u64 {
    let json = Value::Array(messages.to_vec()).to_string();
    let raw: Vec<&RawValue> = serde_json::from_str(&json).unwrap();
    let raw: Vec<&[u8]> = raw.iter().map(|m| m.get().as_bytes()).collect();
    let prompt = RawPrompt {
        messages: &raw,
        ..RawPrompt::default()
    };
    let count = counter
        .count_raw(&prompt, "gpt-4o", info)
        .await
        .unwrap()
        .count;
    count.total
}

#[tokio::test]
async fn a_long_raw_conversation_is_counted_once_then_grows_by_one_encoding() {
    let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
    let info = catalog.resolve("gpt-4o");
    // About 150 KB of new text: more than an event loop should encode inline.
    let mut messages: Vec<Value> = (0..50)
        .map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("turn {i}: ").repeat(300)}))
        .collect();
    let counter = TokenCounter::new(0.1);
    let first = count_raw_total(&counter, &messages, &info).await;
    assert_eq!(counter.messages_encoded(), 50);
    let mut by_value = Map::new();
    by_value.insert("model".into(), Value::from("gpt-4o"));
    by_value.insert("messages".into(), Value::Array(messages.clone()));
    let reference = TokenCounter::new(0.1).count_request(&by_value, &info).await;
    assert_eq!(first, reference.total, "raw and tree counts agree");
    messages.push(serde_json::json!({"role": "user", "content": "and one more"}));
    let grown = count_raw_total(&counter, &messages, &info).await;
    assert_eq!(
        counter.messages_encoded(),
        51,
        "only the new message was encoded"
    );
    assert!(grown > first);
}
