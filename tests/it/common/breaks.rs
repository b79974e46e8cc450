//! Rule 8 checked request by request on what the upstream got: between two requests of a
//! session, read in the provider's cache order, the forwarded prompt changes only where the
//! client's own request changed, or from the summary on at a summary step; and, by rule 10,
//! at a cut step that takes the prompt from the trigger down to the target in one step (or
//! as far down as its head, task, summary and recent part let it, under the trigger). Anything
//! else is an avoidable cache break, which costs the user the rest of the prompt at full
//! price: a cut at every turn (issue 54's rolling cut), and an output once cut that reads
//! differently later while the client sent it as before.

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
    /// What condenser scaled this request's counts by (1 for an exact tokenizer): for an
    /// estimated one, the ratio it had learned from usage by then, which moves from one
    /// request to the next. Two requests' counts are compared in the later one's scale.
    pub scale: f64,
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
/// What a cut reference starts with: an output cut down to its marker alone is known by it.
const REFERENCE: &str = "condenser_recall ctx:";

/// The name an output goes by in every request: its first characters, which a cut keeps,
/// with the count of tokens a marker says it removed left out (a cut to another length is
/// the same output); or, for an output cut down to its marker, the marker and its reference.
/// None for a text too short to tell apart.
fn output_key(text: &str) -> Option<String> {
    let mut key = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(CUT_MARK) {
        let digits = rest[..at].trim_end_matches(|c: char| c.is_ascii_digit());
        key.push_str(digits);
        key.push('#');
        key.push_str(CUT_MARK);
        rest = &rest[at + CUT_MARK.len()..];
    }
    key.push_str(rest);
    let long = key.chars().count() >= OUTPUT_KEY_CHARS;
    (long || key.contains(REFERENCE)).then(|| key.chars().take(OUTPUT_KEY_CHARS).collect())
}

/// Where an output cut in an earlier request reads differently in a later one (cut again to
/// another length, or whole again) while the client sent it as before: `(request index,
/// what changed)`. Rule 8: an output once cut reads the same until a summary step takes it
/// out. Where the client rewrote the output itself (Gemini CLI masks its older ones), how
/// it reads is the client's doing; and where the client changed its request otherwise than
/// by appending (a resumed session resending turns otherwise), the cache breaks where it
/// did, and the outputs after may be planned afresh: that request is held to nothing, the
/// ones after it to how it read them.
fn cuts_reread(sent: &[Sent]) -> Vec<(usize, String)> {
    // By output: how the client sent it and how it was forwarded, when it was last cut.
    let mut cut: HashMap<String, (Option<String>, String)> = HashMap::new();
    let mut reread = Vec::new();
    for (i, request) in sent.iter().enumerate() {
        let client_changed = i > 0 && !extends(&sent[i - 1].client, &request.client);
        let client: serde_json::Value = serde_json::from_slice(&request.client).unwrap_or_default();
        let client: HashMap<String, &str> = texts(&client)
            .into_iter()
            .filter_map(|text| Some((output_key(text)?, text)))
            .collect();
        let prompt: serde_json::Value =
            serde_json::from_slice(&request.forwarded).unwrap_or_default();
        for text in texts(&prompt) {
            let Some(key) = output_key(text) else {
                continue;
            };
            let sent_as = client.get(&key).map(|text| text.to_string());
            // Each change is one break: the output as it reads now is what later requests
            // are held to.
            match cut.get(&key) {
                Some((was_sent_as, before)) if before != text => {
                    if *was_sent_as == sent_as && !client_changed {
                        reread.push((
                            i,
                            format!("an output cut before reads differently: {key:?}"),
                        ));
                    }
                    cut.insert(key, (sent_as, text.to_string()));
                }
                None if text.contains(CUT_MARK) => {
                    cut.insert(key, (sent_as, text.to_string()));
                }
                _ => {}
            }
        }
    }
    reread
}

