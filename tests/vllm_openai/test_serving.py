"""vLLM's server-level tests, rewritten against `minillm serve` on the default model: models,
tokenization, metrics, prompt and size validation, truncation, structured outputs' validation, tool
use (the hermes parser) and the optional middleware (API key, headers).

Sources (vllm-project/vllm): tests/entrypoints/openai/{models/test_models.py,
test_prompt_validation.py, test_truncation.py, test_async_tokenization.py, test_chunked_prompt.py,
test_optional_middleware.py},
tests/entrypoints/serve/{tokenize/test_tokenization.py, instrumentator/test_metrics.py,
instrumentator/test_orca_metrics.py}, tests/v1/entrypoints/openai/test_chat_completion.py and
tests/tool_use/. Each test names the one it follows; what was left out, and why, is in the report
that came with this file."""

import asyncio
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import minillm_serve
from prometheus_client.parser import text_string_to_metric_families

# vLLM's tokenization and metrics servers: --max-model-len 8192 --max-num-seqs 128 (--dtype bfloat16
# and --enforce-eager dropped: float32 is minillm's anchor, and there are no CUDA graphs on a CPU)
# vLLM's tokenization tests add --enable-tokenizer-info-endpoint
SERVER_ARGS = [
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "128",
    "--enable-tokenizer-info-endpoint",
]
# tests/tool_use/utils.py: ARGS + the hermes config. Its --chat-template
# (examples/tool_chat_template_hermes.jinja) has no counterpart to pass: minillm writes the tools
# into the prompt itself when the model's template does not render them (SmolLM2's does not).
TOOL_ARGS = [
    "--enable-auto-tool-choice",
    "--max-model-len",
    "1024",
    "--max-num-seqs",
    "256",
    "--no-prefix-caching",
    "--tool-call-parser",
    "hermes",
]
# tests/entrypoints/openai/test_chunked_prompt.py (chunked prefill is minillm's default)
CHUNKED_ARGS = ["--max-num-batched-tokens", "1000"]
tool_server = pytest.mark.parametrize("server_args", [TOOL_ARGS], indirect=True, ids=["hermes"])
chunked_server = pytest.mark.parametrize(
    "server_args", [CHUNKED_ARGS], indirect=True, ids=["chunked"]
)


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, timeout=300, **kw)


def chat_body(model_name, **kw) -> dict:
    return {"model": model_name, "messages": [{"role": "user", "content": "Hello"}], **kw}


# ---------------------------------------------------------------- models


def test_check_models(client, model_name, model_dir):
    "vLLM: entrypoints/openai/models/test_models.py::test_check_models"
    served = client.models.list().data[0]  # vLLM's LoRA adapters after it: none here
    assert served.id == model_name
    assert getattr(served, "root", None) in (model_name, str(model_dir))


def test_retrieve_base_model(client, model_name, model_dir):
    "vLLM: entrypoints/openai/models/test_models.py::test_retrieve_base_model"
    model = client.models.retrieve(model_name)
    assert model.id == model_name
    assert getattr(model, "root", None) in (model_name, str(model_dir))


@pytest.mark.quick
def test_retrieve_unknown_model(client):
    "vLLM: entrypoints/openai/models/test_models.py::test_retrieve_unknown_model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("this-model-does-not-exist")
    assert "does not exist" in str(e.value)


# ---------------------------------------------------------------- tokenization

CONVERSATION = [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Nice to meet you!"},
    {"role": "user", "content": "Can I ask a question? vllm1"},
]
TOKENIZE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]


def chat_variants(conversation):
    "(add_generation_prompt, continue_final_message, add_special_tokens, messages), as vLLM"
    for gen, special, cont in itertools.product([False, True], repeat=3):
        if gen and cont:
            continue
        extra = [{"role": "assistant", "content": "Sure,"}] if cont else []
        yield gen, cont, special, conversation + extra


def check_tokenized(result: dict, tokens: list[int], strs=None):
    assert result["tokens"] == tokens
    assert result["count"] == len(tokens)
    assert result["max_model_len"] == 8192
    assert result["token_strs"] == strs


