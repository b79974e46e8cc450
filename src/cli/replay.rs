//! `condenser replay`: what condenser would have done with a recorded session, request by
//! request, and what the session would have been billed.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderMap;
use serde_json::Value;

use super::input::{body_with_model, settings_named, CommandError};
use super::report::{self, SessionView};
use crate::config::Config;
use crate::dialect::stages::{Dialect, Settings};
use crate::dialect::{detect_api, with_dialect, Api, WithDialect};
use crate::error::ProxyError;
use crate::pipeline::observer::CacheBreak;
use crate::pipeline::observing::observe;
use crate::pipeline::sent::sent_parts;
use crate::pipeline::sessions::Record;
use crate::pipeline::state::AppState;

pub struct ReplayOptions<'a> {
    /// Replaces each body's model.
    pub model: Option<&'a str>,
    /// The bodies' API, when not detected.
    pub api: Option<Api>,
    pub profile: Option<&'a str>,
}

/// A replayed session: the table `condenser replay` prints, and each request's record,
/// which `--html` draws.
pub struct Replay {
    pub table: String,
    /// In the file's order, each with its line number.
    pub records: Vec<(usize, Record)>,
}

impl Replay {
    /// The page `--html` writes: one chart for each session the file holds (a client's side
    /// requests interleaved with its main conversation are sessions of their own), in the
    /// order each first appears.
    pub fn html(&self, title: &str) -> String {
        let mut sessions: Vec<SessionView<'_>> = Vec::new();
        let mut keys: Vec<u64> = Vec::new();
        for (line, record) in &self.records {
            match keys.iter().position(|key| *key == record.session) {
                Some(at) => sessions[at].records.push((*line, record)),
                None => {
                    keys.push(record.session);
                    sessions.push(SessionView {
                        records: vec![(*line, record)],
                        dropped: 0,
                    });
                }
            }
        }
        report::page(title, &sessions)
    }
}

/// What condenser would have done with a recorded session, calling nothing: `input` holds
/// one request body a line (JSON Lines, as a logging proxy records them), in the order they
/// were sent. Each goes through observe mode's steps (`observing::observe`), its would-be
/// summaries made at once between requests, as an agent's turn would let them land.
pub async fn replay(
    config: &Config,
    input: &str,
    options: ReplayOptions<'_>,
) -> Result<Replay, CommandError> {
    let (context, recall) = settings_named(config, options.profile)?;
    let settings = Settings {
        context: &context,
        recall,
    };
    let state = Arc::new(AppState::new(replaying(config))?);
    let mut records = Vec::new();
    let lines = input
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    for (at, line) in lines {
        let record = replayed(&state, line, &options, settings)
            .await
            .map_err(|error| CommandError::Line {
                line: at + 1,
                error: Box::new(error),
            })?;
        state.observer.settled().await;
        records.push((at + 1, record));
    }
    Ok(Replay {
        table: replay_table(&records),
        records,
    })
}

/// `config` as replay runs it: a last route that takes every model in every API, to a host
/// nothing is sent to, so that a session of an API no configured upstream speaks (a Claude
/// Code session under the shipped configuration) is still planned as the gateway would plan
/// it. Replay calls nothing; which upstream a request would go to changes no plan.
fn replaying(config: &Config) -> Config {
    let mut config = config.clone();
    config.routes.push(crate::config::RouteConfig {
        models: vec!["*".to_string()],
        base_url: "http://replay.invalid".to_string(),
        api_key_env: String::new(),
        apis: Vec::new(),
    });
    config
}

async fn replayed(
    state: &Arc<AppState>,
    line: &str,
    options: &ReplayOptions<'_>,
    settings: Settings<'_>,
) -> Result<Record, CommandError> {
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
/// header; its record with what the model would have been sent.
struct ObserveAs<'a> {
    state: &'a Arc<AppState>,
    /// The model its path names, for an API that names it there.
    path_model: String,
    body: Bytes,
    settings: Settings<'a>,
}

impl WithDialect for ObserveAs<'_> {
    type Output = Result<Record, ProxyError>;

    async fn with<D: Dialect + 'static>(self) -> Self::Output {
        let path = D::path_for(&self.path_model);
        let observed = observe::<D>(
            self.state,
            (self.body.clone(), &path),
            &HeaderMap::new(),
            self.settings,
        )
        .await?;
        let sent = sent_parts::<D>(&self.body, &observed.forwarded);
        Ok(observed.record(sent))
    }
}

/// A provider's price of a cached prompt token, against an uncached one.
const CACHED_PRICE: f64 = 0.1;

/// The prompt tokens billed for `tokens`, `cached` of them at the cached price.
fn bill(tokens: u64, cached: u64) -> f64 {
    tokens.saturating_sub(cached) as f64 + CACHED_PRICE * cached as f64
}

/// One line per request, then the session's totals against the session as sent.
fn replay_table(rows: &[(usize, Record)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:>9}  {:>9}  {:<10}  {:>10}  {:>9}  cache break",
        "#", "sent", "forwarded", "action", "summarized", "cached"
    );
    let (mut sent, mut forwarded) = (0u64, 0u64);
    let (mut billed_as_sent, mut billed) = (0.0, 0.0);
    let mut breaks = [0usize; 3];
    for (i, (_, row)) in rows.iter().enumerate() {
        let why = match row.cache_break {
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
            row.cached_tokens,
        );
        sent += row.received_tokens;
        forwarded += row.forwarded_tokens;
        billed_as_sent += bill(row.received_tokens, row.client_cached_tokens);
        billed += bill(row.forwarded_tokens, row.cached_tokens);
        if let Some(cache_break) = row.cache_break {
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
