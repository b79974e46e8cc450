//! The artifact ledger: the identifiers an agent saw in the messages a summary replaces
//! (paths, file names, URLs, IDs and UUIDs, error codes, commit hashes, amounts, numbers with
//! units), found by code in every role, and carried verbatim in the summary's Artifacts
//! section when the summarizer dropped them. A summarizer may paraphrase; the ledger does not.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::compaction::identifiers::{identifiers, locates, says};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;

/// The heading the summary's own artifacts go under, as the summarizer is asked to write it.
const ARTIFACTS_HEADING: &str = "## Artifacts";

/// A window's worth of identifiers: one token in this many of the window. A session that
/// fills a larger window has read more paths, IDs and hashes that it may need again.
const WINDOW_SHARE_FOR_ARTIFACTS: u64 = 256;

/// The ledger's budget for a summary made in a window of `window` tokens: the configured
/// `max_artifact_tokens` at least, more as the window grows (128k: 500 tokens, 200k: 781,
/// 1M: 3,906), so the ledger keeps the same share of what a session has seen.
pub fn budget(configured: u32, window: u64) -> u32 {
    let scaled = u32::try_from(window / WINDOW_SHARE_FOR_ARTIFACTS).unwrap_or(u32::MAX);
    configured.max(scaled)
}

/// Where an identifier was seen, the most salient first. What the task and the user name is
/// what the work is about; what the model wrote or called a tool with is what it chose to act
/// on; a tool's output also holds much that nobody used (logs, listings, counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Rank {
    User,
    Model,
    ToolOutput,
}

const RANKS: [Rank; 3] = [Rank::User, Rank::Model, Rank::ToolOutput];

impl Rank {
    /// The line the ledger lists this rank's identifiers under. It records the rank in the
    /// summary itself, where an extension reads it back: by then the messages it was
    /// learned from are no longer sent to the summarizer.
    fn heading(self) -> &'static str {
        match self {
            Rank::User => "Named by the task or the user:",
            Rank::Model => "Named by the assistant or in its tool calls:",
            Rank::ToolOutput => "Seen in tool outputs:",
        }
    }
}

/// The line the ledger starts with.
const LEDGER_INTRO: &str = "Carried verbatim from the earlier messages:";

/// Between the first and the last of a run written compactly: `turn-1 … turn-103 (103 alike)`.
const RUN_ELLIPSIS: &str = " … ";

/// How the Messages API's view of a user turn writes a tool result
/// (`dialect::messages::view`): a tool's output, though its turn is the user's. Should the
/// view write it otherwise, `tests/it/artifacts.rs` fails.
const TOOL_RESULT_TEXT: &str = "[tool result ";

/// What identifiers alike but for their last number share: the text before and after it.
type Pattern = (String, String);

/// The pattern of `id` and its last number: `turn-103` is `turn-`, `` around `103`;
/// `src/a.rs:40` is `src/a.rs:`, `` around `40`. None for an identifier without a number or
/// that is only one.
fn pattern(id: &str) -> Option<(Pattern, &str)> {
    let end = id.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = id[..end]
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .len();
    let (before, after) = (&id[..start], &id[end..]);
    if before.is_empty() && after.is_empty() {
        return None;
    }
    Some(((before.to_string(), after.to_string()), &id[start..end]))
}

/// The order of a run's members: by their number's value (`turn-9` before `turn-10`, and
/// `req-0099` before `req-0100`), then as written.
fn counter_order(id: &str) -> (usize, String, String) {
    let number = pattern(id).map_or("", |(_, number)| number.trim_start_matches('0'));
    (number.len(), number.to_string(), id.to_string())
}

/// What the ledger knows of one identifier.
struct Seen {
    rank: Rank,
    /// How many times it was seen; from an earlier ledger, as many as it said.
    times: usize,
    /// When it was first seen, among all identifiers: an earlier summary's come first.
    first: usize,
}

/// A run an earlier ledger wrote as its first and last only.
struct CompactRun {
    first: String,
    last: String,
    /// How many members it did not name.
    unnamed: usize,
}

