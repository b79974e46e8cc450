//! The OpenAI Responses API (`POST /v1/responses`): the dialect's stages of the pipeline.
//! The head is `instructions`, never changed, then any leading system and developer input
//! messages; the conversation is `input`, a string or a list of items. Each item is shown to
//! counting, planning and the summarizer as one chat message; a compaction writes the head,
//! a summary message and the kept items back as input items. Requests whose history is held
//! upstream go as sent.

pub mod recall;
pub mod summary;
pub mod usage;
mod view;

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::compaction::plan::{ForwardReason, Split};
use crate::compaction::rewrite::Rewrite;
use crate::compaction::summary_api::SummaryApi;
use crate::config::{ContextConfig, SummaryRole};
use crate::conversation::{units, Item, Views};
use crate::dialect::openai;
use crate::dialect::recall::RecallWire;
use crate::dialect::request::{
    changed_items, object_with_model, planned_body, Origins, RawFields, SentRanges, Splice,
};
use crate::dialect::stages::{Dialect, Prepared, RawStage};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::count_cache::CountCache;
use crate::tokens::counter::{model_name, RawItems, TokenCounter};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::{count_text, count_tools, REPLY_PRIMING};
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;
use view::{chat_view, input_items, item_meta, item_view, Head};

pub const RESPONSES: &str = "/v1/responses";

/// The OpenAI Responses API.
pub struct Responses;

/// A Responses request; its input items are seen as chat messages (`conversation`) when
/// read.
pub struct ResponsesRequest {
    body: Map<String, Value>,
    /// Set when the request must go as it came.
    as_sent: Option<ForwardReason>,
    /// Where its sent items stand in the body and, once rewritten, each item's origin
    /// (`compacted_input`): what its body is spliced from.
    origins: Origins,
}

impl Dialect for Responses {
    const NAME: &'static str = "responses";
    const PATH: &'static str = RESPONSES;
    const SERVED: &'static str = "response";
    const USAGE: &'static dyn UsageReader = &usage::ResponsesUsage;
    const KEY_STYLE: KeyStyle = openai::KEY_STYLE;
    const SUMMARY: &'static dyn SummaryApi = &summary::ResponsesSummary;
    const CONVERSATION_FIELD: &'static str = "input";
    const CACHED_BEFORE: &'static [&'static str] = &["tools", "instructions"];
    const ROUTE: Route = Route::named("responses");
    const RECALL: Option<&'static dyn RecallWire> = Some(&recall::ResponsesRecall);
    const RAW_STAGE: Option<&'static RawStage> = Some(&RAW_STAGE);
    type Request = ResponsesRequest;

    /// A body with `input` or `instructions`.
    fn written_for(body: &Value) -> bool {
        body.get("input").is_some() || body.get("instructions").is_some()
    }

    /// OpenAI's shape, as chat's.
    fn error_response(error: &ProxyError) -> hyper::Response<ProxyBody> {
        openai::error_response(error)
    }

    fn parse(bytes: &[u8], _path: &str) -> Result<Self::Request, ProxyError> {
        parse_request(bytes)
    }

    fn body_mut(request: &mut Self::Request) -> &mut Map<String, Value> {
        &mut request.body
    }

    fn model(request: &Self::Request) -> &str {
        model_name(&request.body)
    }

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send {
        counted(request, catalog, counter)
    }

    fn conversation(request: &Self::Request) -> Views<'_> {
        let items = input_items(&request.body);
        Views::lazy(items.len(), move |index| {
            chat_view(request.origins.item(&items, index).unwrap_or(&Value::Null))
        })
    }

    fn rewrite(
        request: &mut Self::Request,
        split: &Split,
        rewrite: &Rewrite,
        settings: &ContextConfig,
        encoding: Encoding,
    ) {
        // Taken out of the body, so that the kept items are moved, not copied.
        let mut items = match request.body.get_mut("input") {
            Some(Value::Array(items)) => std::mem::take(items),
            _ => input_items(&request.body).into_owned(),
        };
        let seed = (encoding, RAW_STAGE.items.seed);
        let cut = request
            .origins
            .cut_outputs(&mut items, rewrite, seed, output_texts);
        request.origins.parse_into(&mut items, rewrite.items_read());
        let (compacted, mut origins) =
            compacted_input(items, split, rewrite, settings.summary_role);
        changed_items(&mut origins, &cut);
        request.origins.of_items = Some(origins);
        request.body.insert("input".into(), Value::Array(compacted));
    }

    fn forward_as_sent(request: &Self::Request) -> Option<ForwardReason> {
        request.as_sent
    }

    /// Its input items left out of the tree, each parsed when read: a compacted request
    /// reads only the few its rewrite changes (and, to check its tool outputs travel with
    /// their calls, each new item's type and call: `sent_head`), and copies the rest as sent
    /// (`splice`).
    fn parse_planned(
        bytes: &Bytes,
        _path: &str,
        sent: SentRanges,
    ) -> Result<Self::Request, ProxyError> {
        let (body, origins) = planned_body(bytes, sent, checked_body)?;
        let as_sent = {
            let placed = input_items(&body);
            let kept: Vec<Arc<Head>> = (0..placed.len())
                .filter_map(|index| sent_head(bytes, &origins, &placed, index))
                .collect();
            let heads: Vec<Head> = kept.iter().map(|head| head.borrowed()).collect();
            forwarded_as_sent(&body, &heads)
        };
        Ok(ResponsesRequest {
            body,
            as_sent,
            origins,
        })
    }

    fn made_whole(request: &mut Self::Request) {
        request.origins.parse_all_into(&mut request.body, "input");
    }

    fn splice(request: &Self::Request) -> Option<(&Map<String, Value>, Splice<'_>)> {
        Some((&request.body, request.origins.splice("input")?))
    }

    // A Responses stream always ends with its usage: the default `outgoing_body` asks for
    // none.
}

