//! How long freed memory stays with the process. mimalloc gives a page back to the system 10
//! ms after it is freed (`purge_delay`), and an agent's compacted request frees its 826 KB
//! body and its tree before the next comes: each request then faulted its pages in again,
//! 17% of a compacted Responses request's time in `perf record` (page faults and the
//! `madvise` that gave them back). Kept for a second, they are reused: the compacted
//! Responses request's p50 went from 2.93, 2.87, 2.91 to 2.67, 2.59, 2.64 ms
//! (`bench/agent_replay.sh`, `MIMALLOC_PURGE_DELAY=1000` by turns with the default). Peak
//! memory does not move: memory is kept only as long as it goes unused for less than a second.

use std::ffi::c_long;

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc v2's `mi_option_purge_delay`, by its place in `mi_option_e` (libmimalloc-sys
/// names only the options it deems stable).
const PURGE_DELAY: mi_option_t = 15;

/// How long freed memory is kept for reuse, in milliseconds.
pub const KEEP_FREED_MS: c_long = 1_000;

/// Keeps freed memory `KEEP_FREED_MS` before giving it back, unless the operator set
/// mimalloc's own `MIMALLOC_PURGE_DELAY`.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads atomically.
        unsafe { mi_option_set(PURGE_DELAY, KEEP_FREED_MS) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    /// mimalloc's purge delay now, in milliseconds.
    fn purge_delay_ms() -> c_long {
        // SAFETY: reads one of mimalloc's options.
        unsafe { mi_option_get(PURGE_DELAY) }
    }

    #[test]
    fn freed_memory_is_kept_a_second() {
        // v2's default, read through the option's number: the number names the delay.
        assert_eq!(purge_delay_ms(), 10);
        keep_freed_memory();
        assert_eq!(purge_delay_ms(), KEEP_FREED_MS);
    }
}
