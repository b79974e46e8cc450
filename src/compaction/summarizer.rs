//! The summarizer: a non-streaming chat completion that folds evicted messages into a
//! structured summary, with a circuit breaker per upstream.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::Method;
use regex::Regex;
use serde_json::{json, Value};

use crate::config::SummarizerConfig;
use crate::http::upstream::Upstream;
use crate::tokens::counter::shorten_middle;

/// Bumped whenever the prompt changes, so summaries made by another prompt are not reused.
pub const PROMPT_VERSION: u32 = 1;
/// Tool outputs are cut to this many tokens (head and end) before the summarizer sees them.
const TOOL_OUTPUT_TOKENS: u32 = 600;
/// Room for the instructions and a previous summary, besides the transcript.
const PROMPT_OVERHEAD_TOKENS: u64 = 2_500;
const MAX_APPENDED_IDENTIFIERS: usize = 60;
/// Appended identifiers stop at this many characters, so they cannot outgrow the summary.
const MAX_APPENDED_CHARS: usize = 2_000;
/// Completion budget reasoning models get on top of `max_summary_tokens` for their thinking.
const REASONING_ALLOWANCE_TOKENS: u32 = 2_048;

const INSTRUCTIONS: &str = "You compress the earlier part of a conversation between a user and an AI assistant \
so the assistant can continue the work without the original messages. Write a faithful summary with exactly \
these sections, in this order, each as a markdown heading. Under each, write \"none\" when it is empty.\n\
\n\
## Goal and constraints\nWhat the user wants and every constraint they set, quoting the user's own words where they matter.\n\
## Decisions\nWhat was decided, and why.\n\
## Facts and identifiers\nNames, numbers with units, IDs, URLs, paths, versions, dates: copied verbatim, never paraphrased.\n\
## Artifacts\nFiles, commands, code, errors and their messages that matter to the work.\n\
## Progress\nDone, in progress and pending, as the conversation's own plan marks them.\n\
## Open questions\nWhat is unresolved or waiting on the user.\n\
## Next step\nWhat the assistant was about to do.\n\
\n\
Write only the summary, no preamble. Never invent anything not in the transcript.";

const EXTEND_INSTRUCTIONS: &str = "Below are the existing summary of the conversation so far and the messages \
that came after it. Return the updated summary: the same sections, with the new messages folded in, keeping \
every fact of the existing summary that is still true. Do not summarize the summary; update it.";

#[derive(Debug, Clone, thiserror::Error)]
pub enum SummarizeError {
    #[error("circuit open after repeated failures against {0}")]
    CircuitOpen(String),
    #[error("summarizer request failed: {0}")]
    Upstream(String),
    #[error("summarizer answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("summarizer timed out after {0:?}")]
    Timeout(Duration),
    #[error("summary rejected: {0}")]
    Invalid(String),
}

impl SummarizeError {
    /// Whether the failure says the summarizer's upstream is unwell (and so counts toward
    /// the breaker), rather than this caller's request being refused.
    fn is_upstream_fault(&self) -> bool {
        match self {
            SummarizeError::CircuitOpen(_) => false,
            SummarizeError::Status { status, .. } => {
                *status >= 500 || *status == 408 || *status == 429
            }
            SummarizeError::Upstream(_)
            | SummarizeError::Timeout(_)
            | SummarizeError::Invalid(_) => true,
        }
    }
}

/// One message as the summarizer will see it, with its token count.
#[derive(Debug, Clone)]
pub struct Evicted {
    pub message: Value,
    pub tokens: u32,
}

pub struct SummaryRequest {
    pub upstream: Arc<Upstream>,
    pub model: String,
    pub authorization: Option<HeaderValue>,
    pub previous: Option<String>,
    pub messages: Vec<Evicted>,
    /// The summarizer model's context window.
    pub window: u64,
}

#[derive(Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

pub struct Summarizer {
    config: SummarizerConfig,
    dedicated: Option<Arc<Upstream>>,
    /// From `api_key_env`: sent instead of the caller's key, whichever upstream summarizes.
    own_key: Option<HeaderValue>,
    breakers: Mutex<HashMap<String, Breaker>>,
}