/// Input items' heads, kept by their identity (the raw stage's hash of their bytes as sent):
/// a planned request's pairing check reads every item's head, and reading them from their
/// bytes took 4.5M of a compacted Responses agent request's 15.6M instructions (callgrind,
/// the guard's compacted case replayed on Responses). An agent resends each item whole on
/// every turn, so only the newest are read.
static HEADS: LazyLock<CountCache<Arc<Head<'static>>>> =
    LazyLock::new(|| CountCache::new(HEADS_KEPT));

/// The heads of some fifty agent sessions of 200 rounds (three items a round), about 200 bytes
/// each with their entry: 6.5 MB when full.
const HEADS_KEPT: usize = 32_768;

/// Sent item `index`'s head: kept from a request before when its identity is known, else read
/// from its bytes, or from its tree when they cannot be read as the tree reads them.
fn sent_head(
    bytes: &[u8],
    origins: &Origins,
    placed: &[Value],
    index: usize,
) -> Option<Arc<Head<'static>>> {
    let identity = origins.identity(index);
    if let Some(kept) = identity.and_then(|identity| HEADS.get(identity)) {
        return Some(kept);
    }
    let read = origins
        .ranges
        .get(index)
        .and_then(|range| bytes.get(range.clone()))
        .and_then(Head::read);
    let head = Arc::new(
        read.or_else(|| Some(Head::of(origins.item(placed, index)?)))?
            .into_owned(),
    );
    if let Some(identity) = identity {
        HEADS.insert(identity, head.clone());
    }
    Some(head)
}

/// The fields besides the input items that cost tokens, in the order the raw stage counts
/// them.
const PARTS: [&str; 4] = ["instructions", "tools", "tool_choice", "text"];

