//! The one rule by which a tool output is cut: its middle replaced by a marker, so that the
//! text counts at most a given number of tokens. The cut depends only on the text, the budget
//! and the encoding, so an output cut on one turn reads the same on every later turn (a
//! provider's prompt cache keeps matching it), and the count after the cut is known before
//! the request is written, so a shortened request is never over the limit it was planned for.

use std::sync::{Arc, LazyLock};

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use crate::tokens::count_cache::{random_secret, CountCache, SECRET_BYTES};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::{bpe, count_text};

/// What a shortened tool output counts, whole: the one size every cut output is brought to,
/// so that the cut depends only on the output (and reads the same on every later turn).
/// About a screenful: an output's first and last lines, where errors and results are.
pub const SHORTENED_OUTPUT_TOKENS: u32 = 256;

/// What a cleared tool output counts, whole: its first and last lines (where an output names
/// what it is, and where errors and results are) around the marker naming what was removed
/// and the reference recall gives it back under, in the item's framing. Outputs are cleared
/// only when cutting every output of the middle cannot bring the prompt to its budget (rule
/// 10: clearing or cutting). The marker and a Messages `tool_result`'s framing take about 50;
/// with nothing beside them (64), an agent's middle lost every identifier its outputs named
/// before a summary took them.
pub const CLEARED_OUTPUT_TOKENS: u32 = 128;

/// A tool output in the tail cut down to `keep_tokens` (`SHORTENED_OUTPUT_TOKENS`), the
/// whole item counted, at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shorten {
    pub index: usize,
    pub tokens: u32,
    pub keep_tokens: u32,
}

/// Room left for where an item's texts meet its framing when they are counted together.
const FRAMING_SLACK_TOKENS: u32 = 4;

/// Token boundaries may merge where the kept parts meet the marker; the cut allows for it
/// and then checks, so this only saves a second pass.
const JOIN_SLACK_TOKENS: usize = 2;

/// How many items' cut outputs are kept: each is about `SHORTENED_OUTPUT_TOKENS` (256
/// tokens, a kilobyte or two), so some 16 MB at most, the cut outputs of a hundred agent
/// sessions of a few hundred rounds each.
const KEPT_CUTS: usize = 16_384;

/// How many times the cut is tightened when the joined text still counts over the budget.
const MAX_TIGHTENINGS: usize = 8;

/// `text` as it is when it counts at most `budget` tokens; else its first and last tokens
/// around a marker naming how many were removed (and the `reference` recall gives the whole
/// under, when there is one), counting at most `budget` (or the marker alone, when even that
/// does not fit).
pub fn cut_middle(encoding: Encoding, text: &str, budget: u32, reference: Option<&str>) -> String {
    let bpe = bpe(encoding);
    let tokens = bpe.encode_ordinary(text);
    let budget = budget as usize;
    if tokens.len() <= budget {
        return text.to_string();
    }
    let marker_tokens =
        count_text(encoding, &marker(tokens.len(), reference)) as usize + JOIN_SLACK_TOKENS;
    let mut keep = budget.saturating_sub(marker_tokens);
    for _ in 0..MAX_TIGHTENINGS {
        let head_len = keep / 2;
        let head = decodable_prefix(encoding, &tokens[..head_len]);
        let tail = decodable_suffix(encoding, &tokens[tokens.len() - (keep - head_len)..]);
        let removed = tokens.len() - head.1 - tail.1;
        let cut = format!("{}{}{}", head.0, marker(removed, reference), tail.0);
        let counted = count_text(encoding, &cut) as usize;
        if counted <= budget || keep == 0 {
            return cut;
        }
        keep = keep.saturating_sub(counted - budget);
    }
    marker(tokens.len(), reference)
}

fn marker(removed: usize, reference: Option<&str>) -> String {
    match reference {
        Some(reference) => {
            format!("\n[… {removed} tokens removed; condenser_recall {reference} returns them …]\n")
        }
        None => format!("\n[… {removed} tokens removed …]\n"),
    }
}

/// The text of the longest prefix of `tokens` that ends on a character boundary, and how
/// many tokens it took.
fn decodable_prefix(encoding: Encoding, tokens: &[u32]) -> (String, usize) {
    let bpe = bpe(encoding);
    (0..=tokens.len())
        .rev()
        .find_map(|n| {
            let bytes = bpe.decode_bytes(&tokens[..n]).ok()?;
            String::from_utf8(bytes).ok().map(|text| (text, n))
        })
        .unwrap_or_default()
}

