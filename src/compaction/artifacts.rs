//! The artifact ledger: the identifiers an agent saw in the messages a summary replaces
//! (paths, file names, URLs, IDs and UUIDs, error codes, commit hashes, amounts, numbers with
//! units), found by code in every role, and carried verbatim in the summary's Artifacts
//! section when the summarizer dropped them. A summarizer may paraphrase; the ledger does not.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use regex::{Regex, RegexSet};
use serde_json::Value;

use crate::conversation::content_text;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;

/// The heading the summary's own artifacts go under, as the summarizer is asked to write it.
const ARTIFACTS_HEADING: &str = "## Artifacts";

/// One pattern per kind of identifier, each matched against a whole word: an identifier is
/// kept whole or not at all (`KX-7731-QZ`, never `KX-7731`).
static WORD_KINDS: LazyLock<Option<RegexSet>> = LazyLock::new(|| {
    RegexSet::new([
        // URLs, with their query.
        r"^https?://\S+$",
        // Emails.
        r"^[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}$",
        // Paths, rooted or with an extension or two slashes deep, with a line and column.
        r"^(?:~|\.{1,2})?/[\w.\-@+/]*[\w\-@+](?::\d+){0,2}$",
        r"^[\w.\-@+]+(?:/[\w.\-@+]+)+\.[A-Za-z0-9]{1,8}(?::\d+){0,2}$",
        r"^[\w\-]+(?:/[\w.\-]+){2,}$",
        // File names with a known extension, with a line and column.
        r"^[\w.\-]+\.(?:rs|py|js|mjs|ts|tsx|jsx|go|java|kt|rb|php|cs|swift|toml|json|yaml|yml|md|txt|csv|sql|sh|c|h|cc|cpp|hpp|lock|log|html|css|xml|ini|cfg|conf|env|proto|tf)(?::\d+){0,2}$",
        // Hashes and digests, with their algorithm: sha256:9f86d081884c7d65, 9fceb02.
        r"^(?:[a-z][a-z0-9]*:)?[0-9a-f]{7,128}$",
        // UUIDs.
        r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
        // Ticket keys, error and status codes: KX-7731-QZ, ORD-4411, HTTP_503, E0425.
        r"^[A-Z][A-Z0-9]*(?:[-_][A-Z0-9]+)+$",
        r"^[A-Z]{1,4}\d{3,5}$",
        // Lower-case names with a number in them: eu-west-1, us-east-1a, build-7f3a,
        // call_8f2a91x, orders_v2; provider ids with mixed case: req_01HXAB.
        r"^[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)+$",
        r"^[a-z]{2,12}_[A-Za-z0-9]*\d[A-Za-z0-9]{3,}$",
        // Versions: v1.2.3-rc1, 1.4.0+build.7.
        r"^v?\d+\.\d+\.\d+(?:-[0-9A-Za-z.\-]+)?(?:\+[0-9A-Za-z.\-]+)?$",
        // Addresses with a port: 10.0.3.7:5432, [::1]:8080.
        r"^\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?$",
        r"^\[[0-9A-Fa-f:.]+\](?::\d{1,5})?$",
        // Functions named with their call: parse_config(), OrderService.cancel().
        r"^[A-Za-z_][\w.:]*\(\)$",
    ])
    .ok()
});

/// URLs, paths and file names: their indexes in `WORD_KINDS`.
const LOCATOR_KINDS: &[usize] = &[0, 2, 3, 4, 5];

/// Kinds that must hold a digit to be told from words: hashes (`facade`), lower-case names
/// (`well-known`). Their indexes in `WORD_KINDS`.
const NEEDS_A_DIGIT: &[usize] = &[6, 10];

/// Identifiers that span a space or start with a sign, found anywhere in the text: amounts
/// and numbers with units.
static SPANNING: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(concat!(
        r"\$\d[\d,]*(?:\.\d+)?",
        r"|\b\d+(?:[.,]\d+)?\s?(?:ms|s|min|h|KB|MB|GB|TB|KiB|MiB|GiB|kg|km|mg|ml|px|%|USD|EUR|GBP)(?:\b|$)",
    ))
    .ok()
});

static MARKUP: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"</?[A-Za-z][\w\-]*>").ok());

