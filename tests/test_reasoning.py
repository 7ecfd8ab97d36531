"""Chapter 12b's reasoning parsers: the cases of vLLM's own tests for its qwen3 parser (as data in
tests/data, with the commit they were read at), streamed in every way a tokenizer can cut them,
and a `minillm serve --reasoning-parser qwen3` whose answers, streamed or whole, chat or
Responses, carry the model's thinking apart from its content. The model is not trained to think,
so it never writes `</think>`: with thinking on, its whole answer is reasoning, as vLLM splits an
answer cut before the tag."""

import json
from pathlib import Path

import httpx
import pytest
from helpers import ask, minillm_serve, openai_client

from minillm.server.protocol import ChatMessage
from minillm.server.reasoning_parsers import REASONING_PARSERS, Qwen3ReasoningParser

CASES = json.loads((Path(__file__).parent / "data" / "vllm_qwen3_reasoning_cases.json").read_text())


def streamed(parser, pieces) -> tuple[str | None, str | None]:
    reasoning = content = ""
    for piece in pieces:
        r, c = parser.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    return (reasoning + r) or None, (content + c) or None


@pytest.mark.parametrize("output, reasoning, content", CASES["thinking"])
def test_vllm_cases_whole_and_streamed(output, reasoning, content, tokenizer):
    assert Qwen3ReasoningParser.split(output) == (reasoning, content)
    tokens = [tokenizer.decode([t]) for t in tokenizer.encode(output, add_special_tokens=False)]
    assert "".join(tokens) == output
    assert streamed(Qwen3ReasoningParser(), tokens) == (reasoning, content)  # token by token
    assert streamed(Qwen3ReasoningParser(), list(output)) == (reasoning, content)  # by character


@pytest.mark.parametrize("deltas, reasoning, content", CASES["deltas"])
def test_vllm_cases_in_deltas_of_several_tokens(deltas, reasoning, content):
    assert streamed(Qwen3ReasoningParser(), deltas) == (reasoning, content)


@pytest.mark.parametrize("output, reasoning, content", CASES["thinking_disabled"])
def test_vllm_cases_thinking_disabled(output, reasoning, content):
    assert not Qwen3ReasoningParser.thinks({"enable_thinking": False})
    assert Qwen3ReasoningParser.split(output, thinking=False) == (reasoning, content)
    assert streamed(Qwen3ReasoningParser(thinking=False), list(output)) == (reasoning, content)


def test_a_tag_that_never_completes_is_text():
    assert Qwen3ReasoningParser.split("a < b and </thin") == ("a < b and </thin", None)
    assert streamed(Qwen3ReasoningParser(), ["a <", "/thi", "nk", ">b"]) == ("a ", "b")
    assert REASONING_PARSERS["deepseek_r1"].thinks({"enable_thinking": False})  # always thinks


def test_an_assistant_turns_reasoning_reaches_the_template():
    for key in ("reasoning_content", "reasoning"):
        message = ChatMessage.model_validate({"role": "assistant", "content": "4", key: "2+2"})
        assert message.as_dict()["reasoning_content"] == "2+2"


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--reasoning-parser", "qwen3", "--served-model-name", "m"]
    with minillm_serve(model_dir, log, *flags) as (base, _):
        yield base


def chat(server, **body) -> httpx.Response:
    body = {"model": "m", "messages": ask("What is 2 + 2?"), "max_tokens": 12} | body
    return httpx.post(f"{server}/v1/chat/completions", json=body | {"temperature": 0}, timeout=120)


