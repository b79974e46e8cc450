//! The offline commands (`check-config`, `count`, `plan`, `replay`) and logging set-up. Each returns the
//! text to print; `main` prints it.

use std::fmt::Write as _;
use std::future::Future;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use serde_json::{json, Value};

use crate::compaction::cache::ScopeHeaders;
use crate::compaction::plan::{
    summary_room, total_tokens, triggers, Decision, Limits, Mode, PlanInput, Split,
    RECALL_RESERVE_TOKENS,
};
use crate::compaction::recall::conversation_id;
use crate::compaction::rewrite::{ArchiveScope, Rewrite};
use crate::config::{Config, ConfigError, ContextConfig, Overrides, RecallConfig};
use crate::dialect::stages::{
    count_as_sent, offers_recall, write_compaction, Counting, Dialect, Prepared, Settings,
};
use crate::dialect::{
    check_apis, detect_api, key_headers, summary_api_named, with_dialect, Api, WithDialect,
};
use crate::error::ProxyError;
use crate::pipeline::observer::CacheBreak;
use crate::pipeline::observing::{observe, Observed};
use crate::pipeline::state::{AppState, StartError};
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::TokenCounter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Logs go to stderr, so command output on stdout stays machine-readable. `RUST_LOG` refines
/// the level (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only where a terminal reads them: in a file or a log collector they are
    // noise around every level and field name.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The config at `path` (see `Config::load`), its summarizer's API checked against the
/// dialects as serving checks it: every command refuses what serving would.
pub fn load_config(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let config = Config::load(path, overrides)?;
    summary_api_named(&config.summarizer.api)?;
    check_apis(&config)?;
    Ok(config)
}

pub fn check_config(path: Option<&Path>, overrides: &Overrides) -> Result<String, ConfigError> {
    let mut config = load_config(path, overrides)?;
    for warning in window_warnings(&config) {
        tracing::warn!("{warning}");
    }
    // Redis takes its password in its URL, the one configured URL allowed credentials.
    config.cache.redis_url = masked_password(&config.cache.redis_url);
    // Left out, the scope is every API's key headers: printed as they are.
    config.cache.scope_headers.get_or_insert_with(|| {
        key_headers()
            .iter()
            .map(|name| name.as_str().to_string())
            .collect()
    });
    Ok(format!(
        "# effective configuration: valid\n{}",
        config.to_toml()
    ))
}

/// A warning for each configured window (`[models.*] context_window`,
/// `tokens.default_context_window`) that leaves less room than the settings ask: valid, and
/// compacted in the room there is, but not as the settings read.
fn window_warnings(config: &Config) -> Vec<String> {
    let models = config.models.iter().filter_map(|(name, model)| {
        Some((
            format!("models.{name:?}.context_window"),
            model.context_window?,
        ))
    });
    models
        .chain([(
            "tokens.default_context_window".to_string(),
            config.tokens.default_context_window,
        )])
        .filter_map(|(key, window)| {
            let short = window_shortfalls(config, window);
            (!short.is_empty()).then(|| {
                format!(
                    "{key} = {window} leaves less room than the settings need: {}",
                    short.join("; ")
                )
            })
        })
        .collect()
}

/// What a window of `window` tokens cannot give the settings, as the planner reckons it for
/// a request that names no reply limit.
fn window_shortfalls(config: &Config, window: u64) -> Vec<String> {
    let settings = &config.context;
    let input = PlanInput {
        messages: &[],
        fixed_tokens: 0,
        context_window: window,
        requested_completion_tokens: None,
        settings,
        mode: Mode::Auto,
        summary_tokens: 0,
    };
    let limits = Limits::new(&input);
    let max_summary_tokens = config.summarizer.max_summary_tokens;
    let room = summary_room(&limits, max_summary_tokens, config.recall.enabled);
    let reserve = window.saturating_sub(limits.usable);
    let mut short = Vec::new();
    if reserve < settings.response_reserve_tokens {
        short.push(format!(
            "a request that names no max_tokens reserves {reserve} tokens for its reply (at most half the window), not response_reserve_tokens = {}",
            settings.response_reserve_tokens
        ));
    }
    if room.summary_tokens < max_summary_tokens {
        short.push(format!(
            "a summary gets at most {} tokens (half the compacted prompt's target of {}), not max_summary_tokens = {max_summary_tokens}",
            room.summary_tokens, limits.target
        ));
    }
    if config.recall.enabled && !room.recall {
        short.push(format!(
            "recall is not offered: its tool and line need {RECALL_RESERVE_TOKENS} tokens beside the summary"
        ));
    }
    short
}