@pytest.mark.quick
def test_tokenize_completions(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenize_completions"
    prompt = "vllm1 This is a test prompt."
    for add_special in [False, True]:
        tokens = tokenizer.encode(prompt, add_special_tokens=add_special)
        body = {"add_special_tokens": add_special, "model": model_name, "prompt": prompt}
        r = post(server, "tokenize", body)
        r.raise_for_status()
        check_tokenized(r.json(), tokens)


@pytest.mark.quick
def test_tokenize_chat(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenize_chat"
    for gen, cont, special, messages in chat_variants(CONVERSATION):
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=gen, continue_final_message=cont, tokenize=False
        )
        tokens = tokenizer.encode(text, add_special_tokens=special)
        body = {
            "add_generation_prompt": gen,
            "continue_final_message": cont,
            "add_special_tokens": special,
            "messages": messages,
            "model": model_name,
        }
        r = post(server, "tokenize", body)
        r.raise_for_status()
        check_tokenized(r.json(), tokens)


@pytest.mark.xfail(
    reason="minillm's /tokenize shows the prompt its chat sees, tools written in by the fallback"
)
def test_tokenize_chat_with_tools(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenize_chat_with_tools"
    conversation = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    for gen, cont, special, messages in chat_variants(conversation):
        text = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=gen,
            continue_final_message=cont,
            tools=TOKENIZE_TOOLS,
            tokenize=False,
        )
        tokens = tokenizer.encode(text, add_special_tokens=special)
        body = {
            "add_generation_prompt": gen,
            "continue_final_message": cont,
            "add_special_tokens": special,
            "messages": messages,
            "model": model_name,
            "tools": TOKENIZE_TOOLS,
        }
        r = post(server, "tokenize", body)
        r.raise_for_status()
        check_tokenized(r.json(), tokens)


@pytest.mark.quick
def test_tokenize_with_return_token_strs(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenize_with_return_token_strs"
    prompt = "This is a token_strs test prompt! vllm1"
    r = post(server, "tokenize", {"prompt": prompt, "model": model_name, "return_token_strs": True})
    r.raise_for_status()
    tokens = tokenizer.encode(prompt, add_special_tokens=True)
    check_tokenized(r.json(), tokens, tokenizer.convert_ids_to_tokens(tokens))


@pytest.mark.quick
def test_detokenize(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_detokenize"
    prompt = "This is a test prompt. vllm1"
    tokens = tokenizer.encode(prompt, add_special_tokens=False)
    r = post(server, "detokenize", {"model": model_name, "tokens": tokens})
    r.raise_for_status()
    assert r.json() == {"prompt": prompt}


def test_tokenizer_info_basic(server):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenizer_info_basic"
    r = httpx.get(server.url_for("tokenizer_info"), timeout=30)
    r.raise_for_status()
    assert isinstance(r.json().get("tokenizer_class"), str) and r.json()["tokenizer_class"]


def test_tokenizer_info_consistency_with_tokenize(server, model_name):
    "vLLM: entrypoints/serve/tokenize/test_tokenization.py::test_tokenizer_info_consistency_with_tokenize"  # noqa: E501
    info = httpx.get(server.url_for("tokenizer_info"), timeout=30)
    info.raise_for_status()
    r = post(server, "tokenize", {"model": model_name, "prompt": "Hello world!"})
    r.raise_for_status()
    info_len, tokenize_len = info.json().get("model_max_length"), r.json().get("max_model_len")
    if info_len and tokenize_len:
        assert info_len >= tokenize_len


# ---------------------------------------------------------------- metrics

METRICS_PROMPT = "Hello my name is Robert and I love magic"
EXPECTED_METRICS_V1 = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total",
    "vllm:cache_config_info",
    "vllm:request_success_total",
] + [
    f"vllm:{family}_{suffix}"
    for family in [
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_params_n",
        "request_params_max_tokens",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_inference_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_num_preemptions",
    ]
    for suffix in ["sum", "bucket", "count"]
]


def scrape(server) -> str:
    r = httpx.get(server.url_for("metrics"), timeout=30)
    assert r.status_code == 200
    return r.text


def samples(text: str) -> dict[str, float]:
    "Each vllm: sample's value by name, summed over labels (finished_reason...)."
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def running_metrics(server) -> tuple[float, float, float]:
    "(running, waiting, KV cache usage), as vLLM's _get_running_metrics_from_api reads them."
    got = samples(scrape(server))
    keys = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
    assert all(k in got for k in keys), [k for k in keys if k not in got]
    return tuple(got[k] for k in keys)


def wait_until(predicate, timeout: float = 120, interval: float = 0.2):
    "Poll until predicate() holds (a generous bound for a loaded 2-core machine); False if never."
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


def test_metrics_counts(server, client, model_name, tokenizer):
    "vLLM: entrypoints/serve/instrumentator/test_metrics.py::test_metrics_counts"
    # the server is shared with the other tests of this module: counts are compared as increments
    wait_until(lambda: running_metrics(server)[:2] == (0, 0))
    prompt_ids = tokenizer.encode(METRICS_PROMPT)
    num_requests, max_tokens = 10, 10
    before = samples(scrape(server))
    generated = []
    for _ in range(num_requests):
        r = client.completions.create(model=model_name, prompt=prompt_ids, max_tokens=max_tokens)
        generated.append(r.usage.completion_tokens)
    after = samples(scrape(server))
    n, p, g = num_requests, len(prompt_ids), sum(generated)  # vLLM: g = n * max_tokens
    expected = {
        "vllm:time_to_first_token_seconds_count": n,
        "vllm:inter_token_latency_seconds_count": g - n,
        "vllm:e2e_request_latency_seconds_count": n,
        "vllm:request_queue_time_seconds_count": n,
        "vllm:request_inference_time_seconds_count": n,
        "vllm:request_prefill_time_seconds_count": n,
        "vllm:request_decode_time_seconds_count": n,
        "vllm:request_num_preemptions_count": n,
        "vllm:request_prompt_tokens_sum": n * p,
        "vllm:request_prompt_tokens_count": n,
        "vllm:request_generation_tokens_sum": g,
        "vllm:request_generation_tokens_count": n,
        "vllm:request_params_n_count": n,
        "vllm:request_params_max_tokens_sum": n * max_tokens,
        "vllm:request_params_max_tokens_count": n,
        "vllm:iteration_tokens_total_sum": n * p + g,
        "vllm:iteration_tokens_total_count": g,
        "vllm:prompt_tokens_total": n * p,
        "vllm:generation_tokens_total": g,
        "vllm:request_success_total": n,
    }
    missing = [k for k in expected if k not in after]
    wrong = {
        k: (after[k] - before.get(k, 0), v)
        for k, v in expected.items()
        if k in after and after[k] - before.get(k, 0) != v
    }
    assert not missing and not wrong, f"missing: {missing}; (got, expected): {wrong}"


def test_metrics_exist(server, client, model_name):
    "vLLM: entrypoints/serve/instrumentator/test_metrics.py::test_metrics_exist"
    client.completions.create(
        model=model_name, prompt="Hello, my name is", max_tokens=5, temperature=0.0
    )
    text = scrape(server)
    missing = [m for m in EXPECTED_METRICS_V1 if m not in text]
    cache_config = [
        s
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:cache_config_info"
        for s in family.samples
    ]
    assert not missing, f"missing: {missing}"
    assert cache_config
    for s in cache_config:
        assert s.labels.get("kv_cache_size_tokens") not in (None, "None", "")
        assert s.labels.get("kv_cache_max_concurrency") not in (None, "None", "")


def test_abort_metrics_reset(server, model_name, tokenizer):
    "vLLM: entrypoints/serve/instrumentator/test_metrics.py::test_abort_metrics_reset"
    prompt_ids = tokenizer.encode(METRICS_PROMPT)
    wait_until(lambda: running_metrics(server) == (0, 0, 0))
    assert running_metrics(server) == (0, 0, 0)

    async def scenario():
        client = server.get_async_client()
        kw = dict(model=model_name, prompt=prompt_ids, max_tokens=500, temperature=0.0)
        tasks = [asyncio.create_task(client.completions.create(**kw)) for _ in range(3)]
        seen = await asyncio.to_thread(wait_until, lambda: running_metrics(server)[0] > 0)
        during = await asyncio.to_thread(running_metrics, server)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen, during

    seen, (running, _, usage) = asyncio.run(scenario())
    assert seen, "requests never appeared as running in the metrics"
    assert running > 0 and usage > 0
    wait_until(lambda: running_metrics(server) == (0, 0, 0))
    assert running_metrics(server) == (0, 0, 0)


# ---------------------------------------------------------------- prompt validation


@pytest.mark.quick
def test_empty_prompt(client, model_name):
    "vLLM: entrypoints/openai/test_prompt_validation.py::test_empty_prompt"
    # vLLM's current version sends prompt=None with empty prompt_embeds (not implemented here);
    # this is its earlier form, prompt="" ("decoder prompt cannot be empty")
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.completions.create(model=model_name, prompt="", max_tokens=5, temperature=0.0)


@pytest.mark.quick
def test_out_of_vocab_token_ids(client, model_name):
    "vLLM: entrypoints/openai/test_prompt_validation.py::test_out_of_vocab_token_ids"
    # vLLM's message says "out of vocabulary"; minillm's gives the vocabulary's range
    with pytest.raises(openai.BadRequestError, match=r"(?i)vocab|\[0, \d+\)"):
        client.completions.create(model=model_name, prompt=[999999], max_tokens=5, temperature=0.0)


# ---------------------------------------------------------------- truncation

TRUNCATION_INPUT = """Immerse yourself in the enchanting chronicle of calculus, a mathematical
    domain that has radically transformed our comprehension of change and motion. Despite its
    roots in ancient civilizations, the formal birth of calculus predominantly occurred in the
    17th century, primarily under the influential guidance of Sir Isaac Newton and Gottfried
    Wilhelm Leibniz. The earliest traces of calculus concepts are found in ancient Greek
    mathematics, most notably in the works of Eudoxus and Archimedes, around 300 BCE."""


@pytest.mark.quick
def test_smaller_truncation_size(client, model_name):
    "vLLM: entrypoints/openai/test_truncation.py::test_smaller_truncation_size"
    # vLLM sends these to /v1/embeddings (an embedding model); here the same field on completions
    r = client.completions.create(
        model=model_name,
        prompt=TRUNCATION_INPUT,
        max_tokens=1,
        extra_body={"truncate_prompt_tokens": 10},
    )
    assert r.usage.prompt_tokens == 10


@pytest.mark.quick
def test_bigger_truncation_size(client, model_name):
    "vLLM: entrypoints/openai/test_truncation.py::test_bigger_truncation_size"
    max_model_len = client.models.retrieve(model_name).model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=model_name,
            prompt=TRUNCATION_INPUT,
            max_tokens=1,
            extra_body={"truncate_prompt_tokens": max_model_len + 1},
        )
    assert e.value.status_code == 400
    assert "truncate_prompt_tokens" in e.value.response.json()["error"]["message"]


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_with_and_without_truncate(client, model_name, chat):
    "vLLM: entrypoints/openai/test_async_tokenization.py::test_with_and_without_truncate"
    words = " ".join(["A"] * 10_000)
    if chat:
        create, body = (
            client.chat.completions.create,
            {"messages": [{"role": "user", "content": words}]},
        )
    else:
        create, body = client.completions.create, {"prompt": words}
    truncations = [1000, None] * 5  # vLLM shuffles five of each

    def status(t):
        try:
            create(
                model=model_name, max_tokens=10, extra_body={"truncate_prompt_tokens": t}, **body
            )
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    with ThreadPoolExecutor(len(truncations)) as pool:
        statuses = list(pool.map(status, truncations))
    assert 500 not in statuses


# ---------------------------------------------------------------- long prompts, chunked prefill

LONG_QUESTION = "What is the capital of France?" * 400


@chunked_server
def test_completion_stream_options_and_logprobs_with_long_prompts(client, model_name):
    "vLLM: entrypoints/openai/test_chunked_prompt.py::test_completion_stream_options_and_logprobs_with_long_prompts"  # noqa: E501
    stream = client.completions.create(
        model=model_name,
        prompt=LONG_QUESTION,
        max_tokens=5,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        logprobs=5,
    )
    received, finished = 0, False
    for chunk in stream:
        assert chunk.usage.prompt_tokens >= 0 and chunk.usage.completion_tokens >= 0
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        if not finished:
            received += 1
            assert chunk.choices[0].text
            finished = chunk.choices[0].finish_reason is not None
        if finished:
            assert chunk.usage.completion_tokens == received


@chunked_server
def test_chat_completion_stream_options_and_logprobs_with_long_prompts(client, model_name):
    "vLLM: entrypoints/openai/test_chunked_prompt.py::test_chat_completion_stream_options_and_logprobs_with_long_prompts"  # noqa: E501
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": LONG_QUESTION},
    ]
    stream = client.chat.completions.create(
        model=model_name,
        messages=messages,
        max_tokens=5,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        logprobs=True,
        top_logprobs=5,
    )
    received, empty, finished = 0, 0, False
    for chunk in stream:
        assert chunk.usage.prompt_tokens >= 0 and chunk.usage.completion_tokens >= 0
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        if not finished:
            if chunk.choices[0].delta.content == "":  # no token generated yet
                assert chunk.usage.completion_tokens == 0
                assert chunk.choices[0].logprobs is None
                empty += 1
            else:
                received += 1
            finished = chunk.choices[0].finish_reason is not None
        if finished:
            assert chunk.usage.completion_tokens == received
    assert empty <= 1


