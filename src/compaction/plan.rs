//! The compaction planner: given per-message token counts and the context settings, decide
//! what to keep, what to summarize and what to refuse. Pure: no I/O, no clock.

pub use crate::config::Mode;
use std::fmt;
use std::ops::Range;

use crate::compaction::horizon::{advance_horizon, cuts_before, saving, Horizon};
use crate::compaction::limits::{Limits, PlanInput, Trigger, RECALL_RESERVE_TOKENS};
use crate::compaction::shorten::{Shorten, SHORTENED_OUTPUT_TOKENS};
use crate::conversation::{head_len, task_prompt, units, Item, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardReason {
    Disabled,
    UnderTriggers,
    NothingToSummarize,
    UnpairedToolMessage,
    SeveralChoices,
    /// The conversation's history is held upstream (a Responses `previous_response_id` or
    /// `conversation`): what condenser sees is only its newest part.
    Stateful,
}

impl ForwardReason {
    pub fn describe(self) -> &'static str {
        match self {
            ForwardReason::Disabled => "compaction off for this request",
            ForwardReason::UnderTriggers => "under every trigger",
            ForwardReason::NothingToSummarize => "nothing older than the kept messages",
            ForwardReason::UnpairedToolMessage => {
                "a tool message follows no assistant tool call; forwarded as sent"
            }
            ForwardReason::SeveralChoices => "n > 1 asks for several choices; forwarded as sent",
            ForwardReason::Stateful => {
                "its history is held upstream (previous_response_id or conversation); forwarded as sent"
            }
        }
    }
}

/// `messages[..head]` kept first, `messages[head..tail_start]` summarized, the rest kept.
/// The current task's prompt, when it falls in the summarized part, is kept too, verbatim,
/// before the summary: an agent's one prompt then hundreds of tool rounds keeps
/// its task in view while the rounds are summarized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub head: usize,
    pub tail_start: usize,
    /// The current task (`conversation::task_prompt`): wherever a summary ends after it, it
    /// is kept verbatim, before the summary.
    pub task: Option<Range<usize>>,
    /// Where the next step, made ahead of need, ends: at or after `tail_start`, so that once
    /// it is used the prompt is back at the target.
    pub ahead: usize,
    /// Where a summary of the items after the head may end, in order: every unit start up to
    /// `ahead`, and `tail_start`, so that no summary splits a unit.
    pub summary_ends: Vec<usize>,
    /// The tool outputs cut: those of the middle (after `tail_start`, before `recent_start`)
    /// toward the target; and, only when the recent part alone cannot fit the hard limit,
    /// recent ones, shortened just enough, the newest last (`recent_cuts`).
    pub shorten: Vec<Shorten>,
    /// Where the recent part starts: the last `keep_recent_messages` items in whole units,
    /// and the newest round, which every forwarded request carries verbatim (rule 3).
    pub recent_start: usize,
    /// Estimated forwarded prompt with a summary of at most `summary_tokens`.
    pub estimated_tokens: u64,
}

impl Split {
    pub fn summarized(&self) -> usize {
        self.tail_start - self.head
    }

    /// The recent outputs this plan shortens: none unless the recent part alone cannot fit
    /// the hard limit.
    pub fn recent_cuts(&self) -> impl Iterator<Item = &Shorten> + '_ {
        self.shorten
            .iter()
            .filter(move |cut| cut.index >= self.recent_start)
    }

    /// How many of the recent part's items a request with `cuts`, keeping the items from
    /// `kept_from` on, does not carry verbatim: shortened, or left to the summary when not
    /// even the recent part with its outputs shortened fits. 0 but for a recent part that
    /// alone cannot fit the hard limit (rule 3); the reply says so.
    pub fn recent_altered(&self, kept_from: usize, cuts: &[Shorten]) -> usize {
        let dropped = kept_from.saturating_sub(self.recent_start);
        let pinned = self.pinned_before(kept_from).map_or(0, |task| {
            task.end.saturating_sub(task.start.max(self.recent_start))
        });
        let shortened = cuts
            .iter()
            .filter(|cut| cut.index >= self.recent_start.max(kept_from))
            .count();
        dropped.saturating_sub(pinned) + shortened
    }

    /// The task's items a rewrite keeping the items from `kept_from` on would drop: they are
    /// kept, pinned before the summary.
    pub fn pinned_before(&self, kept_from: usize) -> Option<Range<usize>> {
        self.task
            .clone()
            .filter(|task| self.head <= task.start && task.start < kept_from)
            .map(|task| task.start..task.end.min(kept_from))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Forward(ForwardReason),
    /// Forward unchanged, and summarize the split's middle in the background ahead of need.
    Precompute(Split),
    Compact {
        split: Split,
        triggers: Vec<Trigger>,
    },
    Reject {
        tokens: u64,
        limit: u64,
        /// What the smallest request that could be made of it needs.
        shortfall: Shortfall,
    },
}

/// Why a request cannot be sent, whatever is summarized: what the smallest request condenser
/// could make of it needs (the head, the task, the last turn, the summary's room), against
/// what the window leaves once the reply's reserve is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    pub window: u64,
    /// The window less the reply's reserve.
    pub usable: u64,
    /// The head and the request's parts besides its conversation (tools, reply priming).
    pub head: u64,
    /// The current task, always kept.
    pub task: u64,
    /// The last turn besides the task, its tool outputs cut as far as they may be.
    pub last_turn: u64,
    /// The room kept for the summary of the rest (and recall's tool, when offered).
    pub summary: u64,
}

impl Shortfall {
    pub fn needed(&self) -> u64 {
        self.head + self.task + self.last_turn + self.summary
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the model's context window is {} tokens, {} of them reserved for the response \
             (max_tokens, else response_reserve_tokens), which leaves {}; the smallest request \
             condenser can make of this one needs {}: {} for the head and the request's other \
             fields, {} for the task, {} for the last turn and {} kept for the summary",
            self.window,
            self.window.saturating_sub(self.usable),
            self.usable,
            self.needed(),
            self.head,
            self.task,
            self.last_turn,
            self.summary,
        )
    }
}

pub fn total_tokens(input: &PlanInput) -> u64 {
    sum(input.messages) + u64::from(input.fixed_tokens)
}

