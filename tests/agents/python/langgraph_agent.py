"""LangGraph's prebuilt ReAct agent (langgraph and langchain-openai from PyPI) as an agent
condenser's tests run: one task, then a tool loop the scripted upstream drives, on Chat
Completions.

Usage: langgraph_agent.py BASE_URL MODEL LOG_DIR TASK
"""

import os
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

base_url, model, log_dir, task = sys.argv[1:5]


@tool
def read_log(round: int) -> str:
    """Reads the build log of one round."""
    with open(os.path.join(log_dir, f"log-{round:03}.txt")) as log:
        return log.read()


llm = ChatOpenAI(model=model, base_url=base_url, api_key="sk-agent-test", max_retries=0)
agent = create_react_agent(llm, [read_log])
state = agent.invoke({"messages": [("user", task)]}, {"recursion_limit": 1000})
print(state["messages"][-1].content)
