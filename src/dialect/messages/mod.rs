//! Anthropic Messages (`POST /v1/messages`): the dialect's stages of the pipeline. The head
//! is `system`, never changed (save for the summary when `summary_role = "system"`); each
//! message is one conversation item, seen by counting and the summarizer as a chat message;
//! an assistant turn's `tool_use` blocks and the next user turn's `tool_result` blocks are
//! one unit. A compacted `messages` starts with a user turn and alternates roles.

mod error;
pub mod recall;
mod rewrite;
pub mod summary;
pub mod usage;
mod view;

use std::future::Future;

use bytes::Bytes;
use hyper::Response;
use serde_json::{json, Map, Value};

use crate::compaction::plan::Split;
use crate::compaction::rewrite::Rewrite;
use crate::compaction::summary_api::SummaryApi;
use crate::config::{ContextConfig, SummaryRole};
use crate::conversation::Views;
use crate::dialect::recall::RecallWire;
use crate::dialect::request::{
    array, changed_items, object_with_model, planned_body, rewrite_conversation, Origins,
    RawFields, SentRanges, Splice,
};
use crate::dialect::stages::{Dialect, Prepared, RawStage};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::{RawItems, TokenCounter};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::{count_text, count_tools, REPLY_PRIMING};
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;
use error::error_response;
use rewrite::{compacted_messages, tool_result_texts};
use view::{chat_message, item, messages};

pub const MESSAGES: &str = "/v1/messages";

/// The header Anthropic's SDKs send with every request, whatever the key: on a path its API
/// shares with others, it says the caller is Anthropic's.
pub const VERSION_HEADER: &str = "anthropic-version";

/// Anthropic Messages.
pub struct Messages;

/// A Messages request; its messages are seen as chat messages (`conversation`) when read.
pub struct MessagesRequest {
    body: Map<String, Value>,
    /// Where its sent items stand in the body and, once rewritten, each item's origin
    /// (`compacted_messages`): what its body is spliced from.
    origins: Origins,
}

impl Dialect for Messages {
    const NAME: &'static str = "messages";
    const PATH: &'static str = MESSAGES;
    const SERVED: &'static str = "message";
    const USAGE: &'static dyn UsageReader = &usage::MessagesUsage;
    const KEY_STYLE: KeyStyle = KeyStyle {
        header: "x-api-key",
        also_in: &[],
        query: None,
    };
    const SUMMARY: &'static dyn SummaryApi = &summary::MessagesSummary;
    const CONVERSATION_FIELD: &'static str = "messages";
    const CACHED_BEFORE: &'static [&'static str] = &["tools", "system"];
    const ROUTE: Route = Route::named("messages");
    const RECALL: Option<&'static dyn RecallWire> = Some(&recall::MessagesRecall);
    const RAW_STAGE: Option<&'static RawStage> = Some(&RAW_STAGE);
    type Request = MessagesRequest;

    /// A body with a top-level `system` or Anthropic's content blocks. One that could be
    /// chat as well is read as chat: `--api` says otherwise.
    fn written_for(body: &Value) -> bool {
        let anthropic_block = |block: &Value| {
            matches!(
                block.get("type").and_then(Value::as_str),
                Some("tool_use" | "tool_result" | "thinking" | "redacted_thinking")
            )
        };
        let has_anthropic_blocks = body
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|message| message.get("content").and_then(Value::as_array))
            .flatten()
            .any(anthropic_block);
        body.get("system").is_some() || has_anthropic_blocks
    }

    fn error_response(error: &ProxyError) -> Response<ProxyBody> {
        error_response(error)
    }

    fn parse(bytes: &[u8], _path: &str) -> Result<Self::Request, ProxyError> {
        Ok(MessagesRequest {
            body: parse_request(bytes)?,
            origins: Origins::default(),
        })
    }

    fn body_mut(request: &mut Self::Request) -> &mut Map<String, Value> {
        &mut request.body
    }

    fn model(request: &Self::Request) -> &str {
        request
            .body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send {
        counted(request, catalog, counter)
    }

    fn conversation(request: &Self::Request) -> Views<'_> {
        let messages = messages(&request.body);
        Views::lazy(messages.len(), |index| {
            let message = request.origins.item(messages, index);
            chat_message(message.unwrap_or(&Value::Null))
        })
    }

    fn rewrite(
        request: &mut Self::Request,
        split: &Split,
        rewrite: &Rewrite,
        settings: &ContextConfig,
        encoding: Encoding,
    ) {
        let summary = rewrite.summary_text(split.head, "messages");
        let summary_role = settings.summary_role;
        let mut origins = None;
        let sent_items = &mut request.origins;
        rewrite_conversation(&mut request.body, "messages", |body, mut sent| {
            let seed = (encoding, RAW_STAGE.items.seed);
            let cut = sent_items.cut_outputs(&mut sent, rewrite, seed, tool_result_texts);
            sent_items.parse_into(&mut sent, rewrite.items_read());
            let (messages, mut from) =
                compacted_messages(body, sent, split, rewrite, summary, summary_role);
            changed_items(&mut from, &cut);
            origins = Some(from);
            messages
        });
        request.origins.of_items = origins;
        if summary_role == SummaryRole::System {
            request.origins.changed("system");
        }
    }

    /// Its messages left out of the tree, each parsed when read: a compacted request reads
    /// only the few its rewrite changes, and copies the rest as sent (`splice`).
    fn parse_planned(
        bytes: &Bytes,
        _path: &str,
        sent: SentRanges,
    ) -> Result<Self::Request, ProxyError> {
        let (body, origins) = planned_body(bytes, sent, parse_request)?;
        Ok(MessagesRequest { body, origins })
    }

    fn made_whole(request: &mut Self::Request) {
        request
            .origins
            .parse_all_into(&mut request.body, "messages");
    }

    fn splice(request: &Self::Request) -> Option<(&Map<String, Value>, Splice<'_>)> {
        Some((&request.body, request.origins.splice("messages")?))
    }

    // Anthropic streams always carry usage (`message_start`, `message_delta`): the default
    // `outgoing_body` asks for none.
}

