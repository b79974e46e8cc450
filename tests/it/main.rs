#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! condenser's integration tests, one crate: the helpers in `common` are compiled once, not
//! once per file. A module per subject; `cargo test --test it MODULE` runs one of them.
//! Tests share this process: one that needs process-wide state (an environment variable, the
//! log subscriber) takes a name or a helper no other test uses.

mod common;

mod admin;
mod agent_clients;
mod agent_sessions;
mod architecture;
mod artifacts;
mod bill;
mod binary;
mod bodies;
mod browser;
mod cache_truth;
mod clean_paths;
mod compaction;
mod dashboard;
mod gateway;
mod gemini;
mod hostile_upstream;
mod key_routing;
mod live_replay;
mod messages;
mod metrics;
mod observe;
mod reactive;
mod recall;
mod recall_offer;
mod redis;
mod replay;
mod responses;
mod sdk;
mod small_windows;
mod summarizer_api;
mod summary_checks;
mod tenants;
mod token_fixtures;
