//! The conversation as every dialect presents it to counting, planning and compaction: a head
//! that is always kept, then items, each with a role and a kind, grouped into units that are
//! never split. A dialect maps its own request onto this (chat messages, Responses input
//! items, Anthropic messages); the planner and the compactor see nothing else.

use std::borrow::Cow;
#[cfg(test)]
use std::ops::Index;
use std::ops::Range;
use std::sync::OnceLock;

use serde_json::Value;

/// The conversation as chat messages, one per item: what compaction hashes into cache keys
/// when an item's identity is new, and what the summarizer and the archive read. A dialect
/// whose items are not chat messages makes each view the first time it is read: a compacted
/// request whose keys are found by its items' identities reads a handful (building all 181
/// of an agent's took 3.2M of its 24.1M instructions, `bench/instruction_budget.sh`).
pub struct Views<'a>(Source<'a>);

enum Source<'a> {
    Made(Cow<'a, [Value]>),
    Lazy {
        made: Box<[OnceLock<Value>]>,
        view: Box<dyn Fn(usize) -> Value + Send + Sync + 'a>,
    },
}

impl<'a> Views<'a> {
    /// Views made already: chat's own messages, or a copy.
    pub fn made(views: impl Into<Cow<'a, [Value]>>) -> Views<'a> {
        Views(Source::Made(views.into()))
    }

    /// `len` views, the one of item `index` made by `view(index)` when first read.
    pub fn lazy(len: usize, view: impl Fn(usize) -> Value + Send + Sync + 'a) -> Views<'a> {
        Views(Source::Lazy {
            made: (0..len).map(|_| OnceLock::new()).collect(),
            view: Box::new(view),
        })
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Source::Made(views) => views.len(),
            Source::Lazy { made, .. } => made.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, index: usize) -> Option<&Value> {
        match &self.0 {
            Source::Made(views) => views.get(index),
            Source::Lazy { made, view } => Some(made.get(index)?.get_or_init(|| view(index))),
        }
    }

    /// The views of the items in `range`, as far as the conversation goes.
    pub fn range(&self, range: Range<usize>) -> impl Iterator<Item = &Value> + '_ {
        let end = range.end.min(self.len());
        (range.start.min(end)..end).filter_map(|index| self.get(index))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Value> + '_ {
        self.range(0..self.len())
    }

    pub fn to_vec(&self) -> Vec<Value> {
        self.iter().cloned().collect()
    }
}

/// As a slice is indexed, in tests: out of range, it panics.
#[cfg(test)]
impl Index<usize> for Views<'_> {
    type Output = Value;

    fn index(&self, index: usize) -> &Value {
        match self.get(index) {
            Some(view) => view,
            None => panic!("item {index} of a conversation of {}", self.len()),
        }
    }
}

/// The role names of OpenAI's chat messages and Responses input messages.
pub const VALID_ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Other,
}

impl Role {
    pub fn parse(role: &str) -> Role {
        match role {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            _ => Role::Other,
        }
    }
}

/// What an item is, whatever its dialect calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text (and other content) from a participant.
    Message,
    /// Asks for one or more tool calls: a chat assistant message with `tool_calls`, a
    /// Responses `function_call`, an Anthropic assistant turn with `tool_use` blocks.
    ToolCall,
    /// Answers the calls before it: a chat `tool` message, a `function_call_output`, an
    /// Anthropic user turn with `tool_result` blocks.
    ToolResult,
    /// The model's reasoning, kept with the item it leads to.
    Reasoning,
    /// Anything else: a unit of its own, kept as sent.
    Other,
}

