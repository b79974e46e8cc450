//! What condenser reports: its Prometheus metrics.

pub mod metrics;
