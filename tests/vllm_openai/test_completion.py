"""vLLM's tests/entrypoints/openai/completion, rewritten against `minillm serve`: /v1/completions'
shapes, logprobs (echoed, prompt, packed), streaming and stream_options, parallel sampling, batches,
structured-output errors, prompt validation, usage, and token-in/token-out. Where vLLM tests its
serving classes on mock engine outputs (text_offset, logprobs, stream frames), the same property
is checked here on the server's real responses."""

import base64
import json
import math

import httpx
import numpy as np
import openai
import pytest

from vllm_openai.schemas import INVALID_JSON_SCHEMA

# vLLM: --dtype float32 --max-model-len 2048 --max-num-seqs 128 --enforce-eager
# --enable-prompt-tokens-details --no-enable-prefix-caching (minillm always sends
# prompt_tokens_details; --enforce-eager is a CUDA-graph switch, nothing on CPU)
SERVER_ARGS = ["--max-model-len", "2048", "--max-num-seqs", "128", "--no-prefix-caching"]

ZEROS = [0, 0, 0, 0, 0]  # vLLM's token-id prompt


def vocab_size(model_dir) -> int:
    from pathlib import Path

    return json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url_for("v1/completions"), json=body, timeout=300)


# --- completion/test_completion.py -------------------------------------------------------------


@pytest.mark.quick
def test_single_completion(client, model_name, tokenizer):
    "vLLM: completion/test_completion.py::test_single_completion"
    prompt = "Hello, my name is"
    r = client.completions.create(model=model_name, prompt=prompt, max_tokens=5, temperature=0.0)
    assert r.id is not None
    assert r.choices is not None and len(r.choices) == 1
    choice = r.choices[0]
    assert len(choice.text) >= 5
    assert choice.finish_reason == "length"
    # vLLM's numbers are OPT's (6 prompt tokens with its BOS); the same counts for this tokenizer
    n_prompt = len(tokenizer(prompt).input_ids)
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.total_tokens == n_prompt + 5

    r = client.completions.create(model=model_name, prompt=ZEROS, max_tokens=5, temperature=0.0)
    assert len(r.choices[0].text) >= 1
    assert getattr(r.choices[0], "prompt_logprobs", None) is None


@pytest.mark.quick
def test_no_logprobs(client, model_name):
    "vLLM: completion/test_completion.py::test_no_logprobs"
    r = client.completions.create(
        model=model_name, prompt=ZEROS, max_tokens=5, temperature=0.0, logprobs=None
    )
    assert r.choices[0].logprobs is None


@pytest.mark.quick
def test_zero_logprobs(client, model_name):
    "vLLM: completion/test_completion.py::test_zero_logprobs"
    r = client.completions.create(
        model=model_name, prompt=ZEROS, max_tokens=5, temperature=0.0, logprobs=0
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.top_logprobs[0]) == 1


