//! The shared second level of the summary cache, in Redis. Never a reason a request fails:
//! every operation is bounded by a timeout, a fault is counted and logged once per outage,
//! and the connection is re-made by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;

use crate::compaction::summary::{hex, Key, Summary};
use crate::config::{CacheConfig, ConfigError};

/// After a failed connection attempt, requests go on without Redis this long before the next.
const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

pub struct RedisStore {
    client: redis::Client,
    manager: tokio::sync::Mutex<Option<ConnectionManager>>,
    next_attempt: Mutex<Instant>,
    prefix: String,
    ttl: Duration,
    timeout: Duration,
    healthy: AtomicBool,
    errors: IntCounter,
}

pub enum LockOutcome {
    Acquired(String),
    HeldElsewhere,
    Unavailable,
}

static RELEASE_IF_OURS: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    )
});

/// A value no other lock holder shares: process, time and a counter.
fn lock_token() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}-{nanos:x}-{n:x}", std::process::id())
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl RedisStore {
    pub fn new(config: &CacheConfig, errors: IntCounter) -> Result<RedisStore, ConfigError> {
        let client = redis::Client::open(config.redis_url.as_str())
            .map_err(|e| ConfigError::Invalid(format!("cache.redis_url: {e}")))?;
        Ok(RedisStore {
            client,
            manager: tokio::sync::Mutex::new(None),
            next_attempt: Mutex::new(Instant::now()),
            prefix: config.redis_key_prefix.clone(),
            ttl: Duration::from_secs(config.ttl_secs.max(1)),
            timeout: Duration::from_millis(config.redis_timeout_ms.max(1)),
            healthy: AtomicBool::new(true),
            errors,
        })
    }

    fn summary_key(&self, key: &Key) -> String {
        format!("{}summary:{}", self.prefix, hex(key))
    }

    fn archive_key(&self, key: &Key) -> String {
        format!("{}archive:{}", self.prefix, hex(key))
    }

    fn lock_key(&self, key: &Key) -> String {
        format!("{}lock:{}", self.prefix, hex(key))
    }

    fn fault(&self, operation: &str, error: &dyn std::fmt::Display) {
        self.errors.inc();
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(operation, %error, "redis unavailable: going on with the in-memory cache");
        }
    }

    fn recovered(&self) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!("redis reachable again");
        }
    }

    /// A connection, made on first use and after failures at most once per backoff; `None`
    /// while Redis is unreachable. Requests arriving while a connection is being made wait
    /// for it no longer than one operation's timeout.
    async fn connection(&self) -> Option<ConnectionManager> {
        let mut manager = tokio::time::timeout(self.timeout, self.manager.lock())
            .await
            .ok()?;
        if let Some(connection) = manager.as_ref() {
            return Some(connection.clone());
        }
        {
            let mut next = self.next_attempt.lock().ok()?;
            if Instant::now() < *next {
                return None;
            }
            *next = Instant::now() + RECONNECT_BACKOFF;
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        match tokio::time::timeout(
            self.timeout * 2,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        {
            Ok(Ok(connection)) => {
                *manager = Some(connection.clone());
                Some(connection)
            }
            Ok(Err(e)) => {
                self.fault("connect", &e);
                None
            }
            Err(_) => {
                self.fault("connect", &"timed out");
                None
            }
        }
    }

    /// Runs one command with the timeout; faults are counted and become `None`.
    async fn run<T, F, Fut>(&self, operation: &str, command: F) -> Option<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let connection = self.connection().await?;
        match tokio::time::timeout(self.timeout, command(connection)).await {
            Ok(Ok(value)) => {
                self.recovered();
                Some(value)
            }
            Ok(Err(e)) => {
                self.fault(operation, &e);
                None
            }
            Err(_) => {
                self.fault(operation, &"timed out");
                None
            }
        }
    }

    /// The last of `keys` with a stored summary, in one round trip.
    pub async fn longest(&self, keys: &[Key]) -> Option<(usize, Summary)> {
        if keys.is_empty() {
            return None;
        }
        let names: Vec<String> = keys.iter().map(|k| self.summary_key(k)).collect();
        let values: Vec<Option<String>> = self
            .run("get", |mut c| async move { c.mget(names).await })
            .await?;
        values
            .into_iter()
            .enumerate()
            .rev()
            .find_map(|(i, v)| Some((i, serde_json::from_str::<Summary>(&v?).ok()?)))
    }

    pub async fn put(&self, key: &Key, summary: &Summary) {
        let Ok(value) = serde_json::to_string(summary) else {
            return;
        };
        let name = self.summary_key(key);
        let ttl = self.ttl.as_millis() as u64;
        let _: Option<()> = self
            .run(
                "set",
                |mut c| async move { c.pset_ex(name, value, ttl).await },
            )
            .await;
    }

    /// Stores archived items, each under its key with the cache's TTL, in one round trip.
    pub async fn archive_put(&self, items: &[(Key, &str)]) {
        if items.is_empty() {
            return;
        }
        let ttl = self.ttl.as_millis() as u64;
        let mut pipeline = redis::pipe();
        for (key, text) in items {
            pipeline.pset_ex(self.archive_key(key), *text, ttl).ignore();
        }
        let _: Option<()> = self
            .run("archive", |mut c| async move {
                pipeline.query_async(&mut c).await
            })
            .await;
    }

    /// The archived items under `keys`, by index, in one round trip; all `None` when Redis
    /// is unavailable.
    pub async fn archive_get(&self, keys: &[Key]) -> Vec<Option<String>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = keys.iter().map(|k| self.archive_key(k)).collect();
        self.run("recall", |mut c| async move { c.mget(names).await })
            .await
            .filter(|values: &Vec<Option<String>>| values.len() == keys.len())
            .unwrap_or_else(|| vec![None; keys.len()])
    }

    /// Takes the cross-replica lock for making `key`'s summary, for at most `hold`.
    pub async fn try_lock(&self, key: &Key, hold: Duration) -> LockOutcome {
        let name = self.lock_key(key);
        let token = lock_token();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(hold.as_millis() as u64));
        let value = token.clone();
        let taken: Option<Option<String>> = self
            .run("lock", |mut c| async move {
                c.set_options(name, value, options).await
            })
            .await;
        match taken {
            Some(Some(_)) => LockOutcome::Acquired(token),
            Some(None) => LockOutcome::HeldElsewhere,
            None => LockOutcome::Unavailable,
        }
    }

    /// Releases the lock only if it is still ours: an expired lock may belong to another
    /// replica by now.
    pub async fn unlock(&self, key: &Key, token: &str) {
        let name = self.lock_key(key);
        let token = token.to_string();
        let _: Option<i64> = self
            .run("unlock", |mut c| async move {
                RELEASE_IF_OURS
                    .key(name)
                    .arg(token)
                    .invoke_async(&mut c)
                    .await
            })
            .await;
    }
}
