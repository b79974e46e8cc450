//! What every offline command reads, and how it fails: the config, checked as serving checks
//! it; a request body, its model replaced when asked; a profile's settings.

use std::path::Path;

use serde_json::Value;

use crate::config::{Config, ConfigError, ContextConfig, Overrides, RecallConfig};
use crate::dialect::{check_apis, summary_api_named};
use crate::error::ProxyError;
use crate::pipeline::state::StartError;

/// The config at `path` (see `Config::load`), its summarizer's API checked against the
/// dialects as serving checks it: every command refuses what serving would.
pub fn load_config(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let config = Config::load(path, overrides)?;
    summary_api_named(&config.summarizer.api)?;
    check_apis(&config)?;
    Ok(config)
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

/// How a zstd frame starts (RFC 8878 §3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The text of a command's input: zstd-compressed (a recorded session as
/// tests/fixtures/sessions keeps them) is decoded, whatever the file is called; anything
/// else is read as UTF-8.
pub fn decoded_input(bytes: Vec<u8>) -> Result<String, String> {
    let bytes = if bytes.starts_with(&ZSTD_MAGIC) {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(&bytes[..])
            .map_err(|e| format!("it looks zstd-compressed, and does not decode: {e}"))?;
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut decoder, &mut text)
            .map_err(|e| format!("it looks zstd-compressed, and does not decode: {e}"))?;
        text
    } else {
        bytes
    };
    String::from_utf8(bytes).map_err(|e| format!("it is not UTF-8 text: {e}"))
}

/// The request body `input`, its model replaced by `model` when given.
pub(super) fn body_with_model(input: &str, model: Option<&str>) -> Result<Value, ProxyError> {
    let mut body: Value = serde_json::from_str(input).map_err(ProxyError::InvalidJson)?;
    if let (Some(model), Some(fields)) = (model, body.as_object_mut()) {
        fields.insert("model".into(), Value::String(model.to_string()));
    }
    Ok(body)
}

/// `model`, when given, replaces the body's; `api`, when given, is the body's API.
/// The `[context]` and `[recall]` settings of `profile`, as `x-condenser-profile` names it.
pub(super) fn settings_named(
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
