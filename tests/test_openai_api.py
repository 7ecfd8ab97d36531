"""Chapter 12b: logprobs, penalties, biases and structured outputs, in the engine and through a real
`minillm serve` driven by the official openai client."""

import json
import math
import re
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
import torch
from helpers import ask, minillm_serve, openai_client

from minillm import LLM, SamplingParams
from minillm.course.naive import greedy_divergence
from minillm.engine.logits_processor import apply_penalties, token_counts
from minillm.engine.structured_output import GuidedDecodingParams

SCHEMAS = [
    {  # nested objects, required and optional fields, bounded numbers
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city"],
            },
        },
        "required": ["name", "age", "address"],
    },
    {  # arrays of enums, booleans
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"type": "string", "enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "happy": {"type": "boolean"},
        },
        "required": ["colors", "happy"],
    },
    {  # numbers with bounds, nullable
        "type": "object",
        "properties": {
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "unit": {"enum": ["C", "F"]},
            "note": {"type": ["string", "null"], "maxLength": 16},
        },
        "required": ["temperature", "unit", "note"],
    },
    {  # an array at the top, objects inside
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["id"],
        },
        "minItems": 2,
        "maxItems": 4,
    },
]
QUESTIONS = ["Describe a person.", "Pick some colors.", "What is the weather?", "List some ids."]


def chat_prompt(tokenizer, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), dtype="float32", kv_cache_memory_gb=0.2)


# --- the sampler's pieces against straightforward references ---


def reference_penalties(logits, prompts, outputs, presence, frequency, repetition):
    "One row at a time, one token at a time: the definitions, written out."
    logits = logits.clone()
    for i in range(len(logits)):
        for t in set(prompts[i]) | set(outputs[i]):
            x = logits[i, t]
            logits[i, t] = x / repetition[i] if x > 0 else x * repetition[i]
        for t in set(outputs[i]):
            logits[i, t] -= frequency[i] * outputs[i].count(t) + presence[i]
    return logits


def test_penalties_match_the_reference_and_transformers():
    torch.manual_seed(0)
    V = 50
    logits = torch.randn(4, V) * 3
    prompts = [[1, 2, 3], [4, 4], [], [7]]
    outputs = [[2, 2, 9], [], [5, 5, 5, 6], [7, 8]]
    pres, freq, rep = [0.5, -1.0, 2.0, 0.0], [0.3, 0.0, -0.5, 1.5], [1.3, 0.7, 1.0, 2.0]
    counts = token_counts(outputs, V, "cpu")
    mask = token_counts(prompts, V, "cpu") > 0
    got = apply_penalties(
        logits, counts, mask, torch.tensor(pres), torch.tensor(freq), torch.tensor(rep)
    )
    want = reference_penalties(logits, prompts, outputs, pres, freq, rep)
    torch.testing.assert_close(got, want)
    # transformers' repetition penalty is the same rule over prompt + output
    from transformers import RepetitionPenaltyLogitsProcessor

    hf = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompts[0] + outputs[0]]), logits[:1])
    only_rep = apply_penalties(
        logits[:1], counts[:1], mask[:1], torch.zeros(1), torch.zeros(1), torch.tensor([1.3])
    )
    torch.testing.assert_close(only_rep, hf)


def test_greedy_with_penalties_bias_and_bad_words_equals_transformers(llm, hf_model, tokenizer):
    prompts = [tokenizer(p).input_ids for p in ["The capital of France is", "Once upon a time"]]
    banned = tokenizer.encode(" Paris", add_special_tokens=False)
    cases = [
        (dict(repetition_penalty=1.3), dict(repetition_penalty=1.3)),
        (dict(logit_bias={11: 4.0, 30: -3.0}), dict(sequence_bias={(11,): 4.0, (30,): -3.0})),
        (dict(bad_words=[" Paris"]), dict(bad_words_ids=[banned])),
    ]
    for ours, theirs in cases:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **ours)
        outs = llm.generate(prompts, params, use_tqdm=False)
        for o, p in zip(outs, prompts):
            greedy_divergence(hf_model, p, o.token_ids, None, **theirs)
    out = llm.generate(
        prompts[:1], SamplingParams(temperature=0, max_tokens=12, bad_words=[" Paris"])
    )
    assert banned[0] not in out[0].token_ids


