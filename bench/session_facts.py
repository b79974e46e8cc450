"""The recorded agent sessions (tests/fixtures/sessions/), and the facts a probe asks of them:
shared by bench/real_model.py and bench/probe.py.

A session is one request body a line, as the client sent it (Messages or Gemini). Its facts are
found (the task's id, the release build the first file read shows) and planted: a checksum line
added to the tool output of some batches, in every body that carries it, so that each has one
exact answer and no judge is needed.
"""

import hashlib
import json
import subprocess

SESSIONS = {
    "claude-code-2.0.77": {"path": "/v1/messages", "key": ("x-api-key", "sk-bench")},
    "claude-code-2.1.332": {"path": "/v1/messages", "key": ("x-api-key", "sk-bench")},
    "gemini-cli-0.61": {
        "path": "/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse",
        "key": ("x-goog-api-key", "sk-bench"),
    },
}
# The windows the sessions were recorded in (their README).
WINDOWS = {
    "claude-code-2.0.77": ("claude-sonnet-4-5-20250929", 80000),
    "claude-code-2.1.332": ("claude-opus-5-5", 168000),
    "gemini-cli-0.61": ("gemini-3.1-pro-preview", 60000),
}

FOUND = [
    ("What is the deploy key id that the task asked to remember?", "KX-7731-QZ"),
    ("Which build do the project notes name as the release candidate?", "4f9c2ab1"),
]


def checksum(batch):
    return hashlib.sha256(f"batch {batch}".encode()).hexdigest()[:8]


def planted(batches):
    return [(f"What checksum did batch {b} report?", checksum(b)) for b in batches]


def facts(batches):
    """Every fact a probe asks: (question, exact answer)."""
    return FOUND + planted(batches)


def load(path):
    """The session's bodies, from its .jsonl.zst file."""
    text = subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout.decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _plant_text(text, batches):
    for batch in batches:
        for head in (f"turn-{batch} row 1:", f"Output: turn-{batch} row 1:"):
            if text.startswith(head) or text.startswith("<untrusted_context>\n" + head):
                marker = f"batch {batch} checksum: {checksum(batch)}"
                if marker not in text:
                    return text.rstrip("\n") + "\n" + marker + "\n"
    return text


def plant(value, batches):
    """`value` (a body, or any part of one) with each batch's tool output given its checksum."""
    if isinstance(value, dict):
        return {k: (_plant_text(v, batches) if k in ("content", "output") and isinstance(v, str)
                    else plant(v, batches)) for k, v in value.items()}
    if isinstance(value, list):
        return [plant(v, batches) for v in value]
    return value


def _text_of(content):
    if isinstance(content, str):
        return content
    out = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            out.append(block.get("text", ""))
        elif kind == "tool_result":
            out.append(_text_of(block.get("content")))
    return "\n".join(out)


def to_chat(body):
    """A Messages or Gemini body as chat completions messages (text, tool calls and their
    results; thinking left out), for a model that speaks chat."""
    messages = []
    if "contents" in body:
        system = " ".join(p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", []))
        if system:
            messages.append({"role": "system", "content": system})
        for item in body["contents"]:
            texts = [p["text"] for p in item.get("parts", []) if "text" in p and not p.get("thought")]
            calls = [p["functionCall"] for p in item.get("parts", []) if "functionCall" in p]
            results = [p["functionResponse"] for p in item.get("parts", []) if "functionResponse" in p]
            if item.get("role") == "model":
                message = {"role": "assistant", "content": "\n".join(texts)}
                if calls:
                    message["tool_calls"] = [{"id": c.get("id") or f"call_{len(messages)}_{i}", "type": "function",
                                              "function": {"name": c["name"], "arguments": json.dumps(c.get("args", {}))}}
                                             for i, c in enumerate(calls)]
                messages.append(message)
            elif results:
                for i, r in enumerate(results):
                    output = r.get("response", {}).get("output", json.dumps(r.get("response")))
                    messages.append({"role": "tool", "tool_call_id": r.get("id") or f"call_{len(messages) - 1}_{i}",
                                     "content": output})
            else:
                messages.append({"role": "user", "content": "\n".join(texts)})
        return messages
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str) else _text_of(system)})
    for item in body["messages"]:
        content = item.get("content")
        if item["role"] == "system":
            messages.append({"role": "system", "content": _text_of(content)})
        elif item["role"] == "assistant":
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            message = {"role": "assistant", "content": "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")}
            calls = [b for b in blocks if b.get("type") == "tool_use"]
            if calls:
                message["tool_calls"] = [{"id": b["id"], "type": "function",
                                          "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}}
                                         for b in calls]
            messages.append(message)
        else:
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            for b in blocks:
                if b.get("type") == "tool_result":
                    messages.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": _text_of(b.get("content"))})
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            if texts:
                messages.append({"role": "user", "content": "\n".join(texts)})
    return messages


def flatten(messages):
    """Chat messages with tool calls and their results written as plain turns, alternating, for
    a model whose chat template takes neither: what it is shown, not what it may call."""
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            role, content = "user", f"[tool output]\n{content}"
        elif role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(f"[calls {c['function']['name']}({c['function']['arguments']})]" for c in m["tool_calls"])
            content = f"{content}\n{calls}".strip()
        if out and out[-1]["role"] == role and role != "system":
            out[-1]["content"] += "\n\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


def texts(value):
    """Every string in a body, joined: what a model is shown, to look an answer up in."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(texts(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(texts(v) for v in value)
    return ""
