"A real `minillm serve` process on a free localhost port, driven by the official openai client."

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import minillm_serve

from minillm import LLM, SamplingParams

KEY, NAME = "test-key", "smollm2"


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--api-key", KEY, "--served-model-name", NAME, "--num-kv-blocks", "400"]
    with minillm_serve(model_dir, log, *flags) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(str(model_dir))


def metrics(server) -> dict:
    text = httpx.get(f"{server}/metrics").text
    return {
        l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("minillm_")
    }


def wait_pool_free(server, timeout=20):
    for _ in range(int(timeout / 0.2)):
        m = metrics(server)
        if (
            m["minillm_kv_cache_free_blocks"] == m["minillm_kv_cache_total_blocks"]
            and m["minillm_requests_running"] == 0
        ):
            return m
        time.sleep(0.2)
    raise AssertionError(f"KV pool not free: {m}")


def test_models(client):
    assert [m.id for m in client.models.list()] == [NAME]


def test_chat_answers_paris(client):
    r = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=32,
    )
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    assert (
        r.usage.completion_tokens > 0
        and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    )


def test_completion_equals_offline(client, offline):
    prompt = "The history of the printing press"
    r = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24)
    ref = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids)


def test_streams_equal_non_streamed(client):
    kw = dict(model=NAME, temperature=0, max_tokens=30)
    full = client.completions.create(prompt="Once upon a time", **kw).choices[0].text
    chunks = list(
        client.completions.create(
            prompt="Once upon a time", stream=True, stream_options={"include_usage": True}, **kw
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert (
        chunks[-1].usage.completion_tokens > 0
        and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    )
    msgs = [{"role": "user", "content": "Name three colors."}]
    full = client.chat.completions.create(messages=msgs, **kw).choices[0].message.content
    streamed = client.chat.completions.create(messages=msgs, stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == full


def test_special_tokens_stream_a_chunk_each(server, client, offline):
    """A token whose text is empty (a special one, skipped) still gets its chunk, as vLLM streams
    it; the load generator counts such a stream's tokens, as vLLM's `bench serve` does."""
    import asyncio

    from minillm.bench.online import ServingRequest, send_request

    eos = min(offline.engine.eos_token_ids)
    body = dict(ignore_eos=True, logit_bias={str(eos): 100.0})
    kw = dict(model=NAME, prompt="Once upon a time", max_tokens=5, temperature=0, stream=True)
    kw |= dict(stream_options={"include_usage": True}, extra_body=body)
    chunks = list(client.completions.create(**kw))
    tokens = [c.choices[0] for c in chunks if c.choices]
    assert len(tokens) == 5 and all(c.text == "" for c in tokens)
    assert tokens[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 5

    async def one():
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(timeout=60, headers=headers) as http:
            req = ServingRequest("Once upon a time", 4, 5)
            return await send_request(http, f"{server}/v1/completions", NAME, req, body)

    r = asyncio.run(one())
    assert r.success and r.output_tokens == 5 and len(r.itl) == 3, r  # the 5th: the finish chunk


def test_stop_seed_and_n(client):
    r = client.completions.create(
        model=NAME, prompt="1, 2, 3, 4,", temperature=0, max_tokens=30, stop=["7"]
    )
    assert r.choices[0].finish_reason == "stop" and "7" not in r.choices[0].text
    kw = dict(model=NAME, prompt="My favourite animal is", temperature=1.0, max_tokens=12, seed=42)
    assert (
        client.completions.create(**kw).choices[0].text
        == client.completions.create(**kw).choices[0].text
    )
    r = client.completions.create(n=3, **kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2] and len({c.text for c in r.choices}) > 1
    streamed = list(client.completions.create(n=2, stream=True, **kw))
    assert {c.choices[0].index for c in streamed if c.choices} == {0, 1}


def test_32_concurrent_streams(server, client, offline):
    prompts = [f"Write a sentence about the number {i}." for i in range(32)]

    def one(p):
        chunks = client.completions.create(
            model=NAME, prompt=p, temperature=0, max_tokens=16, stream=True
        )
        return "".join(c.choices[0].text for c in chunks if c.choices)

    before = metrics(server)
    t = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(one, prompts))
    wall = time.perf_counter() - t
    refs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert texts == [r.text for r in refs]
    after = metrics(server)
    steps = after["minillm_batch_size_count"] - before["minillm_batch_size_count"]
    tokens = after["minillm_batch_size_sum"] - before["minillm_batch_size_sum"]
    print(
        f"32 concurrent streams in {wall:.1f} s, {steps:.0f} engine steps, "
        f"{tokens / steps:.1f} sequences per step"
    )
    assert steps < tokens / 4  # they were batched together, not served one by one
    wait_pool_free(server)


def test_disconnect_frees_the_pool(server):
    body = {
        "model": NAME,
        "prompt": "Tell me a very long story.",
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        f"{server}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(l.startswith("data: ") for l in got)
        assert (
            metrics(server)["minillm_kv_cache_free_blocks"]
            < metrics(server)["minillm_kv_cache_total_blocks"]
        )
    wait_pool_free(server)  # the server noticed, aborted the request and freed its blocks


def post_json(url: str, body: dict) -> httpx.Response:
    """POST `body` as ASCII JSON, so that lone surrogates travel as \\ud800 escapes, as a hostile
    client would send them."""
    return httpx.post(
        url,
        content=json.dumps(body).encode(),
        timeout=60,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )


BAD = [
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "logprobs": 30}, "logprobs"),
    ({"prompt": ""}, "empty"),
    ({"prompt": "hello " * 9000}, "context"),
    ({"temperature": 0.5}, "prompt"),
    ({"prompt": "\ud800 lone surrogate"}, "Unicode"),
    ({"prompt": "hi", "temperature": 1e300}, "temperature"),
    ({"prompt": "hi", "top_p": 1e-46}, "top_p"),
    ({"prompt": "hi", "seed": 2**64}, "seed"),
    ({"prompt": "hi", "n": 10**9}, "n"),
    ({"prompt": ["hi"] * 1000}, "prompts"),
    ({"prompt": "hi", "stop": ["x"] * 1000}, "stop"),
    ({"prompt": "hi", "stop": "x" * 200_000}, "stop"),
    ({"prompt": "hi", "echo": "yes"}, "echo"),
    ({"prompt": "hi", "suffix": "!"}, "suffix"),
    ({"prompt": "hi", "logit_bias": {"cat": 10}}, "logit_bias"),
    ({"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"prompt": [10**6]}, "token ids"),
    ({"prompt": "hi", "kv_transfer_params": {"transfer_id": "a"}}, "kv_role"),  # chapter 14
]


@pytest.mark.parametrize("body, word", BAD)
def test_bad_completion_requests(server, body, word):
    r = post_json(f"{server}/v1/completions", {"model": NAME, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert word in err["message"] and err["type"] == "invalid_request_error"


CHAT_BAD = [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "text"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "image_url",
    ),
    ({"messages": [{"role": "user", "content": "\udfff"}]}, "Unicode"),
    (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "tools",
    ),
    (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "xml"},
        },
        "response_format",
    ),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "logprobs"),
]


@pytest.mark.parametrize("body, word", CHAT_BAD)
def test_bad_chat_bodies(server, body, word):
    r = post_json(f"{server}/v1/chat/completions", {"model": NAME, **body})
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"]


def test_fields_that_change_nothing_are_accepted_and_unknown_ones_refused(client):
    r = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        user="u-1",
        metadata={"k": "v"},
        logit_bias={},
        extra_body={"session_id": "s-1", "use_beam_search": False},
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="some_vendor_field"):
        client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            extra_body={"some_vendor_field": 1},
        )


