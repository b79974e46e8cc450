//! The forms a request can go in, and the choice of one from what its conversation has on
//! hand: a summary cached or being made, and the cut horizons earlier rewrites recorded.
//! Pure: what to make, the compactor starts; what went, it records.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, Shared};

use crate::compaction::horizon::{advance_horizon, cuts_before, saving, Horizon, StandInRecord};
use crate::compaction::limits::{Tier, SUMMARY_FRAMING_TOKENS};
use crate::compaction::pace::Pace;
use crate::compaction::recall;
use crate::compaction::rewrite::{
    as_sent, Action, ArchiveScope, CacheOutcome, CompactionJob, Rewrite,
};
use crate::compaction::shorten::Shorten;
use crate::compaction::stand_in::{stand_in, WHOLE_MESSAGE_TOKENS};
use crate::compaction::summary::Summary;
use crate::conversation::{Item, Kind, Role};
use crate::error::SummarizeError;
use crate::tokens::rules::count_text;

/// A summary being made, which every request that needs it awaits.
pub(super) type SharedSummary = Shared<BoxFuture<'static, Result<Arc<Summary>, SummarizeError>>>;

/// What this request's conversation already has: summaries cached at its candidate ends,
/// and a summary being made for one of them.
pub(super) struct OnHand {
    /// By end, shortest first.
    pub(super) cached: Vec<(usize, Arc<Summary>)>,
    /// The latest-ending summary being made (ahead of need, or for another request).
    pub(super) pending: Option<(usize, SharedSummary)>,
    /// The cut horizons earlier rewrites of this conversation recorded, by where their kept
    /// part starts (a cached summary's end, or the head), each checked against this
    /// request's items.
    pub(super) horizons: HashMap<usize, Horizon>,
    /// The cut horizon of the latest kept part on record, which a step made now keeps.
    pub(super) carried: Option<Horizon>,
    /// The stand-in the conversation went with, as recorded, and its text.
    pub(super) stand_in: Option<(StandInRecord, Arc<Summary>)>,
    /// How the conversation's summaries have kept up with it.
    pub(super) pace: Pace,
}

impl OnHand {
    pub(super) fn exact(&self, end: usize) -> Option<Arc<Summary>> {
        self.cached
            .iter()
            .find(|(e, _)| *e == end)
            .map(|(_, s)| s.clone())
    }

    /// The latest-ending cached summary before `end`, which a summary up to `end` extends.
    pub(super) fn longest_before(&self, end: usize) -> Option<(usize, Arc<Summary>)> {
        self.cached.iter().rev().find(|(e, _)| *e < end).cloned()
    }
}

/// A way the request can go: the items from `end` on kept after `summary` (of the items
/// `head..end`), or from the head with no summary; the kept tool outputs before `horizon`
/// cut; and where that stands against the request's limits.
#[derive(Clone)]
pub(super) struct Form {
    pub(super) end: usize,
    pub(super) summary: Option<Arc<Summary>>,
    pub(super) horizon: Horizon,
    /// Its estimated prompt, and where that stands.
    tokens: u64,
    pub(super) tier: Tier,
    /// For a stand-in: where its fold starts (the end of the model's summary it extends, or
    /// the head).
    folded_from: Option<usize>,
}

/// A request and what its conversation has on hand.
#[derive(Clone, Copy)]
pub(super) struct On<'a, 'r> {
    pub(super) job: &'a CompactionJob<'r>,
    pub(super) on_hand: &'a OnHand,
    /// Where the conversation's items are archived: the line after a summary names them,
    /// when the request offers recall.
    pub(super) archive: &'a ArchiveScope,
    /// The identifiers ledger's budget, in a stand-in as in a model's summary.
    pub(super) ledger_tokens: u32,
}

impl Form {
    pub(super) fn at(
        on: On<'_, '_>,
        summary: Option<Arc<Summary>>,
        end: usize,
        horizon: Horizon,
    ) -> Form {
        let job = on.job;
        // No horizon reaches into the recent part, whatever an earlier request recorded
        // (rule 3: a client that resends fewer items, or keeps fewer recent ones, gets them
        // whole).
        let horizon = horizon.within(job.split.recent_start.max(end));
        let (tokens, messages) = estimate(on, summary.as_deref(), end, horizon);
        Form {
            end,
            summary,
            horizon,
            tokens,
            tier: job.limits.tier(job.settings, tokens, messages),
            folded_from: None,
        }
    }

    /// With the horizon the conversation recorded for this kept part, if any: what the
    /// request before it sent.
    fn recorded(on: On<'_, '_>, summary: Option<Arc<Summary>>, end: usize) -> Option<Form> {
        let horizon = *on.on_hand.horizons.get(&end)?;
        Some(Form::at(on, summary, end, horizon))
    }

    /// The stand-in the conversation went with, with its horizon, if any.
    fn recorded_stand_in(on: On<'_, '_>) -> Option<Form> {
        let (record, summary) = on.on_hand.stand_in.as_ref()?;
        let form = Form::at(on, Some(summary.clone()), record.end, record.horizon);
        Some(Form {
            folded_from: Some(record.from),
            ..form
        })
    }

    /// Whether its summary is a stand-in.
    pub(super) fn stands_in(&self) -> bool {
        self.summary
            .as_ref()
            .is_some_and(|summary| summary.stand_in)
    }

