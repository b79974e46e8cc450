//! Compaction: the pure planner, the rule that cuts a tool output, the summarizer, the
//! summary cache and its shared Redis level, and the compactor that carries a plan out.

pub mod artifacts;
pub mod breaker;
pub mod cache;
pub mod compactor;
mod forms;
mod horizon;
mod identifiers;
pub mod limits;
mod pace;
pub mod plan;
pub mod recall;
pub mod redis;
pub mod rewrite;
pub mod session;
pub mod shorten;
mod single_flight;
mod stand_in;
pub mod summarizer;
pub mod summary;
pub mod summary_api;
pub mod summary_check;
mod summary_maker;
pub mod summary_prompt;
