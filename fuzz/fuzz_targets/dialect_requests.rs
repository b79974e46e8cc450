//! Each dialect's request parser, view, counter and the planner, on any bytes: the first
//! byte picks the API and the mode, the rest is the request body. `condenser plan` runs the
//! same stages the proxy runs before it sends (parse, the raw first stage, count, plan, the
//! compaction written out and counted again), calling nothing. Errors are answers; only a
//! panic is a finding.
#![no_main]

use std::sync::OnceLock;

use condenser::cli::{count, plan, PlanOptions};
use condenser::compaction::plan::Mode;
use condenser::dialect::DIALECTS;
use condenser::Config;
use libfuzzer_sys::fuzz_target;

/// A config whose triggers fire on small requests, so the planner and the rewrite run.
fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let mut config = Config::default();
        config.context.max_messages = 4;
        config.context.keep_recent_messages = 2;
        config
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let Ok(body) = std::str::from_utf8(body) else {
        return;
    };
    let api = DIALECTS[usize::from(pick) % DIALECTS.len()].api;
    let mode = [Mode::Auto, Mode::Force, Mode::Off][usize::from(pick >> 4) % 3];
    runtime().block_on(async {
        let _ = count(config(), body, None, Some(api), true).await;
        let options = PlanOptions {
            model: None,
            api: Some(api),
            mode,
            profile: None,
        };
        let _ = plan(config(), body, options).await;
    });
});
