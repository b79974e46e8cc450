//! The cut horizon: where a session's cuts reach in a kept part, how it moves on in one step
//! to a budget, the tool outputs it cuts, and the record of it a conversation keeps from one
//! request to the next (rule 8: what the request before sent stays), checked against the
//! items it was made on.

use std::collections::HashMap;

use crate::compaction::cache::{prefix_keys, SummaryCache};
use crate::compaction::shorten::{Shorten, CLEARED_OUTPUT_TOKENS, SHORTENED_OUTPUT_TOKENS};
use crate::compaction::summary::Key;
use crate::conversation::{Item, ToolCut, Views};

/// Where a session's cuts reach in a kept part: every output before `all` cut, the outputs of
/// tools cut first (`ToolCut::First`) before `first` cut, and every output before `cleared`
/// cleared. It is what a session's rewrites keep from one turn to the next (rule 8): outputs
/// before it read the same, cut, on every turn until a summary takes them; outputs after it
/// are whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Horizon {
    pub(super) all: usize,
    pub(super) first: usize,
    pub(super) cleared: usize,
}

impl Horizon {
    /// Nothing cut from `index` on.
    pub(super) fn at(index: usize) -> Horizon {
        Horizon {
            all: index,
            first: index,
            cleared: index,
        }
    }

    /// Where its last cut may be.
    pub(super) fn reach(self) -> usize {
        self.all.max(self.first).max(self.cleared)
    }

    /// It, reaching no further than `limit`.
    pub(super) fn within(self, limit: usize) -> Horizon {
        Horizon {
            all: self.all.min(limit),
            first: self.first.min(limit),
            cleared: self.cleared.min(limit),
        }
    }

    fn cuts(self, index: usize, item: &Item) -> bool {
        item.cuttable(SHORTENED_OUTPUT_TOKENS)
            && (index < self.all || index < self.first && item.cut == ToolCut::First)
    }

    /// What the output at `index` counts once this horizon is applied, when it is cut or
    /// cleared.
    fn keep(self, index: usize, item: &Item) -> Option<u32> {
        if index < self.cleared && item.cuttable(SHORTENED_OUTPUT_TOKENS) {
            Some(CLEARED_OUTPUT_TOKENS)
        } else if self.cuts(index, item) {
            Some(SHORTENED_OUTPUT_TOKENS)
        } else {
            None
        }
    }
}

/// The tool outputs cut in a kept part that starts at `kept_from`, with the cut horizon at
/// `horizon`: every output before it over the cut size, but those whose tool is never cut.
pub(super) fn cuts_before(items: &[Item], kept_from: usize, horizon: Horizon) -> Vec<Shorten> {
    let reach = horizon.reach().min(items.len());
    (kept_from..reach)
        .filter_map(|index| {
            let keep_tokens = horizon.keep(index, &items[index])?;
            Some(Shorten {
                index,
                tokens: items[index].tokens,
                keep_tokens,
            })
        })
        .collect()
}

/// What `cuts` take off a prompt.
pub(super) fn saving(cuts: &[Shorten]) -> u64 {
    cuts.iter()
        .map(|cut| u64::from(cut.tokens - cut.keep_tokens))
        .sum()
}

/// Where the cut horizon moves from `horizon`, for a prompt estimated at `estimate` (with
/// the cuts before `horizon`) to come down to `budget`: the outputs of tools cut first, oldest
/// first, then every output, oldest first, then, when cutting them all is not enough, every
/// output cleared, oldest first; each mark just past the output that gets it there, or at
/// `floor` (where the recent part starts, which is never cut) when nothing before it does. Oldest first: what changes is then as far back as it can be. A horizon
/// only moves forward, in one step to the budget, so a session's cuts change only at such a
/// step.
pub(super) fn advance_horizon(
    items: &[Item],
    horizon: Horizon,
    estimate: u64,
    (budget, clear_over): (u64, u64),
    floor: usize,
) -> Horizon {
    let mut estimate = estimate;
    let mut horizon = horizon;
    let floor = floor.min(items.len());
    let saving = |item: &Item| u64::from(item.tokens - SHORTENED_OUTPUT_TOKENS);
    for (index, item) in items.iter().enumerate().take(floor).skip(horizon.first) {
        if estimate <= budget {
            break;
        }
        if item.cut == ToolCut::First && item.cuttable(SHORTENED_OUTPUT_TOKENS) {
            if !horizon.cuts(index, item) {
                estimate -= saving(item);
            }
            horizon.first = index + 1;
        }
    }
    for (index, item) in items.iter().enumerate().take(floor).skip(horizon.all) {
        if estimate <= budget {
            break;
        }
        if item.cuttable(SHORTENED_OUTPUT_TOKENS) {
            if !horizon.cuts(index, item) {
                estimate -= saving(item);
            }
            horizon.all = index + 1;
        }
    }
    // Every output of the middle cut and still over the hard limit (`clear_over`): they are
    // cleared, oldest first, to the budget. Only then: a cleared output keeps so little that
    // what the middle named (paths, ids) would be gone before a summary carries it.
    if estimate <= clear_over {
        return horizon;
    }
    for (index, item) in items.iter().enumerate().take(floor).skip(horizon.cleared) {
        if estimate <= budget {
            break;
        }
        if item.cuttable(SHORTENED_OUTPUT_TOKENS) {
            let counted = horizon.keep(index, item).unwrap_or(item.tokens);
            estimate -= u64::from(counted - CLEARED_OUTPUT_TOKENS);
            horizon.cleared = index + 1;
        }
    }
    horizon
}

