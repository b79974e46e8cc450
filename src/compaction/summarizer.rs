//! The summarizer: one non-streaming call, in the API its upstream speaks (chat completions,
//! responses or Anthropic messages), that folds evicted messages into a structured summary;
//! with a circuit breaker per upstream and caller.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::Method;
use serde_json::Value;

use crate::compaction::artifacts;
use crate::compaction::breaker::Breakers;
use crate::compaction::summary::{hex, Key};
use crate::compaction::summary_api::{SummaryApi, SummaryAsk, SummaryEndpoint};
use crate::compaction::summary_check::{check, Expected};
use crate::compaction::summary_prompt::{
    chunks, placeholder, render_transcript, Evicted, EXTEND_INSTRUCTIONS, INSTRUCTIONS,
    SESSION_INSTRUCTIONS, TOOL_OUTPUT_TOKENS,
};
use crate::config::{SummarizerConfig, ToolPolicy, Via};
use crate::error::SummarizeError;
use crate::observe::metrics::{SummarizerFailure, SummarizerHealth, SummaryVia};
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::encoding::Encoding;
use crate::transport::upstream::{blank_credentials, Upstream};

/// Room for the instructions and a previous summary, besides the transcript.
const PROMPT_OVERHEAD_TOKENS: u64 = 2_500;
/// The summarizer's tokenizer may count a transcript longer than the request's encoding
/// does (a local model's own vocabulary): a tenth of its window is left for that.
const TOKENIZER_SLACK_DIVISOR: u64 = 10;
/// Characters of an upstream's error body kept in the error (and so in the log).
const ERROR_BODY_CHARS: usize = 300;

/// Besides its key (in any of `Connections::key_headers`), the caller's headers a summarizer
/// call paid by the caller carries: the organization and project to bill.
static CALLER_BILLING: [HeaderName; 2] = [
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
];

impl SummarizeError {
    /// Whether the failure says the summarizer's upstream itself is unwell (and so counts
    /// toward the breaker). A 4xx (429 included) is about this caller's key or quota, and
    /// must not turn summarizing off for it. (A refused summary counts toward this caller's
    /// breaker all the same: see `summarize`.)
    fn is_upstream_fault(&self) -> bool {
        match self {
            SummarizeError::Status { status, .. } => *status >= 500,
            SummarizeError::Upstream(_)
            | SummarizeError::Timeout(_)
            | SummarizeError::Malformed(_) => true,
            SummarizeError::CircuitOpen(_)
            | SummarizeError::Rejected(_)
            | SummarizeError::Refused(_)
            | SummarizeError::Internal(_) => false,
        }
    }

    /// The `reason` label of `condenser_summarizer_failures_total`.
    fn reason(&self) -> SummarizerFailure {
        match self {
            SummarizeError::CircuitOpen(_) => SummarizerFailure::CircuitOpen,
            SummarizeError::Upstream(_) => SummarizerFailure::Connection,
            SummarizeError::Status { .. } => SummarizerFailure::Status,
            SummarizeError::Timeout(_) => SummarizerFailure::Timeout,
            SummarizeError::Malformed(_) => SummarizerFailure::Malformed,
            SummarizeError::Rejected(_) | SummarizeError::Refused(_) => SummarizerFailure::Rejected,
            SummarizeError::Internal(_) => SummarizerFailure::Internal,
        }
    }
}

pub struct SummaryRequest {
    pub upstream: Arc<Upstream>,
    /// The API it is asked in (from [`Summarizer::api_for`]).
    pub api: SummaryEndpoint,
    pub model: String,
    /// The hash of the caller's identity: the breaker is per upstream and caller.
    pub caller: Key,
    /// From [`Summarizer::credentials_for`].
    pub credentials: HeaderMap,
    pub previous: Option<String>,
    pub messages: Vec<Evicted>,
    /// The pinned task's identifiers, when the task lies before the summary's end: the
    /// summary must keep one (`summary_check`).
    pub task: Vec<String>,
    /// The summarizer model's context window.
    pub window: u64,
    /// The summary's completion budget: `max_summary_tokens`, or less in a small window
    /// (`limits::summary_room`).
    pub max_tokens: u32,
    /// The request model's: the artifact budget is counted in it.
    pub encoding: Encoding,
    /// The session's last request, when the summary may be asked through it.
    pub session: Option<ThroughSession>,
}

