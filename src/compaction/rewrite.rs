//! What a compaction says, shared by the compactor that makes it and the dialects that write
//! it out: the job a request hands the compactor (`CompactionJob`), and what the request
//! becomes (`Rewrite`), with its action and cache outcome.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderMap;
use serde_json::Value;

use crate::compaction::cache::{archive_slot, PrefixKeys};
use crate::compaction::limits::Limits;
use crate::compaction::plan::{Mode, Split};
use crate::compaction::recall;
use crate::compaction::shorten::{cut_item_texts, Shorten};
use crate::compaction::summary::{Key, Summary};
use crate::compaction::summary_api::SummaryEndpoint;
use crate::config::ContextConfig;
use crate::conversation::{Item, Views};
use crate::tokens::catalog::ModelInfo;
use crate::tokens::counter::PromptCount;
use crate::tokens::encoding::Encoding;
use crate::transport::upstream::Upstream;

/// What a stand-in's summary line adds (`stand_in`): the model then reads its lines as a list
/// of what was done, not as a summary of it.
pub const STAND_IN_NOTE: &str = ", a stand-in until the summary is made";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Summarized,
    Trimmed,
    /// Sent unchanged.
    Forwarded,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Summarized => "summarized",
            Action::Trimmed => "trimmed",
            Action::Forwarded => "forwarded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// A cached summary that keeps the prompt under every trigger.
    Hit,
    /// Made while the request waited.
    Miss,
    /// A cached summary extended while the request waited.
    Extended,
    /// Over a trigger: a summary on hand went now, the one the plan wants is being made.
    Stale,
    /// Over a trigger with no summary on hand: sent as it came while one is made.
    Deferred,
    None,
}

impl CacheOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Extended => "extended",
            CacheOutcome::Stale => "stale",
            CacheOutcome::Deferred => "deferred",
            CacheOutcome::None => "none",
        }
    }
}

/// Every action and cache outcome a compaction ends with but a request sent as it came with
/// no summary in the making (`Forwarded`, `None`): the series of `condenser_compactions_total`,
/// shown from start-up. A new outcome belongs here.
pub const COUNTED_OUTCOMES: [(Action, CacheOutcome); 8] = [
    (Action::Summarized, CacheOutcome::Hit),
    (Action::Summarized, CacheOutcome::Miss),
    (Action::Summarized, CacheOutcome::Extended),
    (Action::Summarized, CacheOutcome::Stale),
    (Action::Trimmed, CacheOutcome::None),
    (Action::Trimmed, CacheOutcome::Hit),
    (Action::Trimmed, CacheOutcome::Deferred),
    (Action::Forwarded, CacheOutcome::Deferred),
];

/// What the request becomes, for its dialect to write out: the head, then the `pinned` task
/// prompt when there is one, then `summary` when there is one (of the items
/// `head..kept_from`), then the items from `kept_from` on, the tool outputs in `cuts` cut.
#[derive(Debug)]
pub struct Rewrite {
    pub summary: Option<Arc<Summary>>,
    pub kept_from: usize,
    /// The task's items, kept verbatim though before `kept_from`.
    pub pinned: Option<Range<usize>>,
    /// The kept tool outputs cut: those before the session's cut horizon (`horizon::cuts_before`).
    pub cuts: Vec<Shorten>,
    pub action: Action,
    pub cache: CacheOutcome,
    pub summarized: usize,
    /// Time spent waiting on the summarizer (not condenser's own overhead).
    pub waited: Duration,
    /// Where the summarized items and the cleared tool outputs are archived, when the
    /// request offers recall.
    pub archive: Option<ArchiveScope>,
}

/// The archive's keys of `conversation`'s first `upto` items: each the key of the items up to
/// it that bind (`recall::binds`).
fn bound_keys(keys: &PrefixKeys, conversation: Conversation<'_>, upto: usize) -> Vec<Key> {
    let (messages, items, identities) = conversation;
    // Identities, when the raw stage gave one per item, only find keys made before.
    let identities = match identities.len() == messages.len() {
        true => identities,
        false => &[],
    };
    keys.chain(
        &recall::CONVERSATION_SEED,
        (messages, upto),
        identities,
        |index| items.get(index).is_some_and(recall::binds),
    )
}

/// Where a compacted conversation's items are archived: the caller's scope, the
/// conversation's id in it (`recall::reference`), and what each item is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveScope {
    pub caller: Key,
    pub conversation: String,
    /// `bindings[i]`: the key of what was written before item `i` (`recall::archive_bindings`).
    pub bindings: Arc<[Key]>,
}

/// A conversation as compaction reads it, for its archive: its items' views, what the
/// planner read of each, and their identities by their bytes as sent (or none).
pub type Conversation<'a> = (&'a Views<'a>, &'a [Item], &'a [u128]);

