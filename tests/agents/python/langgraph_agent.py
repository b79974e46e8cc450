"""LangGraph's prebuilt ReAct agent (langgraph and langchain-openai from PyPI) as an agent
condenser's tests run: one task, a tool loop the scripted upstream drives, on Chat
Completions, then a question in the same conversation.

Usage: langgraph_agent.py BASE_URL MODEL LOG_DIR INSTRUCTIONS_FILE TASK QUESTION
"""

import os
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

base_url, model, log_dir, instructions_file, task, question = sys.argv[1:7]


@tool
def read_log(name: str) -> str:
    """Reads the build log of that name."""
    with open(os.path.join(log_dir, os.path.basename(name))) as log:
        return log.read()


with open(instructions_file) as rules:
    instructions = "Find why the nightly build fails.\n\n" + rules.read()
llm = ChatOpenAI(model=model, base_url=base_url, api_key="sk-agent-test", max_retries=0)
agent = create_react_agent(llm, [read_log], prompt=instructions)
state = agent.invoke({"messages": [("user", task)]}, {"recursion_limit": 1000})
print(state["messages"][-1].content)
state = agent.invoke({"messages": state["messages"] + [("user", question)]}, {"recursion_limit": 20})
print(state["messages"][-1].content)