impl CompactRun {
    /// How many of its members the ledger did not name are not among `named` either: a
    /// member seen again between its first and last is taken for one of them, so a run
    /// re-read at each extension does not count the same members twice.
    fn unnamed_beside(&self, named: &[String]) -> usize {
        let (low, high) = (counter_order(&self.first), counter_order(&self.last));
        let again = named
            .iter()
            .map(|id| counter_order(id))
            .filter(|order| low < *order && *order < high)
            .count();
        self.unnamed.saturating_sub(again)
    }
}

/// The identifiers an earlier summary and the summarized messages hold.
#[derive(Default)]
struct Sightings {
    seen: HashMap<String, Seen>,
    /// The runs an earlier ledger wrote compactly, by rank and pattern.
    compact_runs: HashMap<(Rank, Pattern), CompactRun>,
}

impl Sightings {
    /// `id` seen `times` more, at `rank`: an identifier keeps the best rank it was seen at.
    fn note(&mut self, id: &str, rank: Rank, times: usize) {
        let first = self.seen.len();
        let seen = self.seen.entry(id.to_string()).or_insert(Seen {
            rank,
            times: 0,
            first,
        });
        seen.rank = seen.rank.min(rank);
        seen.times += times;
    }

    /// An earlier summary: its ledger's identifiers at the rank its headings give them, as
    /// many times as it said, its compact runs with the members they did not name; those of
    /// the rest of its text at the model's rank, as a summary is a model's writing (so is a
    /// ledger that lost its headings, such as one written before ranks were recorded).
    fn read_summary(&mut self, summary: &str) {
        let mut rank = None;
        for line in summary.lines().map(str::trim_end) {
            if let Some(heading) = RANKS.into_iter().find(|r| line == r.heading()) {
                rank = Some(heading);
                continue;
            }
            match (rank, line.strip_prefix("- ")) {
                (Some(rank), Some(entry)) => self.read_entry(rank, entry),
                _ => {
                    rank = None;
                    for id in identifiers(line) {
                        self.note(&id, Rank::Model, 1);
                    }
                }
            }
        }
    }

    /// One line of an earlier ledger: `id`, `id (×3)` or `first … last (12 alike)`. The
    /// count of what was left out, in parentheses, names nothing.
    fn read_entry(&mut self, rank: Rank, entry: &str) {
        if entry.starts_with('(') {
            return;
        }
        if let Some((first, last, alike)) = read_run(entry) {
            self.note(first, rank, 1);
            self.note(last, rank, 1);
            if let Some((pattern, _)) = pattern(first) {
                let unnamed = alike.saturating_sub(2);
                // A summarizer may have copied the line: the same run, not another.
                self.compact_runs
                    .entry((rank, pattern))
                    .and_modify(|known| known.unnamed = known.unnamed.max(unnamed))
                    .or_insert(CompactRun {
                        first: first.to_string(),
                        last: last.to_string(),
                        unnamed,
                    });
            }
            return;
        }
        let (id, times) = read_repeated(entry).unwrap_or((entry, 1));
        self.note(id, rank, times);
    }

