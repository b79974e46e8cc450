//! Values derived from a string key, kept for the requests that follow: read on every
//! request by every worker, written once per new key.
//!
//! papaya's map: a read takes no lock and writes nothing that other workers read, so the
//! workers' lookups of one model name do not move a cache line between their cores.

/// A bounded map of values kept by key: clients choose the keys (model names), so beyond
/// `max` keys, values are derived each time instead of kept.
pub struct Memo<V> {
    map: papaya::HashMap<Box<str>, V>,
    max: usize,
}

impl<V> Memo<V> {
    pub fn new(max: usize) -> Memo<V> {
        Memo {
            map: papaya::HashMap::new(),
            max,
        }
    }

    /// What `read` makes of the value kept for `key`, if one is.
    pub fn read<R>(&self, key: &str, read: impl FnOnce(&V) -> R) -> Option<R> {
        self.map.pin().get(key).map(read)
    }

    /// What `read` makes of the value kept for `key`, keeping `make`'s first if there is
    /// room. When two requests keep the same key at once, both read the one kept first.
    /// None when the key is not kept and there is no room.
    pub fn read_or_keep<R>(
        &self,
        key: &str,
        make: impl FnOnce() -> V,
        read: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let map = self.map.pin();
        if let Some(kept) = map.get(key) {
            return Some(read(kept));
        }
        // Requests racing to keep new keys may each pass this check: the bound can be
        // overshot by as many, which still bounds it.
        if map.len() >= self.max {
            return None;
        }
        let (Ok(kept) | Err(kept)) = map.try_insert_with(key.into(), make);
        Some(read(kept))
    }

    /// How many values are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.map.len()
    }
}

impl<V: Clone> Memo<V> {
    /// The value kept for `key`, else `derive`'s, kept if there is room. When two requests
    /// derive the same key at once, both get the one kept first.
    pub fn get_or_derive(&self, key: &str, derive: impl FnOnce() -> V) -> V {
        if let Some(kept) = self.read(key, V::clone) {
            return kept;
        }
        let value = derive();
        self.read_or_keep(key, || value.clone(), V::clone)
            .unwrap_or(value)
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
    fn many_kept_keys_are_all_found_again() {
        let memo = Memo::new(2_000);
        let keys: Vec<String> = (0..2_000).map(|i| format!("model-{i}")).collect();
        for key in &keys {
            assert_eq!(memo.get_or_derive(key, || key.len()), key.len());
        }
        assert_eq!(memo.kept(), 2_000);
        for key in &keys {
            assert_eq!(memo.get_or_derive(key, || 0), key.len(), "{key}");
        }
        // Past the bound: derived, not kept.
        assert_eq!(memo.get_or_derive("one more", || 7), 7);
        assert_eq!(memo.get_or_derive("one more", || 8), 8);
        assert_eq!(memo.read("one more", |v| *v), None);
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
