//! `condenser check-config`: the effective configuration, valid, with a warning for each
//! window too small for the settings and for a summarizer with no key, Redis's password
//! masked, and comment lines saying which APIs each upstream speaks and whose key pays for
//! summaries.

use std::path::Path;

use super::input::load_config;
use crate::compaction::limits::{summary_room, Limits, PlanInput, RECALL_RESERVE_TOKENS};
use crate::config::{speaks, Config, ConfigError, Mode, Overrides};
use crate::dialect::key_headers;

/// The configuration `path` and `overrides` make, as TOML, once it is found valid.
pub fn check_config(path: Option<&Path>, overrides: &Overrides) -> Result<String, ConfigError> {
    let mut config = load_config(path, overrides)?;
    for warning in window_warnings(&config)
        .into_iter()
        .chain(summarizer_key_warning(&config))
    {
        tracing::warn!("{warning}");
    }
    let notes: String = spoken_apis(&config)
        .into_iter()
        .chain([summarizer_key(&config)])
        .map(|note| format!("# {note}\n"))
        .collect();
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
        "# effective configuration: valid\n{notes}{}",
        config.to_toml()
    ))
}

/// Which APIs each configured upstream speaks (`config::speaks`): what a key sent to it may
/// be for.
fn spoken_apis(config: &Config) -> Vec<String> {
    let upstreams = std::iter::once((
        "upstream".to_string(),
        &config.upstream.base_url,
        &config.upstream.apis,
    ))
    .chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}]"), &route.base_url, &route.apis)),
    );
    upstreams
        .map(|(name, base_url, apis)| {
            let spoken = match (speaks(base_url, apis), apis.is_empty()) {
                (Some(spoken), true) => format!("{} (its host's)", spoken.join(", ")),
                (Some(spoken), false) => spoken.join(", "),
                (None, _) => "any API (a host of no known provider, and no apis listed)".into(),
            };
            format!("{name} {base_url} speaks: {spoken}")
        })
        .collect()
}

/// Whose key a summary carries (`Summarizer::credentials_for`).
fn summarizer_key(config: &Config) -> String {
    let summarizer = &config.summarizer;
    if !summarizer.api_key_env.is_empty() {
        return format!(
            "summarizer key: its own, from ${}; never a caller's",
            summarizer.api_key_env
        );
    }
    if !summarizer.base_url.is_empty() {
        return format!(
            "summarizer key: none ({} is a dedicated summarizer, and a caller's key never goes to one)",
            summarizer.base_url
        );
    }
    "summarizer key: the caller's, as a summary goes to the upstream the caller's request went to"
        .into()
}

/// A dedicated summarizer with no key of its own is asked with none: right for a local model
/// that takes none, and a summarizer that wants one fails every summary. Not refused, as the
/// first is a setup of its own (a model on the same host); said, as the second is a mistake.
fn summarizer_key_warning(config: &Config) -> Option<String> {
    let summarizer = &config.summarizer;
    (!summarizer.base_url.is_empty() && summarizer.api_key_env.is_empty()).then(|| {
        format!(
            "summarizer.base_url = {:?} has no summarizer.api_key_env: summaries are asked with no key, as a caller's never goes to a dedicated summarizer; name the variable that holds its key unless it takes none",
            summarizer.base_url
        )
    })
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
        scale: 1.0,
        recall: false,
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
