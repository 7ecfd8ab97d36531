"""vLLM's tests/entrypoints/openai/basic, rewritten against `minillm serve`: version and health,
request cancellation, content types, server load, chat echo with continue_final_message, logit_bias
bounds, return_token_ids, and chat templates (vLLM tests its loader directly; here the same
templates go through `--chat-template` and the server's /tokenize)."""

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from helpers import minillm_serve

from minillm.bench.online import free_port

# vLLM runs these files on servers with --max-model-len 1024..10100, --max-num-seqs 32..128 and
# hermes tool calls; one server here covers them (10100 for test_request_cancellation's long asks).
SERVER_ARGS = [
    "--max-model-len",
    "10100",
    "--max-num-seqs",
    "128",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]

# vLLM's basic/conftest.py: a template that writes each message as "role: content" on a line
ROLE_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
BASIC_ARGS = [
    "--max-model-len",
    "1024",
    "--max-num-seqs",
    "32",
    "--chat-template",
    ROLE_TEMPLATE,
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "The unit of temperature",
                },
            },
            "required": ["location"],
        },
    },
}
WEATHER_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather like in Paris?"},
]
EMOJI_PROMPT = "Complete this sentence with emojis: I love coding 🚀"
EMOJI_CHAT = [
    {"role": "system", "content": "You like to use emojis in your responses."},
    {"role": "user", "content": "Repeat after me: I love cats 🐱"},
]


def vocab_size(model_dir) -> int:
    "The model's vocabulary size, from its config (vLLM asks its ModelConfig)."
    return json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]


def ids_from_token_strs(tokens: list[str]) -> list[int]:
    "The ids in logprobs tokens named 'token_id:<id>' (return_tokens_as_token_ids)."
    return [int(t.removeprefix("token_id:")) for t in tokens if t.startswith("token_id:")]


def load(server) -> httpx.Response:
    return httpx.get(server.url_for("load"), timeout=30)


# --- basic/test_basic.py ---------------------------------------------------------------------


@pytest.mark.quick
def test_show_version(server):
    "vLLM: basic/test_basic.py::test_show_version"
    r = httpx.get(server.url_for("version"), timeout=30)
    r.raise_for_status()
    from minillm import __version__

    assert r.json() == {"version": __version__}


@pytest.mark.quick
def test_check_health(server):
    "vLLM: basic/test_basic.py::test_check_health"
    assert httpx.get(server.url_for("health"), timeout=30).status_code == 200


def test_request_cancellation(server, model_name):
    "vLLM: basic/test_basic.py::test_request_cancellation"
    chat = [{"role": "user", "content": "Write a long story"}]

    async def flood():
        client = server.get_async_client(timeout=0.5)
        tasks = [
            asyncio.create_task(
                client.chat.completions.create(
                    messages=chat,
                    model=model_name,
                    max_tokens=10000,
                    extra_body={"min_tokens": 10000},
                )
            )
            for _ in range(200)  # about two million tokens asked for
        ]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.ALL_COMPLETED)
        await client.close()
        return done, pending

    done, pending = asyncio.run(flood())
    assert len(pending) == 0
    for d in done:  # each timed out (no 400 or other error hides among them)
        with pytest.raises(openai.APITimeoutError):
            d.result()
    # vLLM then gives one short request 5 s; minillm's wall clock on a shared CPU is no measure,
    # so: the server drops every abandoned request (they would run for hours otherwise) ...
    for _ in range(600):
        state = httpx.get(server.url_for("get_load"), timeout=30).json()
        if state["load"] == 0:
            break
        time.sleep(0.5)
    assert state["load"] == 0, state
    # ... and answers afterwards
    r = server.get_client().chat.completions.create(messages=chat, model=model_name, max_tokens=10)
    assert len(r.choices) == 1


@pytest.mark.quick
def test_request_wrong_content_type(client, model_name):
    "vLLM: basic/test_basic.py::test_request_wrong_content_type"
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(
            messages=[{"role": "user", "content": "Write a long story"}],
            model=model_name,
            max_tokens=10000,
            extra_headers={"Content-Type": "application/x-www-form-urlencoded"},
        )


