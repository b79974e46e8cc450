#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Counts must equal OpenAI's tiktoken on every shared fixture.

use std::collections::BTreeMap;
use std::path::PathBuf;

use condenser::config::TokensConfig;
use condenser::models::{Encoding, ModelCatalog};
use condenser::tokens::{count_text, TokenCounter};
use serde_json::{Map, Value};

fn fixture(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/tokens")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_text_fixture_matches_tiktoken() {
    let cases = fixture("texts.jsonl");
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

#[tokio::test]
async fn every_chat_request_fixture_matches_the_cookbook() {
    let cases = fixture("messages.jsonl");
    assert!(cases.len() >= 60);
    let catalog = ModelCatalog::new(BTreeMap::new(), TokensConfig::default());
    let counter = TokenCounter::new(0.1);
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
    }
    assert!(wrong.is_empty(), "{} mismatches: {:?}", wrong.len(), wrong);
}