@pytest.mark.quick
def test_some_logprobs(client, model_name):
    "vLLM: completion/test_completion.py::test_some_logprobs"
    r = client.completions.create(
        model=model_name, prompt=ZEROS, max_tokens=5, temperature=0.0, logprobs=5
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert 5 <= len(lp.top_logprobs[0]) <= 6


@pytest.mark.quick
def test_too_many_completion_logprobs(client, model_name):
    "vLLM: completion/test_completion.py::test_too_many_completion_logprobs"
    kw = dict(model=model_name, prompt=ZEROS, max_tokens=5, temperature=0.0)
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        client.completions.create(**kw, logprobs=21)  # vLLM's max_logprobs is 20
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        for _ in client.completions.create(**kw, logprobs=30, stream=True):
            pass
    r = client.completions.create(**kw)  # the server still answers
    assert len(r.choices[0].text) >= 0


@pytest.mark.parametrize("prompt_logprobs", [-1, 0, 1, None])
def test_prompt_logprobs_completion(client, model_name, prompt_logprobs):
    "vLLM: completion/test_completion.py::test_prompt_logprobs_completion"
    kw = dict(model=model_name, prompt=["A robot may not injure another robot", "My name is"])
    if prompt_logprobs is not None:
        kw["extra_body"] = {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**kw)
        return
    r = client.completions.create(**kw)
    if prompt_logprobs is None:
        assert getattr(r.choices[0], "prompt_logprobs", None) is None
        return
    for choice in r.choices[:2]:
        assert choice.prompt_logprobs is not None and len(choice.prompt_logprobs) > 0


def last_prompt_token_probability(prompt_logprobs) -> float:
    "The probability of the prompt's last token, from prompt_logprobs=0 (that token only)."
    assert prompt_logprobs is not None and prompt_logprobs[-1] is not None
    assert len(prompt_logprobs[-1]) == 1
    (entry,) = prompt_logprobs[-1].values()
    return math.exp(entry["logprob"] if isinstance(entry, dict) else entry.logprob)


def test_prompt_logprobs_temperature_increases_argmax_prob_completion(client, model_name):
    "vLLM: completion/test_completion.py::test_prompt_logprobs_temperature_increases_argmax_prob_completion"  # noqa: E501
    argmax = client.completions.create(
        model=model_name,
        prompt=ZEROS,
        max_tokens=1,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    ).choices[0]
    assert argmax.token_ids is not None and len(argmax.token_ids) == 1
    prompt = ZEROS + argmax.token_ids  # ends with the greedy token

    def probability(t: float) -> float:
        r = client.completions.create(
            model=model_name,
            prompt=prompt,
            max_tokens=1,
            temperature=0.0,
            extra_body={"prompt_logprobs": 0, "prompt_logprobs_temperature": t},
        )
        return last_prompt_token_probability(r.choices[0].prompt_logprobs)

    assert probability(0.1) > probability(1.0) > probability(5.0)


@pytest.mark.quick
def test_completion_streaming(client, model_name):
    "vLLM: completion/test_completion.py::test_completion_streaming"
    kw = dict(model=model_name, prompt="What is an LLM?", max_tokens=5, temperature=0.0)
    single = client.completions.create(**kw).choices[0]
    chunks, finishes = [], 0
    for chunk in client.completions.create(**kw, stream=True):
        chunks.append(chunk.choices[0].text)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1  # only the last chunk has one
    # vLLM asserts "length" and text in the last chunk: OPT-125m runs on for 5 tokens, SmolLM2 ends
    # its turn at once (<|im_end|>, no text); the finish reason and text are the non-streamed ones
    assert chunk.choices[0].finish_reason == single.finish_reason
    if single.finish_reason == "length":
        assert chunk.choices[0].text  # the last token's text comes with the finish reason
    assert "".join(chunks) == single.text


PARALLEL_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="asserts facebook/opt-125m's output: 3 distinct samples of different lengths; "
    "SmolLM2 ends its turn at once on this prompt (p=0.39), 2 of the 3 seed-42 samples are empty",
)


@PARALLEL_XFAIL
def test_parallel_no_streaming(client, model_name):
    "vLLM: completion/test_completion.py::test_parallel_no_streaming"
    n, max_tokens = 3, 50  # some should finish before others
    r = client.completions.create(
        model=model_name,
        prompt="What is an LLM?",
        max_tokens=max_tokens,
        n=n,
        temperature=1.0,
        stream=False,
        logprobs=0,
        seed=42,
    )
    assert len(r.choices) == n
    lengths, texts = set(), []
    for i, choice in enumerate(r.choices):
        assert choice.index == i
        assert choice.finish_reason is not None
        texts.append(choice.text)
        lengths.add(len(choice.logprobs.tokens))
    assert len(lengths) > 1  # the samples ended at different times
    assert len(set(texts)) == n, texts