/// Where the kept part starting at `start` anchors its cut horizon: the key of the prefix
/// before it (the scope's, for a conversation with no head), and what the request's parts
/// besides its conversation cost. Those parts (tools, system) come first in a provider's
/// cache, so requests that differ in them share no cached prefix, and an agent's side
/// requests over the same conversation (without tools, another system) must not move the
/// cuts of its loop.
///
/// `fixed` is the encoding's count of those parts (`PromptCount::fixed`), a function of
/// their bytes: a count scaled by a learned ratio moved with every reply, and a session
/// whose anchor moved found no record and cut its middle again at every turn (issue 54).
fn anchor(scope: &Key, keys: &[Key], start: usize, fixed: u32) -> Key {
    let prefix = start
        .checked_sub(1)
        .and_then(|at| keys.get(at))
        .unwrap_or(scope);
    let mut hasher = blake3::Hasher::new();
    hasher.update(prefix);
    hasher.update(&fixed.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// Where a conversation records the stand-in in use (`stand_in`): one record a
/// conversation, anchored on its head as its kept parts are on their starts, naming where
/// the stand-in ends, what it extends, and its cut horizon.
fn stand_in_anchor(scope: &Key, keys: &[Key], head: usize, fixed: u32) -> Key {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"condenser stand-in v1");
    hasher.update(&anchor(scope, keys, head, fixed));
    *hasher.finalize().as_bytes()
}

/// The stand-in a conversation went with: the items `from..end` folded into it (after the
/// model's summary ending at `from`, or the head), and the cut horizon of the items after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StandInRecord {
    pub(super) from: usize,
    pub(super) end: usize,
    pub(super) horizon: Horizon,
}

/// What a horizon record says: the horizon (where every output is cut, and where those of
/// tools cut first are), and the hash of the prefix up to its reach, so that a conversation
/// whose items before it changed does not take another's cuts.
fn horizon_record(horizon: Horizon, prefix: &Key) -> String {
    format!(
        "{} {} {} {}",
        horizon.all,
        horizon.first,
        horizon.cleared,
        blake3::Hash::from_bytes(*prefix).to_hex()
    )
}

/// What a stand-in record says: where its fold starts and ends, then its horizon's record.
fn stand_in_record(went: &StandInRecord, prefix: &Key) -> String {
    format!(
        "{} {} {}",
        went.from,
        went.end,
        horizon_record(went.horizon, prefix)
    )
}

/// The horizon a record names (its three marks, before the prefix's hash).
fn recorded_horizon(record: &str) -> Option<Horizon> {
    let mut marks = record.split(' ').map(|mark| mark.parse::<usize>().ok());
    Some(Horizon {
        all: marks.next()??,
        first: marks.next()??,
        cleared: marks.next()??,
    })
}

/// What a horizon record checks the items up to `horizon` by, for the kept part after
/// `anchor`: the anchor with the conversation's prefix key up to the horizon. The keys made
/// for the summary lookup reach the plan's furthest summary end, so only the items past it
/// are hashed here, not every item from each kept part's start again (which was a hash of
/// most of the conversation per summary on hand).
fn horizon_prefix(anchor: &Key, records: &Records<'_>, horizon: usize) -> Option<Key> {
    let up_to = match horizon.checked_sub(1) {
        None => records.scope,
        Some(last) => match records.keys.get(last) {
            Some(key) => *key,
            None => {
                let made = records.keys.len();
                let from = records.keys.last().unwrap_or(&records.scope);
                let beyond = (horizon <= records.messages.len())
                    .then(|| records.messages.range(made..horizon))?;
                *prefix_keys(from, beyond).last()?
            }
        },
    };
    let mut hasher = blake3::Hasher::new();
    hasher.update(anchor);
    hasher.update(&up_to);
    Some(*hasher.finalize().as_bytes())
}