def test_server_load(server):
    "vLLM: basic/test_basic.py::test_server_load (vLLM's server runs --enable-server-load-tracking)"
    r = load(server)
    assert r.status_code == 200
    assert r.json().get("server_load") == 0

    def long_completion():
        return httpx.post(
            server.url_for("v1/completions"),
            # ignore_eos: the request must still run when the poll looks, whatever the model says
            json={
                "prompt": "Give me a long story",
                "max_tokens": 1000,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=600,
        )

    worker = threading.Thread(target=long_completion)
    worker.start()
    seen = []
    while worker.is_alive() and 1 not in seen:  # vLLM sleeps 0.1 s; here: poll while it runs
        r = load(server)
        assert r.status_code == 200
        seen.append(r.json().get("server_load"))
    worker.join()
    assert 1 in seen
    r = load(server)
    assert r.status_code == 200 and r.json().get("server_load") == 0


# --- basic/test_chat_logit_bias_validation.py --------------------------------------------------


@pytest.mark.quick
def test_chat_logit_bias_valid(model_dir, client, model_name):
    "vLLM: basic/test_chat_logit_bias_validation.py::test_chat_logit_bias_valid"
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Testing valid logit bias"}],
        max_tokens=5,
        logit_bias={str(vocab_size(model_dir) - 1): 1.0},
    )
    assert r.choices[0].message.content is not None


@pytest.mark.quick
def test_chat_logit_bias_invalid(model_dir, client, model_name):
    "vLLM: basic/test_chat_logit_bias_validation.py::test_chat_logit_bias_invalid"
    vocab = vocab_size(model_dir)
    bad = vocab + 1
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Testing invalid logit bias"}],
            max_tokens=5,
            logit_bias={str(bad): 1.0},
        )
    assert e.value.status_code == 400
    assert str(bad) in str(e.value) and str(vocab) in str(e.value)


# --- basic/test_return_token_ids.py ------------------------------------------------------------


@pytest.mark.parametrize(
    "return_token_ids", [pytest.param(True, marks=pytest.mark.quick), False, None]
)
def test_basic_completion_with_emoji(client, model_name, tokenizer, return_token_ids):
    "vLLM: basic/test_return_token_ids.py::test_basic_completion_with_emoji"
    kw = dict(model=model_name, prompt=EMOJI_PROMPT, max_tokens=10, temperature=0, logprobs=1)
    extra = None if return_token_ids is None else {"return_token_ids": return_token_ids}
    r = client.completions.create(**kw, extra_body=extra)
    choice = r.model_dump()["choices"][0]
    assert "prompt_token_ids" in choice  # vLLM always has the key (null unless asked for)
    if not return_token_ids:
        assert choice.get("token_ids") is None and choice.get("prompt_token_ids") is None
        return
    prompt_ids = r.choices[0].prompt_token_ids
    assert isinstance(prompt_ids, list)
    encoded = tokenizer.encode(EMOJI_PROMPT)
    assert any(
        prompt_ids[i : i + len(encoded)] == encoded
        for i in range(len(prompt_ids) - len(encoded) + 1)
    )
    ids = r.choices[0].token_ids
    assert isinstance(ids, list) and len(ids) > 0
    assert tokenizer.decode(ids).startswith(r.choices[0].text)

    without = client.completions.create(**kw, extra_body={"return_token_ids": False}).model_dump()
    assert without["choices"][0].get("token_ids") is None
    assert without.get("prompt_token_ids") is None


def weather(client, model_name, return_token_ids: bool):
    return client.chat.completions.create(
        model=model_name,
        messages=WEATHER_CHAT,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_tokens=100,
        temperature=0,
        logprobs=True,
        extra_body={"return_token_ids": return_token_ids},
    )