/// What may close a sentence or a bracket after an identifier, and is not part of it.
const TRAILING: &[char] = &[
    '.', ',', ';', ':', '!', '?', ')', ']', '}', '>', '"', '\'', '`',
];
const LEADING: &[char] = &['(', '[', '{', '<', '"', '\'', '`'];
const QUOTES: &[char] = &['"', '\'', '`'];
/// What joins identifiers into one word in structured text.
const JOINERS: &[char] = &['"', '{', '}', '[', ']', '(', ')', '=', ',', '\'', '`', '|'];

/// An identifier in `word` (text between spaces), trimmed of what surrounds it.
fn identifier_in(word: &str) -> Option<&str> {
    let kinds = WORD_KINDS.as_ref()?;
    let trimmed = word.trim_end_matches(TRAILING);
    // An IPv6 address keeps its bracket.
    let bare = if trimmed.starts_with('[') && trimmed.contains("]:") {
        trimmed
    } else {
        trimmed.trim_start_matches(LEADING)
    };
    // A function keeps its call.
    let bare = if word.contains("()") && !bare.ends_with("()") {
        word.trim_start_matches(LEADING)
            .trim_end_matches(|c| TRAILING.contains(&c) && c != ')')
    } else {
        bare
    };
    let matched = kinds.matches(bare);
    let digit_ok =
        |kind: &usize| !NEEDS_A_DIGIT.contains(kind) || bare.bytes().any(|b| b.is_ascii_digit());
    if matched.iter().any(|kind| digit_ok(&kind)) {
        return Some(bare);
    }
    // A quoted name: `OrderService.cancel`, "payments-api", 'orders_v2'.
    let quoted = word
        .chars()
        .next()
        .filter(|c| QUOTES.contains(c))
        .and_then(|quote| {
            let inner = word.trim_end_matches(|c| TRAILING.contains(&c) && c != quote);
            inner.strip_prefix(quote)?.strip_suffix(quote)
        })?;
    let name_like = !quoted.is_empty()
        && quoted
            .chars()
            .all(|c| c.is_alphanumeric() || "_-./:@".contains(c))
        && (quoted.contains(['_', '-', '.', '/', ':'])
            || quoted.chars().skip(1).any(char::is_uppercase));
    name_like.then_some(quoted)
}

/// Paths, URLs, IDs, hashes, versions, addresses, names and amounts found in text, each
/// whole, in order of first appearance.
pub fn identifiers(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut note = |id: &str| {
        if !found.iter().any(|f| f == id) {
            found.push(id.to_string());
        }
    };
    // Markup tags (`<system-reminder>`) are not paths.
    let text = match MARKUP.as_ref() {
        Some(markup) => markup.replace_all(text, " "),
        None => std::borrow::Cow::Borrowed(text),
    };
    for word in text.split_whitespace() {
        match identifier_in(word) {
            Some(id) => note(id),
            // JSON and other punctuation-joined text, such as a tool call's arguments:
            // `{"path":"src/app.rs"}`.
            None => word
                .split(JOINERS)
                .filter_map(identifier_in)
                .for_each(&mut note),
        }
    }
    if let Some(spanning) = SPANNING.as_ref() {
        for m in spanning.find_iter(&text) {
            note(m.as_str().trim());
        }
    }
    found
}

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
/// survive) and of `messages`, best first: what cannot be found again (hashes, tickets,
/// versions, addresses) before what locates something (URLs, paths, file names); then said
/// before only seen in a tool's output; then the most recent; then the most repeated.
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
    for id in previous.map(identifiers).unwrap_or_default() {
        note(id, Source::Said, 0);
    }
    for (index, message) in messages.iter().enumerate() {
        for (source, text) in texts(message) {
            for id in identifiers(&text) {
                if !call_ids.contains(id.as_str()) {
                    note(id, source, index + 1);
                }
            }
        }
    }
    order.sort_by_cached_key(|id| {
        let entry = &seen[id];
        (
            locates(id),
            entry.source,
            std::cmp::Reverse(entry.last),
            std::cmp::Reverse(entry.count),
        )
    });
    order
}

