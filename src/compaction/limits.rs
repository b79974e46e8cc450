//! What a request is measured against before it is planned: the planner's input, the limits
//! and tiers its tokens and items fall in, the triggers they fire, and the room a compacted
//! request keeps for its summary. Pure, as the planner is.

use crate::config::{ContextConfig, Mode};
use crate::conversation::Item;

/// What a summary message costs on top of its text: its role and the
/// `[Context summary: N earlier messages]` line.
pub const SUMMARY_FRAMING_TOKENS: u32 = 20;

/// What the plan keeps for recall on a compacted request: the tool (about 100 tokens,
/// `recall::tool_tokens`), and the line after the summary naming the archived references
/// (40 to 55, as the hex of the conversation's id falls).
pub const RECALL_RESERVE_TOKENS: u32 = 160;

/// The room a compacted request that offers recall keeps under the hard limit for one recall
/// round: the model's reply that calls the tool, carried into the continuation (some 100
/// tokens written as JSON), and an answer of a few dozen tokens with its framing
/// (`pipeline::recall`). A prompt planned up to the hard limit leaves no room to answer the
/// call, and the client then gets the reply with the call taken out: often nothing, which ends
/// an agent's turn with an empty answer (Claude Code 2.0.77 at 58 turns of 60).
pub const RECALL_ROUND_TOKENS: u64 = 256;

/// What a compacted request keeps room for besides the items it keeps: the summary's text,
/// and recall's tool and line when they are offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryRoom {
    /// The most a summary's text may take: what the summarizer is asked for.
    pub summary_tokens: u32,
    /// Recall's tool and line are offered, and room is kept for them.
    pub recall: bool,
}

impl SummaryRoom {
    /// What the plan keeps: the summary, its framing, and recall's tool and line.
    pub fn reserved(self) -> u32 {
        let recall = if self.recall {
            RECALL_RESERVE_TOKENS
        } else {
            0
        };
        self.summary_tokens + SUMMARY_FRAMING_TOKENS + recall
    }
}

/// The room a request with these limits keeps for its summary: half its target, at most
/// `max_summary_tokens`. A fixed room takes a small window whole (1,204 tokens of the 500 a
/// 1,000-token window leaves once the reserve is out); half the target leaves the other half
/// for the head, the task and the recent turns the summary makes room for. At the default
/// ratios that is a quarter of the usable window, and the cap holds from 4,096 usable tokens
/// up (an 8,192-token window with the default reserve), so larger windows plan as they always
/// did. Recall's tool and line cost 160 tokens whatever the window: they are offered
/// (`recall` on) only where that half is at least as large, so they never take more room
/// than a summary could.
///
/// The half is of the target as the window sets it, before the scale: what the summarizer is
/// asked for goes into the summary cache's keys (`Summarizer::settings_key`), which are
/// functions of bytes and settings alone, never of a learned ratio (rule 8).
pub fn summary_room(limits: &Limits, max_summary_tokens: u32, recall: bool) -> SummaryRoom {
    let half = u32::try_from(limits.window_target / 2).unwrap_or(u32::MAX);
    SummaryRoom {
        summary_tokens: max_summary_tokens.min(half),
        recall: recall && half >= RECALL_RESERVE_TOKENS,
    }
}

#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub messages: &'a [Item],
    /// Tokens outside the messages: reply priming, tools, response format.
    pub fixed_tokens: u32,
    pub context_window: u64,
    /// The request's `max_completion_tokens`/`max_tokens`, if it named one.
    pub requested_completion_tokens: Option<u64>,
    pub settings: &'a ContextConfig,
    pub mode: Mode,
    /// Room to leave for the summary message.
    pub summary_tokens: u32,
    /// What the provider counts for each of the encoding's tokens (`PromptCount::scale`):
    /// the window is measured in the encoding's tokens by it, not the items scaled.
    pub scale: f64,
    /// Whether a compacted request may offer recall (its profile's, and room for the tool
    /// beside the summary): a recent part shortened to fit must then leave a recall round's
    /// room (`Limits::with_recall_round`), as the compaction carrying it out does.
    pub recall: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Tokens,
    Messages,
    PromptTokens,
    Forced,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Tokens => "trigger_ratio",
            Trigger::Messages => "max_messages",
            Trigger::PromptTokens => "max_prompt_tokens",
            Trigger::Forced => "force",
        }
    }
}

/// The thresholds a request is measured against, in the encoding's tokens: the window and
/// the operator's caps, which are the provider's, divided by the request's scale. Counts are
/// functions of the bytes alone (`PromptCount`), so a learned ratio that moves moves only
/// these lines: it may bring the next step sooner, and never changes what a step made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Context window less the room reserved for the response.
    pub usable: u64,
    /// The operator's `max_prompt_tokens` (0: off).
    pub prompt_cap: u64,
    /// What the provider counts for each of the encoding's tokens.
    pub scale: f64,
    /// `target` as the window sets it, in the provider's tokens, before the scale.
    pub window_target: u64,
    pub trigger: u64,
    pub precompute: u64,
    /// What a compacted prompt aims under.
    pub target: u64,
    /// A compacted request aims at no more messages than this (0: no cap).
    pub message_target: usize,
    /// `max_messages` × `precompute_ratio`: from here, the next step is made ahead (0: no cap).
    pub message_precompute: usize,
}