impl Summarizer {
    /// `connections`: kept as for every upstream.
    pub fn new(
        config: SummarizerConfig,
        connections: &crate::http::upstream::Connections,
    ) -> Result<Summarizer, crate::config::ConfigError> {
        let timeout = Duration::from_secs(config.timeout_secs);
        let dedicated = if config.base_url.is_empty() {
            None
        } else {
            Some(Arc::new(Upstream::new(
                &config.base_url,
                "",
                timeout,
                connections,
            )?))
        };
        Ok(Summarizer {
            own_key: crate::http::upstream::bearer_from_env(&config.api_key_env)?,
            config,
            dedicated,
            breakers: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &SummarizerConfig {
        &self.config
    }

    /// The summarizer model for a request: the configured one, else the request's own.
    pub fn model_for(&self, request_model: &str) -> String {
        if self.config.model.is_empty() {
            request_model.to_string()
        } else {
            self.config.model.clone()
        }
    }

    /// The configured summarizer upstream, else the request's.
    pub fn upstream_for(&self, request_upstream: &Arc<Upstream>) -> Arc<Upstream> {
        self.dedicated
            .clone()
            .unwrap_or_else(|| request_upstream.clone())
    }

    /// Whose key pays: the summarizer's own `api_key_env` when set, else the caller's
    /// Authorization (and without either, the upstream's configured key).
    pub fn authorization_for(&self, caller: Option<&HeaderValue>) -> Option<HeaderValue> {
        self.own_key.clone().or_else(|| caller.cloned())
    }

    /// Summarizes `request.messages` (folded into `request.previous` when given), in chunks
    /// that fit the summarizer's window.
    pub async fn summarize(&self, request: SummaryRequest) -> Result<String, SummarizeError> {
        let breaker_key = request.upstream.base_url().to_string();
        self.check_breaker(&breaker_key)?;
        let result = self.fold(&request).await;
        match &result {
            Ok(_) => self.record(&breaker_key, true),
            Err(e) if e.is_upstream_fault() => self.record(&breaker_key, false),
            Err(_) => {}
        }
        let summary = result?;
        Ok(with_identifiers(summary, &request.messages))
    }

    async fn fold(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let budget = request
            .window
            .saturating_sub(u64::from(self.config.max_summary_tokens) + PROMPT_OVERHEAD_TOKENS)
            .max(1_000);
        let budget = u32::try_from(budget).unwrap_or(u32::MAX);
        let mut summary = request.previous.clone();
        for chunk in chunks(&request.messages, budget) {
            let transcript = render_transcript(chunk, budget);
            summary = Some(self.call(request, summary.as_deref(), &transcript).await?);
        }
        summary.ok_or_else(|| SummarizeError::Invalid("nothing to summarize".into()))
    }

    async fn call(
        &self,
        request: &SummaryRequest,
        previous: Option<&str>,
        transcript: &str,
    ) -> Result<String, SummarizeError> {
        let user = match previous {
            Some(previous) => format!(
                "{EXTEND_INSTRUCTIONS}\n\n<existing_summary>\n{previous}\n</existing_summary>\n\n<new_messages>\n{transcript}</new_messages>"
            ),
            None => format!("<transcript>\n{transcript}</transcript>"),
        };
        let mut body = json!({
            "model": request.model,
            "messages": [
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": user},
            ],
            "stream": false,
        });
        // Reasoning models take neither `max_tokens` nor a temperature, and spend part of
        // their completion budget thinking: ask for little of it and leave room for it.
        let name = crate::models::base_name(&request.model);
        if ["o1", "o3", "o4", "gpt-5"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            body["max_completion_tokens"] =
                json!(self.config.max_summary_tokens + REASONING_ALLOWANCE_TOKENS);
            let effort = if name.starts_with("gpt-5") {
                "minimal"
            } else {
                "low"
            };
            body["reasoning_effort"] = json!(effort);
        } else {
            body["max_tokens"] = json!(self.config.max_summary_tokens);
            body["temperature"] = json!(0);
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(auth) = &request.authorization {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let call = async {
            let response = request
                .upstream
                .send(
                    Method::POST,
                    "/v1/chat/completions",
                    headers,
                    crate::http::body::full(body.to_string()),
                )
                .await
                .map_err(|e| SummarizeError::Upstream(e.to_string()))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| SummarizeError::Upstream(e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                return Err(SummarizeError::Status {
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned(),
                });
            }
            Ok(bytes)
        };
        let bytes = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| SummarizeError::Timeout(timeout))??;
        let reply: Value = serde_json::from_slice(&bytes)
            .map_err(|e| SummarizeError::Invalid(format!("not JSON: {e}")))?;
        let choice = reply.pointer("/choices/0");
        if choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str)
            == Some("content_filter")
        {
            return Err(SummarizeError::Invalid("content filtered".into()));
        }
        let text = choice
            .and_then(|c| c.pointer("/message/content"))
            .and_then(Value::as_str)
            .unwrap_or("");
        validate(text)
    }

    fn check_breaker(&self, key: &str) -> Result<(), SummarizeError> {
        let Ok(mut breakers) = self.breakers.lock() else {
            return Ok(());
        };
        let breaker = breakers.entry(key.to_string()).or_default();
        match breaker.open_until {
            Some(until) if Instant::now() < until => {
                Err(SummarizeError::CircuitOpen(key.to_string()))
            }
            Some(_) => {
                // Half-open: let this one try; one more failure re-opens at once.
                breaker.open_until = None;
                breaker.failures = self.config.breaker_failures.saturating_sub(1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn record(&self, key: &str, success: bool) {
        let Ok(mut breakers) = self.breakers.lock() else {
            return;
        };
        let breaker = breakers.entry(key.to_string()).or_default();
        if success {
            *breaker = Breaker::default();
            return;
        }
        breaker.failures += 1;
        if breaker.failures >= self.config.breaker_failures.max(1) && breaker.open_until.is_none() {
            let cooldown = Duration::from_secs(self.config.breaker_cooldown_secs);
            breaker.open_until = Some(Instant::now() + cooldown);
            tracing::warn!(
                upstream = key,
                failures = breaker.failures,
                cooldown_secs = cooldown.as_secs(),
                "summarizer circuit open: compaction falls back until the cooldown ends"
            );
        }
    }
}

/// Accepts a summary only if it has content and is not an apology or an error text.
fn validate(text: &str) -> Result<String, SummarizeError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(SummarizeError::Invalid("empty summary".into()));
    }
    let lower = text.to_lowercase();
    let refusals = [
        "i'm sorry",
        "i am sorry",
        "i cannot",
        "i can't",
        "as an ai",
        "error:",
        "{\"error\"",
    ];
    if refusals.iter().any(|r| lower.starts_with(r)) {
        let head: String = text.chars().take(80).collect();
        return Err(SummarizeError::Invalid(format!(
            "looks like an error: {head}"
        )));
    }
    Ok(text.to_string())
}

/// Groups messages, in order, so each group's tokens stay under the budget.
fn chunks(messages: &[Evicted], budget: u32) -> Vec<&[Evicted]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut used = 0u64;
    for (i, m) in messages.iter().enumerate() {
        let tokens = u64::from(transcript_tokens(m, budget));
        if i > start && used + tokens > u64::from(budget) {
            out.push(&messages[start..i]);
            start = i;
            used = 0;
        }
        used += tokens;
    }
    if start < messages.len() {
        out.push(&messages[start..]);
    }
    out
}

fn is_tool_output(message: &Value) -> bool {
    matches!(
        message.get("role").and_then(Value::as_str),
        Some("tool" | "function")
    )
}

/// How much of a message the summarizer sees: tool outputs are cut short, and no message is
/// larger than one chunk.
fn keep_tokens(m: &Evicted, budget: u32) -> u32 {
    if is_tool_output(&m.message) {
        TOOL_OUTPUT_TOKENS.min(budget)
    } else {
        budget
    }
}

fn transcript_tokens(m: &Evicted, budget: u32) -> u32 {
    m.tokens.min(keep_tokens(m, budget) + 20)
}

/// The text of a message's content: a string, or its text parts with placeholders for the rest.
pub fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) => text.to_string(),
                None => format!(
                    "[{}]",
                    part.get("type").and_then(Value::as_str).unwrap_or("part")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn render_transcript(messages: &[Evicted], budget: u32) -> String {
    let mut out = String::new();
    for m in messages {
        let message = &m.message;
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        out.push_str("### ");
        out.push_str(role);
        if let Some(name) = message.get("name").and_then(Value::as_str) {
            out.push_str(&format!(" ({name})"));
        }
        out.push('\n');
        out.push_str(&shorten_middle(
            &content_text(message),
            m.tokens,
            keep_tokens(m, budget),
        ));
        out.push('\n');
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            for call in calls {
                let f = call.get("function");
                let field = |k: &str| {
                    f.and_then(|f| f.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                };
                out.push_str(&format!(
                    "→ calls {}({})\n",
                    field("name"),
                    field("arguments")
                ));
            }
        }
        out.push('\n');
    }
    out
}

static IDENTIFIER: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(concat!(
        r"https?://[^\s<>()\[\]{}'`]+[^\s<>()\[\]{}'`.,;:!?]",
        r"|(?:~|\.{1,2})?/[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)+",
        r"|[A-Za-z0-9_\-]+\.(?:rs|py|js|ts|go|java|toml|json|yaml|yml|md|txt|csv|sql|sh|c|h|cpp)\b",
        r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
        r"|\b[A-Z][A-Z0-9]+[-_][A-Z0-9][A-Z0-9\-_]*\d[A-Z0-9]*\b",
        r"|\$\d[\d,]*(?:\.\d+)?",
        r"|\b\d+(?:[.,]\d+)?\s?(?:ms|s|min|h|KB|MB|GB|TB|KiB|MiB|GiB|kg|km|mg|ml|px|%|USD|EUR|GBP)(?:\b|$)",
    ))
    .ok()
});

/// Paths, URLs, numbers with units and IDs found in text, in order of first appearance.
pub fn identifiers(text: &str) -> Vec<String> {
    let Some(re) = IDENTIFIER.as_ref() else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    for m in re.find_iter(text) {
        let id = m.as_str().trim().to_string();
        if !found.contains(&id) {
            found.push(id);
        }
    }
    found
}

/// Appends, under "Artifacts", any identifier from the evicted user messages that the summary
/// dropped, so no model paraphrase can lose it.
fn with_identifiers(summary: String, messages: &[Evicted]) -> String {
    let mut missing = Vec::new();
    for m in messages {
        if m.message.get("role").and_then(Value::as_str) != Some("user") {
            continue;
        }
        for id in identifiers(&content_text(&m.message)) {
            if !summary.contains(&id) && !missing.contains(&id) {
                missing.push(id);
            }
        }
    }
    if missing.is_empty() {
        return summary;
    }
    missing.truncate(MAX_APPENDED_IDENTIFIERS);
    let mut used = 0;
    let list: Vec<String> = missing
        .into_iter()
        .take_while(|id| {
            used += id.len() + 3;
            used <= MAX_APPENDED_CHARS
        })
        .map(|id| format!("- {id}"))
        .collect();
    format!(
        "{summary}\n\n## Artifacts (verbatim from the user's messages)\n{}",
        list.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_found() {
        let text = "Deploy ORD-77812 to https://example.com/api/v2, config at /etc/app/conf.toml, \
                    budget $1,200.50, timeout 250ms, disk 40 GB, id 123e4567-e89b-12d3-a456-426614174000, see main.rs.";
        let ids = identifiers(text);
        for want in [
            "ORD-77812",
            "https://example.com/api/v2",
            "/etc/app/conf.toml",
            "$1,200.50",
            "250ms",
            "40 GB",
            "123e4567-e89b-12d3-a456-426614174000",
            "main.rs",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} not in {ids:?}");
        }
    }

    #[test]
    fn dropped_identifiers_are_appended() {
        let messages = vec![Evicted {
            message: json!({"role": "user", "content": "ticket ORD-4411 costs $90"}),
            tokens: 10,
        }];
        let out = with_identifiers("The user has a ticket ORD-4411.".into(), &messages);
        assert!(out.contains("## Artifacts"));
        assert!(out.contains("- $90"));
        assert!(!out.contains("- ORD-4411"));
    }

    #[test]
    fn bad_summaries_are_rejected() {
        assert!(validate("  ").is_err());
        assert!(validate("I'm sorry, I can't help with that").is_err());
        assert!(validate("## Goal and constraints\nnone").is_ok());
    }

    #[test]
    fn chunks_respect_the_budget_and_order() {
        let m = |t| Evicted {
            message: json!({"role": "user", "content": "x"}),
            tokens: t,
        };
        let messages = vec![m(400), m(400), m(400), m(5000), m(10)];
        let groups = chunks(&messages, 1000);
        let sizes: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        assert_eq!(sizes, vec![2, 1, 1, 1]);
    }
}