# ---------------------------------------------------------------- optional middleware


@pytest.fixture(scope="module")
def key_server(model_dir, tmp_path_factory):
    "vLLM's middleware server with --api-key test (conftest's `server` reads /v1/models unkeyed)."
    log = tmp_path_factory.mktemp("vllm-suite-key") / "server.log"
    with minillm_serve(model_dir, log, "--api-key", "test") as (base, _):
        yield base


@pytest.mark.quick
def test_no_api_token(server):
    "vLLM: entrypoints/openai/test_optional_middleware.py::test_no_api_token"
    assert httpx.get(server.url_for("v1/models"), timeout=30).status_code == 200


@pytest.mark.quick
def test_no_request_id_header(server):
    "vLLM: entrypoints/openai/test_optional_middleware.py::test_no_request_id_header"
    assert "X-Request-Id" not in httpx.get(server.url_for("health"), timeout=30).headers


def test_missing_api_token(key_server):
    "vLLM: entrypoints/openai/test_optional_middleware.py::test_missing_api_token"
    assert httpx.get(f"{key_server}/v1/models", timeout=30).status_code == 401


def test_passed_api_token(key_server):
    "vLLM: entrypoints/openai/test_optional_middleware.py::test_passed_api_token"
    headers = {"Authorization": "Bearer test"}
    assert httpx.get(f"{key_server}/v1/models", headers=headers, timeout=30).status_code == 200


