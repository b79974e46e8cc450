//! Admission by open descriptors. A client connection holds its own descriptor and, while
//! its request is forwarded, one to upstream. Past what the open-files limit allows for both,
//! a new client gets a clear 503 at once, rather than a connection that takes the last
//! descriptors and whose request then fails upstream for want of one (a 502 after the client
//! waited).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What one client connection needs: its own descriptor and its upstream connection's.
const DESCRIPTORS_PER_CONNECTION: usize = 2;

/// Descriptors kept for everything else: the listeners and each worker's event loop, Redis,
/// the summarizer's calls, logs, and idle pooled upstream connections beyond one a client.
const RESERVED_DESCRIPTORS: usize = 64;

/// How long a refused client is given to send its request before the 503 goes (an HTTP/1.1
/// client that gets its answer before it sent everything may see a reset instead).
const REFUSED_READ: Duration = Duration::from_millis(200);

/// The open client connections, and the most the open-files limit allows.
pub struct Admission {
    open: AtomicUsize,
    most: usize,
}

/// One admitted connection; dropping it makes room for another.
pub struct Admitted(Arc<Admission>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    /// As many connections as `open_files` descriptors allow beside the reserved ones.
    pub fn for_open_files(open_files: u64) -> Admission {
        let files = usize::try_from(open_files).unwrap_or(usize::MAX);
        Admission {
            open: AtomicUsize::new(0),
            most: files.saturating_sub(RESERVED_DESCRIPTORS) / DESCRIPTORS_PER_CONNECTION,
        }
    }

    /// As the process's open-files limit (its soft limit, which `condenser serve` raised to
    /// the hard one at start-up) allows; unbounded where the limit cannot be read.
    pub fn from_limit() -> Admission {
        Admission::for_open_files(open_files_limit().unwrap_or(u64::MAX))
    }

    pub fn most(&self) -> usize {
        self.most
    }

    /// A place for one more connection, if the limit leaves one.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let admitted = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < self.most).then_some(open + 1)
            })
            .is_ok();
        admitted.then(|| Admitted(self.clone()))
    }
}

/// Raises the soft limit on open files to the hard one, and returns it. Each stream holds
/// two descriptors (the client's connection and upstream's), and the soft limit most systems
/// start a process with (1,024) would refuse new streams after some 500, though the hard
/// limit (often 20k or more) allows many more.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = open_files()?;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit only reads the `rlimit` passed to it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// The process's soft limit on open files.
fn open_files_limit() -> Option<u64> {
    open_files().ok().map(|limit| limit.rlim_cur)
}

/// The process's limits on open files, soft and hard.
fn open_files() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` passed to it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

/// Answers a client that was not admitted with a 503 in OpenAI's error shape (every SDK reads
/// `error.message`), `retry-after` set, and closes the connection. Written by hand rather than
/// through hyper: at the descriptor limit a refusal should hold nothing past one read and one
/// write (hyper's connection would keep its buffers, timers and keep-alive for a client that
/// is to go). An h2c client sent straight to HTTP/2 reads this as a broken connection, which
/// its SDK retries like the 503.
pub async fn refuse(mut stream: TcpStream, most: usize) {
    let mut request = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSED_READ, stream.read(&mut request)).await;
    let body = serde_json::json!({"error": {
        "message": format!(
            "condenser is serving {most} connections, all its open-files limit allows; retry shortly"
        ),
        "type": "server_overloaded",
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_leaves_the_reserve_and_two_descriptors_a_connection() {
        assert_eq!(Admission::for_open_files(96).most(), 16);
        assert_eq!(Admission::for_open_files(40).most(), 0);
        assert_eq!(Admission::for_open_files(1_048_576).most(), 524_256);
    }

    #[test]
    fn a_connection_dropped_makes_room_for_the_next() {
        let admission = Arc::new(Admission::for_open_files(68));
        let first = admission.admit().expect("room for two");
        let second = admission.admit().expect("room for two");
        assert!(admission.admit().is_none());
        drop(first);
        assert!(admission.admit().is_some());
        drop(second);
    }
}