/// Judges every request against the one before it, as rule 8 and rule 10 say.
pub fn cache_figures(sent: &[Sent], limits: Thresholds) -> CacheFigures {
    let mut figures = CacheFigures::default();
    let mut shares = Vec::new();
    // The recall tool's arrival is due at the session's first step, and again at the first
    // after the client rewrote its own history (Gemini CLI masks its older outputs: the
    // history it then sends may go as sent, without the tool, until the next step).
    let mut arrival_due = true;
    // The index of the last request that changed the form by a cut, a step or not.
    let mut last_cut = None;
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
        // The form the request before went with, grown by what the client added, counted
        // in this request's scale (a ratio that moved may make a step due sooner): a cut
        // step starts from over the trigger and lands on the target, or on the least the
        // prompt can be when that is over the target, and under the trigger, so that the
        // next round does not need another. condenser plans a form by an estimate that
        // counts a summary's framing and recall's line from above, not by the bytes it then
        // writes: within a hundredth, a step is its estimate's call.
        let raw = |tokens: u64, request: &Sent| tokens as f64 / request.scale;
        let grown = ((raw(before.forwarded_tokens, before) + raw(now.received_tokens, now)
            - raw(before.received_tokens, before))
            * now.scale) as u64;
        let aim = limits.target.max(now.floor_tokens);
        let from_trigger = grown > limits.trigger - limits.trigger / 100;
        let to_target = now.forwarded_tokens <= aim + aim / 100;
        let under_trigger = now.forwarded_tokens < limits.trigger;
        // A rolling cut: one more output cut each round, each a "step" from just over the
        // trigger (or a floor above it) to just under it. A step lands where the next round
        // needs none: a cut right after a cut (a step or not) is none.
        let rolling = last_cut == Some(i);
        last_cut = Some(i + 1);
        if from_trigger && to_target && under_trigger && !rolling {
            figures.cut_steps += 1;
            continue;
        }
        let at = common.saturating_sub(40);
        let context =
            String::from_utf8_lossy(&now.forwarded[at..(common + 80).min(now.forwarded.len())]);
        figures.avoidable.push((
            i + 1,
            format!(
                "at byte {common}, {grown} tokens grown, {} forwarded, aim {aim}{}: …{context}…",
                now.forwarded_tokens,
                if rolling {
                    ", right after a cut step"
                } else {
                    ""
                }
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

/// The judge on made-up sessions, each request a head (tools, system), the task and tool
/// outputs of 1,000 tokens (a cut one 100), in a window whose trigger is 8,000 tokens and
/// target 5,000: what it must call avoidable, and what it must not.
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Thresholds = Thresholds {
        hard_limit: 10_000,
        trigger: 8_000,
        target: 5_000,
    };
    const HEAD: u64 = 500;
    const WHOLE: u64 = 1_000;
    const CUT: u64 = 100;
    const TASK: &str = "Ticket KX-7731-QZ: find why the nightly build fails.";

    /// Tool output `n` as the client sends it.
    fn output(n: usize) -> String {
        let rows: String = (1..=40)
            .map(|row| format!("turn-{n} row {row}: alpha beta gamma delta\n"))
            .collect();
        format!("log {n:03}: {rows}")
    }

    /// Output `n` cut, `removed` tokens named by the marker, its reference `ctx:n`.
    fn cut(n: usize, removed: usize) -> String {
        let whole = output(n);
        format!(
            "{}\n[… {removed} tokens removed; condenser_recall ctx:{n:04} returns them …]\n{}",
            &whole[..120],
            &whole[whole.len() - 60..]
        )
    }

    /// A prompt in cache order: tools, system, then the task, an optional summary line and
    /// the outputs.
    fn prompt(summary: Option<&str>, outputs: &[String]) -> Vec<u8> {
        let mut conversation = vec![json!({"role": "user", "content": TASK})];
        if let Some(summary) = summary {
            conversation.push(json!({"role": "user",
                "content": format!("[Context summary: {summary}] The agent read logs.")}));
        }
        conversation.extend(outputs.iter().map(
            |text| json!({"role": "user", "content": [{"type": "tool_result", "content": text}]}),
        ));
        serde_json::to_vec(&json!([[{"name": "Read"}], "You are an agent.", conversation])).unwrap()
    }

    /// A request: the client sent outputs `0..sent`; condenser forwarded them with those in
    /// `cuts` cut (output, tokens the marker names), under `summary` if any, at `scale`.
    fn request(sent: usize, cuts: &[(usize, usize)], summary: Option<&str>, scale: f64) -> Sent {
        let client: Vec<String> = (0..sent).map(output).collect();
        let forwarded: Vec<String> = (0..sent)
            .map(|n| match cuts.iter().find(|(at, _)| *at == n) {
                Some((_, removed)) => cut(n, *removed),
                None => output(n),
            })
            .collect();
        let tokens = |whole: u64, cut_ones: u64| {
            ((HEAD + whole * WHOLE + cut_ones * CUT) as f64 * scale) as u64
        };
        Sent {
            client: prompt(None, &client),
            task: TASK.as_bytes().to_vec(),
            forwarded: prompt(summary, &forwarded),
            received_tokens: tokens(sent as u64, 0),
            forwarded_tokens: tokens((sent - cuts.len()) as u64, cuts.len() as u64),
            // The head and the last 3 outputs, which no cut takes.
            floor_tokens: tokens(3, 0),
            scale,
        }
    }

    fn cuts(outputs: std::ops::Range<usize>) -> Vec<(usize, usize)> {
        outputs.map(|n| (n, 900)).collect()
    }

    #[test]
    fn an_output_cut_under_the_trigger_with_the_same_summary_is_avoidable() {
        let sent = [
            request(5, &[], Some("1"), 1.0),
            request(6, &cuts(0..1), Some("1"), 1.0),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert_eq!(figures.avoidable.len(), 1, "{figures:?}");
        assert_eq!(figures.cut_steps, 0);
    }

    #[test]
    fn an_output_cut_again_to_another_length_is_avoidable() {
        // At a step that is one: from over the trigger to the target; output 0 was cut
        // before, and reads otherwise now.
        let sent = [
            request(8, &cuts(0..1), None, 1.0),
            request(
                9,
                &[(0, 905), (1, 900), (2, 900), (3, 900), (4, 900)],
                None,
                1.0,
            ),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert_eq!(figures.avoidable.len(), 1, "{figures:?}");
        assert!(figures.avoidable[0]
            .1
            .starts_with("an output cut before reads differently"));
        // And whole again, as sent.
        let sent = [
            request(5, &cuts(0..1), None, 1.0),
            request(6, &[], None, 1.0),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert!(
            figures
                .avoidable
                .iter()
                .any(|(_, what)| what.starts_with("an output cut before")),
            "{figures:?}"
        );
    }

    #[test]
    fn a_step_from_the_trigger_to_the_target_is_not_avoidable() {
        // 7,500 tokens grow to 8,500: four outputs cut land at 4,900; then the form is kept.
        let sent = [
            request(7, &[], None, 1.0),
            request(8, &cuts(0..4), None, 1.0),
            request(9, &cuts(0..4), None, 1.0),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert!(figures.avoidable.is_empty(), "{figures:?}");
        assert_eq!(figures.cut_steps, 1);
        // A ratio that moved up makes the same step due a round sooner: 6,500 tokens counted
        // at 1.0 are 7,800 at 1.2, and grow to 9,000.
        let sent = [
            request(6, &[], None, 1.0),
            request(7, &cuts(0..4), None, 1.2),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert!(figures.avoidable.is_empty(), "{figures:?}");
        assert_eq!(figures.cut_steps, 1);
    }

    #[test]
    fn a_summary_step_and_a_clients_own_change_are_not_avoidable() {
        let mut rewritten = request(6, &[], Some("1"), 1.0);
        // The client masks its first output (as Gemini CLI does) and condenser sends it so.
        let masked = |bytes: &[u8]| {
            String::from_utf8(bytes.to_vec())
                .unwrap()
                .replace("log 000: turn-0 row 1:", "log 000: [masked] row 1:")
                .into_bytes()
        };
        rewritten.client = masked(&rewritten.client);
        rewritten.forwarded = masked(&rewritten.forwarded);
        let sent = [
            request(7, &[], None, 1.0),
            request(8, &[], Some("1"), 1.0),
            request(9, &[], Some("1"), 1.0),
            request(10, &[], Some("2"), 1.0),
        ];
        let figures = cache_figures(&sent, LIMITS);
        assert!(figures.avoidable.is_empty(), "{figures:?}");
        assert_eq!(figures.summary_steps, 2);
        let sent = [request(5, &[], Some("1"), 1.0), rewritten];
        let figures = cache_figures(&sent, LIMITS);
        assert!(figures.avoidable.is_empty(), "{figures:?}");
        assert_eq!(figures.client_changes, 1);
    }

    /// Issue 54: one more output cut each round, the summary the same, from round 4 to 11.
    /// Near the target each cut is under the trigger. At a floor just under the trigger (the
    /// head, task, summary and recent part of a large agent in a window that reserves much),
    /// each looks like a step from the trigger to the floor; at a floor over the trigger,
    /// like one that landed as low as it could. With the learned ratio moving between 1.30
    /// and 1.33 and the client's whole session (60,000 tokens it still sends, which the
    /// summary stands for) counted at each request's own ratio, each rise looks like a step
    /// the ratio made due. Every one breaks the cache where no step was due.
    #[test]
    fn a_rolling_cut_is_avoidable_every_round() {
        // `(extra, client_only)`: tokens every forwarded prompt carries beyond the outputs,
        // and tokens only the client sends; `at_floor`: nothing more could be cut.
        let rolling = |scale: &dyn Fn(usize) -> f64, (extra, client_only): (u64, u64), at_floor| {
            (4..12)
                .map(|sent| {
                    let mut request = request(sent, &cuts(0..sent - 4), Some("1"), scale(sent));
                    let scaled = |tokens: u64| (tokens as f64 * scale(sent)) as u64;
                    request.forwarded_tokens += scaled(extra);
                    request.received_tokens += scaled(extra + client_only);
                    if at_floor {
                        request.floor_tokens = request.forwarded_tokens;
                    }
                    request
                })
                .collect::<Vec<Sent>>()
        };
        let pairs = 7;
        for (name, sent, at_least) in [
            ("near the target", rolling(&|_| 1.0, (0, 0), false), pairs),
            (
                "at a floor just under the trigger",
                rolling(&|_| 1.0, (3_000, 0), true),
                pairs - 1,
            ),
            (
                "at a floor over the trigger",
                rolling(&|_| 1.0, (4_500, 0), true),
                pairs,
            ),
            (
                "with a ratio that moves",
                rolling(
                    &|sent| if sent % 2 == 0 { 1.30 } else { 1.33 },
                    (0, 60_000),
                    true,
                ),
                pairs - 1,
            ),
        ] {
            let figures = cache_figures(&sent, LIMITS);
            assert!(
                figures.avoidable.len() >= at_least,
                "{name}: {} avoidable of {} pairs: {figures:?}",
                figures.avoidable.len(),
                figures.pairs
            );
        }
    }
}