impl ArchiveScope {
    /// The archive of `caller`'s `conversation`, whose head is `head` items long: each item
    /// bound to the key of the items before it that bind (`recall::binds`), so a history reads
    /// only what its own requests archived, with a key or without; made by `keys` as the
    /// summaries' prefix keys are (a key made before is found by the item's identity, its view
    /// not read again).
    pub fn new(
        caller: Key,
        keys: &PrefixKeys,
        conversation: Conversation<'_>,
        head: usize,
    ) -> ArchiveScope {
        let (messages, _, _) = conversation;
        let bindings: Arc<[Key]> = std::iter::once(recall::CONVERSATION_SEED)
            .chain(bound_keys(keys, conversation, messages.len()))
            .collect();
        let opening = recall::opening(conversation.1, head).min(messages.len());
        ArchiveScope {
            caller,
            conversation: recall::conversation_id(&bindings[opening]),
            bindings,
        }
    }

    /// The id of `conversation` in its caller's archive (`recall::conversation_id`), without
    /// the rest of its archive's keys.
    pub fn conversation_id(
        keys: &PrefixKeys,
        conversation: Conversation<'_>,
        head: usize,
    ) -> String {
        let opening = recall::opening(conversation.1, head);
        let opened = bound_keys(keys, conversation, opening).pop();
        recall::conversation_id(&opened.unwrap_or(recall::CONVERSATION_SEED))
    }

    /// Where the conversation's item `index` is archived, and found: `None` past its end.
    pub fn slot(&self, index: usize) -> Option<Key> {
        let binding = self.bindings.get(index)?;
        Some(archive_slot(
            &self.caller,
            binding,
            &recall::reference(&self.conversation, index),
        ))
    }
}

impl Rewrite {
    /// The head, the pinned task and the planned tail, without a summary.
    pub fn trimmed(split: &Split, waited: Duration) -> Rewrite {
        Rewrite {
            summary: None,
            kept_from: split.tail_start,
            pinned: split.pinned_before(split.tail_start),
            cuts: split.shorten.clone(),
            action: Action::Trimmed,
            cache: CacheOutcome::None,
            summarized: 0,
            waited,
            archive: None,
        }
    }

    /// The summary's text as every dialect forwards it, after the head's `head` items:
    /// `[Context summary: N earlier <unit>]`, a blank line, then the summary; with recall,
    /// a line naming the references of the items it replaces.
    pub fn summary_text(&self, head: usize, unit: &str) -> Option<String> {
        let summary = self.summary.as_ref()?;
        let stand_in = if summary.stand_in { STAND_IN_NOTE } else { "" };
        let mut text = format!(
            "[Context summary: {} earlier {unit}{stand_in}]\n\n{}",
            self.kept_from - head,
            summary.text
        );
        if let Some(archive) = &self.archive {
            text.push_str(&recall::archived_note(
                &archive.conversation,
                head..self.kept_from,
                unit,
            ));
        }
        Some(text)
    }

    /// Cuts the outputs of `kept` (the items from `kept_from` on) as planned, each item's
    /// output texts found by `texts`, in `encoding`; returns the places in `kept` it cut.
    pub fn cut_kept_outputs(
        &self,
        kept: &mut [Value],
        kept_from: usize,
        encoding: Encoding,
        texts: fn(&mut Value) -> Vec<&mut String>,
    ) -> Vec<usize> {
        let mut cut_at = Vec::new();
        for cut in &self.cuts {
            let Some(at) = cut.index.checked_sub(kept_from) else {
                continue;
            };
            if let Some(item) = kept.get_mut(at) {
                cut_item_texts(
                    encoding,
                    texts(item),
                    cut,
                    self.cleared_reference(cut.index).as_deref(),
                );
                cut_at.push(at);
            }
        }
        cut_at
    }

    /// The conversation's items a dialect's rewrite reads or changes, besides moving them:
    /// the first kept (which the summary may join), the pinned task's, and the outputs it
    /// cuts. Every other item goes as it was sent.
    pub fn items_read(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.kept_from)
            .chain(self.pinned.clone().unwrap_or_default())
            .chain(self.cuts.iter().map(|cut| cut.index))
    }

    /// The reference a cleared output's stub names, when the request offers recall.
    pub fn cleared_reference(&self, index: usize) -> Option<String> {
        let archive = self.archive.as_ref()?;
        Some(recall::reference(&archive.conversation, index))
    }

    /// The conversation's items this rewrite archived, which recall searches: those its
    /// summary replaces (less the pinned task, which goes as sent), and the tool outputs it
    /// cut.
    pub fn archived_items(&self, split: &Split) -> Vec<usize> {
        let summarized = if self.summary.is_some() {
            split.head..self.kept_from
        } else {
            0..0
        };
        let pinned = self.pinned.clone().unwrap_or_default();
        summarized
            .filter(|index| !pinned.contains(index))
            .chain(self.cuts.iter().map(|cut| cut.index))
            .collect()
    }
}

