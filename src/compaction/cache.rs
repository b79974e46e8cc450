//! The summary cache: keys from a rolling hash over the conversation prefix, moka in memory
//! as the first level, Redis (when configured) as the shared second level.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName};
use serde_json::Value;

use xxhash_rust::xxh3;

use crate::canonical::{hash_with_seed, trimmed_canonical};
use crate::compaction::redis::RedisStore;
use crate::compaction::summary::{Key, Summary};
use crate::config::{CacheConfig, ConfigError};
use crate::conversation::Views;
use crate::tokens::count_cache::{random_secret, CountCache, SECRET_BYTES};

/// The request headers that say who the caller is (`cache.scope_headers`), in configured order;
/// left out, every header a key may come in (`key_headers`, every API's).
pub struct ScopeHeaders(Vec<HeaderName>);

impl ScopeHeaders {
    pub fn new(
        config: &CacheConfig,
        key_headers: &[HeaderName],
    ) -> Result<ScopeHeaders, ConfigError> {
        let Some(names) = &config.scope_headers else {
            return Ok(ScopeHeaders(key_headers.to_vec()));
        };
        names
            .iter()
            .map(|name| {
                HeaderName::from_lowercase(name.as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!(
                        "cache.scope_headers: {name:?} is not a header name"
                    ))
                })
            })
            .collect::<Result<_, _>>()
            .map(ScopeHeaders)
    }

    /// The hash of the caller's identity: every scope header it sent, name and value, in
    /// configured order (so `x-api-key: K` and `api-key: K` are different callers). Callers
    /// who send none of them are one caller, the anonymous one.
    pub fn caller(&self, headers: &HeaderMap) -> Key {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"condenser caller v1");
        for name in &self.0 {
            for value in headers.get_all(name) {
                // Length-prefixed, so no two different header sets hash the same bytes.
                for part in [name.as_str().as_bytes(), value.as_bytes()] {
                    hasher.update(&(part.len() as u64).to_le_bytes());
                    hasher.update(part);
                }
            }
        }
        *hasher.finalize().as_bytes()
    }
}

/// The hash every prefix chain starts from: who asks ([`ScopeHeaders::caller`]), which model
/// summarizes, and everything else that shapes a summary (`Summarizer::settings_key`).
pub fn scope(caller: &Key, summarizer_model: &str, settings: &Key) -> Key {
    let mut hasher = blake3::Hasher::new();
    hasher.update(caller);
    hasher.update(summarizer_model.as_bytes());
    hasher.update(settings);
    *hasher.finalize().as_bytes()
}

/// Prefix keys kept as `prefix_keys` makes them, by a keyed xxh3 of the bytes blake3 hashes
/// for each: a session's requests share their prefix, and blake3 over it took 3.5M of a
/// compacted agent request's 31.7M instructions (`bench/instruction_budget.sh`), xxh3 a
/// tenth of that. The secret is random per process, so no one can make two prefixes share a
/// kept key, as for the counter's raw items.
pub struct PrefixKeys {
    made: CountCache<Key>,
    secret: [u8; SECRET_BYTES],
    /// For keys found by identity: a second secret, so that they and the keys found by what
    /// blake3 hashes are kept by two different hashes.
    identity_secret: [u8; SECRET_BYTES],
}

/// Prefix keys kept: one or two per item of a session's prefix (found by its view, and by
/// its identity), so a hundred sessions' worth or more, about 5 MB once the first is kept.
const PREFIX_KEYS_KEPT: usize = 50_000;

impl Default for PrefixKeys {
    fn default() -> PrefixKeys {
        PrefixKeys {
            made: CountCache::new(PREFIX_KEYS_KEPT),
            secret: random_secret(),
            identity_secret: random_secret(),
        }
    }
}