/// Responses items and parts, their counts kept apart from other dialects' of the same bytes.
/// The fields counting and planning read, the input items left raw: a request under every
/// trigger is counted from the bytes of items seen before, without a JSON tree. A request
/// whose history is held upstream, an `input` that is a string, anything irregular: the full
/// path (which checks that its tool outputs travel with their calls), with its count and plan.
const RAW_STAGE: RawStage = RawStage {
    fields: RawFields {
        items: "input",
        parts: &PARTS,
        max_tokens: "max_output_tokens",
        extra: None,
        full_path: &["previous_response_id", "conversation"],
    },
    items: RawItems {
        seed: 0x7265_7370_6f6e_7300,
        read: |item| Some(item_view(item)),
    },
    parts_seed: 0x696e_7374_7275_6300,
    part: |encoding, index, part| {
        PARTS
            .get(index)
            .map_or(0, |field| part_tokens(field, &part, encoding))
    },
    summed: None,
    reserve: |max_output_tokens, _| max_output_tokens,
};

/// Checks what condenser cannot read without (an object with a model, `input` a string or a
/// list); everything else is left for upstream to judge. An item of a type or role condenser
/// does not know is carried as an opaque item, counted and kept in order.
pub fn parse_request(bytes: &[u8]) -> Result<ResponsesRequest, ProxyError> {
    let body = checked_body(bytes)?;
    let items = input_items(&body);
    let heads: Vec<Head> = items.iter().map(Head::of).collect();
    let as_sent = forwarded_as_sent(&body, &heads);
    Ok(ResponsesRequest {
        body,
        as_sent,
        origins: Origins::default(),
    })
}

/// The body, checked.
fn checked_body(bytes: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    let body = object_with_model(bytes, "you must provide a model parameter")?;
    match body.get("input") {
        None | Some(Value::Null | Value::String(_)) => Ok(body),
        Some(Value::Array(_)) => Ok(body),
        Some(_) => Err(ProxyError::invalid(
            "input must be a string or an array of input items",
            Some("input"),
        )),
    }
}

/// Why a request whose input items are read as `heads` goes as it came, if it must: its
/// history is held upstream, or a tool output could be parted from its call.
fn forwarded_as_sent(body: &Map<String, Value>, heads: &[Head]) -> Option<ForwardReason> {
    let metas: Vec<Item> = heads.iter().map(Head::meta).collect();
    let stateful = ["previous_response_id", "conversation"]
        .iter()
        .any(|field| body.get(*field).is_some_and(|v| !v.is_null()));
    if stateful {
        Some(ForwardReason::Stateful)
    } else if !pairs_travel_together(heads, &metas) {
        Some(ForwardReason::UnpairedToolMessage)
    } else {
        None
    }
}

/// Whether every tool output's call comes before it, in the same unit, so that no
/// compaction can part them. Otherwise the request goes as sent, for upstream to judge.
fn pairs_travel_together(heads: &[Head], metas: &[Item]) -> bool {
    let Some(starts) = units(metas) else {
        return false;
    };
    let mut unit_start = 0;
    let mut calls_in_unit: HashSet<&str> = HashSet::new();
    for (i, head) in heads.iter().enumerate() {
        if starts.get(unit_start) == Some(&i) {
            unit_start += 1;
            calls_in_unit.clear();
        }
        if head.is_call() {
            if let Some(id) = head.call_id() {
                calls_in_unit.insert(id);
            }
        } else if head.is_output() && !head.call_id().is_some_and(|id| calls_in_unit.contains(id)) {
            return false;
        }
    }
    true
}

/// Besides the input: reply priming, and each of `PARTS` the body has (`part_tokens`).
fn fixed_tokens(body: &Map<String, Value>, encoding: Encoding) -> u32 {
    REPLY_PRIMING
        + PARTS
            .iter()
            .filter_map(|field| Some(part_tokens(field, body.get(*field)?, encoding)))
            .sum::<u32>()
}

/// What one of `PARTS` costs: `instructions`, tools (function tools by the cookbook formula,
/// as chat's, others as their JSON text), `tool_choice` and a structured output's format.
fn part_tokens(field: &str, value: &Value, encoding: Encoding) -> u32 {
    let json_text = |value: &Value| count_text(encoding, &value.to_string());
    match (field, value) {
        (_, Value::Null) => 0,
        ("instructions" | "tool_choice", Value::String(text)) => count_text(encoding, text),
        ("instructions" | "tool_choice", other) => json_text(other),
        ("tools", Value::Array(tools)) => {
            let as_chat: Vec<Value> = tools
                .iter()
                .map(|tool| match tool.get("type").and_then(Value::as_str) {
                    Some("function") => json!({"type": "function", "function": tool}),
                    _ => tool.clone(),
                })
                .collect();
            count_tools(encoding, &as_chat)
        }
        ("text", text) => match text.get("format") {
            Some(format) if format.get("type").and_then(Value::as_str) == Some("json_schema") => {
                json_text(format)
            }
            _ => 0,
        },
        _ => 0,
    }
}

