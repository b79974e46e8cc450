//! The checks a summary passes before it is used (design rule 10): a model's answer that is
//! no summary (empty, cut off at its token limit, longer than its budget, a copy of the
//! conversation, without the task or the asked shape) is refused, so that the step falls
//! back as on a failed summarizer rather than forward it as the conversation's memory.
//! Each check is a pass over the summary's text or the span's words, nothing more.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

use crate::compaction::identifiers::{identifiers, says};
use crate::compaction::summary_prompt::{Evicted, SECTIONS};
use crate::conversation::content_text;
use crate::error::Refusal;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;

/// The fewest of the prompt's sections a summary must head: real models leave out some that
/// are empty whatever the prompt says, but a summary with fewer is not in the asked shape.
const MIN_SECTIONS: usize = 3;
/// Words in a row, copied from the span, that count as a verbatim run.
const RUN_WORDS: usize = 12;
/// A summary is a copy when more than half its words are in verbatim runs, and at least this
/// many: a summary quoting one of the user's sentences is not.
const MIN_COPIED_WORDS: usize = 40;
/// The task's identifiers the summary is held to (any one of them): the first ones it names.
const TASK_IDENTIFIERS: usize = 8;
/// A summary counted in the request model's encoding may come out a little longer than in
/// the summarizer's own, which its budget is in: a quarter more is still within it.
const BUDGET_SLACK_DIVISOR: u32 = 4;

/// What a summary is checked against.
pub struct Expected<'a> {
    /// Its budget (`max_tokens` of the call), counted in `encoding`.
    pub max_tokens: u32,
    pub encoding: Encoding,
    /// The messages it was asked to summarize: a long run of theirs copied is no summary.
    pub span: &'a [Evicted],
    /// The pinned task's identifiers ([`task_identifiers`]), when the task lies before the
    /// summary's end.
    pub task: &'a [String],
}

/// Refuses a summary (trimmed, as the summarizer reads it) that is no summary; `cut_off`:
/// the reply stopped at its token limit (`SummaryApi::cut_off`). The cheapest checks first.
pub fn check(summary: &str, cut_off: bool, expected: &Expected) -> Result<(), Refusal> {
    if summary.trim().is_empty() {
        return Err(Refusal::Empty);
    }
    if cut_off {
        return Err(Refusal::CutOff);
    }
    let budget = expected.max_tokens + expected.max_tokens / BUDGET_SLACK_DIVISOR;
    if count_text(expected.encoding, summary) > budget {
        return Err(Refusal::OverBudget);
    }
    if sections_headed(summary) < MIN_SECTIONS {
        return Err(Refusal::NoSections);
    }
    if !expected.task.is_empty() && !expected.task.iter().any(|id| says(summary, id)) {
        return Err(Refusal::TaskDropped);
    }
    if copied(summary, expected.span) {
        return Err(Refusal::Verbatim);
    }
    Ok(())
}

/// The identifiers of the pinned task's messages that a summary must keep one of.
pub fn task_identifiers<'a>(task: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    let text: Vec<String> = task.into_iter().map(content_text).collect();
    let mut found = identifiers(&text.join("\n"));
    found.truncate(TASK_IDENTIFIERS);
    found
}

/// How many of the prompt's sections the summary heads: a line that starts as a heading does
/// (`#`, `**`, or the name and a colon) and names the section, in any case.
fn sections_headed(summary: &str) -> usize {
    let headings: Vec<String> = summary
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with('#') || line.starts_with("**") || line.ends_with(':'))
        .map(str::to_lowercase)
        .collect();
    SECTIONS
        .iter()
        .filter(|section| {
            let section = section.to_lowercase();
            headings.iter().any(|line| line.contains(&section))
        })
        .count()
}

/// A word as compared: lower case, without the punctuation around it.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split_whitespace()
        .map(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|word| !word.is_empty())
}

fn run_hash(run: &[String]) -> u64 {
    let mut hasher = DefaultHasher::new();
    run.hash(&mut hasher);
    hasher.finish()
}