impl PrefixKeys {
    /// `prefix_keys(scope, messages)`, each key found when made before: by the key before it
    /// and the message's identity by its bytes as sent (`identities`, one per message, or
    /// none), else by the bytes blake3 hashes. Writing those for every message of an agent's
    /// session took 1.3M of its compacted request's 25M instructions
    /// (`bench/instruction_budget.sh`); messages alike in their bytes are alike in their
    /// views, so a key found by identity is the key their views make.
    /// The view of a message is read only when its key is not found by identity.
    pub fn keys(
        &self,
        scope: &Key,
        (messages, ahead): (&Views<'_>, usize),
        identities: &[u128],
    ) -> Vec<Key> {
        self.chain(scope, (messages, ahead), identities, |_| true)
    }

    /// `keys`, over the messages `binds` picks: a message it leaves out adds nothing, its key
    /// the one before it (`recall::binds`: the archive's keys leave out tool outputs).
    pub fn chain(
        &self,
        scope: &Key,
        (messages, ahead): (&Views<'_>, usize),
        identities: &[u128],
        binds: impl Fn(usize) -> bool,
    ) -> Vec<Key> {
        let mut previous = *scope;
        (0..ahead.min(messages.len()))
            .map(|at| {
                if !binds(at) {
                    return previous;
                }
                let known = identities.get(at).map(|identity| {
                    let mut after = [0u8; 48];
                    after[..32].copy_from_slice(&previous);
                    after[32..].copy_from_slice(&identity.to_le_bytes());
                    xxh3::xxh3_128_with_secret(&after, &self.identity_secret)
                });
                if let Some(key) = known.and_then(|known| self.made.get(known)) {
                    previous = key;
                    return key;
                }
                // `at` is within the conversation.
                let view = messages.get(at).unwrap_or(&Value::Null);
                let written = trimmed_canonical(&previous, view);
                let fast = xxh3::xxh3_128_with_secret(&written, &self.secret);
                previous = self.made.get(fast).unwrap_or_else(|| {
                    let key = *blake3::hash(&written).as_bytes();
                    self.made.insert(fast, key);
                    key
                });
                if let Some(known) = known {
                    self.made.insert(known, previous);
                }
                previous
            })
            .collect()
    }
}

/// `keys[i] = h_i = blake3(h_{i-1} ‖ canonical(message_i))`, `h_{-1}` the scope.
pub fn prefix_keys<'v>(scope: &Key, messages: impl IntoIterator<Item = &'v Value>) -> Vec<Key> {
    let mut previous = *scope;
    messages
        .into_iter()
        .map(|message| {
            previous = hash_with_seed(&previous, message);
            previous
        })
        .collect()
}

/// Where one caller's record is kept under `reference` (a cut horizon's).
fn archive_key(caller: &Key, reference: &str) -> Key {
    let mut hasher = blake3::Hasher::new();
    hasher.update(caller);
    hasher.update(reference.as_bytes());
    *hasher.finalize().as_bytes()
}

/// Where one caller's archived item is kept: its reference names it for its caller only, and
/// only in the history `binding` (the key of what was written before it) names, so that a
/// reference or a masked item of another history finds nothing.
pub fn archive_slot(caller: &Key, binding: &Key, reference: &str) -> Key {
    let mut hasher = blake3::Hasher::new();
    hasher.update(caller);
    hasher.update(binding);
    hasher.update(reference.as_bytes());
    *hasher.finalize().as_bytes()
}

/// Where the cut horizon of the kept part after `anchor` (a prefix key) is recorded: a name
/// no recall reference (`ctx:…`) can take.
fn horizon_reference(anchor: &Key) -> String {
    format!("cuts:{}", blake3::Hash::from_bytes(*anchor).to_hex())
}

pub struct SummaryCache {
    memory: moka::future::Cache<Key, Arc<Summary>>,
    /// The verbatim items compaction took out, for the recall tool.
    archive: moka::future::Cache<Key, Arc<str>>,
    shared: Option<RedisStore>,
}

impl SummaryCache {
    pub fn new(config: &CacheConfig, shared: Option<RedisStore>) -> SummaryCache {
        let memory = moka::future::Cache::builder()
            .max_capacity(config.max_bytes)
            .weigher(|_key: &Key, summary: &Arc<Summary>| {
                u32::try_from(summary.text.len() + summary.model.len() + 128).unwrap_or(u32::MAX)
            })
            .time_to_live(Duration::from_secs(config.ttl_secs.max(1)))
            .build();
        let archive = moka::future::Cache::builder()
            .max_capacity(config.max_bytes)
            .weigher(|_key: &Key, text: &Arc<str>| {
                u32::try_from(text.len() + 64).unwrap_or(u32::MAX)
            })
            .time_to_live(Duration::from_secs(config.ttl_secs.max(1)))
            .build();
        SummaryCache {
            memory,
            archive,
            shared,
        }
    }