/// `url` with its password shown as `****`, wherever a Redis URL may hold one: in its user
/// info (the whole user info when it is one word, as Redis takes a bare password), and in a
/// `pass` or `password` query parameter (`redis+unix:///run/redis.sock?pass=…`). A URL that
/// does not parse is not shown at all.
fn masked_password(url: &str) -> String {
    const MASK: &str = "****";
    if url.is_empty() {
        return String::new();
    }
    let Ok(mut parsed) = url::Url::parse(url) else {
        return MASK.to_string();
    };
    let mut masked = false;
    if parsed.password().is_some() {
        masked |= parsed.set_password(Some(MASK)).is_ok();
    } else if !parsed.username().is_empty() {
        masked |= parsed.set_username(MASK).is_ok();
    }
    let is_password = |name: &str| name == "pass" || name == "password";
    if parsed.query_pairs().any(|(name, _)| is_password(&name)) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| match is_password(&name) {
                true => (name.into_owned(), MASK.to_string()),
                false => (name.into_owned(), value.into_owned()),
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
        masked = true;
    }
    match masked {
        true => parsed.into(),
        // As written, not as the parser would write it again.
        false => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::masked_password;

    #[test]
    fn passwords_in_urls_are_masked() {
        for (url, shown) in [
            ("redis://:s3cret@cache:6379/0", "redis://:****@cache:6379/0"),
            (
                "redis://app:s3cret@cache:6379",
                "redis://app:****@cache:6379",
            ),
            ("rediss://s3cret@cache", "rediss://****@cache"),
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            (
                "redis+unix:///run/redis.sock?db=2&pass=s3cret",
                "redis+unix:///run/redis.sock?db=2&pass=****",
            ),
            (
                "unix:///run/redis.sock?user=app&password=s3cret",
                "unix:///run/redis.sock?user=app&password=****",
            ),
            ("redis://[s3cret", "****"),
            ("", ""),
        ] {
            assert_eq!(masked_password(url), shown);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Request(#[from] ProxyError),
    /// A flag's mistake, not the config's: the config may be fine.
    #[error(
        "--profile {name}: the config has no [profiles.{name}] (it has: {})",
        list_or_none(known)
    )]
    UnknownProfile { name: String, known: Vec<String> },
    #[error(transparent)]
    Start(#[from] StartError),
    /// A replayed session's line, by its number.
    #[error("line {line}: {error}")]
    Line {
        line: usize,
        error: Box<CommandError>,
    },
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// A request counted as the proxy counts it: its model, its count, and each counted item's
/// role.
struct Counted {
    model: String,
    prepared: Prepared,
    roles: Vec<String>,
    /// The body as read, and its API, for carrying a plan out on it.
    body: String,
    api: Api,
}

async fn counted_as<D: Dialect>(
    config: &Config,
    body: String,
    api: Api,
) -> Result<Counted, CommandError> {
    let request = D::parse(body.as_bytes(), D::PATH)?;
    let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = TokenCounter::new(config.tokens.unknown_model_margin);
    let mut prepared = D::count(&request, &catalog, &counter).await;
    prepared.apply_tool_policies(&D::conversation(&request), &config.context.tools);
    let roles = D::conversation(&request)
        .iter()
        .map(|m| {
            m.get("role")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    Ok(Counted {
        model: D::model(&request).to_string(),
        prepared,
        roles,
        body,
        api,
    })
}

/// The exact prompt of what the proxy forwards when it goes without a summary (trimmed): the
/// plan carried out on the body as the proxy carries it out, then counted. With `recall`,
/// cut outputs name their references and the tool is offered, as the proxy does for a
/// caller that sends no scope header.
async fn trimmed_as<D: Dialect>(
    config: &Config,
    body: &[u8],
    split: &Split,
    (settings, recall): (Settings<'_>, bool),
) -> Result<u64, CommandError> {
    let mut request = D::parse(body, D::PATH)?;
    let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = TokenCounter::new(config.tokens.unknown_model_margin);
    let encoding = catalog.resolve(D::model(&request)).encoding;
    let mut rewrite = Rewrite::trimmed(split, Duration::ZERO);
    if offers_recall::<D>(&mut request, recall) && !split.shorten.is_empty() {
        rewrite.archive = Some(ArchiveScope {
            caller: ScopeHeaders::new(&config.cache, key_headers())?.caller(&HeaderMap::new()),
            conversation: conversation_id(&D::conversation(&request), split.head),
        });
    }
    write_compaction::<D>(&mut request, split, &rewrite, settings.context, encoding);
    let (sent, _) = D::outgoing_body(request, Bytes::new(), true)?;
    let counting = Counting {
        config,
        catalog: &catalog,
        counter: &counter,
    };
    Ok(count_as_sent::<D>(counting, &sent, D::PATH, settings)
        .await?
        .total)
}

async fn trimmed_tokens(
    config: &Config,
    counted: &Counted,
    split: &Split,
    settings: (Settings<'_>, bool),
) -> Result<u64, CommandError> {
    let trim = TrimAs {
        config,
        body: counted.body.as_bytes(),
        split,
        settings,
    };
    with_dialect(counted.api, trim).await
}

/// `trimmed_as`, in the dialect `with_dialect` picks.
struct TrimAs<'a> {
    config: &'a Config,
    body: &'a [u8],
    split: &'a Split,
    /// The request's settings, and whether it offers recall.
    settings: (Settings<'a>, bool),
}

impl WithDialect for TrimAs<'_> {
    type Output = Result<u64, CommandError>;

    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output> {
        trimmed_as::<D>(self.config, self.body, self.split, self.settings)
    }
}

/// `counted_as`, in the dialect `with_dialect` picks: `api`'s.
struct CountAs<'a> {
    config: &'a Config,
    body: String,
    api: Api,
}

impl WithDialect for CountAs<'_> {
    type Output = Result<Counted, CommandError>;

    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output> {
        counted_as::<D>(self.config, self.body, self.api)
    }
}

/// The request body `input`, its model replaced by `model` when given.
fn body_with_model(input: &str, model: Option<&str>) -> Result<Value, ProxyError> {
    let mut body: Value = serde_json::from_str(input).map_err(ProxyError::InvalidJson)?;
    if let (Some(model), Some(fields)) = (model, body.as_object_mut()) {
        fields.insert("model".into(), Value::String(model.to_string()));
    }
    Ok(body)
}

/// `model`, when given, replaces the body's; `api`, when given, is the body's API.
async fn prepare(
    config: &Config,
    input: &str,
    model: Option<&str>,
    api: Option<Api>,
) -> Result<Counted, CommandError> {
    let body = body_with_model(input, model)?;
    let api = api.unwrap_or_else(|| detect_api(&body));
    let count = CountAs {
        config,
        body: body.to_string(),
        api,
    };
    with_dialect(api, count).await
}

pub async fn count(
    config: &Config,
    input: &str,
    model: Option<&str>,
    api: Option<Api>,
    as_json: bool,
) -> Result<String, CommandError> {
    let Counted {
        model, prepared, ..
    } = prepare(config, input, model, api).await?;
    if as_json {
        Ok(json!({
            "model": model,
            "encoding": prepared.info.encoding.name(),
            "prompt_tokens": prepared.count.total,
            "messages": prepared.count.per_message.len(),
        })
        .to_string()
            + "\n")
    } else {
        Ok(format!("{}\n", prepared.count.total))
    }
}

fn bar(value: u64, limit: u64) -> String {
    const WIDTH: u64 = 30;
    let filled = (value * WIDTH)
        .checked_div(limit)
        .map_or(WIDTH, |f| f.min(WIDTH));
    format!(
        "[{}{}]",
        "█".repeat(filled as usize),
        "░".repeat((WIDTH - filled) as usize)
    )
}

fn percent(value: u64, limit: u64) -> u64 {
    (value * 100).checked_div(limit).unwrap_or(0)
}

pub struct PlanOptions<'a> {
    pub model: Option<&'a str>,
    /// The body's API, when not detected.
    pub api: Option<Api>,
    pub mode: Mode,
    pub profile: Option<&'a str>,
}

/// The `[context]` and `[recall]` settings of `profile`, as `x-condenser-profile` names it.
fn settings_named(
    config: &Config,
    profile: Option<&str>,
) -> Result<(ContextConfig, RecallConfig), CommandError> {
    let unknown_profile = || CommandError::UnknownProfile {
        name: profile.unwrap_or_default().to_string(),
        known: config.profiles.keys().cloned().collect(),
    };
    let context = config.context_for(profile).ok_or_else(unknown_profile)?;
    let recall = config.recall_for(profile).ok_or_else(unknown_profile)?;
    Ok((context, recall))
}

/// What the proxy would do with the request, without calling anything.
pub async fn plan(
    config: &Config,
    input: &str,
    options: PlanOptions<'_>,
) -> Result<String, CommandError> {
    let (context, recall) = settings_named(config, options.profile)?;
    let settings = Settings {
        context: &context,
        recall,
    };
    let counted = prepare(config, input, options.model, options.api).await?;
    let Counted {
        model,
        prepared,
        roles,
        ..
    } = &counted;
    let input = prepared.plan_input(config, settings, options.mode);
    let mut out = String::new();
    write_limits(&mut out, model, prepared, &input, &context);
    let decision = prepared.decide(&input);
    let Some(split) = write_decision(&mut out, &decision) else {
        return Ok(out);
    };
    // As the proxy decides it: in a window too small for the tool beside a summary, no recall.
    let room = summary_room(
        &Limits::new(&input),
        config.summarizer.max_summary_tokens,
        recall.enabled,
    );
    write_split(&mut out, split, roles, room.summary_tokens);
    let trimmed = trimmed_tokens(config, &counted, split, (settings, room.recall)).await?;
    let _ = writeln!(
        out,
        "forwarded = {trimmed} tokens when trimmed (no summary)"
    );
    Ok(out)
}

pub struct ReplayOptions<'a> {
    /// Replaces each body's model.
    pub model: Option<&'a str>,
    /// The bodies' API, when not detected.
    pub api: Option<Api>,
    pub profile: Option<&'a str>,
}

/// What condenser would have done with a recorded session, calling nothing: `input` holds
/// one request body a line (JSON Lines, as a logging proxy records them), in the order they
/// were sent. Each goes through observe mode's steps (`observing::observe`), its would-be
/// summaries made at once between requests, as an agent's turn would let them land.
pub async fn replay(
    config: &Config,
    input: &str,
    options: ReplayOptions<'_>,
) -> Result<String, CommandError> {
    let (context, recall) = settings_named(config, options.profile)?;
    let settings = Settings {
        context: &context,
        recall,
    };
    let state = Arc::new(AppState::new(config.clone())?);
    let mut rows = Vec::new();
    let lines = input
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    for (at, line) in lines {
        let observed = replayed(&state, line, &options, settings)
            .await
            .map_err(|error| CommandError::Line {
                line: at + 1,
                error: Box::new(error),
            })?;
        state.observer.settled().await;
        rows.push(observed);
    }
    Ok(replay_table(&rows))
}

async fn replayed(
    state: &Arc<AppState>,
    line: &str,
    options: &ReplayOptions<'_>,
    settings: Settings<'_>,
) -> Result<Observed, CommandError> {
    let body = body_with_model(line, options.model)?;
    let api = options.api.unwrap_or_else(|| detect_api(&body));
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let observe = ObserveAs {
        state,
        path_model: options.model.unwrap_or(model).to_string(),
        body: Bytes::from(body.to_string()),
        settings,
    };
    Ok(with_dialect(api, observe).await?)
}

/// `observing::observe`, in the dialect `with_dialect` picks, as a caller with no scope
/// header.
struct ObserveAs<'a> {
    state: &'a Arc<AppState>,
    /// The model its path names, for an API that names it there.
    path_model: String,
    body: Bytes,
    settings: Settings<'a>,
}

impl WithDialect for ObserveAs<'_> {
    type Output = Result<Observed, ProxyError>;

    async fn with<D: Dialect + 'static>(self) -> Self::Output {
        let path = D::path_for(&self.path_model);
        observe::<D>(
            self.state,
            (self.body, &path),
            &HeaderMap::new(),
            self.settings,
        )
        .await
    }
}

