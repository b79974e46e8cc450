//! Token-counting benchmarks: how fast a prompt is measured cold, how cheap a growing
//! conversation is once its earlier messages are cached, and tiktoken's slow inputs.
//!
//! Run: `cargo bench --bench tokens` (results and the bars are in BENCHMARKS.md).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use condenser::canonical::fast_hash_with_seed;
use condenser::tokens::catalog::TokensConfig;
use condenser::tokens::catalog::{ModelCatalog, ModelInfo};
use condenser::tokens::counter::{RawPrompt, TokenCounter};
use condenser::tokens::encoding::Encoding;
use condenser::tokens::rules::count_text;

/// The conversation of the cold and warm benchmarks.
const MESSAGES: usize = 200;
const CONVERSATION_TOKENS: u64 = 128_000;

/// xorshift64*: a seeded, dependency-free source of varied but reproducible text.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[rustfmt::skip]
const ENGLISH: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "request", "response",
    "conversation", "summary", "context", "window", "however", "therefore", "because",
    "understand", "implementation", "performance", "latency", "throughput", "measurement",
    "customer", "invoice", "shipment", "warehouse", "quarterly", "forecast", "revenue",
    "Please", "Could", "Thanks", "Sure", "Here", "First", "Then", "Finally", "Note",
    "approximately", "unfortunately", "straightforward", "configuration", "deployment",
    "Kubernetes", "PostgreSQL", "München", "naïve", "café", "résumé", "北京", "東京", "données",
];

#[rustfmt::skip]
const CODE: &[&str] = &[
    "fn", "let", "mut", "impl", "pub", "struct", "enum", "match", "return", "self", "Self",
    "async", "await", "Vec<u8>", "Option<String>", "Result<(), Error>", "HashMap::new()", "=>",
    "->", "::", "&mut", "{", "}", "(", ")", "[", "]", ";", "0x7f", "42", "3.14159", "i += 1;",
    "if x == 0 {", "} else {", "for item in items.iter() {", "println!(\"{}\", x);", "def",
    "class", "import", "numpy as np", "self.value", "__init__", "None", "True", "const",
    "function", "=== undefined", "console.log(err)", "SELECT * FROM", "WHERE id = $1",
    "user_id", "created_at", "snake_case_name", "camelCaseName", "HTTP/1.1", "Content-Type:",
    "\"application/json\"", "// TODO:", "# comment", "/usr/local/bin",
    "https://example.com/a?b=c",
];

/// About `tokens` o200k tokens of prose, occasionally switching into a code-like passage.
fn text(rng: &mut Rng, tokens: u32) -> String {
    let mut out = String::new();
    let mut counted = 0;
    while counted < tokens {
        let mut chunk = String::new();
        let code = rng.below(4) == 0;
        let words = 20 + rng.below(40);
        for i in 0..words {
            let list = if code { CODE } else { ENGLISH };
            let word = list[rng.below(list.len())];
            if i > 0 {
                chunk.push(if code && rng.below(6) == 0 { '\n' } else { ' ' });
            }
            chunk.push_str(word);
            if !code && rng.below(12) == 0 {
                chunk.push_str(if rng.below(3) == 0 { "," } else { "." });
            }
        }
        chunk.push_str(if code { "\n\n" } else { " " });
        let chunk_tokens = count_text(Encoding::O200k, &chunk);
        // Stop at whichever side of the target is closer.
        if counted > 0 && counted + chunk_tokens / 2 > tokens {
            break;
        }
        counted += chunk_tokens;
        out.push_str(&chunk);
    }
    out
}

fn message(role: &str, content: String) -> Value {
    json!({ "role": role, "content": content })
}

/// A system prompt and alternating user/assistant turns, ~`CONVERSATION_TOKENS` in all.
fn conversation() -> Vec<Value> {
    let mut rng = Rng(0x5eed_c0de_1234_5678);
    let per_message = (CONVERSATION_TOKENS / MESSAGES as u64) as u32 - 3;
    let mut messages = vec![message("system", text(&mut rng, per_message))];
    for i in 1..MESSAGES {
        // Vary the length (±50%) while keeping the total close to the target.
        let swing = if i % 2 == 0 { 1.5 } else { 0.5 };
        let tokens = (f64::from(per_message) * swing) as u32;
        let role = if i % 2 == 1 { "user" } else { "assistant" };
        messages.push(message(role, text(&mut rng, tokens)));
    }
    messages
}

