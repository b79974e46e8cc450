//! Upstream exchanges that failed, by kind.

use prometheus::{IntCounterVec, Opts};

use super::registering::MetricsError;

/// Why an upstream exchange failed, as `condenser_upstream_failures_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No connection could be made.
    Connect,
    /// No answer, or a silence within a body, past the upstream timeout.
    Timeout,
    /// A reply that breaks HTTP's rules: framing, an unrequested upgrade, an oversized head.
    Malformed,
    /// The connection closed or reset before the reply was complete.
    Reset,
}

impl FailureKind {
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Connect,
        FailureKind::Timeout,
        FailureKind::Malformed,
        FailureKind::Reset,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Malformed => "malformed",
            FailureKind::Reset => "reset",
        }
    }
}

/// `condenser_upstream_failures_total{kind}`. Failures are rare, so a plain counter does.
#[derive(Clone)]
pub struct UpstreamFailures(pub(super) IntCounterVec);

impl UpstreamFailures {
    /// Every kind shows 0 from start-up.
    pub fn new() -> Result<UpstreamFailures, MetricsError> {
        let failures = IntCounterVec::new(
            Opts::new(
                "condenser_upstream_failures_total",
                "Upstream exchanges that failed, by kind: connect, timeout, malformed, reset.",
            ),
            &["kind"],
        )?;
        for kind in FailureKind::ALL {
            failures.with_label_values(&[kind.as_str()]);
        }
        Ok(UpstreamFailures(failures))
    }

    pub fn count(&self, kind: FailureKind) {
        self.0.with_label_values(&[kind.as_str()]).inc();
    }
}