/// The text of a message's content: a string, or its text parts with placeholders for the rest.
pub fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) => text.to_string(),
                None => format!(
                    "[{}]",
                    part.get("type").and_then(Value::as_str).unwrap_or("part")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Content parts as the conversation view holds them: one text part is its text, as a client
/// may send it either way (Claude Code writes its task as a string when it sends it and as a
/// text block when it resumes the session). Equal views count alike and hash into the same
/// summary keys.
pub fn view_content(parts: Vec<Value>) -> Value {
    match <[Value; 1]>::try_from(parts) {
        Ok([part]) if part.get("type").and_then(Value::as_str) == Some("text") => {
            match part.get("text") {
                Some(Value::String(text)) => Value::String(text.clone()),
                _ => Value::Array(vec![part]),
            }
        }
        Ok(one) => Value::Array(one.to_vec()),
        Err(parts) => Value::Array(parts),
    }
}

/// How a tool's outputs may be cut (`[[context.tools]]`): as any other (`Normal`), `never`
/// (kept whole in the cut middle and in the summarizer's span), or `first` (cut at a cut step
/// before the other outputs of the middle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolCut {
    #[default]
    Normal,
    Never,
    First,
}

/// What the planner needs of one item.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    pub role: Role,
    pub kind: Kind,
    pub tokens: u32,
    /// For a tool output, how its tool's policy lets it be cut; `Normal` for any other item.
    pub cut: ToolCut,
}

impl Item {
    pub fn new(role: Role, kind: Kind, tokens: u32) -> Item {
        Item {
            role,
            kind,
            tokens,
            cut: ToolCut::Normal,
        }
    }

    /// A tool output that a cut may shorten: over the cut size `keep`, and not kept whole by
    /// its tool's policy.
    pub fn cuttable(&self, keep: u32) -> bool {
        self.kind == Kind::ToolResult && self.tokens > keep && self.cut != ToolCut::Never
    }
}

/// The names of the tools each item of `view` answers, for the tool outputs among `items`:
/// a chat-shaped conversation view (every dialect presents one), whose calls are assistant
/// messages' `tool_calls`. An output naming its call (`tool_call_id`) answers that call; one
/// that does not (a Messages or Gemini turn answering every call before it) answers every
/// call of its unit.
pub fn answered_tools<'v>(view: &'v Views<'_>, items: &[Item]) -> Vec<Vec<&'v str>> {
    let mut calls: Vec<(&str, &str)> = Vec::new();
    let mut previous = None;
    let mut answered = Vec::with_capacity(view.len());
    for (message, item) in view.iter().zip(items) {
        let mut names = Vec::new();
        match item.kind {
            Kind::ToolCall => {
                // A new round's calls, unless they continue the calls just before.
                if previous != Some(Kind::ToolCall) {
                    calls.clear();
                }
                let listed = message.get("tool_calls").and_then(Value::as_array);
                for call in listed.into_iter().flatten() {
                    let id = call.get("id").and_then(Value::as_str).unwrap_or("");
                    let name = call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    calls.push((id, name));
                }
            }
            Kind::ToolResult => {
                let id = message.get("tool_call_id").and_then(Value::as_str);
                names = calls
                    .iter()
                    .filter(|(call, _)| id.is_none_or(|id| id == *call))
                    .map(|(_, name)| *name)
                    .collect();
            }
            _ => {}
        }
        if item.kind != Kind::Reasoning {
            previous = Some(item.kind);
        }
        answered.push(names);
    }
    answered
}

/// How many leading items are the head (system and developer messages), always kept.
pub fn head_len(items: &[Item]) -> usize {
    items
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count()
}

/// Where each unit after the head starts. A unit is an item and whatever must travel with
/// it: tool calls with every result that answers them (parallel calls included), and
/// reasoning with the item it leads to. `None` when a tool result follows no call, a
/// conversation the planner does not understand.
pub fn units(items: &[Item]) -> Option<Vec<usize>> {
    let head = head_len(items);
    let mut starts = Vec::new();
    let mut open_call = false;
    let mut previous = None;
    for (i, item) in items.iter().enumerate().skip(head) {
        let joins_previous = match item.kind {
            Kind::ToolResult if !open_call => return None,
            Kind::ToolResult => true,
            Kind::ToolCall => matches!(previous, Some(Kind::ToolCall | Kind::Reasoning)),
            _ => previous == Some(Kind::Reasoning),
        };
        if !joins_previous {
            starts.push(i);
        }
        open_call = match item.kind {
            Kind::ToolCall => true,
            Kind::ToolResult => open_call,
            _ => false,
        };
        previous = Some(item.kind);
    }
    Some(starts)
}