def test_not_v1_api_token(key_server):
    "vLLM: entrypoints/openai/test_optional_middleware.py::test_not_v1_api_token"
    assert httpx.get(f"{key_server}/health", timeout=30).status_code == 200


# ---------------------------------------------------------------- load-report headers (ORCA)


def test_chat_completion_with_orca_header(server, model_name):
    "vLLM: entrypoints/serve/instrumentator/test_orca_metrics.py::test_chat_completion_with_orca_header"  # noqa: E501
    messages = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": "what is 1+1?"},
    ]
    client = server.get_client()
    raw = client.with_raw_response.chat.completions.create(
        model=model_name,
        messages=messages,
        max_tokens=16,
        extra_headers={"endpoint-load-metrics-format": "TEXT"},
    )
    assert "endpoint-load-metrics" in raw.http_response.headers


def test_completion_with_orca_header(client, model_name):
    "vLLM: entrypoints/serve/instrumentator/test_orca_metrics.py::test_completion_with_orca_header"
    raw = client.with_raw_response.completions.create(
        model=model_name,
        prompt="Hello, my name is",
        max_tokens=5,
        extra_headers={"endpoint-load-metrics-format": "JSON"},
    )
    assert "endpoint-load-metrics" in raw.http_response.headers


@pytest.mark.quick
def test_single_completion(client, model_name, tokenizer):
    "vLLM: entrypoints/serve/instrumentator/test_orca_metrics.py::test_single_completion"
    prompt = "Hello, my name is"
    completion = client.completions.create(
        model=model_name,
        prompt=prompt,
        max_tokens=5,
        extra_headers={"endpoint-load-metrics-format": "JSON"},
        temperature=0.0,
    )
    assert completion.id is not None and len(completion.choices) == 1
    choice = completion.choices[0]
    assert len(choice.text) >= 5 and choice.finish_reason == "length"
    p = len(tokenizer.encode(prompt))  # vLLM: Qwen3-0.6B's 5 tokens
    assert completion.usage.model_dump(
        include={"completion_tokens", "prompt_tokens", "total_tokens"}
    ) == {
        "completion_tokens": 5,
        "prompt_tokens": p,
        "total_tokens": p + 5,
    }
    completion = client.completions.create(
        model=model_name, prompt=[0, 0, 0, 0, 0], max_tokens=5, temperature=0.0
    )
    assert len(completion.choices[0].text) >= 1
    assert getattr(completion.choices[0], "prompt_logprobs", None) is None