/// A summary asked through the session (`summarizer.via`): its last request as it went
/// upstream, the question appended, sent where and as the session's requests go.
pub struct ThroughSession {
    pub upstream: Arc<Upstream>,
    /// The session's own API.
    pub api: SummaryEndpoint,
    pub model: String,
    /// The caller's credentials, and the headers its body may need (`session_headers`).
    pub headers: HeaderMap,
    pub forwarded: Bytes,
    /// How many of the forwarded request's last items the summary leaves out.
    pub recent: usize,
}

pub struct Summarizer {
    config: SummarizerConfig,
    dedicated: Option<Arc<Upstream>>,
    /// From `api_key_env`: sent instead of the caller's key, whichever upstream summarizes.
    own_key: Option<HeaderValue>,
    /// The headers a caller's key may come in (`Connections::key_headers`).
    key_headers: &'static [HeaderName],
    /// See [`Summarizer::settings_key`].
    settings: Key,
    breakers: Breakers,
    health: SummarizerHealth,
    /// The API `summarizer.api` names; none for each request's own.
    configured_api: Option<SummaryEndpoint>,
    /// Resolves the summarizer model's family, its `model` label in metrics.
    catalog: Arc<ModelCatalog>,
}

impl Summarizer {
    /// `connections`: kept as for every upstream; `configured_api`: the API `config.api`
    /// names, found by the dialects that know the names. A configured model's token series
    /// show from start-up.
    pub fn new(
        config: SummarizerConfig,
        connections: &crate::transport::upstream::Connections,
        health: SummarizerHealth,
        catalog: Arc<ModelCatalog>,
        configured_api: Option<SummaryEndpoint>,
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
        let settings = settings_for(&config, config.max_summary_tokens);
        if !config.model.is_empty() {
            let label = health.label_for(&config.model, &catalog.resolve(&config.model));
            health.count_tokens(label, Default::default(), None);
        }
        Ok(Summarizer {
            own_key: crate::transport::upstream::bearer_from_env(&config.api_key_env)?,
            key_headers: connections.key_headers,
            breakers: Breakers::new(&config, health.clone()),
            config,
            dedicated,
            health,
            settings,
            configured_api,
            catalog,
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

    /// The summarizer model's window: the configured one, else the catalog's (`catalog`).
    pub fn window(&self, catalog: u64) -> u64 {
        if self.config.context_window > 0 {
            self.config.context_window
        } else {
            catalog
        }
    }

    /// The configured summarizer upstream, else the request's.
    pub fn upstream_for(&self, request_upstream: &Arc<Upstream>) -> Arc<Upstream> {
        self.dedicated
            .clone()
            .unwrap_or_else(|| request_upstream.clone())
    }

    /// What shapes a summary of at most `summary_tokens` besides its model and its messages:
    /// the prompt's text, how tool outputs are cut (the request's tool policies included), the
    /// summary's and the artifact ledger's budgets. Summaries made under other settings (a smaller window's budget included) are
    /// not reused, with no version number to remember to bump.
    pub fn settings_key(&self, summary_tokens: u32, tools: &[ToolPolicy]) -> Key {
        let settings = if summary_tokens == self.config.max_summary_tokens {
            self.settings
        } else {
            settings_for(&self.config, summary_tokens)
        };
        if tools.is_empty() {
            return settings;
        }
        // The tool policies decide which outputs the summarizer reads whole (`cut = "never"`):
        // each policy's cut, then how many names it lists, then the names.
        let mut texts = vec![hex(&settings)];
        let mut counts = Vec::new();
        for policy in tools {
            texts.push(format!("{:?}", policy.cut));
            texts.extend(policy.names.iter().cloned());
            counts.push(u32::try_from(policy.names.len()).unwrap_or(u32::MAX));
        }
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        settings_key(&texts, &counts)
    }

    /// The API a summary is asked in: the configured one, else the request's own.
    pub fn api_for(&self, request_api: SummaryEndpoint) -> SummaryEndpoint {
        self.configured_api.unwrap_or(request_api)
    }

    /// The caller's headers a summary paid by the caller carries: its key, in whichever
    /// header it came, and whom to bill.
    fn caller_credentials(&self) -> impl Iterator<Item = &HeaderName> {
        self.key_headers.iter().chain(&CALLER_BILLING)
    }

    /// Whose key pays for a summary of a request in `request_api`: the summarizer's own
    /// `api_key_env` alone when set (in the style of the API asked); else the caller's
    /// credential headers, only when the summary goes to the request's own upstream, which
    /// speaks the request's API and was sent the key already (`carries_callers_key`); else
    /// none. A dedicated summarizer (`summarizer.base_url`) never gets a caller's key, in
    /// whichever header or query parameter it came.
    pub fn credentials_for(
        &self,
        request_headers: &HeaderMap,
        request_api: SummaryEndpoint,
    ) -> HeaderMap {
        let mut credentials = HeaderMap::new();
        if let Some(key) = &self.own_key {
            self.api_for(request_api)
                .key_style
                .insert(&mut credentials, key);
            return credentials;
        }
        if self.carries_callers_key() {
            copy_headers(request_headers, self.caller_credentials(), &mut credentials);
        }
        credentials
    }

    /// Whether a summary may carry the caller's key: only to the caller's own upstream (no
    /// `summarizer.base_url`), the one its request's route chose for its API and model, where
    /// the key goes anyway.
    fn carries_callers_key(&self) -> bool {
        self.dedicated.is_none()
    }

    /// Whether a summary may be asked through the session of a request of `model` in
    /// `api`: always under `via = "session"`; under `auto` only when the summarizer is the
    /// session's own model, API, upstream and key, so that the provider's cache of the
    /// session is the summarizer's too (the cache's age is checked when the summary is made).
    pub fn through_session(&self, model: &str, api: SummaryEndpoint) -> bool {
        match self.config.via {
            Via::Separate => false,
            Via::Session => true,
            Via::Auto => {
                (self.config.model.is_empty() || self.config.model == model)
                    && self
                        .configured_api
                        .is_none_or(|configured| std::ptr::addr_eq(configured.api, api.api))
                    && self.dedicated.is_none()
                    && self.own_key.is_none()
            }
        }
    }

    /// The headers a summary asked through the session carries: the caller's credentials, as
    /// its requests carry them, and those its body may need.
    pub fn session_headers(&self, request_headers: &HeaderMap, api: SummaryEndpoint) -> HeaderMap {
        let mut headers = HeaderMap::new();
        copy_headers(request_headers, self.caller_credentials(), &mut headers);
        for name in api.api.session_headers() {
            for value in request_headers.get_all(*name) {
                headers.append(*name, value.clone());
            }
        }
        headers
    }

    /// Summarizes `request.messages` (folded into `request.previous` when given), in chunks
    /// that fit the summarizer's window.
    pub async fn summarize(&self, request: SummaryRequest) -> Result<String, SummarizeError> {
        let breaker_key = (request.upstream.base_url().to_string(), request.caller);
        let result = match self.breakers.check(&breaker_key) {
            Ok(()) => match self.through(&request).await {
                Some(summary) => Ok(summary),
                None => self.fold(&request).await.inspect(|_| {
                    self.health.count_summary(SummaryVia::Separate);
                }),
            },
            Err(open) => Err(open),
        };
        match &result {
            Ok(_) => self.breakers.record(&breaker_key, true),
            Err(e) => {
                if let SummarizeError::Refused(refusal) = e {
                    self.health.count_refused(SummaryVia::Separate, *refusal);
                }
                self.health.count_failure(e.reason());
                // A refused summary counts as a failure too: a summarizer whose answers are
                // refused would otherwise be asked again at every request, each call billed
                // the whole span (the peers' bench: 118 calls for 111 requests, 1.53 of the
                // session sent straight), while the step falls back anyway.
                if e.is_upstream_fault() || matches!(e, SummarizeError::Refused(_)) {
                    self.breakers.record(&breaker_key, false);
                }
            }
        }
        let summary = result?;
        Ok(artifacts::carry(
            summary,
            request.previous.as_deref(),
            request.messages.iter().map(|m| &m.message),
            self.ledger_budget(&request),
            request.encoding,
        ))
    }

    /// What observe mode counts in place of a summary, calling nothing: a placeholder as long
    /// as the summary's budget (what a summary of a long span comes close to), and the ledger
    /// the real summary would carry, since it is made here from the messages alone.
    pub fn stand_in(&self, request: &SummaryRequest) -> String {
        artifacts::carry(
            placeholder(request.max_tokens),
            request.previous.as_deref(),
            request.messages.iter().map(|m| &m.message),
            self.ledger_budget(request),
            request.encoding,
        )
    }

    /// The ledger's budget: the configured one (`artifacts::budget`), shrunk in the
    /// proportion a small window shrank the summary, so that identifiers do not outgrow the
    /// summary they end.
    fn ledger_budget(&self, request: &SummaryRequest) -> u32 {
        self.ledger_tokens(request.max_tokens, request.window)
    }

    /// The ledger's budget for a summary of at most `summary_tokens` made in a window of
    /// `window` tokens (`ledger_budget`): a stand-in carries the same ledger a summary would.
    pub fn ledger_tokens(&self, summary_tokens: u32, window: u64) -> u32 {
        let full = artifacts::budget(self.config.max_artifact_tokens, window);
        let scaled = u64::from(full) * u64::from(summary_tokens)
            / u64::from(self.config.max_summary_tokens.max(1));
        u32::try_from(scaled).map_or(full, |scaled| scaled.min(full))
    }

    /// The summary asked through the session, when it may be; None when it was not, or came
    /// back unusable (a tool called, an error), and so is asked apart. A failure here is the
    /// session's request reworked, not the summarizer's health: it is logged, not counted.
    async fn through(&self, request: &SummaryRequest) -> Option<String> {
        let session = request.session.as_ref()?;
        let instruction = self.budget_said(
            request,
            SESSION_INSTRUCTIONS.replace("{recent}", &session.recent.to_string()),
        );
        let forwarded: Value = serde_json::from_slice(&session.forwarded).ok()?;
        let api = session.api.api;
        let body = api.session_body(forwarded, &instruction, request.max_tokens)?;
        let target = Target {
            upstream: &session.upstream,
            endpoint: session.api,
            model: &session.model,
            headers: &session.headers,
        };
        let answer = match self.ask(target, body).await {
            Ok(reply) if api.calls_a_tool(&reply) => {
                Err(SummarizeError::Rejected("the reply called a tool".into()))
            }
            Ok(reply) => self.checked(request, &request.messages, &reply, api),
            Err(error) => Err(error),
        };
        match answer {
            Ok(summary) => {
                self.health.count_summary(SummaryVia::Session);
                Some(summary)
            }
            Err(error) => {
                if let SummarizeError::Refused(refusal) = error {
                    self.health.count_refused(SummaryVia::Session, refusal);
                }
                tracing::info!(%error, "summary through the session not usable; asking apart");
                None
            }
        }
    }

    /// `user`, with the budget said when a small window shrank it below the configured one:
    /// so that the model writes a whole short summary rather than the start of a long one.
    fn budget_said(&self, request: &SummaryRequest, user: String) -> String {
        if request.max_tokens < self.config.max_summary_tokens {
            format!(
                "{user}\n\nThe whole summary must fit in {} tokens: keep the headings, and only what matters most under them.",
                request.max_tokens
            )
        } else {
            user
        }
    }

    async fn fold(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        // At least 1,000 tokens a chunk, for fewer calls; but in a small window (a local
        // model summarizing with its own 1,000 or 2,048 tokens) a quarter of it, so that the
        // instructions, the summary so far and the answer still fit beside the chunk.
        let floor = (request.window / 4).min(1_000);
        let budget = request
            .window
            .saturating_sub(
                u64::from(request.max_tokens)
                    + PROMPT_OVERHEAD_TOKENS
                    + request.window / TOKENIZER_SLACK_DIVISOR,
            )
            .max(floor);
        let budget = u32::try_from(budget).unwrap_or(u32::MAX);
        let mut summary = request.previous.clone();
        for chunk in chunks(&request.messages, budget) {
            summary = Some(
                self.call(request, summary.as_deref(), chunk, budget)
                    .await?,
            );
        }
        summary.ok_or_else(|| SummarizeError::Rejected("nothing to summarize".into()))
    }

    /// One piece of the span folded into the summary so far: each summary written is checked
    /// before the next piece is folded into it.
    async fn call(
        &self,
        request: &SummaryRequest,
        previous: Option<&str>,
        chunk: &[Evicted],
        budget: u32,
    ) -> Result<String, SummarizeError> {
        let transcript = render_transcript(chunk, budget);
        let user = match previous {
            Some(previous) => format!(
                "{EXTEND_INSTRUCTIONS}\n\n<existing_summary>\n{previous}\n</existing_summary>\n\n<new_messages>\n{transcript}</new_messages>"
            ),
            None => format!("<transcript>\n{transcript}</transcript>"),
        };
        let user = self.budget_said(request, user);
        let api = request.api.api;
        let body = api.request_body(&SummaryAsk {
            model: &request.model,
            instructions: INSTRUCTIONS,
            user: &user,
            max_tokens: request.max_tokens,
        });
        let target = Target {
            upstream: &request.upstream,
            endpoint: request.api,
            model: &request.model,
            headers: &request.credentials,
        };
        let reply = self.ask(target, body).await?;
        self.checked(request, chunk, &reply, api)
    }

    /// The summary a reply holds, if it passes the checks (`summary_check`) against the
    /// messages it was asked to summarize.
    fn checked(
        &self,
        request: &SummaryRequest,
        span: &[Evicted],
        reply: &Value,
        api: &dyn SummaryApi,
    ) -> Result<String, SummarizeError> {
        let text = validate(&api.reply_text(reply)?)?;
        let expected = Expected {
            max_tokens: request.max_tokens,
            encoding: request.encoding,
            span,
            task: &request.task,
        };
        check(&text, api.cut_off(reply), &expected).map_err(SummarizeError::Refused)?;
        Ok(text)
    }

    /// One summary call, its tokens counted, its reply's JSON.
    async fn ask(&self, target: Target<'_>, body: Value) -> Result<Value, SummarizeError> {
        let Target {
            upstream,
            endpoint,
            model,
            headers: credentials,
        } = target;
        let mut headers = credentials.clone();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        endpoint.api.add_headers(&mut headers);
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let call = async {
            let response = upstream
                .send(
                    Method::POST,
                    &(endpoint.path)(model),
                    endpoint.key_style,
                    headers,
                    crate::transport::body::full(body.to_string()),
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
                    body: error_excerpt(&bytes, credentials),
                });
            }
            Ok(bytes)
        };
        let bytes = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| SummarizeError::Timeout(timeout))??;
        // Counted before the reply is judged: a summary refused was paid for all the same.
        if let Some(usage) = endpoint.usage.body_usage(&bytes) {
            let info = self.catalog.resolve(model);
            let label = self.health.label_for(model, &info);
            self.health
                .count_tokens(label, usage.billed(), info.price.as_ref());
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| SummarizeError::Malformed(format!("not JSON: {e}")))
    }
}

