"""The official OpenAI, Anthropic and Google Python SDKs through a recall round that condenser serves:
a compacted conversation whose decision the summary lost, a scripted model that recalls it,
and the SDK's own parsing and stream accumulators reading the one reply the client gets
(stitched across rounds when streamed). Usage: recall_sdk.py BASE_URL API DECISION
(API: chat, responses, messages, gemini, or messages-thinking: extended thinking on, the model's
signed thinking in every round). Gemini's through the official `google-genai` SDK."""

import sys

WORDS = ["river", "engine", "garden", "signal", "copper", "window", "market", "lantern"]
TOOL = "condenser_recall"
FORCE = {"x-condenser-mode": "force"}


def prose(seed, words):
    return " ".join(WORDS[(seed * 7 + i * 3 + i // 5) % len(WORDS)] for i in range(words))


def turns(decision):
    """14 exchanges, the decision stated by the assistant in the second; then the question."""
    items = []
    for t in range(14):
        items.append({"role": "user", "content": f"msg-u{t}. {prose(t, 100)}"})
        said = f"{decision} {prose(t + 1000, 90)}" if t == 1 else f"msg-a{t}. {prose(t + 1000, 100)}"
        items.append({"role": "assistant", "content": said})
    items.append({"role": "user", "content": "Which port do we bind the service to?"})
    return items


def check(label, text, dump, decision):
    assert decision in text, f"{label}: {text!r}"
    assert TOOL not in dump, f"{label}: the tool leaked: {dump}"
    print(f"{label}: recalled")


def chat(base_url, decision):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0, timeout=30)
    request = dict(model="gpt-4o", messages=[{"role": "system", "content": "Be brief."}] + turns(decision),
                   extra_headers=FORCE)
    raw = client.chat.completions.with_raw_response.create(**request)
    assert raw.headers["x-condenser-recalls"] == "1", dict(raw.headers)
    reply = raw.parse()
    assert reply.choices[0].finish_reason == "stop", reply
    assert not reply.choices[0].message.tool_calls, reply
    assert reply.usage.completion_tokens == 20, reply.usage
    check("chat plain", reply.choices[0].message.content, reply.model_dump_json(), decision)

    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"], finish
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens == 20, usage
    check("chat stream", text, "".join(c.model_dump_json() for c in chunks), decision)


def responses(base_url, decision):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0, timeout=30)
    request = dict(model="gpt-4o", instructions="Be brief.", input=turns(decision), extra_headers=FORCE)
    raw = client.responses.with_raw_response.create(**request)
    assert raw.headers["x-condenser-recalls"] == "1", dict(raw.headers)
    reply = raw.parse()
    assert [item.type for item in reply.output] == ["message"], reply.output
    assert reply.usage.output_tokens == 20, reply.usage
    check("responses plain", reply.output_text, reply.model_dump_json(), decision)

    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    assert [item.type for item in final.output] == ["message"], final.output
    assert final.usage.output_tokens == 20, final.usage
    check("responses stream", final.output_text, final.model_dump_json(), decision)


def messages(base_url, decision):
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-sdk-test", max_retries=0)
    request = dict(model="claude-sonnet-4-5", max_tokens=500, system="Be brief.", messages=turns(decision),
                   extra_headers=FORCE)
    raw = client.messages.with_raw_response.create(**request)
    assert raw.headers["x-condenser-recalls"] == "1", dict(raw.headers)
    reply = raw.parse()
    assert [block.type for block in reply.content] == ["text"], reply.content
    assert reply.stop_reason == "end_turn", reply
    assert reply.usage.output_tokens == 20, reply.usage
    check("messages plain", reply.content[0].text, reply.model_dump_json(), decision)

    with client.messages.stream(**request) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text"], final.content
    assert final.stop_reason == "end_turn", final
    assert final.usage.output_tokens == 20, final.usage
    check("messages stream", streamed, final.model_dump_json(), decision)


def messages_thinking(base_url, decision):
    """With thinking on, the reply holds both rounds' signed thinking, then the answer."""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-sdk-test", max_retries=0)
    request = dict(model="claude-sonnet-4-5", max_tokens=2000, system="Be brief.", messages=turns(decision),
                   thinking={"type": "enabled", "budget_tokens": 1024}, extra_headers=FORCE)
    raw = client.messages.with_raw_response.create(**request)
    assert raw.headers["x-condenser-recalls"] == "1", dict(raw.headers)
    reply = raw.parse()
    assert [block.type for block in reply.content] == ["thinking", "thinking", "text"], reply.content
    assert all(block.signature for block in reply.content[:2]), reply.content
    assert reply.stop_reason == "end_turn", reply
    assert reply.usage.output_tokens == 20, reply.usage
    check("messages-thinking plain", reply.content[2].text, reply.model_dump_json(), decision)

    with client.messages.stream(**request) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "thinking", "text"], final.content
    assert [block.signature for block in final.content[:2]] == [
        block.signature for block in reply.content[:2]], final.content
    assert final.stop_reason == "end_turn", final
    assert final.usage.output_tokens == 20, final.usage
    check("messages-thinking stream", streamed, final.model_dump_json(), decision)


def gemini(base_url, decision):
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="AIza-sdk-test-key", http_options={"base_url": base_url, "headers": FORCE})
    contents = [{"role": "model" if item["role"] == "assistant" else "user", "parts": [{"text": item["content"]}]}
                for item in turns(decision)]
    request = dict(model="gemini-2.5-pro", contents=contents,
                   config=types.GenerateContentConfig(system_instruction="Be brief."))
    reply = client.models.generate_content(**request)
    assert reply.candidates[0].finish_reason == "STOP", reply
    assert not reply.function_calls, reply
    check("gemini plain", reply.text, reply.model_dump_json(), decision)

    chunks = list(client.models.generate_content_stream(**request))
    text = "".join(chunk.text or "" for chunk in chunks)
    assert not any(chunk.function_calls for chunk in chunks), chunks
    finish = [c.candidates[0].finish_reason for c in chunks if c.candidates and c.candidates[0].finish_reason]
    assert finish == ["STOP"], finish
    check("gemini stream", text, "".join(chunk.model_dump_json() for chunk in chunks), decision)


if __name__ == "__main__":
    base_url, api, decision = sys.argv[1:4]
    {"chat": chat, "responses": responses, "messages": messages, "gemini": gemini,
     "messages-thinking": messages_thinking}[api](base_url, decision)
    print("ok")