    /// The ledger's entries for what `summary` does not already say, best first: by rank;
    /// within one, what was seen more than once first; then what cannot be found again
    /// (hashes, tickets, versions, addresses) before what locates something (URLs, paths,
    /// file names), which an agent can find again by listing or searching; then in the order
    /// first seen. First seen, not most recent: the newest identifiers are the likeliest to
    /// be in the recent messages kept verbatim or in the summary's own account of progress,
    /// while what was read once early is nowhere else; and what one ledger carried, the next
    /// carries again in the same order unless something more salient comes.
    fn into_entries(self, summary: &str) -> Vec<LedgerEntry> {
        let mut runs: HashMap<(Rank, Pattern), LedgerEntry> = HashMap::new();
        let mut entries = Vec::new();
        for (id, seen) in self.seen {
            if says(summary, &id) {
                continue;
            }
            let run = pattern(&id).map(|(pattern, _)| (seen.rank, pattern));
            let entry = LedgerEntry {
                rank: seen.rank,
                locates: locates(&id),
                members: vec![id],
                unnamed: 0,
                times: seen.times,
                first: seen.first,
            };
            match run {
                Some(run) => match runs.get_mut(&run) {
                    Some(alike) => alike.absorb(entry),
                    None => {
                        runs.insert(run, entry);
                    }
                },
                None => entries.push(entry),
            }
        }
        for (run, mut entry) in runs {
            entry.unnamed = self
                .compact_runs
                .get(&run)
                .map_or(0, |compact| compact.unnamed_beside(&entry.members));
            entry.times += entry.unnamed;
            entry.members.sort_by_cached_key(|id| counter_order(id));
            entries.push(entry);
        }
        entries.sort_by_key(|e| (e.rank, e.times < 2, e.locates, e.first));
        entries
    }
}

/// A compact run's line, `first … last (12 alike)`: its first, its last, how many are alike.
fn read_run(entry: &str) -> Option<(&str, &str, usize)> {
    let (first, rest) = entry.split_once(RUN_ELLIPSIS)?;
    let (last, alike) = rest.strip_suffix(" alike)")?.rsplit_once(" (")?;
    Some((first, last, alike.parse().ok()?))
}

/// A line `id (×3)`: the identifier and how many times it was seen.
fn read_repeated(entry: &str) -> Option<(&str, usize)> {
    let (id, times) = entry.strip_suffix(')')?.rsplit_once(" (×")?;
    Some((id, times.parse().ok()?))
}

/// One entry of the ledger: an identifier, or a run of identifiers alike but for their last
/// number, which costs one line however long it is.
struct LedgerEntry {
    rank: Rank,
    /// Its identifiers; a run's in the order of their numbers.
    members: Vec<String>,
    /// A run's members an earlier ledger did not name, which only their count stands for.
    unnamed: usize,
    /// How many times its identifiers were seen, together: a run's pattern recurs.
    times: usize,
    /// When its first identifier was first seen.
    first: usize,
    locates: bool,
}

impl LedgerEntry {
    /// Another identifier of the same run.
    fn absorb(&mut self, other: LedgerEntry) {
        self.members.extend(other.members);
        self.times += other.times;
        self.first = self.first.min(other.first);
        self.locates &= other.locates;
    }

    /// How many identifiers it stands for.
    fn identifiers(&self) -> usize {
        self.members.len() + self.unnamed
    }

    /// The entry as the ledger writes it: in the cheaper of its forms, and, when that is the
    /// compact one of a run, in full (every member on a line), to use if room is left. A
    /// lone identifier seen more than once says how often, for an extension to read back.
    fn forms(&self, encoding: Encoding) -> (String, Option<String>) {
        let full: String = match self.members.as_slice() {
            [id] if self.times > 1 => format!("- {id} (×{})\n", self.times),
            members => members.iter().map(|id| format!("- {id}\n")).collect(),
        };
        let compact = match self.members.as_slice() {
            [first, .., last] => format!(
                "- {first}{RUN_ELLIPSIS}{last} ({} alike)\n",
                self.identifiers()
            ),
            _ => return (full, None),
        };
        if self.unnamed > 0 {
            (compact, None)
        } else if count_text(encoding, &compact) < count_text(encoding, &full) {
            (compact, Some(full))
        } else {
            (full, None)
        }
    }
}

/// The rank of a message's own role.
fn role_rank(message: &Value) -> Rank {
    match message.get("role").and_then(Value::as_str) {
        Some("tool" | "function") => Rank::ToolOutput,
        Some("assistant") => Rank::Model,
        // The user's, and the system or developer turns that instruct mid-conversation.
        _ => Rank::User,
    }
}

/// The rank of one text of a message whose role ranks `rank`: a tool's output in a user
/// turn ranks as one.
fn text_rank(rank: Rank, text: &str) -> Rank {
    match rank {
        Rank::User if text.starts_with(TOOL_RESULT_TEXT) => Rank::ToolOutput,
        _ => rank,
    }
}