/// The current task: the turn of the newest prompt (the last user message that is not a tool
/// result), whole. That is every item the client sent in a row around it, before the model
/// answered: in a one-prompt session the whole opening turn (Codex's
/// `<environment_context>` message before the task, a task split over several messages,
/// Claude Code's reminders), and the system or developer messages right after the prompt
/// (Claude Code sends its environment so). An agent sends them once, then tool rounds; they
/// stay in view (pinned) while what follows is summarized.
pub fn task_prompt(items: &[Item], units: &[usize]) -> Option<Range<usize>> {
    let prompt = units
        .iter()
        .rev()
        .copied()
        .find(|&i| items[i].role == Role::User && items[i].kind == Kind::Message)?;
    let head = head_len(items);
    let before = items[head..prompt]
        .iter()
        .rev()
        .take_while(|item| sent_by_the_client(item))
        .count();
    let instructions = items[prompt + 1..]
        .iter()
        .take_while(|item| matches!(item.role, Role::System | Role::Developer))
        .count();
    Some(prompt - before..prompt + 1 + instructions)
}

/// A message of the client's own (user, system or developer), not a tool's answer: each is a
/// unit of its own, and a run of them is one turn.
fn sent_by_the_client(item: &Item) -> bool {
    item.kind == Kind::Message && matches!(item.role, Role::User | Role::System | Role::Developer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(role: Role, kind: Kind) -> Item {
        Item::new(role, kind, 1)
    }

    #[test]
    fn calls_results_and_reasoning_stay_with_what_they_belong_to() {
        use Kind::*;
        let items = [
            item(Role::System, Message),
            item(Role::User, Message),
            item(Role::Assistant, Reasoning),
            item(Role::Assistant, ToolCall),
            item(Role::Assistant, ToolCall),
            item(Role::Tool, ToolResult),
            item(Role::Tool, ToolResult),
            item(Role::Assistant, Message),
            item(Role::User, ToolResult),
        ];
        assert_eq!(head_len(&items), 1);
        assert_eq!(units(&items[..8]), Some(vec![1, 2, 7]));
        assert_eq!(
            units(&items),
            None,
            "a result after a plain message answers nothing"
        );
        let answered_in_a_user_turn = [
            item(Role::Assistant, ToolCall),
            item(Role::User, ToolResult),
            item(Role::User, Message),
        ];
        assert_eq!(units(&answered_in_a_user_turn), Some(vec![0, 2]));
    }

    #[test]
    fn the_task_is_the_newest_prompts_whole_turn() {
        use Kind::*;
        // Codex: instructions, then its environment and the task as two user messages.
        let opening = [
            item(Role::Developer, Message),
            item(Role::User, Message),
            item(Role::User, Message),
            item(Role::Assistant, ToolCall),
            item(Role::Tool, ToolResult),
            item(Role::Assistant, ToolCall),
            item(Role::Tool, ToolResult),
        ];
        let starts = units(&opening).unwrap_or_default();
        assert_eq!(task_prompt(&opening, &starts), Some(1..3));
        // A second prompt is the task; the first turn is history.
        let mut later = opening.to_vec();
        later.extend([
            item(Role::User, Message),
            item(Role::System, Message),
            item(Role::Assistant, Message),
        ]);
        let starts = units(&later).unwrap_or_default();
        assert_eq!(task_prompt(&later, &starts), Some(7..9));
        // A prompt right after a tool's answer starts its own turn.
        let mut interjected = opening.to_vec();
        interjected.push(item(Role::User, Message));
        let starts = units(&interjected).unwrap_or_default();
        assert_eq!(task_prompt(&interjected, &starts), Some(7..8));
    }
}
