//! The scripted models read what they are sent (issue 36), the same in all four APIs. Each log
//! names the next one on a `next-step:` line in its middle (where a cut takes text out), and
//! the next read must carry that name: the model takes it from the newest tool output in the
//! request it was sent. When that output was cut, the model calls `condenser_recall` for it,
//! by the reference the cut names, as a model would; when it cannot get the name at all, the
//! step is blind. The session's last prompt asks for three findings, planted in the first,
//! a middle and the last round: the model answers from what the request shows, or recalls
//! each finding it cannot see by a query. Every step and every recall is tallied for the
//! judge.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::{filler, said_by_the_client, texts, PLANTED, ROUNDS, TICKET};

/// What each log says its next step is.
const NEXT_STEP: &str = "next-step: ";
/// The ids the scripted models give their recall calls start so, in every API.
pub const RECALL_CALL: &str = "call_recall";
/// The last prompt, which asks for the findings.
pub const QUESTION: &str = "Before you close the ticket: what were the three findings, \
                            FINDING-A, FINDING-B and FINDING-C?";

/// The findings: the round whose log states it, its label, and what it says.
pub const FINDINGS: [(usize, &str, &str); 3] = [
    (1, "FINDING-A", "the linker ran out of memory on runner-31"),
    (
        ROUNDS / 2,
        "FINDING-B",
        "the cache key omits the target triple",
    ),
    (
        ROUNDS - 1,
        "FINDING-C",
        "pinning mold 2.4 fixes the nightly build",
    ),
];

/// The words step tokens are made of.
const TOKEN_WORDS: [&str; 16] = [
    "alfa", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike", "oscar",
    "papa", "quebec", "sierra", "tango", "zulu",
];

/// The token of `round`'s step: three words, random-looking, the same every run. Words and
/// not a hash, so that the artifact ledger does not take each for an identifier (110 of
/// those would crowd out the ones the judge plants).
fn step_token(round: usize) -> String {
    let mixed = (round as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (0..3)
        .map(|word| TOKEN_WORDS[(mixed >> (4 * word)) as usize % TOKEN_WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The name of the log the agent reads in `round`, which only the log before it (or, for the
/// first, the task) tells.
pub fn log_name(round: usize) -> String {
    format!("log-{round:03} {}", step_token(round))
}

/// The log the agent reads in `round`: `lines` lines of about 15 tokens, with that round's
/// planted identifier first, and in the middle the name of the next log and the round's
/// finding, if it has one.
pub fn log_file(round: usize, lines: usize) -> String {
    let planted = PLANTED
        .iter()
        .find(|(r, _)| *r == round)
        .map(|(_, id)| format!("deploy note: artifact {id} is the one to check\n"))
        .unwrap_or_default();
    let line = |line: usize| format!("{round:03}.{line:03} {}\n", filler(round * 61 + line, 11));
    let finding = FINDINGS
        .iter()
        .find(|(r, _, _)| *r == round)
        .map(|(_, label, says)| format!("{label}: {says}\n"))
        .unwrap_or_default();
    let middle = format!("{NEXT_STEP}{}\n{finding}", log_name(round + 1));
    let (first, second): (String, String) = (
        (0..lines / 2).map(line).collect(),
        (lines / 2..lines).map(line).collect(),
    );
    format!("{planted}{first}{middle}{second}")
}

pub fn write_logs(dir: &Path, lines: usize) {
    for round in 0..ROUNDS {
        std::fs::write(dir.join(log_name(round)), log_file(round, lines)).unwrap();
    }
}

/// The task with the question in it, for a client that takes one prompt a session.
pub fn task_asking() -> String {
    format!("{} Then answer: {QUESTION}", claude_task())
}

pub fn claude_task() -> String {
    format!(
        "Ticket {TICKET}: the nightly build fails. Read the logs one at a time, starting with \
         {}: each names the next on its `{NEXT_STEP}` line. Go on until you find the cause.",
        log_name(0)
    )
}

/// What the scripted model does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Move {
    /// Reads the log of this name with the client's tool.
    Read(String),
    /// Calls `condenser_recall` with these arguments, under this call id.
    Recall { id: String, arguments: Value },
    /// Says this and ends its turn.
    Say(String),
}

/// How the model came by a step's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// In the newest output as sent.
    There,
    /// Only from a recall.
    Recalled,
    /// Not at all.
    Blind,
}

/// What the scripted model read over a session.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Each round's step, the worst way it went when the round was asked more than once.
    pub steps: BTreeMap<usize, Step>,
    /// Recall calls for a step's input, and for a finding.
    pub step_recalls: usize,
    pub finding_recalls: usize,
    /// The findings of the last answer given: how many were right, and the answer.
    pub findings_right: Option<usize>,
    pub answer: String,
}

impl Tally {
    pub fn count(&self, step: Step) -> usize {
        self.steps.values().filter(|s| **s == step).count()
    }

    pub fn recalls(&self) -> usize {
        self.step_recalls + self.finding_recalls
    }
}

/// What the recall sessions' model searches for whenever it is offered recall: the kind of
/// the first planted identifier.
pub const RECALL_QUERY: &str = "sha256";

/// A scripted model that reads: one for a session, shared by its upstream and its judge.
pub struct Reader {
    /// Where the logs are, which tools that take a path are given.
    pub dir: PathBuf,
    /// Whether it searches with `RECALL_QUERY` whenever condenser offers recall, before
    /// anything else (the recall sessions).
    pub recalls_always: bool,
    pub tally: Mutex<Tally>,
}

/// What follows `label` in `value`'s texts, to the end of its line (a recall answer gives
/// archived items as JSON, its lines ending in an escaped newline).
fn read_after<'a>(value: &'a Value, label: &str) -> Option<&'a str> {
    texts(value).into_iter().find_map(|text| {
        let at = text.find(label)? + label.len();
        let rest = &text[at..];
        let end = ['\n', '\\', '"']
            .iter()
            .filter_map(|stop| rest.find(*stop))
            .min()
            .unwrap_or(rest.len());
        Some(rest[..end].trim())
    })
}

