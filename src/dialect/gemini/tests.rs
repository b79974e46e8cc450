//! The request view and the rewrite, on Gemini's own shapes.

use super::view::{is_user, parts};
use super::*;
use crate::compaction::rewrite::{Action, CacheOutcome};
use crate::compaction::summary::Summary;
use crate::config::SummaryRole;
use crate::conversation::{Item, Kind, Role};
use crate::dialect::stages::forced_split;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

const PATH: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent";

fn request(body: Value) -> GeminiRequest {
    Gemini::parse(body.to_string().as_bytes(), PATH).unwrap()
}

fn signed_call(name: &str, signature: &str) -> Value {
    json!({"functionCall": {"name": name, "args": {"path": "a.rs"}}, "thoughtSignature": signature})
}

fn answer(name: &str, output: &str) -> Value {
    json!({"functionResponse": {"name": name, "response": {"output": output}}})
}

#[test]
fn the_model_and_method_are_the_paths() {
    for (path, compacts, serves, model) in [
        (
            "/v1beta/models/gemini-2.5-pro:generateContent",
            true,
            true,
            Some("gemini-2.5-pro"),
        ),
        (
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
            true,
            true,
            Some("gemini-2.5-pro"),
        ),
        (
            "/v1/models/gemini-3.1-pro-preview:generateContent",
            true,
            true,
            Some("gemini-3.1-pro-preview"),
        ),
        (
            "/v1beta/models/gemini-2.5-pro:countTokens",
            false,
            true,
            Some("gemini-2.5-pro"),
        ),
        (
            "/v1beta/models/text-embedding-004:embedContent",
            false,
            true,
            Some("text-embedding-004"),
        ),
        ("/v1beta/models", false, true, None),
        ("/v1beta/cachedContents", false, true, None),
        ("/v1/models", false, false, None),
        ("/v1/models/gpt-4o", false, false, None),
        ("/v1/models/ft:gpt-4o-mini:org::id", false, false, None),
        (
            "/v1/models/gemini-2.5-pro:countTokens",
            false,
            true,
            Some("gemini-2.5-pro"),
        ),
        (
            "/v1beta/models/ft:gpt-4o-mini:org::id",
            false,
            true,
            Some("ft"),
        ),
        ("/v1/chat/completions", false, false, None),
        ("/v1beta/models/:generateContent", false, true, None),
    ] {
        assert_eq!(Gemini::compacts(path), compacts, "{path}");
        assert_eq!(Gemini::serves(path), serves, "{path}");
        assert_eq!(Gemini::model_in_path(path), model, "{path}");
    }
    assert_eq!(
        Gemini::model(&request(json!({"contents": []}))),
        "gemini-2.5-pro"
    );
    let from_body = Gemini::parse(
        br#"{"model":"models/gemini-2.0-flash","contents":[]}"#,
        Gemini::PATH,
    );
    assert_eq!(Gemini::model(&from_body.unwrap()), "gemini-2.0-flash");
}

