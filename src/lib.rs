//! condenser: an OpenAI-compatible reverse proxy that keeps long conversations inside the
//! model's context window.

pub mod body;
pub mod canonical;
pub mod config;
pub mod error;
pub mod models;
pub mod plan;
pub mod tokens;