/// The reference a cut names for what it took out (`condenser_recall ctx:… returns them`).
fn cut_reference(value: &Value) -> Option<String> {
    texts(value).into_iter().find_map(|text| {
        let at = text.find("condenser_recall ctx:")? + "condenser_recall ".len();
        let reference: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.'))
            .collect();
        Some(reference.trim_end_matches('.').to_string())
    })
}

/// Whether a conversation item holds a tool's output: neither the client's own message nor
/// the model's (a message, a call, its reasoning).
fn is_tool_output(item: &Value) -> bool {
    let model = matches!(item["role"].as_str(), Some("assistant" | "model"))
        || matches!(item["type"].as_str(), Some("function_call" | "reasoning"));
    !model && !said_by_the_client(item)
}

/// The call id or function name that says an item answers condenser's recall call: a
/// Messages `tool_result`, a Responses `function_call_output`, a chat tool message, a Gemini
/// `functionResponse`.
pub fn answers_recall(item: &Value) -> bool {
    let recall_id = |id: &Value| id.as_str().is_some_and(|id| id.starts_with(RECALL_CALL));
    let blocks = item["content"].as_array().into_iter().flatten();
    let parts = item["parts"].as_array().into_iter().flatten();
    (item["type"] == "function_call_output" && recall_id(&item["call_id"]))
        || (item["role"] == "tool" && recall_id(&item["tool_call_id"]))
        || blocks
            .into_iter()
            .any(|b| b["type"] == "tool_result" && recall_id(&b["tool_use_id"]))
        || parts
            .into_iter()
            .any(|p| p["functionResponse"]["name"] == "condenser_recall")
}

/// How many items at the end of `items` condenser's recall continuations added: each a call
/// and its answer (a Responses call after the round's reasoning).
pub fn continuation_len(items: &[Value]) -> usize {
    let mut end = items.len();
    while end >= 2 && answers_recall(&items[end - 1]) {
        end -= 2;
        while end > 0 && items[end - 1]["type"] == "reasoning" {
            end -= 1;
        }
    }
    items.len() - end
}

impl Reader {
    pub fn new(dir: PathBuf, recalls_always: bool) -> Reader {
        Reader {
            dir,
            recalls_always,
            tally: Mutex::new(Tally::default()),
        }
    }

