//! condenser: an OpenAI-compatible reverse proxy that keeps long conversations inside the
//! model's context window.

pub mod canonical;
pub mod cli;
pub mod compaction;
pub mod config;
pub mod conversation;
pub mod dialect;
pub mod error;
pub mod observe;
pub mod pipeline;
pub mod server;
pub mod tokens;
pub mod transport;

pub use config::Config;
pub use pipeline::state::AppState;
pub use server::serve::Server;