    pub fn entries(&self) -> u64 {
        self.memory.entry_count()
    }

    pub fn shared(&self) -> Option<&RedisStore> {
        self.shared.as_ref()
    }

    /// Every summary cached under `keys`, by index, in order: those memory holds, and the
    /// longest beyond them that another replica stored in Redis.
    pub async fn cached(&self, keys: &[Key]) -> Vec<(usize, Arc<Summary>)> {
        let mut found = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if let Some(summary) = self.memory.get(key).await {
                found.push((i, summary));
            }
        }
        let after = found.last().map_or(0, |(i, _)| i + 1);
        let Some(shared) = self.shared.as_ref().filter(|_| after < keys.len()) else {
            return found;
        };
        if let Some((i, summary)) = shared.longest(&keys[after..]).await {
            let summary = Arc::new(summary);
            self.memory.insert(keys[after + i], summary.clone()).await;
            found.push((after + i, summary));
        }
        found
    }

    pub async fn get(&self, key: &Key) -> Option<Arc<Summary>> {
        self.cached(std::slice::from_ref(key))
            .await
            .pop()
            .map(|(_, s)| s)
    }

    pub async fn put(&self, key: Key, summary: Arc<Summary>) {
        if let Some(shared) = &self.shared {
            shared.put(&key, &summary).await;
        }
        self.memory.insert(key, summary).await;
    }

    /// The cut horizons `caller`'s conversations recorded for the kept parts after
    /// `anchors` (`compactor`'s records), by index. They live beside the archive, with its
    /// TTL and in its Redis space: like the archive, they are what a session's earlier
    /// rewrites did, which every replica must do alike.
    pub async fn horizons(&self, caller: &Key, anchors: &[Key]) -> Vec<Option<Arc<str>>> {
        let keys: Vec<Key> = anchors
            .iter()
            .map(|anchor| archive_key(caller, &horizon_reference(anchor)))
            .collect();
        let mut found = Vec::with_capacity(keys.len());
        for key in &keys {
            found.push(self.archive.get(key).await);
        }
        // Unlike an archived item, a record changes: another replica may have moved it since
        // this one's memory took it, so with Redis the shared record wins (memory serves when
        // Redis has none, or is down).
        if let Some(shared) = &self.shared {
            for (i, record) in shared.archive_get(&keys).await.into_iter().enumerate() {
                if let Some(record) = record {
                    let record: Arc<str> = Arc::from(record);
                    self.archive.insert(keys[i], record.clone()).await;
                    found[i] = Some(record);
                }
            }
        }
        found
    }

    /// Records a cut horizon, replacing the one recorded before for the same kept part.
    pub async fn horizon_put(&self, caller: &Key, anchor: &Key, record: &str) {
        let key = archive_key(caller, &horizon_reference(anchor));
        self.archive.insert(key, Arc::from(record)).await;
        if let Some(shared) = &self.shared {
            shared.archive_put(&[(key, record)]).await;
        }
    }

    /// Archives `(slot, item)` pairs (`ArchiveScope::slot`), each item as its verbatim text.
    /// Items memory already holds are skipped, and not even written out (a compacted agent
    /// request archives every output it cuts, nearly all of them archived before), so a later
    /// request archiving them again costs nothing in Redis; the others reach Redis in one
    /// round trip.
    pub async fn archive_put(&self, items: &[(Key, impl Display)]) {
        let mut fresh: Vec<(Key, Arc<str>)> = Vec::new();
        for &(key, ref item) in items {
            if self.archive.contains_key(&key) {
                continue;
            }
            let text: Arc<str> = Arc::from(item.to_string());
            self.archive.insert(key, text.clone()).await;
            fresh.push((key, text));
        }
        if let Some(shared) = &self.shared {
            let fresh: Vec<(Key, &str)> = fresh.iter().map(|(key, text)| (*key, &**text)).collect();
            shared.archive_put(&fresh).await;
        }
    }