fn request(messages: Vec<Value>) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), json!("gpt-4o"));
    body.insert("messages".into(), Value::Array(messages));
    body
}

fn gpt_4o() -> ModelInfo {
    ModelCatalog::new(BTreeMap::new(), TokensConfig::default()).resolve("gpt-4o")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn bench_count(c: &mut Criterion) {
    let rt = runtime();
    let model = gpt_4o();
    // Loads the encodings once, so no measured iteration pays for that.
    let counter = TokenCounter::new(0.1);

    let body = request(conversation());
    let total = rt.block_on(counter.count_request(&body, &model)).total;
    let bytes = serde_json::to_vec(&body).unwrap().len();
    println!("conversation: {MESSAGES} messages, {total} tokens, {bytes} bytes of JSON");

    let mut group = c.benchmark_group("count");

    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("cold_200_messages_128k", |b| {
        b.iter_batched_ref(
            || TokenCounter::new(0.1),
            |fresh| black_box(rt.block_on(fresh.count_request(&body, &model)).total),
            BatchSize::PerIteration,
        )
    });

    // Warm: the 200 messages are cached; every iteration appends one message never seen
    // before, so exactly one message is encoded and 200 are looked up.
    group.sample_size(100);
    group.measurement_time(Duration::from_secs(8));
    let warm = TokenCounter::new(0.1);
    rt.block_on(warm.count_request(&body, &model));
    let mut growing = body.clone();
    let mut turn: u64 = 0;
    let before = warm.messages_encoded();
    group.bench_function("warm_plus_one", |b| {
        b.iter(|| {
            turn += 1;
            let next = message(
                "user",
                format!(
                    "Turn {turn}: what does the summary say about the latency of the deployment?"
                ),
            );
            let list = growing
                .get_mut("messages")
                .and_then(Value::as_array_mut)
                .unwrap();
            if list.len() > MESSAGES {
                list.pop();
            }
            list.push(next);
            black_box(rt.block_on(warm.count_request(&growing, &model)).total)
        })
    });
    let encoded = warm.messages_encoded() - before;
    println!("warm_plus_one: {turn} iterations encoded {encoded} messages (expected {turn})");

    // The proxy's path for requests under every trigger: the messages array read as raw
    // JSON (no tree), each message keyed by its bytes. Same growing conversation; building
    // the JSON text is setup, not measured.
    let raw_warm = TokenCounter::new(0.1);
    let texts: Vec<String> = conversation().iter().map(Value::to_string).collect();
    let raw_count = |counter: &TokenCounter, json: &str| {
        let raw: Vec<&RawValue> = serde_json::from_str(json).unwrap();
        let raw: Vec<&[u8]> = raw.iter().map(|m| m.get().as_bytes()).collect();
        let prompt = RawPrompt {
            messages: &raw,
            ..RawPrompt::default()
        };
        rt.block_on(counter.count_raw(&prompt, "gpt-4o", &model))
            .unwrap()
            .count
            .total
    };
    raw_count(&raw_warm, &format!("[{}]", texts.join(",")));
    let before = raw_warm.messages_encoded();
    let mut raw_turn: u64 = 0;
    group.bench_function("raw_warm_plus_one", |b| {
        b.iter_batched(
            || {
                raw_turn += 1;
                let next = message(
                    "user",
                    format!("Turn {raw_turn}: what does the summary say about the latency?"),
                );
                format!("[{},{next}]", texts.join(","))
            },
            |json| black_box(raw_count(&raw_warm, &json)),
            BatchSize::LargeInput,
        )
    });
    // The full path on the same input, for comparison: the body parsed into a tree, then
    // counted with the canonical-form keys.
    let tree_warm = TokenCounter::new(0.1);
    rt.block_on(tree_warm.count_request(&body, &model));
    let mut tree_turn: u64 = 0;
    group.bench_function("tree_warm_plus_one_with_parse", |b| {
        b.iter_batched(
            || {
                tree_turn += 1;
                let next = message(
                    "user",
                    format!("Turn {tree_turn}: what does the summary say about the latency?"),
                );
                format!(
                    r#"{{"model":"gpt-4o","messages":[{},{next}]}}"#,
                    texts.join(",")
                )
            },
            |json| {
                let parsed: Map<String, Value> = serde_json::from_str(&json).unwrap();
                black_box(rt.block_on(tree_warm.count_request(&parsed, &model)).total)
            },
            BatchSize::LargeInput,
        )
    });
    let encoded = raw_warm.messages_encoded() - before;
    println!(
        "raw_warm_plus_one: {raw_turn} iterations encoded {encoded} messages (expected {raw_turn})"
    );

    // One 1 MB message, cold (it is encoded on the blocking pool, as in the proxy).
    let mut rng = Rng(0x0dd0_ba11);
    let mut big = String::new();
    while big.len() < 1 << 20 {
        big.push_str(&text(&mut rng, 2_000));
    }
    big.truncate(big.floor_char_boundary_compat(1 << 20));
    let big_body = request(vec![message("user", big)]);
    let big_tokens = rt.block_on(counter.count_request(&big_body, &model)).total;
    println!("one_message_1mb: {big_tokens} tokens");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("one_message_1mb", |b| {
        b.iter_batched_ref(
            || TokenCounter::new(0.1),
            |fresh| black_box(rt.block_on(fresh.count_request(&big_body, &model)).total),
            BatchSize::PerIteration,
        )
    });

    // tiktoken's slow case: one long run of letters is one pre-tokenizer piece, merged
    // pair by pair.
    let mut rng = Rng(0x0a1f_abe7);
    let no_spaces: String = (0..200 * 1024)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect();
    println!(
        "no_spaces_200kb: {} tokens",
        count_text(Encoding::O200k, &no_spaces)
    );
    // One timing per size shows how the cost grows with the length of the run.
    let mut scaling = String::from("no_spaces scaling (one run each):");
    for kb in [50, 100, 200, 400, 800] {
        let run: String = (0..kb * 1024)
            .map(|_| char::from(b'a' + rng.below(26) as u8))
            .collect();
        let start = std::time::Instant::now();
        black_box(count_text(Encoding::O200k, &run));
        scaling.push_str(&format!(" {kb} KB {:.0?};", start.elapsed()));
    }
    println!("{scaling}");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("no_spaces_200kb", |b| {
        b.iter(|| black_box(count_text(Encoding::O200k, black_box(&no_spaces))))
    });

    group.finish();
}

/// Where the warm count's time goes: the cache keys, against a count where nothing is new.
fn bench_hash(c: &mut Criterion) {
    let rt = runtime();
    let model = gpt_4o();
    let body = request(conversation());
    let messages = body["messages"].as_array().unwrap().clone();
    let mut group = c.benchmark_group("hash");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(5));

    let warm = TokenCounter::new(0.1);
    rt.block_on(warm.count_request(&body, &model));
    group.bench_function("warm_no_new_message", |b| {
        b.iter(|| black_box(rt.block_on(warm.count_request(&body, &model)).total))
    });
    // The count cache's keys: the canonical form fed into xxh3, one message at a time.
    group.bench_function("count_keys_200_messages", |b| {
        b.iter(|| {
            for m in &messages {
                black_box(fast_hash_with_seed(&[1], m));
            }
        })
    });
    // The summary cache's prefix chain: the same canonical form fed into blake3.
    group.bench_function("prefix_chain_200_messages", |b| {
        b.iter(|| black_box(condenser::compaction::cache::prefix_keys(&[0; 32], &messages).len()))
    });
    group.finish();
}

/// `str::floor_char_boundary` is unstable; the largest char boundary at or below `index`.
trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, index: usize) -> usize;
}

impl FloorCharBoundary for String {
    fn floor_char_boundary_compat(&self, index: usize) -> usize {
        let mut i = index.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

criterion_group!(benches, bench_count, bench_hash);
criterion_main!(benches);
