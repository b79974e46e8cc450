//! Values derived from a string key, kept for the requests that follow: read on every
//! request, written once per new key, so lookups share a read lock.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

pub struct Memo<V> {
    values: RwLock<HashMap<String, V>>,
    /// Keys beyond this many are derived each time instead of kept.
    max: usize,
}

impl<V: Clone> Memo<V> {
    pub fn new(max: usize) -> Memo<V> {
        Memo {
            values: RwLock::new(HashMap::new()),
            max,
        }
    }

    /// The value kept for `key`, else `derive`'s, kept if there is room. When two requests
    /// derive the same key at once, both get the one kept first. The map only caches, so a
    /// poisoned lock is used as it stands.
    pub fn get_or_derive(&self, key: &str, derive: impl FnOnce() -> V) -> V {
        let known = self
            .values
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        if let Some(value) = known {
            return value;
        }
        let value = derive();
        let mut values = self.values.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(first) = values.get(key) {
            return first.clone();
        }
        if values.len() < self.max {
            values.insert(key.to_string(), value.clone());
        }
        value
    }

    /// How many values are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.values
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
