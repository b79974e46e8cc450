//! Transport: bodies, the upstream client and its egress, and the relayed reply's usage.
//! It knows HTTP and upstreams, nothing of compaction or of any dialect's requests.

pub mod body;
pub mod broken;
pub mod departure;
pub mod egress;
pub mod events;
pub mod headers;
mod pool;
pub mod redact;
pub mod upstream;
pub mod usage;