/// Whether the summary is mostly the span copied: more than half its words, and at least
/// `MIN_COPIED_WORDS`, in runs of `RUN_WORDS` found word for word in one of the span's
/// messages.
fn copied(summary: &str, span: &[Evicted]) -> bool {
    let summary: Vec<String> = words(summary).collect();
    if summary.len() < MIN_COPIED_WORDS.max(RUN_WORDS) {
        return false;
    }
    let mut runs = HashSet::new();
    for evicted in span {
        let message: Vec<String> = words(&content_text(&evicted.message)).collect();
        runs.extend(message.windows(RUN_WORDS).map(run_hash));
    }
    let mut in_a_run = vec![false; summary.len()];
    for (start, run) in summary.windows(RUN_WORDS).enumerate() {
        if runs.contains(&run_hash(run)) {
            in_a_run[start..start + RUN_WORDS].fill(true);
        }
    }
    let copied = in_a_run.iter().filter(|&&copied| copied).count();
    copied >= MIN_COPIED_WORDS && copied * 2 > summary.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GOOD: &str = "## Goal and constraints\nFix the flaky upload test named in KX-7731-QZ.\n\
## Decisions\nRetry once on a 503.\n## Facts and identifiers\nKX-7731-QZ, commit 4f9c2ab1.\n\
## Artifacts\nsrc/upload.rs\n## Progress\nThe retry is written.\n## Open questions\nnone\n\
## Next step\nRun the suite.";

    fn span(texts: &[&str]) -> Vec<Evicted> {
        texts
            .iter()
            .map(|text| Evicted {
                message: json!({"role": "tool", "content": text}),
                tokens: 100,
                whole: false,
            })
            .collect()
    }

    fn checked(
        summary: &str,
        cut_off: bool,
        span: &[Evicted],
        task: &[String],
    ) -> Result<(), Refusal> {
        check(
            summary,
            cut_off,
            &Expected {
                max_tokens: 200,
                encoding: Encoding::O200k,
                span,
                task,
            },
        )
    }

    fn task() -> Vec<String> {
        task_identifiers([
            &json!({"role": "user", "content": "Fix the upload test, ticket KX-7731-QZ. Remember it."}),
        ])
    }

    /// The conversation's rows, as the recorded sessions' tool outputs print them.
    fn rows(turn: usize) -> String {
        (1..=40)
            .map(|row| {
                format!("turn-{turn} row {row}: alpha beta gamma delta epsilon zeta eta theta")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_summary_in_the_asked_shape_that_keeps_the_task_is_used() {
        assert_eq!(task(), vec!["KX-7731-QZ".to_string()]);
        assert_eq!(checked(GOOD, false, &span(&[&rows(1)]), &task()), Ok(()));
        // Headings as models write them besides markdown's: bold, or a name and a colon.
        let bold = "**Goal and Constraints**\nKX-7731-QZ\nDecisions:\nnone\n**Next step**\nrun it";
        assert_eq!(checked(bold, false, &[], &task()), Ok(()));
    }

    #[test]
    fn an_empty_summary_is_refused() {
        assert_eq!(checked(" \n ", false, &[], &[]), Err(Refusal::Empty));
    }

    #[test]
    fn a_summary_cut_off_at_its_token_limit_is_refused() {
        assert_eq!(checked(GOOD, true, &[], &task()), Err(Refusal::CutOff));
    }

    #[test]
    fn a_summary_over_its_budget_is_refused() {
        let long = format!("{GOOD}\n{}", "more detail ".repeat(300));
        assert_eq!(
            checked(&long, false, &[], &task()),
            Err(Refusal::OverBudget)
        );
        // A little over, as another tokenizer counts it, is within.
        let near = format!("{GOOD}\n{}", "more detail ".repeat(60));
        assert!(count_text(Encoding::O200k, &near) > 200);
        assert_eq!(checked(&near, false, &[], &task()), Ok(()));
    }

    #[test]
    fn a_summary_without_the_asked_sections_is_refused() {
        let prose = "The user wants the upload test fixed (KX-7731-QZ); a retry was written.";
        assert_eq!(
            checked(prose, false, &[], &task()),
            Err(Refusal::NoSections)
        );
        // Two of seven is not the asked shape either; a section named in a sentence is no
        // heading.
        let two = "## Goal and constraints\nKX-7731-QZ\n## Next step\nthe Decisions and Progress";
        assert_eq!(checked(two, false, &[], &task()), Err(Refusal::NoSections));
    }

    #[test]
    fn a_summary_that_drops_the_pinned_task_is_refused() {
        let dropped = GOOD.replace("KX-7731-QZ", "the ticket");
        assert_eq!(
            checked(&dropped, false, &[], &task()),
            Err(Refusal::TaskDropped)
        );
        // No pinned task, or one without identifiers: nothing to hold the summary to.
        assert_eq!(checked(&dropped, false, &[], &[]), Ok(()));
        let plain = task_identifiers([&json!({"role": "user", "content": "make it faster"})]);
        assert!(plain.is_empty());
    }

    #[test]
    fn a_summary_that_repeats_the_conversation_is_refused() {
        let span = span(&[&rows(1), &rows(2)]);
        // The sections there, the task kept, and under them the conversation as it was.
        let echo = format!(
            "## Goal and constraints\nKX-7731-QZ\n## Progress\n{}\n## Next step\nmore",
            rows(2).lines().take(6).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(
            checked(&echo, false, &span, &task()),
            Err(Refusal::Verbatim)
        );
        // One line quoted is a summary quoting its source.
        let quoted = format!("{GOOD}\n{}", rows(1).lines().next().unwrap());
        assert_eq!(checked(&quoted, false, &span, &task()), Ok(()));
    }
}
