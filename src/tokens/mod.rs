//! Exact prompt-token counts, the cache that keeps each message's count, and the catalog of
//! what condenser knows of each model (its encoding and window).

pub mod catalog;
pub mod count_cache;
pub mod counter;
pub mod encoding;
pub mod memo;
pub mod rules;