pub struct CompactionJob<'a> {
    /// The conversation; at least its messages up to the plan's furthest summary end
    /// (`split.ahead`), all that keys and summaries are made of. Its length is the count's.
    pub messages: &'a Views<'a>,
    pub count: &'a PromptCount,
    /// What the planner read of each item (its kind and tokens), which cuts are chosen by.
    pub items: &'a [Item],
    /// Each item's identity by its bytes as sent, when the raw stage counted them (else
    /// empty): what its prefix key is kept by.
    pub identities: &'a [u128],
    pub split: &'a Split,
    pub model: &'a str,
    pub info: &'a ModelInfo,
    pub upstream: &'a Arc<Upstream>,
    /// The request's headers: who the caller is, and the credentials its summaries are paid with.
    pub headers: &'a HeaderMap,
    /// The request's own API, which its summaries are asked in unless `summarizer.api` says.
    pub api: SummaryEndpoint,
    pub settings: &'a ContextConfig,
    pub mode: Mode,
    pub limits: Limits,
    /// The request offers recall: its summary names the archived items.
    pub recall: bool,
}

/// The request unchanged: while its summary is made, or when the summarizer failed and
/// `on_failure = forward`.
pub(super) fn as_sent(cache: CacheOutcome, waited: Duration) -> Rewrite {
    Rewrite {
        summary: None,
        kept_from: 0,
        pinned: None,
        cuts: Vec::new(),
        action: Action::Forwarded,
        cache,
        summarized: 0,
        waited,
        archive: None,
    }
}

pub(super) fn trimmed(job: &CompactionJob<'_>, waited: Duration) -> Rewrite {
    Rewrite::trimmed(job.split, waited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split() -> Split {
        Split {
            head: 1,
            tail_start: 4,
            task: Some(2..3),
            ahead: 4,
            summary_ends: vec![4],
            shorten: vec![Shorten {
                index: 5,
                tokens: 900,
                keep_tokens: 256,
            }],
            recent_start: 6,
            estimated_tokens: 0,
        }
    }

    fn summary() -> Arc<Summary> {
        Arc::new(Summary {
            text: "what happened".into(),
            tokens: 3,
            messages: 3,
            model: "m".into(),
            created_at: 0,
            stand_in: false,
        })
    }

    #[test]
    fn a_trimmed_rewrite_keeps_the_planned_tail_the_task_pinned() {
        let rewrite = Rewrite::trimmed(&split(), Duration::from_millis(5));
        assert_eq!(rewrite.kept_from, 4);
        assert_eq!(rewrite.pinned, Some(2..3));
        assert_eq!(rewrite.cuts, split().shorten);
        assert_eq!(
            (rewrite.action, rewrite.cache),
            (Action::Trimmed, CacheOutcome::None)
        );
        assert_eq!(rewrite.summary_text(1, "messages"), None);
        // Only the cut output is archived: nothing is summarized.
        assert_eq!(rewrite.archived_items(&split()), [5]);
    }

    #[test]
    fn as_sent_changes_nothing() {
        let rewrite = as_sent(CacheOutcome::Deferred, Duration::ZERO);
        assert_eq!(rewrite.action, Action::Forwarded);
        assert_eq!(rewrite.cache, CacheOutcome::Deferred);
        assert_eq!((rewrite.kept_from, rewrite.summarized), (0, 0));
        assert!(rewrite.cuts.is_empty() && rewrite.summary.is_none());
    }

    #[test]
    fn a_summary_text_counts_what_it_replaces_and_names_the_archive_with_recall() {
        let mut rewrite = Rewrite::trimmed(&split(), Duration::ZERO);
        rewrite.summary = Some(summary());
        assert_eq!(
            rewrite.summary_text(1, "messages").as_deref(),
            Some("[Context summary: 3 earlier messages]\n\nwhat happened")
        );
        assert_eq!(rewrite.cleared_reference(5), None);
        rewrite.archive = Some(ArchiveScope {
            caller: [0; 32],
            conversation: "c0ffee".into(),
            bindings: Default::default(),
        });
        let text = rewrite.summary_text(1, "turns").unwrap();
        assert!(text.starts_with("[Context summary: 3 earlier turns]\n\nwhat happened"));
        assert!(text.ends_with(&recall::archived_note("c0ffee", 1..4, "turns")));
        assert_eq!(
            rewrite.cleared_reference(5),
            Some(recall::reference("c0ffee", 5))
        );
        // The summarized items but the pinned task (2), which goes as sent, then the cut
        // output.
        assert_eq!(rewrite.archived_items(&split()), [1, 3, 5]);
    }

    #[test]
    fn every_counted_outcome_is_named_apart() {
        let names: std::collections::BTreeSet<String> = COUNTED_OUTCOMES
            .iter()
            .map(|(action, cache)| format!("{}/{}", action.name(), cache.name()))
            .collect();
        assert_eq!(names.len(), COUNTED_OUTCOMES.len());
        assert!(!COUNTED_OUTCOMES.contains(&(Action::Forwarded, CacheOutcome::None)));
    }
}