    /// What a stand-in form records: where its fold started, where it ends, its horizon.
    pub(super) fn stand_in_record(&self) -> Option<StandInRecord> {
        Some(StandInRecord {
            from: self.folded_from?,
            end: self.end,
            horizon: self.horizon,
        })
    }

    /// Taken up now for the first time: the middle's outputs cut, oldest first (`stepped`).
    /// What was cut before stays cut (rule 8: nothing cut is restored), from the conversation's
    /// latest recorded horizon on.
    pub(super) fn fresh(on: On<'_, '_>, summary: Option<Arc<Summary>>, end: usize) -> Form {
        let start = Horizon::at(end);
        let carried = on.on_hand.carried.map_or(start, |cut| Horizon {
            all: cut.all.max(end),
            first: cut.first.max(end),
            cleared: cut.cleared.max(end),
        });
        Form::at(on, summary, end, carried).stepped(on)
    }

    /// Its horizon moved on, in one step, past every output of the middle: the step lands
    /// at its floor (head, task, summary, the middle's calls with their outputs cut, the
    /// recent part whole), under the target whenever the recent part allows. A step is a
    /// cache break from the summary on whatever it cuts, and the prompts after it are
    /// billed from where it lands: landing at the target, the current Claude Code's session
    /// billed 0.587 of the session sent whole (0.654 at the instant pace); at the floor,
    /// 0.482 (0.553), with every step's input there and the findings 3 of 3 (issue 40,
    /// `tests/it/agent_clients.rs`). Cut outputs stay recallable.
    fn stepped(self, on: On<'_, '_>) -> Form {
        let job = on.job;
        let horizon = advance_horizon(
            job.items,
            self.horizon,
            self.tokens,
            (0, job.limits.hard()),
            job.split.recent_start,
        );
        Form {
            folded_from: self.folded_from,
            ..Form::at(on, self.summary, self.end, horizon)
        }
    }

    /// Whether this form's prompt is at or under the target (and so under every trigger).
    fn reaches_the_target(&self, on: On<'_, '_>) -> bool {
        self.tier <= Tier::Precompute && self.tokens <= on.job.limits.target
    }

    fn cuts(&self, job: &CompactionJob<'_>) -> Vec<Shorten> {
        form_cuts(job, self.end, self.horizon)
    }
}

/// The outputs a form keeping the items from `end` on cuts: those of the middle before
/// `horizon`, and the recent ones the plan shortens only when the recent part alone cannot
/// fit the hard limit.
fn form_cuts(job: &CompactionJob<'_>, end: usize, horizon: Horizon) -> Vec<Shorten> {
    let mut cuts = cuts_before(job.items, end, horizon);
    cuts.extend(
        job.split
            .recent_cuts()
            .filter(|cut| cut.index >= end)
            .copied(),
    );
    cuts
}

/// Estimated prompt, and message count, of a request forwarded with `summary` (ending before
/// message `end`) and everything after it (the task pinned), the outputs before `horizon`
/// cut; or, with no summary, whole but for those cuts.
fn estimate(
    on: On<'_, '_>,
    summary: Option<&Summary>,
    end: usize,
    horizon: Horizon,
) -> (u64, usize) {
    let job = on.job;
    let cuts = saving(&form_cuts(job, end, horizon));
    let items = job.count.per_message.len();
    let Some(summary) = summary else {
        let tool = if job.recall && cuts > 0 {
            u64::from(recall::tool_tokens(job.info.encoding))
        } else {
            0
        };
        return (job.count.raw_total + tool - cuts, items);
    };
    let pinned = job.split.pinned_before(end).unwrap_or_default();
    let head: u64 = job.count.per_message[..job.split.head]
        .iter()
        .chain(&job.count.per_message[pinned.clone()])
        .map(|&t| u64::from(t))
        .sum();
    let rest: u64 = job.count.per_message[end..]
        .iter()
        .map(|&t| u64::from(t))
        .sum();
    let tokens = head
        + u64::from(summary.tokens)
        + u64::from(SUMMARY_FRAMING_TOKENS)
        + recall_tokens(job, &on.archive.conversation, end)
        + rest
        + u64::from(job.count.fixed)
        - cuts;
    (tokens, job.split.head + pinned.len() + 1 + items - end)
}

/// What recall adds to a request forwarded with a summary ending before `end`: the tool,
/// and the line naming the summarized items' references, counted as written.
fn recall_tokens(job: &CompactionJob<'_>, conversation: &str, end: usize) -> u64 {
    if !job.recall {
        return 0;
    }
    let note = recall::archived_note(conversation, job.split.head..end, "messages");
    let encoding = job.info.encoding;
    u64::from(recall::tool_tokens(encoding) + count_text(encoding, &note))
}

/// How the request may go now, with what is on hand, if anything fits the hard limit; no
/// request waits while something does (rule 10). What the request before it sent stays
/// (rule 8): the form in use is the latest kept part with a recorded cut horizon (a stand-in
/// one among them), and it goes unchanged while it keeps the prompt under every trigger.
/// Past the precompute line the next step is made ahead, and before it when the session's
/// pace says that made a request later it would come too late (`Pace::summary_due`). Over
/// the trigger the next step is taken when one on hand brings the prompt down to the target
/// in one step (`Form::stepped`: to its floor); else, while the plan's summary is made, the
/// form in use cuts the middle's tool outputs in one step when that brings the prompt down
/// to the target (D16), and when it does not, the oldest middle rounds are folded into a
/// stand-in, in one step down to the target (`folded`).
/// Over the hard limit, with no step on hand that fits, the form in use cuts the middle's
/// whole tool outputs, in one step, or folds into a stand-in. Either way the model's summary
/// takes over at the next trigger.
pub(super) fn without_waiting(on: On<'_, '_>) -> Choice {
    let make = Cell::new(None);
    let went = chosen(on, &make);
    Choice {
        went,
        make: make.get(),
    }
}