def test_chat_completion_with_tool_use(client, model_name, tokenizer):
    "vLLM: basic/test_return_token_ids.py::test_chat_completion_with_tool_use (but the tool call)"
    r = weather(client, model_name, True)
    assert isinstance(r.choices[0].token_ids, list)
    assert isinstance(r.prompt_token_ids, list)
    prompt = tokenizer.decode(r.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert prompt.endswith("What's the weather like in Paris?<|im_end|>\n<|im_start|>assistant\n")
    if r.choices[0].message.tool_calls:
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"

    without = weather(client, model_name, False)
    assert getattr(without.choices[0], "token_ids", None) is None
    assert getattr(without, "prompt_token_ids", None) is None


@pytest.mark.xfail(
    strict=True,
    reason="asserts hmellor/tiny-random-LlamaForCausalLM's output: a hermes get_weather "
    "<tool_call> (SmolLM2-135M answers in prose)",
)
def test_chat_completion_with_tool_use_calls_the_tool(client, model_name, tokenizer):
    "vLLM: basic/test_return_token_ids.py::test_chat_completion_with_tool_use (the tool call)"
    r = weather(client, model_name, True)
    text = tokenizer.decode(r.choices[0].token_ids)
    assert text.startswith('<tool_call>\n{"name": "get_weather"')
    assert text.endswith("</tool_call><|im_end|>")


def test_comparison_with_prompt_logprobs_and_logprobs(client, model_name, tokenizer):
    "vLLM: basic/test_return_token_ids.py::test_comparison_with_prompt_logprobs_and_logprobs"
    r = client.completions.create(
        model=model_name,
        prompt="Hello, world! How are you today?",
        max_tokens=20,
        temperature=0,
        echo=True,
        logprobs=1,
        extra_body={
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "prompt_logprobs": 1,
        },
    )
    choice = r.choices[0]
    assert choice.token_ids is not None and choice.prompt_token_ids is not None
    assert choice.prompt_logprobs is not None and choice.logprobs is not None
    logprob_ids = ids_from_token_strs(choice.logprobs.tokens)
    # echo: the logprobs cover the prompt and the completion, the completion's ids end them
    assert len(choice.token_ids) < len(logprob_ids)
    assert logprob_ids[-len(choice.token_ids) :] == choice.token_ids
    assert "Hello, world" in tokenizer.decode(choice.prompt_token_ids)
    # vLLM's tiny random Llama runs to max_tokens; a model that ends its turn has the end token in
    # token_ids and not in the text (special tokens are skipped), so they are compared without it
    assert choice.text.endswith(tokenizer.decode(choice.token_ids, skip_special_tokens=True))

    stream = client.completions.create(
        model=model_name,
        prompt="Tell me a short fact about Python:",
        max_tokens=30,
        temperature=0,
        stream=True,
        echo=False,
        logprobs=1,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    prompt_ids, ids, logprob_ids = [], [], []
    for i, chunk in enumerate(stream):
        logprob_ids += ids_from_token_strs(chunk.choices[0].logprobs.tokens)
        if i == 0:
            prompt_ids = chunk.choices[0].prompt_token_ids
        ids += chunk.choices[0].token_ids
    assert len(prompt_ids) > 0
    assert ids == logprob_ids


@pytest.mark.quick
def test_chat_completion_with_emoji_and_token_ids(client, model_name, tokenizer):
    "vLLM: basic/test_return_token_ids.py::test_chat_completion_with_emoji_and_token_ids"
    kw = dict(model=model_name, messages=EMOJI_CHAT, max_tokens=50, temperature=0)
    r = client.chat.completions.create(**kw, logprobs=True, extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids is not None
    assert "prompt_token_ids" in r.model_dump()
    content = r.choices[0].message.content
    assert content is not None
    prompt = tokenizer.decode(r.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nYou like to use emojis in your responses.")
    assert prompt.endswith("I love cats 🐱<|im_end|>\n<|im_start|>assistant\n")
    # the token ids are the content and the end of the turn
    assert tokenizer.decode(r.choices[0].token_ids) == content + "<|im_end|>"

    streamed, ids = "", []
    for i, chunk in enumerate(
        client.chat.completions.create(**kw, stream=True, extra_body={"return_token_ids": True})
    ):
        if i == 0:
            assert isinstance(chunk.prompt_token_ids, list)
            assert tokenizer.decode(chunk.prompt_token_ids) == prompt
        else:
            assert "prompt_token_ids" not in chunk.model_dump(), "only the first chunk has them"
        if chunk.choices:
            streamed += chunk.choices[0].delta.content or ""
            ids += chunk.choices[0].model_dump().get("token_ids") or []
    assert len(streamed) > 0 and len(ids) > 0
    assert tokenizer.decode(ids) == streamed + "<|im_end|>"


# --- basic/test_chat_template.py ---------------------------------------------------------------
# vLLM calls load_chat_template and apply_hf_chat_template itself; here a server loads the template
# (--chat-template) and its /tokenize renders the messages.

# ChatML as vLLM's examples/template_chatml.jinja writes it (written anew here): every message
# closes with <|im_end|> except the last unless a generation prompt follows; that prompt opens an
# assistant turn unless the last message is the assistant's.
CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] }}"
    "{% if add_generation_prompt or not loop.last %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEMPLATE_MESSAGES = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there!"},
    {"role": "user", "content": "What is the capital of"},
]
TO_CONTINUE = {"role": "assistant", "content": "The capital of"}
HISTORY = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n"
GEN_PROMPTS = [  # add_generation_prompt, continue_final_message, the prompt
    (
        True,
        False,
        HISTORY + "<|im_start|>user\nWhat is the capital of<|im_end|>\n<|im_start|>assistant\n",
    ),
    (False, False, HISTORY + "<|im_start|>user\nWhat is the capital of"),
    (
        False,
        True,
        HISTORY + "<|im_start|>user\nWhat is the capital of<|im_end|>\n"
        "<|im_start|>assistant\nThe capital of",
    ),
]