/// Where a conversation's cut horizons are recorded and looked up: the caller's records in
/// the summary cache, each anchored on a kept part's start (`anchor`) and checked by the
/// conversation's prefix keys (`horizon_prefix`).
pub(super) struct Records<'r> {
    pub(super) cache: &'r SummaryCache,
    /// The hash of the caller's identity.
    pub(super) caller: Key,
    /// What every prefix key descends from.
    pub(super) scope: Key,
    /// The conversation's prefix keys, up to the plan's furthest summary end.
    pub(super) keys: &'r [Key],
    pub(super) messages: &'r Views<'r>,
    /// What the request's parts besides its conversation cost (`PromptCount::fixed`).
    pub(super) fixed: u32,
}

impl Records<'_> {
    /// The cut horizons recorded for the kept parts starting at `starts`, kept where the
    /// request's items up to the horizon are those the record was made on; and the stand-in
    /// the conversation after `head` went with, kept where its items up to its end and its
    /// horizon are those it was made on. One look-up for all.
    pub(super) async fn recorded(
        &self,
        starts: &[usize],
        head: usize,
    ) -> (HashMap<usize, Horizon>, Option<StandInRecord>) {
        let mut anchors: Vec<Key> = starts
            .iter()
            .map(|&start| anchor(&self.scope, self.keys, start, self.fixed))
            .collect();
        let stand_in = stand_in_anchor(&self.scope, self.keys, head, self.fixed);
        anchors.push(stand_in);
        let mut records = self.cache.horizons(&self.caller, &anchors).await;
        let stand_in = records
            .pop()
            .flatten()
            .and_then(|record| self.stand_in_found(&stand_in, &record, head));
        let horizons = starts
            .iter()
            .zip(&anchors)
            .zip(records)
            .filter_map(|((&start, anchor), record)| {
                let record = record?;
                let horizon = recorded_horizon(&record)?;
                let prefix = horizon_prefix(anchor, self, horizon.reach())?;
                let marks = [horizon.all, horizon.first, horizon.cleared];
                (marks.iter().all(|&mark| mark >= start)
                    && *record == *horizon_record(horizon, &prefix))
                .then_some((start, horizon))
            })
            .collect();
        (horizons, stand_in)
    }

    /// The stand-in `record` names, if this request's items up to its reach are those it
    /// was made on.
    fn stand_in_found(&self, anchor: &Key, record: &str, head: usize) -> Option<StandInRecord> {
        let (from, rest) = record.split_once(' ')?;
        let (end, rest) = rest.split_once(' ')?;
        let found = StandInRecord {
            from: from.parse().ok()?,
            end: end.parse().ok()?,
            horizon: recorded_horizon(rest)?,
        };
        let marks = [
            found.horizon.all,
            found.horizon.first,
            found.horizon.cleared,
        ];
        let reach = found.horizon.reach().max(found.end);
        let prefix = horizon_prefix(anchor, self, reach)?;
        (head <= found.from
            && found.from < found.end
            && marks.iter().all(|&mark| mark >= found.end)
            && record == stand_in_record(&found, &prefix))
        .then_some(found)
    }

    /// Records the stand-in `went` with, in place of the one recorded before.
    pub(super) async fn record_stand_in(&self, head: usize, went: StandInRecord) {
        let anchor = stand_in_anchor(&self.scope, self.keys, head, self.fixed);
        let reach = went.horizon.reach().max(went.end);
        let Some(prefix) = horizon_prefix(&anchor, self, reach) else {
            return;
        };
        self.cache
            .horizon_put(&self.caller, &anchor, &stand_in_record(&went, &prefix))
            .await;
    }

    /// Records `horizon` for the kept part starting at `start`.
    pub(super) async fn record(&self, start: usize, horizon: Horizon) {
        let anchor = anchor(&self.scope, self.keys, start, self.fixed);
        let Some(prefix) = horizon_prefix(&anchor, self, horizon.reach()) else {
            return;
        };
        self.cache
            .horizon_put(&self.caller, &anchor, &horizon_record(horizon, &prefix))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::cache::scope;
    use crate::conversation::{Kind, Role};
    use serde_json::json;

    fn output(tokens: u32) -> Item {
        Item::new(Role::Tool, Kind::ToolResult, tokens)
    }

    #[test]
    fn a_horizon_record_round_trips_and_a_malformed_one_names_none() {
        let horizon = Horizon {
            all: 7,
            first: 9,
            cleared: 4,
        };
        let record = horizon_record(horizon, &[3; 32]);
        assert_eq!(recorded_horizon(&record), Some(horizon));
        assert!(record.ends_with(&blake3::Hash::from_bytes([3; 32]).to_hex().to_string()));
        assert_eq!(recorded_horizon("7 9"), None);
        assert_eq!(recorded_horizon("7 x 4 abc"), None);
    }

    #[test]
    fn a_horizon_reaches_its_furthest_mark_and_is_held_within_a_limit() {
        let horizon = Horizon {
            all: 3,
            first: 8,
            cleared: 5,
        };
        assert_eq!(horizon.reach(), 8);
        assert_eq!(
            horizon.within(4),
            Horizon {
                all: 3,
                first: 4,
                cleared: 4
            }
        );
        assert_eq!(Horizon::at(6).reach(), 6);
    }

    #[test]
    fn cuts_before_cuts_and_clears_only_outputs_behind_the_horizon() {
        let mut never = output(900);
        never.cut = ToolCut::Never;
        let items = [output(900), output(900), never, output(100), output(900)];
        let horizon = Horizon {
            all: 4,
            first: 4,
            cleared: 1,
        };
        let cuts = cuts_before(&items, 0, horizon);
        let kept: Vec<(usize, u32)> = cuts.iter().map(|c| (c.index, c.keep_tokens)).collect();
        // The never-cut tool and the output under the cut size stay; the one past the
        // horizon too.
        assert_eq!(
            kept,
            [(0, CLEARED_OUTPUT_TOKENS), (1, SHORTENED_OUTPUT_TOKENS)]
        );
        assert_eq!(
            saving(&cuts),
            u64::from(900 - CLEARED_OUTPUT_TOKENS) + u64::from(900 - SHORTENED_OUTPUT_TOKENS)
        );
    }

    #[test]
    fn an_anchor_tells_apart_kept_parts_and_the_requests_other_parts() {
        let scope = scope(&[1; 32], "m", &[2; 32]);
        let messages = [
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let keys = prefix_keys(&scope, &messages);
        assert_eq!(anchor(&scope, &keys, 0, 5), anchor(&scope, &keys, 0, 5));
        assert_ne!(anchor(&scope, &keys, 0, 5), anchor(&scope, &keys, 1, 5));
        assert_ne!(anchor(&scope, &keys, 1, 5), anchor(&scope, &keys, 1, 6));
    }

    #[test]
    fn the_prefix_a_record_is_checked_by_reaches_past_the_keys_made() {
        let scope = scope(&[1; 32], "m", &[2; 32]);
        let messages: Vec<_> = (0..4)
            .map(|i| json!({"role": "user", "content": i}))
            .collect();
        let all_keys = prefix_keys(&scope, &messages);
        let cache = SummaryCache::new(&Default::default(), None);
        let views = Views::made(&messages);
        let records = |keys| Records {
            cache: &cache,
            caller: [1; 32],
            scope,
            keys,
            messages: &views,
            fixed: 0,
        };
        let anchor = [9; 32];
        // Keys made up to the second item only: the rest are hashed on, the same as made.
        let short = horizon_prefix(&anchor, &records(&all_keys[..2]), 4);
        let whole = horizon_prefix(&anchor, &records(&all_keys), 4);
        assert!(short.is_some());
        assert_eq!(short, whole);
        assert_ne!(whole, horizon_prefix(&anchor, &records(&all_keys), 3));
        assert_eq!(horizon_prefix(&anchor, &records(&all_keys), 5), None);
    }

    #[tokio::test]
    async fn a_recorded_horizon_is_found_for_its_start_and_not_for_another_conversation() {
        let scope = scope(&[1; 32], "m", &[2; 32]);
        let messages: Vec<_> = (0..6)
            .map(|i| json!({"role": "user", "content": i}))
            .collect();
        let keys = prefix_keys(&scope, &messages);
        let cache = SummaryCache::new(&Default::default(), None);
        let views = Views::made(&messages);
        let records = Records {
            cache: &cache,
            caller: [1; 32],
            scope,
            keys: &keys,
            messages: &views,
            fixed: 10,
        };
        let horizon = Horizon {
            all: 4,
            first: 5,
            cleared: 2,
        };
        records.record(2, horizon).await;
        let (found, stand_in) = records.recorded(&[1, 2], 0).await;
        assert_eq!(stand_in, None);
        assert_eq!(found.get(&2), Some(&horizon));
        assert_eq!(found.get(&1), None);
        // Another conversation's items up to the horizon: the record is not its.
        let other: Vec<_> = (0..6)
            .map(|i| json!({"role": "user", "content": i + 1}))
            .collect();
        let other_keys = prefix_keys(&scope, &other);
        let other = Views::made(&other);
        let elsewhere = Records {
            keys: &other_keys,
            messages: &other,
            ..records
        };
        assert!(elsewhere.recorded(&[2], 0).await.0.is_empty());
    }
}