@PARALLEL_XFAIL
def test_parallel_streaming(client, model_name):
    "vLLM: completion/test_completion.py::test_parallel_streaming"
    n, max_tokens = 3, 50
    stream = client.completions.create(
        model=model_name,
        prompt="What is an LLM?",
        max_tokens=max_tokens,
        n=n,
        temperature=1.0,
        stream=True,
        seed=42,
    )
    chunks: list[list[str]] = [[] for _ in range(n)]
    finishes = 0
    for chunk in stream:
        choice = chunk.choices[0]
        chunks[choice.index].append(choice.text)
        finishes += choice.finish_reason is not None
    assert finishes == n
    lengths = {len(c) for c in chunks}
    assert all(length <= max_tokens for length in lengths)
    assert len(lengths) > 1  # the samples ended at different times
    texts = ["".join(c) for c in chunks]
    assert len(set(texts)) == n, texts


NO_USAGE_OPTIONS = [
    {"include_usage": False, "continuous_usage_stats": False},
    {"include_usage": False, "continuous_usage_stats": True},
    {},
]
NOT_WITHOUT_STREAM = [
    {"include_usage": None},
    {"include_usage": True},
    {"continuous_usage_stats": None},
    {"continuous_usage_stats": True},
]


def check_usage(usage):
    assert usage is not None
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.quick
def test_completion_stream_options(client, model_name):
    "vLLM: completion/test_completion.py::test_completion_stream_options"
    kw = dict(model=model_name, prompt="What is the capital of France?", max_tokens=5)
    kw["temperature"] = 0.0

    def stream(**options):
        return client.completions.create(**kw, stream=True, stream_options=options)

    for options in NO_USAGE_OPTIONS:
        for chunk in stream(**options):
            assert chunk.usage is None

    chunks = stream(include_usage=True, continuous_usage_stats=False)
    for chunk in chunks:
        assert chunk.usage is None
        if chunk.choices[0].finish_reason is not None:
            final = next(chunks)  # usage comes in a chunk of its own, after the last choice
            check_usage(final.usage)
            assert final.choices == []

    chunks = stream(include_usage=True, continuous_usage_stats=True)
    for chunk in chunks:
        check_usage(chunk.usage)
        if chunk.choices[0].finish_reason is not None:
            final = next(chunks)
            check_usage(final.usage)
            assert final.choices == []

    # stream_options without stream
    for options in NOT_WITHOUT_STREAM:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**kw, stream=False, stream_options=options)


@pytest.mark.quick
@pytest.mark.parametrize("prompts", [["Hello, my name is"] * 2, [ZEROS] * 2], ids=["text", "ids"])
def test_batch_completions(client, model_name, prompts):
    "vLLM: completion/test_completion.py::test_batch_completions (without its beam-search part)"
    kw = dict(model=model_name, prompt=prompts, max_tokens=5, temperature=0.0)
    batch = client.completions.create(**kw)
    assert len(batch.choices) == 2
    assert batch.choices[0].text == batch.choices[1].text

    texts = ["", ""]
    for chunk in client.completions.create(**kw, stream=True):
        assert len(chunk.choices) == 1
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts[0] == texts[1]


@pytest.mark.quick
@pytest.mark.parametrize("logprobs_arg", [1, 0])
@pytest.mark.parametrize("prompt", ["Hello, my name is", ZEROS], ids=["text", "ids"])
def test_echo_logprob_completion(client, model_name, tokenizer, prompt, logprobs_arg):
    "vLLM: completion/test_completion.py::test_echo_logprob_completion"
    r = client.completions.create(
        model=model_name,
        prompt=prompt,
        max_tokens=5,
        temperature=0.0,
        echo=True,
        logprobs=logprobs_arg,
    )
    prompt_text = tokenizer.decode(prompt) if isinstance(prompt, list) else prompt
    assert r.choices[0].text.startswith(prompt_text)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.text_offset) > 5
    assert len(lp.token_logprobs) > 5 and lp.token_logprobs[0] is None
    assert len(lp.top_logprobs) > 5 and lp.top_logprobs[0] is None
    for top in lp.top_logprobs[1:]:
        assert max(logprobs_arg, 1) <= len(top) <= logprobs_arg + 1
    assert len(lp.tokens) > 5