/// The text of the longest suffix of `tokens` that starts on a character boundary, and how
/// many tokens it took.
fn decodable_suffix(encoding: Encoding, tokens: &[u32]) -> (String, usize) {
    let bpe = bpe(encoding);
    (0..=tokens.len())
        .find_map(|skip| {
            let bytes = bpe.decode_bytes(&tokens[skip..]).ok()?;
            String::from_utf8(bytes)
                .ok()
                .map(|text| (text, tokens.len() - skip))
        })
        .unwrap_or_default()
}

/// Cuts the output texts of one item so the whole item counts at most `cut.keep_tokens`:
/// its framing (role, ids, the rest of its content) stays as it is, and the texts share
/// what is left, each in proportion to its size. Each cut names `reference`, under which
/// recall gives the item whole, when the request offers it.
///
/// An agent resends every output cut on one turn with each later turn, and cutting one
/// encodes it whole several times over: the tokenizer took some 55 of a compacted
/// request's 60 ms (`bench/agent_replay.sh`). So an item's cut texts are made once and kept
/// by what they are made of (`KeptCuts`).
pub fn cut_item_texts(
    encoding: Encoding,
    texts: Vec<&mut String>,
    cut: &Shorten,
    reference: Option<&str>,
) {
    let key = KEPT.key(encoding, &texts, cut, reference);
    let made = KEPT.cuts.get(key).unwrap_or_else(|| {
        let made: Arc<[String]> = cut_afresh(encoding, &texts, cut, reference).into();
        KEPT.cuts.insert(key, made.clone());
        made
    });
    for (text, made) in texts.into_iter().zip(made.iter()) {
        text.clone_from(made);
    }
}

/// What `cut_item_texts` makes of `texts`, made anew.
fn cut_afresh(
    encoding: Encoding,
    texts: &[&mut String],
    cut: &Shorten,
    reference: Option<&str>,
) -> Vec<String> {
    let sizes: Vec<u32> = texts.iter().map(|t| count_text(encoding, t)).collect();
    let framing = cut.tokens.saturating_sub(sizes.iter().sum());
    let budget = cut
        .keep_tokens
        .saturating_sub(framing + FRAMING_SLACK_TOKENS);
    texts
        .iter()
        .zip(shares(&sizes, budget))
        .map(|(text, share)| cut_middle(encoding, text, share, reference))
        .collect()
}

/// Items' cut texts, kept by a hash of all a cut depends on: the texts, the item's count,
/// the budget, the encoding and the reference. One map serves every caller, so the hash is
/// keyed with a random secret: no one can make another caller's item hash as theirs does.
struct KeptCuts {
    secret: [u8; SECRET_BYTES],
    cuts: CountCache<Arc<[String]>>,
}

static KEPT: LazyLock<KeptCuts> = LazyLock::new(|| KeptCuts {
    secret: random_secret(),
    cuts: CountCache::new(KEPT_CUTS),
});

impl KeptCuts {
    fn key(
        &self,
        encoding: Encoding,
        texts: &[&mut String],
        cut: &Shorten,
        reference: Option<&str>,
    ) -> u128 {
        let mut hasher = Xxh3::with_secret(self.secret);
        hasher.update(&[encoding as u8]);
        hasher.update(&cut.tokens.to_le_bytes());
        hasher.update(&cut.keep_tokens.to_le_bytes());
        // Each string after its length, so no two lists of them write the same bytes; no
        // reference writes a length of all ones.
        match reference {
            Some(reference) => write_text(&mut hasher, reference),
            None => hasher.update(&u64::MAX.to_le_bytes()),
        }
        for text in texts {
            write_text(&mut hasher, text);
        }
        hasher.digest128()
    }
}

/// Items cut, kept by the item's identity (the raw stage's hash of its bytes as sent) and all
/// else its cut depends on:
/// an agent resends each output whole on every turn, and a compacted request cuts most of
/// them again, each the same way. Found here, an output is neither parsed, cut nor written
/// out again: parsing them took 6.7M of a compacted agent request's 19.4M instructions, and
/// writing them out 2.2M (`bench/instruction_budget.sh`).
static KEPT_ITEMS: LazyLock<(Secret, CountCache<Arc<CutItem>>)> =
    LazyLock::new(|| (random_secret(), CountCache::new(KEPT_ITEMS_CAPACITY)));

/// How many cut items are kept: an agent's session cuts a hundred or so, each a few KB once
/// cut (as many as `KEPT_CUTS` keeps cut texts).
const KEPT_ITEMS_CAPACITY: usize = 16_384;

type Secret = [u8; SECRET_BYTES];

/// An item cut, and written out as JSON.
pub struct CutItem {
    pub item: Value,
    pub written: Box<[u8]>,
}

