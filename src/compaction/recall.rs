//! The recall tool's side in compaction: the short stable reference an archived item is
//! named by, and the tool's answer to one call (the items asked for by reference, or found
//! by a lexical search over this conversation's archive), within a token budget.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::compaction::shorten::cut_middle;
use crate::compaction::summary::{hex, Key};
use crate::conversation::{Item, Kind, Role};
use crate::tokens::encoding::Encoding;
use crate::tokens::memo::Memo;
use crate::tokens::rules::{count_text, count_tools};

pub const REFERENCE_PREFIX: &str = "ctx:";

/// 32 bits of a conversation's key, shown in its references: two histories of one caller
/// whose ids match still read only their own items, since an item is archived under the
/// whole key of what came before it (`ArchiveScope`).
const CONVERSATION_HEX_DIGITS: usize = 8;

/// What a conversation's archive keys are hashed from besides its items. No caller is in it:
/// the archive is keyed by caller already, and an id made of the conversation alone can be
/// told without a request (`condenser plan`).
pub const CONVERSATION_SEED: Key = [0; 32];

/// Room for every encoding's count of the tool (`tool_tokens`).
const ENCODINGS: usize = 3;

const EXPECTED_SHAPE: &str = r#"expected {"refs": ["ctx:…", …]} or {"query": "words"} (or both)"#;

/// Where two parts of an answer meet.
const SEPARATOR: &str = "\n\n";

/// BM25's usual constants: how fast a term's repetitions stop adding, and how much a long
/// item is discounted.
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;

/// The tool's name, the same in every dialect.
pub const TOOL_NAME: &str = "condenser_recall";

/// What the model reads about the tool: what it is for, in a few words.
pub const TOOL_DESCRIPTION: &str = "Recall, verbatim, earlier parts of this conversation that \
were summarized away. Pass the ctx: references the context summary names, or a search query.";

/// The tool's parameters, as a JSON schema every dialect's definition carries.
pub fn parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "refs": {
                "type": "array",
                "items": {"type": "string"},
                "description": "References to recall, such as ctx:7f3a2c91.12"
            },
            "query": {
                "type": "string",
                "description": "Words to search the summarized messages for"
            }
        }
    })
}

/// What the tool's definition costs a request, as every dialect counts a function tool:
/// counted once per encoding, as it never changes. Counted each time, it was 0.6M of a
/// compacted agent request's 27.6M instructions, asked four times (`bench/instruction_budget.sh`,
/// callgrind).
pub fn tool_tokens(encoding: Encoding) -> u32 {
    static COUNTED: LazyLock<Memo<u32>> = LazyLock::new(|| Memo::new(ENCODINGS));
    COUNTED.get_or_derive(encoding.name(), || counted_tool_tokens(encoding))
}

fn counted_tool_tokens(encoding: Encoding) -> u32 {
    let tool = json!({"type": "function", "function": {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": parameters(),
    }});
    count_tools(encoding, std::slice::from_ref(&tool))
}

/// Whether an item binds what follows it in the archive: every item but a tool's output,
/// which a client may replace with a stub of its own (`<tool_output_masked>`) once it is far
/// back, while the items the model and the user wrote stay as they were sent.
pub fn binds(item: &Item) -> bool {
    item.kind != Kind::ToolResult
}

/// How many of a conversation's first items make its id: its items through the first the
/// model wrote after the head (the head and first item alone while the model has written
/// none). The same on every turn and every replica, and not shared by two histories that
/// open alike but for what the model first said (a tool call's id is the provider's, new
/// each time).
pub fn opening(items: &[Item], head: usize) -> usize {
    let first_written = items
        .iter()
        .enumerate()
        .skip(head)
        .find(|(_, item)| item.role == Role::Assistant)
        .map_or(head, |(index, _)| index);
    (first_written + 1).min(items.len())
}

/// A conversation's id in its caller's archive, shown in its references: the first digits of
/// the archive's key after its opening (`opening`, `ArchiveScope`).
pub fn conversation_id(opening_key: &Key) -> String {
    hex(opening_key)[..CONVERSATION_HEX_DIGITS].to_string()
}

/// The reference of the conversation's item `index`: `ctx:<conversation>.<index>`. Named by
/// position, the references of a summarized span are one range, which the summary names in
/// one line however long the span (`archived_note`).
pub fn reference(conversation: &str, index: usize) -> String {
    format!("{REFERENCE_PREFIX}{conversation}.{index}")
}