class Base:
    "A server's url_for, for the server this file starts itself."

    def __init__(self, base: str):
        self.base = base

    def url_for(self, path: str) -> str:
        return f"{self.base}/{path}"


@pytest.fixture(scope="module")
def chatml_server(model_dir, tmp_path_factory):
    "A server whose --chat-template is a ChatML file."
    tmp = tmp_path_factory.mktemp("chatml")
    path = tmp / "template_chatml.jinja"
    path.write_text(CHATML)
    with minillm_serve(model_dir, tmp / "server.log", "--chat-template", str(path)) as (base, _):
        yield Base(base)


def rendered(server, messages, **kw) -> str:
    "The prompt the server makes of `messages`, as text."
    r = httpx.post(server.url_for("tokenize"), json={"messages": messages, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    d = httpx.post(server.url_for("detokenize"), json={"tokens": r.json()["tokens"]}, timeout=60)
    return d.json()["prompt"]


def test_load_chat_template(chatml_server):
    "vLLM: basic/test_chat_template.py::test_load_chat_template"
    got = rendered(chatml_server, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert got == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_no_load_chat_template_filelike(model_dir, tmp_path):
    "vLLM: basic/test_chat_template.py::test_no_load_chat_template_filelike"
    missing = "../../examples/does_not_exist"
    cmd = [str(Path(sys.executable).parent / "minillm"), "serve", "--port", str(free_port())]
    cmd += ["--model", str(model_dir), "--dtype", "float32", "--chat-template", missing]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # refused, not served as a template that prints the path
    assert missing in out


@pytest.mark.parametrize(
    "server_args", [["--chat-template", "{{ messages }}"]], indirect=True, ids=["literal"]
)
def test_no_load_chat_template_literallike(server):
    "vLLM: basic/test_chat_template.py::test_no_load_chat_template_literallike"
    messages = [{"role": "user", "content": "Hello"}]
    assert rendered(server, messages) == str(messages)  # the template itself, not a file's


@pytest.mark.parametrize("add_generation_prompt,continue_final_message,expected", GEN_PROMPTS)
def test_get_gen_prompt(chatml_server, add_generation_prompt, continue_final_message, expected):
    "vLLM: basic/test_chat_template.py::test_get_gen_prompt"
    messages = TEMPLATE_MESSAGES + ([TO_CONTINUE] if continue_final_message else [])
    got = rendered(
        chatml_server,
        messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )
    assert got == expected


# --- basic/test_chat_echo.py -------------------------------------------------------------------


@pytest.mark.parametrize("server_args", [BASIC_ARGS], indirect=True, ids=["basic-conftest"])
@pytest.mark.parametrize("echo", [True, False])
def test_chat_session_with_echo_and_continue_final_message(client, model_name, echo):
    "vLLM: basic/test_chat_echo.py::test_chat_session_with_echo_and_continue_final_message"
    saying = "Here is a common saying about apple. An apple a day, keeps"
    r = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "user", "content": "tell me a common saying"},
            {"role": "assistant", "content": saying},
        ],
        max_tokens=32,  # vLLM sends none; its assertion allows "length"
        extra_body={"echo": echo, "continue_final_message": True, "add_generation_prompt": False},
    )
    assert r.id is not None
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    message = choice.message
    assert message.content is not None
    assert (saying in message.content) == echo
    assert message.role == "assistant"


@pytest.mark.parametrize("server_args", [BASIC_ARGS], indirect=True, ids=["basic-conftest"])
def test_chat_prompt_logprobs(client, model_name):
    "vLLM: basic/test_chat_echo.py::test_prompt_logprobs"
    r = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Beijing is the capital of which country?"},
        ],
        max_tokens=16,  # vLLM sends none (the rest of its 1024-token context)
        extra_body={"prompt_logprobs": 5},
    )
    assert r.prompt_logprobs is not None
    assert len(r.prompt_logprobs) > 0


@pytest.mark.xfail(
    strict=True,
    reason="sends logprobs as the string 'true': minillm parses strictly (chapter 9), where "
    "vLLM's lax pydantic coerces it",
)
@pytest.mark.parametrize("server_args", [BASIC_ARGS], indirect=True, ids=["basic-conftest"])
def test_chat_top_logprobs(client, model_name):
    "vLLM: basic/test_chat_echo.py::test_top_logprobs"
    r = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Beijing is the capital of which country?"},
        ],
        max_tokens=16,  # vLLM sends none
        extra_body={"top_logprobs": 5, "logprobs": "true"},  # the string, as vLLM's test sends it
    )
    assert r.choices[0].logprobs is not None
    assert r.choices[0].logprobs.content is not None
    assert len(r.choices[0].logprobs.content) > 0