/// The texts of a message's content, its parts' in order.
fn content_texts(message: &Value) -> impl Iterator<Item = &str> {
    let (whole, parts) = match message.get("content") {
        Some(Value::String(text)) => (Some(text.as_str()), None),
        Some(Value::Array(parts)) => (None, Some(parts)),
        _ => (None, None),
    };
    let parts = parts
        .into_iter()
        .flatten()
        .filter_map(|part| part.get("text").and_then(Value::as_str));
    whole.into_iter().chain(parts)
}

/// Whether a message is a tool's output: in a role of its own (chat's `tool`, or the older
/// `function`), or in a user turn as the Messages and Gemini views write one, its first text
/// the tool's.
pub(super) fn is_tool_output(message: &Value) -> bool {
    let rank = role_rank(message);
    rank == Rank::ToolOutput
        || content_texts(message)
            .next()
            .is_some_and(|text| text_rank(rank, text) == Rank::ToolOutput)
}

/// The texts of a message by rank: its content's, and for an assistant's tool calls each
/// call's name and arguments.
fn texts(message: &Value) -> Vec<(Rank, &str)> {
    let rank = role_rank(message);
    let mut out: Vec<(Rank, &str)> = content_texts(message)
        .map(|text| (text_rank(rank, text), text))
        .collect();
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for call in calls {
            if let Some(function) = call.get("function") {
                for field in ["name", "arguments"] {
                    if let Some(text) = function.get(field).and_then(Value::as_str) {
                        out.push((Rank::Model, text));
                    }
                }
            }
        }
    }
    out
}

/// The ledger's entries for the identifiers of `previous` (an earlier summary being
/// extended, whose ledger must survive with its ranks) and of `messages` that `summary` does
/// not already say, best first (see [`Sightings::into_entries`]).
fn entries<'a>(
    summary: &str,
    previous: Option<&str>,
    messages: impl IntoIterator<Item = &'a Value>,
) -> Vec<LedgerEntry> {
    let messages: Vec<&Value> = messages.into_iter().collect();
    // The conversation's own tool-call ids pair calls with results; nobody needs them again.
    let call_ids: HashSet<&str> = messages
        .iter()
        .flat_map(|m| {
            let calls = m.get("tool_calls").and_then(Value::as_array);
            calls
                .into_iter()
                .flatten()
                .filter_map(|call| call.get("id"))
                .chain(m.get("tool_call_id"))
                .filter_map(Value::as_str)
        })
        .collect();
    let mut sightings = Sightings::default();
    if let Some(previous) = previous {
        sightings.read_summary(previous);
    }
    for message in &messages {
        for (rank, text) in texts(message) {
            for id in identifiers(text) {
                if !call_ids.contains(id.as_str()) {
                    sightings.note(&id, rank, 1);
                }
            }
        }
    }
    sightings.into_entries(summary)
}