    /// The items archived in `keys` (`ArchiveScope::slot`), by index: those memory holds, and
    /// the rest from Redis in one round trip (kept in memory from then on).
    pub async fn archive_get(&self, keys: &[Key]) -> Vec<Option<Arc<str>>> {
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            found.push(self.archive.get(key).await);
        }
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| found[i].is_none()).collect();
        let Some(shared) = self.shared.as_ref().filter(|_| !missing.is_empty()) else {
            return found;
        };
        let missing_keys: Vec<Key> = missing.iter().map(|&i| keys[i]).collect();
        for (i, text) in missing
            .into_iter()
            .zip(shared.archive_get(&missing_keys).await)
        {
            if let Some(text) = text {
                let text: Arc<str> = Arc::from(text);
                self.archive.insert(keys[i], text.clone()).await;
                found[i] = Some(text);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope_headers(names: &[&str]) -> ScopeHeaders {
        let config = CacheConfig {
            scope_headers: Some(names.iter().map(|n| n.to_string()).collect()),
            ..CacheConfig::default()
        };
        ScopeHeaders::new(&config, &[]).unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, hyper::header::HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_caller_is_every_scope_header_sent_by_name_and_value() {
        let default =
            ScopeHeaders::new(&CacheConfig::default(), crate::dialect::key_headers()).unwrap();
        let caller = |pairs| default.caller(&headers(pairs));
        // The header's name counts, not only its value.
        assert_ne!(caller(&[("x-api-key", "K")]), caller(&[("api-key", "K")]));
        assert_ne!(caller(&[("x-api-key", "K")]), caller(&[("x-api-key", "L")]));
        assert_ne!(
            caller(&[("authorization", "Bearer K")]),
            caller(&[("authorization", "Bearer L")])
        );
        // Every one sent counts, whatever order the request lists them in.
        let both = caller(&[("authorization", "Bearer A"), ("x-api-key", "K")]);
        assert_ne!(both, caller(&[("authorization", "Bearer A")]));
        assert_eq!(
            both,
            caller(&[("x-api-key", "K"), ("authorization", "Bearer A")])
        );
        // Headers outside the list do not; a caller with none of the listed is anonymous.
        let anonymous = caller(&[]);
        assert_eq!(
            caller(&[("x-user-id", "alice"), ("user-agent", "sdk")]),
            anonymous
        );
        assert_ne!(caller(&[("api-key", "")]), anonymous);
        // An operator's extra header splits callers who share a key.
        let gateway = scope_headers(&["authorization", "x-user-id"]);
        let user = |id| {
            gateway.caller(&headers(&[
                ("authorization", "Bearer shared"),
                ("x-user-id", id),
            ]))
        };
        assert_ne!(user("alice"), user("bob"));
        assert_eq!(user("alice"), user("alice"));
        // Hashed in configured order: the same pair of values under swapped names differs.
        assert_ne!(
            gateway.caller(&headers(&[("authorization", "a"), ("x-user-id", "b")])),
            gateway.caller(&headers(&[("authorization", "b"), ("x-user-id", "a")]))
        );
    }

    /// The history the tests' items are archived in.
    const BINDING: Key = [9; 32];

    /// Where `caller`'s items `references` are kept, in the history `BINDING` names.
    fn slots(caller: &Key, references: &[&str]) -> Vec<Key> {
        references
            .iter()
            .map(|reference| archive_slot(caller, &BINDING, reference))
            .collect()
    }

    fn items(caller: &Key, pairs: &[(&str, &str)]) -> Vec<(Key, String)> {
        pairs
            .iter()
            .map(|(reference, text)| (archive_slot(caller, &BINDING, reference), text.to_string()))
            .collect()
    }

    fn texts(found: Vec<Option<Arc<str>>>) -> Vec<Option<String>> {
        found
            .into_iter()
            .map(|text| text.map(|t| t.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn archived_items_come_back_verbatim_for_their_caller_and_history_only() {
        let cache = SummaryCache::new(&CacheConfig::default(), None);
        let (alice, bob) = ([1; 32], [2; 32]);
        let text = "  port 23456\n\twith trailing space ";
        cache
            .archive_put(&items(&alice, &[("ctx:a", text), ("ctx:b", "second")]))
            .await;
        let asked = ["ctx:b", "ctx:missing", "ctx:a"];
        assert_eq!(
            texts(cache.archive_get(&slots(&alice, &asked)).await),
            [Some("second".into()), None, Some(text.into())]
        );
        assert_eq!(
            texts(cache.archive_get(&slots(&bob, &asked)).await),
            [None, None, None]
        );
        // The same caller and reference in another history: nothing.
        let elsewhere = [archive_slot(&alice, &[8; 32], "ctx:a")];
        assert_eq!(texts(cache.archive_get(&elsewhere).await), [None]);
        assert!(cache.archive_get(&[]).await.is_empty());
    }

    /// A compacted request archives every output it cuts, nearly all archived before: those
    /// are not written out again, so their views are never made (`archive_cleared`).
    #[tokio::test]
    async fn an_item_archived_before_is_not_written_out_again() {
        struct Counted<'a>(&'a std::sync::atomic::AtomicUsize, &'a str);
        impl Display for Counted<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                f.write_str(self.1)
            }
        }
        let cache = SummaryCache::new(&CacheConfig::default(), None);
        let caller = [3; 32];
        let written = std::sync::atomic::AtomicUsize::new(0);
        let put = |reference: &str, text| {
            (
                archive_slot(&caller, &BINDING, reference),
                Counted(&written, text),
            )
        };
        cache.archive_put(&[put("ctx:a", "first")]).await;
        cache
            .archive_put(&[put("ctx:a", "again"), put("ctx:b", "second")])
            .await;
        assert_eq!(written.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(
            texts(
                cache
                    .archive_get(&slots(&caller, &["ctx:a", "ctx:b"]))
                    .await
            ),
            [Some("first".into()), Some("second".into())]
        );
    }

    #[tokio::test]
    async fn archiving_never_fails_when_redis_is_unreachable() {
        let config = CacheConfig {
            redis_url: "redis://127.0.0.1:1".into(),
            redis_timeout_ms: 200,
            ..CacheConfig::default()
        };
        let errors = prometheus::IntCounter::new("errors", "redis faults").unwrap();
        let shared = RedisStore::new(&config, errors.clone()).unwrap();
        let cache = SummaryCache::new(&config, Some(shared));
        let caller = [7; 32];
        cache
            .archive_put(&items(&caller, &[("ctx:a", "kept in memory")]))
            .await;
        assert_eq!(
            texts(
                cache
                    .archive_get(&slots(&caller, &["ctx:a", "ctx:gone"]))
                    .await
            ),
            [Some("kept in memory".into()), None]
        );
        assert!(errors.get() >= 1, "the fault is counted");
    }

    #[test]
    fn prefix_keys_roll_and_depend_on_scope() {
        let messages = vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let default =
            ScopeHeaders::new(&CacheConfig::default(), crate::dialect::key_headers()).unwrap();
        let k1 = default.caller(&headers(&[("authorization", "Bearer k1")]));
        let k2 = default.caller(&headers(&[("authorization", "Bearer k2")]));
        let s1 = scope(&k1, "gpt-4o", &[1; 32]);
        let s2 = scope(&k2, "gpt-4o", &[1; 32]);
        let a = prefix_keys(&s1, &messages);
        let b = prefix_keys(&s1, &messages[..1]);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[0], a[1]);
        assert_ne!(prefix_keys(&s2, &messages)[1], a[1]);
        assert_ne!(scope(&k1, "gpt-4o", &[2; 32]), s1);
        assert_ne!(scope(&k1, "gpt-4o-mini", &[1; 32]), s1);
        // Kept or made afresh, the same keys.
        let kept = PrefixKeys::default();
        let views = Views::made(&messages[..]);
        assert_eq!(kept.keys(&s1, (&views, 2), &[]), a);
        assert_eq!(kept.keys(&s1, (&views, 2), &[]), a);
        assert_eq!(
            kept.keys(&s2, (&views, 1), &[]),
            prefix_keys(&s2, &messages[..1])
        );
        // Found by identity, the same keys: made once by the views, then found without
        // reading them.
        let identities = [7, 8];
        assert_eq!(kept.keys(&s1, (&views, 2), &identities), a);
        let unread = Views::lazy(2, |at| panic!("view {at} read, its key known by identity"));
        assert_eq!(kept.keys(&s1, (&unread, 2), &identities), a);
        // An identity after another key is another item.
        assert_eq!(
            kept.keys(&s2, (&views, 2), &identities),
            prefix_keys(&s2, &messages)
        );
    }
}