INVALID_GRAMMAR = """
    root ::= select_statementinvalidsyntax

    select_statement ::= "SELECT " column " from " table " where " condition

    column ::= "col_1 " | "col_2 "

    table ::= "table_1 " | "table_2 "

    condition ::= column "= " number

    number ::= "1 " | "2 "
"""


@pytest.mark.parametrize(
    "prompt,structured",
    [
        (
            "Generate a JSON with the brand, model and car_type of"
            "the most iconic car from the 90's",
            {"json": INVALID_JSON_SCHEMA},
        ),
        (
            "Generate an email address for Alan Turing, who works in Enigma.End in .com and new "
            "line. Example result:alan.turing@enigma.com\n",
            {"regex": r"[.*"},
        ),
        (
            "Generate an SQL query to show the 'username' and 'email'from the 'users' table.",
            {"grammar": INVALID_GRAMMAR},
        ),
    ],
    ids=["test_invalid_json_schema", "test_invalid_regex", "test_invalid_grammar"],
)
def test_invalid_structured_outputs(client, model_name, prompt, structured):
    "vLLM: completion/test_completion.py::test_invalid_json_schema, test_invalid_regex, test_invalid_grammar"  # noqa: E501
    extra = {"structured_outputs": structured}
    if "regex" in structured:
        extra["stop"] = ["\n"]
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        client.completions.create(model=model_name, prompt=prompt, extra_body=extra)


# --- completion/test_completion_text_offset.py -------------------------------------------------


@pytest.mark.parametrize(
    "prompt,max_tokens", [("Hi", 8), ("Write two short paragraphs about cats.\n\n", 48)]
)
def test_stream_text_offset_matches_non_stream_with_stop_holdback(
    client, model_name, prompt, max_tokens
):
    "vLLM: completion/test_completion_text_offset.py::test_stream_text_offset_matches_non_stream_with_stop_holdback"  # noqa: E501
    # vLLM feeds its serving class text that lags the tokens (a stop string's held-back
    # characters); here the server streams a real completion with the same stop string
    kw = dict(model=model_name, prompt=prompt, max_tokens=max_tokens, logprobs=0, stop=["\n\n"])
    kw["temperature"] = 0.0
    full = client.completions.create(**kw).choices[0]
    streamed_offsets, streamed_text = [], ""
    for chunk in client.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            streamed_text += choice.text
            if choice.logprobs is not None:
                streamed_offsets += choice.logprobs.text_offset
    assert streamed_text == full.text
    assert full.logprobs.text_offset[0] == 0
    assert full.logprobs.text_offset == sorted(full.logprobs.text_offset)
    assert streamed_offsets == full.logprobs.text_offset


# --- completion/test_empty_prompt_list.py ------------------------------------------------------


@pytest.mark.quick
def test_empty_prompt_list_rejected(server, model_name):
    "vLLM: completion/test_empty_prompt_list.py::test_empty_prompt_list_rejected"
    r = post(server, {"model": model_name, "prompt": []})
    assert r.status_code == 400
    assert "prompt" in r.json()["error"]["message"]


@pytest.mark.quick
def test_nonempty_prompt_list_ok(client, model_name):
    "vLLM: completion/test_empty_prompt_list.py::test_nonempty_prompt_list_ok"
    r = client.completions.create(model=model_name, prompt=["hello"], max_tokens=2)
    assert len(r.choices) == 1


# --- completion/test_prompt_validation.py ------------------------------------------------------


