//! Values derived from a string key, kept for the requests that follow: read on every
//! request by every worker, written once per new key.
//!
//! A read writes nothing shared. Even a read lock is a write to the lock's word, and two
//! workers taking it for every request kept moving that cache line between their cores. So
//! the kept values sit in an append-only hash table of write-once slots: a lookup follows
//! the probe sequence through slots that, once filled, never change.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Tables are at least twice as large as what they keep, so probe sequences stay short;
/// beyond this many slots, keys are derived each time instead of kept.
const MAX_SLOTS: usize = 1 << 12;

/// Filled once with a key and its value, never changed after.
type Slot<V> = OnceLock<(Box<str>, V)>;

pub struct Memo<V> {
    slots: Box<[Slot<V>]>,
    /// Keys beyond this many are derived each time instead of kept.
    max: usize,
    kept: AtomicUsize,
    /// Clients choose the keys (model names): a per-process seed keeps them from choosing
    /// one long probe sequence.
    seed: u64,
}

impl<V> Memo<V> {
    pub fn new(max: usize) -> Memo<V> {
        let len = max
            .saturating_mul(2)
            .clamp(2, MAX_SLOTS)
            .next_power_of_two();
        Memo {
            slots: std::iter::repeat_with(OnceLock::new).take(len).collect(),
            max: max.min(len / 2),
            kept: AtomicUsize::new(0),
            seed: std::collections::hash_map::RandomState::new().hash_one(0u8),
        }
    }

    /// Slots in the order `key` is looked for, from its hash.
    fn probe(&self, key: &str) -> impl Iterator<Item = &Slot<V>> {
        let start = xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), self.seed) as usize;
        (0..self.slots.len()).map(move |i| &self.slots[(start + i) & (self.slots.len() - 1)])
    }

    /// The value kept for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&V> {
        for slot in self.probe(key) {
            match slot.get() {
                Some((kept, value)) if **kept == *key => return Some(value),
                Some(_) => continue,
                // Slots fill along the probe sequence, so the key is in none further on.
                None => break,
            }
        }
        None
    }

    /// Keeps `value` for `key` if there is room; returns the value kept for `key`, which is
    /// the first one kept when two requests keep the same key at once.
    pub fn keep(&self, key: &str, value: V) -> Option<&V> {
        if self.kept.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.kept.fetch_sub(1, Ordering::Relaxed);
            return self.get(key);
        }
        let mut entry = Some((Box::<str>::from(key), value));
        for slot in self.probe(key) {
            if let Some(new) = entry.take() {
                if let Err(back) = slot.set(new) {
                    entry = Some(back);
                }
            }
            match slot.get() {
                Some((kept, first)) if **kept == *key => {
                    if entry.is_some() {
                        // Another request kept it first: the room taken above is given back.
                        self.kept.fetch_sub(1, Ordering::Relaxed);
                    }
                    return Some(first);
                }
                Some(_) => continue,
                None => break,
            }
        }
        if entry.is_some() {
            self.kept.fetch_sub(1, Ordering::Relaxed);
        }
        None
    }

    /// How many values are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| slot.get().is_some())
            .count()
    }
}

impl<V: Clone> Memo<V> {
    /// The value kept for `key`, else `derive`'s, kept if there is room. When two requests
    /// derive the same key at once, both get the one kept first.
    pub fn get_or_derive(&self, key: &str, derive: impl FnOnce() -> V) -> V {
        if let Some(kept) = self.get(key) {
            return kept.clone();
        }
        let value = derive();
        self.keep(key, value.clone()).cloned().unwrap_or(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn values_are_derived_once_per_key_and_kept_up_to_the_bound() {
        let memo = Memo::new(2);
        let mut derived = 0;
        for key in ["a", "b", "a", "c", "c", "b"] {
            let value = memo.get_or_derive(key, || {
                derived += 1;
                key.to_uppercase()
            });
            assert_eq!(value, key.to_uppercase());
        }
        // "c" came after the bound, so it was derived both times.
        assert_eq!(derived, 4);
        assert_eq!(memo.kept(), 2);
    }

    #[test]
    fn a_full_table_still_finds_every_kept_key() {
        let memo = Memo::new(usize::MAX);
        let keys: Vec<String> = (0..MAX_SLOTS / 2).map(|i| format!("model-{i}")).collect();
        for key in &keys {
            assert_eq!(memo.get_or_derive(key, || key.len()), key.len());
        }
        assert_eq!(memo.kept(), MAX_SLOTS / 2);
        for key in &keys {
            assert_eq!(memo.get_or_derive(key, || 0), key.len(), "{key}");
        }
        // Past the bound: derived, not kept.
        assert_eq!(memo.get_or_derive("one more", || 7), 7);
        assert_eq!(memo.get_or_derive("one more", || 8), 8);
    }

    #[test]
    fn racing_derivations_agree_on_the_first_value_kept() {
        let memo = Arc::new(Memo::new(64));
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                let memo = memo.clone();
                std::thread::spawn(move || {
                    (0..32)
                        .map(|k| memo.get_or_derive(&format!("k{k}"), || t))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let seen: Vec<Vec<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for later in &seen[1..] {
            assert_eq!(later, &seen[0]);
        }
        assert_eq!(memo.kept(), 32);
    }
}
