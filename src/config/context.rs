//! `[context]`, `[recall]` and `[profiles.NAME]`, which override them for the requests that
//! name it: when a request is compacted, how far, what of it is kept and stays recallable;
//! the mode it is handled in.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use crate::conversation::ToolCut;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryRole {
    System,
    User,
}

impl SummaryRole {
    pub fn as_str(self) -> &'static str {
        match self {
            SummaryRole::System => "system",
            SummaryRole::User => "user",
        }
    }
}

/// What condenser does with a request: `[context] mode`, a profile's, or the request's
/// `x-condenser-mode` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Compact when the plan says so.
    Auto,
    /// Forward as sent.
    Off,
    /// Compact now, whatever the size.
    Force,
    /// Forward as sent, and plan off the request's path what `auto` would have done.
    Observe,
}

impl Mode {
    pub const NAMES: &'static str = "auto, off, force or observe";

    pub fn parse(value: &str) -> Option<Mode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(Mode::Auto),
            "off" => Some(Mode::Off),
            "force" => Some(Mode::Force),
            "observe" => Some(Mode::Observe),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    Trim,
    Forward,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    pub enabled: bool,
    pub trigger_ratio: f64,
    pub target_ratio: f64,
    pub precompute_ratio: f64,
    pub keep_recent_messages: usize,
    pub max_messages: usize,
    pub max_prompt_tokens: u64,
    pub response_reserve_tokens: u64,
    pub summary_role: SummaryRole,
    pub on_failure: OnFailure,
    /// `[[context.tools]]`: how given tools' outputs may be cut, first match wins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolPolicy>,
    /// A request's mode unless its `x-condenser-mode` header names one.
    pub mode: Mode,
}

/// One `[[context.tools]]` entry: the tools it names (globs on the tool's name, `Read`,
/// `mcp__*`), and how their outputs may be cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    pub names: Vec<String>,
    pub cut: ToolCut,
}

/// How an output answering the tools `names` may be cut: by the first policy naming each;
/// `never` for any of them keeps it whole, else `first` for any cuts it first.
pub fn tool_cut(policies: &[ToolPolicy], names: &[&str]) -> ToolCut {
    let of = |name: &str| {
        policies
            .iter()
            .find(|policy| {
                policy
                    .names
                    .iter()
                    .any(|glob| wildmatch::WildMatch::new(glob).matches(name))
            })
            .map_or(ToolCut::Normal, |policy| policy.cut)
    };
    let cuts: Vec<ToolCut> = names.iter().map(|name| of(name)).collect();
    if cuts.contains(&ToolCut::Never) {
        ToolCut::Never
    } else if cuts.contains(&ToolCut::First) {
        ToolCut::First
    } else {
        ToolCut::Normal
    }
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            trigger_ratio: 0.8,
            target_ratio: 0.5,
            precompute_ratio: 0.6,
            keep_recent_messages: 6,
            max_messages: 0,
            max_prompt_tokens: 0,
            response_reserve_tokens: 4096,
            summary_role: SummaryRole::System,
            on_failure: OnFailure::Trim,
            tools: Vec::new(),
            mode: Mode::Auto,
        }
    }
}

/// `[profiles.NAME]`: any `[context]` key, overriding it for requests that name the profile.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub enabled: Option<bool>,
    pub trigger_ratio: Option<f64>,
    pub target_ratio: Option<f64>,
    pub precompute_ratio: Option<f64>,
    pub keep_recent_messages: Option<usize>,
    pub max_messages: Option<usize>,
    pub max_prompt_tokens: Option<u64>,
    pub response_reserve_tokens: Option<u64>,
    pub summary_role: Option<SummaryRole>,
    pub on_failure: Option<OnFailure>,
    pub mode: Option<Mode>,
    /// `[profiles.NAME.recall]`: any `[recall]` key, for requests that name the profile.
    pub recall: Option<RecallOverride>,
}

impl ContextConfig {
    pub fn with_profile(&self, profile: &Profile) -> ContextConfig {
        ContextConfig {
            enabled: profile.enabled.unwrap_or(self.enabled),
            trigger_ratio: profile.trigger_ratio.unwrap_or(self.trigger_ratio),
            target_ratio: profile.target_ratio.unwrap_or(self.target_ratio),
            precompute_ratio: profile.precompute_ratio.unwrap_or(self.precompute_ratio),
            keep_recent_messages: profile
                .keep_recent_messages
                .unwrap_or(self.keep_recent_messages),
            max_messages: profile.max_messages.unwrap_or(self.max_messages),
            max_prompt_tokens: profile.max_prompt_tokens.unwrap_or(self.max_prompt_tokens),
            response_reserve_tokens: profile
                .response_reserve_tokens
                .unwrap_or(self.response_reserve_tokens),
            summary_role: profile.summary_role.unwrap_or(self.summary_role),
            on_failure: profile.on_failure.unwrap_or(self.on_failure),
            tools: self.tools.clone(),
            mode: profile.mode.unwrap_or(self.mode),
        }
    }

    pub(super) fn validate(&self, section: &str) -> Result<(), ConfigError> {
        for (key, value) in [
            ("trigger_ratio", self.trigger_ratio),
            ("target_ratio", self.target_ratio),
            ("precompute_ratio", self.precompute_ratio),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ConfigError::Invalid(format!(
                    "{section}.{key} must be in (0, 1], got {value}"
                )));
            }
        }
        if self.target_ratio > self.trigger_ratio {
            return Err(ConfigError::Invalid(format!(
                "{section}.target_ratio ({}) must not exceed trigger_ratio ({})",
                self.target_ratio, self.trigger_ratio
            )));
        }
        Ok(())
    }
}

/// `[recall]`: what compaction takes out stays recallable by the model, through a tool
/// condenser offers on compacted requests and serves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecallConfig {
    pub enabled: bool,
    /// Recall rounds condenser serves within one request.
    pub max_rounds: u32,
    /// Most recalled text one call returns.
    pub max_tokens: u32,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_rounds: 3,
            max_tokens: 8192,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallOverride {
    pub enabled: Option<bool>,
    pub max_rounds: Option<u32>,
    pub max_tokens: Option<u32>,
}

impl RecallConfig {
    pub(super) fn with_override(self, profile: Option<RecallOverride>) -> RecallConfig {
        let profile = profile.unwrap_or_default();
        RecallConfig {
            enabled: profile.enabled.unwrap_or(self.enabled),
            max_rounds: profile.max_rounds.unwrap_or(self.max_rounds),
            max_tokens: profile.max_tokens.unwrap_or(self.max_tokens),
        }
    }

    pub(super) fn validate(&self, section: &str) -> Result<(), ConfigError> {
        if self.max_rounds == 0 {
            return Err(ConfigError::Invalid(format!(
                "{section}.max_rounds must be at least 1 (set enabled = false to turn recall off)"
            )));
        }
        if self.max_tokens < MIN_RECALL_TOKENS {
            return Err(ConfigError::Invalid(format!(
                "{section}.max_tokens must be at least {MIN_RECALL_TOKENS}, got {}",
                self.max_tokens
            )));
        }
        Ok(())
    }
}

/// Below this, one recalled message of an agent's session rarely fits whole.
const MIN_RECALL_TOKENS: u32 = 256;