# ---------------------------------------------------------------- structured outputs: bad specs


@pytest.mark.quick
def test_invalid_regex(client, model_name):
    "vLLM: v1/entrypoints/openai/test_chat_completion.py::test_invalid_regex"
    prompt = (
        "Generate an email address for Alan Turing, who works in Enigma. End in .com and new "
        "line. Example result: alan.turing@enigma.com\n"
    )
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"guided_regex": r"[.*", "stop": ["\n"]},
        )


@pytest.mark.quick
def test_invalid_grammar(client, model_name):
    "vLLM: v1/entrypoints/openai/test_chat_completion.py::test_invalid_grammar"
    grammar = """
        root ::= select_statementinvalidsyntax

        select_statement ::= "SELECT " column " from " table " where " condition

        column ::= "col_1 " | "col_2 "

        table ::= "table_1 " | "table_2 "

        condition ::= column "= " number

        number ::= "1 " | "2 "
    """
    prompt = "Generate an SQL query to show the 'username' and 'email' from the 'users' table."
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"guided_grammar": grammar},
        )


# ---------------------------------------------------------------- tool use: request validation
# vLLM checks these on its ChatCompletionRequest model (a 400 at the server); here, over HTTP.

SAMPLE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}


def test_chat_completion_request_with_no_tools(server, model_name):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_chat_completion_request_with_no_tools"  # noqa: E501
    assert (
        post(server, "v1/chat/completions", chat_body(model_name, max_tokens=2)).status_code == 200
    )
    body = chat_body(model_name, max_tokens=2, tools=None)
    assert post(server, "v1/chat/completions", body).status_code == 200
    r = post(server, "v1/chat/completions", chat_body(model_name, max_tokens=2, tools=[]))
    assert r.status_code == 400, r.text  # vLLM: "must not be an empty array"
    assert "tools" in r.json()["error"]["message"]