def test_min_tokens_bans_eos_until_reached(llm, tokenizer, eos_ids):
    prompt = chat_prompt(tokenizer, "What is the capital of France?")
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0]
    assert free.finish_reason == "stop" and len(free.token_ids) < 20
    params = SamplingParams(temperature=0, max_tokens=40, min_tokens=len(free.token_ids) + 5)
    forced = llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(forced.token_ids) >= params.min_tokens
    assert not set(forced.token_ids[: params.min_tokens]) & set(eos_ids)


def test_logprobs_match_a_direct_forward_pass(llm, hf_model, tokenizer):
    prompt = tokenizer("The capital of France is").input_ids
    for temperature in (0.0, 0.8):
        params = SamplingParams(
            temperature=temperature,
            seed=1,
            max_tokens=6,
            logprobs=5,
            prompt_logprobs=3,
            presence_penalty=0.5,  # logprobs come from the raw model, before penalties (vLLM's)
        )
        o = llm.generate([prompt], params, use_tqdm=False)[0]
        ids = prompt + o.token_ids
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        entries = o.outputs[0].logprobs
        assert [e.token_id for e in entries] == o.token_ids
        for j, e in enumerate(entries):
            row = ref[len(prompt) - 1 + j]
            assert math.isclose(e.logprob, float(row[e.token_id]), abs_tol=1e-3)
            assert (
                e.rank == int((row > row[e.token_id] + 1e-4).sum()) + 1
                or abs(float(row.sort(descending=True).values[e.rank - 1] - row[e.token_id])) < 1e-3
            )
            top = [lp for _, lp in e.top]
            assert len(top) == 5 and top == sorted(top, reverse=True)
            assert sum(math.exp(lp) for lp in top) <= 1 + 1e-4
            torch.testing.assert_close(torch.tensor(top), row.topk(5).values, atol=1e-3, rtol=0)
        assert o.prompt_logprobs[0] is None
        for p, e in enumerate(o.prompt_logprobs[1:], start=1):
            assert e.token_id == prompt[p]
            assert math.isclose(e.logprob, float(ref[p - 1, prompt[p]]), abs_tol=1e-3)
            assert len(e.top) == 3


def test_prompt_logprobs_skip_the_prefix_cache_and_survive_chunking(model_dir, tokenizer):
    prompt = tokenizer("The quick brown fox jumps over the lazy dog. " * 6).input_ids
    llm = LLM(str(model_dir), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24)
    llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)  # fills the cache
    a = llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)[0]
    fresh = LLM(str(model_dir), dtype="float32", num_kv_blocks=64, enable_prefix_caching=False)
    b = fresh.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)[0]
    assert all(e is not None for e in a.prompt_logprobs[1:])
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x.token_id == y.token_id and math.isclose(x.logprob, y.logprob, abs_tol=1e-3)


# --- structured outputs in the engine ---


def guided(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=120, guided_decoding=GuidedDecodingParams(**kw))


def test_every_schema_is_followed(llm, tokenizer):
    prompts = [chat_prompt(tokenizer, q + " Answer in JSON.") for q in QUESTIONS]
    outs = llm.generate(prompts, [guided(json=s) for s in SCHEMAS], use_tqdm=False)
    for o, schema in zip(outs, SCHEMAS):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)


