"""The client libraries people put in front of vLLM's server, against a real `minillm serve` on
the default model: langchain-openai, litellm and openai-agents. Each library's answer at
temperature 0 must equal what the official openai client gets for the same request (the server is
deterministic at greedy); where the model decides (calling a tool or not), the test asserts what
the server guarantees: a forced call's arguments match the tool's schema, a structured output
validates, a tool loop ends. The libraries are dev dependencies (pyproject.toml), pinned."""

import asyncio
import importlib
import json
import os

import httpx
import jsonschema
import openai
import pytest
from helpers import ask, minillm_serve, openai_client
from pydantic import BaseModel, Field

KEY = "clients-key"
PARIS = "What is the weather in Paris?"
FRANCE = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--api-key", KEY]
    with minillm_serve(model_dir, log, *flags) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, KEY)


@pytest.fixture(scope="module")
def model_id(client):
    "The served id (the model directory's name): what a user copies from /v1/models."
    (model,) = client.models.list().data
    return model.id


def chat(client, model_id, messages, **kw):
    "The reference: the official client, greedy."
    kw = {"temperature": 0, "max_tokens": 20} | kw
    return client.chat.completions.create(model=model_id, messages=messages, **kw)


def streamed(client, model_id, messages, **kw) -> tuple[str, str]:
    "The reference streamed: content and finish reason."
    content, finish = "", None
    for chunk in chat(client, model_id, messages, stream=True, **kw):
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return content, finish


def call_of(message) -> tuple[str, dict]:
    "The one tool call of an openai message: name and parsed arguments."
    (call,) = message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


class Recorder:
    "httpx event hooks that keep each request's path and JSON body (the report names them)."

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []

    def keep(self, request: httpx.Request):
        body = json.loads(request.content) if request.content else {}
        self.requests.append((request.url.path, body))

    async def keep_async(self, request: httpx.Request):
        self.keep(request)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self.keep]}, timeout=300)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self.keep_async]}, timeout=300)

    @property
    def last(self) -> dict:
        return self.requests[-1][1]


# ---------------------------------------------------------------------------------------------
# langchain-openai


class Weather(BaseModel):
    """The current weather in a city"""

    city: str = Field(description="the city")


class Address(BaseModel):
    street: str
    city: str


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int
    address: Address  # a nested model: the schema has $defs and a $ref


@pytest.fixture(scope="module")
def lc(request):
    "ChatOpenAI on the server, greedy, and the recorder of what it sent."
    langchain_openai = importlib.import_module("langchain_openai")  # before the server starts
    server, model_id = request.getfixturevalue("server"), request.getfixturevalue("model_id")
    rec = Recorder()

    def make(**kw):
        kw = {"temperature": 0, "max_tokens": 20} | kw
        return langchain_openai.ChatOpenAI(
            base_url=f"{server}/v1",
            api_key=KEY,
            model=model_id,
            max_retries=0,
            http_client=rec.client(),
            **kw,
        )

    return make, rec


def test_langchain_invoke_stream_batch(lc, client, model_id):
    make, rec = lc
    llm = make()
    ref = chat(client, model_id, ask(FRANCE))
    r = llm.invoke(FRANCE)
    assert rec.last["max_completion_tokens"] == 20  # langchain's name for max_tokens
    assert r.content == ref.choices[0].message.content
    assert r.response_metadata["finish_reason"] == ref.choices[0].finish_reason
    assert r.usage_metadata["input_tokens"] == ref.usage.prompt_tokens
    assert r.usage_metadata["output_tokens"] == ref.usage.completion_tokens

    chunks = list(make(stream_usage=True).stream(FRANCE))
    assert rec.last["stream"] is True and rec.last["stream_options"] == {"include_usage": True}
    assert len([c for c in chunks if c.content]) > 1  # token by token
    total = chunks[0]
    for c in chunks[1:]:
        total += c
    assert total.content == ref.choices[0].message.content
    assert total.response_metadata["finish_reason"] == ref.choices[0].finish_reason
    assert total.usage_metadata["output_tokens"] == ref.usage.completion_tokens

    questions = [FRANCE, "What is 2 + 2?", "Name a colour."]
    answers = llm.batch(questions)  # concurrent requests, batched by the engine
    assert [a.content for a in answers] == [
        chat(client, model_id, ask(q)).choices[0].message.content for q in questions
    ]