@pytest.mark.quick
def test_out_of_vocab_token_ids(client, model_name, model_dir):
    "vLLM: completion/test_prompt_validation.py::test_out_of_vocab_token_ids"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=[999999], max_tokens=5, temperature=0)
    # vLLM says "out of vocabulary"; the same in other words names the vocabulary's bound
    message = str(e.value)
    assert "vocab" in message.lower() or str(vocab_size(model_dir)) in message


# --- completion/test_completion_logprobs.py ----------------------------------------------------


def test_completion_logprobs_handles_sampled_token_absent_from_step(client, model_name):
    "vLLM: completion/test_completion_logprobs.py::test_completion_logprobs_handles_sampled_token_absent_from_step"  # noqa: E501
    # vLLM hands its serving class a step whose top logprobs lack the sampled token; a server
    # meets that when it samples below the top N: hot sampling with logprobs=1
    r = client.completions.create(
        model=model_name,
        prompt="Once upon a time",
        max_tokens=32,
        temperature=2.0,
        seed=7,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 32
    outside = 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        if logprob is None:  # vLLM's answer for such a step: no logprobs there
            assert top is None
            continue
        assert token in top  # or the sampled token beside the top 1
        outside += len(top) > 1
    assert outside > 0  # the case happened


# --- completion/test_packed_logprobs.py --------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_packed_request_returns_top_k(client, model_name, stream):
    "vLLM: completion/test_packed_logprobs.py::test_packed_request_uses_flat_engine_scores_without_candidate_decoding"  # noqa: E501
    kw = dict(model=model_name, prompt=[1], max_tokens=4, temperature=0.0, logprobs=2)
    extra = {"return_top_k_logprobs": True, "return_tokens_as_token_ids": True}
    plain = client.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True})
    expected_top = [
        [int(t.removeprefix("token_id:")) for t in sorted(top, key=top.get, reverse=True)][:2]
        for top in plain.choices[0].logprobs.top_logprobs
    ]
    if stream:
        chunks = list(
            client.completions.create(
                **kw, stream=True, extra_body=extra | {"return_token_ids": True}
            )
        )
        logprobs = [c.choices[0].logprobs for c in chunks if c.choices]
    else:
        logprobs = [client.completions.create(**kw, extra_body=extra).choices[0].logprobs]
    ids = []
    for lp in logprobs:
        packed = lp.model_dump()["top_k"]
        assert packed["k"] == 2
        assert not lp.top_logprobs
        rows = np.frombuffer(base64.b64decode(packed["token_ids"]), "<i4").reshape(-1, 2)
        assert packed["num_positions"] == len(rows) == len(lp.token_logprobs)
        ids += rows.tolist()
    assert ids == expected_top
    assert "Infinity" not in json.dumps([lp.model_dump() for lp in logprobs])


@pytest.mark.parametrize(
    "override",
    [
        {"echo": True},
        {"use_beam_search": True},
        {"logprobs": 0},
        {"logprobs": -1},
        {"logprobs": None},
        {"logprob_token_ids": [1]},
        {"return_tokens_as_token_ids": False},
    ],
    ids=lambda o: next(iter(o)) + "=" + str(next(iter(o.values()))),
)
def test_reject_unsupported_packed_requests(server, model_name, override):
    "vLLM: completion/test_packed_logprobs.py::test_reject_unsupported_packed_requests"
    body = {
        "model": model_name,
        "prompt": [1],
        "max_tokens": 1,
        "logprobs": 2,
        "return_top_k_logprobs": True,
        "return_tokens_as_token_ids": True,
    }
    assert post(server, body | override).status_code == 400


# --- completion/test_token_in_token_out.py -----------------------------------------------------


