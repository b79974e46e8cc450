//! What the summarizer needs of the API a summary is asked in (`SummaryApi`): each dialect
//! writes the question and reads the answer its own way, and the summarizer, below the
//! dialects, reaches them only through this trait.

use std::borrow::Cow;

use hyper::header::HeaderMap;
use serde_json::Value;

use crate::error::SummarizeError;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;

/// Completion budget reasoning models get on top of `max_summary_tokens` for their thinking.
pub const REASONING_ALLOWANCE_TOKENS: u32 = 2_048;

/// One summary asked for: what any API's request says, whatever its shape.
pub struct SummaryAsk<'a> {
    pub model: &'a str,
    /// The system text.
    pub instructions: &'a str,
    /// The user's text: the transcript, with a previous summary to extend.
    pub user: &'a str,
    /// The summary's completion budget.
    pub max_tokens: u32,
}

/// How a reasoning model is asked: the effort its API names, and the completion budget
/// with room for its thinking.
pub struct Reasoning {
    pub effort: &'static str,
    pub max_tokens: u32,
}

impl SummaryAsk<'_> {
    /// Reasoning models take neither a token limit nor a temperature the usual way, and
    /// spend part of their completion budget thinking: they are asked for little of it, with
    /// room. `None` for other models.
    pub fn reasoning(&self) -> Option<Reasoning> {
        reasoning_for(self.model, self.max_tokens)
    }
}

/// How `model` is asked for an answer of `max_tokens` when it is a reasoning model: the
/// effort its API names, and room for its thinking. `None` for other models.
pub fn reasoning_for(model: &str, max_tokens: u32) -> Option<Reasoning> {
    let name = crate::tokens::catalog::base_name(model);
    let effort = if name.starts_with("gpt-5") {
        "minimal"
    } else if ["o1", "o3", "o4"].iter().any(|p| name.starts_with(p)) {
        "low"
    } else {
        return None;
    };
    Some(Reasoning {
        effort,
        max_tokens: max_tokens + REASONING_ALLOWANCE_TOKENS,
    })
}

/// How a summary is asked in one API, and read from its reply.
pub trait SummaryApi: Send + Sync {
    /// Headers the API requires of every request, besides the credentials.
    fn add_headers(&self, _headers: &mut HeaderMap) {}

    /// The request body, non-streaming.
    fn request_body(&self, ask: &SummaryAsk) -> Value;

    /// The summary's text from a successful reply. A reply without the shape of its API is
    /// `Malformed` (the upstream's fault); a refusal is `Rejected`.
    fn reply_text(&self, reply: &Value) -> Result<String, SummarizeError>;

    /// Whether the reply stopped at its token limit, as the API says it: a summary that
    /// ends mid-sentence (`summary_check`).
    fn cut_off(&self, reply: &Value) -> bool;

    /// A summary asked through the session: `forwarded`, the session's last request as it
    /// went upstream, with one user turn appended that says `instruction`, asked whole and
    /// for at most `max_tokens` of answer (with room to think where the request thinks).
    /// Everything else stays as sent, so that the provider serves the prefix from its cache.
    /// None when the request does not carry its conversation whole (a chained Responses
    /// request).
    fn session_body(&self, forwarded: Value, instruction: &str, max_tokens: u32) -> Option<Value>;

    /// Whether a reply calls a tool: a summary asked through the session offers the
    /// session's tools, and a reply that uses one is no summary.
    fn calls_a_tool(&self, reply: &Value) -> bool;

    /// The caller's headers, besides its credentials, that a body the session sent may need
    /// (beta features it uses).
    fn session_headers(&self) -> &'static [&'static str] {
        &[]
    }
}

/// `forwarded` as an object asked whole (no `stream`, which every API defaults to false, and
/// so no `stream_options`), with `turn` appended to its `conversation` array.
pub fn with_turn_appended(
    forwarded: Value,
    conversation: &str,
    turn: Value,
) -> Option<serde_json::Map<String, Value>> {
    let Value::Object(mut body) = forwarded else {
        return None;
    };
    body.get_mut(conversation)?.as_array_mut()?.push(turn);
    body.remove("stream");
    body.remove("stream_options");
    Some(body)
}

/// An API as the summarizer reaches it.
#[derive(Clone, Copy)]
pub struct SummaryEndpoint {
    /// Where a summary by a model is asked for.
    pub path: fn(&str) -> Cow<'static, str>,
    /// How a key of the summarizer's own is sent.
    pub key_style: KeyStyle,
    pub api: &'static dyn SummaryApi,
    /// How its replies carry usage: the relay's reader, the summarizer's tokens counted.
    pub usage: &'static dyn UsageReader,
}