@pytest.mark.quick
def test_langchain_bind_tools(lc, client, model_id):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    make, rec = lc
    llm = make(max_tokens=60)

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"18 C and cloudy in {city}"

    tools = [convert_to_openai_tool(t) for t in (Weather, get_weather)]

    # auto (no tool_choice): the model decides; the answer is the official client's
    r = llm.bind_tools([Weather, get_weather]).invoke(PARIS)
    assert "tool_choice" not in rec.last and len(rec.last["tools"]) == 2
    ref = chat(client, model_id, ask(PARIS), tools=tools, max_tokens=60).choices[0].message
    assert r.content == (ref.content or "")
    assert [(c["name"], c["args"]) for c in r.tool_calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in ref.tool_calls or []
    ]

    # a forced tool, by name: one call whose arguments match the schema
    forced = {"type": "function", "function": {"name": "Weather"}}
    bound = llm.bind_tools([Weather], tool_choice="Weather")
    r = bound.invoke(PARIS)
    assert rec.last["tool_choice"] == forced
    (c,) = r.tool_calls
    assert c["name"] == "Weather"
    jsonschema.validate(c["args"], tools[0]["function"]["parameters"])
    Weather.model_validate(c["args"])
    ref = chat(client, model_id, ask(PARIS), tools=tools[:1], tool_choice=forced, max_tokens=60)
    assert (c["name"], c["args"]) == call_of(ref.choices[0].message)
    chunks = list(bound.stream(PARIS))  # the call's arguments stream in pieces
    total = chunks[0]
    for piece in chunks[1:]:
        total += piece
    assert [(t["name"], t["args"]) for t in total.tool_calls] == [(c["name"], c["args"])]

    # "any" is OpenAI's "required": at least one call, each valid
    r = llm.bind_tools([get_weather], tool_choice="any").invoke(PARIS)
    assert rec.last["tool_choice"] == "required"
    assert r.tool_calls and r.response_metadata["finish_reason"] == "tool_calls"
    for c in r.tool_calls:
        assert c["name"] == "get_weather"
        jsonschema.validate(c["args"], tools[1]["function"]["parameters"])

    # the round trip: the call and its result go back, the answer is the official client's
    messages = [HumanMessage(PARIS), r]
    messages += [get_weather.invoke(c) for c in r.tool_calls]
    final = llm.bind_tools([get_weather]).invoke(messages)
    sent = rec.last["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant"] + ["tool"] * len(r.tool_calls)
    ref = chat(client, model_id, sent, tools=tools[1:], max_tokens=60).choices[0].message
    assert final.content == (ref.content or "")


def test_langchain_structured_output(lc, client, model_id):
    make, rec = lc
    llm = make(max_tokens=80)
    ref_body = None
    for method in (None, "json_schema", "function_calling"):
        kw = {} if method is None else {"method": method}
        out = llm.with_structured_output(Weather, include_raw=True, **kw).invoke(PARIS)
        assert out["parsing_error"] is None and isinstance(out["parsed"], Weather)
        body = rec.last
        if method == "function_calling":
            assert body["tool_choice"]["function"]["name"] == "Weather"
            (c,) = out["raw"].tool_calls
            jsonschema.validate(c["args"], body["tools"][0]["function"]["parameters"])
            continue
        fmt = body["response_format"]  # langchain-openai's default method is json_schema
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        jsonschema.validate(json.loads(out["raw"].content), fmt["json_schema"]["schema"])
        ref = chat(client, model_id, ask(PARIS), max_tokens=80, response_format=fmt)
        assert out["raw"].content == ref.choices[0].message.content
        ref_body = ref_body or body
        assert body == ref_body  # the default is json_schema, the same request

    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(Person, method=method, include_raw=True).invoke(
            "Describe a person."
        )
        assert out["parsing_error"] is None and isinstance(out["parsed"], Person)
        body = rec.last
        if method == "json_schema":
            schema = body["response_format"]["json_schema"]["schema"]
            assert "$defs" in schema and schema["properties"]["address"] == {
                "$ref": "#/$defs/Address"
            }
            jsonschema.validate(json.loads(out["raw"].content), schema)
        else:  # langchain inlines the $ref in a tool's parameters
            (c,) = out["raw"].tool_calls
            jsonschema.validate(c["args"], body["tools"][0]["function"]["parameters"])