/// A provider's price of a cached prompt token, against an uncached one.
const CACHED_PRICE: f64 = 0.1;

/// The prompt tokens billed for `tokens`, `cached` of them at the cached price.
fn bill(tokens: u64, cached: u64) -> f64 {
    tokens.saturating_sub(cached) as f64 + CACHED_PRICE * cached as f64
}

/// One line per request, then the session's totals against the session as sent.
fn replay_table(rows: &[Observed]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:>9}  {:>9}  {:<10}  {:>10}  {:>9}  cache break",
        "#", "sent", "forwarded", "action", "summarized", "cached"
    );
    let (mut sent, mut forwarded) = (0u64, 0u64);
    let (mut billed_as_sent, mut billed) = (0.0, 0.0);
    let mut breaks = [0usize; 3];
    for (i, row) in rows.iter().enumerate() {
        let judged = &row.judged;
        let why = match judged.cache_break {
            None if i == 0 => "(first request)",
            None => "",
            Some(cache_break) => cache_break.name(),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:>9}  {:>9}  {:<10}  {:>10}  {:>9}  {why}",
            i + 1,
            row.received_tokens,
            row.forwarded_tokens,
            row.action.name(),
            row.summarized,
            judged.cached_tokens,
        );
        sent += row.received_tokens;
        forwarded += row.forwarded_tokens;
        billed_as_sent += bill(row.received_tokens, judged.client_cached_tokens);
        billed += bill(row.forwarded_tokens, judged.cached_tokens);
        if let Some(cache_break) = judged.cache_break {
            breaks[cache_break as usize] += 1;
        }
    }
    let _ = writeln!(
        out,
        "\n{} requests. Prompt tokens billed, a cached one at {CACHED_PRICE}:",
        rows.len()
    );
    let _ = writeln!(
        out,
        "  as sent         {sent:>10} tokens, billed {billed_as_sent:>10.0}"
    );
    let _ = writeln!(
        out,
        "  with condenser  {forwarded:>10} tokens, billed {billed:>10.0} ({:.2} of as sent)",
        billed / billed_as_sent.max(1.0)
    );
    let _ = writeln!(
        out,
        "cache breaks: {} summary steps, {} cut steps, {} client changes",
        breaks[CacheBreak::SummaryStep as usize],
        breaks[CacheBreak::CutStep as usize],
        breaks[CacheBreak::ClientChange as usize],
    );
    out
}

