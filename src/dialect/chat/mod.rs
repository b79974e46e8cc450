//! OpenAI Chat Completions (`POST /v1/chat/completions`): the dialect's stages of the
//! pipeline. Its first stage reads a request under every trigger from its raw bytes, without
//! a JSON tree; anything else is parsed, and compacted messages are written out as chat
//! messages.

pub mod message_spans;
pub mod recall;
pub mod summary;
pub mod usage;

use std::borrow::Cow;
use std::future::Future;

use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::compaction::limits::Limits;
use crate::compaction::plan::{Decision, Mode, Split};
use crate::compaction::rewrite::Rewrite;
use crate::compaction::shorten::cut_item_texts;
use crate::compaction::summary_api::SummaryApi;
use crate::config::ContextConfig;
use crate::conversation::{content_text, Item, Views};
use crate::dialect::openai;
use crate::dialect::recall::RecallWire;
use crate::dialect::request::{
    array, object_start, object_with_model, present, Layout, SentRanges,
};
use crate::dialect::stages::{Counting, Dialect, Planned, Prepared, Ready, Settings};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::{message_meta, messages, model_name, RawPrompt, TokenCounter};
use crate::tokens::encoding::Encoding;
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;

pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";

/// OpenAI Chat Completions.
pub struct Chat;

impl Dialect for Chat {
    const NAME: &'static str = "chat";
    const PATH: &'static str = CHAT_COMPLETIONS;
    const SERVED: &'static str = "chat completion";
    const USAGE: &'static dyn UsageReader = &usage::ChatUsage;
    const KEY_STYLE: KeyStyle = openai::KEY_STYLE;
    const SUMMARY: &'static dyn SummaryApi = &summary::ChatSummary;
    const CONVERSATION_FIELD: &'static str = "messages";
    const CACHED_BEFORE: &'static [&'static str] = &["tools"];
    const ROUTE: Route = Route::named("chat_completions");
    const RECALL: Option<&'static dyn RecallWire> = Some(&recall::ChatRecall);
    type Request = Map<String, Value>;

    fn scan(
        counting: Counting<'_>,
        bytes: &Bytes,
        settings: Settings<'_>,
        mode: Mode,
    ) -> impl Future<Output = Result<Ready, Option<Planned>>> + Send {
        scan(counting, bytes, settings, mode)
    }

    fn error_response(error: &ProxyError) -> Response<ProxyBody> {
        openai::error_response(error)
    }

    fn parse(bytes: &[u8], _path: &str) -> Result<Self::Request, ProxyError> {
        parse_request(bytes)
    }

    fn body_mut(request: &mut Self::Request) -> &mut Map<String, Value> {
        request
    }

    fn model(request: &Self::Request) -> &str {
        model_name(request)
    }

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send {
        counted(request, catalog, counter)
    }

    fn conversation(request: &Self::Request) -> Views<'_> {
        Views::made(messages(request))
    }

    fn rewrite(
        request: &mut Self::Request,
        split: &Split,
        rewrite: &Rewrite,
        settings: &ContextConfig,
        encoding: Encoding,
    ) {
        let compacted = compacted_messages(
            messages(request),
            split,
            rewrite,
            settings.summary_role.as_str(),
            encoding,
        );
        request.insert("messages".into(), Value::Array(compacted));
    }

    fn outgoing_body(
        mut request: Self::Request,
        original: Bytes,
        rewritten: bool,
    ) -> Result<(Bytes, bool, Option<Layout>), ProxyError> {
        let usage = UsageRequest::new(
            request.get("stream").and_then(Value::as_bool) == Some(true),
            request.get("stream_options").map(asks_for_usage),
        );
        let body = if rewritten || usage == UsageRequest::Merge {
            if usage == UsageRequest::Merge {
                request_usage_in_stream(&mut request);
            }
            Bytes::from(serde_json::to_vec(&request).map_err(ProxyError::Rewrite)?)
        } else {
            original
        };
        let body = match usage {
            UsageRequest::Splice => {
                // `parse_request` found an object, so the body has an opening brace.
                let open = object_start(&body).unwrap_or(0);
                with_usage_requested(&body, open)
            }
            UsageRequest::None | UsageRequest::Merge => body,
        };
        Ok((body, usage != UsageRequest::None, None))
    }
}

