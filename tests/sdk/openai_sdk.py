"""The official OpenAI Python SDK, pointed at condenser, completes a plain and a streamed chat."""
import sys

from openai import OpenAI

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0, timeout=30)

plain = client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "say hello"}],
)
assert plain.choices[0].message.content, plain
assert plain.usage.completion_tokens == 4, plain.usage
print("plain:", plain.choices[0].message.content)

raw = client.chat.completions.with_raw_response.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "say hello"}],
)
assert raw.headers["x-condenser-action"] == "forwarded", dict(raw.headers)

pieces = []
chunks = 0
for chunk in client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "count to three"}],
    stream=True,
):
    chunks += 1
    assert chunk.choices, "condenser must not leak the usage chunk the client did not ask for"
    pieces.append(chunk.choices[0].delta.content or "")
text = "".join(pieces)
assert text.strip(), pieces
print("streamed:", chunks, "chunks:", text.strip())

usage_seen = False
for chunk in client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "count to three"}],
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage_seen = True
assert usage_seen, "asked for usage, so it is kept"
print("ok")
