"""The OpenAI Agents SDK (openai-agents from PyPI) as an agent condenser's tests run: one
task, a tool loop the scripted upstream drives, on the Responses API or Chat Completions,
then a question in the same conversation.

Usage: agents_sdk.py BASE_URL MODEL API(responses|chat) LOG_DIR INSTRUCTIONS_FILE TASK QUESTION
"""

import os
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

base_url, model, api, log_dir, instructions_file, task, question = sys.argv[1:8]


@function_tool
def read_log(name: str) -> str:
    """Reads the build log of that name."""
    with open(os.path.join(log_dir, os.path.basename(name))) as log:
        return log.read()


with open(instructions_file) as rules:
    instructions = "Find why the nightly build fails.\n\n" + rules.read()
set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key="sk-agent-test"), use_for_tracing=False)
set_default_openai_api("responses" if api == "responses" else "chat_completions")
agent = Agent(name="debugger", instructions=instructions, tools=[read_log], model=model)
result = Runner.run_sync(agent, task, max_turns=500)
print(result.final_output)
answer = Runner.run_sync(agent, result.to_input_list() + [{"role": "user", "content": question}], max_turns=10)
print(answer.final_output)