/// The model, the prompt, and each trigger against its limit.
fn write_limits(
    out: &mut String,
    model: &str,
    prepared: &Prepared,
    input: &PlanInput,
    settings: &ContextConfig,
) {
    let limits = Limits::new(input);
    let tokens = total_tokens(input);
    let fired = triggers(input, &limits);
    let _ = writeln!(
        out,
        "model {model}: {} ({}), window {} tokens, {} usable after the response reserve",
        prepared.info.encoding.name(),
        if prepared.info.exact {
            "exact"
        } else {
            "estimate"
        },
        prepared.info.context_window,
        limits.usable
    );
    let _ = writeln!(
        out,
        "prompt {tokens} tokens in {} messages\n",
        input.messages.len()
    );
    let mut row = |name: &str, value: u64, limit: u64, on: bool| {
        if on {
            let _ = writeln!(
                out,
                "{name:<18} {} {value:>8} / {limit:<8} {:>4}%{}",
                bar(value, limit),
                percent(value, limit),
                if value > limit { "  ← over" } else { "" }
            );
        } else {
            let _ = writeln!(out, "{name:<18} off");
        }
    };
    row("precompute_ratio", tokens, limits.precompute, true);
    row("trigger_ratio", tokens, limits.trigger, true);
    row(
        "max_prompt_tokens",
        tokens,
        settings.max_prompt_tokens,
        settings.max_prompt_tokens > 0,
    );
    row(
        "max_messages",
        input.messages.len() as u64,
        settings.max_messages as u64,
        settings.max_messages > 0,
    );
    let _ = writeln!(out, "target (compacted) {} tokens", limits.target);
    if !fired.is_empty() {
        let names: Vec<&str> = fired.iter().map(|t| t.name()).collect();
        let _ = writeln!(out, "fired: {}", names.join(", "));
    }
    out.push('\n');
}

