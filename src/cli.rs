//! The offline commands (`check-config`, `count`, `plan`) and logging set-up. Each returns the
//! text to print; `main` prints it.

use std::fmt::Write as _;
use std::future::Future;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use serde_json::{json, Value};

use crate::compaction::cache::ScopeHeaders;
use crate::compaction::compactor::{ArchiveScope, Rewrite};
use crate::compaction::plan::{
    summary_room, total_tokens, triggers, Decision, Limits, Mode, PlanInput, Split,
    RECALL_RESERVE_TOKENS,
};
use crate::compaction::recall::conversation_id;
use crate::config::{Config, ConfigError, ContextConfig, Overrides};
use crate::dialect::stages::{
    count_as_sent, offers_recall, write_compaction, Counting, Dialect, Prepared, Settings,
};
use crate::dialect::{check_apis, detect_api, summary_api_named, with_dialect, Api, WithDialect};
use crate::error::ProxyError;
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
            caller: ScopeHeaders::new(&config.cache)?.caller(&HeaderMap::new()),
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

/// `model`, when given, replaces the body's; `api`, when given, is the body's API.
async fn prepare(
    config: &Config,
    input: &str,
    model: Option<&str>,
    api: Option<Api>,
) -> Result<Counted, CommandError> {
    let mut body: Value = serde_json::from_str(input).map_err(ProxyError::InvalidJson)?;
    if let (Some(model), Some(fields)) = (model, body.as_object_mut()) {
        fields.insert("model".into(), Value::String(model.to_string()));
    }
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

/// What the proxy would do with the request, without calling anything.
pub async fn plan(
    config: &Config,
    input: &str,
    options: PlanOptions<'_>,
) -> Result<String, CommandError> {
    let unknown_profile = || CommandError::UnknownProfile {
        name: options.profile.unwrap_or_default().to_string(),
        known: config.profiles.keys().cloned().collect(),
    };
    let context = config
        .context_for(options.profile)
        .ok_or_else(unknown_profile)?;
    let recall = config
        .recall_for(options.profile)
        .ok_or_else(unknown_profile)?;
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
