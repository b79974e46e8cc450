"""The official Anthropic Python SDK against condenser: messages.create, plain and streamed,
with a conversation long enough to be compacted. Usage: anthropic_sdk.py BASE_URL"""

import sys

import anthropic


def filler(seed, words):
    vocabulary = ["river", "engine", "garden", "signal", "copper", "window", "market", "lantern"]
    return " ".join(vocabulary[(seed * 7 + i * 3 + i // 5) % len(vocabulary)] for i in range(words))


def conversation(turns):
    """An agent's rounds: question, tool call, tool result, answer; then a question."""
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"msg-u{t}. {filler(t, 100)}"})
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"msg-c{t}. Let me look."},
            {"type": "tool_use", "id": f"toolu_{t}", "name": "lookup", "input": {"q": f"q{t}"}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": f"msg-r{t}. {filler(t + 500, 100)}"},
        ]})
        messages.append({"role": "assistant", "content": f"msg-a{t}. {filler(t + 1000, 100)}"})
    messages.append({"role": "user", "content": "what next?"})
    return messages


def main():
    client = anthropic.Anthropic(base_url=sys.argv[1], api_key="sk-ant-sdk-test", max_retries=0)
    messages = conversation(30)
    request = dict(model="claude-sonnet-4-5", max_tokens=500, system="You are careful.", messages=messages)

    raw = client.messages.with_raw_response.create(**request)
    message = raw.parse()
    assert message.type == "message", message
    text = message.content[0].text
    assert text.startswith("reply to "), text
    assert int(text.split()[2]) < len(messages), text
    assert message.usage.output_tokens == 4, message.usage
    print(f"plain: {raw.headers['x-condenser-action']}: {text}")

    with client.messages.stream(**request) as stream:
        pieces = [piece for piece in stream.text_stream]
        final = stream.get_final_message()
        action = stream.response.headers["x-condenser-action"]
    streamed = "".join(pieces).strip()
    assert streamed.startswith("reply to "), pieces
    assert final.usage.output_tokens == 4, final.usage
    assert final.stop_reason == "end_turn", final
    print(f"stream: {action}: {streamed}")
    print("ok")


if __name__ == "__main__":
    main()