    /// The path the tools that take one read the log `name` at.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// What the model does with a loop request `body` whose next read is of `round`'s log,
    /// `rounds` of them, when `reads` says the client's reading tool is offered.
    pub fn play(&self, body: &Value, round: usize, rounds: usize, reads: bool) -> Move {
        let items = super::conversation(body);
        let offered = body["tools"].to_string().contains("\"condenser_recall\"");
        if self.recalls_always && offered && continuation_len(items) == 0 {
            let arguments = json!({"query": RECALL_QUERY});
            let id = format!("{RECALL_CALL}{round}x");
            return Move::Recall { id, arguments };
        }
        // Requests that do not carry the task are the client's side requests (Claude Code
        // warms its subagents up with one, tools and all): answered, not read.
        let on_task = texts(body).iter().any(|text| text.contains(TICKET));
        if !reads || !on_task {
            return Move::Say(format!("Done with {TICKET}."));
        }
        self.next(body, items, round, rounds, offered)
    }

    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap().clone()
    }

    fn note(&self, round: usize, step: Step) {
        let mut tally = self.tally.lock().unwrap();
        let worst = tally.steps.get(&round).map_or(step, |was| step.max(*was));
        tally.steps.insert(round, worst);
    }

    /// What the model does with `body`, whose conversation is `items`, when its next read is
    /// of `round`'s log, `rounds` of them, and recall is `offered`.
    fn next(
        &self,
        body: &Value,
        items: &[Value],
        round: usize,
        rounds: usize,
        offered: bool,
    ) -> Move {
        let (sent, continued) = items.split_at(items.len() - continuation_len(items));
        let asks = |item: &Value| said_by_the_client(item) && item.to_string().contains(QUESTION);
        // Asked on its own, last, or in the task (which names the ticket), after the last read.
        let alone = |item: &Value| asks(item) && !item.to_string().contains(TICKET);
        let asked = sent.last().is_some_and(alone) || (round >= rounds && sent.iter().any(asks));
        if asked {
            return self.answer(body, continued, offered);
        }
        // The newest item but the system messages a client adds after it (the current
        // Claude Code's "The user hasn't heard from you in a while").
        let newest = sent
            .iter()
            .rfind(|item| !matches!(item["role"].as_str(), Some("system" | "developer")))
            .unwrap_or(&Value::Null);
        let answers_a_tool = !said_by_the_client(newest);
        // The task's first request: no tool output yet.
        let fresh = !sent.iter().any(is_tool_output);
        if round >= rounds || !(answers_a_tool || fresh) {
            return Move::Say(format!("Done with {TICKET}."));
        }
        let expected = log_name(round);
        // The first step's input is the task's; every later one's, the newest output's.
        let (found, recalled) = if round == 0 {
            let name = texts(body)
                .into_iter()
                .any(|text| text.contains(&expected))
                .then(|| expected.clone());
            (name, None)
        } else {
            let continued = Value::Array(continued.to_vec());
            (
                read_after(newest, NEXT_STEP).map(String::from),
                read_after(&continued, NEXT_STEP).map(String::from),
            )
        };
        let step = match (found, recalled) {
            (Some(name), _) if name == expected => Step::There,
            (_, Some(name)) if name == expected => Step::Recalled,
            _ if offered && continued.is_empty() && round > 0 => {
                self.tally.lock().unwrap().step_recalls += 1;
                let arguments = match cut_reference(newest) {
                    Some(reference) => json!({"refs": [reference]}),
                    None => json!({"query": format!("next step {:03}", round - 1)}),
                };
                let id = format!("{RECALL_CALL}_s{round}");
                return Move::Recall { id, arguments };
            }
            _ => Step::Blind,
        };
        self.note(round, step);
        // A blind step still reads the right log, so that the session goes on as it would
        // have: the judge counts it.
        Move::Read(expected)
    }

    /// The answer to the last prompt: each finding from what the request shows, or from a
    /// recall by its label; the first finding neither gives is recalled, one at a time.
    fn answer(&self, body: &Value, continued: &[Value], offered: bool) -> Move {
        let mut said = Vec::new();
        let mut right = 0;
        for (index, (_, label, says)) in FINDINGS.iter().enumerate() {
            let label_line = format!("{label}: ");
            let found = read_after(body, &label_line);
            let id = format!("{RECALL_CALL}_f{index}");
            let tried = continued.iter().any(|item| item.to_string().contains(&id));
            match found {
                Some(found) => {
                    right += usize::from(found == *says);
                    said.push(format!("{label}: {found}"));
                }
                None if offered && !tried => {
                    self.tally.lock().unwrap().finding_recalls += 1;
                    let arguments = json!({"query": label.replace('-', " ")});
                    return Move::Recall { id, arguments };
                }
                None => said.push(format!("{label}: not known")),
            }
        }
        let answer = format!("Done with {TICKET}. {}", said.join("; "));
        let mut tally = self.tally.lock().unwrap();
        tally.findings_right = Some(right);
        tally.answer = answer.clone();
        Move::Say(answer)
    }
}