#[test]
fn turns_map_to_chat_messages_one_for_one() {
    let request = request(json!({
        "systemInstruction": {"parts": [{"text": "rules"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "fix it"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]},
            {"role": "model", "parts": [
                {"text": "weighing", "thought": true},
                {"text": "reading"},
                signed_call("read_file", "c2lnbmF0dXJl")]},
            {"role": "user", "parts": [answer("read_file", "fn main() {}")]},
            {"role": "model", "parts": [{"text": "done", "thoughtSignature": "dGV4dA=="}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {"type": "object"}}]}],
        "generationConfig": {"maxOutputTokens": 8192, "thinkingConfig": {"includeThoughts": true}},
    }));
    let chat = Gemini::conversation(&request);
    assert_eq!(chat.len(), 4);
    assert_eq!(
        chat[0],
        json!({"role": "user", "content": [{"type": "text", "text": "fix it"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]})
    );
    assert_eq!(
        chat[1],
        json!({"role": "assistant", "content": "reading", "tool_calls": [{"id": "read_file",
            "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}]})
    );
    assert_eq!(
        chat[2],
        json!({"role": "user", "content": "[tool result read_file]\nfn main() {}"})
    );
    assert_eq!(chat[3], json!({"role": "assistant", "content": "done"}));
    let items: Vec<Item> = contents(&request.body).iter().map(|t| item(t, 1)).collect();
    assert_eq!(
        items.iter().map(|i| (i.role, i.kind)).collect::<Vec<_>>(),
        [
            (Role::User, Kind::Message),
            (Role::Assistant, Kind::ToolCall),
            (Role::User, Kind::ToolResult),
            (Role::Assistant, Kind::Message)
        ]
    );
    assert_eq!(request.config.max_output_tokens, Some(8192));
}

#[test]
fn what_condenser_relies_on_is_checked_in_googles_words() {
    let message = |body: &str| {
        Gemini::parse(body.as_bytes(), PATH)
            .err()
            .map(|e| e.to_string())
    };
    assert!(message("{")
        .unwrap()
        .starts_with("request body is not valid JSON"));
    assert!(message("[]").unwrap().contains("must be a JSON object"));
    assert_eq!(
        message("{}").unwrap(),
        "* GenerateContentRequest.contents: contents is not specified"
    );
    assert!(message(r#"{"contents":"hi"}"#)
        .unwrap()
        .contains("'contents'"));
    assert!(message(r#"{"contents":[7]}"#)
        .unwrap()
        .contains("'contents[0]'"));
    assert!(message(r#"{"contents":[{"parts":"hi"}]}"#)
        .unwrap()
        .contains("'contents[0].parts'"));
    assert!(message(r#"{"contents":[],"generationConfig":[]}"#)
        .unwrap()
        .contains("generationConfig"));
    let orphan = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]},
        {"role": "user", "parts": [answer("f", "x")]}]});
    assert!(message(&orphan.to_string())
        .unwrap()
        .contains("function response turn comes immediately after a function call turn"));
    let short = json!({"contents": [{"role": "model", "parts": [signed_call("f", "s"), signed_call("g", "t")]},
        {"role": "user", "parts": [answer("f", "x")]}]});
    assert!(message(&short.to_string())
        .unwrap()
        .contains("number of function response parts"));
    // Roles and parts it does not know are carried, never refused.
    assert_eq!(
        message(
            r#"{"contents":[{"role":"critic","parts":[{"executableCode":{"code":"1"}}]}],"x":1}"#
        ),
        None
    );
}

/// The rewrite reads the head of a split alone: Gemini's is always empty.
fn no_split() -> Split {
    Split {
        head: 0,
        tail_start: 0,
        task: None,
        ahead: 0,
        summary_ends: Vec::new(),
        shorten: Vec::new(),
        recent_start: 0,
        estimated_tokens: 0,
    }
}

fn rewrite_of(kept_from: usize, pinned: Option<std::ops::Range<usize>>, summary: bool) -> Rewrite {
    Rewrite {
        summary: summary.then(|| Arc::new(Summary::story_so_far(kept_from))),
        kept_from,
        pinned,
        cuts: Vec::new(),
        action: Action::Summarized,
        cache: CacheOutcome::Hit,
        summarized: kept_from,
        waited: Duration::ZERO,
        archive: None,
    }
}

/// A session of `rounds` signed calls and their answers after one task.
fn session(rounds: usize) -> Value {
    let mut turns =
        vec![json!({"role": "user", "parts": [{"text": "Ticket KX-1: read the logs"}]})];
    for round in 0..rounds {
        turns.push(
            json!({"role": "model", "parts": [signed_call("read_file", &format!("sig-{round}"))]}),
        );
        turns.push(json!({"role": "user", "parts": [answer("read_file", &format!("log {round} ").repeat(50))]}));
    }
    json!({"systemInstruction": {"parts": [{"text": "rules"}]}, "contents": turns,
        "tools": [{"functionDeclarations": [{"name": "read_file"}]}], "labels": {"k": "v"}})
}

#[test]
fn the_pinned_task_then_the_summary_then_kept_turns_their_signatures_verbatim() {
    let mut request = request(session(6));
    let sent = contents(&request.body).to_vec();
    let settings = ContextConfig {
        summary_role: SummaryRole::User,
        ..Default::default()
    };
    Gemini::rewrite(
        &mut request,
        &no_split(),
        &rewrite_of(7, Some(0..1), true),
        &settings,
        Encoding::O200k,
    );
    let out = contents(&request.body);
    assert_eq!(out.len(), 1 + 6);
    assert_eq!(
        parts(&out[0])[0],
        json!({"text": "Ticket KX-1: read the logs"})
    );
    let summary = parts(&out[0])[1]["text"].as_str().unwrap();
    assert!(summary.starts_with("[Context summary: 7 earlier messages]\n\nthe story so far"));
    assert_eq!(
        &out[1..],
        &sent[7..],
        "kept turns, signatures and all, as sent"
    );
    assert_eq!(out[1]["parts"][0]["thoughtSignature"], "sig-3");
    // Every other field stays, in its place.
    let keys: Vec<&String> = request.body.keys().collect();
    assert_eq!(keys, ["systemInstruction", "contents", "tools", "labels"]);
    assert_eq!(
        request.body["systemInstruction"],
        json!({"parts": [{"text": "rules"}]})
    );
    assert_eq!(Gemini::conversation(&request).len(), out.len());
}

#[test]
fn without_a_pinned_task_a_summary_opens_the_contents_as_a_user_turn() {
    let mut request = request(session(4));
    let settings = ContextConfig {
        summary_role: SummaryRole::User,
        ..Default::default()
    };
    Gemini::rewrite(
        &mut request,
        &no_split(),
        &rewrite_of(3, None, true),
        &settings,
        Encoding::O200k,
    );
    let out = contents(&request.body);
    assert!(is_user(&out[0]));
    assert!(out[0]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[Context summary: 3 earlier messages]"));
    assert_eq!(out[1]["parts"][0]["thoughtSignature"], "sig-1");
    // Trimmed, the first turn is still the user's.
    let mut request = self::request(session(4));
    Gemini::rewrite(
        &mut request,
        &no_split(),
        &rewrite_of(3, None, false),
        &settings,
        Encoding::O200k,
    );
    assert_eq!(
        contents(&request.body)[0]["parts"][0]["text"],
        "[3 earlier messages omitted]"
    );
    // With `summary_role = "system"`, the summary follows the system instruction.
    let mut request = self::request(session(4));
    let settings = ContextConfig {
        summary_role: SummaryRole::System,
        ..Default::default()
    };
    Gemini::rewrite(
        &mut request,
        &no_split(),
        &rewrite_of(7, Some(0..1), true),
        &settings,
        Encoding::O200k,
    );
    assert_eq!(
        request.body["systemInstruction"]["parts"][0]["text"],
        "rules"
    );
    assert!(request.body["systemInstruction"]["parts"][1]["text"]
        .as_str()
        .unwrap()
        .contains("the story so far"));
    assert_eq!(
        contents(&request.body)[0],
        json!({"role": "user", "parts": [{"text": "Ticket KX-1: read the logs"}]})
    );
}

#[test]
fn a_planned_cut_shortens_the_response_text_and_nothing_else() {
    let mut request = request(session(3));
    let mut rewrite = rewrite_of(0, None, false);
    rewrite.cuts = vec![crate::compaction::shorten::Shorten {
        index: 2,
        tokens: 400,
        keep_tokens: 60,
    }];
    Gemini::rewrite(
        &mut request,
        &no_split(),
        &rewrite,
        &ContextConfig::default(),
        Encoding::O200k,
    );
    let out = contents(&request.body);
    let output = out[2]["parts"][0]["functionResponse"]["response"]["output"]
        .as_str()
        .unwrap();
    assert!(output.contains("tokens removed"), "{output}");
    assert_eq!(out[2]["parts"][0]["functionResponse"]["name"], "read_file");
    assert_eq!(out[1]["parts"][0]["thoughtSignature"], "sig-0");
    assert_eq!(out[4], session(3)["contents"][4], "other turns untouched");
}

/// Random sessions: a task, then rounds of one to three signed calls answered together, or
/// of model text and a new user prompt.
fn conversation() -> impl Strategy<Value = Vec<Value>> {
    prop::collection::vec((any::<bool>(), 1usize..4, 1usize..300), 1..30).prop_map(|rounds| {
        let mut turns = vec![json!({"role": "user", "parts": [{"text": "the task"}]})];
        for (r, (calls, n, size)) in rounds.into_iter().enumerate() {
            let text = "word ".repeat(size);
            if calls {
                let calls: Vec<Value> = (0..n)
                    .map(|c| signed_call(&format!("f{r}_{c}"), &format!("s{r}")))
                    .collect();
                let answers: Vec<Value> = (0..n)
                    .map(|c| answer(&format!("f{r}_{c}"), &text))
                    .collect();
                turns.push(json!({"role": "model", "parts": calls}));
                turns.push(json!({"role": "user", "parts": answers}));
            } else {
                turns.push(json!({"role": "model", "parts": [{"text": text}]}));
                turns.push(json!({"role": "user", "parts": [{"text": text}]}));
            }
        }
        turns
    })
}

fn names(turn: &Value, kind: &str) -> Vec<String> {
    parts(turn)
        .iter()
        .filter_map(|p| p.get(kind)?.get("name")?.as_str().map(String::from))
        .collect()
}

proptest! {
    #[test]
    fn compacted_contents_start_with_a_user_and_keep_calls_with_their_answers(
        sent in conversation(),
        window in 2_000u64..30_000,
        keep in 0usize..8,
        with_summary in any::<bool>(),
        role_system in any::<bool>(),
    ) {
        let mut request = request(json!({"systemInstruction": {"parts": [{"text": "rules"}]},
            "contents": &sent, "generationConfig": {"maxOutputTokens": 500}}));
        let mut settings = ContextConfig { keep_recent_messages: keep, ..Default::default() };
        settings.summary_role = if role_system { SummaryRole::System } else { SummaryRole::User };
        let Some(split) = forced_split::<Gemini>(&request, window, &settings) else {
            return Ok(());
        };
        let kept_from = split.tail_start;
        let mut rewrite = rewrite_of(kept_from, split.pinned_before(kept_from), with_summary);
        rewrite.cuts = split.shorten.clone();
        Gemini::rewrite(&mut request, &split, &rewrite, &settings, Encoding::O200k);
        let out = contents(&request.body);
        prop_assert!(!out.is_empty());
        prop_assert!(is_user(&out[0]), "first turn is not the user's");
        if let Some(task) = &rewrite.pinned {
            prop_assert_eq!(&parts(&out[0])[0], &parts(&sent[task.start])[0], "the task is pinned first");
        }
        for (i, turn) in out.iter().enumerate() {
            let answered = names(turn, "functionResponse");
            if !answered.is_empty() {
                prop_assert!(i > 0);
                prop_assert_eq!(names(&out[i - 1], "functionCall"), answered);
            }
            let calls = names(turn, "functionCall");
            if !calls.is_empty() && i + 1 < out.len() {
                prop_assert_eq!(names(&out[i + 1], "functionResponse"), calls);
                let signed = parts(turn).iter().all(|p| p["thoughtSignature"].is_string());
                prop_assert!(signed, "a kept call lost its signature");
            }
        }
        prop_assert!(Gemini::parse(&serde_json::to_vec(&request.body).unwrap(), PATH).is_ok());
    }
}
