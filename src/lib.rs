//! condenser: an OpenAI-compatible reverse proxy that keeps long conversations inside the
//! model's context window.

pub mod app;
pub mod body;
pub mod cache;
pub mod canonical;
pub mod chat;
pub mod cli;
pub mod compaction;
pub mod config;
pub mod count_cache;
pub mod egress;
pub mod error;
pub mod forward;
pub mod h1;
pub mod memo;
pub mod message_spans;
pub mod metrics;
pub mod models;
pub mod passthrough;
pub mod plan;
pub mod redis_store;
pub mod routes;
pub mod server;
pub mod summarize;
pub mod tokens;
pub mod usage;

pub use app::AppState;
pub use config::Config;
pub use server::Server;
