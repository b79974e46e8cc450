//! A bounded map from content hashes to what counting that content found, shared by every
//! worker: scc's `HashCache`, which evicts the least recently used entry of a full bucket,
//! so entries in use survive and entries counted once go first.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

pub struct CountCache<V> {
    /// Made on the first insert: a proxy that never counts on one path pays nothing.
    entries: OnceLock<scc::HashCache<u128, V, KeyBits>>,
    capacity: usize,
}

impl<V: Clone> CountCache<V> {
    /// Room for `capacity` entries, rounded up to scc's bucket size.
    pub fn new(capacity: usize) -> Self {
        CountCache {
            entries: OnceLock::new(),
            capacity,
        }
    }

    pub fn get(&self, key: u128) -> Option<V> {
        let entries = self.entries.get()?;
        entries.get_sync(&key).map(|entry| entry.get().clone())
    }

    /// Keeps the value already there when `key` is present.
    pub fn insert(&self, key: u128, value: V) {
        // Sized whole at once: a table that starts small evicts from a full bucket rather
        // than grow: it lost 58 of its first 1,000 entries.
        let entries = self.entries.get_or_init(|| {
            scc::HashCache::with_capacity_and_hasher(self.capacity, self.capacity, KeyBits)
        });
        let _ = entries.put_sync(key, value);
    }
}

/// xxh3's default secret size (at least 136 bytes are required).
pub const SECRET_BYTES: usize = 192;

/// Random bytes for an xxh3 secret, from the standard library's per-process random keys:
/// keys hashed with it cannot be made to collide by someone who knows the hash function.
pub fn random_secret() -> [u8; SECRET_BYTES] {
    let keys = std::collections::hash_map::RandomState::new();
    let mut secret = [0; SECRET_BYTES];
    for (i, word) in secret.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&keys.hash_one(i).to_le_bytes());
    }
    secret
}

/// Keys are uniform 128-bit hashes already: their bits are the table's hash. SipHash over
/// them again cost about 200 instructions a lookup, a tenth of a chat request's lookups.
#[derive(Clone, Copy, Default)]
struct KeyBits;

impl BuildHasher for KeyBits {
    type Hasher = KeyBitsHasher;

    fn build_hasher(&self) -> KeyBitsHasher {
        KeyBitsHasher(0)
    }
}

struct KeyBitsHasher(u64);

impl Hasher for KeyBitsHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = (key >> 64) as u64 ^ key as u64;
    }

    /// Only `u128` keys are hashed here, through `write_u128`.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
    }

    #[test]
    fn every_entry_is_kept_until_the_table_is_nearly_full() {
        let cache = CountCache::new(100_000);
        assert!(
            cache.entries.get().is_none(),
            "nothing is made before an insert"
        );
        for i in 0..50_000 {
            cache.insert(key(i), i as u32);
        }
        assert!((0..50_000).all(|i| cache.get(key(i)) == Some(i as u32)));
    }

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let cache = CountCache::new(1_000);
        assert_eq!(cache.get(key(0)), None);
        cache.insert(key(0), 0u32);
        for i in 1..20_000u64 {
            cache.insert(key(i), i as u32);
            // Touched all along, the first entry survives every replacement.
            assert_eq!(cache.get(key(0)), Some(0), "after {i} inserts");
        }
        let entries = cache.entries.get().map_or(0, scc::HashCache::len);
        assert!(entries <= 1_024, "{entries} entries");
        assert!(entries >= 900, "{entries} entries: the table is full");
        assert_eq!(cache.get(key(19_999)), Some(19_999));
        assert_eq!(
            cache.get(key(1)),
            None,
            "an old untouched entry was replaced"
        );
        // Inserting a key already present changes nothing.
        cache.insert(key(0), 99);
        assert_eq!(cache.get(key(0)), Some(0));
    }

    /// Writers race over a few keys while readers check that every hit pairs a key with
    /// its own value.
    #[test]
    fn concurrent_readers_see_each_key_with_its_own_value() {
        let cache = Arc::new(CountCache::<u32>::new(64));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    let mut hits = 0;
                    for round in 0..5_000u64 {
                        let i = (round * 7 + t) % 16;
                        // The value is derived from the key, so any mix-up shows.
                        cache.insert(key(i), (key(i) as u32) ^ 0x5a5a);
                        let j = (round + t * 3) % 16;
                        if let Some(value) = cache.get(key(j)) {
                            assert_eq!(value, (key(j) as u32) ^ 0x5a5a, "key {j}");
                            hits += 1;
                        }
                    }
                    hits
                })
            })
            .collect();
        let hits: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(hits > 0, "the readers found entries");
    }
}