/// The line a summary ends with when recall is offered: the references of the items
/// `summarized` it replaces.
pub fn archived_note(conversation: &str, summarized: Range<usize>, unit: &str) -> String {
    format!(
        "\n\n[The {unit} this summary replaces are archived verbatim as {} to {}: \
         call condenser_recall with references or a search query to read them.]",
        reference(conversation, summarized.start),
        reference(conversation, summarized.end.saturating_sub(1)),
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallAnswer {
    pub text: String,
    pub is_error: bool,
}

impl RecallAnswer {
    fn error(text: String) -> RecallAnswer {
        RecallAnswer {
            text,
            is_error: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallLimits {
    pub max_tokens: u32,
    pub encoding: Encoding,
}

/// What a model may send: one reference or several, a query, or both.
#[derive(Deserialize)]
struct Arguments {
    #[serde(default)]
    refs: Refs,
    #[serde(default)]
    query: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Refs {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl Refs {
    /// The references asked for, once each, in the order asked; a bare hash gets the prefix
    /// the model left off.
    fn normalized(self) -> Vec<String> {
        let asked = match self {
            Refs::None => Vec::new(),
            Refs::One(reference) => vec![reference],
            Refs::Many(references) => references,
        };
        let mut seen = HashSet::new();
        asked
            .iter()
            .map(|reference| reference.trim())
            .filter(|reference| !reference.is_empty())
            .map(|reference| {
                if reference.starts_with(REFERENCE_PREFIX) {
                    reference.to_string()
                } else {
                    format!("{REFERENCE_PREFIX}{reference}")
                }
            })
            .filter(|reference| seen.insert(reference.clone()))
            .collect()
    }
}

/// An item a request's summary or cuts took out, under its reference.
pub type Archived = (String, Arc<str>);

/// The tool's answer to one call, from `archived`: the items this request's summary and
/// cuts took out, in the conversation's order (what a query searches). A reference outside
/// them is not this conversation's to recall, whatever else its caller archived. Never an
/// error to the client: whatever goes wrong is told to the model in the answer.
pub fn answer(archived: &[Archived], arguments: &str, limits: &RecallLimits) -> RecallAnswer {
    let Ok(arguments) = serde_json::from_str::<Arguments>(arguments) else {
        return RecallAnswer::error(format!("invalid arguments: {EXPECTED_SHAPE}"));
    };
    let refs = arguments.refs.normalized();
    let query = arguments.query.filter(|query| !query.trim().is_empty());
    if refs.is_empty() && query.is_none() {
        return RecallAnswer::error(format!("nothing asked: {EXPECTED_SHAPE}"));
    }

    let mut found: Vec<Archived> = Vec::new();
    let mut notes = Vec::new();
    let mut missing = Vec::new();
    for reference in &refs {
        match archived.iter().find(|(archived, _)| archived == reference) {
            Some(item) => found.push(item.clone()),
            None => missing.push(reference.as_str()),
        }
    }
    if !missing.is_empty() {
        notes.push(format!(
            "not archived for this conversation (unknown or expired): {}",
            missing.join(", ")
        ));
    }
    if let Some(query) = &query {
        let matches = search(archived, query, &refs);
        if matches.is_empty() {
            notes.push(format!("nothing archived matches {query:?}"));
        }
        found.extend(matches);
    }
    if found.is_empty() {
        return RecallAnswer::error(notes.join("\n"));
    }
    RecallAnswer {
        text: within_budget(&found, notes, query.as_deref(), limits),
        is_error: false,
    }
}

/// The archived items that match `query`, best first, leaving out those already asked for
/// by reference.
fn search(archived: &[Archived], query: &str, asked: &[String]) -> Vec<Archived> {
    let candidates: Vec<&Archived> = archived
        .iter()
        .filter(|(reference, _)| !asked.contains(reference))
        .collect();
    let documents: Vec<&str> = candidates.iter().map(|(_, text)| &**text).collect();
    rank(query, &documents)
        .into_iter()
        .map(|i| candidates[i].clone())
        .collect()
}

/// The items that fit `limits.max_tokens` whole, in order, then the notes. The first item is
/// always given: cut in the middle when it alone is over the budget. Those left out are
/// named, so the model can ask for them on their own.
fn within_budget(
    found: &[(String, Arc<str>)],
    notes: Vec<String>,
    query: Option<&str>,
    limits: &RecallLimits,
) -> String {
    let count = |text: &str| count_text(limits.encoding, text);
    let join = count(SEPARATOR) + JOIN_SLACK_TOKENS;
    let mut notes = notes;
    let mut used: u32 = notes.iter().map(|note| count(note) + join).sum();
    // Each item is taken with room kept for the note that would name those after it (the
    // item's own `join` is the separator before it), so the answer is seldom over the
    // budget once whole: each check below counts it all again.
    let left_out_cost = |after: usize| {
        let rest: Vec<&str> = found[after..].iter().map(|(r, _)| r.as_str()).collect();
        left_out_note(&rest, limits.max_tokens).map_or(0, |note| count(&note))
    };
    let mut blocks = Vec::new();
    // Which block is an item shown cut, whose note goes if the block does.
    let mut shown_cut = None;
    for (i, (reference, text)) in found.iter().enumerate() {
        let header = header(reference);
        let cost = count(&header) + count(text) + join;
        let reserve = left_out_cost(i + 1);
        if used.saturating_add(cost).saturating_add(reserve) <= limits.max_tokens {
            used += cost;
            blocks.push(format!("{header}{text}"));
            continue;
        }
        // Found by a query, an item is shown where it matched, while there is room for a
        // useful part of it: its middle, cut, may be just what was searched for. Asked by
        // reference, only the first is given cut, in its middle.
        let matched = query.and_then(|query| first_match(text, query));
        let cut_note = format!(
            "{reference} {} the budget of {} tokens: {}",
            match blocks.is_empty() {
                true => "alone is over",
                false => "is over what is left of",
            },
            limits.max_tokens,
            match matched {
                Some(_) => "shown around what matched the query",
                None => "its middle is cut",
            }
        );
        let room = limits
            .max_tokens
            .saturating_sub(used + count(&cut_note) + 2 * join + reserve + count(&header));
        let shown = match matched {
            Some(at) if blocks.is_empty() || room >= LEAST_EXCERPT_TOKENS => {
                Some(around(limits.encoding, text, at, room))
            }
            None if blocks.is_empty() => Some(cut_middle(limits.encoding, text, room, None)),
            _ => None,
        };
        if let Some(shown) = shown {
            shown_cut = Some(blocks.len());
            blocks.push(format!("{header}{shown}"));
            notes.insert(0, cut_note);
        }
        break;
    }
    // The sum of the parts' counts is an estimate: where parts meet, tokens may merge or
    // split. Checked once whole, and items dropped from the end until it fits.
    loop {
        let left_out: Vec<&str> = found[blocks.len()..]
            .iter()
            .map(|(r, _)| r.as_str())
            .collect();
        let text = render(&blocks, &notes, left_out_note(&left_out, limits.max_tokens));
        if blocks.len() <= 1 || count(&text) <= limits.max_tokens {
            return text;
        }
        blocks.pop();
        if shown_cut == Some(blocks.len()) {
            notes.remove(0);
        }
    }
}

/// Room left where two parts of an answer meet and their tokens merge differently.
const JOIN_SLACK_TOKENS: u32 = 2;

/// How many left-out references an answer names: a query that matches a long session's
/// every item would otherwise spend its budget on their names.
const LEFT_OUT_NAMED: usize = 10;

fn header(reference: &str) -> String {
    format!("[{reference}]\n")
}

fn left_out_note(left_out: &[&str], max_tokens: u32) -> Option<String> {
    (!left_out.is_empty()).then(|| {
        let named = left_out[..left_out.len().min(LEFT_OUT_NAMED)].join(", ");
        let more = match left_out.len().saturating_sub(LEFT_OUT_NAMED) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        format!("not returned, over the budget of {max_tokens} tokens (ask for them alone): {named}{more}")
    })
}

fn render(blocks: &[String], notes: &[String], left_out: Option<String>) -> String {
    let notes: Vec<&str> = notes
        .iter()
        .map(String::as_str)
        .chain(left_out.as_deref())
        .collect();
    let mut text = blocks.join(SEPARATOR);
    if !notes.is_empty() {
        text.push_str(SEPARATOR);
        text.push_str(&notes.join("\n"));
    }
    text
}

/// Where in `text` the query matches most tellingly: the first occurrence of the query's
/// word that `text` holds least often (`finding` over `a`), by byte.
fn first_match(text: &str, query: &str) -> Option<usize> {
    let query: HashSet<String> = terms(query).collect();
    let mut seen: HashMap<String, (usize, usize)> = HashMap::new();
    for (at, word) in words(text) {
        let word = word.to_lowercase();
        if query.contains(&word) {
            seen.entry(word).or_insert((0, at)).0 += 1;
        }
    }
    seen.into_values()
        .min_by_key(|&(times, at)| (times, at))
        .map(|(_, at)| at)
}

/// The alphanumeric words of `text`, each with where it starts.
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(move |word| (word.as_ptr() as usize - text.as_ptr() as usize, word))
}

/// The part of `text` from a little before byte `at`, within `budget` tokens, what it leaves
/// out before and after marked with their counts.
fn around(encoding: Encoding, text: &str, at: usize, budget: u32) -> String {
    let count = |part: &str| count_text(encoding, part);
    let whole = count(text).max(1);
    if whole <= budget {
        return text.to_string();
    }
    let bytes_per_token = text.len() as f64 / f64::from(whole);
    let mut room = f64::from(budget) * bytes_per_token;
    for _ in 0..MAX_TIGHTENINGS {
        // A match opens what it is about (a label, a name): most of the room goes after it.
        let before = (room / 4.0) as usize;
        let start = floor_boundary(text, at.saturating_sub(before));
        let end = floor_boundary(text, (start + room as usize).min(text.len()));
        let marked = |part: &str| match count(part) {
            0 => String::new(),
            n => format!("[… {n} tokens removed …]"),
        };
        let shown = format!(
            "{}\n{}\n{}",
            marked(&text[..start]),
            &text[start..end],
            marked(&text[end..])
        );
        let counted = count(&shown);
        if counted <= budget {
            return shown;
        }
        room -= f64::from(counted - budget) * bytes_per_token + 1.0;
        if room <= 0.0 {
            break;
        }
    }
    cut_middle(encoding, text, budget, None)
}

/// The least room an item found by a query is shown in after the first: fewer tokens say
/// too little around a match to be worth the answer's room.
const LEAST_EXCERPT_TOKENS: u32 = 128;

/// How many times `around` narrows its part when the estimate from bytes was over.
const MAX_TIGHTENINGS: usize = 4;

/// The nearest character boundary at or before byte `at`.
fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The lowercase alphanumeric words of `text`.
fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    words(text).map(|(_, word)| word.to_lowercase())
}

/// The indices of `documents` that share a word with `query`, best first by BM25 (ties in
/// their given order). Written here rather than taken from the `bm25` crate: that one brings
/// its own tokenizer, stemmer and stop-word lists for an embedding index, where this ranks
/// one request's archived items, as written, in about thirty lines.
fn rank(query: &str, documents: &[&str]) -> Vec<usize> {
    let query: HashSet<String> = terms(query).collect();
    let mut lengths = Vec::with_capacity(documents.len());
    let frequencies: Vec<HashMap<String, u32>> = documents
        .iter()
        .map(|document| {
            let mut frequency = HashMap::new();
            let mut length = 0u32;
            for term in terms(document) {
                length += 1;
                if query.contains(&term) {
                    *frequency.entry(term).or_default() += 1;
                }
            }
            lengths.push(f64::from(length));
            frequency
        })
        .collect();
    let count = documents.len() as f64;
    let average_length = (lengths.iter().sum::<f64>() / count.max(1.0)).max(1.0);
    let idf: HashMap<&str, f64> = query
        .iter()
        .map(|term| {
            let holding = frequencies.iter().filter(|f| f.contains_key(term)).count() as f64;
            let idf = ((count - holding + 0.5) / (holding + 0.5) + 1.0).ln();
            (term.as_str(), idf)
        })
        .collect();
    let mut scored: Vec<(usize, f64)> = frequencies
        .iter()
        .zip(&lengths)
        .enumerate()
        .filter(|(_, (frequency, _))| !frequency.is_empty())
        .map(|(i, (frequency, length))| {
            let norm = BM25_K1 * (1.0 - BM25_B + BM25_B * length / average_length);
            let score = frequency
                .iter()
                .map(|(term, &tf)| {
                    let tf = f64::from(tf);
                    idf.get(term.as_str()).copied().unwrap_or(0.0) * tf * (BM25_K1 + 1.0)
                        / (tf + norm)
                })
                .sum();
            (i, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::cache::PrefixKeys;
    use crate::compaction::rewrite::ArchiveScope;
    use crate::conversation::Views;

    fn limits(max_tokens: u32) -> RecallLimits {
        RecallLimits {
            max_tokens,
            encoding: Encoding::O200k,
        }
    }

    /// `items` as a request's archived items, and their references in order.
    fn archive(items: &[&str]) -> (Vec<Archived>, Vec<String>) {
        let archived: Vec<Archived> = items
            .iter()
            .enumerate()
            .map(|(i, text)| (reference("0a1b2c3d", i), Arc::from(*text)))
            .collect();
        let refs = archived.iter().map(|(r, _)| r.clone()).collect();
        (archived, refs)
    }

    #[test]
    fn the_tools_count_kept_is_each_encodings_own() {
        // Not o200k_harmony: a test sees it built on first use (`tokens::counter`).
        let encodings = [Encoding::Cl100k, Encoding::O200k];
        let counted = encodings.map(counted_tool_tokens);
        // Encodings that count the tool alike would hide one's count kept for another's.
        assert_ne!(counted[0], counted[1]);
        for _ in 0..2 {
            assert_eq!(encodings.map(tool_tokens), counted);
        }
    }

    fn ask(archived: &[Archived], arguments: Value) -> RecallAnswer {
        answer(archived, &arguments.to_string(), &limits(1_000))
    }

    /// The archive of chat-view items, with their planner's reading: role and kind by the
    /// view's role.
    fn archive_of(views: &[Value]) -> ArchiveScope {
        let items: Vec<Item> = views
            .iter()
            .map(|view| {
                let role = Role::parse(view["role"].as_str().unwrap_or(""));
                let kind = match role {
                    Role::Tool => Kind::ToolResult,
                    _ => Kind::Message,
                };
                Item::new(role, kind, 10)
            })
            .collect();
        let views = Views::made(views.to_vec());
        let keys = PrefixKeys::default();
        let archive = ArchiveScope::new([0; 32], &keys, (&views, &items, &[]), 1);
        // The id alone is the one the whole archive names.
        assert_eq!(
            ArchiveScope::conversation_id(&keys, (&views, &items, &[]), 1),
            archive.conversation
        );
        archive
    }

    fn id_of(views: &[Value]) -> String {
        archive_of(views).conversation
    }

    #[test]
    fn references_name_the_conversation_and_position_and_the_note_names_the_range() {
        let system = json!({"role": "system", "content": "rules"});
        let task = |text: &str| json!({"role": "user", "content": text});
        let said = |text: &str| json!({"role": "assistant", "content": text});
        let id = id_of(&[
            system.clone(),
            task("fix the build"),
            said("on it"),
            task("later"),
        ]);
        assert_eq!(id.len(), 8);
        // Its opening names it, through the model's first item; what follows does not.
        assert_eq!(
            id,
            id_of(&[system.clone(), task("fix the build"), said("on it")])
        );
        assert_ne!(
            id,
            id_of(&[system.clone(), task("write the docs"), said("on it")])
        );
        // Two histories that open alike but for what the model first said are two.
        assert_ne!(
            id,
            id_of(&[system.clone(), task("fix the build"), said("looking")])
        );
        // Before the model has said anything, the head and first item.
        assert_eq!(
            id_of(&[system.clone(), task("fix the build")]),
            id_of(&[system, task("fix the build"), task("and the tests")])
        );
        assert_eq!(reference(&id, 7), format!("ctx:{id}.7"));
        let note = archived_note(&id, 1..12, "messages");
        assert!(
            note.contains(&format!("ctx:{id}.1 to ctx:{id}.11")),
            "{note}"
        );
        assert!(note.contains("condenser_recall"));
    }

    #[test]
    fn an_item_is_bound_to_what_was_written_before_it_but_tool_outputs() {
        let system = json!({"role": "system", "content": "rules"});
        let task = json!({"role": "user", "content": "read the log"});
        let call = |id: &str| json!({"role": "assistant", "tool_calls": [{"id": id}]});
        let output = |text: &str| json!({"role": "tool", "content": text});
        let mine = [
            system.clone(),
            task.clone(),
            call("call_1"),
            output("the log"),
            call("call_2"),
            output("secret"),
        ];
        let bound = archive_of(&mine);
        assert_eq!(bound.bindings.len(), mine.len() + 1);
        // Outputs masked by the client since change nothing they bind.
        let mut masked = mine.clone();
        masked[3] = output("<tool_output_masked>");
        masked[5] = output("<tool_output_masked>");
        assert_eq!(archive_of(&masked), bound);
        // Another history of the same opening, whose model called its tool under another id:
        // another id, and the output after the call is kept elsewhere.
        let mut other = masked.clone();
        other[2] = call("call_9");
        let theirs = archive_of(&other);
        assert_eq!(theirs.bindings[..3], bound.bindings[..3]);
        assert_ne!(theirs.conversation, bound.conversation);
        assert_ne!(theirs.slot(5), bound.slot(5));
        // A later item the same history changed moves only what comes after it.
        let mut later = mine.clone();
        later[4] = call("call_3");
        let changed = archive_of(&later);
        assert_eq!(changed.slot(3), bound.slot(3));
        assert_ne!(changed.slot(5), bound.slot(5));
        assert_eq!(bound.slot(mine.len() + 1), None);
    }

    #[test]
    fn ranking_prefers_rare_repeated_words_in_short_items() {
        let documents = [
            "the build passed",
            "The PORT is 23456; the port, again: port.",
            "nothing relevant here",
            "the port is mentioned once in a long line about many other things entirely",
        ];
        // Case and punctuation do not matter; items without a query word are left out.
        assert_eq!(rank("Port?", &documents), [1, 3]);
        // A rare word outweighs a common one.
        assert_eq!(rank("the build", &documents)[0], 0);
        assert_eq!(rank("23456", &documents), [1]);
        assert!(rank("absent words", &documents).is_empty());
        assert!(rank("", &documents).is_empty());
        assert!(rank("port", &[]).is_empty());
        // Equal scores keep their given order.
        assert_eq!(rank("same", &["same text", "same text"]), [0, 1]);
    }

    #[test]
    fn arguments_of_the_wrong_shape_are_a_tool_error_naming_the_right_one() {
        let (archived, _) = archive(&["kept"]);
        for arguments in [
            "not json",
            "{}",
            r#"{"refs": []}"#,
            r#"{"query": "  "}"#,
            "[1]",
        ] {
            let answer = answer(&archived, arguments, &limits(100));
            assert!(answer.is_error, "{arguments}");
            assert!(
                answer.text.contains(r#"{"refs": ["ctx:…", …]}"#),
                "{arguments}: {}",
                answer.text
            );
        }
    }

    #[test]
    fn references_come_back_verbatim_in_the_order_asked() {
        let first = "we bind the service to port 23456\n  (decided by the user)  ";
        let (archived, refs) = archive(&[first, "second item"]);
        let answer = ask(&archived, json!({"refs": [refs[1], refs[0]]}));
        assert!(!answer.is_error);
        assert_eq!(
            answer.text,
            format!("[{}]\nsecond item\n\n[{}]\n{first}", refs[1], refs[0])
        );
        // One reference as a bare string, or without its prefix, is understood.
        let bare = refs[0].trim_start_matches(REFERENCE_PREFIX);
        for asked in [json!(refs[0]), json!([bare, refs[0]])] {
            let answer = ask(&archived, json!({ "refs": asked }));
            assert_eq!(answer.text, format!("[{}]\n{first}", refs[0]));
        }
    }

    #[test]
    fn unknown_references_are_named_and_an_error_only_when_none_was_found() {
        let (archived, refs) = archive(&["kept"]);
        let answer = ask(&archived, json!({"refs": [refs[0], "ctx:000000000000"]}));
        assert!(!answer.is_error);
        assert_eq!(
            answer.text,
            format!(
                "[{}]\nkept\n\nnot archived for this conversation (unknown or expired): ctx:000000000000",
                refs[0]
            )
        );
        let answer = ask(
            &archived,
            json!({"refs": ["ctx:000000000000", "ctx:111111111111"]}),
        );
        assert!(answer.is_error);
        assert_eq!(
            answer.text,
            "not archived for this conversation (unknown or expired): ctx:000000000000, ctx:111111111111"
        );
        // A reference this request did not take out is not recalled, though it names an
        // item of the same conversation: it may be another history's item at that place.
        let (other, _) = archive(&["kept", "a later item"]);
        let later = &other[1].0;
        let answer = ask(&archived, json!({ "refs": [later] }));
        assert!(answer.is_error);
        assert!(answer.text.contains(later.as_str()));
    }

    #[test]
    fn a_query_returns_this_conversations_best_matches_first() {
        let (archived, refs) = archive(&[
            "tests: 41 passed, 2 failed",
            "we bind the service to port 23456",
            "the port of the old service was 8080, port 8080",
        ]);
        let answer = ask(&archived, json!({"query": "Which PORT?"}));
        assert!(!answer.is_error);
        assert_eq!(
            answer.text,
            format!(
                "[{}]\nthe port of the old service was 8080, port 8080\n\n[{}]\nwe bind the service to port 23456",
                refs[2], refs[1]
            )
        );
        let answer = ask(&archived, json!({"query": "zebra"}));
        assert!(answer.is_error);
        assert_eq!(answer.text, r#"nothing archived matches "zebra""#);
    }

    #[test]
    fn refs_and_a_query_together_give_each_item_once() {
        let (archived, refs) = archive(&["port 23456", "port 8080", "tests passed"]);
        let answer = ask(
            &archived,
            json!({"refs": [refs[2], "ctx:000000000000"], "query": "port tests"}),
        );
        assert!(!answer.is_error);
        assert_eq!(answer.text.matches("tests passed").count(), 1);
        assert!(answer
            .text
            .starts_with(&format!("[{}]\ntests passed\n\n", refs[2])));
        assert!(answer.text.contains("port 23456") && answer.text.contains("port 8080"));
        assert!(answer.text.ends_with(
            "not archived for this conversation (unknown or expired): ctx:000000000000"
        ));
    }

    #[test]
    fn whole_items_are_given_while_they_fit_and_the_rest_named() {
        let item = |n: usize| format!("item {n}: {}", "word ".repeat(40));
        let texts: Vec<String> = (0..5).map(item).collect();
        let (archived, refs) = archive(&texts.iter().map(String::as_str).collect::<Vec<_>>());
        let arguments = json!({ "refs": refs }).to_string();
        let expected = format!(
            "[{}]\n{}\n\n[{}]\n{}\n\nnot returned, over the budget of {{budget}} tokens (ask for them alone): {}",
            refs[0],
            texts[0],
            refs[1],
            texts[1],
            refs[2..].join(", ")
        );
        // Room for two items and the note naming the rest (with the slack the parts' counts
        // keep where they meet), not for a third item.
        let budget = count_text(Encoding::O200k, &expected) + 8;
        let answer = answer(&archived, &arguments, &limits(budget));
        assert!(!answer.is_error);
        assert_eq!(
            answer.text,
            expected.replace("{budget}", &budget.to_string())
        );
        assert!(count_text(Encoding::O200k, &answer.text) <= budget);
    }

    #[test]
    fn a_long_list_left_out_is_named_in_part_and_the_answer_stays_within_budget() {
        let texts: Vec<String> = (0..40)
            .map(|n| format!("item {n}: {}", "word ".repeat(60)))
            .collect();
        let (archived, refs) = archive(&texts.iter().map(String::as_str).collect::<Vec<_>>());
        let arguments = json!({ "refs": refs }).to_string();
        let budget = 400;
        let answer = answer(&archived, &arguments, &limits(budget));
        assert!(count_text(Encoding::O200k, &answer.text) <= budget);
        let given = answer.text.matches("\nitem ").count();
        assert!(
            given >= 2,
            "{given} items in {budget} tokens: {}",
            answer.text
        );
        let note = answer.text.rsplit("\n\n").next().unwrap();
        let left_out = refs.len() - given;
        assert!(
            note.ends_with(&format!(
                "{} and {} more",
                refs[given + LEFT_OUT_NAMED - 1],
                left_out - LEFT_OUT_NAMED
            )),
            "{note}"
        );
        assert!(!note.contains(&refs[given + LEFT_OUT_NAMED]), "{note}");
    }

    #[test]
    fn an_item_alone_over_the_budget_is_cut_in_the_middle_and_says_so() {
        let long = format!("start {} end", "filler line\n".repeat(500));
        let (archived, refs) = archive(&[&long, "next"]);
        let arguments = json!({ "refs": refs }).to_string();
        let budget = 200;
        let answer = answer(&archived, &arguments, &limits(budget));
        assert!(!answer.is_error);
        assert!(
            count_text(Encoding::O200k, &answer.text) <= budget,
            "{}",
            answer.text
        );
        assert!(answer
            .text
            .starts_with(&format!("[{}]\nstart filler", refs[0])));
        assert!(answer.text.contains("tokens removed"));
        assert!(answer.text.contains(" end\n\n"));
        assert!(answer.text.contains(&format!(
            "{} alone is over the budget of {budget} tokens: its middle is cut",
            refs[0]
        )));
        assert!(answer
            .text
            .ends_with(&format!("(ask for them alone): {}", refs[1])));
    }

    #[test]
    fn an_item_found_by_a_query_and_over_the_budget_is_shown_where_it_matched() {
        // A log whose one telling line is in its middle, where a middle cut would take it out.
        let lines: Vec<String> = (0..400)
            .map(|i| format!("{i:03} a filler line of a log"))
            .collect();
        let mut log = lines.join("\n");
        let middle = log.find("200 a filler").unwrap();
        log.insert_str(middle, "FINDING-B: the cache key omits the target triple\n");
        let (archived, refs) = archive(&[&log]);
        let budget = 200;
        let asked = json!({"query": "FINDING B"}).to_string();
        let found = answer(&archived, &asked, &limits(budget));
        assert!(!found.is_error);
        assert!(
            count_text(Encoding::O200k, &found.text) <= budget,
            "{}",
            found.text
        );
        assert!(
            found
                .text
                .contains("FINDING-B: the cache key omits the target triple"),
            "{}",
            found.text
        );
        assert!(found.text.contains(&format!(
            "{} alone is over the budget of {budget} tokens: shown around what matched the query",
            refs[0]
        )));
        // What it leaves out on either side is marked, with its count.
        assert!(found.text.starts_with(&format!("[{}]\n[… ", refs[0])));
        assert_eq!(found.text.matches(" tokens removed …]").count(), 2);
        // Asked by reference, the same item is cut in its middle as before.
        let by_reference = answer(
            &archived,
            &json!({"refs": refs}).to_string(),
            &limits(budget),
        );
        assert!(
            !by_reference.text.contains("FINDING-B"),
            "{}",
            by_reference.text
        );
    }

    #[test]
    fn a_second_item_found_by_a_query_is_shown_around_its_match_in_the_room_left() {
        // The task that quotes the question ranks first; the log that answers it, long, next.
        let task = "Before you close it: what were FINDING-A and FINDING-B, the findings?";
        let lines: Vec<String> = (0..400)
            .map(|i| format!("{i:03} a filler line of a log"))
            .collect();
        let mut log = lines.join("\n");
        log.insert_str(
            log.find("200 a filler").unwrap(),
            "FINDING-A: runner-31 ran out of memory\n",
        );
        let (archived, refs) = archive(&[task, &log]);
        let budget = 400;
        let found = answer(
            &archived,
            &json!({"query": "FINDING A"}).to_string(),
            &limits(budget),
        );
        assert!(
            count_text(Encoding::O200k, &found.text) <= budget,
            "{}",
            found.text
        );
        assert!(
            found.text.starts_with(&format!("[{}]\n{task}", refs[0])),
            "{}",
            found.text
        );
        assert!(
            found
                .text
                .contains("FINDING-A: runner-31 ran out of memory"),
            "{}",
            found.text
        );
        assert!(found.text.contains(&format!(
            "{} is over what is left of the budget of {budget} tokens: shown around what matched",
            refs[1]
        )));
        assert!(!found.text.contains("not returned"), "{}", found.text);
    }

    #[test]
    fn the_telling_match_is_the_query_word_the_item_holds_least_often() {
        let text = "a b a FINDING c a";
        assert_eq!(first_match(text, "FINDING A"), text.find("FINDING"));
        assert_eq!(first_match(text, "absent"), None);
        // Words are whole: `a` is not found inside `alpha`.
        assert_eq!(first_match("alpha a", "a"), Some(6));
    }
}