/// Checks what condenser cannot read without; everything else is left for upstream to
/// judge. A role or block condenser does not know (Claude Code sends `system` messages
/// among the turns) is carried as an opaque item, counted and kept in order.
fn parse_request(bytes: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    let body = object_with_model(bytes, "model: Field required")?;
    array(&body, "messages", "messages: Field required")?;
    Ok(body)
}

/// Messages items and parts, their counts kept apart from other dialects' of the same bytes.
/// The fields counting and planning read, the messages left raw: an agent's 800 KB request
/// under every trigger is counted from the bytes of messages seen before, without a JSON
/// tree. Anything irregular fails this and takes the full path.
const RAW_STAGE: RawStage = RawStage {
    fields: RawFields {
        items: "messages",
        // In the order `part` counts them.
        parts: &["system", "tools", "tool_choice"],
        max_tokens: "max_tokens",
        extra: Some("thinking"),
        full_path: &[],
    },
    items: RawItems {
        seed: 0x616e_7468_726f_7000,
        read: |message| Some((chat_message(message), item(message, 0))),
    },
    parts_seed: 0x7379_7374_656d_0000,
    part: |encoding, index, part| match index {
        0 => system_tokens(encoding, Some(&part)),
        1 => tools_tokens(encoding, Some(&part)),
        _ => tool_choice_tokens(encoding, Some(&part)),
    },
    // `system`'s blocks, each counted alone (`system_tokens`).
    summed: Some(0),
    reserve: |max_tokens, thinking| {
        let budget = thinking
            .and_then(|thinking| serde_json::from_str::<Value>(thinking.get()).ok())
            .and_then(|thinking| thinking.get("budget_tokens").and_then(Value::as_u64));
        reserve(max_tokens, budget)
    },
};

/// What a request costs besides its messages: reply priming, `system`, tools, `tool_choice`.
fn fixed_tokens(
    encoding: Encoding,
    system: Option<&Value>,
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> u32 {
    REPLY_PRIMING
        + system_tokens(encoding, system)
        + tools_tokens(encoding, tools)
        + tool_choice_tokens(encoding, tool_choice)
}

fn tool_choice_tokens(encoding: Encoding, tool_choice: Option<&Value>) -> u32 {
    tool_choice.map_or(0, |choice| count_text(encoding, &choice.to_string()))
}

/// The text of `system`, a string or text blocks.
fn system_tokens(encoding: Encoding, system: Option<&Value>) -> u32 {
    match system {
        Some(Value::String(text)) => count_text(encoding, text),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|block| match block.get("text").and_then(Value::as_str) {
                Some(text) => count_text(encoding, text),
                None => count_text(encoding, &block.to_string()),
            })
            .sum(),
        Some(other) => count_text(encoding, &other.to_string()),
        None => 0,
    }
}

