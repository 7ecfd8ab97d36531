"""Chapter 12b's Responses API (`POST /v1/responses`) through the official openai client: each
answer equals the chat completion it amounts to, streamed events add up to the same response, and
what minillm does not implement is refused by name."""

import json

import httpx
import jsonschema
import pytest
from helpers import minillm_serve, openai_client

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
FORCED = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with minillm_serve(model_dir, log, "--served-model-name", "m") as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def chat(client, messages, **kw):
    kw = {"temperature": 0, "max_tokens": 16} | kw
    return client.chat.completions.create(model="m", messages=messages, **kw)


def respond(client, input, **kw):
    kw = {"temperature": 0, "max_output_tokens": 16} | kw
    return client.responses.create(model="m", input=input, **kw)


def test_text_equals_the_chat_completion(client):
    for instructions in (None, "Answer in French."):
        r = respond(client, "What is the capital of France?", instructions=instructions)
        system = [{"role": "system", "content": instructions}] if instructions else []
        c = chat(client, system + [{"role": "user", "content": "What is the capital of France?"}])
        assert r.output_text == c.choices[0].message.content
        assert r.usage.input_tokens == c.usage.prompt_tokens
        assert r.usage.output_tokens == c.usage.completion_tokens
        expected = "completed" if c.choices[0].finish_reason == "stop" else "incomplete"
        assert r.status == expected and r.model == "m" and r.id.startswith("resp_")
    r = respond(client, "Tell me a long story.", max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_add_up_to_the_response(client):
    whole = respond(client, "Tell me a long story.", max_output_tokens=12)
    events = list(respond(client, "Tell me a long story.", max_output_tokens=12, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete" and kinds.count("response.output_item.done") == 1
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 12


def test_function_calls_and_a_round_trip(client):
    r = respond(client, "Weather in Paris?", tools=[TOOL], tool_choice=FORCED, max_output_tokens=40)
    (call,) = r.output
    assert (
        call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    )
    jsonschema.validate(json.loads(call.arguments), TOOL["parameters"])
    events = list(
        respond(
            client,
            "Weather in Paris?",
            tools=[TOOL],
            tool_choice=FORCED,
            max_output_tokens=40,
            stream=True,
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == [call.arguments]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == call.arguments
    # the call and its result come back as input items: the answer is the chat's with the same turns
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and cloudy"},
    ]
    r = respond(client, items, tools=[TOOL], tool_choice="none")
    tool_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    messages = [
        items[0],
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C and cloudy"},
    ]
    c = chat(client, messages, tools=[CHAT_TOOL], tool_choice="none")
    assert r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens


def test_structured_text_formats(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}}}
    schema["required"] = ["answer"]
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": schema}}
    r = respond(client, "The capital of France?", text=fmt, max_output_tokens=40)
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tools": [TOOL]}, "tool_choice"),  # 'auto' without --enable-auto-tool-choice
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_is_not_implemented_is_refused_by_name(server, extra, param):
    body = {"model": "m", "input": "hi", "max_output_tokens": 2} | extra
    r = httpx.post(f"{server}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # what asks for nothing, or cannot change the answer, is accepted
    body = {"model": "m", "input": "hi", "max_output_tokens": 2, "store": False, "user": "u"}
    assert httpx.post(f"{server}/v1/responses", json=body, timeout=60).status_code == 200
