"""Chapter 12b's Responses API (`POST /v1/responses`) through the official openai client: each
answer equals the chat completion it amounts to, streamed events add up to the same response, and
stored responses continue as the whole conversation would, and what minillm does not implement is
refused by name."""

import json
import time

import httpx
import jsonschema
import openai
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
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"reasoning": {"summary": "auto"}}, "reasoning"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"background": True, "store": False}, "background"),
        ({"background": True, "stream": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tools": [TOOL]}, "tool_choice"),  # 'auto' without --enable-auto-tool-choice
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "input",
        ),
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


def test_a_stored_response_continues_as_the_whole_conversation(client):
    "previous_response_id replays the stored turn: the answer equals the chat of all of it."
    first = respond(client, "My name is Ada. Say hello.", instructions="Be brief.")
    second = respond(client, "What is my name?", previous_response_id=first.id)
    history = [
        {"role": "user", "content": "My name is Ada. Say hello."},  # the instructions do not carry
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    c = chat(client, history)
    assert second.output_text == c.choices[0].message.content
    assert second.usage.input_tokens == c.usage.prompt_tokens
    assert client.responses.retrieve(second.id).output_text == second.output_text
    unstored = respond(client, "Hello", store=False)
    for missing in (unstored.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(missing)
    with pytest.raises(openai.NotFoundError):
        respond(client, "Hi", previous_response_id="resp_nothing")


def test_logprobs_equal_the_chat_completions(client):
    include = ["message.output_text.logprobs"]
    r = respond(client, "Count to five.", include=include, top_logprobs=3)
    c = chat(client, [{"role": "user", "content": "Count to five."}], logprobs=True, top_logprobs=3)
    ours, theirs = r.output[0].content[0].logprobs, c.choices[0].logprobs.content
    assert [e.token for e in ours] == [e.token for e in theirs]
    assert [e.logprob for e in ours] == pytest.approx([e.logprob for e in theirs], abs=1e-4)
    assert all(len(e.top_logprobs) == 3 for e in ours)
    events = list(respond(client, "Count to five.", include=include, top_logprobs=3, stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [e.token for e in streamed] == [e.token for e in ours]


def test_background_runs_to_the_same_answer_and_cancels(server, client):
    sync = respond(client, "Name a color.")
    queued = respond(client, "Name a color.", background=True)
    assert queued.status == "queued" and queued.output == []
    for _ in range(300):
        done = client.responses.retrieve(queued.id)
        if done.status not in ("queued", "in_progress"):
            break
        time.sleep(0.1)
    assert done.output_text == sync.output_text and done.status == sync.status
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(sync.id)
    long = respond(client, "Write a long story.", background=True, max_output_tokens=2000)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    metrics = lambda: httpx.get(f"{server}/metrics", timeout=30).text  # noqa: E731
    for _ in range(100):  # its engine request was aborted: nothing runs, no block is held
        if "\nminillm_requests_running 0.0" in metrics():
            break
        time.sleep(0.1)
    text = metrics()
    assert "\nminillm_requests_running 0.0" in text and "\nminillm_kv_cache_usage_ratio 0.0" in text


def test_input_tokens_count_what_the_response_reads(server, client):
    r = respond(client, "How many tokens is this?", instructions="Answer briefly.")
    body = {"model": "m", "input": "How many tokens is this?", "instructions": "Answer briefly."}
    counted = httpx.post(f"{server}/v1/responses/input_tokens", json=body, timeout=60).json()
    assert counted == {"object": "response.input_tokens", "input_tokens": r.usage.input_tokens}
