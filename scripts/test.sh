#!/usr/bin/env bash
# Runs every test on a fresh Debian machine: installs what the tests need first (README, "Two
# commands"): redis-server, prometheus and chromium from Debian, the OpenAI, Anthropic and Google Gen AI
# Python SDKs, PyYAML, the Agents SDK and LangGraph from PyPI, the Claude Code, Codex and Gemini
# CLIs from npm.
# Needs root or sudo, and network to those registries.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v redis-server >/dev/null; then
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
# tests/it/dashboard.rs runs a real Prometheus and promtool (the `prometheus` package brings both).
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# tests/it/browser.rs renders the replay page in headless Chromium, and keeps its screenshot.
if ! command -v chromium >/dev/null; then
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
python3 -c "import openai, anthropic, yaml, google.genai" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check openai anthropic pyyaml google-genai
python3 -c "import agents, langgraph, langchain_openai" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check -r tests/agents/python/requirements.txt
# The real agent CLIs the agent tests run, from npm; their packages ship their binaries.
for client in claude codex gemini; do
  [ -d "tests/agents/$client/node_modules" ] || npm ci --prefix "tests/agents/$client" --no-audit --no-fund --loglevel=error
done

cargo test --locked
cargo build --locked --quiet
python3 deploy/check.py target/debug/condenser
