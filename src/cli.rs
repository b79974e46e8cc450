//! The offline commands (`check-config`, `count`, `plan`, `replay`) and logging set-up. Each returns the
//! text to print; `main` prints it.

mod check;
mod input;
mod replay;
pub mod report;

use std::fmt::Write as _;
use std::future::Future;
use std::io::IsTerminal;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use serde_json::{json, Value};

use crate::compaction::cache::{PrefixKeys, ScopeHeaders};
use crate::compaction::limits::{summary_room, Limits, PlanInput};
use crate::compaction::plan::{total_tokens, triggers, Decision, Mode, Split};
use crate::compaction::rewrite::{ArchiveScope, Rewrite};
use crate::config::{Config, ContextConfig};
use crate::conversation::Item;
use crate::dialect::stages::{
    count_as_sent, offers_recall, write_compaction, Counting, Dialect, Prepared, Settings,
};
use crate::dialect::{detect_api, key_headers, with_dialect, Api, WithDialect};
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::TokenCounter;
pub use check::check_config;
use input::{body_with_model, settings_named};
pub use input::{decoded_input, load_config, CommandError};
pub use replay::{replay, Replay, ReplayOptions};

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
    (body, items): (&[u8], &[Item]),
    split: &Split,
    (settings, recall): (Settings<'_>, bool),
) -> Result<u64, CommandError> {
    let mut request = D::parse(body, D::PATH)?;
    let catalog = ModelCatalog::new(config.models.clone(), config.tokens.clone());
    let counter = TokenCounter::new(config.tokens.unknown_model_margin);
    let encoding = catalog.resolve(D::model(&request)).encoding;
    let mut rewrite = Rewrite::trimmed(split, Duration::ZERO);
    if offers_recall::<D>(&mut request, recall) && !split.shorten.is_empty() {
        rewrite.archive = Some(ArchiveScope::new(
            ScopeHeaders::new(&config.cache, key_headers())?.caller(&HeaderMap::new()),
            &PrefixKeys::default(),
            (&D::conversation(&request), items, &[]),
            split.head,
        ));
    }
    write_compaction::<D>(&mut request, split, &rewrite, settings.context, encoding);
    let (sent, _, layout) = D::outgoing_body(request, Bytes::new(), true)?;
    let counting = Counting {
        config,
        catalog: &catalog,
        counter: &counter,
    };
    Ok(
        count_as_sent::<D>(counting, (&sent, layout.as_ref()), D::PATH, settings)
            .await?
            .total,
    )
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
        items: &counted.prepared.metas,
        split,
        settings,
    };
    with_dialect(counted.api, trim).await
}

/// `trimmed_as`, in the dialect `with_dialect` picks.
struct TrimAs<'a> {
    config: &'a Config,
    body: &'a [u8],
    /// The planner's reading of its items.
    items: &'a [Item],
    split: &'a Split,
    /// The request's settings, and whether it offers recall.
    settings: (Settings<'a>, bool),
}

impl WithDialect for TrimAs<'_> {
    type Output = Result<u64, CommandError>;

    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output> {
        trimmed_as::<D>(
            self.config,
            (self.body, self.items),
            self.split,
            self.settings,
        )
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
    let limits = Limits::new(&input);
    let room = summary_room(
        &limits,
        config.summarizer.max_summary_tokens,
        recall.enabled,
    );
    write_split(&mut out, split, roles, (room.summary_tokens, &limits));
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
    let fired = triggers(input, &limits);
    // Planned in the encoding's tokens, told as the provider counts, as the window is.
    let told = |tokens: u64| limits.provider_tokens(tokens);
    let tokens = told(total_tokens(input));
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
        limits.provider_usable()
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
    row("precompute_ratio", tokens, told(limits.precompute), true);
    row("trigger_ratio", tokens, told(limits.trigger), true);
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
    let _ = writeln!(out, "target (compacted) {} tokens", told(limits.target));
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
/// The forwarded estimate is told as the provider counts, as the proxy's header is; the
/// outputs' sizes are the encoding's, which a cut is made to.
fn write_split(
    out: &mut String,
    split: &Split,
    roles: &[String],
    (summary_tokens, limits): (u32, &Limits),
) {
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
        limits.provider_tokens(split.estimated_tokens),
        summary_tokens
    );
}
