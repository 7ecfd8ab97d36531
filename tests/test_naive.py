"The naive loop against transformers' greedy generate on the default model."

import pytest
from helpers import hf_greedy

from minillm.course.naive import generate
from minillm.loader import encode_chat
from minillm.sampling import SamplingParams

PLAIN = ["The quick brown fox", "def fibonacci(n):", "1, 2, 3, 4,"]
CHAT = ["What is the capital of France?", "Write a haiku about the sea."]


def prompts(tokenizer):
    return [tokenizer(p).input_ids for p in PLAIN] + [
        encode_chat(tokenizer, [{"role": "user", "content": c}]) for c in CHAT
    ]


def test_greedy_equals_transformers(hf_model, tokenizer, eos_ids):
    for ids in prompts(tokenizer):
        ours = generate(
            hf_model, tokenizer, ids, SamplingParams(temperature=0, max_tokens=20), eos_ids
        )
        ref = hf_greedy(hf_model, ids, 20, eos_ids)
        assert ours.token_ids == ref, tokenizer.decode(ids)
        assert ours.finish_reason == ("stop" if ref[-1] in eos_ids else "length")


def test_chat_answer(hf_model, tokenizer, eos_ids):
    ids = encode_chat(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    out = generate(hf_model, tokenizer, ids, SamplingParams(temperature=0, max_tokens=30), eos_ids)
    assert "Paris" in out.text and out.finish_reason == "stop"


def test_seeded_sampling_reproduces(hf_model, tokenizer):
    ids = tokenizer("Once upon a time").input_ids

    def p(seed):
        return SamplingParams(temperature=1.0, seed=seed, max_tokens=12, ignore_eos=True)

    a, b, c = (generate(hf_model, tokenizer, ids, p(s)).token_ids for s in (3, 3, 4))
    assert a == b and a != c


def test_stop_string_ends_generation(hf_model, tokenizer):
    ids = tokenizer("1, 2, 3, 4,").input_ids
    out = generate(
        hf_model, tokenizer, ids, SamplingParams(temperature=0, max_tokens=30, stop=["7"])
    )
    assert out.finish_reason == "stop" and "7" not in out.text and out.text.strip().startswith("5")


def test_prompt_too_long(hf_model, tokenizer):
    with pytest.raises(ValueError, match="context"):
        generate(
            hf_model, tokenizer, [1] * hf_model.config.max_position_embeddings, SamplingParams()
        )