@pytest.mark.quick
def test_token_in_token_out_and_logprobs(client, model_name, tokenizer):
    "vLLM: completion/test_token_in_token_out.py::test_token_in_token_out_and_logprobs"
    # vLLM's server runs --skip-tokenizer-init --load-format dummy; minillm has neither
    text = "Hello, world! How are you today?"
    r = client.completions.create(
        model=model_name,
        prompt=tokenizer.encode(text),
        max_tokens=20,
        temperature=0,
        echo=True,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    assert choice.token_ids is not None and 0 < len(choice.token_ids) <= 20
    assert choice.prompt_token_ids is not None
    assert tokenizer.decode(choice.prompt_token_ids) == text


# --- completion/test_usage_policy.py -----------------------------------------------------------


@pytest.mark.quick
def test_usage_policy_non_streaming(client, model_name):
    "vLLM: completion/test_usage_policy.py::TestUsagePolicyDefault::test_non_streaming"
    r = client.completions.create(
        model=model_name, prompt="Hello", max_tokens=5, temperature=0.0, stream=False
    )
    assert r.usage is not None
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


@pytest.mark.quick
def test_usage_policy_streaming_no_usage(client, model_name):
    "vLLM: completion/test_usage_policy.py::TestUsagePolicyDefault::test_streaming_no_usage"
    stream = client.completions.create(
        model=model_name, prompt="Hello", max_tokens=5, temperature=0.0, stream=True
    )
    assert not any(c.usage is not None and not c.choices for c in stream)


@pytest.mark.quick
def test_usage_policy_streaming_with_usage_option(client, model_name):
    "vLLM: completion/test_usage_policy.py::TestUsagePolicyDefault::test_streaming_with_usage_option"  # noqa: E501
    stream = client.completions.create(
        model=model_name,
        prompt="Hello",
        max_tokens=5,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage_chunks = [c for c in stream if c.usage is not None and not c.choices]
    assert usage_chunks
    assert all(c.usage.prompt_tokens > 0 for c in usage_chunks)


# --- completion/test_stream_frame_template.py --------------------------------------------------
# vLLM renders stream frames from a per-stream template and checks them against its response
# models' JSON for awkward ids, model names, indices and texts. Here the same values travel
# through a real stream (--served-model-name, request_id, the 8th prompt, echoed prompt text): every
# frame must be JSON that gives back exactly what the non-streamed response has.

FRAME_TEXTS = [  # vLLM's, but the empty one (an empty prompt is refused, nothing echoes)
    "Hello, world",
    ' "quoted" and \\backslashed\\ ',
    "line\nbreaks\r\ttabs",
    "\x00\x01\x1f\x7f",
    "unicode é 日本語 🚀 \U0001d549\U0010ffff",
]
REQUEST_IDS = {  # served model name -> request_id, vLLM's pairs
    "meta-llama/Llama-3.1-8B": "cmpl-abc123",
    "модель 🎯": 'id "with" quotes\\',
}


@pytest.mark.parametrize(
    "server_args",
    [["--served-model-name", name] for name in REQUEST_IDS],
    indirect=True,
    ids=["plain-names", "quoted-names"],
)
@pytest.mark.parametrize("text", FRAME_TEXTS, ids=range(len(FRAME_TEXTS)))
def test_template_frame_matches_model_frame(server, model_name, text):
    "vLLM: completion/test_stream_frame_template.py::test_template_frame_matches_model_frame"
    request_id = REQUEST_IDS[model_name]
    index = 7
    body = {
        "model": model_name,
        "prompt": ["Hello"] * index + [text],
        "max_tokens": 3,
        "temperature": 0.0,
        "echo": True,
        "request_id": request_id,
    }
    full = post(server, body)
    assert full.status_code == 200, full.text
    full_texts = {c["index"]: c["text"] for c in full.json()["choices"]}
    assert full_texts[index].startswith(text)

    texts: dict[int, str] = {}
    with httpx.stream(
        "POST", server.url_for("v1/completions"), json=body | {"stream": True}, timeout=300
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frame = json.loads(line.removeprefix("data: "))  # each frame is valid JSON
            assert frame["id"].endswith(request_id) and frame["model"] == model_name
            for choice in frame["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == full_texts