/// What a request that need not wait goes with, and the summary the compactor starts
/// meanwhile: made for `make`, extending the longest on hand that ends before it.
pub(super) struct Choice {
    pub(super) went: Option<(Form, CacheOutcome, Found)>,
    pub(super) make: Option<usize>,
}

/// How a compacted request found the form it went with (`condenser_forms_total`): the form
/// in use, kept; a step to a model's summary; the form in use with more outputs cut; a
/// stand-in folded; or nothing on record, the request as sent. `Stepped` near the request
/// rate means the form in use is not found from one request to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Kept,
    Stepped,
    Cut,
    StandIn,
    AsSent,
}

impl Found {
    pub const ALL: [Found; 5] = [
        Found::Kept,
        Found::Stepped,
        Found::Cut,
        Found::StandIn,
        Found::AsSent,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Found::Kept => "kept",
            Found::Stepped => "stepped",
            Found::Cut => "cut",
            Found::StandIn => "stand_in",
            Found::AsSent => "as_sent",
        }
    }
}

/// The form `without_waiting` chooses, the end of the summary to make set in `to_make`.
fn chosen(on: On<'_, '_>, to_make: &Cell<Option<usize>>) -> Option<(Form, CacheOutcome, Found)> {
    let (job, on_hand) = (on.job, on.on_hand);
    let split = job.split;
    // The summary to make for `end`, extending the longest on hand that ends before it;
    // unless one is being made already, whose end the conversation has not yet outgrown:
    // a step started on every turn would never be used.
    let make = |end: usize| {
        if end > split.head && on_hand.exact(end).is_none() && on_hand.pending.is_none() {
            to_make.set(Some(end));
        }
    };
    // Past the precompute line, counted on what is forwarded, the next step is made unless
    // one on hand or in the making would take over: a summary that ends later but would
    // itself leave the prompt past the line covers too little, and is extended. Under the
    // line it is made when the session's pace says that, started a request later, it would
    // come with no request to spare before the hard limit (`Pace::summary_due`).
    let hard = job.limits.hard();
    let make_ahead_from = |form: &Form| {
        let ready = on_hand
            .pending
            .as_ref()
            .is_some_and(|(end, _)| *end > form.end)
            || on_hand.cached.iter().any(|(end, summary)| {
                *end > form.end
                    && Form::fresh(on, Some(summary.clone()), *end).tier < Tier::Precompute
            });
        let due = match form.tier {
            Tier::Precompute => true,
            Tier::Settled => on_hand.pace.summary_due(form.tokens, hard),
            Tier::Soft | Tier::Hard => false,
        };
        if due && !ready {
            make(split.ahead);
        }
    };
    // The latest kept part on record; a stand-in only where it ends later than the model's
    // summary on record, which replaces it at the same end.
    let summarized = on_hand
        .cached
        .iter()
        .rev()
        .find_map(|(end, summary)| Form::recorded(on, Some(summary.clone()), *end));
    let in_use = match (summarized, Form::recorded_stand_in(on)) {
        (Some(summarized), Some(stand_in)) if stand_in.end > summarized.end => Some(stand_in),
        (summarized, stand_in) => summarized.or(stand_in),
    }
    .or_else(|| Form::recorded(on, None, split.head));
    if let Some(form) = in_use.as_ref().filter(|form| form.tier <= Tier::Precompute) {
        make_ahead_from(form);
        return Some((form.clone(), CacheOutcome::Hit, Found::Kept));
    }
    // The next steps on hand: the model's summaries ending after the one in use (or where a
    // stand-in in use ends), shortest first, each with its outputs cut afresh.
    let after = in_use.as_ref().map(|form| (form.end, form.stands_in()));
    let steps: Vec<Form> = on_hand
        .cached
        .iter()
        .filter(|(end, _)| {
            after.is_none_or(|(after, stand_in)| *end > after || (stand_in && *end == after))
        })
        .map(|(end, summary)| Form::fresh(on, Some(summary.clone()), *end))
        .collect();
    if let Some(step) = steps.iter().find(|form| form.tier <= Tier::Precompute) {
        make_ahead_from(step);
        return Some((step.clone(), CacheOutcome::Hit, Found::Stepped));
    }
    let kept = if in_use.is_some() {
        Found::Kept
    } else {
        Found::AsSent
    };
    let as_sent = Form::at(on, None, split.head, Horizon::at(split.head));
    let current = in_use.unwrap_or(as_sent);
    if current.tier < Tier::Hard {
        make(split.tail_start);
        if current.tier < Tier::Soft {
            return Some((current, CacheOutcome::Stale, kept));
        }
        // Over the trigger with the summary still being made: the middle's outputs cut now,
        // in one step, when that brings the prompt down to the target, rather than the
        // prompt going on past the trigger to the hard limit while the summarizer catches
        // up (D16); when it does not, the oldest middle rounds folded into a stand-in, in
        // one step down to the target (rule 10). A cut that lands short of the target would
        // leave the summary's step due a few turns on: two breaks where one would do.
        let cut = current.clone().stepped(on);
        if cut.reaches_the_target(on) {
            return Some((cut, CacheOutcome::Stale, Found::Cut));
        }
        return Some(match folded(on, &current) {
            Some(stand_in) => (stand_in, CacheOutcome::Stale, Found::StandIn),
            None => (current, CacheOutcome::Stale, kept),
        });
    }
    // Over the hard limit: the longest step on hand that fits; else the form in use with
    // more of its outputs cut, or a stand-in folded, whichever lands on the target; else the
    // first of them that fits. A cut that only fits leaves the next step due a turn or two
    // on (Gemini CLI at the instant pace, its older outputs masked and the stand-in's record
    // with them: a cut from 56k to 54k, then another, against a target of 28k).
    make(split.tail_start);
    if let Some(step) = steps.into_iter().rev().find(|form| form.tier < Tier::Hard) {
        return Some((step, CacheOutcome::Stale, Found::Stepped));
    }
    let cut = current.clone().stepped(on);
    if cut.reaches_the_target(on) {
        return Some((cut, CacheOutcome::Stale, Found::Cut));
    }
    if let Some(stand_in) = folded(on, &current).filter(|form| form.tier < Tier::Hard) {
        return Some((stand_in, CacheOutcome::Stale, Found::StandIn));
    }
    (cut.tier < Tier::Hard).then_some((cut, CacheOutcome::Stale, Found::Cut))
}