def test_choice_regex_and_grammar(llm, tokenizer):
    prompts = [chat_prompt(tokenizer, q) for q in ["Is the sky blue?", "A date?", "Count."]]
    params = [
        guided(choice=["yes", "no", "maybe not"]),
        guided(regex=r"(19|20)\d\d-(0[1-9]|1[0-2])-[0-2]\d"),
        guided(grammar='root ::= "one" item? item? "."\nitem ::= ", " ("two" | "three")'),
    ]
    a, b, c = llm.generate(prompts, params, use_tqdm=False)
    assert a.text in ("yes", "no", "maybe not")
    assert re.fullmatch(r"(19|20)\d\d-(0[1-9]|1[0-2])-[0-2]\d", b.text)
    assert re.fullmatch(r"one(, (two|three)){0,2}\.", c.text)


def test_sampled_structured_outputs_stay_valid(llm, tokenizer):
    prompts = [chat_prompt(tokenizer, QUESTIONS[1])] * 8
    params = [
        SamplingParams(
            temperature=1.0,
            seed=s,
            max_tokens=120,
            guided_decoding=GuidedDecodingParams(json=SCHEMAS[1]),
        )
        for s in range(8)
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    finished = [o for o in outs if o.finish_reason == "stop"]  # the others ran out of max_tokens
    print(f"{len(finished)} of {len(outs)} samples finished")
    assert finished, "no sample finished its JSON: the check below would check nothing"
    for o in finished:
        jsonschema.validate(json.loads(o.text), SCHEMAS[1])


def assert_same_or_near_tie(outs, refs):
    """Greedy tokens equal the reference's, or part at a token where the reference's top two (raw
    logprobs after the grammar's mask: what greedy compares) are within 1e-4: another batch shape
    may round differently there."""
    for o, r in zip(outs, refs):
        i = next((i for i, (a, b) in enumerate(zip(o.token_ids, r.token_ids)) if a != b), None)
        if i is None:
            assert o.token_ids == r.token_ids
            continue
        top = r.outputs[0].logprobs[i].top
        assert top[0][1] - top[1][1] < 1e-4, (i, top, o.token_ids, r.token_ids)


def test_structured_outputs_exact_under_preemption_and_speculation(model_dir, tokenizer, llm):
    prompts = [chat_prompt(tokenizer, q + " Answer in JSON.") for q in QUESTIONS] * 2
    params = [guided(json=s) for s in SCHEMAS] * 2
    for p in params:
        p.logprobs = 2
    want = llm.generate(prompts, params, use_tqdm=False)
    tight = LLM(
        str(model_dir),
        dtype="float32",
        num_kv_blocks=24,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert_same_or_near_tie(outs, want)
    spec = LLM(
        str(model_dir),
        dtype="float32",
        kv_cache_memory_gb=0.2,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    outs = spec.generate(prompts, params, use_tqdm=False)
    assert_same_or_near_tie(outs, want)
    assert spec.engine.scheduler.num_draft_tokens > 0
    for o, schema in zip(outs, SCHEMAS * 2):
        jsonschema.validate(json.loads(o.text), schema)
    for engine in (tight.engine, spec.engine, llm.engine):
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


class OpenAIPenalties:
    "transformers logits processor: OpenAI's frequency and presence penalties on generated tokens."

    def __init__(self, prompt_len: int, frequency: float, presence: float):
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_len :]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


def test_penalties_kept_across_steps_equal_transformers(model_dir, tokenizer, hf_model):
    # the counts are kept on the request and grow by each step's tokens: a penalised request
    # beside an unpenalised one, chunked and preempted (a pool too small for both), stays exact
    from transformers import LogitsProcessorList

    small = LLM(
        str(model_dir),
        dtype="float32",
        num_kv_blocks=5,
        block_size=16,
        max_num_batched_tokens=16,
    )
    prompts = [tokenizer(p).input_ids for p in ["The capital of France is", "Once upon a time"]]
    penalties = dict(frequency_penalty=0.4, presence_penalty=0.3, repetition_penalty=1.2)
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **penalties),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
    ]
    outs = small.generate(prompts, params, use_tqdm=False)
    assert small.engine.scheduler.num_preemptions > 0
    penalised = OpenAIPenalties(len(prompts[0]), 0.4, 0.3)
    processors = LogitsProcessorList([penalised])
    hf_kw = dict(repetition_penalty=1.2, logits_processor=processors)
    greedy_divergence(hf_model, prompts[0], outs[0].token_ids, None, **hf_kw)
    greedy_divergence(hf_model, prompts[1], outs[1].token_ids, None)
    assert small.engine.block_manager.num_free_blocks == 5


