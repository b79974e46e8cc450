//! The artifact ledger: the identifiers an agent saw in the messages a summary replaces
//! (paths, file names, URLs, IDs and UUIDs, error codes, commit hashes, amounts, numbers with
//! units), found by code in every role, and carried verbatim in the summary's Artifacts
//! section when the summarizer dropped them. A summarizer may paraphrase; the ledger does not.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::conversation::content_text;
use crate::tokens::counter::count_text;
use crate::tokens::encoding::Encoding;

/// The heading the summary's own artifacts go under, as the summarizer is asked to write it.
const ARTIFACTS_HEADING: &str = "## Artifacts";

static IDENTIFIER: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(concat!(
        r"https?://[^\s<>()\[\]{}'`]+[^\s<>()\[\]{}'`.,;:!?]",
        r"|(?:~|\.{1,2})?/[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)+",
        r"|\b[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_.\-]+)+\.[A-Za-z0-9]{1,6}\b",
        r"|[A-Za-z0-9_\-]+\.(?:rs|py|js|ts|tsx|go|java|rb|toml|json|yaml|yml|md|txt|csv|sql|sh|c|h|cpp|lock|log|html|css)\b",
        r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
        // Ticket numbers and error codes: ORD-4411, E_CONN-12, HTTP_503, E0425, TS2345.
        r"|\b[A-Z][A-Z0-9]+[-_][A-Z0-9][A-Z0-9\-_]*\d[A-Z0-9]*\b",
        r"|\b[A-Z]{1,4}\d{3,5}\b",
        // Provider IDs: call_8f2a91, req_01HX…, resp_68a…
        r"|\b[a-z]{2,12}_[A-Za-z0-9]*\d[A-Za-z0-9]{3,}\b",
        // Commit hashes: 7 to 40 hex digits, told from words by needing a digit (below).
        r"|\b[0-9a-f]{7,40}\b",
        r"|\$\d[\d,]*(?:\.\d+)?",
        r"|\b\d+(?:[.,]\d+)?\s?(?:ms|s|min|h|KB|MB|GB|TB|KiB|MiB|GiB|kg|km|mg|ml|px|%|USD|EUR|GBP)(?:\b|$)",
    ))
    .ok()
});

/// Paths, URLs, numbers with units and IDs found in text, in order of first appearance.
pub fn identifiers(text: &str) -> Vec<String> {
    let Some(re) = IDENTIFIER.as_ref() else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    for m in re.find_iter(text) {
        let id = m.as_str().trim();
        let hex_word = id.len() >= 7 && id.bytes().all(|b| b.is_ascii_hexdigit());
        if hex_word && !id.bytes().any(|b| b.is_ascii_digit()) {
            continue;
        }
        if !found.iter().any(|f| f == id) {
            found.push(id.to_string());
        }
    }
    found
}

/// Where an identifier was seen. What the user or assistant said, or what a tool was called
/// with, is what the work is about; a tool's output also holds much that nobody used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Said,
    ToolResult,
}

/// What the ledger knows of one identifier.
struct Seen {
    source: Source,
    /// The index of the newest message (or of the earlier summary, `0`) that has it.
    last: usize,
    count: usize,
}

/// The texts of a message by where they come from: its content, and for an assistant's tool
/// calls each call's name and arguments.
fn texts(message: &Value) -> Vec<(Source, String)> {
    let tool_output = matches!(
        message.get("role").and_then(Value::as_str),
        Some("tool" | "function")
    );
    let source = if tool_output {
        Source::ToolResult
    } else {
        Source::Said
    };
    let mut out = vec![(source, content_text(message))];
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for call in calls {
            if let Some(function) = call.get("function") {
                for field in ["name", "arguments"] {
                    if let Some(text) = function.get(field).and_then(Value::as_str) {
                        out.push((Source::Said, text.to_string()));
                    }
                }
            }
        }
    }
    out
}