/// Whether a stand-in may fold `items[index]`: an agent's round (its calls, their outputs,
/// its reasoning and its own words), or a message short enough to be written whole
/// (`stand_in::WHOLE_MESSAGE_TOKENS`) inside the agent's loop, after a tool's output and
/// before the agent's next call: a reminder the client adds ("The user hasn't heard from you
/// in a while"), a prompt queued while the agent worked. A person's turns the model answered
/// in words, and a chat's history, wait for the model's summary, which says what they
/// meant; their first words would not. Before, a reminder Claude Code had added stopped
/// every stand-in after it, and the next steps over the hard limit could only cut, landing
/// far above the target (2 avoidable breaks in 112 requests at the instant pace).
fn foldable(items: &[Item], index: usize) -> bool {
    let item = &items[index];
    match item.kind {
        Kind::ToolCall | Kind::ToolResult | Kind::Reasoning => true,
        Kind::Message if item.role == Role::Assistant => true,
        Kind::Message => {
            let after_an_output = index
                .checked_sub(1)
                .is_some_and(|before| items[before].kind == Kind::ToolResult);
            let call_follows = items
                .get(index + 1)
                .is_some_and(|next| matches!(next.kind, Kind::ToolCall | Kind::Reasoning));
            item.tokens <= WHOLE_MESSAGE_TOKENS && after_an_output && call_follows
        }
        Kind::Other => false,
    }
}

/// The oldest middle rounds folded into a stand-in (`stand_in`), in one step: at the first
/// summary end where the prompt, its middle's outputs cut, reaches the target, else at the
/// last before the recent part. A stand-in extends a model's summary: the latest on hand
/// that leaves rounds to fold, else the one in use, else it starts at the head; one in use
/// is written afresh. The model's summary takes over from a stand-in at the next step with
/// the rounds it does not reach folded behind it: a summarizer slower than the session
/// never reaches where a stand-in written from the head has got to, and its summaries would
/// go unused while the stand-in grows a line a round (Claude Code 2.0.77 at the instant
/// pace: a step every second request). None when there is nothing to fold, or folding
/// lowers nothing.
fn folded(on: On<'_, '_>, current: &Form) -> Option<Form> {
    let in_use = current
        .summary
        .clone()
        .filter(|summary| !summary.stand_in)
        .map(|summary| (current.end, summary));
    let since = in_use.as_ref().map_or(on.job.split.head, |(end, _)| *end);
    let latest = on
        .on_hand
        .cached
        .iter()
        .rev()
        .find(|(end, summary)| !summary.stand_in && *end > since)
        .cloned();
    [latest, in_use, None]
        .into_iter()
        .filter_map(|base| folded_after(on, current, base))
        .next()
        .filter(|form| form.tokens < current.tokens)
}

/// The oldest middle rounds after `base` (a model's summary and its end; None: the head)
/// folded into a stand-in extending it, in one step (`folded`). None when no round after
/// `base` can be folded past `current`'s end.
fn folded_after(
    on: On<'_, '_>,
    current: &Form,
    base: Option<(usize, Arc<Summary>)>,
) -> Option<Form> {
    let job = on.job;
    let split = job.split;
    let from = base.as_ref().map_or(split.head, |(end, _)| *end);
    let pinned = split.pinned_before(split.recent_start).unwrap_or_default();
    let rounds_end = (from..split.recent_start)
        .find(|&index| !pinned.contains(&index) && !foldable(job.items, index))
        .unwrap_or(split.recent_start);
    // Past what `current` keeps; or as far, a stand-in in use written again behind a later
    // model's summary.
    let rebased = current.stands_in() && current.folded_from != Some(from);
    let ends: Vec<usize> = split
        .summary_ends
        .iter()
        .copied()
        .filter(|&end| end > current.end || (rebased && end == current.end))
        .filter(|&end| end > from && end <= rounds_end)
        .collect();
    let fold = |end: usize| {
        let summary = stand_in(
            job.messages,
            (split.head, from..end),
            split.pinned_before(end),
            base.as_ref().map(|(_, summary)| &**summary),
            (
                &on.archive.conversation,
                job.info.encoding,
                on.ledger_tokens,
            ),
        );
        Form {
            folded_from: Some(from),
            ..Form::fresh(on, Some(Arc::new(summary)), end)
        }
    };
    // The first end that reaches the target, found by halves: the prompt falls as the fold
    // grows (each round's line is a small part of the round), and each fold is written and
    // counted whole.
    let reaching = ends.partition_point(|&end| !fold(end).reaches_the_target(on));
    let end = *ends.get(reaching).or(ends.last())?;
    Some(fold(end))
}