def stream_chat(server, **body) -> tuple[str, str, list[dict]]:
    "A streamed chat as a client reads it: its reasoning, its content, and every delta."
    deltas = []
    body = {"model": "m", "messages": ask("What is 2 + 2?"), "max_tokens": 12} | body
    body |= {"stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas += [c["delta"] for c in json.loads(line[6:])["choices"]]
    reasoning = "".join(d.get("reasoning") or "" for d in deltas)
    return reasoning, "".join(d.get("content") or "" for d in deltas), deltas


def test_thinking_on_the_answer_is_reasoning_until_the_tag(server):
    off = chat(server, chat_template_kwargs={"enable_thinking": False}).json()
    text = off["choices"][0]["message"]["content"]  # the template ignores the flag: same prompt
    assert text and off["choices"][0]["message"]["reasoning"] is None
    message = chat(server).json()["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == text
    assert message["content"] is None
    reasoning, content, deltas = stream_chat(server)
    assert (reasoning, content) == (text, "")
    assert all(d.get("reasoning_content") == d.get("reasoning") for d in deltas)
    reasoning, content, _ = stream_chat(server, chat_template_kwargs={"enable_thinking": False})
    assert (reasoning, content) == ("", text)
    client = openai_client(server)  # the official client reads the field
    r = client.chat.completions.create(
        model="m", messages=ask("What is 2 + 2?"), max_tokens=12, temperature=0
    )
    assert r.choices[0].message.reasoning == text and r.choices[0].message.content is None


def test_include_reasoning_false_drops_it(server):
    message = chat(server, include_reasoning=False).json()["choices"][0]["message"]
    assert "reasoning" not in message and message["content"] is None
    reasoning, content, _ = stream_chat(server, include_reasoning=False)
    assert (reasoning, content) == ("", "")


def test_a_grammar_while_thinking_is_refused_by_name(server):
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    r = chat(server, **choice)
    assert r.status_code == 400 and "enable_thinking" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "chat_template_kwargs"
    r = chat(server, **choice, chat_template_kwargs={"enable_thinking": False})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    for field, value in (("thinking_token_budget", 8), ("separate_reasoning", False)):
        r = chat(server, **{field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"]


def test_responses_carry_a_reasoning_item(server):
    text = chat(server).json()["choices"][0]["message"]["reasoning"]
    body = {"model": "m", "input": "What is 2 + 2?", "max_output_tokens": 12, "temperature": 0}
    r = httpx.post(f"{server}/v1/responses", json=body, timeout=120).json()
    (item,) = r["output"]  # no message: the answer is all thinking
    assert item["type"] == "reasoning" and item["content"][0]["text"] == text
    events = []
    with httpx.stream("POST", f"{server}/v1/responses", json=body | {"stream": True}) as s:
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    (done,) = [e for e in events if e["type"] == "response.reasoning_text.done"]
    assert "".join(deltas) == done["text"] == text
    assert events[-1]["response"]["output"][0]["type"] == "reasoning"
    # stored, the reasoning item goes back as the assistant turn's reasoning_content
    first = httpx.post(f"{server}/v1/responses", json=body, timeout=120).json()
    follow = body | {"input": "And 3 + 3?", "previous_response_id": first["id"]}
    again = httpx.post(f"{server}/v1/responses", json=follow, timeout=120)
    assert again.status_code == 200, again.text
    turns = ask("What is 2 + 2?") + [{"role": "assistant", "content": None}]
    turns[-1]["reasoning_content"] = text
    same = chat(server, messages=turns + ask("And 3 + 3?")).json()
    assert again.json()["usage"]["input_tokens"] == same["usage"]["prompt_tokens"]


def test_responses_turn_the_thinking_off_with_effort_none(server):
    "reasoning.effort 'none' is Qwen3's enable_thinking false: a structured output is then allowed."
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}
    body = {"model": "m", "input": "2 + 2?", "max_output_tokens": 12, "text": fmt}
    r = httpx.post(f"{server}/v1/responses", json=body, timeout=120)
    assert r.status_code == 400 and "reasoning.effort 'none'" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/responses", json=body | {"reasoning": {"effort": "none"}})
    assert r.status_code == 200 and r.json()["output"][0]["type"] == "message", r.text
