"""vLLM's chat-completion tests, rewritten against `minillm serve` on the default model: logprobs
and prompt logprobs, streaming and its usage options, structured outputs and response_format, n,
message shapes and the batched-conversation extension.

Sources (vllm-project/vllm): tests/entrypoints/openai/chat_completion/test_chat.py and
test_chat_completion.py. Each test names the one it follows. vLLM runs them on Zephyr-7B (with a
LoRA adapter, whose parametrizations are dropped here) and Qwen2.5-1.5B-Instruct; where its
assertion holds a number of that model (a prompt's token count) the number is computed for ours.
Requests that vLLM sends without a length limit or a seed get one where the case would otherwise
run to the context's end or pass only by chance; each such change has a comment."""

import json
import re
from collections import defaultdict

import httpx
import jsonschema
import openai
import pytest

from vllm_openai.schemas import EMPLOYEE, INVALID_JSON_SCHEMA

# vLLM: --max-model-len 8192 --max-num-seqs 128 (Zephyr), --max-model-len 2048 (Qwen2.5); dropped:
# --dtype bfloat16 and --enforce-eager (float32 is minillm's anchor, a CPU has no CUDA graphs) and
# the LoRA flags (--enable-lora --lora-modules ...), which minillm does not have.
SERVER_ARGS = ["--max-model-len", "8192", "--max-num-seqs", "128"]

HELPER = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is 1+1?"},
]
WORLD_SERIES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]
FRANCE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
LANGUAGES = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "The best language for type-safe systems programming is "},
]
# tests/entrypoints/conftest.py: sample_structured_outputs_choices, sample_json_schema, sample_regex
CHOICES = "Python Java JavaScript C++ C# PHP TypeScript Ruby Swift Kotlin".split()
IPV4 = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"
MAX_N = 64  # minillm's --max-n default (vLLM's counterpart is VLLM_MAX_N_SEQUENCES)


def chat(client, model_name, messages, **kw):
    return client.chat.completions.create(model=model_name, messages=messages, **kw)


def prompt_length(server, messages) -> int:
    "The number of tokens the chat template makes of `messages` (vLLM's /tokenize)."
    r = httpx.post(server.url_for("tokenize"), json={"messages": messages}, timeout=60)
    r.raise_for_status()
    return r.json()["count"]


def then(messages, answer: str, question: str) -> list[dict]:
    "The conversation with the assistant's answer and the next question."
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": question},
    ]


# ---------------------------------------------------------------- logprobs


@pytest.mark.quick
def test_no_logprobs_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_no_logprobs_chat"
    r = chat(client, model_name, HELPER, max_completion_tokens=5, temperature=0.0, logprobs=False)
    assert r.choices[0].logprobs is None


@pytest.mark.quick
def test_zero_logprobs_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_zero_logprobs_chat"
    r = chat(
        client,
        model_name,
        HELPER,
        max_completion_tokens=5,
        temperature=0.0,
        logprobs=True,
        top_logprobs=0,
    )
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert logprobs.content[0].top_logprobs == []


@pytest.mark.quick
def test_some_logprobs_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_some_logprobs_chat"
    r = chat(
        client,
        model_name,
        HELPER,
        max_completion_tokens=5,
        temperature=0.0,
        logprobs=True,
        top_logprobs=5,
    )
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content[0].top_logprobs) == 5


