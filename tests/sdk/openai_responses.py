"""The official OpenAI Python SDK's `responses.create`, pointed at condenser, plain and
streamed, with a conversation long enough to be compacted."""
import sys

from openai import OpenAI

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0, timeout=30)

WORDS = ["river", "engine", "garden", "signal", "copper", "window", "market", "lantern"]


def prose(seed, words):
    return " ".join(WORDS[(seed * 7 + i * 3 + i // 5) % len(WORDS)] for i in range(words))


# A developer head, then 30 rounds of user message, function call, its output and answer:
# about 10,000 tokens, over the trigger of the 8,000-token window the test configures.
conversation = [{"role": "developer", "content": "Always answer in English."}]
for t in range(30):
    conversation += [
        {"role": "user", "content": f"msg-u{t}. {prose(t, 100)}"},
        {"type": "function_call", "call_id": f"call_{t}", "name": "search", "arguments": f'{{"q":"{t}"}}'},
        {"type": "function_call_output", "call_id": f"call_{t}", "output": f"result-{t}. {prose(t + 500, 90)}"},
        {"role": "assistant", "content": f"msg-a{t}. {prose(t + 1000, 90)}"},
    ]

raw = client.responses.with_raw_response.create(
    model="gpt-4o", instructions="Be brief.", input=conversation, max_output_tokens=500
)
assert raw.headers["x-condenser-action"] == "summarized", dict(raw.headers)
plain = raw.parse()
assert plain.output_text.startswith("reply to "), plain
assert int(plain.output_text.split()[2]) < len(conversation), plain.output_text
assert plain.usage.output_tokens == 5, plain.usage
print("plain:", plain.output_text)

kinds = []
text = ""
completed = None
for event in client.responses.create(
    model="gpt-4o", instructions="Be brief.", input=conversation, max_output_tokens=500, stream=True
):
    kinds.append(event.type)
    if event.type == "response.output_text.delta":
        text += event.delta
    elif event.type == "response.completed":
        completed = event.response
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert completed is not None and completed.usage.output_tokens == 7, completed
assert text.startswith("reply to "), text
print("streamed:", len(kinds), "events:", text)
print("ok")