/// The item known as `sent` (its identity by its bytes as sent, in a dialect told apart by
/// `seed`), cut as `cut_item_texts` cuts it (its texts found by `texts`): kept from when it
/// was cut before, else `parsed`, cut and written out. An item of no known identity is cut
/// afresh and not kept.
pub fn cut_sent_item(
    (encoding, seed): (Encoding, u64),
    sent: Option<u128>,
    (cut, reference): (&Shorten, Option<&str>),
    parsed: impl FnOnce() -> Value,
    texts: fn(&mut Value) -> Vec<&mut String>,
) -> Arc<CutItem> {
    let made = || {
        let mut item = parsed();
        cut_item_texts(encoding, texts(&mut item), cut, reference);
        let written = serde_json::to_vec(&item).unwrap_or_default().into();
        Arc::new(CutItem { item, written })
    };
    let Some(sent) = sent else {
        return made();
    };
    let (secret, kept) = &*KEPT_ITEMS;
    let mut hasher = Xxh3::with_secret(*secret);
    hasher.update(&[encoding as u8]);
    hasher.update(&seed.to_le_bytes());
    hasher.update(&cut.tokens.to_le_bytes());
    hasher.update(&cut.keep_tokens.to_le_bytes());
    match reference {
        Some(reference) => write_text(&mut hasher, reference),
        None => hasher.update(&u64::MAX.to_le_bytes()),
    }
    hasher.update(&sent.to_le_bytes());
    let key = hasher.digest128();
    kept.get(key).unwrap_or_else(|| {
        let made = made();
        kept.insert(key, made.clone());
        made
    })
}