/// The planner's decision; the split, when it makes one.
fn write_decision<'d>(out: &mut String, decision: &'d Decision) -> Option<&'d Split> {
    match decision {
        Decision::Forward(reason) => {
            let _ = writeln!(out, "decision: forward unchanged ({})", reason.describe());
            None
        }
        Decision::Precompute(split) => {
            let _ = writeln!(
                out,
                "decision: forward unchanged, summarize ahead of need in the background"
            );
            Some(split)
        }
        Decision::Compact { split, .. } => {
            let _ = writeln!(out, "decision: compact");
            Some(split)
        }
        Decision::Reject {
            tokens, shortfall, ..
        } => {
            let _ = writeln!(
                out,
                "decision: reject with 400 context_length_exceeded: {tokens} prompt tokens, and {shortfall}"
            );
            None
        }
    }
}

/// What a split keeps, summarizes and shortens.
fn write_split(out: &mut String, split: &Split, roles: &[String], summary_tokens: u32) {
    if split.head > 0 {
        let _ = writeln!(
            out,
            "keep head      messages 0..{} ({})",
            split.head,
            roles[..split.head].join(", ")
        );
    }
    if let Some(task) = split.pinned_before(split.tail_start) {
        let _ = writeln!(
            out,
            "keep task      messages {}..{} (pinned before the summary)",
            task.start, task.end
        );
    }
    let _ = writeln!(
        out,
        "summarize      messages {}..{} ({} messages)",
        split.head,
        split.tail_start,
        split.summarized()
    );
    let _ = writeln!(
        out,
        "keep verbatim  messages {}..{} ({})",
        split.tail_start,
        roles.len(),
        roles[split.tail_start..].join(", ")
    );
    for cut in &split.shorten {
        let _ = writeln!(
            out,
            "shorten        message {}: tool output {} → at most {} tokens",
            cut.index, cut.tokens, cut.keep_tokens
        );
    }
    let _ = writeln!(
        out,
        "forwarded ≤ {} tokens with a summary of at most {} tokens",
        split.estimated_tokens, summary_tokens
    );
}
