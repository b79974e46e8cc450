//! The process's one log subscriber. Every test of this crate shares the process, so a test
//! that reads logs sees other tests' lines too, and picks its own by what only it logs.

use std::sync::{Arc, Mutex, OnceLock};

/// Every log line this process writes from now on, at every level, from every thread.
pub fn captured_logs() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs(Arc::new(Mutex::new(Vec::new())));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
    .clone()
}

#[derive(Clone)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