/// Where a summary call goes, and with which headers.
struct Target<'a> {
    upstream: &'a Upstream,
    endpoint: SummaryEndpoint,
    model: &'a str,
    headers: &'a HeaderMap,
}

/// Every value of `names` in `from`, marked sensitive (they carry keys), into `to`.
fn copy_headers<'n>(
    from: &HeaderMap,
    names: impl IntoIterator<Item = &'n HeaderName>,
    to: &mut HeaderMap,
) {
    for name in names {
        for value in from.get_all(name) {
            let mut value = value.clone();
            value.set_sensitive(true);
            to.append(name.clone(), value);
        }
    }
}

/// The settings key of summaries of at most `summary_tokens` (`Summarizer::settings_key`):
/// the configured budget is in it too, since the ledger shrinks by their proportion.
fn settings_for(config: &SummarizerConfig, summary_tokens: u32) -> Key {
    settings_key(
        &[INSTRUCTIONS, EXTEND_INSTRUCTIONS, SESSION_INSTRUCTIONS],
        &[
            TOOL_OUTPUT_TOKENS,
            summary_tokens,
            config.max_summary_tokens,
            config.max_artifact_tokens,
        ],
    )
}

/// The hash of `texts` (length-prefixed, so no two lists hash alike) and `numbers`.
fn settings_key(texts: &[&str], numbers: &[u32]) -> Key {
    let mut hasher = blake3::Hasher::new();
    for text in texts {
        hasher.update(&(text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    for number in numbers {
        hasher.update(&number.to_le_bytes());
    }
    *hasher.finalize().as_bytes()
}

/// The summary's text, trimmed, unless it is an apology or an error text (an empty one is
/// left to `summary_check`).
fn validate(text: &str) -> Result<String, SummarizeError> {
    let text = text.trim();
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
        return Err(SummarizeError::Rejected(format!(
            "looks like an error: {head}"
        )));
    }
    Ok(text.to_string())
}

/// The start of an upstream's error body, fit for a log line: any of the credentials sent
/// that the upstream echoed back is blanked out.
fn error_excerpt(body: &[u8], credentials: &HeaderMap) -> String {
    let sent: Vec<HeaderValue> = credentials.values().cloned().collect();
    let blanked = blank_credentials(body, &sent);
    String::from_utf8_lossy(&blanked)
        .chars()
        .take(ERROR_BODY_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::summary_api::REASONING_ALLOWANCE_TOKENS;
    use crate::conversation::ToolCut;
    use crate::dialect::named;
    use serde_json::json;

    #[test]
    fn bad_summaries_are_rejected() {
        assert!(validate("I'm sorry, I can't help with that").is_err());
        assert!(validate("## Goal and constraints\nnone").is_ok());
    }

    /// The dialect named `name`, as the summarizer asks it.
    fn endpoint(name: &str) -> SummaryEndpoint {
        named(name).unwrap().summary
    }

    fn summarizer(api_key_env: &str) -> Summarizer {
        let config = SummarizerConfig {
            api_key_env: api_key_env.into(),
            ..SummarizerConfig::default()
        };
        built(config, SummarizerHealth::standalone().unwrap())
    }

    fn built(config: SummarizerConfig, health: SummarizerHealth) -> Summarizer {
        let catalog = ModelCatalog::new(Default::default(), Default::default());
        Summarizer::new(config, &connections(), health, Arc::new(catalog), None).unwrap()
    }

    fn connections() -> crate::transport::upstream::Connections {
        let failures = crate::observe::metrics::UpstreamFailures::new().unwrap();
        crate::transport::upstream::Connections::new(
            &crate::config::Config::default(),
            failures,
            crate::dialect::key_headers(),
        )
    }

    #[test]
    fn only_faults_of_the_upstream_itself_count_toward_the_breaker() {
        let status = |status| SummarizeError::Status {
            status,
            body: String::new(),
        };
        for fault in [
            status(500),
            status(503),
            SummarizeError::Upstream("connection refused".into()),
            SummarizeError::Timeout(Duration::from_secs(1)),
            SummarizeError::Malformed("not JSON".into()),
        ] {
            assert!(fault.is_upstream_fault(), "{fault}");
        }
        for refusal in [
            status(400),
            status(401),
            status(408),
            status(429),
            SummarizeError::Rejected("content filtered".into()),
            SummarizeError::CircuitOpen("x".into()),
        ] {
            assert!(!refusal.is_upstream_fault(), "{refusal}");
        }
    }

    #[test]
    fn the_callers_credentials_are_carried_unless_the_summarizer_has_its_own_key() {
        let mut request = HeaderMap::new();
        for (name, value) in [
            ("x-api-key", "sk-ant-caller"),
            ("openai-project", "proj_1"),
            ("openai-organization", "org_1"),
            ("x-user-id", "alice"),
            ("cookie", "session=1"),
        ] {
            request.insert(name, HeaderValue::from_static(value));
        }
        let carried = summarizer("").credentials_for(&request, endpoint("messages"));
        assert_eq!(carried.len(), 3);
        assert_eq!(carried["x-api-key"], "sk-ant-caller");
        assert_eq!(carried["openai-project"], "proj_1");
        assert_eq!(carried["openai-organization"], "org_1");
        assert!(carried.values().all(HeaderValue::is_sensitive));

        std::env::set_var("CONDENSER_UNIT_SUMMARIZER_KEY", "sk-own");
        let own =
            summarizer("CONDENSER_UNIT_SUMMARIZER_KEY").credentials_for(&request, endpoint("chat"));
        assert_eq!(own.len(), 1);
        assert_eq!(own[header::AUTHORIZATION], "Bearer sk-own");
        let own = summarizer("CONDENSER_UNIT_SUMMARIZER_KEY")
            .credentials_for(&request, endpoint("messages"));
        assert_eq!(own.len(), 1);
        assert_eq!(
            own["x-api-key"], "sk-own",
            "Anthropic's API takes its key bare"
        );
        assert!(own["x-api-key"].is_sensitive());
    }

    #[test]
    fn a_callers_key_goes_only_to_its_own_upstream() {
        let mut request = HeaderMap::new();
        request.insert("x-goog-api-key", HeaderValue::from_static("AIza-caller"));
        request.insert("openai-project", HeaderValue::from_static("proj_1"));
        let health = || SummarizerHealth::standalone().unwrap();
        // A dedicated summarizer, in the caller's API or another: no key of the caller's.
        let dedicated = built(
            SummarizerConfig {
                base_url: "http://127.0.0.1:9".into(),
                ..SummarizerConfig::default()
            },
            health(),
        );
        for api in ["gemini", "chat"] {
            assert!(
                dedicated
                    .credentials_for(&request, endpoint(api))
                    .is_empty(),
                "{api}"
            );
        }
        // The caller's own upstream, whichever API the summary is asked in: the key it was
        // sent already, with whom to bill.
        let own_upstream = Summarizer::new(
            SummarizerConfig::default(),
            &connections(),
            health(),
            Arc::new(ModelCatalog::new(Default::default(), Default::default())),
            Some(endpoint("chat")),
        )
        .unwrap();
        assert_eq!(
            own_upstream
                .credentials_for(&request, endpoint("gemini"))
                .len(),
            2
        );
        // Its own key, wherever it is.
        std::env::set_var("CONDENSER_UNIT_DEDICATED_KEY", "sk-summarizer");
        let own = built(
            SummarizerConfig {
                base_url: "http://127.0.0.1:9".into(),
                api_key_env: "CONDENSER_UNIT_DEDICATED_KEY".into(),
                ..SummarizerConfig::default()
            },
            health(),
        )
        .credentials_for(&request, endpoint("chat"));
        assert_eq!(own.len(), 1);
        assert_eq!(own[header::AUTHORIZATION], "Bearer sk-summarizer");
    }

    #[test]
    fn the_settings_key_follows_the_prompt_text_and_the_budgets() {
        let base = settings_key(&["prompt", "extend"], &[600, 1024, 512]);
        assert_eq!(base, settings_key(&["prompt", "extend"], &[600, 1024, 512]));
        assert_ne!(
            base,
            settings_key(&["prompt!", "extend"], &[600, 1024, 512])
        );
        assert_ne!(base, settings_key(&["promp", "textend"], &[600, 1024, 512]));
        assert_ne!(base, settings_key(&["prompt", "extend"], &[600, 1000, 512]));
        assert_ne!(base, settings_key(&["prompt", "extend"], &[600, 1024, 256]));
        let config = |max_summary_tokens, max_artifact_tokens| SummarizerConfig {
            max_summary_tokens,
            max_artifact_tokens,
            ..SummarizerConfig::default()
        };
        let key = |config, summary_tokens| {
            built(config, SummarizerHealth::standalone().unwrap()).settings_key(summary_tokens, &[])
        };
        assert_eq!(key(config(1024, 512), 1024), key(config(1024, 512), 1024));
        assert_ne!(key(config(1024, 512), 1024), key(config(900, 512), 900));
        assert_ne!(key(config(1024, 512), 1024), key(config(1024, 100), 1024));
        // A small window's budget is a setting of its own, whatever the configured one.
        assert_ne!(key(config(1024, 512), 1024), key(config(1024, 512), 300));
        assert_eq!(key(config(1024, 512), 300), key(config(1024, 512), 300));
        // Tool policies decide what the summarizer reads whole: summaries made under others
        // are not reused, nor are two policies' names mixed up.
        let summarizer = built(config(1024, 512), SummarizerHealth::standalone().unwrap());
        let policy = |names: &[&str], cut| ToolPolicy {
            names: names.iter().map(|n| n.to_string()).collect(),
            cut,
        };
        let plain = summarizer.settings_key(1024, &[]);
        let never = summarizer.settings_key(1024, &[policy(&["Read", "Edit"], ToolCut::Never)]);
        assert_ne!(plain, never);
        assert_eq!(
            never,
            summarizer.settings_key(1024, &[policy(&["Read", "Edit"], ToolCut::Never)])
        );
        assert_ne!(
            never,
            summarizer.settings_key(1024, &[policy(&["Read", "Edit"], ToolCut::First)])
        );
        let split = [
            policy(&["Read"], ToolCut::Never),
            policy(&["Edit"], ToolCut::Never),
        ];
        assert_ne!(never, summarizer.settings_key(1024, &split));
        assert_ne!(key(config(1024, 512), 300), key(config(900, 512), 300));
    }

    /// The request body the summarizer sends in `api`.
    fn request_body(api: &str, model: &str, user: &str, max_tokens: u32) -> Value {
        endpoint(api).api.request_body(&SummaryAsk {
            model,
            instructions: INSTRUCTIONS,
            user,
            max_tokens,
        })
    }

    /// The summary the summarizer takes from a reply in `api`.
    fn reply_text(api: &str, reply: &Value) -> Result<String, SummarizeError> {
        validate(&endpoint(api).api.reply_text(reply)?)
    }

    #[test]
    fn each_api_is_asked_its_own_way_and_its_reply_read_its_own_way() {
        let chat = request_body("chat", "gpt-4o", "T", 100);
        assert_eq!(chat["messages"][1]["content"], "T");
        assert_eq!(chat["max_tokens"], 100);
        let reasoning = request_body("responses", "o3-mini", "T", 100);
        assert_eq!(reasoning["input"], "T");
        assert_eq!(reasoning["instructions"], INSTRUCTIONS);
        assert_eq!(
            reasoning["max_output_tokens"],
            100 + REASONING_ALLOWANCE_TOKENS
        );
        assert_eq!(reasoning["reasoning"]["effort"], "low");
        let claude = request_body("messages", "claude-sonnet-4", "T", 100);
        assert_eq!(claude["system"], INSTRUCTIONS);
        assert_eq!(claude["messages"][0]["content"], "T");
        assert_eq!(claude["max_tokens"], 100);

        let summary = "## Goal and constraints\nship it";
        let responses = json!({"output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": summary}]},
        ]});
        assert_eq!(reply_text("responses", &responses).unwrap(), summary);
        let messages =
            json!({"content": [{"type": "text", "text": summary}], "stop_reason": "end_turn"});
        assert_eq!(reply_text("messages", &messages).unwrap(), summary);
        let refused = json!({"content": [], "stop_reason": "refusal"});
        assert!(matches!(
            reply_text("messages", &refused),
            Err(SummarizeError::Rejected(_))
        ));
        let refused = json!({"output": [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}]});
        assert!(matches!(
            reply_text("responses", &refused),
            Err(SummarizeError::Rejected(_))
        ));
        for (api, shapeless) in [
            ("responses", json!({"id": "r"})),
            ("messages", json!({"id": "m"})),
            ("chat", json!({})),
        ] {
            assert!(
                matches!(
                    reply_text(api, &shapeless),
                    Err(SummarizeError::Malformed(_))
                ),
                "{api:?}"
            );
        }
    }

    #[test]
    fn echoed_credentials_are_blanked_from_error_bodies() {
        let mut credentials = HeaderMap::new();
        credentials.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-secret-1"),
        );
        credentials.insert("api-key", HeaderValue::from_static("azure-secret-2"));
        let body = br#"{"error":"bad key sk-secret-1 or azure-secret-2"}"#;
        let excerpt = error_excerpt(body, &credentials);
        assert_eq!(excerpt, r#"{"error":"bad key [redacted] or [redacted]"}"#);
        let long = "x".repeat(5_000);
        assert_eq!(
            error_excerpt(long.as_bytes(), &credentials).len(),
            ERROR_BODY_CHARS
        );
    }
}
