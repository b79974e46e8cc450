"""The official Google Gen AI Python SDK (google-genai) against condenser: generate_content,
plain and streamed, with a conversation long enough to be compacted, its function calls signed.
Usage: genai_sdk.py BASE_URL"""

import base64
import sys

from google import genai
from google.genai import types


def filler(seed, words):
    vocabulary = ["river", "engine", "garden", "signal", "copper", "window", "market", "lantern"]
    return " ".join(vocabulary[(seed * 7 + i * 3 + i // 5) % len(vocabulary)] for i in range(words))


def signature(t):
    """As tests/it/common/gemini.rs writes it: the bytes of this base64 text."""
    return base64.b64decode(f"CiQB{t:04}" + "Vr0k" * 40)


def conversation(turns):
    """An agent's rounds: prompt, signed function call, its response, answer; then a question."""
    contents = []
    for t in range(turns):
        contents.append(types.Content(role="user", parts=[types.Part(text=f"msg-u{t}. {filler(t, 100)}")]))
        contents.append(types.Content(role="model", parts=[
            types.Part(text=f"msg-c{t}. Let me look."),
            types.Part(function_call=types.FunctionCall(id=f"call-{t}", name="lookup", args={"q": f"q{t}"}),
                       thought_signature=signature(t)),
        ]))
        contents.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id=f"call-{t}", name="lookup", response={"output": f"msg-r{t}. {filler(t + 500, 100)}"}))]))
        contents.append(types.Content(role="model", parts=[types.Part(text=f"msg-a{t}. {filler(t + 1000, 100)}")]))
    contents.append(types.Content(role="user", parts=[types.Part(text="what next?")]))
    return contents


def main():
    client = genai.Client(api_key="AIza-sdk-test-key", http_options={"base_url": sys.argv[1]})
    contents = conversation(30)
    config = types.GenerateContentConfig(
        system_instruction="You are careful.",
        max_output_tokens=500,
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name="lookup", description="Looks up a query.",
            parameters={"type": "OBJECT", "properties": {"q": {"type": "STRING"}}})])],
    )

    response = client.models.generate_content(model="gemini-2.5-pro", contents=contents, config=config)
    text = response.text
    assert text.startswith("reply to "), text
    assert int(text.split()[2]) < len(contents), text
    assert response.usage_metadata.candidates_token_count == 4, response.usage_metadata
    assert response.usage_metadata.cached_content_token_count == 6, response.usage_metadata
    action = response.sdk_http_response.headers["x-condenser-action"]
    print(f"plain: {action}: {text}")

    pieces, last = [], None
    for chunk in client.models.generate_content_stream(model="gemini-2.5-pro", contents=contents, config=config):
        pieces.append(chunk.text or "")
        last = chunk
    streamed = "".join(pieces).strip()
    assert streamed.startswith("reply to "), pieces
    assert last.usage_metadata.thoughts_token_count == 3, last.usage_metadata
    action = last.sdk_http_response.headers["x-condenser-action"]
    print(f"stream: {action}: {streamed}")
    print("ok")


if __name__ == "__main__":
    main()