/// Every identifier of `previous` (an earlier summary being extended, whose ledger must
/// survive) and of `messages`, best first: said before only seen in a tool's output, then
/// the most recent, then the most repeated.
fn ranked<'a>(
    previous: Option<&str>,
    messages: impl IntoIterator<Item = &'a Value>,
) -> Vec<String> {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut note = |id: String, source: Source, at: usize| match seen.get_mut(&id) {
        Some(entry) => {
            entry.source = entry.source.min(source);
            entry.last = at;
            entry.count += 1;
        }
        None => {
            order.push(id.clone());
            seen.insert(
                id,
                Seen {
                    source,
                    last: at,
                    count: 1,
                },
            );
        }
    };
    for id in previous.map(identifiers).unwrap_or_default() {
        note(id, Source::Said, 0);
    }
    for (index, message) in messages.into_iter().enumerate() {
        for (source, text) in texts(message) {
            for id in identifiers(&text) {
                note(id, source, index + 1);
            }
        }
    }
    order.sort_by(|a, b| {
        let (a, b) = (&seen[a], &seen[b]);
        a.source
            .cmp(&b.source)
            .then(b.last.cmp(&a.last))
            .then(b.count.cmp(&a.count))
    });
    order
}

/// The summary with every identifier it dropped carried verbatim under its Artifacts heading
/// (added when it has none), best first, within `budget_tokens` of `encoding`; the list says
/// how many did not fit.
pub fn carry<'a>(
    summary: String,
    previous: Option<&str>,
    messages: impl IntoIterator<Item = &'a Value>,
    budget_tokens: u32,
    encoding: Encoding,
) -> String {
    let missing: Vec<String> = ranked(previous, messages)
        .into_iter()
        .filter(|id| !summary.contains(id.as_str()))
        .collect();
    if missing.is_empty() {
        return summary;
    }
    let mut used = 0u32;
    let mut lines = Vec::new();
    for id in &missing {
        let line = format!("- {id}\n");
        let tokens = count_text(encoding, &line);
        if used + tokens > budget_tokens {
            break;
        }
        used += tokens;
        lines.push(line);
    }
    let left_out = missing.len() - lines.len();
    let mut ledger = format!(
        "Carried verbatim from the earlier messages:\n{}",
        lines.concat()
    );
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

    #[test]
    fn identifiers_are_found() {
        let text = "Deploy ORD-77812 to https://example.com/api/v2, config at /etc/app/conf.toml, \
                    budget $1,200.50, timeout 250ms, disk 40 GB, id 123e4567-e89b-12d3-a456-426614174000, \
                    see main.rs, commit 9fceb02d0ae5, error E0425, call call_8f2a91x.";
        let ids = identifiers(text);
        for want in [
            "ORD-77812",
            "https://example.com/api/v2",
            "/etc/app/conf.toml",
            "$1,200.50",
            "250ms",
            "40 GB",
            "123e4567-e89b-12d3-a456-426614174000",
            "main.rs",
            "9fceb02d0ae5",
            "E0425",
            "call_8f2a91x",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} not in {ids:?}");
        }
        assert!(
            identifiers("a deadbeef cafebabe facade").is_empty(),
            "hex words without digits"
        );
    }

    #[test]
    fn every_role_is_read_and_what_was_said_ranks_first() {
        let messages = [
            json!({"role": "tool", "content": "wrote /srv/old.log and /srv/a.txt"}),
            json!({"role": "user", "content": "fix ORD-4411"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/app.rs\"}"}}
            ]}),
            json!({"role": "assistant", "content": "The cost is $90; see /srv/a.txt"}),
        ];
        let ranked = ranked(None, &messages);
        assert_eq!(
            ranked,
            [
                "/srv/a.txt",
                "$90",
                "src/app.rs",
                "ORD-4411",
                "/srv/old.log"
            ]
        );
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

        let many: Vec<Value> = (0..50)
            .map(|i| json!({"role": "user", "content": format!("see /data/file{i}.csv")}))
            .collect();
        let out = carry(
            "## Goal and constraints\nnone".into(),
            None,
            &many,
            40,
            Encoding::O200k,
        );
        let ledger = &out[out.find("Carried verbatim").unwrap()..];
        assert!(count_text(Encoding::O200k, ledger) <= 40 + 20, "{ledger}");
        let carried = ledger.lines().filter(|l| l.starts_with("- /data/")).count();
        assert!(carried > 0 && carried < 50);
        assert!(
            ledger.contains(&format!("({} more left out)", 50 - carried)),
            "{ledger}"
        );
        assert!(
            ledger.contains("/data/file49.csv"),
            "the newest first: {ledger}"
        );
    }

    #[test]
    fn an_extended_summary_keeps_the_ledger_it_extends() {
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
        assert!(out.contains("- /srv/kept.db"), "{out}");
    }
}
