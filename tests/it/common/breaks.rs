//! Rule 8 checked request by request on what the upstream got: between two requests of a
//! session, read in the provider's cache order, the forwarded prompt changes only where the
//! client's own request changed, or from the summary on at a summary step; and, by rule 10,
//! at a cut step that takes the prompt from the trigger down to the target in one step (or
//! as far down as its head, task, summary and recent part let it). Anything else is an
//! avoidable cache break, which costs the user the rest of the prompt at full price: a cut
//! at every turn, and an output once cut that reads differently later.

use std::collections::HashMap;

/// One request of a session: what the client sent and what the upstream got, each in the
/// provider's cache order (tools, then system or instructions, then the conversation, as
/// `cached_order` writes them), and condenser's counts of both.
#[derive(Debug, Clone)]
pub struct Sent {
    pub client: Vec<u8>,
    /// The client's newest prompt with its turn: the task rule 1 pins.
    pub task: Vec<u8>,
    pub forwarded: Vec<u8>,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    /// The least the forwarded prompt could count: its head, the task, the summary and the
    /// recent part, which no cut takes out.
    pub floor_tokens: u64,
}

/// What a session's requests are measured against, in tokens.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub hard_limit: u64,
    pub trigger: u64,
    pub target: u64,
}

/// What a session's requests did to the provider's cache.
#[derive(Debug, Default)]
pub struct CacheFigures {
    /// Requests after the first, each judged against the one before it.
    pub pairs: usize,
    /// Where the client's own request changed what it sent before: its break, not ours.
    pub client_changes: usize,
    /// Where the client sent a new prompt: the task pinned before the summary (rule 1) is
    /// now that prompt, and the one pinned before goes back into the history.
    pub new_prompts: usize,
    /// Requests that took a new summary (the `[Context summary: N` line changed).
    pub summary_steps: usize,
    /// The one summary step at which the recall tool joined `tools`: the first step's break.
    pub tool_arrivals: usize,
    /// Requests that cut more tool outputs because the form in use went over the trigger,
    /// down to the target in one step.
    pub cut_steps: usize,
    /// Breaks none of the above explains: `(request index, what changed)`.
    pub avoidable: Vec<(usize, String)>,
    /// The mean share of each forwarded prompt that repeats the previous one's start.
    pub reuse: f64,
    /// Forwarded prompt tokens a provider would bill: a cached token (the longest common
    /// prefix with the previous request, by its share of the bytes) at a tenth.
    pub billed: f64,
    /// The same for the session sent whole, as the client sent it.
    pub billed_whole: f64,
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Whether `after` only appends to `before`: the arrays written by `cached_order` end in
/// `]]`, which an appended item moves.
fn extends(before: &[u8], after: &[u8]) -> bool {
    common_prefix(before, after) + 2 >= before.len()
}

const SUMMARY_LINE: &[u8] = b"[Context summary: ";

/// Where a forwarded prompt's summary line starts, and the line up to its count.
fn summary_line(prompt: &[u8]) -> Option<(usize, &[u8])> {
    let at = prompt
        .windows(SUMMARY_LINE.len())
        .position(|w| w == SUMMARY_LINE)?;
    let rest = &prompt[at..];
    let end = rest.iter().position(|&b| b == b']').unwrap_or(rest.len());
    Some((at, &rest[..end]))
}

/// Where a prompt's tools (the first of its parts in cache order) end, so that the recall
/// tool's arrival at the first summary step is told apart.
fn tools_end(prompt: &[u8]) -> usize {
    let parts: serde_json::Value = serde_json::from_slice(prompt).unwrap_or_default();
    1 + serde_json::to_vec(&parts[0]).map_or(0, |tools| tools.len())
}

/// Every string in `value`, depth first.
pub fn texts(value: &serde_json::Value) -> Vec<&str> {
    match value {
        serde_json::Value::String(text) => vec![text],
        serde_json::Value::Array(items) => items.iter().flat_map(texts).collect(),
        serde_json::Value::Object(map) => map.values().flat_map(texts).collect(),
        _ => Vec::new(),
    }
}

/// What a cut keeps of an output's start, which names it in every later request.
const OUTPUT_KEY_CHARS: usize = 80;
const CUT_MARK: &str = " tokens removed";

/// Where an output cut in an earlier request reads differently in a later one (cut again to
/// another length, or whole again): `(request index, what changed)`. A client that rewrote
/// its own history (a resumed session resending turns otherwise) starts a new conversation,
/// with references of its own: what was cut before it is not held.
fn cuts_reread(sent: &[Sent]) -> Vec<(usize, String)> {
    let mut cut: HashMap<String, String> = HashMap::new();
    let mut reread = Vec::new();
    for (i, request) in sent.iter().enumerate() {
        if i > 0 && !extends(&sent[i - 1].client, &request.client) {
            cut.clear();
        }
        let prompt: serde_json::Value =
            serde_json::from_slice(&request.forwarded).unwrap_or_default();
        for text in texts(&prompt) {
            let key: String = text.chars().take(OUTPUT_KEY_CHARS).collect();
            if key.chars().count() < OUTPUT_KEY_CHARS {
                continue;
            }
            // Each change is one break: the output as it reads now is what later requests
            // are held to.
            match cut.get(&key) {
                Some(before) if before != text => {
                    reread.push((
                        i,
                        format!("an output cut before reads differently: {key:?}"),
                    ));
                    cut.insert(key, text.to_string());
                }
                None if text.contains(CUT_MARK) => {
                    cut.insert(key, text.to_string());
                }
                _ => {}
            }
        }
    }
    reread
}

/// Whether an avoidable break is a step that landed above its aim (rather than a change
/// between steps, or an output cut before reading differently): what a step taken while the
/// summary on hand is stale does, its middle cut and cleared but not gone (issue 36 leaves
/// it open at a pace where the model outruns the summarizer).
pub fn is_landing(what: &str) -> bool {
    what.starts_with("at byte ")
}

/// Judges every request against the one before it, as rule 8 and rule 10 say.
pub fn cache_figures(sent: &[Sent], limits: Thresholds) -> CacheFigures {
    let mut figures = CacheFigures::default();
    let mut shares = Vec::new();
    // The recall tool's arrival is due at the session's first step, and again at the first
    // after the client rewrote its own history (Gemini CLI masks its older outputs: the
    // history it then sends may go as sent, without the tool, until the next step).
    let mut arrival_due = true;
    for (i, pair) in sent.windows(2).enumerate() {
        let (before, now) = (&pair[0], &pair[1]);
        figures.pairs += 1;
        let common = common_prefix(&before.forwarded, &now.forwarded);
        let share = common as f64 / now.forwarded.len().max(1) as f64;
        shares.push(share);
        let cached = now.forwarded_tokens as f64 * share;
        figures.billed += now.forwarded_tokens as f64 - 0.9 * cached;
        let client_common =
            common_prefix(&before.client, &now.client) as f64 / now.client.len().max(1) as f64;
        figures.billed_whole +=
            now.received_tokens as f64 - 0.9 * now.received_tokens as f64 * client_common;
        if !extends(&before.client, &now.client) {
            figures.client_changes += 1;
            arrival_due = true;
            continue;
        }
        if extends(&before.forwarded, &now.forwarded) {
            continue;
        }
        if before.task != now.task {
            figures.new_prompts += 1;
            continue;
        }
        let step = summary_line(&now.forwarded).map(|(_, line)| line)
            != summary_line(&before.forwarded).map(|(_, line)| line);
        if step {
            figures.summary_steps += 1;
            // From the summary on: where the new one starts, or where the one it replaces
            // did (a prompt pinned at the step, placed before the summary, takes its place).
            let summary_at = [&before.forwarded, &now.forwarded]
                .into_iter()
                .filter_map(|prompt| summary_line(prompt).map(|(at, _)| at))
                .min();
            let from_summary = summary_at.is_some_and(|at| common + 64 >= at);
            if from_summary {
                continue;
            }
        }
        // The recall tool joins `tools` at the session's first step, summary or cut (D7):
        // that break is the tools'.
        if common < tools_end(&now.forwarded) && arrival_due {
            figures.tool_arrivals += 1;
            arrival_due = false;
            continue;
        }
        // The form the request before went with, grown by what the client added: a cut
        // step starts from over the trigger and lands on the target, or on the least the
        // prompt can be when that is over the target. condenser plans a form by an estimate
        // that counts a summary's framing and recall's line from above, not by the bytes it
        // then writes: within a hundredth, a step is its estimate's call.
        let grown =
            before.forwarded_tokens + now.received_tokens.saturating_sub(before.received_tokens);
        let aim = limits.target.max(now.floor_tokens);
        let from_trigger = grown > limits.trigger - limits.trigger / 100;
        let to_target = now.forwarded_tokens <= aim + aim / 100;
        if from_trigger && to_target {
            figures.cut_steps += 1;
            continue;
        }
        let at = common.saturating_sub(40);
        let context =
            String::from_utf8_lossy(&now.forwarded[at..(common + 80).min(now.forwarded.len())]);
        figures.avoidable.push((
            i + 1,
            format!(
                // `is_landing` reads this opening.
                "at byte {common}, {grown} tokens grown, {} forwarded, aim {aim}: …{context}…",
                now.forwarded_tokens
            ),
        ));
    }
    figures.avoidable.extend(cuts_reread(sent));
    if let Some(first) = sent.first() {
        figures.billed += first.forwarded_tokens as f64;
        figures.billed_whole += first.received_tokens as f64;
    }
    figures.reuse = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    figures
}
