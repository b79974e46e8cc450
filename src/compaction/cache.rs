//! The summary cache: keys from a rolling hash over the conversation prefix, moka in memory
//! as the first level, Redis (when configured) as the shared second level.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::canonical::hash_with_seed;
use crate::compaction::redis::RedisStore;
use crate::compaction::summary::{Key, Summary};
use crate::config::CacheConfig;

/// The hash every prefix chain starts from: who asks (their key's hash), which model
/// summarizes, and with which prompt.
pub fn scope(authorization: Option<&[u8]>, summarizer_model: &str, prompt_version: u32) -> Key {
    let caller = blake3::hash(authorization.unwrap_or(b"anonymous"));
    let mut hasher = blake3::Hasher::new();
    hasher.update(caller.as_bytes());
    hasher.update(summarizer_model.as_bytes());
    hasher.update(&prompt_version.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// `keys[i] = h_i = blake3(h_{i-1} ‖ canonical(message_i))`, `h_{-1}` the scope.
pub fn prefix_keys(scope: &Key, messages: &[Value]) -> Vec<Key> {
    let mut previous = *scope;
    messages
        .iter()
        .map(|message| {
            previous = hash_with_seed(&previous, message);
            previous
        })
        .collect()
}

pub struct SummaryCache {
    memory: moka::future::Cache<Key, Arc<Summary>>,
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
        SummaryCache { memory, shared }
    }

    pub fn entries(&self) -> u64 {
        self.memory.entry_count()
    }

    pub fn shared(&self) -> Option<&RedisStore> {
        self.shared.as_ref()
    }

    /// The last of `keys` that has a summary, with its position: memory first, then one
    /// round trip to the shared level for all of them. Found shared entries are kept in memory.
    pub async fn longest(&self, keys: &[Key]) -> Option<(usize, Arc<Summary>)> {
        let mut found = None;
        for (i, key) in keys.iter().enumerate().rev() {
            if let Some(summary) = self.memory.get(key).await {
                found = Some((i, summary));
                break;
            }
        }
        // Another replica may hold a longer one than memory has.
        let after = found.as_ref().map_or(0, |(i, _)| i + 1);
        let Some(shared) = self.shared.as_ref().filter(|_| after < keys.len()) else {
            return found;
        };
        let Some((i, summary)) = shared.longest(&keys[after..]).await else {
            return found;
        };
        let summary = Arc::new(summary);
        self.memory.insert(keys[after + i], summary.clone()).await;
        Some((after + i, summary))
    }

    pub async fn get(&self, key: &Key) -> Option<Arc<Summary>> {
        self.longest(std::slice::from_ref(key))
            .await
            .map(|(_, s)| s)
    }

    pub async fn put(&self, key: Key, summary: Arc<Summary>) {
        if let Some(shared) = &self.shared {
            shared.put(&key, &summary).await;
        }
        self.memory.insert(key, summary).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefix_keys_roll_and_depend_on_scope() {
        let messages = vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let s1 = scope(Some(b"Bearer k1"), "gpt-4o", 1);
        let s2 = scope(Some(b"Bearer k2"), "gpt-4o", 1);
        let a = prefix_keys(&s1, &messages);
        let b = prefix_keys(&s1, &messages[..1]);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[0], a[1]);
        assert_ne!(prefix_keys(&s2, &messages)[1], a[1]);
        assert_ne!(scope(Some(b"Bearer k1"), "gpt-4o", 2), s1);
    }
}