def test_penalties_exact_under_speculation(model_dir, tokenizer, hf_model):
    prompts = [tokenizer(p).input_ids for p in ["1, 2, 3, 4, 5,", "a b a b a b a b"]]
    spec = LLM(
        str(model_dir),
        dtype="float32",
        kv_cache_memory_gb=0.2,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4},
    )
    # below 1 it rewards repeating, so the n-gram drafts are accepted and penalised rows verified
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=0.9)
    outs = spec.generate(prompts, params, use_tqdm=False)
    for o, p in zip(outs, prompts):
        assert len(o.token_ids) == 16
        greedy_divergence(hf_model, p, o.token_ids, None, repetition_penalty=0.9)
    assert spec.engine.scheduler.num_accepted_tokens > 0


def test_bad_requests_are_refused(llm):
    bad = [
        dict(logprobs=21),
        dict(presence_penalty=3.0),
        dict(repetition_penalty=0.0),
        dict(logit_bias={5: 200.0}),
        dict(bad_words=[" "]),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="exactly one"):
        GuidedDecodingParams(json={"type": "object"}, regex="a")
    refused = [
        SamplingParams(logit_bias={10**6: 1.0}),
        guided(json={"type": "nonsense"}),
        guided(regex="(unclosed"),
        SamplingParams(min_tokens=3, guided_decoding=GuidedDecodingParams(choice=["a"])),
    ]
    for params in refused:
        with pytest.raises(ValueError):
            llm.engine.make_request("hi", params)
    assert not llm.engine.has_unfinished_requests()


# --- through the server, with the official client ---


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with minillm_serve(model_dir, log, "--dtype", "float32", "--num-kv-blocks", "400") as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_server_json_schema_and_json_mode(client):
    for schema, q in zip(SCHEMAS, QUESTIONS):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        r = client.chat.completions.create(
            model="x" and None or client.models.list().data[0].id,
            messages=ask(q),
            response_format=fmt,
            temperature=0,
            max_tokens=150,
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=ask('Reply with a JSON object with one key "answer": the capital of France.'),
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=150,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_server_streams_structured_output_with_logprobs(client):
    model = client.models.list().data[0].id
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMAS[0]}}
    ask_json = dict(
        model=model,
        messages=ask(QUESTIONS[0]),
        response_format=fmt,
        temperature=0,
        max_tokens=150,
        logprobs=True,
        top_logprobs=2,
    )
    stream = client.chat.completions.create(**ask_json, stream=True)
    text, logprobs = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs:
                logprobs += chunk.choices[0].logprobs.content
    jsonschema.validate(json.loads(text), SCHEMAS[0])
    # every generated token has its entry, the EOS that ended the output included
    assert "".join(lp.token for lp in logprobs) == text + "<|im_end|>"
    plain = client.chat.completions.create(**ask_json)
    assert plain.choices[0].message.content == text
    assert [lp.logprob for lp in plain.choices[0].logprobs.content] == pytest.approx(
        [lp.logprob for lp in logprobs], abs=1e-4
    )