def test_langchain_vllm_extra_body(lc, client, model_id):
    "vLLM's own fields through extra_body, as vLLM's docs show them for ChatOpenAI."
    make, rec = lc
    body = {"structured_outputs": {"choice": ["yes", "no"]}, "top_k": 1, "repetition_penalty": 1.1}
    r = make(extra_body=body).invoke("Is Paris in France?")
    assert {k: rec.last[k] for k in body} == body
    ref = chat(client, model_id, ask("Is Paris in France?"), extra_body=body)
    assert r.content == ref.choices[0].message.content and r.content in ("yes", "no")


def test_langchain_responses_api(lc, client, model_id):
    "use_responses_api=True: the same answers through POST /v1/responses."
    make, rec = lc
    llm = make(use_responses_api=True)
    r = llm.invoke(FRANCE)
    assert rec.requests[-1][0] == "/v1/responses"
    assert r.text == chat(client, model_id, ask(FRANCE)).choices[0].message.content
    r = llm.bind_tools([Weather], tool_choice="Weather").invoke(PARIS)
    (c,) = r.tool_calls
    assert c["name"] == "Weather"
    Weather.model_validate(c["args"])
    parsed = llm.with_structured_output(Weather).invoke(PARIS)
    assert rec.last["text"]["format"]["type"] == "json_schema"
    assert isinstance(parsed, Weather)


# ---------------------------------------------------------------------------------------------
# litellm


@pytest.fixture(scope="module")
def ll():
    "litellm, offline (its bundled model cost map), with a callback that keeps each request body."
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = importlib.import_module("litellm")
    from litellm.integrations.custom_logger import CustomLogger

    litellm.suppress_debug_info = True
    sent = []

    class Keep(CustomLogger):
        def log_pre_api_call(self, model, messages, kwargs):
            sent.append(kwargs.get("additional_args", {}).get("complete_input_dict"))

    keep = Keep()
    litellm.callbacks.append(keep)
    yield litellm, sent
    litellm.callbacks.remove(keep)


PROVIDERS = ["hosted_vllm", "openai"]  # litellm's vLLM provider, and any OpenAI-compatible server