/// Checks what condenser cannot read without; everything else is left for upstream to judge.
pub fn parse_request(bytes: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    let body = object_with_model(bytes, "you must provide a model parameter")?;
    let messages = array(&body, "messages", "missing required parameter: messages")?;
    if messages.is_empty() {
        return Err(ProxyError::invalid(
            "messages must contain at least one message",
            Some("messages"),
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        let Some(message) = message.as_object() else {
            return Err(ProxyError::invalid(
                format!("messages[{i}] must be an object"),
                Some("messages"),
            ));
        };
        // A role condenser does not know is the upstream's to judge: such a message is
        // carried as an opaque item, counted and kept in order.
        if message.get("role").is_some_and(|role| !role.is_string()) {
            return Err(ProxyError::invalid(
                format!("messages[{i}].role must be a string"),
                Some("messages"),
            ));
        }
    }
    Ok(body)
}

fn message_metas(messages: &[Value], counts: &[u32]) -> Vec<Item> {
    messages
        .iter()
        .zip(counts)
        .map(|(message, &tokens)| message_meta(message, tokens))
        .collect()
}

fn requested_completion_tokens(body: &Map<String, Value>) -> Option<u64> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
}

/// A parsed request counted for planning; shared by the proxy and `condenser plan`.
pub async fn counted(
    body: &Map<String, Value>,
    catalog: &ModelCatalog,
    counter: &TokenCounter,
) -> Prepared {
    let info = catalog.resolve(model_name(body));
    let count = counter.count_request(body, &info).await;
    let metas = message_metas(messages(body), &count.per_message);
    Prepared {
        info,
        count,
        metas,
        requested_completion_tokens: requested_completion_tokens(body),
        choices: body.get("n").and_then(Value::as_u64).unwrap_or(1),
        identities: Vec::new(),
    }
}

/// Counted from raw JSON; None when the request must take the full path.
async fn prepared_raw(
    request: &Scanned<'_>,
    messages: &[&[u8]],
    catalog: &ModelCatalog,
    counter: &TokenCounter,
) -> Option<Prepared> {
    if messages.is_empty() {
        return None;
    }
    let info = catalog.resolve(&request.model);
    let prompt = RawPrompt {
        messages,
        tools: request.tools,
        tool_choice: request.tool_choice,
        response_format: request.response_format,
    };
    let raw = counter.count_raw(&prompt, &request.model, &info).await?;
    Some(Prepared {
        info,
        count: raw.count,
        metas: raw.metas,
        requested_completion_tokens: request.max_completion_tokens.or(request.max_tokens),
        choices: request.n.unwrap_or(1),
        identities: raw.identities,
    })
}

/// The fields of a chat request that counting and planning read, deserialized without
/// building a JSON tree. Anything irregular (a missing or mistyped field, a duplicate key)
/// fails this and sends the request down the full path, which names the problem.
#[derive(Deserialize)]
struct Scanned<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    /// Emptied by `message_spans::split`, which found the messages; declared so that a
    /// second `messages` key is refused rather than ignored.
    #[serde(rename = "messages")]
    _messages: serde::de::IgnoredAny,
    n: Option<u64>,
    stream: Option<bool>,
    /// Present even when null, which the raw path leaves to the full one.
    #[serde(borrow, default, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    max_completion_tokens: Option<u64>,
    max_tokens: Option<u64>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    response_format: Option<&'a RawValue>,
}

/// `stream_options.include_usage` asked for upstream on behalf of a client that did not:
/// spliced in as the first key, the rest of the body kept byte for byte.
const INCLUDE_USAGE_FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// Whether condenser asks upstream for a stream's usage on the client's behalf, and how.
/// Decided the same way on both paths; only a merge needs the parsed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UsageRequest {
    /// Not a stream, or a stream that asks for usage itself: the body stands.
    None,
    /// A stream without `stream_options`: the field is spliced in.
    Splice,
    /// A stream whose `stream_options` leave usage out: usage is merged into them.
    Merge,
}

impl UsageRequest {
    /// `options`: None when the client sent no `stream_options`, else whether they ask for
    /// usage.
    fn new(stream: bool, options: Option<bool>) -> UsageRequest {
        match (stream, options) {
            (false, _) | (true, Some(true)) => UsageRequest::None,
            (true, None) => UsageRequest::Splice,
            (true, Some(false)) => UsageRequest::Merge,
        }
    }
}

/// `open`: where the body's opening brace is.
fn with_usage_requested(body: &[u8], open: usize) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + INCLUDE_USAGE_FIELD.len());
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(INCLUDE_USAGE_FIELD);
    out.extend_from_slice(&body[open + 1..]);
    Bytes::from(out)
}