fn sum(messages: &[Item]) -> u64 {
    messages.iter().map(|m| u64::from(m.tokens)).sum()
}

pub fn triggers(input: &PlanInput, limits: &Limits) -> Vec<Trigger> {
    let mut fired = Vec::new();
    if input.mode == Mode::Force {
        fired.push(Trigger::Forced);
    }
    fired.extend(limits.fired(input.settings, total_tokens(input), input.messages.len()));
    fired
}

pub fn plan(input: &PlanInput) -> Decision {
    // Observed requests go as sent; what auto would do is planned apart, under `auto`.
    if matches!(input.mode, Mode::Off | Mode::Observe) || !input.settings.enabled {
        return Decision::Forward(ForwardReason::Disabled);
    }
    let limits = Limits::new(input);
    let fired = triggers(input, &limits);
    let tokens = total_tokens(input);
    // With no trigger fired the tier is settled unless past a precompute line: the triggers
    // are not worked out twice on every request.
    if fired.is_empty() && !limits.past_precompute(tokens, input.messages.len()) {
        return Decision::Forward(ForwardReason::UnderTriggers);
    }
    let Some(units) = units(input.messages) else {
        return Decision::Forward(ForwardReason::UnpairedToolMessage);
    };
    let split = match split(input, &limits, &units) {
        Ok(split) => split,
        Err(_) if fired.is_empty() => return Decision::Forward(ForwardReason::UnderTriggers),
        Err(shortfall) => {
            return Decision::Reject {
                tokens: limits.provider_tokens(tokens),
                limit: limits.provider_tokens(limits.usable),
                shortfall,
            }
        }
    };
    if split.summarized() == 0 && split.shorten.is_empty() {
        return Decision::Forward(if fired.is_empty() {
            ForwardReason::UnderTriggers
        } else {
            ForwardReason::NothingToSummarize
        });
    }
    if fired.is_empty() {
        return if split.summarized() > 0 {
            Decision::Precompute(split)
        } else {
            Decision::Forward(ForwardReason::UnderTriggers)
        };
    }
    Decision::Compact {
        split,
        triggers: fired,
    }
}

/// The plan's split; else, when not even the task and the last turn fit, why.
fn split(input: &PlanInput, limits: &Limits, units: &[usize]) -> Result<Split, Shortfall> {
    let splitter = Splitter::new(input, limits, units);
    let tail_start = Some(splitter.kept_within(limits.target))
        .filter(|&start| splitter.worth_a_summary(start))
        .unwrap_or(splitter.head);
    // A step made ahead, from the precompute line, covers everything before the recent part
    // (rule 3): used once the trigger fires, it lands the prompt on its head, task, summary,
    // what came since and the recent part, well under the target, so steps come seldom and
    // each rewrites little.
    let ahead = splitter.recent.max(tail_start);
    let planned = splitter.kept_from(tail_start, ahead);
    if planned.estimated_tokens <= limits.usable {
        return Ok(planned);
    }
    // The kept minimum cannot fit the window: keep only the last unit, and the task.
    let last = splitter.kept_from(units.last().copied().unwrap_or(splitter.head), ahead);
    if last.estimated_tokens <= limits.usable {
        return Ok(last);
    }
    let summary = if last.summarized() > 0 {
        splitter.summary
    } else {
        0
    };
    // Told as the provider counts, as the window is.
    let told = |tokens: u64| limits.provider_tokens(tokens);
    Err(Shortfall {
        window: input.context_window,
        usable: told(limits.usable),
        head: told(splitter.fixed),
        task: told(splitter.task_tokens),
        last_turn: told(
            last.estimated_tokens
                .saturating_sub(splitter.fixed + splitter.task_tokens + summary),
        ),
        summary: told(summary),
    })
}

/// What `split` weighs a conversation's units by: the head and the request's other parts
/// (`fixed`), the task that is always kept, and the summary's room.
struct Splitter<'a> {
    input: &'a PlanInput<'a>,
    limits: &'a Limits,
    units: &'a [usize],
    head: usize,
    fixed: u64,
    summary: u64,
    task: Option<Range<usize>>,
    task_tokens: u64,
    /// Where the recent part starts (`recent_start`).
    recent: usize,
}

impl<'a> Splitter<'a> {
    fn new(input: &'a PlanInput<'a>, limits: &'a Limits, units: &'a [usize]) -> Self {
        let messages = input.messages;
        let head = head_len(messages);
        let task = task_prompt(messages, units);
        Splitter {
            input,
            limits,
            units,
            head,
            fixed: sum(&messages[..head]) + u64::from(input.fixed_tokens),
            summary: u64::from(input.summary_tokens),
            task_tokens: task.clone().map_or(0, |task| sum(&messages[task])),
            task,
            recent: recent_start(messages, units, input.settings.keep_recent_messages),
        }
    }

    fn in_task(&self, i: usize) -> bool {
        self.task.as_ref().is_some_and(|task| task.contains(&i))
    }

    /// The tokens of `messages[from..to]` but the task's, which is always kept.
    fn span(&self, from: usize, to: usize) -> u64 {
        (from..to)
            .filter(|&i| !self.in_task(i))
            .map(|i| u64::from(self.input.messages[i].tokens))
            .sum()
    }

    /// The task's tokens before `start`: pinned when the tail starts there.
    fn pinned_tokens(&self, start: usize) -> u64 {
        self.task.clone().map_or(0, |task| {
            sum(&self.input.messages[task.start.min(start)..task.end.min(start)])
        })
    }

    /// Where the kept tail starts: the recent part, then, walking back from it, as many
    /// whole units as fit `budget` (none more when forced: force means compact now).
    fn kept_within(&self, budget: u64) -> usize {
        let grow = self.input.mode != Mode::Force;
        let n = self.input.messages.len();
        let mut tail_start = self.recent;
        let mut tail_tokens = self.span(self.recent, n);
        for &start in self
            .units
            .iter()
            .rev()
            .filter(|&&start| start < self.recent)
        {
            let unit_tokens = self.span(start, tail_start);
            let fits_tokens =
                self.fixed + self.task_tokens + self.summary + tail_tokens + unit_tokens <= budget;
            let pinned = self
                .task
                .as_ref()
                .map_or(0, |task| task.end.min(start).saturating_sub(task.start));
            let fits_count = self.limits.message_target == 0
                || self.head + pinned + 1 + (n - start) <= self.limits.message_target;
            if !(grow && fits_tokens && fits_count) {
                break;
            }
            tail_start = start;
            tail_tokens += unit_tokens;
        }
        tail_start
    }