/// Client tools in the shape `count_tools` reads; server tools (no `input_schema`) are
/// counted as their JSON.
fn tools_tokens(encoding: Encoding, tools: Option<&Value>) -> u32 {
    let Some(Value::Array(tools)) = tools else {
        return 0;
    };
    let (client, server): (Vec<&Value>, Vec<&Value>) =
        tools.iter().partition(|t| t.get("input_schema").is_some());
    let as_functions: Vec<Value> = client
        .iter()
        .map(|tool| {
            json!({"type": "function", "function": {
                "name": tool.get("name").cloned().unwrap_or_default(),
                "description": tool.get("description").cloned().unwrap_or_default(),
                "parameters": tool.get("input_schema").cloned().unwrap_or_default(),
            }})
        })
        .collect();
    count_tools(encoding, &as_functions)
        + server
            .iter()
            .map(|tool| count_text(encoding, &tool.to_string()))
            .sum::<u32>()
}

/// The reply's reserve: `max_tokens`, which Anthropic requires to exceed
/// `thinking.budget_tokens` (thinking is output within `max_tokens`). Interleaved thinking
/// with tools may set a budget past `max_tokens`; the larger is reserved then.
fn requested_completion_tokens(body: &Map<String, Value>) -> Option<u64> {
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64);
    let budget = body
        .get("thinking")
        .and_then(|t| t.get("budget_tokens"))
        .and_then(Value::as_u64);
    reserve(max_tokens, budget)
}

fn reserve(max_tokens: Option<u64>, budget: Option<u64>) -> Option<u64> {
    match (max_tokens, budget) {
        (Some(max), Some(budget)) => Some(max.max(budget)),
        (max, budget) => max.or(budget),
    }
}