/// The common case, a request under every trigger, handled from its raw JSON without
/// building a tree. Otherwise the full path finishes the request: with the count when the
/// raw path made one (for compaction, a rejection, a rewrite of stream options), without
/// when the request was not read (the full path then validates it and names any problem).
async fn scan(
    counting: Counting<'_>,
    bytes: &Bytes,
    settings: Settings<'_>,
    mode: Mode,
) -> Result<Ready, Option<Planned>> {
    // The derived reader would also take a JSON array for the struct, and skips the fields
    // it does not read without checking their text; the full path rejects both.
    let Some(open) = object_start(bytes) else {
        return Err(None);
    };
    // The messages are checked as they are counted (`TokenCounter::count_raw`), the rest
    // of the body here.
    let Some(split) = message_spans::split(bytes) else {
        return Err(None);
    };
    let Ok(rest) = std::str::from_utf8(&split.rest) else {
        return Err(None);
    };
    let Ok(request) = serde_json::from_str::<Scanned>(rest) else {
        return Err(None);
    };
    let Some(prepared) = prepared_raw(
        &request,
        &split.messages,
        counting.catalog,
        counting.counter,
    )
    .await
    else {
        return Err(None);
    };
    let input = prepared.plan_input(counting.config, settings, mode);
    let decision = prepared.decide(&input);
    if !matches!(decision, Decision::Forward(_)) {
        return Err(Some(Planned {
            prepared,
            decision,
            sent: SentRanges::default(),
        }));
    }
    let asks_usage = |options: &RawValue| {
        serde_json::from_str::<Value>(options.get())
            .ok()
            .is_some_and(|options| asks_for_usage(&options))
    };
    let usage = UsageRequest::new(
        request.stream == Some(true),
        request.stream_options.map(asks_usage),
    );
    let body = match usage {
        UsageRequest::None => bytes.clone(),
        UsageRequest::Splice => with_usage_requested(bytes, open),
        UsageRequest::Merge => {
            return Err(Some(Planned {
                prepared,
                decision,
                sent: SentRanges::default(),
            }))
        }
    };
    Ok(Ready {
        model: request.model.into_owned(),
        limits: Limits::new(&input),
        prepared,
        body,
        inject_usage: usage != UsageRequest::None,
    })
}

/// The chat messages a compaction leaves: the head, the pinned task, the summary as one
/// message of `summary_role`, then the kept messages, tool outputs cut as planned.
fn compacted_messages(
    messages: &[Value],
    split: &Split,
    rewrite: &Rewrite,
    summary_role: &str,
    encoding: Encoding,
) -> Vec<Value> {
    let kept = &messages[rewrite.kept_from..];
    let mut out = Vec::with_capacity(split.head + 2 + kept.len());
    out.extend_from_slice(&messages[..split.head]);
    out.extend_from_slice(&messages[rewrite.pinned.clone().unwrap_or_default()]);
    if let Some(summary) = rewrite.summary_text(split.head, "messages") {
        out.push(json!({"role": summary_role, "content": summary}));
    }
    out.extend(kept.iter().enumerate().map(|(offset, message)| {
        let index = rewrite.kept_from + offset;
        let mut message = message.clone();
        if let Some(cut) = rewrite.cuts.iter().find(|cut| cut.index == index) {
            let mut text = content_text(&message);
            let reference = rewrite.cleared_reference(index);
            cut_item_texts(encoding, vec![&mut text], cut, reference.as_deref());
            message["content"] = Value::String(text);
        }
        message
    }));
    out
}

fn asks_for_usage(stream_options: &Value) -> bool {
    stream_options.get("include_usage").and_then(Value::as_bool) == Some(true)
}

/// `stream_options.include_usage = true`, keeping any other stream options.
fn request_usage_in_stream(body: &mut Map<String, Value>) {
    let options = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Some(options) = options.as_object_mut() {
        options.insert("include_usage".into(), Value::Bool(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_asked_for_only_in_streams_that_leave_it_out() {
        assert_eq!(UsageRequest::new(false, None), UsageRequest::None);
        assert_eq!(UsageRequest::new(false, Some(false)), UsageRequest::None);
        assert_eq!(UsageRequest::new(true, Some(true)), UsageRequest::None);
        assert_eq!(UsageRequest::new(true, None), UsageRequest::Splice);
        assert_eq!(UsageRequest::new(true, Some(false)), UsageRequest::Merge);
        let body = br#" {"model":"m","stream":true}"#;
        let spliced = with_usage_requested(body, 1);
        let parsed: Value = serde_json::from_slice(&spliced).unwrap();
        assert_eq!(parsed["stream_options"]["include_usage"], true);
        assert_eq!(&spliced[spliced.len() - 26..], &body[body.len() - 26..]);
    }
}
