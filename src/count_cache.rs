//! A bounded map from content hashes to what counting that content found.
//!
//! Each shard keeps two generations: a lookup that misses the current one looks in the
//! previous one and promotes what it finds, and a full current generation retires the
//! previous one whole. That approximates LRU for one uncontended lock and one probe per
//! lookup; a general-purpose cache's bookkeeping cost more than the lookups it served.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// Keys are already uniform 128-bit hashes: their low half is the table hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }
}

type Table<V> = HashMap<u128, V, BuildHasherDefault<KeyHasher>>;

struct Generations<V> {
    current: Table<V>,
    previous: Table<V>,
}

pub struct CountCache<V> {
    shards: Vec<Mutex<Generations<V>>>,
    per_generation: usize,
}

impl<V: Copy> CountCache<V> {
    /// Holds at least `capacity` entries and at most twice as many.
    pub fn new(capacity: usize) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Generations {
                    current: Table::default(),
                    previous: Table::default(),
                })
            })
            .collect();
        CountCache {
            shards,
            per_generation: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, key: u128) -> &Mutex<Generations<V>> {
        // The high half picks the shard; the low half is the table hash.
        &self.shards[((key >> 64) as usize) % SHARDS]
    }

    pub fn get(&self, key: u128) -> Option<V> {
        let mut generations = self.shard(key).lock().ok()?;
        if let Some(value) = generations.current.get(&key) {
            return Some(*value);
        }
        let value = generations.previous.remove(&key)?;
        self.store(&mut generations, key, value);
        Some(value)
    }

    pub fn insert(&self, key: u128, value: V) {
        if let Ok(mut generations) = self.shard(key).lock() {
            self.store(&mut generations, key, value);
        }
    }

    fn store(&self, generations: &mut Generations<V>, key: u128, value: V) {
        if generations.current.len() >= self.per_generation {
            generations.previous = std::mem::take(&mut generations.current);
        }
        generations.current.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len<V>(cache: &CountCache<V>) -> usize {
        cache
            .shards
            .iter()
            .map(|shard| {
                let g = shard.lock().unwrap();
                g.current.len() + g.previous.len()
            })
            .sum()
    }

    fn key(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
    }

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let cache = CountCache::new(1_000);
        cache.insert(key(0), 0u32);
        for i in 1..20_000u64 {
            cache.insert(key(i), i as u32);
            // Touched all along, the first entry survives every retirement.
            assert_eq!(cache.get(key(0)), Some(0), "after {i} inserts");
        }
        let entries = len(&cache);
        assert!(entries <= 2 * 1_000 + SHARDS, "{entries} entries");
        assert!(entries >= 1_000 / 2, "{entries} entries");
        assert_eq!(cache.get(key(19_999)), Some(19_999));
        assert_eq!(
            cache.get(key(1)),
            None,
            "an old untouched entry was retired"
        );
    }
}
