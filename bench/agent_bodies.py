"""Agent sessions at their real sizes, for bench/agent_replay.sh: a Claude Code-like Messages
session (a system prompt in cache_control blocks, 18 tools with JSON schemas, tool_use /
tool_result rounds with thinking blocks) and a Codex-like Responses session (developer head,
reasoning, function_call / function_call_output). Writes one body per round count.

Usage: agent_bodies.py OUT_DIR API(messages|responses) MODEL FIRST_ROUNDS LAST_ROUNDS
"""

import json
import os
import random
import sys

out, api, model, first, last = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(7)
WORDS = ("build step compile link test deploy cache layer image digest region zone pod node "
         "error warning retry timeout socket handshake token parser module crate feature").split()


def text(words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def output(r):
    # About 3,000 bytes of log a round: line-numbered, as Claude Code's Read returns it.
    return "".join(f"{i:6}\u2192{r:03}.{i:02} {text(10)}\n" for i in range(40))


tools = [{"name": f"Tool{t}", "description": text(120),
          "input_schema": {"type": "object", "properties": {f"p{k}": {"type": "string", "description": text(25)} for k in range(8)}}}
         for t in range(18)]
os.makedirs(out, exist_ok=True)
task = "Ticket KX-7731-QZ: the nightly build fails. Find out why."
for rounds in range(first, last + 1):
    rng.seed(7)
    # Drawn first, so that it is the same in every body of a session, as a real agent's
    # system prompt is (drawn after the rounds, it differed from one body to the next until
    # round twenty-six, and each request counted it afresh).
    system = text(2500)
    if api == "messages":
        messages = [{"role": "user", "content": [{"type": "text", "text": task}]},
                    {"role": "system", "content": [{"type": "text", "text": "# Environment\n" + text(300)}]}]
        for r in range(rounds):
            messages.append({"role": "assistant", "content": [
                {"type": "thinking", "thinking": text(40), "signature": "sig" + "A" * 300},
                {"type": "tool_use", "id": f"toolu_{r}", "name": "Tool1", "input": {"p0": f"log-{r:03}.txt"}}]})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{r}", "content": output(r)}]})
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        body = {"model": model, "messages": messages,
                "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                "tools": tools, "max_tokens": 32000, "stream": False}
    else:
        items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": system}]},
                 {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}]
        for r in range(rounds):
            items.append({"type": "reasoning", "id": f"rs_{r}", "summary": [], "encrypted_content": "gAAAA" + "x" * 400})
            items.append({"type": "function_call", "id": f"fc_{r}", "call_id": f"call_{r}", "name": "exec_command",
                          "arguments": json.dumps({"cmd": f"cat log-{r:03}.txt"})})
            items.append({"type": "function_call_output", "call_id": f"call_{r}", "output": output(r)})
        body = {"model": model, "input": items, "stream": False, "store": False,
                "tools": [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]} for t in tools]}
    with open(os.path.join(out, f"{api}-{rounds:04}.json"), "w") as f:
        json.dump(body, f)