/// The summary with every identifier it dropped carried verbatim under its Artifacts heading
/// (added when it has none), best first and under the heading of its rank, within
/// `budget_tokens` of `encoding`. Entries go in strictly in order until one does not fit;
/// the list says how many identifiers that left out (all recallable from the archive). Room
/// left then writes compact runs in full, best first, so runs are cut short only when the
/// budget needs it.
pub fn carry<'a>(
    summary: String,
    previous: Option<&str>,
    messages: impl IntoIterator<Item = &'a Value>,
    budget_tokens: u32,
    encoding: Encoding,
) -> String {
    let entries = entries(&summary, previous, messages);
    if entries.is_empty() {
        return summary;
    }
    let heading_tokens = |rank: Rank| count_text(encoding, &format!("{}\n", rank.heading()));
    let mut used = 0u32;
    let mut left_out = 0;
    let mut written: Vec<(Rank, String, Option<String>)> = Vec::new();
    for entry in &entries {
        if left_out > 0 {
            left_out += entry.identifiers();
            continue;
        }
        let (line, in_full) = entry.forms(encoding);
        let opens_rank = written.last().map(|(rank, _, _)| *rank) != Some(entry.rank);
        let heading = opens_rank.then(|| heading_tokens(entry.rank));
        let tokens = count_text(encoding, &line) + heading.unwrap_or(0);
        if used + tokens > budget_tokens {
            left_out += entry.identifiers();
            continue;
        }
        used += tokens;
        written.push((entry.rank, line, in_full));
    }
    let mut room = budget_tokens.saturating_sub(used);
    for (_, line, in_full) in &mut written {
        if let Some(full) = in_full.take() {
            let extra = count_text(encoding, &full).saturating_sub(count_text(encoding, line));
            if extra <= room {
                room -= extra;
                *line = full;
            }
        }
    }
    let mut ledger = format!("{LEDGER_INTRO}\n");
    let mut rank = None;
    for (entry_rank, line, _) in written {
        if rank != Some(entry_rank) {
            ledger.push_str(entry_rank.heading());
            ledger.push('\n');
            rank = Some(entry_rank);
        }
        ledger.push_str(&line);
    }
    if left_out > 0 {
        ledger.push_str(&format!("- ({left_out} more left out)\n"));
    }
    insert_under_artifacts(summary, &ledger)
}