/// A parsed request counted for planning.
pub async fn counted(
    request: &ResponsesRequest,
    catalog: &ModelCatalog,
    counter: &TokenCounter,
) -> Prepared {
    let model = model_name(&request.body);
    let info = catalog.resolve(model);
    let body = &request.body;
    let parts = ["instructions", "tools", "tool_choice", "text"].map(|field| body.get(field));
    let fixed = counter.count_parts(info.encoding, &parts, || fixed_tokens(body, info.encoding));
    // Each item as sent, whether in the tree or left out of it.
    let placed = input_items(body);
    let input: Vec<&Value> = (0..placed.len())
        .filter_map(|index| request.origins.item(&placed, index))
        .collect();
    let messages: Vec<Value> = input.iter().map(|item| chat_view(item)).collect();
    let mut count = counter.count_messages(&messages, fixed, model, &info).await;
    if request.as_sent == Some(ForwardReason::Stateful) {
        // Upstream's usage includes the history it holds, which this count cannot see:
        // nothing to learn the ratio from.
        count.raw_total = 0;
    }
    let metas = input
        .iter()
        .zip(&count.per_message)
        .map(|(item, &tokens)| Item {
            tokens,
            ..item_meta(item)
        })
        .collect();
    Prepared {
        info,
        count,
        metas,
        requested_completion_tokens: request
            .body
            .get("max_output_tokens")
            .and_then(Value::as_u64),
        choices: 1,
        identities: Vec::new(),
    }
}

/// The input a compaction leaves: the head, the pinned task, the summary as one message of
/// role `developer` (`user` when so configured), then the kept items, their string tool
/// outputs cut already (`Origins::cut_outputs`). The items are moved into it, not copied.
fn compacted_input(
    mut items: Vec<Value>,
    split: &Split,
    rewrite: &Rewrite,
    summary_role: SummaryRole,
) -> (Vec<Value>, Vec<Option<usize>>) {
    let kept = items.split_off(rewrite.kept_from.min(items.len()));
    let pinned = rewrite.pinned.clone().unwrap_or_default();
    let mut out = Vec::with_capacity(split.head + 2 + kept.len());
    let mut origins = Vec::with_capacity(out.capacity());
    out.extend_from_slice(&items[..split.head]);
    origins.extend((0..split.head).map(Some));
    out.extend_from_slice(&items[pinned.clone()]);
    origins.extend(pinned.map(Some));
    if let Some(summary) = rewrite.summary_text(split.head, "items") {
        let role = match summary_role {
            SummaryRole::System => "developer",
            SummaryRole::User => "user",
        };
        out.push(json!({
            "type": "message",
            "role": role,
            "content": summary,
        }));
        origins.push(None);
    }
    origins.extend((rewrite.kept_from..).take(kept.len()).map(Some));
    out.extend(kept);
    (out, origins)
}

