//! Exact prompt-token counts, and the cache that keeps each message's count.

pub mod count_cache;
pub mod counter;
pub mod encoding;