def test_server_guided_fields_and_tools(client):
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=ask("Is water wet?"),
        temperature=0,
        max_tokens=10,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert r.choices[0].message.content in ("yes", "no")
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
            },
        },
    }
    clock = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 10}},
                "required": ["zone"],
            },
        },
    }
    r = client.chat.completions.create(
        model=model,
        messages=ask("What is the weather in Paris?"),
        tools=[weather, clock],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), weather["function"]["parameters"])
    r = client.chat.completions.create(
        model=model,
        messages=ask("What time is it in Tokyo?"),
        tools=[weather, clock],
        tool_choice="required",
        temperature=0,
        max_tokens=100,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    for call in r.choices[0].message.tool_calls:
        tool = {"get_weather": weather, "get_time": clock}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    stream = client.chat.completions.create(
        model=model,
        messages=ask("What is the weather in Paris?"),
        tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    args = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in stream
        if c.choices and c.choices[0].delta.tool_calls
    )
    jsonschema.validate(json.loads(args), weather["function"]["parameters"])


def test_server_completion_logprobs_and_echo(client, tokenizer, hf_model):
    model = client.models.list().data[0].id
    prompt = "The capital of France is"
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0
    )  # what lm-eval's loglikelihood sends
    lp = r.choices[0].logprobs
    ids = tokenizer(prompt).input_ids
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
    assert "".join(lp.tokens) == r.choices[0].text
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for p in range(1, len(ids)):
        assert math.isclose(lp.token_logprobs[p], float(ref[p - 1, ids[p]]), abs_tol=1e-3)
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, logprobs=2, temperature=0, stream=True, echo=True
    )
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].text for c in chunks).startswith(prompt)
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks) == len(ids) + 4


def test_server_penalties_and_bias(client, tokenizer):
    model = client.models.list().data[0].id
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    r = client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=5,
        temperature=0,
        logit_bias={str(paris): -100},
        presence_penalty=1.0,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.1},
    )
    assert "Paris" not in r.choices[0].text


