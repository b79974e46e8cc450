//! Google's Gemini API (`POST /v1beta/models/{model}:generateContent`, and
//! `:streamGenerateContent`; the same under `/v1/`): the dialect's stages of the pipeline.
//! The model is named by the path, and so is streaming. The head is `systemInstruction`,
//! never changed (save for the summary when `summary_role = "system"`); each turn of
//! `contents` is one conversation item, seen by counting and the summarizer as a chat
//! message; a `model` turn's `functionCall` parts and the next turn's `functionResponse`
//! parts are one unit. Parts are carried as sent, `thoughtSignature`s with them. A compacted
//! `contents` starts with a user turn. The key comes in `x-goog-api-key`, or in `?key=`.

mod error;
pub mod recall;
mod rewrite;
pub mod summary;
pub mod usage;
mod view;

use std::borrow::Cow;
use std::future::Future;

use hyper::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::compaction::plan::Split;
use crate::compaction::rewrite::Rewrite;
use crate::compaction::summary_api::SummaryApi;
use crate::config::ContextConfig;
use crate::conversation::Views;
use crate::dialect::recall::RecallWire;
use crate::dialect::request::rewrite_conversation;
use crate::dialect::stages::{Dialect, Prepared};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::TokenCounter;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::{count_text, count_tools, REPLY_PRIMING};
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;
use error::error_response;
use rewrite::compacted_contents;
use view::{as_chat, chat_message, check_contents, contents, item};

/// The API versions whose paths it serves: all of `/v1beta/`, and under `/v1/` (OpenAI's
/// otherwise) a model's own methods.
const VERSIONS: [&str; 2] = ["/v1beta/", "/v1/"];
/// The methods of a model it compacts.
const GENERATE: [&str; 2] = ["generateContent", "streamGenerateContent"];
/// Every method Google's API has on a model: what makes `/v1/models/{model}:{method}` its,
/// not an OpenAI model id with a colon in it (`ft:gpt-4o-mini:org::id`).
const MODEL_METHODS: [&str; 16] = [
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "embedContent",
    "batchEmbedContents",
    "batchGenerateContent",
    "asyncBatchEmbedContent",
    "predict",
    "predictLongRunning",
    "generateAnswer",
    "generateMessage",
    "generateText",
    "countMessageTokens",
    "countTextTokens",
    "embedText",
    "batchEmbedText",
];

/// Google's Gemini API.
pub struct Gemini;

/// A Gemini request, its model from the path; its turns are seen as chat messages
/// (`conversation`) when read.
pub struct GeminiRequest {
    model: String,
    body: Map<String, Value>,
    config: GenerationConfig,
}

/// What condenser reads of `generationConfig`; the rest of it goes unread, as sent.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    /// The reply's reserve, Gemini's thinking included.
    max_output_tokens: Option<u64>,
    /// How many replies are asked for; one unless said.
    candidate_count: Option<u64>,
}

/// A path's model and method: `models/{model}:{method}` after an API version. The template
/// `Dialect::PATH` names none.
fn model_method(path: &str) -> Option<(&str, &str)> {
    let (rest, any_method) = match path.strip_prefix(VERSIONS[0]) {
        Some(rest) => (rest, true),
        None => (path.strip_prefix(VERSIONS[1])?, false),
    };
    rest.strip_prefix("models/")?
        .split_once(':')
        .filter(|(model, method)| {
            !model.is_empty()
                && !model.contains('/')
                && !model.starts_with('{')
                && (any_method || MODEL_METHODS.contains(method))
        })
}

