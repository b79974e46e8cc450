"""The OpenAI Agents SDK (openai-agents from PyPI) as an agent condenser's tests run: one
task, then a tool loop the scripted upstream drives, on the Responses API or Chat
Completions.

Usage: agents_sdk.py BASE_URL MODEL API(responses|chat) LOG_DIR TASK
"""

import os
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

base_url, model, api, log_dir, task = sys.argv[1:6]


@function_tool
def read_log(round: int) -> str:
    """Reads the build log of one round."""
    with open(os.path.join(log_dir, f"log-{round:03}.txt")) as log:
        return log.read()


set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key="sk-agent-test"), use_for_tracing=False)
set_default_openai_api("responses" if api == "responses" else "chat_completions")
agent = Agent(name="debugger", instructions="Find why the nightly build fails.", tools=[read_log], model=model)
result = Runner.run_sync(agent, task, max_turns=500)
print(result.final_output)