/// A parsed request counted for planning: `system`, tools and `tool_choice` as fixed
/// tokens, each message as its chat form.
async fn counted(
    request: &MessagesRequest,
    catalog: &ModelCatalog,
    counter: &TokenCounter,
) -> Prepared {
    let body = &request.body;
    let model = Messages::model(request);
    let info = catalog.resolve(model);
    let encoding = info.encoding;
    let [system, tools, tool_choice] = ["system", "tools", "tool_choice"].map(|f| body.get(f));
    let fixed = counter.count_parts(encoding, &[system, tools, tool_choice], || {
        fixed_tokens(encoding, system, tools, tool_choice)
    });
    // Each message as sent, whether in the tree or left out of it.
    let sent = messages(body);
    let sent: Vec<&Value> = (0..sent.len())
        .filter_map(|index| request.origins.item(sent, index))
        .collect();
    let chat: Vec<Value> = sent.iter().map(|message| chat_message(message)).collect();
    let count = counter.count_messages(&chat, fixed, model, &info).await;
    let metas = sent
        .iter()
        .zip(&count.per_message)
        .map(|(message, &tokens)| item(message, tokens))
        .collect();
    Prepared {
        info,
        count,
        metas,
        requested_completion_tokens: requested_completion_tokens(body),
        choices: 1,
        identities: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::view::{block_type, blocks, is_user};
    use super::*;
    use crate::compaction::rewrite::{Action, ArchiveScope, CacheOutcome};
    use crate::compaction::summary::Summary;
    use crate::config::SummaryRole;
    use crate::conversation::{Item, Kind, Role};
    use crate::dialect::request::{read_fields, SentRanges};
    use crate::dialect::stages::forced_split;
    use crate::dialect::stages::write_compaction;
    use bytes::Bytes;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn request(body: Value) -> MessagesRequest {
        Messages::parse(body.to_string().as_bytes(), MESSAGES).unwrap()
    }

    #[test]
    fn system_blocks_counted_alone_sum_to_the_whole_systems_count() {
        let counter = TokenCounter::new(0.1);
        let count = |system: &Value| {
            let raw = system.to_string();
            let part = |index, part| (RAW_STAGE.part)(Encoding::O200k, index, part);
            let seed = (RAW_STAGE.parts_seed, RAW_STAGE.summed);
            counter.count_raw_parts(Encoding::O200k, seed, &[Some(&raw)], part)
        };
        let rules =
            json!({"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}});
        let summary = json!({"type": "text", "text": "the story so far"});
        for system in [
            json!([rules.clone()]),
            json!([rules, summary, {"type": "image", "source": {}}]),
            json!("rules\n\nthe story so far"),
            // An element and a whole part of the same bytes, which count otherwise.
            json!(["rules"]),
            json!("rules"),
        ] {
            let whole = system_tokens(Encoding::O200k, Some(&system));
            assert_eq!(count(&system), Some(whole), "{system}");
            assert_eq!(count(&system), Some(whole), "{system} kept");
        }
    }

    #[test]
    fn messages_map_to_chat_messages_one_for_one() {
        let request = request(
            json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "looking"},
                    {"type": "tool_use", "id": "tu_1", "name": "grep", "input": {"q": "x"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": "found", "is_error": true}]},
            ]}),
        );
        let chat = Messages::conversation(&request);
        assert_eq!(chat.len(), 3);
        assert_eq!(chat[0], json!({"role": "user", "content": "hi"}));
        assert_eq!(
            chat[1],
            json!({"role": "assistant", "content": "looking",
                "tool_calls": [{"id": "tu_1", "type": "function",
                    "function": {"name": "grep", "arguments": "{\"q\":\"x\"}"}}]})
        );
        assert_eq!(chat[2]["content"], "[tool result tu_1 (error)]\nfound");
        let kinds: Vec<Kind> = messages(&request.body)
            .iter()
            .map(|m| item(m, 1).kind)
            .collect();
        assert_eq!(kinds, [Kind::Message, Kind::ToolCall, Kind::ToolResult]);
    }

    #[test]
    fn what_condenser_relies_on_is_checked() {
        let message = |body: &str| {
            Messages::parse(body.as_bytes(), MESSAGES)
                .err()
                .map(|e| e.to_string())
        };
        assert!(message("{")
            .unwrap()
            .starts_with("request body is not valid JSON"));
        assert_eq!(message("[]").unwrap(), "request body must be a JSON object");
        assert_eq!(
            message(r#"{"messages":[]}"#).unwrap(),
            "model: Field required"
        );
        assert_eq!(
            message(r#"{"model":"claude-x"}"#).unwrap(),
            "messages: Field required"
        );
        assert_eq!(message(r#"{"model":"claude-x","messages":[]}"#), None);
    }

    /// Claude Code 2.1 sends `system` turns among the messages; other roles and blocks may
    /// come. Each is an item of its own, counted, kept in order and never refused.
    #[test]
    fn roles_and_blocks_condenser_does_not_know_are_opaque_items() {
        let request = Messages::parse(
            br#"{"model":"claude-x","messages":[
                {"role":"user","content":"fix the bug"},
                {"role":"system","content":"<system-reminder>be brief</system-reminder>"},
                {"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{}},
                    {"type":"mystery_block","data":"x"}]},
                {"role":"critic","content":"fine"}
            ]}"#,
            MESSAGES,
        )
        .unwrap();
        let chat = Messages::conversation(&request);
        assert_eq!(chat.len(), 4);
        assert_eq!(chat[1]["role"], "system");
        assert_eq!(chat[3]["role"], "critic");
        let items: Vec<Item> = messages(&request.body).iter().map(|m| item(m, 1)).collect();
        assert_eq!(
            items.iter().map(|i| i.kind).collect::<Vec<_>>(),
            [Kind::Message, Kind::Message, Kind::Message, Kind::Other]
        );
        assert_eq!(
            items.iter().map(|i| i.role).collect::<Vec<_>>(),
            [Role::User, Role::System, Role::Assistant, Role::Other]
        );
        assert!(chat[2].to_string().contains("mystery_block"));
    }

    #[test]
    fn the_reserve_is_max_tokens_or_a_larger_thinking_budget() {
        let body = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            requested_completion_tokens(&body(
                json!({"max_tokens": 16000, "thinking": {"type": "enabled", "budget_tokens": 10000}})
            )),
            Some(16000)
        );
        assert_eq!(
            requested_completion_tokens(&body(
                json!({"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 10000}})
            )),
            Some(10000)
        );
        assert_eq!(requested_completion_tokens(&body(json!({}))), None);
    }

    #[test]
    fn a_spliced_agent_request_reads_as_its_rewritten_tree() {
        let output = "line of a long tool output ".repeat(300);
        let call = |id: &str| {
            json!({"role": "assistant", "content": [
            {"type": "text", "text": "reading"},
            {"type": "tool_use", "id": id, "name": "Read", "input": {"path": "a.rs"}}]})
        };
        let result = |id: &str| {
            json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]})
        };
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 500,
            "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "fix the bug"}, call("a"), result("a"),
                call("b"), result("b"), call("c"), result("c"),
                {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}],
            "stream": true});
        let (spliced, tree, copied) =
            crate::dialect::splice_cases::spliced_and_tree::<Messages>(&body, 3, 4);
        assert_eq!(spliced, tree);
        assert!(copied);
        let messages = spliced["messages"].as_array().unwrap();
        assert!(messages[0].to_string().contains("the story so far"));
        assert!(messages[2]["content"][0]["content"]
            .to_string()
            .contains("tokens removed"));
        assert_eq!(messages[4], body["messages"][6]);
        assert_eq!(spliced["tools"][1]["name"], "condenser_recall");
    }

    /// Random alternating conversations, user first, where an assistant turn may call tools
    /// (with thinking) and the next user turn answers every call.
    fn conversation() -> impl Strategy<Value = Vec<Value>> {
        prop::collection::vec((any::<bool>(), 1u32..4, 1usize..400), 1..40).prop_map(|turns| {
            let mut messages = Vec::new();
            let mut pending: Vec<String> = Vec::new();
            for (t, (calls, n, size)) in turns.into_iter().enumerate() {
                let text = "word ".repeat(size);
                let mut user = Vec::new();
                for id in pending.drain(..) {
                    user.push(json!({"type": "tool_result", "tool_use_id": id, "content": text}));
                }
                if user.is_empty() {
                    user.push(json!({"type": "text", "text": text}));
                }
                messages.push(json!({"role": "user", "content": user}));
                let mut assistant = vec![json!({"type": "text", "text": text})];
                if calls {
                    assistant.insert(
                        0,
                        json!({"type": "thinking", "thinking": "t", "signature": "s"}),
                    );
                    for c in 0..n {
                        let id = format!("tu_{t}_{c}");
                        assistant
                            .push(json!({"type": "tool_use", "id": id, "name": "f", "input": {}}));
                        pending.push(id);
                    }
                }
                messages.push(json!({"role": "assistant", "content": assistant}));
            }
            if !pending.is_empty() {
                let results: Vec<Value> = pending
                    .drain(..)
                    .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"}))
                    .collect();
                messages.push(json!({"role": "user", "content": results}));
            }
            messages
        })
    }

    fn tool_ids(message: &Value, kind: &str, field: &str) -> Vec<String> {
        blocks(message)
            .iter()
            .filter(|b| block_type(b) == kind)
            .filter_map(|b| b.get(field).and_then(Value::as_str).map(String::from))
            .collect()
    }

    proptest! {
        #[test]
        fn compacted_conversations_alternate_start_with_a_user_and_orphan_nothing(
            sent in conversation(),
            window in 2_000u64..40_000,
            keep in 0usize..8,
            summary_at in any::<prop::sample::Index>(),
            with_summary in any::<bool>(),
            role_system in any::<bool>(),
            with_recall in any::<bool>(),
        ) {
            // Pretty-printed, so that an item copied from the bytes sent differs in its text
            // from one written out again.
            let sent_body = serde_json::to_vec_pretty(&json!({"model": "claude-sonnet-4-5",
                "max_tokens": 500, "system": "rules", "messages": sent,
                "tools": [{"name": "Read", "input_schema": {"type": "object"}}]})).unwrap();
            // Parsed whole, as the full path parses it; and as its raw stage planned it, its
            // messages left as sent until read.
            let mut whole = Messages::parse(&sent_body, MESSAGES).unwrap();
            let raw = read_fields(&sent_body, &RAW_STAGE.fields).unwrap();
            let ranges = SentRanges::of(&sent_body, (&raw.items, &raw.parts), &RAW_STAGE.fields);
            let mut request =
                Messages::parse_planned(&Bytes::from(sent_body.clone()), MESSAGES, ranges).unwrap();
            let mut settings = ContextConfig { keep_recent_messages: keep, ..Default::default() };
            settings.summary_role = if role_system { SummaryRole::System } else { SummaryRole::User };
            let Some(split) = forced_split::<Messages>(&request, window, &settings) else {
                return Ok(());
            };
            // A shorter cached summary may be used: any planned summary end.
            let kept_from = if split.summary_ends.is_empty() {
                split.tail_start
            } else {
                split.summary_ends[summary_at.index(split.summary_ends.len())]
            };
            let rewrite = Rewrite {
                summary: with_summary.then(|| Arc::new(Summary::story_so_far(kept_from))),
                kept_from,
                pinned: split.pinned_before(kept_from),
                cuts: split.shorten.clone(),
                action: Action::Summarized,
                cache: CacheOutcome::Miss,
                summarized: kept_from,
                waited: Duration::ZERO,
                archive: with_recall.then(|| ArchiveScope {
                    caller: [0; 32],
                    conversation: "c0ffee".into(),
            bindings: Default::default(),
                }),
            };
            write_compaction::<Messages>(&mut request, &split, &rewrite, &settings, Encoding::O200k);
            write_compaction::<Messages>(&mut whole, &split, &rewrite, &settings, Encoding::O200k);
            let out = messages(&whole.body);
            prop_assert!(!out.is_empty());
            prop_assert!(is_user(&out[0]), "first turn is not the user's");
            for pair in out.windows(2) {
                prop_assert_ne!(is_user(&pair[0]), is_user(&pair[1]), "roles do not alternate");
            }
            for (i, message) in out.iter().enumerate() {
                let results = tool_ids(message, "tool_result", "tool_use_id");
                if results.is_empty() {
                    continue;
                }
                prop_assert!(i > 0, "a tool result opens the conversation");
                let calls = tool_ids(&out[i - 1], "tool_use", "id");
                for id in results {
                    prop_assert!(calls.contains(&id), "orphan tool result {}", id);
                }
            }
            let text = serde_json::to_string(&whole.body).unwrap();
            prop_assert_eq!(text.contains("the story so far"), with_summary);
            prop_assert_eq!(text.contains("condenser_recall"), with_recall);
            // The views of the messages left as sent are those of the whole tree's.
            let views = Messages::conversation(&request).to_vec();
            prop_assert_eq!(views, Messages::conversation(&whole).to_vec());
            // The body sent, its unchanged messages copied from the bytes that came, reads
            // as the rewritten tree written out.
            let tree = Value::Object(whole.body.clone());
            prop_assert!(Messages::splice(&request).is_some());
            // Copied as sent: any message that goes as it came, but for an output cut, which
            // goes as its cut was written.
            let cut = |sent: usize| sent >= kept_from && rewrite.cuts.iter().any(|c| c.index == sent);
            let copies = request.origins.of_items.iter().flatten().flatten().any(|&sent| !cut(sent));
            let (body, _, layout) =
                Messages::outgoing_body(request, Bytes::from(sent_body.clone()), true).unwrap();
            prop_assert_eq!(&serde_json::from_slice::<Value>(&body).unwrap(), &tree);
            let written = |field: &str| {
                let (_, range) = layout.as_ref().unwrap().fields.iter().find(|(key, _)| key == field).unwrap();
                &body[range.clone()]
            };
            prop_assert_eq!(written("messages").windows(7).any(|w| w == b"\n      "), copies);
            // The tools as sent, copied with the recall tool written after them; `system` as
            // sent unless the summary went into it.
            let sent_text = std::str::from_utf8(&sent_body).unwrap();
            let sent_tools = &sent_text[sent_text.find("\"tools\": ").unwrap() + 9..];
            let sent_tools = &sent_tools[..sent_tools.find("\n  ]").unwrap() + 4];
            prop_assert!(written("tools").starts_with(sent_tools.trim_end_matches(']').as_bytes()));
            prop_assert_eq!(written("tools").ends_with(b"\n  ]"), !with_recall);
            prop_assert_eq!(written("system") == b"\"rules\"", tree["system"] == "rules");
        }
    }
}