@pytest.mark.quick
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_chat_completion_request_with_tool_choice_but_no_tools(server, model_name, tool_choice):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_chat_completion_request_with_tool_choice_but_no_tools"  # noqa: E501
    for extra in [{}, {"tools": None}]:
        r = post(
            server, "v1/chat/completions", chat_body(model_name, tool_choice=tool_choice, **extra)
        )
        assert r.status_code == 400  # vLLM: "When using `tool_choice`, `tools` must be set."
        assert "tools" in r.json()["error"]["message"]


@pytest.mark.quick
def test_structured_outputs_with_named_tool_choice_rejected(server, model_name):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_structured_outputs_with_named_tool_choice_rejected"  # noqa: E501
    body = chat_body(
        model_name,
        tools=[SAMPLE_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        structured_outputs={"json": {"type": "object"}},
    )
    assert post(server, "v1/chat/completions", body).status_code == 400


@tool_server
def test_structured_outputs_with_auto_tool_choice_allowed(server, model_name):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_structured_outputs_with_auto_tool_choice_allowed"  # noqa: E501
    body = chat_body(
        model_name,
        max_tokens=8,
        tools=[SAMPLE_TOOL],
        tool_choice="auto",
        structured_outputs={"json": {"type": "object"}},
    )
    r = post(server, "v1/chat/completions", body)
    assert r.status_code == 200, r.text


@pytest.mark.quick
def test_multiple_structured_outputs_rejected(server, model_name):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_multiple_structured_outputs_rejected"  # noqa: E501
    body = chat_body(model_name, structured_outputs={"json": {"type": "object"}, "regex": ".*"})
    r = post(server, "v1/chat/completions", body)
    assert r.status_code == 400 and "structured_outputs" in r.json()["error"]["message"]


@pytest.mark.quick
def test_invalid_structured_outputs_type_rejected(server, model_name):
    "vLLM: tool_use/test_chat_completion_request_validations.py::test_invalid_structured_outputs_type_rejected"  # noqa: E501
    r = post(server, "v1/chat/completions", chat_body(model_name, structured_outputs=3))
    assert r.status_code == 400 and "structured_outputs" in r.json()["error"]["message"]


# ---------------------------------------------------------------- tool use: the hermes server

HERMES_SYSTEM_PROMPT = (
    "You are a helpful assistant with access to tools. If a tool that you have would be helpful "
    "to answer a user query, call the tool. Otherwise, answer the user's query directly without "
    "calling a tool. DO NOT CALL A TOOL THAT IS IRRELEVANT to the user's question - just respond "
    "to it normally."
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "The city to find the weather for, e.g. 'San Francisco'",
                },
                "state": {
                    "type": "string",
                    "description": "must the two-letter abbreviation for the state that the city "
                    "is in, e.g. 'CA' which would mean 'California'",
                },
                "unit": {
                    "type": "string",
                    "description": "The unit to fetch the temperature in",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the internet and get a summary of the top 10 webpages. Should only "
        "be used if you don't know the answer to a user query, and the results are likely to be "
        "able to be found with a web search",
        "parameters": {
            "type": "object",
            "properties": {
                "search_term": {
                    "type": "string",
                    "description": "The term to use in the search. This should ideally be "
                    "keywords to search for, not a natural-language question",
                }
            },
            "required": ["search_term"],
        },
    },
}
WITHOUT_TOOLS = [
    {"role": "system", "content": HERMES_SYSTEM_PROMPT},
    {"role": "user", "content": "Hi! How are you?"},
    {"role": "assistant", "content": "I'm doing great! How can I assist you?"},
    {"role": "user", "content": "Can you tell me a joke please?"},
]
ASKING_FOR_TOOLS = [
    {"role": "user", "content": "What is the weather in Dallas, Texas in Fahrenheit?"}
]
DALLAS = ("chatcmpl-tool-03e6481b146e408e9523d9c956696295", "Dallas", "TX")
ORLANDO = ("chatcmpl-tool-d027061e1bd21cda48bee7da829c1f5b", "Orlando", "Fl")