@pytest.mark.quick
def test_too_many_chat_logprobs(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_too_many_chat_logprobs"
    with pytest.raises((openai.BadRequestError, openai.APIError)):  # above the limit of 20
        for _ in chat(
            client,
            model_name,
            HELPER,
            max_completion_tokens=10,
            logprobs=True,
            top_logprobs=21,
            stream=True,
        ):
            pass
    with pytest.raises(openai.BadRequestError):
        chat(client, model_name, HELPER, max_completion_tokens=10, logprobs=True, top_logprobs=30)
    r = chat(client, model_name, HELPER, max_completion_tokens=10)  # the server still serves
    assert r.choices[0].message.content is not None


@pytest.mark.quick
@pytest.mark.parametrize("prompt_logprobs", [1, 0, -1, None])
def test_prompt_logprobs_chat(client, model_name, prompt_logprobs):
    "vLLM: chat_completion/test_chat.py::test_prompt_logprobs_chat"
    # vLLM sends no max_completion_tokens; the prompt's logprobs do not depend on it, and without
    # one a small model may write until the context is full
    kw = {"max_completion_tokens": 5}
    if prompt_logprobs is not None:
        kw["extra_body"] = {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:
        with pytest.raises(openai.BadRequestError):
            chat(client, model_name, WORLD_SERIES, **kw)
        return
    r = chat(client, model_name, WORLD_SERIES, **kw)
    got = getattr(r, "prompt_logprobs", None)  # vLLM sends null, minillm leaves the key out
    if prompt_logprobs is None:
        assert got is None
    else:
        assert got is not None and len(got) > 0


def test_more_than_one_prompt_logprobs_chat(server, client, model_name):
    "vLLM: chat_completion/test_chat.py::test_more_than_one_prompt_logprobs_chat"
    r = httpx.post(server.url_for("tokenize"), json={"messages": WORLD_SERIES}, timeout=60)
    own = str(r.json()["tokens"][3])  # the prompt's token at position 3
    for k in (1, 2):
        r = chat(
            client,
            model_name,
            WORLD_SERIES,
            max_completion_tokens=5,  # as in test_prompt_logprobs_chat
            extra_body={"prompt_logprobs": k},
        )
        entries = r.prompt_logprobs[3]
        # vLLM asserts k entries: the k most likely tokens, among which Zephyr's prompt token is.
        # A position lists the prompt's own token too when it ranks lower (SmolLM2 ranks "You"
        # 6th after "system\n"), so the count is k, plus one when it is not among them.
        assert len(entries) == k + (entries[own]["rank"] > k)


# ---------------------------------------------------------------- sessions and streaming


@pytest.mark.quick
def test_single_chat_session(server, client, model_name):
    "vLLM: chat_completion/test_chat.py::test_single_chat_session"
    messages = list(HELPER)
    r = chat(client, model_name, messages, max_completion_tokens=5, logprobs=True, top_logprobs=5)
    assert r.id is not None and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    # vLLM compares with CompletionUsage(5, 37, 42): 37 is Zephyr's prompt, ours is counted; vLLM
    # leaves prompt_tokens_details out by default, minillm sends it, so the counts are compared
    prompt = prompt_length(server, messages)
    usage = r.usage
    assert (usage.completion_tokens, usage.prompt_tokens, usage.total_tokens) == (
        5,
        prompt,
        prompt + 5,
    )
    message = choice.message
    assert message.content is not None and len(message.content) >= 5
    assert message.role == "assistant"
    messages = then(messages, message.content, "express your result in json")
    r = chat(client, model_name, messages, max_completion_tokens=5)
    assert r.choices[0].message.content is not None


@pytest.mark.quick
def test_chat_streaming(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_streaming"
    kw = dict(max_completion_tokens=10, temperature=0.0)
    whole = chat(client, model_name, HELPER, **kw).choices[0]
    pieces, finishes = [], 0
    for chunk in chat(client, model_name, HELPER, stream=True, **kw):
        delta = chunk.choices[0].delta
        if delta.role:
            assert delta.role == "assistant"
        if delta.content:
            pieces.append(delta.content)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1  # only the last chunk has one
    assert chunk.choices[0].finish_reason == whole.finish_reason
    assert delta.content
    assert "".join(pieces) == whole.message.content


def test_chat_completion_stream_options(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_stream_options"
    kw = dict(max_completion_tokens=10, temperature=0.0)
    for chunk in chat(
        client, model_name, FRANCE, stream=True, stream_options={"include_usage": False}, **kw
    ):
        assert chunk.usage is None

    options = {"include_usage": True, "continuous_usage_stats": False}
    stream = iter(chat(client, model_name, FRANCE, stream=True, stream_options=options, **kw))
    for chunk in stream:
        assert chunk.usage is None
        if chunk.choices[0].finish_reason is not None:
            last = next(stream)  # the usage chunk follows the finish
            assert last.choices == []
            usage = last.usage
            assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    for options in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):  # stream_options without stream
            chat(client, model_name, FRANCE, stream=False, stream_options=options, **kw)

    options = {"include_usage": True, "continuous_usage_stats": True}
    seen = 0
    for chunk in chat(
        client,
        model_name,
        FRANCE,
        stream=True,
        stream_options=options,
        extra_body={"min_tokens": 10},
        **kw,
    ):
        usage = chunk.usage  # every chunk has usage, its completion count growing
        assert usage is not None, f"a chunk without usage: {chunk}"
        assert usage.prompt_tokens >= 0
        grew = usage.completion_tokens > seen
        assert seen == 0 or grew or (not chunk.choices and usage.completion_tokens == seen)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        seen = usage.completion_tokens
    assert seen == 10


# ---------------------------------------------------------------- structured outputs


def test_structured_outputs_choice_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_structured_outputs_choice_chat"
    # vLLM samples without a seed (temperature 0.7); the seeds make the case repeatable
    kw = dict(
        max_completion_tokens=10,
        temperature=0.7,
        extra_body={"structured_outputs": {"choice": CHOICES}},
    )
    first = chat(client, model_name, LANGUAGES, seed=0, **kw).choices[0].message.content
    assert first in CHOICES
    messages = then(LANGUAGES, first, "I disagree, pick another one")
    second = chat(client, model_name, messages, seed=1, **kw).choices[0].message.content
    assert second in CHOICES
    assert first != second


@pytest.mark.xfail(
    strict=True,
    reason="asserts Zephyr's output: an employee JSON closed within 1000 tokens (SmolLM2-135M, "
    "seed 1, writes one string until max_completion_tokens)",
)
def test_structured_outputs_json_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_structured_outputs_json_chat"
    messages = [
        {"role": "system", "content": "you are a helpful assistant"},
        {
            "role": "user",
            "content": "Give an example JSON for an employee profile that "
            f"fits this schema: {EMPLOYEE}",
        },
    ]
    kw = dict(max_completion_tokens=1000, extra_body={"structured_outputs": {"json": EMPLOYEE}})
    # seeds, as in test_structured_outputs_choice_chat
    content = chat(client, model_name, messages, seed=1, **kw).choices[0].message.content
    assert content is not None
    first = json.loads(content)
    jsonschema.validate(instance=first, schema=EMPLOYEE)
    messages = then(messages, content, "Give me another one with a different name and age")
    content = chat(client, model_name, messages, seed=2, **kw).choices[0].message.content
    assert content is not None
    second = json.loads(content)
    jsonschema.validate(instance=second, schema=EMPLOYEE)
    assert first["name"] != second["name"]
    assert first["age"] != second["age"]


def test_structured_outputs_regex_chat(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_structured_outputs_regex_chat"
    messages = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": f"Give an example IP address with this regex: {IPV4}"},
    ]
    kw = dict(max_completion_tokens=20, extra_body={"structured_outputs": {"regex": IPV4}})
    first = chat(client, model_name, messages, seed=1, **kw).choices[0].message.content
    assert first is not None and re.fullmatch(IPV4, first)
    messages = then(messages, first, "Give me a different one")
    second = chat(client, model_name, messages, seed=2, **kw).choices[0].message.content
    assert second is not None and re.fullmatch(IPV4, second)
    assert first != second


@pytest.mark.quick
def test_structured_outputs_type_error(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_structured_outputs_type_error"
    with pytest.raises(openai.BadRequestError):
        chat(
            client,
            model_name,
            LANGUAGES,
            extra_body={"structured_outputs": {"regex": {1: "Python", 2: "C++"}}},
        )


@pytest.mark.quick
def test_structured_outputs_choice_chat_logprobs(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_structured_outputs_choice_chat_logprobs"
    r = chat(
        client,
        model_name,
        LANGUAGES,
        max_completion_tokens=10,
        logprobs=True,
        top_logprobs=5,
        extra_body={"structured_outputs": {"choice": CHOICES}},
    )
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    top = logprobs.content[0].top_logprobs
    assert all(t.logprob >= -9999.0 for t in top), top  # OpenAI's floor for a logprob


@pytest.mark.xfail(strict=True, reason='asserts Zephyr\'s output: {"result": 2} for 1+1')
def test_response_format_json_object(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_response_format_json_object"
    question = 'what is 1+1? please respond with a JSON object, the format is {"result": 2}'
    for seed in (0, 1):  # vLLM samples without a seed
        r = chat(
            client,
            model_name,
            [{"role": "user", "content": question}],
            response_format={"type": "json_object"},
            seed=seed,
        )
        content = r.choices[0].message.content
        assert content is not None
        assert json.loads(content) == {"result": 2}


@pytest.mark.xfail(strict=True, reason='asserts Zephyr\'s output: {"result": 2} for 1+1')
def test_response_format_json_schema(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_response_format_json_schema"
    messages = [{"role": "user", "content": 'what is 1+1? The format is "result": 2'}]
    for seed in (0, 1):  # unconstrained, the answer is not that JSON (seeds: vLLM has none)
        content = chat(client, model_name, messages, seed=seed).choices[0].message.content
        assert content is not None
        with pytest.raises((json.JSONDecodeError, AssertionError)):
            assert json.loads(content) == {"result": 2}
    schema = {"type": "object", "properties": {"result": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "foo_test", "schema": schema}}
    for seed in (0, 1):
        r = chat(client, model_name, messages, response_format=fmt, seed=seed)
        content = r.choices[0].message.content
        assert content is not None
        assert json.loads(content) == {"result": 2}


@pytest.mark.quick
def test_response_format_text(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_response_format_text"
    for _ in range(2):
        r = chat(
            client,
            model_name,
            [{"role": "user", "content": "what is 1+1?"}],
            max_completion_tokens=10,
            response_format={"type": "text"},
        )
        assert r.choices[0].message.content is not None


# ---------------------------------------------------------------- message shapes and fields


@pytest.mark.quick
def test_extra_fields_allowed(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_extra_fields_allowed"
    message = {"role": "user", "content": "what is 1+1?", "extra_field": "0"}
    r = chat(client, model_name, [message], temperature=0, seed=0)
    assert r.choices[0].message.content is not None


@pytest.mark.xfail(strict=True, reason="asserts Zephyr's output: exactly '2' for 1+1")
def test_complex_message_content(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_complex_message_content"
    text = "what is 1+1? please provide the result without any other text."
    content = [{"type": "text", "text": text}]
    r = chat(client, model_name, [{"role": "user", "content": content}], temperature=0, seed=0)
    assert r.choices[0].message.content == "2"


def test_custom_role(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_custom_role"
    # not in vLLM's request: a bound (SmolLM2 answers a role it was not trained on at length)
    kw = dict(temperature=0, seed=0, max_completion_tokens=32)
    as_text = {"role": "my-custom-role", "content": "what is 1+1?"}
    as_parts = {"role": "my-custom-role", "content": [{"type": "text", "text": "what is 1+1?"}]}
    first = chat(client, model_name, [as_text], **kw).choices[0].message.content
    second = chat(client, model_name, [as_parts], **kw).choices[0].message.content
    assert first == second


@pytest.mark.xfail(
    reason="minillm takes seeds up to 2**64 (what torch takes); vLLM refuses above int64"
)
def test_long_seed(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_long_seed"
    int64 = (-(2**63), 2**63 - 1)  # torch.long's range
    for seed in (int64[0] - 1, int64[1] + 1):
        with pytest.raises(openai.BadRequestError) as e:
            chat(
                client,
                model_name,
                [{"role": "system", "content": "You are a helpful assistant."}],
                temperature=0,
                seed=seed,
                max_completion_tokens=5,  # not in vLLM's request; bounds the case if accepted
            )
        # vLLM's message names pydantic's bound (greater_than_equal, less_than_equal); minillm's
        # names the field and its range
        message = e.value.message
        assert any(w in message for w in ("greater_than_equal", "less_than_equal", "seed"))


def test_invocations(server, client, model_name):
    "vLLM: chat_completion/test_chat.py::test_invocations"
    body = {
        "model": model_name,
        "messages": HELPER,
        "max_completion_tokens": 5,
        "temperature": 0.0,
        "logprobs": False,
    }
    expected = client.chat.completions.create(**body)
    r = httpx.post(server.url_for("invocations"), json=body, timeout=300)  # SageMaker's path
    r.raise_for_status()
    got = r.json()
    assert expected.model_dump().keys() == got.keys()
    assert expected.model_dump()["choices"] == got["choices"]


# ---------------------------------------------------------------- n


def test_chat_completion_n_parameter_non_streaming(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_n_parameter_non_streaming"
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the opposite of big?"},
    ]
    r = chat(client, model_name, messages, max_completion_tokens=50, temperature=1.0, n=3, seed=42)
    assert len(r.choices) == 3
    for i, choice in enumerate(r.choices):
        assert choice.index == i and choice.message.content
    assert len({c.message.content for c in r.choices}) > 1


def test_chat_completion_n_parameter_streaming(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_n_parameter_streaming"
    texts = defaultdict(str)
    for chunk in chat(
        client, model_name, FRANCE, max_completion_tokens=15, temperature=0.7, n=2, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts[0] and texts[1]


@pytest.mark.quick
def test_chat_completion_n_with_seed(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_n_with_seed"
    messages = [{"role": "user", "content": "Say hello."}]
    r = chat(client, model_name, messages, max_completion_tokens=10, temperature=0.8, n=2, seed=42)
    assert len(r.choices) == 2
    for i, choice in enumerate(r.choices):
        assert choice.index == i and choice.message.content


@pytest.mark.quick
def test_chat_completion_n_equals_1(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_n_equals_1"
    messages = [{"role": "user", "content": "Hello!"}]
    r = chat(client, model_name, messages, max_completion_tokens=10, temperature=0.7, n=1)
    assert len(r.choices) == 1
    assert r.choices[0].index == 0 and r.choices[0].message.content is not None


# vLLM checks its limit on n in ChatCompletionRequest.to_sampling_params (unit tests); here the
# same limits through the API, at minillm's --max-n


@pytest.mark.quick
@pytest.mark.parametrize("n", [MAX_N + 1, 100_000_000], ids=["limit+1", "massive"])
def test_chat_completion_request_n_parameter_exceeds_default_limit(client, model_name, n):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_request_n_parameter_exceeds_default_limit"  # noqa: E501
    with pytest.raises(openai.BadRequestError, match="n must be at most"):
        chat(client, model_name, [{"role": "user", "content": "Test"}], n=n, max_tokens=1)


def test_chat_completion_request_n_parameter_at_limit(client, model_name):
    "vLLM: chat_completion/test_chat.py::test_chat_completion_request_n_parameter_at_limit"
    r = chat(client, model_name, [{"role": "user", "content": "Test"}], n=MAX_N, max_tokens=1)
    assert len(r.choices) == MAX_N


# ---------------------------------------------------------------- test_chat_completion.py


@pytest.mark.quick
def test_invalid_json_schema(client, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_invalid_json_schema (and v1/"
    "entrypoints/openai/test_chat_completion.py's copy)"
    schema = INVALID_JSON_SCHEMA
    question = (
        "Generate a JSON with the brand, model and car_type ofthe most iconic car from the 90's"
    )
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        chat(
            client,
            model_name,
            [{"role": "user", "content": question}],
            extra_body={"structured_outputs": {"json": schema}},
        )


@pytest.mark.quick
def test_invalid_regex(client, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_invalid_regex"
    question = (
        "Generate an email address for Alan Turing, who works in Enigma.End in .com and new "
        "line. Example result:alan.turing@enigma.com\n"
    )
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        chat(
            client,
            model_name,
            [{"role": "user", "content": question}],
            extra_body={"structured_outputs": {"regex": r"[.*"}, "stop": ["\n"]},
        )


@pytest.mark.quick
def test_invalid_grammar(client, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_invalid_grammar"
    grammar = "\n".join(
        [
            "root ::= select_statementinvalidsyntax",  # a rule that does not exist
            'select_statement ::= "SELECT " column " from " table " where " condition',
            'column ::= "col_1 " | "col_2 "',
            'table ::= "table_1 " | "table_2 "',
            'condition ::= column "= " number',
            'number ::= "1 " | "2 "',
        ]
    )
    question = "Generate an SQL query to show the 'username' and 'email'from the 'users' table."
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        chat(
            client,
            model_name,
            [{"role": "user", "content": question}],
            extra_body={"structured_outputs": {"grammar": grammar}},
        )


@pytest.mark.quick
def test_empty_grammar(client, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_empty_grammar"
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        chat(
            client,
            model_name,
            [{"role": "user", "content": "Say hello"}],
            extra_body={"structured_outputs": {"grammar": ""}},
        )


def batch_of_two(server, model_name, *words, **kw) -> httpx.Response:
    "One request with several conversations in `messages` (vLLM's batched chat completions)."
    conversations = [[{"role": "user", "content": w}] for w in words]
    body = {"model": model_name, "messages": conversations, **kw}
    return httpx.post(server.url_for("v1/chat/completions"), json=body, timeout=300)


def test_batched_chat_completions(server, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_batched_chat_completions"
    r = batch_of_two(
        server,
        model_name,
        "Reply with exactly the word: alpha",
        "Reply with exactly the word: beta",
        max_completion_tokens=16,  # not in vLLM's request: bounds the case
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert len(data["choices"]) == 2
    assert {c["index"] for c in data["choices"]} == {0, 1}
    assert all(c["message"]["content"] for c in data["choices"])
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_batched_chat_completions_with_json_schema(server, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_batched_chat_completions_with_json_schema"
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
    }
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    r = batch_of_two(
        server,
        model_name,
        "Is the sky blue? Answer in JSON.",
        "Is fire cold? Answer in JSON.",
        response_format=fmt,
    )
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2
    for choice in choices:
        assert json.loads(choice["message"]["content"])["answer"] in ("yes", "no")


def test_batched_chat_completions_rejects_stream(server, model_name):
    "vLLM: chat_completion/test_chat_completion.py::test_batched_chat_completions_rejects_stream"
    # a batch is answered whole (vLLM refuses its stream too)
    r = batch_of_two(server, model_name, "Hello", "World", stream=True)
    assert r.status_code == 400
