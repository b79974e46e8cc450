//! The official OpenAI Python SDK against condenser (`pip install openai`; `.ci/run` and
//! `scripts/test.sh` install it).

use crate::common::*;

#[tokio::test]
async fn the_openai_python_sdk_works_through_condenser() {
    let upstream = mock_llm(LlmBehaviour::default()).await;
    let proxy = Proxy::start(config_for(&upstream.url())).await;
    let stdout = run_sdk_script("openai_sdk.py", &[&proxy.url("/v1")], "openai").await;
    assert!(stdout.contains("plain: reply to 1 messages"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 4);
    assert!(recorded
        .iter()
        .all(|r| r.path_and_query == "/v1/chat/completions"));
    assert_eq!(recorded[0].headers["authorization"], "Bearer sk-sdk-test");
}