def test_bad_chat_requests_and_auth(server, client):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(
        f"{server}/v1/chat/completions", json={"model": NAME, "messages": []}, headers=auth
    )
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": NAME, "messages": [{"role": 7, "content": "x"}]},
        headers=auth,
    )
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
        headers=auth,
    )
    assert r.status_code == 404 and "gpt-4" in r.json()["error"]["message"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(
            f"{server}/v1/completions", json={"model": NAME, "prompt": "hi"}, headers=headers
        )
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="nope", max_retries=0).models.list()
    # after all of that the server still serves, and nothing leaked
    assert (
        client.completions.create(model=NAME, prompt="Hello", max_tokens=4).choices[0].text
        is not None
    )
    wait_pool_free(server)


def test_tool_choice_auto_needs_the_flag_as_in_vllm(client):
    "Tools without tool_choice mean 'auto'; without --enable-auto-tool-choice, the 400 says so."
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    assert e.value.body["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in e.value.body["message"]


def test_include_reasoning_false_needs_a_reasoning_parser(client):
    "Without --reasoning-parser nothing tells the thinking apart: dropping it is refused by name."
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=2, extra_body={"include_reasoning": False}
        )
    assert e.value.body["param"] == "include_reasoning"
    assert "--reasoning-parser" in e.value.body["message"]
    r = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=2, extra_body={"include_reasoning": True}
    )
    assert r.choices[0].message.content is not None


def test_long_message_content_is_accepted_and_parts_are_bounded():
    # a message's string may be long (a system prompt of a few KB); only lists of parts are bounded
    from pydantic import ValidationError

    from minillm.server.protocol import MAX_PARTS, ChatMessage

    assert ChatMessage(role="system", content="x" * 5000).as_dict()["content"] == "x" * 5000
    parts = [{"type": "text", "text": "a"}] * (MAX_PARTS + 1)
    with pytest.raises(ValidationError):
        ChatMessage(role="user", content=parts)
