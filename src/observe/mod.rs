//! What condenser reports: Prometheus metrics, and usage read from upstream replies.

pub mod metrics;
pub mod usage;
