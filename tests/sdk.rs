#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The official OpenAI Python SDK against condenser (`pip install openai`; `.ci/run` and
//! `scripts/test.sh` install it).

mod common;

use common::*;

#[tokio::test]
async fn the_openai_python_sdk_works_through_condenser() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_sdk.py");
    let output = tokio::process::Command::new("python3")
        .arg(script)
        .arg(proxy.url("/v1"))
        .output()
        .await
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK script failed (is the openai package installed? pip install openai)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("plain: reply to 1 messages"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 4);
    assert!(recorded
        .iter()
        .all(|r| r.path_and_query == "/v1/chat/completions"));
    assert_eq!(recorded[0].headers["authorization"], "Bearer sk-sdk-test");
}