    /// A summary that would replace no more than it costs is no step: the prompt is brought
    /// to the target by shortening instead, unless compaction is forced or counts messages.
    fn worth_a_summary(&self, start: usize) -> bool {
        self.input.mode == Mode::Force
            || self.limits.message_target > 0
            || self.span(self.head, start) > self.summary
    }

    /// Whether a summary ending before `end` replaces anything: not when all it would hold
    /// is the task, which is kept anyway.
    fn evicts(&self, end: usize) -> bool {
        (self.head..end).any(|i| !self.in_task(i))
    }

    /// Keeping everything from `start` on, the task pinned when before it, tool outputs
    /// shortened toward the target; the next step ends at `ahead` or later.
    fn kept_from(&self, start: usize, ahead: usize) -> Split {
        let head = self.head;
        let start = if self.evicts(start) { start } else { head };
        let summary_if_any = if start > head { self.summary } else { 0 };
        let ahead = ahead.max(start);
        let mut split = Split {
            head,
            tail_start: start,
            task: self.task.clone(),
            ahead,
            summary_ends: self
                .units
                .iter()
                .copied()
                .filter(|&unit| head < unit && unit <= ahead && self.evicts(unit))
                .chain((head < start).then_some(start))
                .collect::<std::collections::BTreeSet<usize>>()
                .into_iter()
                .collect(),
            shorten: Vec::new(),
            recent_start: self.recent,
            estimated_tokens: self.fixed
                + self.pinned_tokens(start)
                + summary_if_any
                + sum(&self.input.messages[start..]),
        };
        // The middle (after the summary, before the recent part) is cut toward the target;
        // the recent part stays whole unless it alone cannot fit the hard limit.
        let recent = self.recent.max(start);
        if split.estimated_tokens > self.limits.target {
            let horizon = advance_horizon(
                self.input.messages,
                Horizon::at(start),
                split.estimated_tokens,
                (self.limits.target, self.limits.hard()),
                recent,
            );
            split.shorten = cuts_before(self.input.messages, start, horizon);
            split.estimated_tokens -= saving(&split.shorten);
        }
        // With no summary, the room for recall's tool and line is not in the estimate; a
        // recent output shortened just to the hard limit must leave it, and a recall round's
        // room when the request may offer recall (the compaction carrying the plan out holds
        // it to that hard limit).
        let recall_room = if start == head {
            u64::from(RECALL_RESERVE_TOKENS)
        } else {
            0
        };
        let hard = match self.input.recall {
            true => self.limits.with_recall_round().hard(),
            false => self.limits.hard(),
        };
        if split.estimated_tokens + recall_room > hard {
            let over = split.estimated_tokens + recall_room - hard;
            let shortened = shorten_recent(self.input.messages, recent, over);
            split.estimated_tokens -= saving(&shortened);
            split.shorten.extend(shortened);
        }
        split
    }
}

/// Where the recent part of `items` starts, which every forwarded request carries verbatim
/// (rule 3): units walked from the newest until they hold the last `keep` items, the newest
/// unit always; and the newest round whole, so when the newest unit is the client's own
/// message after a tool round (a prompt typed while the agent worked), that round too.
pub fn recent_start(items: &[Item], units: &[usize], keep: usize) -> usize {
    let n = items.len();
    let mut start = n;
    for (at, &unit) in units.iter().enumerate().rev() {
        let newest_round = at + 2 == units.len()
            && !holds_output(&items[start..])
            && holds_output(&items[unit..start]);
        if !(start == n || n - start < keep || newest_round) {
            break;
        }
        start = unit;
    }
    start.min(n)
}

fn holds_output(items: &[Item]) -> bool {
    items.iter().any(|item| item.kind == Kind::ToolResult)
}

