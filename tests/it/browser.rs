//! The replay page in a real browser: headless Chromium (Debian's `chromium`, which
//! scripts/test.sh installs) opens the page of a recorded session from a file, offline, and
//! the DOM it builds must hold one point per request of replay's own table, and a step mark
//! of the table's kind at each request where the table puts one. A screenshot of the page is
//! kept as a CI artifact (target/artifacts/replay.png; README shows one).

use std::path::PathBuf;
use std::process::Stdio;

use crate::replay::{drawn, recorded_claude_code_page, rows, table_steps};

/// Fails, never skips, without the browser: scripts/test.sh installs it.
fn chromium() -> &'static str {
    let found = std::process::Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "`chromium` is not installed: this test renders the replay page in a real browser. \
         Install Debian's `chromium` package, as scripts/test.sh does."
    );
    "chromium"
}

/// Chromium, headless, with a fresh profile and nothing of its own on the network, run with
/// `args` on `page`; its standard output.
async fn headless(args: &[String], page: &std::path::Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), output)
        .await
        .expect("chromium finished within two minutes")
        .unwrap();
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")));
    let dir = target.join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn the_replay_page_of_a_recorded_session_renders_in_chromium_with_its_steps() {
    let (table, html) = recorded_claude_code_page().await;
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("replay.html");
    std::fs::write(&page, html).unwrap();

    // The DOM as Chromium built it.
    let dom = headless(&["--dump-dom".to_string()], &page).await;
    let built = drawn(&dom);
    let requests = rows(table).len();
    assert_eq!(built.sessions, 1, "{dom:.2000}");
    assert_eq!(built.points, (1..=requests).collect::<Vec<_>>());
    let steps = table_steps(table);
    assert!(!steps.is_empty(), "{table}");
    assert_eq!(built.steps, steps);
    assert!(dom.contains("<svg class=\"chart\""), "{dom:.2000}");

    // The screenshot, kept.
    let shot = artifacts().join("replay.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1040,900".to_string(),
        ],
        &page,
    )
    .await;
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 20_000, "{} bytes: a blank page?", png.len());
}