def weather_call(call_id, city, state):
    arguments = json.dumps({"city": city, "state": state, "unit": "fahrenheit"})
    name = WEATHER_TOOL["function"]["name"]
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WITH_TOOL_RESPONSE = ASKING_FOR_TOOLS + [
    {"role": "assistant", "tool_calls": [weather_call(*DALLAS)]},
    {
        "role": "tool",
        "tool_call_id": DALLAS[0],
        "content": "The weather in Dallas is 98 degrees fahrenheit, with partlycloudy skies and a "
        "low chance of rain.",
    },
]
ASKING_FOR_PARALLEL_TOOLS = [
    {
        "role": "user",
        "content": "What is the weather in Dallas, Texas and Orlando, Florida in Fahrenheit?",
    }
]
WITH_PARALLEL_TOOL_RESPONSE = ASKING_FOR_PARALLEL_TOOLS + [
    {"role": "assistant", "tool_calls": [weather_call(*DALLAS), weather_call(*ORLANDO)]},
    {
        "role": "tool",
        "tool_call_id": DALLAS[0],
        "content": "The weather in Dallas TX is 98 degrees fahrenheit with mostly cloudy skies and "
        "a chance of rain in the evening.",
    },
    {
        "role": "tool",
        "tool_call_id": ORLANDO[0],
        "content": "The weather in Orlando FL is 78 degrees fahrenheit with clearskies.",
    },
]


def text_stream_matches(stream, choice, require_same_finish: bool = True) -> None:
    "vLLM's streamed-text checks: one role, one finish reason, no tool calls, same text."
    chunks, finishes, role_sent = [], 0, False
    for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.role:
            assert not role_sent and delta.role == "assistant"
            role_sent = True
        if delta.content:
            chunks.append(delta.content)
        if chunk.choices[0].finish_reason is not None:
            finishes += 1
            if require_same_finish:
                assert chunk.choices[0].finish_reason == choice.finish_reason
            assert chunk.choices[0].finish_reason != "tool_calls"
        assert not delta.tool_calls
    assert role_sent and finishes == 1 and chunks
    assert "".join(chunks) == choice.message.content


@tool_server
def test_chat_completion_without_tools(client, model_name):
    "vLLM: tool_use/test_chat_completions.py::test_chat_completion_without_tools"
    kw = dict(messages=WITHOUT_TOOLS, temperature=0, max_completion_tokens=150, model=model_name)
    choice = client.chat.completions.create(logprobs=False, **kw).choices[0]
    assert choice.message.content and choice.finish_reason != "tool_calls"
    assert not choice.message.tool_calls
    text_stream_matches(client.chat.completions.create(logprobs=False, stream=True, **kw), choice)


@tool_server
def test_chat_completion_with_tools(client, model_name):
    "vLLM: tool_use/test_chat_completions.py::test_chat_completion_with_tools"
    kw = dict(messages=WITHOUT_TOOLS, temperature=0, max_completion_tokens=150, model=model_name)
    kw |= dict(tools=[WEATHER_TOOL], logprobs=False)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.message.content and choice.finish_reason != "tool_calls"
    assert not choice.message.tool_calls
    text_stream_matches(client.chat.completions.create(stream=True, **kw), choice)


def streamed_calls(stream) -> tuple[list[dict], int, str | None]:
    "The tool calls a stream adds up to, its number of finish reasons and the role it sent."
    calls, finishes, role = [], 0, None
    for chunk in stream:
        choice = chunk.choices[0]
        assert choice.index == 0
        if choice.finish_reason:
            finishes += 1
            assert choice.finish_reason == "tool_calls"
        if choice.delta.role:
            assert role in (None, "assistant")
            role = "assistant"
        for call in choice.delta.tool_calls or []:
            if call.index == len(calls):
                calls.append({"id": None, "name": None, "arguments": ""})
            entry = calls[call.index]
            if call.id:
                assert entry["id"] is None  # an id is streamed once
                entry["id"] = call.id
            if call.function and call.function.name:
                assert entry["name"] is None  # so is the name, whole
                entry["name"] = call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
    return calls, finishes, role