def completion(ll, server, model_id, provider, messages, **kw):
    litellm, _ = ll
    kw = {"temperature": 0, "max_tokens": 20, "num_retries": 0} | kw
    return litellm.completion(
        model=f"{provider}/{model_id}",
        api_base=f"{server}/v1",
        api_key=KEY,
        messages=messages,
        **kw,
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_litellm_completion_and_stream(ll, server, client, model_id, provider):
    litellm, _ = ll
    ref = chat(client, model_id, ask(FRANCE))
    r = completion(ll, server, model_id, provider, ask(FRANCE))
    assert r.choices[0].message.content == ref.choices[0].message.content
    assert r.choices[0].finish_reason == ref.choices[0].finish_reason
    assert r.usage.prompt_tokens == ref.usage.prompt_tokens
    assert r.usage.completion_tokens == ref.usage.completion_tokens

    long_ref = streamed(client, model_id, ask(PARIS))  # cut by max_tokens: "length"
    for options in (None, {"include_usage": True}):
        chunks = list(
            completion(
                ll, server, model_id, provider, ask(PARIS), stream=True, stream_options=options
            )
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert content == long_ref[0]
        assert [f for f in finishes if f] == [long_ref[1]]
        if options:
            assert chunks[-1].usage.completion_tokens == 20

    r = asyncio.run(
        litellm.acompletion(
            model=f"{provider}/{model_id}",
            api_base=f"{server}/v1",
            api_key=KEY,
            messages=ask(FRANCE),
            temperature=0,
            max_tokens=20,
            num_retries=0,
        )
    )
    assert r.choices[0].message.content == ref.choices[0].message.content


@pytest.mark.parametrize("provider", PROVIDERS)
def test_litellm_tools(ll, server, client, model_id, provider):
    litellm, sent = ll
    kw = {"tools": [WEATHER], "max_tokens": 40}  # room for a forced call
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        r = completion(ll, server, model_id, provider, ask(PARIS), tool_choice=choice, **kw)
        assert sent[-1]["tool_choice"] == choice
        message = r.choices[0].message
        name, args = call_of(message)
        assert name == "get_weather"
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        ref = chat(client, model_id, ask(PARIS), tool_choice=choice, **kw).choices[0].message
        assert (name, args) == call_of(ref)
        chunks = list(
            completion(
                ll, server, model_id, provider, ask(PARIS), tool_choice=choice, stream=True, **kw
            )
        )
        built = litellm.stream_chunk_builder(chunks).choices[0].message
        assert call_of(built) == (name, args)

    # the round trip: the call and its result go back; the answer is the official client's
    messages = ask(PARIS) + [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C and cloudy"},
    ]
    kw["max_tokens"] = 24
    r = completion(ll, server, model_id, provider, messages, **kw)
    ref = chat(client, model_id, sent[-1]["messages"], **kw).choices[0].message
    assert r.choices[0].message.content == ref.content

    # auto: the model decides; whatever it does is the official client's answer
    r = completion(ll, server, model_id, provider, ask(PARIS), **kw).choices[0].message
    ref = chat(client, model_id, ask(PARIS), **kw).choices[0].message
    assert r.content == ref.content
    assert [(c.function.name, c.function.arguments) for c in r.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in ref.tool_calls or []
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_litellm_response_format(ll, server, client, model_id, provider):
    _, sent = ll
    r = completion(ll, server, model_id, provider, ask(PARIS), response_format=Weather)
    fmt = sent[-1]["response_format"]
    assert fmt["type"] == "json_schema"
    Weather.model_validate_json(r.choices[0].message.content)
    ref = chat(client, model_id, ask(PARIS), response_format=fmt)
    assert r.choices[0].message.content == ref.choices[0].message.content


@pytest.mark.parametrize("provider", PROVIDERS + ["text-completion-openai"])
def test_litellm_text_completion(ll, server, client, model_id, provider):
    litellm, _ = ll
    prompt = "The capital of France is"
    ref = client.completions.create(model=model_id, prompt=prompt, temperature=0, max_tokens=12)
    kw = {"api_base": f"{server}/v1", "api_key": KEY, "temperature": 0, "max_tokens": 12}
    r = litellm.text_completion(model=f"{provider}/{model_id}", prompt=prompt, **kw)
    assert r.choices[0].text == ref.choices[0].text
    assert r.choices[0].finish_reason == ref.choices[0].finish_reason
    assert r.usage.completion_tokens == ref.usage.completion_tokens
    chunks = list(
        litellm.text_completion(model=f"{provider}/{model_id}", prompt=prompt, stream=True, **kw)
    )
    assert "".join(c.choices[0].text or "" for c in chunks if c.choices) == ref.choices[0].text


@pytest.mark.quick
@pytest.mark.parametrize("provider", PROVIDERS)
def test_litellm_context_window_exceeded(ll, server, model_id, provider):
    """A prompt longer than the context is litellm's ContextWindowExceededError, the error its
    Router's context_window_fallbacks act on. litellm recognises it by vLLM's (and OpenAI's)
    message, "This model's maximum context length is N tokens. However, ..."."""
    litellm, _ = ll
    with pytest.raises(litellm.BadRequestError) as e:
        completion(ll, server, model_id, provider, ask("hi " * 9000), max_tokens=2)
    assert e.value.status_code == 400
    assert isinstance(e.value, litellm.ContextWindowExceededError), str(e.value)


# ---------------------------------------------------------------------------------------------
# openai-agents


@pytest.fixture(scope="module")
def agents():
    agents = importlib.import_module("agents")
    agents.set_tracing_disabled(True)
    return agents


CITY_SCHEMA = {"properties": {"city": {"title": "City", "type": "string"}}, "required": ["city"]}


def weather_agent(agents, model, calls: list, **settings):
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"18 C and cloudy in {city}"

    settings = {"temperature": 0, "max_tokens": 40} | settings
    return agents.Agent(
        name="weather",
        instructions="Answer briefly.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(**settings),
    )


def agent_model(agents, server, model_id, api: str, rec: Recorder):
    if api == "litellm":
        from agents.extensions.models.litellm_model import LitellmModel

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        return LitellmModel(model=f"hosted_vllm/{model_id}", base_url=f"{server}/v1", api_key=KEY)
    # a fresh client per run: an httpx.AsyncClient belongs to the event loop that used it
    client = openai.AsyncOpenAI(
        base_url=f"{server}/v1", api_key=KEY, max_retries=0, http_client=rec.async_client()
    )
    cls = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
    return cls(model=model_id, openai_client=client)


def transcript_reference(client, model_id, call) -> str:
    "The official client's greedy answer once the tool's result is in: the loop's final text."
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": PARIS},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C and cloudy in Paris"},
    ]
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                **CITY_SCHEMA,
                "title": "get_weather_args",
                "type": "object",
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
    r = chat(client, model_id, messages, tools=[tool], max_tokens=40)
    return r.choices[0].message.content


@pytest.mark.quick
@pytest.mark.parametrize("api", ["chat", "responses", "litellm"])
def test_agents_tool_loop(agents, server, client, model_id, api):
    """The first turn is forced to call the tool (a 135M model rarely does on its own), the
    result goes back (tool_choice reset to auto), the loop ends with the model's text: the
    official client's answer to the same transcript."""
    rec, calls = Recorder(), []
    model = agent_model(agents, server, model_id, api, rec)
    agent = weather_agent(agents, model, calls, tool_choice="required")
    result = agents.Runner.run_sync(agent, PARIS, max_turns=4)
    (call, *_) = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), {"type": "object", **CITY_SCHEMA})
    assert calls and calls[0] == json.loads(call.arguments)["city"]
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert outputs and outputs[0].raw_item["call_id"] == call.call_id
    assert isinstance(result.final_output, str) and result.final_output
    if api != "litellm":
        first, second = rec.requests[0][1], rec.requests[1][1]
        assert first["tool_choice"] == "required" and "tool_choice" not in second
        path = "/v1/chat/completions" if api == "chat" else "/v1/responses"
        assert {p for p, _ in rec.requests} == {path}
    if len(calls) == 1:
        assert result.final_output == transcript_reference(client, model_id, call)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_streamed_run(agents, server, client, model_id, api):
    "Runner.run_streamed: the same loop, streamed; the same final text as run_sync."
    rec, calls = Recorder(), []

    async def run():
        model = agent_model(agents, server, model_id, api, rec)
        agent = weather_agent(agents, model, calls, tool_choice="required")
        result = agents.Runner.run_streamed(agent, PARIS, max_turns=4)
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds

    result, kinds = asyncio.run(run())
    assert all(body.get("stream") is True for _, body in rec.requests)
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    (call, *_) = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    assert calls and json.loads(call.arguments)["city"] == calls[0]
    if len(calls) == 1:
        assert result.final_output == transcript_reference(client, model_id, call)


class City(BaseModel):
    name: str
    country: str


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_output_type(agents, server, client, model_id, api):
    "output_type: a JSON schema the server enforces (response_format or text.format)."
    rec = Recorder()
    agent = agents.Agent(
        name="cities",
        instructions="Answer briefly.",
        model=agent_model(agents, server, model_id, api, rec),
        output_type=City,
        model_settings=agents.ModelSettings(temperature=0, max_tokens=40),
    )
    result = agents.Runner.run_sync(agent, FRANCE)
    assert isinstance(result.final_output, City)
    body = rec.last
    if api == "chat":
        fmt = body["response_format"]
    else:
        f = body["text"]["format"]
        fmt = {"type": "json_schema", "json_schema": {k: v for k, v in f.items() if k != "type"}}
    system = [{"role": "system", "content": "Answer briefly."}]
    ref = chat(client, model_id, system + ask(FRANCE), max_tokens=40, response_format=fmt)
    assert result.final_output == City.model_validate_json(ref.choices[0].message.content)
