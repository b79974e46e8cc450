//! What each request does to state that every worker shares, from one thread and from two
//! at once: the count cache lookup (scc), the model memo lookup (papaya) and a latency
//! observation (a prometheus histogram), the first two beside a plain lock. From two threads,
//! a design that writes on every call moves its cache lines between the cores, and its time
//! per call grows; one that only reads (or writes lines of its own) keeps its single-thread
//! time. The load benchmark cannot show this on two cores; at more workers it only grows.
//!
//! Run: `cargo bench --bench shared_state` (results in BENCHMARKS.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Barrier, Mutex, RwLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

use condenser::observe::metrics::Metrics;
use condenser::tokens::count_cache::CountCache;
use condenser::tokens::memo::Memo;

const KEYS: u64 = 16;

fn key(i: u64) -> u128 {
    xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
}

/// Time per call of `work` (given the call's index), made `iters` times by each of
/// `threads` threads started together.
fn per_call(threads: usize, iters: u64, work: &(impl Fn(u64) + Sync)) -> Duration {
    let start = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                start.wait();
                for i in 0..iters {
                    work(i);
                }
            });
        }
        start.wait();
        let began = Instant::now();
        // The scope ends once every thread has.
        began
    })
    .elapsed()
}

fn compare(c: &mut Criterion, group: &str, designs: &[(&str, &(dyn Fn(u64) + Sync))]) {
    let mut group = c.benchmark_group(group);
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, work) in designs {
        for threads in [1, 2] {
            group.bench_function(format!("{name}/{threads}_threads"), |b| {
                b.iter_custom(|iters| per_call(threads, iters, work));
            });
        }
    }
    group.finish();
}

fn count_cache(c: &mut Criterion) {
    let cache = CountCache::new(200_000);
    // A mutex per shard over a hash map.
    let shards: Vec<Mutex<HashMap<u128, u32>>> =
        (0..16).map(|_| Mutex::new(HashMap::new())).collect();
    for i in 0..KEYS {
        cache.insert(key(i), i as u32);
        shards[(key(i) >> 64) as usize % 16]
            .lock()
            .unwrap()
            .insert(key(i), i as u32);
    }
    let keys: Vec<u128> = (0..KEYS).map(key).collect();
    let lookup = |i: u64| {
        black_box(cache.get(keys[(i % KEYS) as usize]));
    };
    let locked_lookup = |i: u64| {
        let key = keys[(i % KEYS) as usize];
        black_box(
            shards[(key >> 64) as usize % 16]
                .lock()
                .unwrap()
                .get(&key)
                .copied(),
        );
    };
    compare(
        c,
        "count_cache_lookup",
        &[("scc", &lookup), ("mutex_shards", &locked_lookup)],
    );
}

fn memo(c: &mut Criterion) {
    let memo = Memo::new(1_000);
    let locked: RwLock<HashMap<String, u64>> = RwLock::new(HashMap::new());
    let names: Vec<String> = (0..4).map(|i| format!("gpt-4o-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        memo.get_or_derive(name, || i as u64);
        locked.write().unwrap().insert(name.clone(), i as u64);
    }
    let lookup = |i: u64| {
        black_box(memo.get_or_derive(&names[(i % 4) as usize], || 0));
    };
    let locked_lookup = |i: u64| {
        black_box(
            locked
                .read()
                .unwrap()
                .get(&names[(i % 4) as usize])
                .copied(),
        );
    };
    compare(
        c,
        "memo_lookup",
        &[("papaya", &lookup), ("read_lock", &locked_lookup)],
    );
}

fn histogram(c: &mut Criterion) {
    let metrics = Metrics::new(&[], ["gpt-4o"], []).unwrap();
    let observe = |i: u64| metrics.overhead_seconds.observe(i as f64 * 1e-6);
    compare(c, "histogram_observe", &[("prometheus", &observe)]);
}

criterion_group!(benches, count_cache, memo, histogram);
criterion_main!(benches);