impl Limits {
    pub fn new(input: &PlanInput) -> Limits {
        let s = input.settings;
        // A reserve as large as the window would make every prompt "too long"; upstream
        // judges such requests itself.
        let reserve = input
            .requested_completion_tokens
            .unwrap_or(s.response_reserve_tokens)
            .min(input.context_window / 2);
        let scale = if input.scale > 0.0 { input.scale } else { 1.0 };
        let encoded = |provider: u64| (provider as f64 / scale) as u64;
        let provider_usable = input.context_window.saturating_sub(reserve).max(1);
        let target_of = |usable: u64, cap: u64| {
            let target = (usable as f64 * s.target_ratio) as u64;
            match cap {
                0 => target,
                cap => target.min((cap as f64 * s.target_ratio) as u64),
            }
        };
        let usable = encoded(provider_usable).max(1);
        let prompt_cap = encoded(s.max_prompt_tokens);
        let share = |ratio: f64| (usable as f64 * ratio) as u64;
        Limits {
            usable,
            prompt_cap,
            scale,
            window_target: target_of(provider_usable, s.max_prompt_tokens),
            trigger: share(s.trigger_ratio),
            precompute: share(s.precompute_ratio),
            target: target_of(usable, prompt_cap),
            message_target: (s.max_messages as f64 * s.target_ratio) as usize,
            message_precompute: (s.max_messages as f64 * s.precompute_ratio) as usize,
        }
    }
}

/// Where a prompt stands against a request's limits, from least to most pressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Under the precompute line: nothing to prepare.
    Settled,
    /// Past the precompute line, under every trigger: the next compaction is made ahead.
    Precompute,
    /// Over the token trigger (soft), within the hard limits: it may go upstream as it is
    /// while the compaction it needs is made.
    Soft,
    /// Over a hard limit (the window less the reserve, or an operator's cap,
    /// `max_messages` or `max_prompt_tokens`): it cannot go upstream as it is.
    Hard,
}

impl Limits {
    /// The token and message triggers that a prompt of `tokens` in `items` items fires.
    pub fn fired(&self, settings: &ContextConfig, tokens: u64, items: usize) -> Vec<Trigger> {
        let mut fired = Vec::new();
        if tokens > self.trigger {
            fired.push(Trigger::Tokens);
        }
        if settings.max_messages > 0 && items > settings.max_messages {
            fired.push(Trigger::Messages);
        }
        if self.prompt_cap > 0 && tokens > self.prompt_cap {
            fired.push(Trigger::PromptTokens);
        }
        fired
    }

    /// The tier of a prompt of `tokens` in `items` items: the rule by which the planner
    /// plans, and by which compaction judges what it could forward instead.
    pub fn tier(&self, settings: &ContextConfig, tokens: u64, items: usize) -> Tier {
        let fired = self.fired(settings, tokens, items);
        if tokens > self.usable || fired.iter().any(|t| *t != Trigger::Tokens) {
            Tier::Hard
        } else if !fired.is_empty() {
            Tier::Soft
        } else if self.past_precompute(tokens, items) {
            Tier::Precompute
        } else {
            Tier::Settled
        }
    }

    /// These limits for a request that offers recall: its hard limit a recall round lower
    /// (`RECALL_ROUND_TOKENS`, at most a sixteenth of what is usable, so that a small window
    /// still has room for its summary), so that a form near the hard limit is stepped down
    /// before the model's call has no room to be answered.
    pub fn with_recall_round(self) -> Limits {
        let round = RECALL_ROUND_TOKENS.min(self.usable / 16);
        Limits {
            usable: self.usable.saturating_sub(round).max(1),
            ..self
        }
    }

    /// The most tokens a forwarded prompt may count: the window less the reserve, and the
    /// operator's `max_prompt_tokens` when set.
    pub fn hard(&self) -> u64 {
        match self.prompt_cap {
            0 => self.usable,
            cap => self.usable.min(cap),
        }
    }

    /// What is usable as the provider counts: what upstream should accept.
    pub fn provider_usable(&self) -> u64 {
        self.provider_tokens(self.usable)
    }

    /// `tokens` of the encoding's as the provider counts them: what the client is told.
    pub fn provider_tokens(&self, tokens: u64) -> u64 {
        crate::tokens::counter::scaled_tokens(tokens, self.scale)
    }

    /// Whether a prompt of `tokens` in `items` items is past a precompute line, of tokens or
    /// of messages: from there the next compaction is made ahead.
    pub fn past_precompute(&self, tokens: u64, items: usize) -> bool {
        tokens > self.precompute || (self.message_precompute > 0 && items > self.message_precompute)
    }
}
