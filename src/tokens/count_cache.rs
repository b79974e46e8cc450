//! A bounded map from content hashes to what counting that content found, shared by every
//! worker.
//!
//! A lookup only reads shared memory. Every worker looks up most messages of every request,
//! and a lock (or any other write) per lookup bounced cache lines between the cores: at full
//! load that cost as much as a tenth of the request, though no instruction count shows it.
//! So each slot is a small seqlock: a writer makes the slot's stamp odd while it writes, and
//! a reader keeps what it read only if the stamp was even and unchanged around its reads.
//!
//! The table is set-associative: a key's set is fixed by its hash, and a new entry replaces
//! one of the set's slots by CLOCK. A hit marks its entry as used (a write, but only the first
//! time after the mark was cleared); an insert clears the marks it passes and takes the first
//! slot that was unmarked, so entries in use survive and entries counted once go first.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::OnceLock;

/// A value that fits in the low 63 bits of a word: the top bit marks recent use.
pub trait Packed: Copy {
    fn pack(self) -> u64;
    /// `None` for bits that `pack` never makes.
    fn unpack(bits: u64) -> Option<Self>;
}

impl Packed for u32 {
    fn pack(self) -> u64 {
        u64::from(self)
    }

    fn unpack(bits: u64) -> Option<u32> {
        u32::try_from(bits).ok()
    }
}

const WAYS: usize = 4;
const USED: u64 = 1 << 63;

/// `stamp`: 0 while the slot has never been written, odd while it is being written, even
/// otherwise; it only grows, so a reader cannot mistake a rewritten slot for the one it read.
#[derive(Default)]
struct Slot {
    stamp: AtomicU64,
    key_low: AtomicU64,
    key_high: AtomicU64,
    value: AtomicU64,
}

/// One set per pair of cache lines, so a lookup touches no other set's lines.
#[repr(align(128))]
#[derive(Default)]
struct Set([Slot; WAYS]);

pub struct CountCache<V> {
    /// Allocated on the first insert: a proxy that never counts on one path pays nothing.
    sets: OnceLock<Box<[Set]>>,
    set_count: usize,
    values: std::marker::PhantomData<V>,
}

impl<V: Packed> CountCache<V> {
    /// Room for `capacity` entries rounded up to a power of two, four per set.
    pub fn new(capacity: usize) -> Self {
        CountCache {
            sets: OnceLock::new(),
            set_count: capacity.div_ceil(WAYS).max(1).next_power_of_two(),
            values: std::marker::PhantomData,
        }
    }

    fn set<'a>(&self, sets: &'a [Set], key: u128) -> &'a Set {
        // Keys are uniform hashes: their high half picks the set.
        &sets[(key >> 64) as usize & (self.set_count - 1)]
    }

    pub fn get(&self, key: u128) -> Option<V> {
        let set = self.set(self.sets.get()?, key);
        set.0.iter().find_map(|slot| {
            let (found, value) = read(slot)?;
            if found != key {
                return None;
            }
            if value & USED == 0 {
                slot.value.fetch_or(USED, Ordering::Relaxed);
            }
            V::unpack(value & !USED)
        })
    }

    /// Gives up, keeping the table as it was, when another writer holds the slot it chose.
    pub fn insert(&self, key: u128, value: V) {
        let sets = self.sets.get_or_init(|| {
            std::iter::repeat_with(Set::default)
                .take(self.set_count)
                .collect()
        });
        let set = self.set(sets, key);
        let mut empty = None;
        for slot in &set.0 {
            if slot.stamp.load(Ordering::Acquire) == 0 {
                // Slots fill in order, so the key is in none of the rest.
                empty = Some(slot);
                break;
            }
            if read(slot).is_some_and(|(found, _)| found == key) {
                return;
            }
        }
        // CLOCK: the first slot not used since its mark was last cleared, clearing the marks
        // on the way; when every slot was in use, the key picks one.
        let slot = empty
            .or_else(|| {
                set.0
                    .iter()
                    .find(|slot| slot.value.fetch_and(!USED, Ordering::Relaxed) & USED == 0)
            })
            .unwrap_or(&set.0[(key as usize) % WAYS]);
        write(slot, key, value.pack() & !USED);
    }
}

/// The slot's key and value as one consistent pair, or `None` while it is empty or being
/// written.
fn read(slot: &Slot) -> Option<(u128, u64)> {
    let stamp = slot.stamp.load(Ordering::Acquire);
    if stamp == 0 || stamp % 2 == 1 {
        return None;
    }
    let low = slot.key_low.load(Ordering::Relaxed);
    let high = slot.key_high.load(Ordering::Relaxed);
    let value = slot.value.load(Ordering::Relaxed);
    // Orders the reads above before the stamp is read again: had any of them seen a writer's
    // store, that writer's odd stamp is seen here.
    fence(Ordering::Acquire);
    (slot.stamp.load(Ordering::Relaxed) == stamp)
        .then_some((u128::from(high) << 64 | u128::from(low), value))
}

fn write(slot: &Slot, key: u128, bits: u64) {
    let stamp = slot.stamp.load(Ordering::Relaxed);
    if stamp % 2 == 1
        || slot
            .stamp
            .compare_exchange(stamp, stamp + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    // Orders the odd stamp before the stores below, for `read`'s fence to pair with.
    fence(Ordering::Release);
    slot.key_low.store(key as u64, Ordering::Relaxed);
    slot.key_high.store((key >> 64) as u64, Ordering::Relaxed);
    slot.value.store(bits, Ordering::Relaxed);
    slot.stamp.store(stamp + 2, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn len<V: Packed>(cache: &CountCache<V>) -> usize {
        cache.sets.get().map_or(0, |sets| {
            sets.iter()
                .flat_map(|set| &set.0)
                .filter(|slot| read(slot).is_some())
                .count()
        })
    }

    fn key(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
    }

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let cache = CountCache::new(1_000);
        assert_eq!(
            cache.get(key(0)),
            None,
            "nothing is allocated before an insert"
        );
        cache.insert(key(0), 0u32);
        for i in 1..20_000u64 {
            cache.insert(key(i), i as u32);
            // Touched all along, the first entry survives every replacement.
            assert_eq!(cache.get(key(0)), Some(0), "after {i} inserts");
        }
        let entries = len(&cache);
        assert!(entries <= 1_024, "{entries} entries");
        assert!(entries >= 1_000, "{entries} entries: the table is full");
        assert_eq!(cache.get(key(19_999)), Some(19_999));
        assert_eq!(
            cache.get(key(1)),
            None,
            "an old untouched entry was replaced"
        );
    }

    #[test]
    fn an_entry_in_use_outlives_entries_counted_once() {
        // One set: four ways.
        let cache = CountCache::new(WAYS);
        for i in 0..4 {
            cache.insert(key(i), i as u32);
        }
        assert_eq!(cache.get(key(2)), Some(2));
        for i in 4..12 {
            cache.insert(key(i), i as u32);
            assert_eq!(cache.get(key(2)), Some(2), "after inserting {i}");
        }
        assert_eq!(len(&cache), WAYS);
        // Inserting a key already present changes nothing.
        cache.insert(key(2), 99);
        assert_eq!(cache.get(key(2)), Some(2));
    }

    /// Writers race over one small set while readers check that every hit pairs a key with
    /// its own value: a torn read would pair one writer's key with another's value.
    #[test]
    fn concurrent_readers_never_see_a_torn_entry() {
        let cache = Arc::new(CountCache::<u32>::new(WAYS));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    let mut hits = 0;
                    for round in 0..20_000u64 {
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