/// A tool output's text, when a string: what a planned cut shortens.
fn output_texts(item: &mut Value) -> Vec<&mut String> {
    match item.get_mut("output") {
        Some(Value::String(output)) => vec![output],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Kind, Role};
    use crate::dialect::request::read_fields;

    fn kinds(body: &str) -> Vec<(Role, Kind)> {
        let request = parse_request(body.as_bytes()).unwrap();
        input_items(&request.body)
            .iter()
            .map(|item| (item_meta(item).role, item_meta(item).kind))
            .collect()
    }

    /// A planned request's pairing check reads each item's head from its bytes: it reads as
    /// the tree does, and what it cannot read is left to the tree.
    #[test]
    fn an_items_head_reads_from_its_bytes_as_from_its_tree() {
        let items = [
            json!({"role": "developer", "content": "rules"}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}),
            json!({"type": "message", "role": "critic", "content": "x"}),
            json!({"type": "message", "role": null, "content": "x"}),
            json!({"type": "message", "content": "x"}),
            json!({"type": 7, "role": "user", "content": "x"}),
            json!({"role": 7, "content": "x"}),
            json!({"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}),
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call", "call_id": null, "name": "f"}),
            json!({"type": "function_call", "name": "f"}),
            json!({"type": "function_call_output", "call_id": 7, "output": "ok"}),
            json!({"type": "custom_tool_call_output", "call_id": "c2", "output": "y"}),
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
            json!({}),
        ];
        for item in &items {
            let bytes = serde_json::to_vec(item).unwrap();
            let (read, of) = (Head::read(&bytes).unwrap(), Head::of(item));
            assert_eq!(read.meta(), of.meta(), "{item}");
            assert_eq!(read.is_call(), of.is_call(), "{item}");
            assert_eq!(read.is_output(), of.is_output(), "{item}");
            assert_eq!(read.call_id(), of.call_id(), "{item}");
        }
        let escaped = br#"{"type": "function_call_output", "call_id": "c\u0031", "output": "x"}"#;
        assert_eq!(Head::read(escaped).unwrap().call_id(), Some("c1"));
        assert!(Head::read(br#""a string item""#).is_none());
        assert!(Head::read(br#"{"type": "message", "type": "reasoning"}"#).is_none());
    }

    #[test]
    fn every_item_type_has_its_role_and_kind() {
        let body = r#"{"model":"m","input":[
            {"role":"developer","content":"rules"},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
            {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"},
            {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"ok"},
            {"type":"custom_tool_call","call_id":"c2","name":"g","input":"x"},
            {"type":"custom_tool_call_output","call_id":"c2","output":"y"},
            {"type":"web_search_call","id":"ws_1","status":"completed"}
        ]}"#;
        assert_eq!(
            kinds(body),
            [
                (Role::Developer, Kind::Message),
                (Role::User, Kind::Message),
                (Role::Assistant, Kind::Reasoning),
                (Role::Assistant, Kind::ToolCall),
                (Role::Tool, Kind::ToolResult),
                (Role::Assistant, Kind::ToolCall),
                (Role::Tool, Kind::ToolResult),
                (Role::Other, Kind::Other),
            ]
        );
        assert_eq!(
            kinds(r#"{"model":"m","input":"hello"}"#),
            [(Role::User, Kind::Message)]
        );
    }

    /// Why `body`, parsed as its raw stage plans it (its items known by `identities`, when
    /// given), goes as it came, if it must.
    fn planned_verdict(body: &Bytes, identities: &[u128]) -> Option<ForwardReason> {
        let raw = read_fields(body, &RAW_STAGE.fields).unwrap();
        let ranges = SentRanges {
            identities: identities.to_vec(),
            ..SentRanges::of(body, (&raw.items, &raw.parts), &RAW_STAGE.fields)
        };
        Responses::parse_planned(body, RESPONSES, ranges)
            .unwrap()
            .as_sent
    }

    #[test]
    fn outputs_apart_from_their_calls_send_the_request_as_it_came() {
        // Parsed whole, and as its raw stage planned it (each item's head read from its
        // bytes): the same verdict.
        let as_sent = |input: &str| {
            let body = Bytes::from(format!(r#"{{"model":"m","input":{input}}}"#));
            let whole = parse_request(&body).unwrap().as_sent;
            assert_eq!(planned_verdict(&body, &[]), whole, "{input}");
            whole
        };
        let call = |id: &str| {
            format!(r#"{{"type":"function_call","call_id":"{id}","name":"f","arguments":"{{}}"}}"#)
        };
        let output = |id: &str| {
            format!(r#"{{"type":"function_call_output","call_id":"{id}","output":"ok"}}"#)
        };
        let user = r#"{"role":"user","content":"go"}"#;
        let paired = format!(
            "[{user},{},{},{},{}]",
            call("a"),
            call("b"),
            output("b"),
            output("a")
        );
        assert_eq!(as_sent(&paired), None);
        let orphan = format!("[{user},{},{}]", call("a"), output("z"));
        assert_eq!(as_sent(&orphan), Some(ForwardReason::UnpairedToolMessage));
        // b's output sits in the unit that starts at c, apart from its call.
        let split_pair = format!(
            "[{user},{},{},{},{},{}]",
            call("a"),
            call("b"),
            output("a"),
            call("c"),
            output("b")
        );
        assert_eq!(
            as_sent(&split_pair),
            Some(ForwardReason::UnpairedToolMessage)
        );
        let stateful = r#"{"model":"m","previous_response_id":"resp_1","input":"more"}"#;
        assert_eq!(
            parse_request(stateful.as_bytes()).unwrap().as_sent,
            Some(ForwardReason::Stateful)
        );
    }

    /// A planned request's items known by identity take the heads kept for it: read once, an
    /// agent's items are not read again on its next turn. Shown with identities that name
    /// another request's items, whose kept heads decide the verdict.
    #[test]
    fn heads_are_kept_by_identity() {
        let planned = |input: &str, identities: &[u128]| {
            let body = Bytes::from(format!(r#"{{"model":"m","input":{input}}}"#));
            planned_verdict(&body, identities)
        };
        let user = r#"{"role":"user","content":"go"}"#;
        let call = r#"{"type":"function_call","call_id":"a","name":"f","arguments":"{}"}"#;
        let paired = format!(r#"[{user},{call},{{"type":"function_call_output","call_id":"a"}}]"#);
        let orphan = format!(r#"[{user},{call},{{"type":"function_call_output","call_id":"z"}}]"#);
        // Identities no counter makes in a test: its keys are random per process.
        let seen = [0x5eed_0001 << 64, 0x5eed_0002 << 64, 0x5eed_0003 << 64];
        assert_eq!(planned(&paired, &seen), None);
        assert_eq!(planned(&orphan, &seen), None, "the heads kept for `seen`");
        let fresh = seen.map(|identity| identity | 1);
        assert_eq!(
            planned(&orphan, &fresh),
            Some(ForwardReason::UnpairedToolMessage)
        );
        assert_eq!(
            planned(&orphan, &[]),
            Some(ForwardReason::UnpairedToolMessage),
            "read from the bytes when no identity is known"
        );
    }

    #[tokio::test]
    async fn instructions_and_tools_are_counted_as_fixed_tokens() {
        let catalog = ModelCatalog::new(Default::default(), Default::default());
        let counter = TokenCounter::new(0.0);
        let fixed = |body: Value| {
            let request = parse_request(body.to_string().as_bytes()).unwrap();
            let (catalog, counter) = (&catalog, &counter);
            async move { counted(&request, catalog, counter).await.count.fixed }
        };
        let bare = fixed(json!({"model": "gpt-4o", "input": "hi"})).await;
        assert_eq!(bare, REPLY_PRIMING);
        let instructions = "Answer in French, briefly.";
        let with_instructions =
            fixed(json!({"model": "gpt-4o", "instructions": instructions, "input": "hi"})).await;
        assert_eq!(
            with_instructions,
            bare + count_text(Encoding::O200k, instructions)
        );
        let tool = json!({"type": "function", "name": "search", "description": "Search.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}});
        let with_tool = fixed(json!({"model": "gpt-4o", "tools": [tool], "input": "hi"})).await;
        let as_chat = json!({"type": "function", "function": tool});
        assert_eq!(with_tool, bare + count_tools(Encoding::O200k, &[as_chat]));
    }

    #[test]
    fn the_summary_goes_after_the_head_in_the_configured_role() {
        let items: Vec<Value> = serde_json::from_str(
            r#"[
            {"role":"developer","content":"rules"},
            {"role":"user","content":"old"},
            {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c","output":"a long output"},
            {"role":"user","content":"new"}
        ]"#,
        )
        .unwrap();
        let split = Split {
            head: 1,
            tail_start: 2,
            task: Some(4..5),
            ahead: 2,
            summary_ends: vec![2],
            shorten: Vec::new(),
            recent_start: 4,
            estimated_tokens: 0,
        };
        let rewrite = Rewrite {
            summary: Some(std::sync::Arc::new(crate::compaction::summary::Summary {
                text: "the story so far".into(),
                messages: 1,
                tokens: 4,
                model: "m".into(),
                created_at: 0,
                stand_in: false,
            })),
            kept_from: 2,
            pinned: None,
            cuts: vec![crate::compaction::shorten::Shorten {
                index: 3,
                tokens: 1000,
                keep_tokens: 500,
            }],
            action: crate::compaction::rewrite::Action::Summarized,
            cache: crate::compaction::rewrite::CacheOutcome::Miss,
            summarized: 1,
            waited: std::time::Duration::ZERO,
            archive: None,
        };
        for (role, expected) in [
            (SummaryRole::System, "developer"),
            (SummaryRole::User, "user"),
        ] {
            let mut cut = items.clone();
            let seed = (Encoding::O200k, RAW_STAGE.items.seed);
            let at = Origins::default().cut_outputs(&mut cut, &rewrite, seed, output_texts);
            assert_eq!(at, [3]);
            let (out, _) = compacted_input(cut, &split, &rewrite, role);
            assert_eq!(out.len(), 5);
            assert_eq!(out[0], items[0]);
            assert_eq!(out[1]["role"], expected);
            assert_eq!(
                out[1]["content"],
                "[Context summary: 1 earlier items]\n\nthe story so far"
            );
            assert_eq!(out[2], items[2]);
            assert_ne!(out[3]["output"], items[3]["output"], "shortened as planned");
            assert_eq!(out[3]["call_id"], "c");
            assert_eq!(out[4], items[4]);
        }
    }

    #[test]
    fn a_spliced_agent_request_reads_as_its_rewritten_tree() {
        let output = "line of a long tool output ".repeat(300);
        let round = |id: &str| {
            [
                json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [],
                    "encrypted_content": "x"}),
                json!({"type": "function_call", "call_id": id, "name": "shell",
                    "arguments": "{\"cmd\":\"ls\"}"}),
                json!({"type": "function_call_output", "call_id": id, "output": output}),
            ]
        };
        let mut input = vec![json!({"role": "user", "content": "fix the bug"})];
        for id in ["a", "b", "c"] {
            input.extend(round(id));
        }
        input.push(json!({"role": "user", "content": [{"type": "input_text", "text": "go on"}]}));
        let body = json!({"model": "gpt-5", "instructions": "rules", "input": input,
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
            "store": false, "stream": true});
        let (spliced, tree, copied) =
            crate::dialect::splice_cases::spliced_and_tree::<Responses>(&body, 4, 6);
        assert_eq!(spliced, tree);
        assert!(copied);
        let items = spliced["input"].as_array().unwrap();
        assert!(items[0].to_string().contains("the story so far"));
        assert!(items[3]["output"].to_string().contains("tokens removed"));
        assert_eq!(items[6], body["input"][9]);
        assert_eq!(spliced["tools"][1]["name"], "condenser_recall");
    }

    #[test]
    fn bad_shapes_are_named() {
        let message = |body: &str| match parse_request(body.as_bytes()) {
            Err(error) => error.to_string(),
            Ok(_) => String::new(),
        };
        assert_eq!(message("[]"), "request body must be a JSON object");
        assert_eq!(
            message(r#"{"input":"x"}"#),
            "you must provide a model parameter"
        );
        assert_eq!(
            message(r#"{"model":"m","input":42}"#),
            "input must be a string or an array of input items"
        );
        // Item types and roles condenser does not know are the upstream's to judge.
        for input in [
            r#"["x"]"#,
            r#"[{"role":"tool","content":"x"}]"#,
            r#"[{"type":"compaction","encrypted_content":"e"},{"type":"web_search_call","id":"w","status":"completed"}]"#,
        ] {
            assert_eq!(message(&format!(r#"{{"model":"m","input":{input}}}"#)), "");
        }
    }
}
