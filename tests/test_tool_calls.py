"""Chapter 12b's tool_choice "auto": a `minillm serve --enable-auto-tool-choice` driven by the
official openai client through a whole tool round trip, the calls it finds in the model's text
(streamed or not), and a `--chat-template` with its own tool format (`--tool-call-parser
llama3_json`). The model is not trained on tools, so where a test needs a call, a regex
(`structured_outputs`) makes the model write one in the format's own text; the parser is what
is tested, on what the model wrote."""

import json
import re

import httpx
import pytest
from helpers import ask, greedy_divergence, minillm_serve, openai_client

from minillm.loader import encode_chat
from minillm.server.tool_parsers import HermesToolParser, tools_in_prompt

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
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def hermes(*payloads: str, before: str = "") -> dict:
    "structured_outputs that make the model write `before`, then each payload as a Hermes call."
    calls = "\n".join(f"<tool_call>\n{p}\n</tool_call>" for p in payloads)
    return {"structured_outputs": {"regex": re.escape(before + calls)}}


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--enable-auto-tool-choice", "--served-model-name", "m"]
    with minillm_serve(model_dir, log, *flags) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def create(client, messages, **kw):
    kw = {"temperature": 0, "max_tokens": 60} | kw
    return client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], **kw)


def streamed(client, messages, **kw) -> tuple[str, list[dict], str, int]:
    """A streamed answer as a client assembles it: content, tool calls (merged by index), the
    finish reason and the number of chunks that carried content."""
    content, calls, finish, pieces = "", {}, None, 0
    for chunk in create(client, messages, stream=True, **kw):
        choice = chunk.choices[0]
        if choice.delta.content:
            content, pieces = content + choice.delta.content, pieces + 1
        for c in choice.delta.tool_calls or []:
            call = calls.setdefault(c.index, {"name": "", "arguments": ""})
            call["name"] += c.function.name or ""
            call["arguments"] += c.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, pieces


def test_a_call_the_model_writes_is_found(client):
    for before in ("", "Let me check. "):
        r = create(
            client, ask("What is the weather in Paris?"), extra_body=hermes(PARIS, before=before)
        )
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert message.content == (before.strip() or None)
        (call,) = message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        content, calls, finish, _ = streamed(
            client, ask("What is the weather in Paris?"), extra_body=hermes(PARIS, before=before)
        )
        assert (content, finish) == (before.strip(), "tool_calls")
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]


def test_parallel_calls_and_parallel_tool_calls_false(client):
    oslo = PARIS.replace("Paris", "Oslo")
    body = hermes(PARIS, oslo)  # two calls: room for both
    r = create(client, ask("Paris and Oslo?"), extra_body=body, max_tokens=150)
    cities = [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls]
    assert cities == ["Paris", "Oslo"]
    _, calls, _, _ = streamed(client, ask("Paris and Oslo?"), extra_body=body, max_tokens=150)
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Oslo"]
    r = create(
        client, ask("Paris and Oslo?"), extra_body=body, max_tokens=150, parallel_tool_calls=False
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    _, calls, _, _ = streamed(
        client, ask("Paris and Oslo?"), extra_body=body, max_tokens=150, parallel_tool_calls=False
    )
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris"]


def test_text_streams_as_it_comes_and_a_cut_call_is_text(client):
    r = create(client, ask("What is 2 + 2?"), max_tokens=30)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    content, calls, finish, pieces = streamed(client, ask("What is 2 + 2?"), max_tokens=30)
    assert (content, calls, finish) == (
        r.choices[0].message.content,
        [],
        r.choices[0].finish_reason,
    )
    assert pieces > 5  # token by token, not held back to the end
    r = create(client, ask("Weather?"), max_tokens=8, extra_body=hermes(PARIS))
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.startswith("<tool_call>")
    content, calls, finish, _ = streamed(
        client, ask("Weather?"), max_tokens=8, extra_body=hermes(PARIS)
    )
    assert (content, calls, finish) == (r.choices[0].message.content, [], "length")


def test_a_tool_round_trip_matches_transformers(client, server, tokenizer, hf_model):
    """Call, the tool's result, the answer: the second turn's prompt shows the earlier call and
    result as the model writes and reads them, and its greedy answer is transformers'."""
    messages = ask("What is the weather in Paris?")
    first = create(client, messages, extra_body=hermes(PARIS)).choices[0].message
    (call,) = first.tool_calls
    messages.append(first.model_dump())  # what agent loops send back: every field, None included
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and cloudy"})
    r = create(client, messages, max_tokens=24, extra_body={"return_token_ids": True})
    answer = r.model_dump()
    expected = tools_in_prompt(
        [
            messages[0],
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
                ],
            },
            {"role": "tool", "content": "18 C and cloudy"},
        ],
        [WEATHER],
        HermesToolParser(),
    )
    prompt = encode_chat(tokenizer, expected)
    assert answer["prompt_token_ids"] == prompt
    text = tokenizer.decode(prompt)
    assert "<tool_response>\n18 C and cloudy\n</tool_response>" in text
    assert f"<tool_call>\n{PARIS}\n</tool_call>" in text
    tokens = answer["choices"][0]["token_ids"]
    greedy_divergence(hf_model, prompt, tokens)  # equal, or parted only at a near-tie
    tokenized = httpx.post(f"{server}/tokenize", json={"messages": messages, "tools": [WEATHER]})
    assert tokenized.json()["tokens"] == prompt


def test_malformed_earlier_calls_are_refused_by_name(server):
    messages = ask("hi") + [{"role": "assistant", "tool_calls": [{"type": "function"}]}]
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "messages[1].tool_calls[0]" in r.json()["error"]["message"]


LLAMA_STYLE = """{%- if tools %}<|im_start|>system
Answer with a JSON function call {"name": ..., "parameters": {...}} when a function helps.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}{%- for m in messages %}<|im_start|>{{ m['role'] }}
{% if m.tool_calls %}{% for c in m.tool_calls -%}
{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments }}}
{%- endfor %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_chat_template_of_ones_own_and_the_llama3_json_parser(model_dir, tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(LLAMA_STYLE)
    flags = ["--served-model-name", "m", "--enable-auto-tool-choice", "--chat-template", str(path)]
    flags += ["--tool-call-parser", "llama3_json"]
    with minillm_serve(model_dir, tmp_path / "server.log", *flags) as (base, _):
        client = openai_client(base)
        payload = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
        body = {"structured_outputs": {"regex": re.escape(payload)}}
        r = create(client, ask("Weather in Oslo?"), extra_body=body)
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        assert json.loads(call.function.arguments) == {"city": "Oslo"}
        _, calls, finish, _ = streamed(client, ask("Weather in Oslo?"), extra_body=body)
        assert finish == "tool_calls" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
        r = create(client, ask("What is 2 + 2?"), max_tokens=12)  # text is text
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
        shown = httpx.post(f"{base}/tokenize", json={"messages": ask("hi"), "tools": [WEATHER]})
        prompt = httpx.post(f"{base}/detokenize", json={"tokens": shown.json()["tokens"]}).json()[
            "prompt"
        ]
        assert prompt.startswith("<|im_start|>system\nAnswer with a JSON function call")
        assert "<tools>" not in prompt  # the template shows the tools: no fallback on top