impl Dialect for Gemini {
    const NAME: &'static str = "gemini";
    const PATH: &'static str = "/v1beta/models/{model}:generateContent";
    const SERVED: &'static str = "generate_content";
    const USAGE: &'static dyn UsageReader = &usage::GeminiUsage;
    const KEY_STYLE: KeyStyle = KeyStyle {
        header: "x-goog-api-key",
        also_in: &[],
        query: Some("key"),
    };
    const SUMMARY: &'static dyn SummaryApi = &summary::GeminiSummary;
    const CONVERSATION_FIELD: &'static str = "contents";
    const CACHED_BEFORE: &'static [&'static str] = &["tools", "toolConfig", "systemInstruction"];
    const ROUTE: Route = Route::named("gemini");
    const RECALL: Option<&'static dyn RecallWire> = Some(&recall::GeminiRecall);
    type Request = GeminiRequest;

    fn compacts(path: &str) -> bool {
        model_method(path).is_some_and(|(_, method)| GENERATE.contains(&method))
    }

    /// Everything under `/v1beta/`, and a model's methods under `/v1/` (the rest of `/v1/` is
    /// OpenAI's).
    fn serves(path: &str) -> bool {
        path.starts_with(VERSIONS[0]) || model_method(path).is_some()
    }

    fn model_in_path(path: &str) -> Option<&str> {
        model_method(path).map(|(model, _)| model)
    }

    /// `alt` named more than once: condenser would act on one value (offering recall for
    /// `alt=sse`) while an upstream that reads another (the last) answers a JSON array, which
    /// recall's stream reader does not read (issue 55).
    fn refused_query(query: Option<&str>) -> Option<String> {
        let alts = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .filter(|(name, _)| name == "alt")
            .count();
        (alts > 1)
            .then(|| format!("the query names `alt` {alts} times; name the response format once"))
    }

    /// Not `:streamGenerateContent` without `alt=sse`: Google's REST default streams one JSON
    /// array, relayed as it arrives, which recall's stream reader does not read; offered the
    /// tool there, the client would see its call.
    fn recall_reads_reply(path: &str, query: Option<&str>) -> bool {
        let array_stream = model_method(path).is_some_and(|(_, method)| method == GENERATE[1])
            && !url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .any(|(name, value)| name == "alt" && value == "sse");
        !array_stream
    }

    fn path_for(model: &str) -> Cow<'static, str> {
        Cow::Owned(format!("/v1beta/models/{model}:generateContent"))
    }

    /// A body with `contents`.
    fn written_for(body: &Value) -> bool {
        body.get("contents").is_some()
    }

    fn error_response(error: &ProxyError) -> Response<ProxyBody> {
        error_response(error)
    }

    /// The model is the path's; a body read without one (`condenser count`) may name it as
    /// Google's `GenerateContentRequest` does, `models/{model}`.
    fn parse(bytes: &[u8], path: &str) -> Result<Self::Request, ProxyError> {
        let (body, config) = parse_request(bytes)?;
        let model = match model_method(path) {
            Some((model, _)) => model,
            None => body
                .get("model")
                .and_then(Value::as_str)
                .map_or("", |model| model.trim_start_matches("models/")),
        };
        Ok(GeminiRequest {
            model: model.to_string(),
            body,
            config,
        })
    }

    fn body_mut(request: &mut Self::Request) -> &mut Map<String, Value> {
        &mut request.body
    }

    fn model(request: &Self::Request) -> &str {
        &request.model
    }

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send {
        counted(request, catalog, counter)
    }

    fn conversation(request: &Self::Request) -> Views<'_> {
        let turns = contents(&request.body);
        Views::lazy(turns.len(), |index| chat_message(&turns[index]))
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
        rewrite_conversation(&mut request.body, "contents", |body, sent| {
            compacted_contents(body, sent, rewrite, summary, summary_role, encoding)
        });
    }

    // Gemini's replies always carry `usageMetadata`: the default `outgoing_body` asks for none.
}