/// `ledger` at the end of the summary's Artifacts section, or in a section of its own.
fn insert_under_artifacts(summary: String, ledger: &str) -> String {
    let section = summary
        .match_indices(ARTIFACTS_HEADING)
        .find(|(at, _)| *at == 0 || summary.as_bytes()[at - 1] == b'\n')
        .map(|(at, _)| at);
    let Some(start) = section else {
        return format!("{}\n\n{ARTIFACTS_HEADING}\n{ledger}", summary.trim_end());
    };
    let body = start + ARTIFACTS_HEADING.len();
    let end = summary[body..]
        .find("\n## ")
        .map_or(summary.len(), |at| body + at + 1);
    let (before, after) = summary.split_at(end);
    let before = before.trim_end();
    if after.is_empty() {
        format!("{before}\n{ledger}")
    } else {
        format!("{before}\n{ledger}\n{after}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The entries `carry` weighs, best first, each as its identifiers.
    fn ranked(previous: Option<&str>, messages: &[Value]) -> Vec<String> {
        entries("", previous, messages)
            .iter()
            .map(|entry| entry.members.join(" "))
            .collect()
    }

    /// A summary that kept nothing: only the ledger carries identifiers.
    const KEPT_NOTHING: &str = "## Goal and constraints\nnone";

    /// The ledger `carry` adds to a summary that kept nothing.
    fn carried(previous: Option<&str>, messages: &[Value], budget: u32) -> String {
        carry(
            KEPT_NOTHING.into(),
            previous,
            messages,
            budget,
            Encoding::O200k,
        )
    }

    fn tool_output(text: &str) -> Value {
        json!({"role": "tool", "tool_call_id": "c0", "content": text})
    }

    #[test]
    fn the_user_ranks_before_the_model_and_the_model_before_tool_outputs() {
        let messages = [
            tool_output("wrote /srv/old.log, build-7f3a"),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/app.rs\"}"}}
            ]}),
            json!({"role": "assistant", "content": "The cost is $90; see /srv/old.log"}),
            json!({"role": "user", "content": "fix ORD-4411"}),
            // A tool result as the Messages API's view writes it, in a user turn with a
            // reminder of the user's.
            json!({"role": "user", "content": [
                {"type": "text", "text": "[tool result toolu_1]\nE0425 in lib.rs"},
                {"type": "text", "text": "remember KX-7731-QZ"},
            ]}),
        ];
        assert_eq!(
            ranked(None, &messages),
            [
                "ORD-4411",
                "KX-7731-QZ",
                // The model's: what it said and what it called a tool with, even if a tool
                // printed it first.
                "/srv/old.log",
                "$90",
                "src/app.rs",
                "build-7f3a",
                "E0425",
                "lib.rs",
            ]
        );
        let out = carried(None, &messages, 512);
        let headings = [Rank::User, Rank::Model, Rank::ToolOutput].map(|r| out.find(r.heading()));
        assert!(
            headings.iter().all(Option::is_some) && headings.is_sorted(),
            "{out}"
        );
    }

    #[test]
    fn within_a_rank_what_was_seen_more_than_once_comes_first_then_what_was_seen_first() {
        let messages = [
            tool_output("commit 4f9c2ab1 built"),
            tool_output("ticket PAY-12 opened, ticket ZX-4417-QA closed"),
            tool_output("ZX-4417-QA reopened"),
        ];
        assert_eq!(
            ranked(None, &messages),
            ["ZX-4417-QA", "4f9c2ab1", "PAY-12"]
        );
        let out = carried(None, &messages, 512);
        assert!(out.contains("- ZX-4417-QA (×2)\n- 4f9c2ab1\n"), "{out}");
    }

    #[test]
    fn what_cannot_be_found_again_ranks_before_what_locates() {
        let messages = [tool_output(
            "see /srv/b.txt: sha256:9f86d081884c7d65 at src/a.rs:42 in eu-west-1",
        )];
        assert_eq!(
            ranked(None, &messages),
            [
                "sha256:9f86d081884c7d65",
                "src/a.rs:42",
                "eu-west-1",
                "/srv/b.txt"
            ]
        );
    }

    #[test]
    fn a_run_of_one_pattern_with_a_counter_is_one_entry_written_compactly_when_room_is_short() {
        let mut messages: Vec<Value> = (1..=103)
            .map(|t| tool_output(&format!("turn-{t} failed at src/worker.rs:{}", 10 * t)))
            .collect();
        messages.push(tool_output("last good commit 4f9c2ab1"));
        messages.push(json!({"role": "user", "content": "why did turn-5 fail?"}));
        let ranked = ranked(None, &messages);
        assert_eq!(ranked.len(), 4, "{ranked:?}");
        assert_eq!(ranked[0], "turn-5", "the user's, apart from the run");
        let out = carried(None, &messages, 80);
        for line in [
            "- turn-5 (×2)\n",
            "- turn-1 … turn-103 (102 alike)\n",
            "- src/worker.rs:10 … src/worker.rs:1030 (103 alike)\n",
            "- 4f9c2ab1\n",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
        assert!(!out.contains("left out"), "{out}");
        // With room, a run is written in full.
        let out = carried(None, &messages[..3], 512);
        assert!(out.contains("- turn-1\n- turn-2\n- turn-3\n"), "{out}");
    }

    #[test]
    fn ranks_repetitions_and_runs_survive_extensions() {
        let turns = |range: std::ops::RangeInclusive<usize>| {
            range.map(|t| tool_output(&format!("turn-{t} done")))
        };
        let mut first = vec![
            json!({"role": "user", "content": "fix KX-7731-QZ"}),
            tool_output("commit 4f9c2ab1; PAY-12 open"),
            tool_output("PAY-12 blocked"),
        ];
        first.extend(turns(1..=5));
        let summary = carried(None, &first, 512);
        // Then enough new identifiers, each seen once in a tool output, to fill the budget.
        let mut second: Vec<Value> = turns(6..=60).collect();
        second.extend((0..60).map(|i| {
            let hash = blake3::hash(&[i]).to_hex();
            tool_output(&format!("build {}", &hash[..10]))
        }));
        let summary = carried(Some(&summary), &second, 60);
        assert!(
            summary.contains("- 4f9c2ab1\n") && summary.contains("more left out)"),
            "what was seen first stays: {summary}"
        );
        // A member of the compact run seen again is not counted twice.
        let third: Vec<Value> = turns(61..=70)
            .chain([tool_output("PAY-12 closed"), tool_output("turn-30 retried")])
            .collect();
        let summary = carried(Some(&summary), &third, 60);
        let user = summary.find(Rank::User.heading()).unwrap();
        let tools = summary.find(Rank::ToolOutput.heading()).unwrap();
        let at = |line: &str| {
            summary
                .find(line)
                .unwrap_or_else(|| panic!("{line} in {summary}"))
        };
        assert!(user < at("- KX-7731-QZ\n") && at("- KX-7731-QZ\n") < tools);
        assert!(tools < at("- turn-1 … turn-70 (70 alike)\n"), "{summary}");
        assert!(at("- PAY-12 (×3)\n") < at("- 4f9c2ab1\n"), "{summary}");
    }

    #[test]
    fn a_summary_says_an_identifier_only_whole() {
        assert!(says("ticket ORD-4411.", "ORD-4411"));
        assert!(
            !says("turn-10 failed", "turn-1"),
            "not a longer one's start"
        );
        assert!(!says("see data.rs", "a.rs"), "nor its end");
    }

    #[test]
    fn dropped_identifiers_are_carried_under_artifacts_within_the_budget() {
        let messages =
            [json!({"role": "user", "content": "ticket ORD-4411 costs $90 at /a/b.txt"})];
        let summary = "## Goal and constraints\nThe user has a ticket ORD-4411.\n## Artifacts\nnone\n## Next step\nnone";
        let out = carry(summary.into(), None, &messages, 512, Encoding::O200k);
        let artifacts = &out[out.find("## Artifacts").unwrap()..out.find("## Next step").unwrap()];
        assert!(
            artifacts.contains("- $90") && artifacts.contains("- /a/b.txt"),
            "{out}"
        );
        assert!(!out.contains("- ORD-4411"), "kept by the summary: {out}");
        assert!(out.ends_with("## Next step\nnone"), "{out}");

        // Fifty commits, no two alike.
        let commits: Vec<String> = (0..50u8)
            .map(|i| blake3::hash(&[i]).to_hex()[..12].to_string())
            .collect();
        let many: Vec<Value> = commits
            .iter()
            .map(|commit| json!({"role": "user", "content": format!("see commit {commit}")}))
            .collect();
        let out = carried(None, &many, 40);
        let ledger = &out[out.find(LEDGER_INTRO).unwrap()..];
        assert!(count_text(Encoding::O200k, ledger) <= 40 + 20, "{ledger}");
        let carried = commits
            .iter()
            .filter(|c| ledger.contains(c.as_str()))
            .count();
        assert!(carried > 0 && carried < 50);
        assert!(
            ledger.contains(&format!("({} more left out)", 50 - carried)),
            "{ledger}"
        );
        assert!(
            ledger.contains(&commits[0]),
            "the first seen first: {ledger}"
        );
    }

    #[test]
    fn the_budget_grows_with_the_window_from_the_configured_floor() {
        assert_eq!(budget(512, 8_000), 512);
        assert_eq!(budget(512, 128_000), 512);
        assert_eq!(budget(512, 200_000), 781);
        assert_eq!(budget(512, 1_000_000), 3_906);
        assert_eq!(budget(5_000, 1_000_000), 5_000);
    }

    #[test]
    fn the_conversations_own_call_ids_are_not_carried() {
        let messages = [
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_42", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
            json!({"role": "user", "content": "[tool result toolu_42]\nbuild build-7f3a"}),
            json!({"role": "tool", "tool_call_id": "call_9x81", "content": "call_9x81: ok"}),
        ];
        assert_eq!(ranked(None, &messages), ["build-7f3a"]);
    }

    #[test]
    fn an_extended_summary_keeps_the_ledger_it_extends() {
        // A ledger with no rank headings, as written before ranks were recorded.
        let previous =
            "## Artifacts\nCarried verbatim from the earlier messages:\n- /srv/kept.db\n";
        let new = [json!({"role": "user", "content": "now ORD-9"})];
        let out = carry(
            "## Goal and constraints\nmore".into(),
            Some(previous),
            &new,
            512,
            Encoding::O200k,
        );
        let model = out.find(Rank::Model.heading()).unwrap();
        assert!(out[model..].contains("- /srv/kept.db\n"), "{out}");
    }
}
