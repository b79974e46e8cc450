//! What every family of series is built with: a registered collector, a series kept once
//! made, and the error of registering one.

use std::sync::OnceLock;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::Registry;

/// The series of `vec` with `labels`, made on its first update and kept in `cell`: a series
/// appears once counted, as any of a vector's does, and later updates skip the vector's
/// lookup by label (a hash, a read lock and a reference count, the last two writes to memory
/// every worker shares).
pub(super) fn series<'a, T: MetricVecBuilder>(
    cell: &'a OnceLock<T::M>,
    vec: &MetricVec<T>,
    labels: &[&str],
) -> &'a T::M {
    cell.get_or_init(|| vec.with_label_values(labels))
}

/// `collector`, registered in `registry`.
pub(super) fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, MetricsError> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);