REFUSED = [
    ("chat", {"response_format": {"type": "xml"}}, "response_format"),
    ("chat", {"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ("chat", {"guided_json": {"type": "nonsense"}}, None),
    ("chat", {"guided_regex": "(unclosed"}, None),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),  # vLLM's whole vocabulary
    ("chat", {"prompt_logprobs": -1}, "prompt_logprobs"),
    ("completion", {"logprobs": -1}, "logprobs"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    (
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
    ),
    ("chat", {"tool_choice": "required"}, "tool_choice"),
    ("chat", {"guided_choice": ["a"], "min_tokens": 2}, None),
    (
        "chat",
        {
            "echo": True,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
        },
        "echo",
    ),
    ("completion", {"logprobs": 2, "return_top_k_logprobs": True}, "return_top_k_logprobs"),
    ("completion", {"prompt_logprobs": 1, "prompt_logprobs_temperature": 0.0}, None),
    ("completion", {"logit_bias": {"cat": 1}}, "logit_bias"),
    ("completion", {"logit_bias": {"99999999": 1}}, None),
    ("completion", {"presence_penalty": 2.5}, None),
    ("completion", {"logprobs": 30}, None),
]


@pytest.mark.parametrize("endpoint,extra,param", REFUSED)
def test_server_refuses_bad_combinations(server, endpoint, extra, param):
    if endpoint == "chat":
        url, body = "/v1/chat/completions", {"messages": ask("hi")}
    else:
        url, body = "/v1/completions", {"prompt": "hi"}
    r = httpx.post(server + url, json={**body, **extra, "max_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"]
    if param:
        assert error["param"] == param, error


def test_server_leaks_nothing(server, client):
    model = client.models.list().data[0].id
    for _ in range(2):
        client.chat.completions.create(
            model=model,
            messages=ask("JSON please"),
            response_format={"type": "json_object"},
            max_tokens=5,
            temperature=0,
        )
    text = httpx.get(f"{server}/metrics").text
    usage = [l for l in text.splitlines() if l.startswith("minillm_kv_cache_usage")]
    assert usage and float(usage[0].split()[-1]) == 0.0, usage


# --- every field of vLLM's request models: implemented, refused by name, or inert (issue 31) ---

VLLM_FIELDS = json.loads((Path(__file__).parent / "data" / "vllm_request_fields.json").read_text())


def _asking_value(unused: tuple):
    "A value of a refused field that asks for something (so it must be refused)."
    if True in unused:
        return False
    if False in unused:
        return True
    if 0 in unused or 1.0 in unused:
        return 2
    if {} in unused or [] in unused:
        return {"x": 1}
    if "" in unused or "xgrammar" in unused:
        return "x"
    return "x"


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_every_vllm_field_is_implemented_refused_or_inert(kind):
    from minillm.server.openai_fields import field_status
    from minillm.server.protocol import INERT, UNSUPPORTED, ChatCompletionRequest, CompletionRequest

    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    tables = UNSUPPORTED, INERT
    statuses = {name: field_status(model, name, *tables)[0] for name in VLLM_FIELDS[kind]}
    assert "unknown" not in statuses.values(), statuses
    assert field_status(model, "min_characters", *tables)[0] == "unknown"


def _post(server, kind, extra, **kw):
    url = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body = {"messages": ask("hi")} if kind == "chat" else {"prompt": "hi"}
    return httpx.post(server + url, json={**body, "max_tokens": 2, **extra}, timeout=60, **kw)


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_server_refuses_every_refused_field_by_name_and_accepts_the_inert(server, kind):
    from minillm.server.openai_fields import field_status
    from minillm.server.protocol import INERT, UNSUPPORTED, ChatCompletionRequest, CompletionRequest

    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    for name in VLLM_FIELDS[kind]:
        status, _ = field_status(model, name, UNSUPPORTED, INERT)
        if status == "refused":
            r = _post(server, kind, {name: _asking_value(UNSUPPORTED[name][1])})
            assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, r.text)
            for unused in (None, *UNSUPPORTED[name][1]):
                assert _post(server, kind, {name: unused}).status_code == 200, name
        elif status == "inert":
            assert (
                _post(server, kind, {name: "x" if name != "stream_interval" else 2}).status_code
                == 200
            )
    for name in ("min_characters", "max_token", "guided_json_schema"):  # unknown, or misspelt
        r = _post(server, kind, {name: 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    r = _post(server, kind, {"stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_server_structured_outputs_and_token_ids(server, client, tokenizer):
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=ask("Is water wet?"),
        temperature=0,
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}, "return_token_ids": True},
    ).model_dump()
    choice = r["choices"][0]
    assert choice["message"]["content"] in ("yes", "no")
    assert (
        tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        == choice["message"]["content"]
    )
    assert r["prompt_token_ids"] == tokenizer.apply_chat_template(
        ask("Is water wet?"), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    r = client.completions.create(
        model=model,
        prompt="My favourite number is",
        temperature=0,
        max_tokens=8,
        extra_body={"structured_outputs": {"regex": "[0-9]{2}"}, "return_token_ids": True},
    ).model_dump()
    assert re.fullmatch("[0-9]{2}", r["choices"][0]["text"])
    assert r["choices"][0]["prompt_token_ids"] == tokenizer("My favourite number is").input_ids
    for bad in ({"choice": ["a"], "regex": "a"}, {"structural_tag": "x"}, ["a"]):
        r = _post(server, "chat", {"structured_outputs": bad})
        error = r.json()["error"]
        assert (
            r.status_code == 400 and "structured_outputs" in f"{error['param']} {error['message']}"
        )


def test_server_truncation_equals_transformers_on_the_kept_tokens(client, tokenizer, hf_model):
    model = client.models.list().data[0].id
    prompt = "Once upon a time, in a land far away, there lived a dragon who loved to read books."
    ids = tokenizer(prompt).input_ids
    for side, kept in (("left", ids[-8:]), ("right", ids[:8])):
        extra = {"truncate_prompt_tokens": 8, "truncation_side": side, "return_token_ids": True}
        r = client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=6, extra_body=extra
        ).model_dump()
        assert r["usage"]["prompt_tokens"] == 8 and r["choices"][0]["prompt_token_ids"] == kept
        assert greedy_divergence(
            hf_model, kept, r["choices"][0]["token_ids"], eos_token_ids=[]
        ) in (
            None,
            *range(6),
        )


def test_server_chat_template_arguments(server, client, tokenizer):
    model = client.models.list().data[0].id
    messages = ask("Name a colour.") + [{"role": "assistant", "content": "The colour is"}]
    extra = {
        "continue_final_message": True,
        "add_generation_prompt": False,
        "return_token_ids": True,
    }
    r = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=4, extra_body=extra
    ).model_dump()
    assert r["prompt_token_ids"] == tokenizer.apply_chat_template(
        messages, continue_final_message=True, tokenize=True, return_dict=False
    )
    r = _post(server, "chat", {"continue_final_message": True})  # with add_generation_prompt
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = _post(server, "chat", {"chat_template_kwargs": {"tools": []}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
    r = _post(server, "chat", {"chat_template_kwargs": {"add_generation_prompt": False}})
    assert r.status_code == 400 and "add_generation_prompt" in r.json()["error"]["message"]
    # request fields this model's template never reads: refused, not accepted and ignored
    assert not re.search(
        r"\b(documents|reasoning_effort|enable_thinking)\b", tokenizer.chat_template
    )
    for field, value in [("documents", [{"title": "t", "text": "x"}]), ("reasoning_effort", "low")]:
        r = _post(server, "chat", {field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    # a template variable it never reads changes nothing: accepted, as vLLM does (clients send
    # enable_thinking to every model)
    plain = _post(server, "chat", {"return_token_ids": True}).json()
    sent = {"chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True}
    thinking = _post(server, "chat", sent).json()
    assert thinking["prompt_token_ids"] == plain["prompt_token_ids"]
    r = _post(server, "chat", {"request_id": "abc123"}).json()
    assert r["id"] == "chatcmpl-abc123"


def test_server_chat_prompt_logprobs_and_token_names(client, tokenizer, hf_model):
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=ask("Hi"),
        temperature=0,
        max_tokens=2,
        logprobs=True,
        extra_body={
            "prompt_logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    ).model_dump()
    ids = r["prompt_token_ids"]
    assert r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) == len(ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for p in range(1, len(ids)):
        got = r["prompt_logprobs"][p][str(ids[p])]["logprob"]
        assert math.isclose(got, float(ref[p - 1, ids[p]]), abs_tol=1e-3)
    tokens = [e["token"] for e in r["choices"][0]["logprobs"]["content"]]
    assert tokens == [f"token_id:{t}" for t in r["choices"][0]["token_ids"]]


def test_server_text_offsets_follow_the_text_after_byte_fallback(client):
    model = client.models.list().data[0].id
    prompt = "I love 🚀 xox"
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, echo=True, logprobs=0, temperature=0
    )
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, offset in zip(lp.tokens, lp.text_offset):
        if "\ufffd" not in token:  # a whole token's text is where its offset says
            assert text[offset:].startswith(token), (token, offset, text)
    assert text[lp.text_offset[-1] :] == lp.tokens[-1] or "\ufffd" in lp.tokens[-1]


def test_server_tools_with_defs_and_a_cut_named_call(client):
    model = client.models.list().data[0].id
    person = {  # what Pydantic writes for a nested model: a local $ref into $defs
        "type": "function",
        "function": {
            "name": "add_person",
            "parameters": {
                "$defs": {
                    "Address": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 12}},
                        "required": ["city"],
                    }
                },
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "home": {"$ref": "#/$defs/Address"},
                },
                "required": ["name", "home"],
            },
        },
    }
    for choice in ("required", {"type": "function", "function": {"name": "add_person"}}):
        r = client.chat.completions.create(
            model=model,
            messages=ask("Add Ann, who lives in Rome."),
            tools=[person],
            tool_choice=choice,
            temperature=0,
            max_tokens=80,
        )
        call = r.choices[0].message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), person["function"]["parameters"])
    r = client.chat.completions.create(
        model=model,
        messages=ask("Add Ann, who lives in Rome."),
        tools=[person],
        tool_choice={"type": "function", "function": {"name": "add_person"}},
        temperature=0,
        max_tokens=3,
    )
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls


def test_server_models_version_tokenize_detokenize(server, client, tokenizer):
    model = client.models.list().data[0].id
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    assert httpx.get(f"{server}/version").json()["version"]
    r = httpx.post(f"{server}/tokenize", json={"prompt": "Hello world"}).json()
    assert r["tokens"] == tokenizer("Hello world").input_ids and r["count"] == len(r["tokens"])
    r = httpx.post(f"{server}/tokenize", json={"messages": ask("Hi")}).json()
    assert r["tokens"] == tokenizer.apply_chat_template(
        ask("Hi"), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    r = httpx.post(f"{server}/detokenize", json={"tokens": tokenizer("Hello world").input_ids})
    assert r.json()["prompt"] == "Hello world"
    for path, body in [
        ("/detokenize", {"tokens": [10**9]}),
        ("/tokenize", {"prompt": "a", "messages": ask("b")}),
        ("/tokenize", {"prompt": "a", "nonsense": 1}),
    ]:
        assert httpx.post(server + path, json=body).status_code == 400


def test_server_continuous_usage_stats(server):
    body = {
        "prompt": "Count: one, two,",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line[6:] not in ("", "[DONE]")]
    assert all("usage" in c for c in chunks)
    completions = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert completions == sorted(completions) and chunks[-1]["usage"]["completion_tokens"] == 4


def test_parallel_tool_calls_false_keeps_the_first_call():
    from types import SimpleNamespace

    from minillm.server.output_extras import OutputExtras, TokenTexts

    fields = ("return_tokens_as_token_ids", "prompt_logprobs", "return_token_ids", "top_logprobs")
    body = SimpleNamespace(parallel_tool_calls=False, logprobs=False, **dict.fromkeys(fields))
    extras = OutputExtras(body, True, "required", TokenTexts(None))
    choice, message = {"finish_reason": "stop"}, {}
    calls = '[{"name": "f", "parameters": {}}, {"name": "g", "parameters": {"x": 1}}]'
    extras._tool_calls(choice, message, calls, "stop")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["f"]
    assert choice["finish_reason"] == "tool_calls"


def test_batched_and_token_in_chats_equal_transformers(server, hf_model, tokenizer):
    "vLLM's batched chat (a list of conversations) and token-in chat: each answer is greedy-exact."
    from minillm.loader import encode_chat

    questions = ["What is 2 + 2?", "Name a fruit.", "Say hi in French."]
    body = {"messages": [ask(q) for q in questions], "max_tokens": 12, "temperature": 0}
    body["return_token_ids"] = True
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    for question, choice in zip(questions, choices):
        ids = encode_chat(tokenizer, ask(question))
        greedy_divergence(hf_model, ids, choice["token_ids"], None)
        token_in = {"messages": [], "prompt_token_ids": ids, "max_tokens": 12, "temperature": 0}
        again = httpx.post(server + "/v1/chat/completions", json=token_in, timeout=120).json()
        assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == sum(len(encode_chat(tokenizer, ask(q))) for q in questions)


def test_logprob_token_ids_are_the_top_logprobs_of_those_tokens(client):
    "vLLM's logprob_token_ids: the tokens named stand in for the top N, with the same logprobs."
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=ask("Name a fruit."), max_tokens=4, temperature=0)
    kw |= dict(logprobs=True, top_logprobs=5, extra_body={"return_tokens_as_token_ids": True})
    top = client.chat.completions.create(**kw).choices[0].logprobs.content
    wanted = [int(e.token.removeprefix("token_id:")) for e in top[0].top_logprobs][::-1]
    kw["extra_body"] |= {"logprob_token_ids": wanted}
    named = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert [e.token for e in named] == [e.token for e in top]  # the same greedy answer
    got = {int(e.token.removeprefix("token_id:")): e.logprob for e in named[0].top_logprobs}
    assert list(got) == wanted
    # the second request may hit the prefix cache: other shapes, other rounding (1.2e-5 seen)
    for e in top[0].top_logprobs:
        assert got[int(e.token.removeprefix("token_id:"))] == pytest.approx(e.logprob, abs=1e-4)