/// Checks what condenser cannot read without (see `check_contents`), and the types of what it
/// reads of `generationConfig`, `toolConfig` and `systemInstruction`; everything else is left
/// for upstream to judge.
fn parse_request(bytes: &[u8]) -> Result<(Map<String, Value>, GenerationConfig), ProxyError> {
    let value: Value = serde_json::from_slice(bytes).map_err(ProxyError::InvalidJson)?;
    let Value::Object(body) = value else {
        return Err(ProxyError::invalid(
            "Invalid JSON payload received: the request must be a JSON object",
            None,
        ));
    };
    let Some(turns) = body.get("contents") else {
        return Err(ProxyError::invalid(
            "* GenerateContentRequest.contents: contents is not specified",
            Some("contents"),
        ));
    };
    check_contents(turns)?;
    let config = match body.get("generationConfig") {
        Some(config) => GenerationConfig::deserialize(config).map_err(|e| {
            ProxyError::invalid(format!("Invalid value at 'generationConfig': {e}"), None)
        })?,
        None => GenerationConfig::default(),
    };
    if body
        .get("toolConfig")
        .is_some_and(|value| !value.is_object())
    {
        return Err(ProxyError::invalid(
            "Invalid value at 'toolConfig': must be an object",
            None,
        ));
    }
    if body
        .get("systemInstruction")
        .is_some_and(|value| !(value.is_object() || value.is_string()))
    {
        return Err(ProxyError::invalid(
            "Invalid value at 'systemInstruction': must be a Content object",
            None,
        ));
    }
    Ok((body, config))
}

/// What a request costs besides its turns: reply priming, `systemInstruction`, tools and
/// `toolConfig`.
fn fixed_tokens(
    encoding: Encoding,
    instruction: Option<&Value>,
    tools: Option<&Value>,
    tool_config: Option<&Value>,
) -> u32 {
    let instruction = match instruction {
        Some(Value::String(text)) => count_text(encoding, text),
        Some(instruction) => view::parts(instruction)
            .iter()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) => count_text(encoding, text),
                None => count_text(encoding, &part.to_string()),
            })
            .sum(),
        None => 0,
    };
    REPLY_PRIMING
        + instruction
        + tools_tokens(encoding, tools)
        + tool_config.map_or(0, |config| count_text(encoding, &config.to_string()))
}

/// Function declarations in the shape `count_tools` reads; other tools (`googleSearch`,
/// `codeExecution`, …) and the rest of a tool are counted as their JSON.
fn tools_tokens(encoding: Encoding, tools: Option<&Value>) -> u32 {
    let Some(Value::Array(tools)) = tools else {
        return 0;
    };
    let mut functions = Vec::new();
    let mut others = 0;
    for tool in tools {
        let Value::Object(tool) = tool else {
            others += count_text(encoding, &tool.to_string());
            continue;
        };
        for (kind, value) in tool {
            match (kind.as_str(), value) {
                ("functionDeclarations", Value::Array(declarations)) => {
                    functions.extend(declarations.iter().map(as_chat_function));
                }
                _ => others += count_text(encoding, &json!({ kind: value }).to_string()),
            }
        }
    }
    count_tools(encoding, &functions) + others
}

/// A function declaration as a chat tool: its schema in `parameters` (or, as newer clients
/// write it, `parametersJsonSchema`).
fn as_chat_function(declaration: &Value) -> Value {
    let field = |name| declaration.get(name).cloned().unwrap_or_default();
    let parameters = declaration
        .get("parameters")
        .or_else(|| declaration.get("parametersJsonSchema"))
        .cloned()
        .unwrap_or_default();
    json!({"type": "function", "function": {
        "name": field("name"),
        "description": field("description"),
        "parameters": parameters,
    }})
}

/// A parsed request counted for planning: `systemInstruction`, tools and `toolConfig` as
/// fixed tokens, each turn as its chat form.
async fn counted(
    request: &GeminiRequest,
    catalog: &ModelCatalog,
    counter: &TokenCounter,
) -> Prepared {
    let body = &request.body;
    let info = catalog.resolve(&request.model);
    let encoding = info.encoding;
    let [instruction, tools, tool_config] =
        ["systemInstruction", "tools", "toolConfig"].map(|f| body.get(f));
    let fixed = counter.count_parts(encoding, &[instruction, tools, tool_config], || {
        fixed_tokens(encoding, instruction, tools, tool_config)
    });
    let count = counter
        .count_messages(
            &as_chat(contents(&request.body)),
            fixed,
            &request.model,
            &info,
        )
        .await;
    let metas = contents(body)
        .iter()
        .zip(&count.per_message)
        .map(|(turn, &tokens)| item(turn, tokens))
        .collect();
    Prepared {
        info,
        count,
        metas,
        requested_completion_tokens: request.config.max_output_tokens,
        choices: request.config.candidate_count.unwrap_or(1),
        identities: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