/// The recent outputs shortened, oldest first and the newest last, each by no more than it
/// must, until `over` tokens are gone (or every recent output is down to the cut size): for
/// a recent part that alone cannot fit the hard limit.
pub fn shorten_recent(items: &[Item], recent: usize, over: u64) -> Vec<Shorten> {
    let mut left = over;
    let mut cuts = Vec::new();
    for (index, item) in items.iter().enumerate().skip(recent) {
        if left == 0 {
            break;
        }
        if !item.cuttable(SHORTENED_OUTPUT_TOKENS) {
            continue;
        }
        let cut = u64::from(item.tokens - SHORTENED_OUTPUT_TOKENS).min(left);
        left -= cut;
        cuts.push(Shorten {
            index,
            tokens: item.tokens,
            keep_tokens: item.tokens - cut as u32,
        });
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::limits::{
        summary_room, SummaryRoom, RECALL_ROUND_TOKENS, SUMMARY_FRAMING_TOKENS,
    };
    use crate::compaction::shorten::CLEARED_OUTPUT_TOKENS;
    use crate::config::ContextConfig;
    use crate::conversation::Role;
    use crate::conversation::ToolCut;
    use proptest::prelude::*;

    fn msg(role: Role, tokens: u32) -> Item {
        let kind = if role == Role::Tool {
            Kind::ToolResult
        } else {
            Kind::Message
        };
        Item::new(role, kind, tokens)
    }

    fn call(tokens: u32) -> Item {
        Item::new(Role::Assistant, Kind::ToolCall, tokens)
    }

    fn settings() -> ContextConfig {
        ContextConfig {
            keep_recent_messages: 2,
            ..ContextConfig::default()
        }
    }

    fn input<'a>(messages: &'a [Item], settings: &'a ContextConfig) -> PlanInput<'a> {
        PlanInput {
            messages,
            fixed_tokens: 3,
            context_window: 10_000,
            requested_completion_tokens: Some(0),
            settings,
            mode: Mode::Auto,
            summary_tokens: 500,
            scale: 1.0,
            recall: false,
        }
    }

    /// system + `turns` × (user, assistant), each message `each` tokens.
    fn chat(turns: usize, each: u32) -> Vec<Item> {
        let mut m = vec![msg(Role::System, 100)];
        for _ in 0..turns {
            m.push(msg(Role::User, each));
            m.push(msg(Role::Assistant, each));
        }
        m
    }

    #[test]
    fn under_every_trigger_forwards() {
        let s = settings();
        let m = chat(5, 100);
        assert_eq!(
            plan(&input(&m, &s)),
            Decision::Forward(ForwardReason::UnderTriggers)
        );
    }

    #[test]
    fn token_trigger_compacts_keeping_head_and_tail() {
        let s = settings();
        let m = chat(50, 100); // 10_103 tokens > 0.8 × 10_000
        let Decision::Compact { split, triggers } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(triggers, vec![Trigger::Tokens]);
        assert_eq!(split.head, 1);
        assert!(m.len() - split.tail_start >= 2);
        // The tail grows to the target (0.5 × 10_000) but not beyond it.
        assert!(split.estimated_tokens <= 5_000, "{split:?}");
        assert!(split.estimated_tokens + 100 > 5_000, "{split:?}");
    }

    #[test]
    fn reserve_comes_from_the_request_or_the_default() {
        let s = settings();
        let m = chat(10, 100);
        let mut i = input(&m, &s);
        i.requested_completion_tokens = None;
        assert_eq!(Limits::new(&i).usable, 10_000 - 4096);
        i.requested_completion_tokens = Some(7_000);
        assert_eq!(
            Limits::new(&i).usable,
            5_000,
            "the reserve is at most half the window"
        );
        assert!(matches!(plan(&i), Decision::Forward(_)));
        i.requested_completion_tokens = Some(20_000);
        assert_eq!(Limits::new(&i).usable, 5_000);
        let m = chat(25, 100);
        let mut i = input(&m, &s);
        i.requested_completion_tokens = Some(4_000);
        assert_eq!(Limits::new(&i).usable, 6_000);
        assert!(matches!(plan(&i), Decision::Compact { .. }));
    }

    #[test]
    fn message_trigger_and_prompt_token_trigger() {
        let s = ContextConfig {
            max_messages: 10,
            ..settings()
        };
        let m = chat(6, 10);
        let Decision::Compact { split, triggers } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(triggers, vec![Trigger::Messages]);
        assert!(split.head + 1 + (m.len() - split.tail_start) <= 5);

        let s = ContextConfig {
            max_prompt_tokens: 1_000,
            ..settings()
        };
        let m = chat(6, 100);
        let Decision::Compact { split, triggers } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(triggers, vec![Trigger::PromptTokens]);
        assert_eq!(split.tail_start, m.len() - 2);
    }

    #[test]
    fn profiles_change_the_decision() {
        let base = settings();
        let research = base.with_profile(&crate::config::Profile {
            max_messages: Some(4),
            ..Default::default()
        });
        let m = chat(3, 10);
        assert!(matches!(plan(&input(&m, &base)), Decision::Forward(_)));
        assert!(matches!(
            plan(&input(&m, &research)),
            Decision::Compact { .. }
        ));
        let off = base.with_profile(&crate::config::Profile {
            enabled: Some(false),
            ..Default::default()
        });
        let m = chat(50, 100);
        assert_eq!(
            plan(&input(&m, &off)),
            Decision::Forward(ForwardReason::Disabled)
        );
    }

    #[test]
    fn modes() {
        let s = settings();
        let m = chat(5, 100);
        let mut i = input(&m, &s);
        i.mode = Mode::Force;
        let Decision::Compact { triggers, .. } = plan(&i) else {
            panic!("force compacts");
        };
        assert_eq!(triggers, vec![Trigger::Forced]);
        let m = chat(50, 100);
        let mut i = input(&m, &s);
        i.mode = Mode::Off;
        assert_eq!(plan(&i), Decision::Forward(ForwardReason::Disabled));
    }

    #[test]
    fn precompute_band_plans_without_compacting() {
        let s = settings();
        let m = chat(33, 100); // 6_703 tokens: above 0.6, under 0.8
        let Decision::Precompute(split) = plan(&input(&m, &s)) else {
            panic!("expected precompute");
        };
        assert!(split.summarized() > 0);
    }

    #[test]
    fn force_on_a_short_chat_has_nothing_to_summarize() {
        let s = ContextConfig {
            keep_recent_messages: 6,
            ..settings()
        };
        let m = chat(2, 10);
        let mut i = input(&m, &s);
        i.mode = Mode::Force;
        assert_eq!(
            plan(&i),
            Decision::Forward(ForwardReason::NothingToSummarize)
        );
    }

    #[test]
    fn the_newest_output_stays_whole_while_the_recent_part_fits() {
        let s = settings();
        let mut m = chat(20, 100);
        m.push(msg(Role::User, 50));
        m.push(call(50));
        m.push(msg(Role::Tool, 9_000));
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert!(split.shorten.is_empty(), "{split:?}");
        assert_eq!(split.recent_start, m.len() - 2, "the call and its output");
        assert!(split.tail_start <= split.recent_start);
        // Over the target, which the recent part alone passes, but within the hard limit.
        assert!(split.estimated_tokens > 5_000, "{split:?}");
        assert!(split.estimated_tokens <= 10_000, "{split:?}");
    }

    #[test]
    fn a_recent_part_over_the_hard_limit_is_shortened_just_enough_the_newest_last() {
        let s = ContextConfig {
            keep_recent_messages: 4,
            ..settings()
        };
        let mut m = agent(10, 100);
        m.push(call(50));
        m.push(msg(Role::Tool, 6_000));
        m.push(call(50));
        m.push(msg(Role::Tool, 6_000));
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        let n = m.len();
        assert_eq!(split.recent_start, n - 4);
        assert!(split.estimated_tokens <= 10_000, "{split:?}");
        // The older recent output gives what is needed, and the newest stays whole.
        let recent: Vec<&Shorten> = split.recent_cuts().collect();
        assert_eq!(recent.len(), 1, "{split:?}");
        assert_eq!(recent[0].index, n - 3);
        assert_eq!(split.estimated_tokens, 10_000, "no more than it must");
        assert_eq!(split.recent_altered(split.tail_start, &split.shorten), 1);
        // When the older one's all is not enough, the newest gives the rest.
        m[n - 1].tokens = 9_000;
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        let recent: Vec<&Shorten> = split.recent_cuts().collect();
        assert_eq!(recent.len(), 2, "{split:?}");
        assert_eq!(recent[0].keep_tokens, SHORTENED_OUTPUT_TOKENS);
        assert_eq!((recent[1].index, recent[1].keep_tokens), (n - 1, 9_000 - 9));
        assert_eq!(split.estimated_tokens, 10_000, "{split:?}");
        assert_eq!(split.recent_altered(split.tail_start, &split.shorten), 2);
        // A single recent output that fits is left whole.
        let mut m = agent(10, 100);
        m.push(call(50));
        m.push(msg(Role::Tool, 7_000));
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(split.recent_cuts().count(), 0, "{split:?}");
        assert_eq!(split.recent_altered(split.tail_start, &split.shorten), 0);
    }

    #[test]
    fn a_recent_part_shortened_where_recall_may_be_offered_leaves_a_recall_rounds_room() {
        let s = ContextConfig {
            keep_recent_messages: 4,
            ..settings()
        };
        let mut m = agent(10, 100);
        for _ in 0..2 {
            m.push(call(50));
            m.push(msg(Role::Tool, 6_000));
        }
        let without = input(&m, &s);
        let with = PlanInput {
            recall: true,
            ..input(&m, &s)
        };
        let shortened_to = |input: &PlanInput| {
            let Decision::Compact { split, .. } = plan(input) else {
                panic!("expected compaction");
            };
            assert_eq!(split.recent_cuts().count(), 1, "{split:?}");
            split.estimated_tokens
        };
        let round = Limits::new(&without).usable - Limits::new(&without).with_recall_round().usable;
        assert_eq!(round, RECALL_ROUND_TOKENS);
        assert_eq!(shortened_to(&with), shortened_to(&without) - round);
    }

    #[test]
    fn the_recent_part_holds_keep_recent_items_in_whole_rounds_and_the_newest_round() {
        let m = agent(5, 100); // system, task, then (call, output) × 5
        let units = units(&m).unwrap_or_default();
        assert_eq!(recent_start(&m, &units, 0), m.len() - 2, "the newest unit");
        assert_eq!(recent_start(&m, &units, 3), m.len() - 4, "whole rounds");
        assert_eq!(recent_start(&m, &units, 4), m.len() - 4);
        // A prompt typed after a tool round: the round stays with it.
        let mut m = agent(5, 100);
        m.push(msg(Role::User, 20));
        let units = conversation_units(&m);
        assert_eq!(recent_start(&m, &units, 1), m.len() - 3);
        // Parallel calls answered together are one round.
        let mut m = agent(2, 100);
        m.extend([call(10), call(10), msg(Role::Tool, 5), msg(Role::Tool, 5)]);
        let units = conversation_units(&m);
        assert_eq!(recent_start(&m, &units, 2), m.len() - 4);
    }

    fn conversation_units(m: &[Item]) -> Vec<usize> {
        units(m).unwrap_or_default()
    }

    #[test]
    fn a_tool_never_cut_keeps_its_outputs_whole_and_one_cut_first_goes_first() {
        let output = |tokens, cut| Item {
            cut,
            ..msg(Role::Tool, tokens)
        };
        let mut m = vec![msg(Role::System, 100), msg(Role::User, 50)];
        for cut in [
            ToolCut::Normal,
            ToolCut::Never,
            ToolCut::Normal,
            ToolCut::First,
        ] {
            m.push(call(30));
            m.push(output(1_500, cut));
        }
        let floor = m.len();
        let never = 5;
        let first = 9;
        // Cutting one output is enough: the one cut first goes, though it is the newest.
        let horizon = advance_horizon(&m, Horizon::at(2), 6_000, (5_000, 0), floor);
        let cut: Vec<usize> = cuts_before(&m, 2, horizon)
            .iter()
            .map(|c| c.index)
            .collect();
        assert_eq!(cut, vec![first]);
        // Cutting everything it may: every output but the one never cut.
        let horizon = advance_horizon(&m, Horizon::at(2), 6_000, (0, 0), floor);
        let cut: Vec<usize> = cuts_before(&m, 2, horizon)
            .iter()
            .map(|c| c.index)
            .collect();
        assert_eq!(cut, vec![3, 7, first]);
        assert!(!cut.contains(&never));
        // A later step moves the horizon on from where it was, the first cut kept.
        let step = advance_horizon(&m, Horizon::at(2), 6_000, (5_000, 0), floor);
        let later = advance_horizon(&m, step, 6_000 - 1_244, (4_000, 0), floor);
        assert_eq!(later.first, step.first);
        let cut: Vec<usize> = cuts_before(&m, 2, later).iter().map(|c| c.index).collect();
        assert_eq!(cut, vec![3, first]);
        // Nor is a recent output of a tool never cut shortened when the recent part alone
        // is over the hard limit.
        let recent = shorten_recent(&m, 2, 10_000);
        assert!(recent.iter().all(|c| c.index != never));
    }

    #[test]
    fn outputs_are_cleared_only_when_cutting_them_all_is_not_enough() {
        let mut m = vec![msg(Role::System, 100), msg(Role::User, 50)];
        for _ in 0..4 {
            m.push(call(30));
            m.push(msg(Role::Tool, 1_000));
        }
        let floor = m.len();
        let total: u64 = m.iter().map(|i| u64::from(i.tokens)).sum();
        // Cutting two of them reaches the budget: nothing cleared.
        let horizon = advance_horizon(&m, Horizon::at(2), total, (total - 1_400, 0), floor);
        assert_eq!(horizon.cleared, 2);
        let cuts = cuts_before(&m, 2, horizon);
        assert_eq!(cuts.len(), 2);
        // All four cut leaves 4 × 256: the oldest are cleared until the budget is met.
        let budget = total - 4 * 744 - 300;
        let horizon = advance_horizon(&m, Horizon::at(2), total, (budget, 0), floor);
        let cuts = cuts_before(&m, 2, horizon);
        let kept: Vec<u32> = cuts.iter().map(|c| c.keep_tokens).collect();
        assert_eq!(kept, vec![128, 128, 128, 256]);
        assert!(total - saving(&cuts) <= budget);
        // Under the hard limit once all are cut, none is cleared, whatever the budget.
        let under_hard = advance_horizon(&m, Horizon::at(2), total, (budget, total), floor);
        assert_eq!(under_hard.cleared, 2);
        // A later step goes on from there, and what was cleared stays so.
        let later = advance_horizon(&m, horizon, total - saving(&cuts), (0, 0), floor);
        assert!(cuts_before(&m, 2, later)
            .iter()
            .all(|c| c.keep_tokens == CLEARED_OUTPUT_TOKENS));
        // Small outputs are never worth clearing.
        let mut small = m.clone();
        small
            .iter_mut()
            .filter(|i| i.kind == Kind::ToolResult)
            .for_each(|i| i.tokens = 100);
        let horizon = advance_horizon(&small, Horizon::at(2), total, (0, 0), floor);
        assert!(cuts_before(&small, 2, horizon).is_empty());
    }

    #[test]
    fn cuts_reach_the_middle_only() {
        let s = ContextConfig {
            keep_recent_messages: 6,
            ..settings()
        };
        // A large head (a third of what is usable), then rounds of 1,700-token outputs: the
        // middle is cut toward the target, the last three rounds never.
        let mut m = vec![msg(Role::System, 3_300), msg(Role::User, 50)];
        for _ in 0..3 {
            m.push(call(30));
            m.push(msg(Role::Tool, 1_700));
        }
        let floor = m.len() - 6;
        let items = m.clone();
        let horizon = advance_horizon(&items, Horizon::at(2), 9_000, (0, 0), floor);
        assert_eq!(horizon.reach(), floor, "no further than the recent part");
        assert!(cuts_before(&items, 2, horizon)
            .iter()
            .all(|c| c.index < floor));
        m.push(call(30));
        m.push(msg(Role::Tool, 1_700));
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(split.recent_start, m.len() - 6);
        assert!(
            split.shorten.iter().all(|c| c.index < split.recent_start),
            "{split:?}"
        );
        assert!(split.estimated_tokens <= 10_000, "{split:?}");
    }

    #[test]
    fn a_last_message_larger_than_the_window_is_rejected_naming_what_does_not_fit() {
        let s = settings();
        let mut m = chat(3, 100);
        m.push(msg(Role::User, 20_000));
        let Decision::Reject {
            limit: 10_000,
            shortfall,
            ..
        } = plan(&input(&m, &s))
        else {
            panic!("expected a rejection");
        };
        assert_eq!(
            shortfall,
            Shortfall {
                window: 10_000,
                usable: 10_000,
                head: 103,
                task: 20_000,
                last_turn: 0,
                summary: 500,
            }
        );
        let said = shortfall.to_string();
        assert!(
            said.contains("window is 10000 tokens, 0 of them reserved")
                && said.contains("needs 20603: 103 for the head")
                && said.contains("20000 for the task"),
            "{said}"
        );
    }

    #[test]
    fn a_learned_scale_lowers_the_lines_and_leaves_the_summarys_room_as_the_window_sets_it() {
        let s = settings();
        let m = chat(3, 100);
        let exact = Limits::new(&input(&m, &s));
        let scaled = Limits::new(&PlanInput {
            scale: 1.35,
            ..input(&m, &s)
        });
        assert_eq!(scaled.usable, (exact.usable as f64 / 1.35) as u64);
        assert!(scaled.trigger < exact.trigger && scaled.target < exact.target);
        assert!(scaled.provider_usable().abs_diff(exact.usable) <= 2);
        // The room is in the summary cache's keys: it moves with the window, never the ratio.
        assert_eq!(
            summary_room(&exact, 5_000, true),
            summary_room(&scaled, 5_000, true)
        );
    }

    #[test]
    fn a_request_that_offers_recall_keeps_a_rounds_room_a_small_one_a_sixteenth() {
        let limits = |usable| Limits {
            usable,
            trigger: usable * 3 / 4,
            precompute: usable / 2,
            target: usable / 2,
            message_target: 0,
            message_precompute: 0,
            prompt_cap: 0,
            scale: 1.0,
            window_target: usable / 2,
        };
        let large = limits(48_000).with_recall_round();
        assert_eq!(large.usable, 48_000 - RECALL_ROUND_TOKENS);
        assert_eq!((large.target, large.trigger), (24_000, 36_000));
        assert_eq!(limits(1_024).with_recall_round().usable, 1_024 - 64);
    }

    #[test]
    fn the_summary_room_is_half_the_target_at_most_max_summary_tokens() {
        let s = ContextConfig::default();
        let m = chat(1, 10);
        let room = |window: u64| {
            let mut i = input(&m, &s);
            i.context_window = window;
            i.requested_completion_tokens = None;
            summary_room(&Limits::new(&i), 1024, true)
        };
        // 1,000 tokens: 500 usable once the reserve (at most half) is out, a target of 250.
        let room_of = |summary_tokens, recall| SummaryRoom {
            summary_tokens,
            recall,
        };
        assert_eq!(
            room(1_000),
            room_of(125, false),
            "no room for recall's tool"
        );
        assert_eq!(room(2_048), room_of(256, true));
        assert_eq!(room(4_096), room_of(512, true));
        assert_eq!(room(8_192), room_of(1024, true), "the cap, from here on");
        assert_eq!(room(128_000), room_of(1024, true));
        assert_eq!(room(1_000).reserved(), 125 + SUMMARY_FRAMING_TOKENS);
        assert_eq!(
            room(4_096).reserved(),
            512 + SUMMARY_FRAMING_TOKENS + RECALL_RESERVE_TOKENS
        );
        let m = chat(1, 10);
        let mut off = input(&m, &s);
        off.context_window = 128_000;
        assert!(!summary_room(&Limits::new(&off), 1024, false).recall);
    }

    #[test]
    fn keep_recent_is_dropped_before_rejecting() {
        let s = ContextConfig {
            keep_recent_messages: 4,
            ..settings()
        };
        let mut m = chat(3, 100);
        m.push(msg(Role::Assistant, 9_000));
        m.push(msg(Role::User, 500));
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(split.tail_start, m.len() - 1);
    }

    /// system, one task prompt, then `rounds` tool rounds (a call, its output of `output`
    /// tokens): the shape of an agent's session.
    fn agent(rounds: usize, output: u32) -> Vec<Item> {
        let mut m = vec![msg(Role::System, 100), msg(Role::User, 50)];
        for _ in 0..rounds {
            m.push(call(30));
            m.push(msg(Role::Tool, output));
        }
        m
    }

    #[test]
    fn an_agents_tool_rounds_are_summarized_with_its_task_pinned() {
        let s = settings();
        let m = agent(40, 200); // 9_350 tokens, over the trigger
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(split.task, Some(1..2));
        assert_eq!(split.pinned_before(split.tail_start), Some(1..2));
        assert!(
            split.tail_start > 2,
            "tool rounds are summarized: {split:?}"
        );
        assert!(split.shorten.is_empty(), "a summary, not cut outputs");
        assert!(split.estimated_tokens <= 5_000, "{split:?}");
        assert!(
            split.summary_ends.iter().all(|&end| end > 2),
            "no summary holds only the task: {split:?}"
        );
        // From the precompute line, the step is made ahead, as for a chat.
        let m = agent(28, 200); // 6_550 tokens
        let Decision::Precompute(split) = plan(&input(&m, &s)) else {
            panic!("expected a step made ahead");
        };
        assert!(split.summarized() > 1, "{split:?}");
        // Forced, the task still stays.
        let mut i = input(&m, &s);
        i.mode = Mode::Force;
        let Decision::Compact { split, .. } = plan(&i) else {
            panic!("expected compaction");
        };
        assert_eq!(split.pinned_before(split.tail_start), Some(1..2));
        assert_eq!(m.len() - split.tail_start, 2, "only what keep_recent asks");
    }

    /// Claude Code sends its environment as a `system` turn right after the task: it is
    /// part of the task, kept with it.
    #[test]
    fn system_turns_after_the_task_are_pinned_with_it() {
        let s = settings();
        let mut m = agent(40, 200);
        m.insert(2, msg(Role::System, 300));
        m.remove(0);
        let Decision::Compact { split, .. } = plan(&input(&m, &s)) else {
            panic!("expected compaction");
        };
        assert_eq!(split.head, 0);
        assert_eq!(split.task, Some(0..2));
        assert_eq!(split.pinned_before(split.tail_start), Some(0..2));
        assert_eq!(
            split.pinned_before(1),
            Some(0..1),
            "only what a rewrite would drop"
        );
        assert!(split.summary_ends.iter().all(|&end| end > 2), "{split:?}");
    }

    #[test]
    fn a_task_too_large_for_the_window_is_rejected() {
        let s = settings();
        let mut m = agent(10, 200);
        m[1].tokens = 10_500;
        assert!(matches!(
            plan(&input(&m, &s)),
            Decision::Reject { limit: 10_000, .. }
        ));
    }

    #[test]
    fn a_summary_that_saves_nothing_is_not_planned() {
        let s = settings();
        // Over the target by less than a summary costs: the middle's outputs are cut instead.
        let mut m = agent(3, 100);
        m.push(call(30));
        m.push(msg(Role::Tool, 3_900));
        m.push(call(30));
        m.push(msg(Role::Tool, 3_900));
        let mut large_summary = input(&m, &s);
        large_summary.summary_tokens = 5_000;
        let Decision::Compact { split, .. } = plan(&large_summary) else {
            panic!("expected compaction");
        };
        assert_eq!(split.tail_start, split.head, "{split:?}");
        assert_eq!(split.shorten.len(), 1, "{split:?}");
        assert_eq!(
            split.shorten[0].index,
            m.len() - 3,
            "the middle's, not the newest"
        );
        assert!(split.estimated_tokens <= 5_000, "{split:?}");
        // When the only large output is the newest, nothing may be cut: it goes as sent.
        let mut m = agent(3, 100);
        m.push(call(30));
        m.push(msg(Role::Tool, 7_900));
        assert_eq!(
            plan(&input(&m, &s)),
            Decision::Forward(ForwardReason::NothingToSummarize)
        );
    }

    #[test]
    fn a_tool_message_without_a_call_is_not_understood() {
        let s = settings();
        let mut m = chat(50, 100);
        m.insert(3, msg(Role::Tool, 10));
        assert_eq!(
            plan(&input(&m, &s)),
            Decision::Forward(ForwardReason::UnpairedToolMessage)
        );
    }

    fn arb_conversation() -> impl Strategy<Value = Vec<Item>> {
        let unit = prop_oneof![
            (1u32..3000).prop_map(|t| vec![msg(Role::User, t)]),
            (1u32..3000).prop_map(|t| vec![msg(Role::Assistant, t)]),
            (1u32..500, proptest::collection::vec(1u32..4000, 1..4)).prop_map(|(c, outs)| {
                let mut u = vec![call(c)];
                u.extend(outs.into_iter().map(|t| msg(Role::Tool, t)));
                u
            }),
        ];
        (0usize..3, proptest::collection::vec(unit, 1..40)).prop_map(|(heads, units)| {
            let mut m = vec![msg(Role::System, 50); heads];
            m.extend(units.into_iter().flatten());
            m
        })
    }

    proptest! {
        #[test]
        fn no_tool_message_is_ever_split_from_its_call(
            m in arb_conversation(),
            keep in 0usize..8,
            window in 2_000u64..60_000,
            force in any::<bool>(),
        ) {
            let s = ContextConfig { keep_recent_messages: keep, ..ContextConfig::default() };
            let mut i = input(&m, &s);
            i.context_window = window;
            i.requested_completion_tokens = None;
            if force { i.mode = Mode::Force; }
            let limits = Limits::new(&i);
            match plan(&i) {
                Decision::Compact { split, .. } | Decision::Precompute(split) => {
                    let head = head_len(&m);
                    prop_assert_eq!(split.head, head);
                    prop_assert!(split.tail_start > head || !split.shorten.is_empty());
                    prop_assert!(split.tail_start < m.len());
                    // The first kept message is never a tool answer, so no call lost its results
                    // and no result lost its call.
                    prop_assert!(m[split.tail_start].role != Role::Tool);
                    // The last message is always kept.
                    prop_assert!(split.tail_start < m.len());
                    prop_assert!(split.estimated_tokens <= limits.usable);
                    // A step made ahead ends no earlier than the plan's, and keeps the last
                    // message; every place a summary may end starts a unit, so none splits one.
                    prop_assert!(split.tail_start <= split.ahead && split.ahead < m.len());
                    // It covers everything before the recent part (rule 3), and no more: it
                    // ends where a unit starts, so a tool answer is never apart from its call.
                    prop_assert_eq!(split.ahead, split.recent_start.max(split.tail_start));
                    prop_assert!(m[split.ahead].role != Role::Tool);
                    prop_assert!(split.summary_ends.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(split.tail_start == head || split.summary_ends.contains(&split.tail_start));
                    for &end in &split.summary_ends {
                        prop_assert!(head < end && end <= split.ahead);
                        prop_assert!(m[end].role != Role::Tool);
                    }
                    for s in &split.shorten {
                        prop_assert!(s.index >= split.tail_start);
                        prop_assert!(m[s.index].role == Role::Tool);
                        prop_assert!(s.keep_tokens >= SHORTENED_OUTPUT_TOKENS);
                        if s.index < split.recent_start {
                            prop_assert_eq!(s.keep_tokens, SHORTENED_OUTPUT_TOKENS);
                        }
                    }
                }
                Decision::Reject { tokens, limit, shortfall } => {
                    prop_assert_eq!(shortfall.usable, limit);
                    prop_assert!(shortfall.needed() > limit);
                    prop_assert_eq!(limit, limits.usable);
                    prop_assert!(tokens > limit);
                }
                Decision::Forward(_) => {}
            }
        }
    }

    /// An agent's session: a head (system prompt and tools) of `head` tokens, the task, then
    /// tool rounds (a call, one or two outputs), now and then a prompt of the user's.
    fn arb_agent_session(window: u64) -> impl Strategy<Value = (Vec<Item>, u32)> {
        let round = prop_oneof![
            8 => (10u32..200, proptest::collection::vec(10u32..5_000, 1..3)).prop_map(|(c, outs)| {
                let mut u = vec![call(c)];
                u.extend(outs.into_iter().map(|t| msg(Role::Tool, t)));
                u
            }),
            1 => (1u32..400).prop_map(|t| vec![msg(Role::User, t)]),
        ];
        let head = (window / 100) as u32..(window * 45 / 100) as u32;
        (head, proptest::collection::vec(round, 1..150)).prop_map(|(head, rounds)| {
            let mut m = vec![msg(Role::System, head), msg(Role::User, 60)];
            m.extend(rounds.into_iter().flatten());
            (m, head)
        })
    }

    /// Where the recent part starts, worked out apart from the planner: the last `keep`
    /// items, back to the call their first output answers, the newest unit at least, and the
    /// newest round when the client's own message follows it.
    fn expected_recent(m: &[Item], keep: usize) -> usize {
        let n = m.len();
        let mut start = n.saturating_sub(keep.max(1)).max(head_len(m));
        while start > 0
            && (m[start].kind == Kind::ToolResult || m[start - 1].kind == Kind::ToolCall)
        {
            start -= 1;
        }
        if start == n - 1
            && m[start].kind == Kind::Message
            && start > 0
            && m[start - 1].kind == Kind::ToolResult
        {
            start -= 1;
            while m[start].kind != Kind::ToolCall {
                start -= 1;
            }
        }
        start
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Rule 3 over random agent sessions: every plan keeps the recent part verbatim, or
        /// shortens a recent output only when the recent part alone is over the hard limit,
        /// and then says so; cuts otherwise touch only the middle.
        #[test]
        fn every_plan_keeps_the_recent_part_verbatim(
            (window, (m, _head)) in (4_000u64..200_000).prop_flat_map(|w| (Just(w), arb_agent_session(w))),
            keep in 0usize..10,
            reserve in 0u64..40_000,
            force in any::<bool>(),
        ) {
            let s = ContextConfig { keep_recent_messages: keep, ..ContextConfig::default() };
            let mut i = input(&m, &s);
            i.context_window = window;
            i.requested_completion_tokens = Some(reserve);
            let limits = Limits::new(&i);
            i.summary_tokens = summary_room(&limits, 1024, true).reserved();
            if force { i.mode = Mode::Force; }
            let recent = expected_recent(&m, keep);
            match plan(&i) {
                Decision::Compact { split, .. } | Decision::Precompute(split) => {
                    prop_assert_eq!(split.recent_start, recent);
                    prop_assert!(split.estimated_tokens <= limits.usable, "{:?}", split);
                    // What the recent part alone needs: the head, the task, the summary's
                    // room, and the recent items whole.
                    let task = task_prompt(&m, &conversation_units(&m)).unwrap_or(1..2);
                    let pinned = task.start.min(recent)..task.end.min(recent);
                    let alone = u64::from(i.fixed_tokens)
                        + sum(&m[..1])
                        + sum(&m[pinned])
                        + u64::from(i.summary_tokens)
                        + sum(&m[recent..]);
                    let altered = split.recent_altered(split.tail_start, &split.shorten);
                    let recent_cut = split.recent_cuts().count();
                    if alone <= limits.usable {
                        prop_assert_eq!(altered, 0, "{:?}", split);
                        prop_assert_eq!(recent_cut, 0);
                        prop_assert!(split.tail_start <= recent);
                    } else {
                        prop_assert!(altered > 0 || split.estimated_tokens + u64::from(i.summary_tokens) >= alone, "{:?}", split);
                    }
                    prop_assert_eq!(altered > 0, recent_cut > 0 || split.tail_start > recent);
                    for cut in &split.shorten {
                        prop_assert!(cut.index >= split.tail_start);
                        if cut.index < recent {
                            prop_assert!(matches!(cut.keep_tokens, SHORTENED_OUTPUT_TOKENS | CLEARED_OUTPUT_TOKENS));
                        }
                    }
                    // The newest output goes last: a recent output is shortened only when
                    // every older recent one is down to the cut size.
                    let cut_at: Vec<usize> = split.recent_cuts().map(|c| c.index).collect();
                    if let Some(&last) = cut_at.last() {
                        for (index, item) in m.iter().enumerate().take(last).skip(recent.max(split.tail_start)) {
                            if item.kind == Kind::ToolResult && item.tokens > SHORTENED_OUTPUT_TOKENS {
                                let cut = split.shorten.iter().find(|c| c.index == index);
                                prop_assert_eq!(cut.map(|c| c.keep_tokens), Some(SHORTENED_OUTPUT_TOKENS));
                            }
                        }
                    }
                }
                Decision::Reject { shortfall, .. } => {
                    prop_assert!(shortfall.needed() > limits.usable);
                }
                Decision::Forward(_) => {}
            }
        }
    }
}