/// Whether `id` says where something is (a URL, a path, a file name): what an agent can find
/// again by listing or searching, unlike a hash, a ticket, a version, an address or a line
/// where an error was, which it cannot. Within a budget, the ledger keeps those first.
fn locates(id: &str) -> bool {
    // `src/a.rs:42` is where something was found, not only where a file is.
    let a_finding = !id.contains("://")
        && id
            .rsplit_once(':')
            .is_some_and(|(_, line)| line.parse::<u32>().is_ok());
    !a_finding
        && WORD_KINDS
            .as_ref()
            .is_some_and(|kinds| kinds.matches(id).iter().any(|k| LOCATOR_KINDS.contains(&k)))
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

    /// Real-world identifiers of every kind, each in a sentence as an agent's tool output or
    /// a user would write it, and found whole.
    #[test]
    fn identifiers_are_kept_whole() {
        let table = [
            ("Fix ticket KX-7731-QZ today.", "KX-7731-QZ"),
            ("(see ZX-4417-QA)", "ZX-4417-QA"),
            ("JIRA PAY-12, please", "PAY-12"),
            (
                "image digest sha256:9f86d081884c7d65, pinned",
                "sha256:9f86d081884c7d65",
            ),
            (
                "commit 9fceb02d0ae598e95dc970b74767f19372d61af8.",
                "9fceb02d0ae598e95dc970b74767f19372d61af8",
            ),
            ("short sha 4b825dc: empty tree", "4b825dc"),
            ("deployed to eu-west-1.", "eu-west-1"),
            ("zone us-east-1a is down", "us-east-1a"),
            ("artifact build-7f3a failed", "build-7f3a"),
            ("release v1.2.3-rc1 is out", "v1.2.3-rc1"),
            ("version 1.4.0+build.7;", "1.4.0+build.7"),
            (
                "docs at https://example.com/api/v2?page=3&sort=asc.",
                "https://example.com/api/v2?page=3&sort=asc",
            ),
            ("panic at src/a.rs:42", "src/a.rs:42"),
            (
                "error in /etc/nginx/nginx.conf:17:5: bad",
                "/etc/nginx/nginx.conf:17:5",
            ),
            ("see ./scripts/test.sh", "./scripts/test.sh"),
            (
                "edit ~/.config/app/settings.json",
                "~/.config/app/settings.json",
            ),
            ("open main.rs:7 now", "main.rs:7"),
            ("mail ops@example.org about it", "ops@example.org"),
            ("db at 10.0.3.7:5432,", "10.0.3.7:5432"),
            ("listen on [::1]:8080", "[::1]:8080"),
            (
                "id 123e4567-e89b-12d3-a456-426614174000",
                "123e4567-e89b-12d3-a456-426614174000",
            ),
            ("the service \"payments-api\" restarts", "payments-api"),
            ("table 'orders_v2' is locked", "orders_v2"),
            ("call `OrderService.cancel` twice", "OrderService.cancel"),
            ("set DATABASE_URL first", "DATABASE_URL"),
            ("call parse_config() on start", "parse_config()"),
            ("error E0425 again", "E0425"),
            ("got HTTP_503 back", "HTTP_503"),
            ("tool call call_8f2a91x done", "call_8f2a91x"),
            ("request req_01HXABCD failed", "req_01HXABCD"),
            ("it costs $1,200.50 a month", "$1,200.50"),
            ("timeout after 250ms", "250ms"),
        ];
        let mut missed = Vec::new();
        for (text, want) in table {
            let found = identifiers(text);
            if !found.iter().any(|id| id == want) {
                missed.push(format!("{want:?} in {text:?}: {found:?}"));
            }
            // Never a part of it standing for the whole.
            for id in &found {
                assert!(
                    !(want.contains(id.as_str()) && id != want),
                    "{id} cut from {want}"
                );
            }
        }
        assert!(missed.is_empty(), "{missed:#?}");
    }

    #[test]
    fn words_and_plain_numbers_are_not_identifiers() {
        for text in [
            "the quick brown fox and/or the lazy dog, e.g. a well-known x-ray",
            "in 2024 there were 42 of them, 3.5 on average",
            "deadbeef cafebabe facade",
            "Hello World! It's fine: really (mostly).",
            "<system-reminder>be brief</system-reminder>",
        ] {
            assert_eq!(identifiers(text), Vec::<String>::new(), "{text}");
        }
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
                "$90",
                "ORD-4411",
                "/srv/a.txt",
                "src/app.rs",
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
    fn what_cannot_be_found_again_ranks_before_what_locates() {
        let messages = [
            json!({"role": "tool", "content": "sha256:9f86d081884c7d65 at src/a.rs:42 in eu-west-1"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"/srv/b.txt\"}"}}
            ]}),
        ];
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
