//! A summary as cached, and the key it is cached under.

use serde::{Deserialize, Serialize};

pub type Key = [u8; 32];

/// A key as it may be shown: in logs and Redis, never the headers it was made from.
pub fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A summary of `messages` messages that follow the head of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    pub messages: usize,
    pub tokens: u32,
    pub model: String,
    pub created_at: u64,
    /// Written without a model (`stand_in`), in place of the model's summary until the next
    /// step.
    #[serde(default)]
    pub stand_in: bool,
}

#[cfg(test)]
impl Summary {
    /// A short summary of the first `messages` messages after the head, for the rewrites'
    /// tests.
    pub fn story_so_far(messages: usize) -> Summary {
        Summary {
            text: "the story so far".into(),
            messages,
            tokens: 5,
            model: "m".into(),
            created_at: 0,
            stand_in: false,
        }
    }
}