fn write_text(hasher: &mut Xxh3, text: &str) {
    hasher.update(&(text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
}

/// Splits `budget` over texts of `tokens` each, in proportion, so that their sum stays
/// within it; texts already within their share keep their own size and leave the rest to
/// the others.
pub fn shares(tokens: &[u32], budget: u32) -> Vec<u32> {
    let total: u64 = tokens.iter().map(|&t| u64::from(t)).sum();
    if total <= u64::from(budget) {
        return tokens.to_vec();
    }
    tokens
        .iter()
        .map(|&t| (u64::from(t) * u64::from(budget) / total.max(1)) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: usize) -> String {
        (0..lines)
            .map(|i| {
                format!(
                    "line {i}: build-7f3a step ok, took {}ms — ünïcödé ✓\n",
                    i * 7
                )
            })
            .collect()
    }

    #[test]
    fn a_text_within_the_budget_is_left_alone() {
        let text = log(3);
        let tokens = count_text(Encoding::O200k, &text);
        assert_eq!(cut_middle(Encoding::O200k, &text, tokens, None), text);
    }

    #[test]
    fn a_cut_text_counts_within_its_budget_and_keeps_both_ends() {
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            let text = log(400);
            for budget in [0, 5, 17, 64, 256, 1000] {
                let cut = cut_middle(encoding, &text, budget, None);
                let counted = count_text(encoding, &cut);
                let marker_only = count_text(encoding, &marker(9999, None));
                assert!(
                    counted <= budget.max(marker_only),
                    "{encoding:?} budget {budget}: {counted}"
                );
                assert!(cut.contains("tokens removed"), "{cut}");
                if budget >= 64 {
                    assert!(cut.starts_with("line 0:"), "{cut}");
                    assert!(cut.trim_end().ends_with('✓'), "{cut}");
                    // Close to the budget, not far under it.
                    assert!(counted + 8 >= budget, "{encoding:?} {budget}: {counted}");
                }
            }
        }
    }

    #[test]
    fn the_same_text_and_budget_always_cut_the_same() {
        let text = log(300);
        let once = cut_middle(Encoding::O200k, &text, 300, None);
        assert_eq!(once, cut_middle(Encoding::O200k, &text, 300, None));
        // The marker names what was removed from this text, whatever else is in the request.
        let total = count_text(Encoding::O200k, &text) as usize;
        let removed: usize = once
            .split("[… ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(removed > 0 && removed < total, "{removed} of {total}");
    }

    /// An output cut once is found by its identity and its cut, not parsed or cut again; any
    /// other cut of it, another output, or one of no known identity, is made afresh.
    #[test]
    fn an_item_cut_before_is_found_by_its_identity_and_cut() {
        fn texts(item: &mut Value) -> Vec<&mut String> {
            match item.get_mut("output") {
                Some(Value::String(output)) => vec![output],
                _ => Vec::new(),
            }
        }
        let item = serde_json::json!({"call_id": "c", "output": log(300)});
        let sent = Some(xxhash_rust::xxh3::xxh3_128(
            &serde_json::to_vec(&item).unwrap(),
        ));
        let cut = Shorten {
            index: 5,
            tokens: 3_000,
            keep_tokens: 200,
        };
        let seed = (Encoding::O200k, 0x5eed);
        let made = cut_sent_item(seed, sent, (&cut, Some("ctx:1.5")), || item.clone(), texts);
        assert_ne!(made.item, item);
        assert_eq!(made.item["call_id"], "c");
        assert_eq!(made.written, serde_json::to_vec(&made.item).unwrap().into());
        let never = || -> Value { panic!("parsed though cut before") };
        let again = cut_sent_item(seed, sent, (&cut, Some("ctx:1.5")), never, texts);
        assert!(Arc::ptr_eq(&again, &made));
        let other_reference = cut_sent_item(seed, sent, (&cut, None), || item.clone(), texts);
        assert_ne!(other_reference.item, made.item);
        let wider = Shorten {
            keep_tokens: 400,
            ..cut
        };
        let other_cut = cut_sent_item(
            seed,
            sent,
            (&wider, Some("ctx:1.5")),
            || item.clone(),
            texts,
        );
        assert_ne!(other_cut.item, made.item);
        let other_dialect = (Encoding::O200k, 0x0d1a);
        let called = std::cell::Cell::new(false);
        let parsed = || {
            called.set(true);
            item.clone()
        };
        cut_sent_item(other_dialect, sent, (&cut, Some("ctx:1.5")), parsed, texts);
        assert!(called.get(), "another dialect's item is cut afresh");
        for _ in 0..2 {
            called.set(false);
            let unknown = cut_sent_item(seed, None, (&cut, Some("ctx:1.5")), parsed, texts);
            assert!(called.get(), "an item of no known identity is cut afresh");
            assert_eq!(unknown.item, made.item);
        }
    }

    #[test]
    fn a_cut_that_names_its_reference_still_counts_within_its_budget() {
        let text = log(400);
        let reference = "ctx:7f3a2c91.17";
        let cut = cut_middle(Encoding::O200k, &text, 256, Some(reference));
        assert!(count_text(Encoding::O200k, &cut) <= 256);
        assert!(
            cut.contains(&format!("condenser_recall {reference} returns them")),
            "{cut}"
        );
        assert!(cut.starts_with("line 0:"), "{cut}");
        assert_eq!(
            cut,
            cut_middle(Encoding::O200k, &text, 256, Some(reference))
        );
    }

    #[test]
    fn an_item_cut_once_is_kept_and_its_cut_read_back_unchanged() {
        // A text no other test cuts, so no other test keeps it first.
        let text = format!("kept-cut test\n{}", log(350));
        let cut = Shorten {
            index: 9,
            tokens: count_text(Encoding::O200k, &text) + 12,
            keep_tokens: 256,
        };
        let key =
            |text: &mut String, reference| KEPT.key(Encoding::O200k, &[text], &cut, reference);
        let mut first = text.clone();
        assert!(KEPT.cuts.get(key(&mut first, None)).is_none());
        cut_item_texts(Encoding::O200k, vec![&mut first], &cut, None);
        let kept = KEPT.cuts.get(key(&mut text.clone(), None)).expect("kept");
        assert_eq!(kept[0], first);
        assert_eq!(
            cut_afresh(Encoding::O200k, &[&mut text.clone()], &cut, None),
            vec![first.clone()]
        );
        let mut again = text.clone();
        cut_item_texts(Encoding::O200k, vec![&mut again], &cut, None);
        assert_eq!(again, first);
        // What else the cut depends on makes another key, and another cut.
        let mut referenced = text.clone();
        let reference = Some("ctx:0badcafe.9");
        assert_ne!(
            key(&mut text.clone(), reference),
            key(&mut text.clone(), None)
        );
        cut_item_texts(Encoding::O200k, vec![&mut referenced], &cut, reference);
        assert!(
            referenced.contains("condenser_recall ctx:0badcafe.9"),
            "{referenced}"
        );
        let other = Shorten {
            keep_tokens: 300,
            ..cut
        };
        assert_ne!(
            KEPT.key(Encoding::O200k, &[&mut text.clone()], &other, None),
            key(&mut text.clone(), None)
        );
    }

    #[test]
    fn shares_split_a_budget_in_proportion() {
        assert_eq!(shares(&[100, 300], 1000), vec![100, 300]);
        assert_eq!(shares(&[100, 300], 200), vec![50, 150]);
        assert!(shares(&[7, 13, 1000], 100).iter().sum::<u32>() <= 100);
    }
}
