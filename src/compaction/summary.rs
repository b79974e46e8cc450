//! A summary as cached, and the key it is cached under.

use serde::{Deserialize, Serialize};

pub type Key = [u8; 32];

/// A summary of `messages` messages that follow the head of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    pub messages: usize,
    pub tokens: u32,
    pub model: String,
    pub prompt_version: u32,
    pub created_at: u64,
}