@tool_server
@pytest.mark.xfail(
    strict=True,
    reason="asserts Hermes-3-Llama-3.1-8B's output: a get_current_weather call for Dallas, TX "
    "(SmolLM2-135M answers in prose)",
)
def test_tool_call_and_choice(client, model_name):
    "vLLM: tool_use/test_tool_calls.py::test_tool_call_and_choice"
    kw = dict(messages=ASKING_FOR_TOOLS, temperature=0, max_completion_tokens=100, model=model_name)
    kw |= dict(tools=[WEATHER_TOOL, SEARCH_TOOL], logprobs=False)
    choice = client.chat.completions.create(**kw).choices[0]
    calls = choice.message.tool_calls
    assert choice.message.role == "assistant"
    assert calls and len(calls) == 1 and calls[0].type == "function"
    assert isinstance(calls[0].id, str) and len(calls[0].id) >= 9
    assert calls[0].function.name == WEATHER_TOOL["function"]["name"]
    args = json.loads(calls[0].function.arguments)
    assert args.get("city") == "Dallas" and args.get("state") == "TX"
    assert choice.finish_reason == "tool_calls"
    streamed, finishes, role = streamed_calls(client.chat.completions.create(stream=True, **kw))
    assert finishes == 1 and role == "assistant" and len(streamed) == 1
    assert isinstance(streamed[0]["id"], str) and len(streamed[0]["id"]) >= 9
    assert streamed[0]["name"] == calls[0].function.name
    assert json.loads(streamed[0]["arguments"]) == args


@tool_server
def test_tool_call_with_results(client, model_name):
    "vLLM: tool_use/test_tool_calls.py::test_tool_call_with_results"
    kw = dict(messages=WITH_TOOL_RESPONSE, temperature=0, max_completion_tokens=100)
    kw |= dict(model=model_name, tools=[WEATHER_TOOL, SEARCH_TOOL], logprobs=False)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason != "tool_calls" and choice.message.role == "assistant"
    assert not choice.message.tool_calls
    assert "98" in choice.message.content  # the temperature the tool reported
    text_stream_matches(client.chat.completions.create(stream=True, **kw), choice)


@tool_server
@pytest.mark.xfail(
    strict=True,
    reason="asserts Hermes-3-Llama-3.1-8B's output: two get_current_weather calls, for Dallas and "
    "Orlando (SmolLM2-135M answers in prose)",
)
def test_parallel_tool_calls(client, model_name):
    "vLLM: tool_use/test_parallel_tool_calls.py::test_parallel_tool_calls"
    kw = dict(messages=ASKING_FOR_PARALLEL_TOOLS, temperature=0, max_tokens=200, model=model_name)
    kw |= dict(tools=[WEATHER_TOOL, SEARCH_TOOL], logprobs=False)
    choice = client.chat.completions.create(**kw).choices[0]
    calls = choice.message.tool_calls
    assert choice.message.role == "assistant" and calls and len(calls) == 2
    for call in calls:
        assert call.type == "function" and isinstance(call.id, str) and len(call.id) > 16
        assert call.function.name == WEATHER_TOOL["function"]["name"]
        args = json.loads(call.function.arguments)
        assert isinstance(args.get("city"), str) and isinstance(args.get("state"), str)
    assert choice.finish_reason == "tool_calls"
    streamed, finishes, role = streamed_calls(client.chat.completions.create(stream=True, **kw))
    assert finishes == 1 and role == "assistant" and len(streamed) == len(calls)
    for call, s in zip(calls, streamed):
        assert len(s["id"]) > 16 and s["name"] == call.function.name
        assert json.loads(s["arguments"]) == json.loads(call.function.arguments)


@tool_server
def test_parallel_tool_calls_with_results(client, model_name):
    "vLLM: tool_use/test_parallel_tool_calls.py::test_parallel_tool_calls_with_results"
    kw = dict(messages=WITH_PARALLEL_TOOL_RESPONSE, temperature=0, max_tokens=200)
    kw |= dict(model=model_name, tools=[WEATHER_TOOL, SEARCH_TOOL], logprobs=False)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason != "tool_calls" and choice.message.role == "assistant"
    assert not choice.message.tool_calls
    assert "98" in choice.message.content and "78" in choice.message.content
    text_stream_matches(client.chat.completions.create(stream=True, **kw), choice)


STRICT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]


@tool_server
def test_tool_calling_survives_strict_structured_outputs(client, model_name):
    "vLLM: tool_use/test_structured_outputs_tool_calling.py::test_tool_calling_survives_strict_structured_outputs"  # noqa: E501
    prompt = "What is the weather in San Francisco in celsius? Use the get_weather tool."
    choice = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        tools=STRICT_TOOLS,
        tool_choice="required",
        temperature=0.0,
        max_completion_tokens=128,
    ).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = next(c for c in choice.message.tool_calls if c.function.name == "get_weather")
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str) and args.get("unit") in ("celsius", "fahrenheit")
