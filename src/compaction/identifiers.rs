//! What counts as an identifier in an agent's text: paths, file names, URLs, IDs and UUIDs,
//! error codes, commit hashes, versions, addresses, amounts and numbers with units, each
//! found whole. The artifact ledger (`artifacts.rs`) carries those a summary dropped.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

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

/// Whether `text` has `id` as a whole, not as the start of a longer one (`turn-1` in
/// `turn-10`) or the end of one (`a.rs` in `data.rs`).
pub fn says(text: &str, id: &str) -> bool {
    text.match_indices(id).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + id.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Whether `id` says where something is (a URL, a path, a file name): what an agent can find
/// again by listing or searching, unlike a hash, a ticket, a version, an address or a line
/// where an error was, which it cannot. Within a rank, the ledger keeps those first.
pub fn locates(id: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