/// The rewrite a form makes: with its summary, or cut only, or as sent when it changes
/// nothing (the cache outcome then says the request went as it came: `deferred`).
pub(super) fn went(on: On<'_, '_>, form: Form, cache: CacheOutcome, waited: Duration) -> Rewrite {
    let job = on.job;
    let cuts = form.cuts(job);
    let Some(summary) = form.summary else {
        // No summary on hand yet: the request went without one while it is made.
        let cache = if cache == CacheOutcome::Stale {
            CacheOutcome::Deferred
        } else {
            cache
        };
        if cuts.is_empty() {
            return as_sent(cache, waited);
        }
        return Rewrite {
            summary: None,
            kept_from: job.split.head,
            pinned: None,
            cuts,
            action: Action::Trimmed,
            cache,
            summarized: 0,
            waited,
            archive: None,
        };
    };
    Rewrite {
        summary: Some(summary),
        kept_from: form.end,
        pinned: job.split.pinned_before(form.end),
        cuts,
        action: Action::Summarized,
        cache,
        summarized: form.end - job.split.head,
        waited,
        archive: job.recall.then(|| on.archive.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::limits::Limits;
    use crate::compaction::plan::{Mode, Split};
    use crate::config::{Config, ContextConfig};
    use crate::conversation::{Item, Kind, Role, Views};
    use crate::tokens::catalog::{ModelCatalog, ModelInfo};
    use crate::tokens::counter::PromptCount;
    use crate::transport::upstream::{Connections, Upstream};
    use hyper::header::HeaderMap;
    use serde_json::{json, Value};

    /// A conversation of six items of 100 tokens (the system prompt its head) but a tool
    /// output of 1,000 at index 3, its request's other parts counting 10; planned to keep the
    /// items from 3 on after a summary, the last one recent.
    struct Fixture {
        messages: Views<'static>,
        count: PromptCount,
        items: Vec<Item>,
        split: Split,
        info: ModelInfo,
        upstream: Arc<Upstream>,
        headers: HeaderMap,
        settings: ContextConfig,
    }

    fn fixture() -> Fixture {
        let tokens = [100, 100, 100, 1_000, 100, 100];
        let items: Vec<Item> = tokens
            .iter()
            .enumerate()
            .map(|(i, &tokens)| match i {
                0 => Item::new(Role::System, Kind::Message, tokens),
                3 => Item::new(Role::Tool, Kind::ToolResult, tokens),
                _ => Item::new(Role::User, Kind::Message, tokens),
            })
            .collect();
        let config = Config::default();
        let failures = crate::observe::metrics::UpstreamFailures::new().unwrap();
        let connections = Connections::new(&config, failures, crate::dialect::key_headers());
        let upstream = Upstream::new(
            "http://127.0.0.1:9",
            "",
            Duration::from_secs(1),
            &connections,
        );
        Fixture {
            messages: Views::made(
                (0..6)
                    .map(|i| json!({"role": "user", "content": i}))
                    .collect::<Vec<Value>>(),
            ),
            count: PromptCount {
                per_message: tokens.to_vec(),
                fixed: 10,
                total: 1_510,
                raw_total: 1_510,
                scale: 1.0,
            },
            items,
            split: Split {
                head: 1,
                tail_start: 3,
                task: None,
                ahead: 3,
                summary_ends: vec![3],
                shorten: Vec::new(),
                recent_start: 5,
                estimated_tokens: 0,
            },
            info: ModelCatalog::new(Default::default(), Default::default()).resolve("gpt-4o"),
            upstream: Arc::new(upstream.unwrap()),
            headers: HeaderMap::new(),
            settings: ContextConfig::default(),
        }
    }

    /// Limits by which the whole conversation (1,510) is over the trigger, within the hard
    /// limit; and a summary of 50 tokens at 3 (1,380) brings it down past the precompute line
    /// only.
    fn limits() -> Limits {
        Limits {
            usable: 10_000,
            trigger: 1_400,
            precompute: 1_000,
            target: 900,
            message_target: 0,
            message_precompute: 0,
            prompt_cap: 0,
            scale: 1.0,
            window_target: 900,
        }
    }

    fn job(f: &Fixture, recall: bool) -> CompactionJob<'_> {
        CompactionJob {
            identities: &[],
            messages: &f.messages,
            count: &f.count,
            items: &f.items,
            split: &f.split,
            model: "gpt-4o",
            info: &f.info,
            upstream: &f.upstream,
            headers: &f.headers,
            api: crate::dialect::named("chat").unwrap().summary,
            settings: &f.settings,
            mode: Mode::Auto,
            limits: limits(),
            recall,
        }
    }

    fn summary(tokens: u32) -> Arc<Summary> {
        Arc::new(Summary {
            text: "s".into(),
            tokens,
            messages: 2,
            model: "m".into(),
            created_at: 0,
            stand_in: false,
        })
    }

    fn on<'a, 'r>(
        job: &'a CompactionJob<'r>,
        on_hand: &'a OnHand,
        archive: &'a ArchiveScope,
    ) -> On<'a, 'r> {
        On {
            job,
            on_hand,
            archive,
            ledger_tokens: 200,
        }
    }

    fn on_hand(cached: Vec<(usize, Arc<Summary>)>) -> OnHand {
        OnHand {
            cached,
            pending: None,
            horizons: HashMap::new(),
            carried: None,
            stand_in: None,
            pace: Pace::default(),
        }
    }

    fn archive() -> ArchiveScope {
        ArchiveScope {
            caller: [0; 32],
            conversation: "c0ffee".into(),
            bindings: Default::default(),
        }
    }

    #[test]
    fn an_estimate_with_a_summary_counts_head_summary_framing_and_kept_less_cuts() {
        let f = fixture();
        let job = job(&f, false);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let on = on(&job, &hand, &archive);
        let framing = u64::from(SUMMARY_FRAMING_TOKENS);
        // Head 100, summary 50, the kept 1,200 and the other parts 10; the system prompt,
        // the summary and three kept items.
        assert_eq!(
            estimate(on, Some(&summary(50)), 3, Horizon::at(3)),
            (100 + 50 + framing + 1_200 + 10, 5)
        );
        // The output at 3 cut to the cut size.
        let cut = Horizon {
            all: 4,
            first: 4,
            cleared: 3,
        };
        assert_eq!(
            estimate(on, Some(&summary(50)), 3, cut).0,
            100 + 50 + framing + 1_200 + 10 - u64::from(1_000 - SHORTENED_OUTPUT)
        );
        // With no summary: the whole count less the cuts.
        assert_eq!(
            estimate(on, None, 1, cut),
            (1_510 - u64::from(1_000 - SHORTENED_OUTPUT), 6)
        );
    }

    const SHORTENED_OUTPUT: u32 = crate::compaction::shorten::SHORTENED_OUTPUT_TOKENS;

    #[test]
    fn recall_adds_its_tool_and_line_to_a_summarized_form_only_when_offered() {
        let f = fixture();
        assert_eq!(recall_tokens(&job(&f, false), "c0ffee", 3), 0);
        let with = recall_tokens(&job(&f, true), "c0ffee", 3);
        assert!(with > u64::from(recall::tool_tokens(f.info.encoding)));
        let hand = on_hand(Vec::new());
        let archive = archive();
        let (off, on) = (job(&f, false), job(&f, true));
        let estimate_of = |job| {
            let on = On {
                job,
                on_hand: &hand,
                archive: &archive,
                ledger_tokens: 200,
            };
            estimate(on, Some(&summary(50)), 3, Horizon::at(3)).0
        };
        assert_eq!(estimate_of(&on) - estimate_of(&off), with);
    }

    #[test]
    fn a_forms_tier_is_where_its_estimate_stands_against_the_limits() {
        let f = fixture();
        let job = job(&f, false);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let on = on(&job, &hand, &archive);
        assert_eq!(Form::at(on, None, 1, Horizon::at(1)).tier, Tier::Soft);
        assert_eq!(
            Form::at(on, Some(summary(50)), 3, Horizon::at(3)).tier,
            Tier::Precompute
        );
        // Taken up fresh, the middle's outputs are cut.
        let fresh = Form::fresh(on, Some(summary(50)), 3);
        assert_eq!(fresh.horizon.all, 4);
        assert_eq!(fresh.tier, Tier::Settled);
        assert_eq!(fresh.cuts(&job).len(), 1);
    }

    #[test]
    fn a_step_cuts_every_output_of_the_middle_though_fewer_would_reach_the_target() {
        let mut f = fixture();
        // A second output in the middle, 300 tokens: cutting the first alone (1,000) already
        // brings the step under the target (900).
        f.items[4] = Item::new(Role::Tool, Kind::ToolResult, 300);
        f.count.per_message[4] = 300;
        let job = job(&f, false);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let on = on(&job, &hand, &archive);
        let fresh = Form::fresh(on, Some(summary(50)), 3);
        let cut: Vec<usize> = fresh.cuts(&job).iter().map(|cut| cut.index).collect();
        assert_eq!(cut, [3, 4], "the middle's outputs cut");
        assert_eq!(fresh.horizon.all, 5);
        // The recent part (from 5) stays whole.
        assert_eq!(fresh.tier, Tier::Settled);
    }

    #[test]
    fn a_step_on_hand_goes_at_once_and_nothing_more_is_made() {
        let f = fixture();
        let job = job(&f, false);
        let hand = on_hand(vec![(3, summary(50))]);
        let archive = archive();
        let on = on(&job, &hand, &archive);
        let choice = without_waiting(on);
        let (form, cache, _) = choice.went.expect("a form");
        assert_eq!((form.end, cache), (3, CacheOutcome::Hit));
        assert_eq!(choice.make, None);
        let rewrite = went(on, form, cache, Duration::ZERO);
        assert_eq!(rewrite.action, Action::Summarized);
        assert_eq!((rewrite.kept_from, rewrite.summarized), (3, 2));
        // Recall is not offered: nothing is named archived.
        assert_eq!(rewrite.archive, None);
    }

    #[test]
    fn a_step_under_the_precompute_line_starts_the_next_summary_when_the_pace_says_it_is_due() {
        let mut f = fixture();
        // Items 3 and 4 may be summarized once the step at 3 is taken.
        f.split.ahead = 5;
        let job = job(&f, false);
        let archive = archive();
        // A session growing 2,000 a request whose last summary took 5 requests: from the
        // step (some 640 tokens) 4 requests fit under the hard limit (10,000) with half a
        // request to spare, so a summary started at the next request would come too late.
        let paces = crate::compaction::pace::Paces::default();
        let session = ([3; 32], "c0ffee".to_string());
        let first = paces.seen(&session, 1_000, |_| false);
        paces.started(&session, first, [9; 32]);
        for tokens in [3_000, 5_000, 7_000, 9_000] {
            paces.seen(&session, tokens, |_| true);
        }
        let pace = paces.seen(&session, 11_000, |_| false);
        for (pace, make) in [(Pace::default(), None), (pace, Some(5))] {
            let mut hand = on_hand(vec![(3, summary(50))]);
            hand.pace = pace;
            let choice = without_waiting(on(&job, &hand, &archive));
            let (form, cache, _) = choice.went.expect("a form");
            assert_eq!(
                (form.end, form.tier, cache),
                (3, Tier::Settled, CacheOutcome::Hit)
            );
            assert_eq!(choice.make, make, "{pace:?}");
        }
    }

    #[test]
    fn over_the_trigger_with_nothing_on_hand_the_middle_is_cut_at_once_while_the_summary_is_made() {
        let f = fixture();
        let job = job(&f, true);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let on = on(&job, &hand, &archive);
        let choice = without_waiting(on);
        assert_eq!(choice.make, Some(3));
        let (form, cache, _) = choice.went.expect("a form");
        // Cutting the middle's one output (1,000 tokens) brings the prompt down to the
        // target: it goes so now, from the head, rather than past the trigger as sent.
        assert_eq!((form.end, cache), (1, CacheOutcome::Stale));
        assert!(form.tier <= Tier::Precompute);
        let rewrite = went(on, form, cache, Duration::ZERO);
        assert_eq!(
            (rewrite.action, rewrite.cache),
            (Action::Trimmed, CacheOutcome::Deferred)
        );
        let cut: Vec<usize> = rewrite.cuts.iter().map(|cut| cut.index).collect();
        assert_eq!(cut, [3], "the middle's output cut, the recent part whole");
    }

    /// The fixture with a message of 500 tokens by `role` as its item 2, in the middle, which
    /// no cut touches (the prompt then counts 1,910). The model's follows the opening prompt,
    /// pinned as the task, so what follows is an agent's; a user's is a chat's history.
    fn with_a_middle_message(role: Role) -> Fixture {
        let mut f = fixture();
        f.items[2] = Item::new(role, Kind::Message, 500);
        if role == Role::Assistant {
            f.split.task = Some(1..2);
        }
        f.count.per_message[2] = 500;
        f.count.total = 1_910;
        f.count.raw_total = 1_910;
        f
    }

    #[test]
    fn over_the_trigger_where_cutting_cannot_bring_it_to_the_target_the_oldest_rounds_are_folded_into_a_stand_in(
    ) {
        // The model's message of 500 in the middle, which no cut touches: cutting the output
        // (1,000) brings the prompt (1,910) under the trigger (1,400), not to the target (900).
        let f = with_a_middle_message(Role::Assistant);
        let job = job(&f, true);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let on = on(&job, &hand, &archive);
        let cut = Form::at(on, None, 1, Horizon::at(1)).stepped(on);
        assert_eq!(
            cut.tier,
            Tier::Precompute,
            "the cut lands under the trigger"
        );
        assert!(!cut.reaches_the_target(on));
        let choice = without_waiting(on);
        assert_eq!(
            choice.make,
            Some(3),
            "the model's summary is made meanwhile"
        );
        let (form, cache, found) = choice.went.expect("a form");
        assert_eq!(found, Found::StandIn);
        assert!(form.stands_in() && form.reaches_the_target(on));
        assert_eq!(
            form.stand_in_record(),
            Some(StandInRecord {
                from: 1,
                end: 3,
                horizon: form.horizon
            })
        );
        let rewrite = went(on, form, cache, Duration::ZERO);
        assert_eq!(rewrite.action, Action::Summarized);
        let text = rewrite.summary_text(1, "messages").expect("a summary");
        assert!(
            text.starts_with("[Context summary: 2 earlier messages, a stand-in"),
            "{text}"
        );
        let cut: Vec<usize> = rewrite.cuts.iter().map(|cut| cut.index).collect();
        assert_eq!(cut, [3], "the middle's output cut, the recent part whole");
    }

    #[test]
    fn a_stand_in_outgrown_by_the_session_is_folded_again_behind_the_models_summary_on_hand() {
        // The agent's rounds 2 to 4 (the model's messages of 100 and 1,200, the output of
        // 1,000 between them), a stand-in of 1..3 in use, and the model's summary of the same
        // items made since: stepping to it alone leaves item 4 over the trigger.
        let mut f = fixture();
        f.items[2] = Item::new(Role::Assistant, Kind::Message, 100);
        f.items[4] = Item::new(Role::Assistant, Kind::Message, 1_200);
        f.count.per_message[4] = 1_200;
        (f.count.total, f.count.raw_total) = (2_610, 2_610);
        f.split.task = Some(1..2);
        f.split.summary_ends = vec![3, 4, 5];
        let job = job(&f, true);
        let archive = archive();
        let mut hand = on_hand(vec![(3, summary(50))]);
        let written = Summary {
            stand_in: true,
            ..Summary::story_so_far(2)
        };
        let record = StandInRecord {
            from: 1,
            end: 3,
            horizon: Horizon::at(3),
        };
        hand.stand_in = Some((record, Arc::new(written)));
        let on = on(&job, &hand, &archive);
        assert_eq!(
            Form::fresh(on, Some(summary(50)), 3).tier,
            Tier::Soft,
            "the model's summary alone is no step"
        );
        let (form, _, found) = without_waiting(on).went.expect("a form");
        assert_eq!(found, Found::StandIn);
        assert!(form.reaches_the_target(on));
        let went = form.stand_in_record().expect("a stand-in");
        assert_eq!(
            (went.from, went.end),
            (3, 5),
            "folded after the model's summary"
        );
        let text = &form.summary.as_ref().expect("its text").text;
        assert!(text.starts_with("s\n"), "the model's summary first: {text}");
    }

    /// A reminder of 50 tokens a client added in the agent's loop, after a tool's output of
    /// 1,000 and before the model's item of 1,200 (with `call`, its reasoning and arguments):
    /// cutting the output leaves the prompt over the target.
    const REMINDER: &str = "The user hasn't heard from you in a while. As you continue, keep \
                            them updated when there's something to tell.";

    fn with_a_reminder(call: bool) -> Fixture {
        let mut f = fixture();
        let kind = if call { Kind::ToolCall } else { Kind::Message };
        f.items[2] = Item::new(Role::Tool, Kind::ToolResult, 1_000);
        f.items[3] = Item::new(Role::User, Kind::Message, 50);
        f.items[4] = Item::new(Role::Assistant, kind, 1_200);
        f.count.per_message[2..5].copy_from_slice(&[1_000, 50, 1_200]);
        (f.count.total, f.count.raw_total) = (2_560, 2_560);
        f.split.task = Some(1..2);
        f.split.summary_ends = vec![3, 4, 5];
        f.messages = Views::made(
            (0..6)
                .map(|i| match i {
                    3 => json!({"role": "user", "content": REMINDER}),
                    _ => json!({"role": "user", "content": i}),
                })
                .collect::<Vec<Value>>(),
        );
        f
    }

    #[test]
    fn a_short_message_in_an_agents_loop_is_folded_and_written_whole() {
        let f = with_a_reminder(true);
        let job = job(&f, true);
        let (hand, archive) = (on_hand(Vec::new()), archive());
        let on = on(&job, &hand, &archive);
        let (form, _, found) = without_waiting(on).went.expect("a form");
        assert_eq!(found, Found::StandIn);
        assert!(form.reaches_the_target(on));
        let went = form.stand_in_record().expect("a stand-in");
        assert_eq!((went.from, went.end), (1, 5), "folded past the reminder");
        let text = &form.summary.as_ref().expect("its text").text;
        assert!(text.contains(&format!("- user: {REMINDER} [")), "{text}");
    }

    #[test]
    fn a_turn_the_model_answers_in_words_stops_the_fold() {
        let f = with_a_reminder(false);
        let job = job(&f, true);
        let (hand, archive) = (on_hand(Vec::new()), archive());
        let (form, _, found) = without_waiting(on(&job, &hand, &archive))
            .went
            .expect("a form");
        let went = form.stand_in_record().expect("a stand-in");
        assert_eq!(
            (found, went.end),
            (Found::StandIn, 3),
            "folded up to the turn"
        );
    }

    #[test]
    fn a_persons_messages_are_not_folded_they_wait_for_the_models_summary() {
        // A user's message of 500 in the middle, not the task: a chat's history.
        let f = with_a_middle_message(Role::User);
        let job = job(&f, true);
        let hand = on_hand(Vec::new());
        let archive = archive();
        let (form, _, found) = without_waiting(on(&job, &hand, &archive))
            .went
            .expect("a form");
        assert_eq!((found, form.end), (Found::AsSent, 1));
        assert!(!form.stands_in());
    }

    #[test]
    fn a_stand_in_on_record_is_kept_and_the_models_summary_replaces_it_at_the_next_step() {
        let f = with_a_middle_message(Role::Assistant);
        let job = job(&f, true);
        let archive = archive();
        let first = on_hand(Vec::new());
        let (went_with, _, _) = without_waiting(on(&job, &first, &archive))
            .went
            .expect("a form");
        let record = went_with.stand_in_record().expect("a stand-in");
        let mut hand = on_hand(Vec::new());
        hand.stand_in = Some((record, went_with.summary.clone().expect("its text")));
        let (kept, cache, found) = without_waiting(on(&job, &hand, &archive))
            .went
            .expect("a form");
        assert_eq!((found, cache), (Found::Kept, CacheOutcome::Hit));
        assert_eq!((kept.end, kept.horizon), (3, went_with.horizon));
        // The model's summary of the same items, on hand: the form in use stays while under
        // every trigger; it is the next step, taken when the trigger fires again.
        hand.cached = vec![(3, Arc::new(Summary::story_so_far(2)))];
        let (kept, _, found) = without_waiting(on(&job, &hand, &archive))
            .went
            .expect("a form");
        assert_eq!(found, Found::Kept);
        assert!(kept.stands_in());
    }
}
