"The engine against transformers' greedy generate: batching, chunking, preemption, prefix caching."

import pytest
from helpers import hf_greedy

from minillm.engine.llm_engine import LLMEngine
from minillm.llm import LLM
from minillm.loader import encode_chat
from minillm.sampling import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Hi",
    "Write a limerick about a cat who loves the sea and the sun.",
    "List three prime numbers.",
    "Why is the sky blue? Answer briefly.",
    "Translate 'thank you' into Spanish.",
]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def references(prompts, hf_model, eos_ids):
    return [hf_greedy(hf_model, p, MAX_TOKENS, eos_ids) for p in prompts]


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def check(llm, prompts, references):
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    for o, ref in zip(outs, references):
        assert o.finish_reason == (
            "length"
            if len(ref) == MAX_TOKENS and ref[-1] not in llm.engine.eos_token_ids
            else "stop"
        )
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests  # nothing leaks
    return outs


def test_defaults(model_dir, prompts, references):
    outs = check(LLM(str(model_dir)), prompts, references)
    assert "Paris" in outs[0].text and outs[0].metrics.ttft > 0


def test_preemption(model_dir, prompts, references):
    llm = LLM(
        str(model_dir), num_kv_blocks=8, block_size=16
    )  # 6 prompts of 30-45 tokens need far more
    check(llm, prompts, references)
    assert llm.engine.scheduler.num_preemptions > 0


def test_every_prompt_chunked(model_dir, prompts, references):
    llm = LLM(str(model_dir), max_num_batched_tokens=7)
    check(llm, prompts, references)


def test_prefix_cache_hits(model_dir, prompts, references):
    llm = LLM(str(model_dir))
    first = check(llm, prompts, references)  # the chat template's system prompt is shared
    outs = check(
        llm, prompts[:2] * 2, references[:2] * 2
    )  # and the same prompts again, twice in one call
    # the first call cached every full block of these prompts: each request now finds all of them
    # except a block that holds its last token, which must be computed
    assert [o.num_cached_tokens for o in outs] == [(len(p) - 1) // 16 * 16 for p in prompts[:2] * 2]
    # the hit rate is prompt tokens found over prompt tokens looked up, each request counted once
    bm = llm.engine.block_manager
    assert bm.queries == sum(map(len, prompts)) + sum(map(len, prompts[:2] * 2))
    assert bm.hits == sum(o.num_cached_tokens for o in first + outs) > 0


def test_prefix_lookups_count_once_per_request(model_dir, prompts):
    """A prompt that waits for blocks looks its prefix up every iteration, and a preempted one
    looks up its own blocks again: the hit rate counts neither."""
    llm = LLM(str(model_dir), num_kv_blocks=8, block_size=16, max_num_seqs=6)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    bm = llm.engine.block_manager
    assert llm.engine.scheduler.num_preemptions > 0
    assert bm.queries == sum(map(len, prompts))
    assert len(outs) == len(prompts) and bm.hits <= sum((len(p) - 1) // 16 * 16 for p in prompts)


def test_everything_at_once(model_dir, prompts, references):
    llm = LLM(
        str(model_dir), num_kv_blocks=10, max_num_batched_tokens=20, max_num_seqs=3, block_size=8
    )
    check(llm, prompts + prompts[:3], references + references[:3])
    assert llm.engine.scheduler.num_preemptions > 0


def test_seeded_sampling_is_independent_of_the_batch(model_dir, prompts):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    llm = LLM(str(model_dir))
    alone = llm.generate([prompts[0]], seeded, use_tqdm=False)[0].token_ids
    crowded = llm.generate(
        prompts, [seeded] + [SamplingParams(temperature=1.0, max_tokens=12)] * 5, use_tqdm=False
    )[0].token_ids
    squeezed = (
        LLM(str(model_dir), num_kv_blocks=6, max_num_batched_tokens=9)
        .generate(
            prompts[:4],
            [seeded] + [SamplingParams(temperature=0.5, max_tokens=12)] * 3,
            use_tqdm=False,
        )[0]
        .token_ids
    )
    assert alone == crowded == squeezed


def test_n_samples(model_dir, prompts):
    out = LLM(str(model_dir)).generate(
        prompts[1], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8), use_tqdm=False
    )[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and len(
        {tuple(c.token_ids) for c in out.outputs}
    ) > 1


def test_abort_frees_blocks(model_dir, prompts):
    engine = LLMEngine(model=str(model_dir))
    reqs = [engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in prompts]
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    for r in reqs[::2]:
        engine.abort_request(r.request_id)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert [r.finish_reason for r in reqs] == ["abort", "length"] * 3


def test_streaming_deltas_add_up(model_dir):
    engine = LLMEngine(model=str(model_dir))
    req = engine.add_request(
        "Once upon a time", SamplingParams(temperature=0, max_tokens=20, stop=["."])
    )
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [o.delta_text for o in engine.step() if o.request_id == req.request_id]
    assert "".join(deltas) == req.stream.text and req.finished


def test_the_first_output_says_so_after_the_engine_runs_on(model_dir):
    # a streaming server reads an output while the engine thread steps on and the request's
    # token_times grows: whether the output was the first must not be read from that list
    engine = LLMEngine(model=str(model_dir))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    req = engine.add_request([1, 2, 3, 4], params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == req.request_id]
    with_tokens = [o for o in outputs if o.delta_token_ids]
    assert len(with_tokens[0].token_times) == 6  # the live list, grown since
    assert [o.first_output for o in with_tokens] == [True] + [False] * (len(with_tokens) - 1)
    assert with_tokens[0].prompt_token_ids == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "prompt, params, match",
    [
        ("", None, "empty"),
        ([1, 2, -5], None, r"token ids must be in"),
        (3.5, None, "a prompt is a string"),
        ([1] * 9000, None, "maximum context length"),
        ("hi", SamplingParams(n=2), "one sample per request"),
    ],
)
def test_bad_requests_are_refused(model_dir, prompt, params, match):
    engine = LLMEngine(model=str(model_dir), num_kv_blocks=16)
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished_requests() and engine.block_manager.num_free_blocks == 16


def test_request_too_big_for_the_pool(model_dir):
    engine = LLMEngine(model=str(model_dir), num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request([5] * 60, SamplingParams(max_tokens=30))


POISON = 4242  # a token id that makes the (wrapped) model raise, as a bug or a device error might
POISONED_PROMPTS = [[5, 6, 7, 8] * 5, [9, POISON, 11], [12, 13] * 20, [POISON] * 3]


def poison(llm):
    "Make `llm`'s model raise for every batch that holds the POISON token."
    runner = llm.engine.runner
    forward = runner.forward  # every step's one way to the model, op by op or in one call (13b)

    def poisoned(batch):
        if (batch.input_ids == POISON).any():
            raise RuntimeError("poisoned batch")
        return forward(batch)

    runner.forward = poisoned


def assert_poison_fails_alone(llm, hf):
    """POISONED_PROMPTS through `llm`: the requests with the poison fail, each alone; the others
    get their exact tokens; nothing is left held."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = llm.generate(POISONED_PROMPTS, params, use_tqdm=False)
    for p, o in zip(POISONED_PROMPTS, outs):
        if POISON in p:
            assert o.finish_reason == "error" and "poisoned batch" in o.error and o.finished
        else:
            assert o.finish_reason == "length" and o.token_ids == hf_greedy(hf, p, 10)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests


def test_a_failing_request_fails_alone(random_llama):
    """A forward pass that raises for one request's tokens fails that request only; the others get
    their exact tokens."""
    path, hf = random_llama
    llm = LLM(str(path), max_num_batched_tokens=64)
    poison(llm)
    assert_poison_fails_alone(llm, hf)


def test_seeds_and_global_rng(random_llama):
    "Seeded requests reproduce across engines; the engine never touches torch's global RNG."
    import torch

    path, _ = random_llama
    state = torch.random.get_rng_state()
    p = SamplingParams(temperature=1.0, max_tokens=8, seed=2**64 - 1, n=3, ignore_eos=True)
    a = LLM(str(path)).generate([[1, 2, 3]], p, use_tqdm=False)[0]
    b = LLM(str(path), seed=7).generate([[1, 2, 3]], p, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert (
        len({tuple(c.token_ids) for c in a.outputs}) > 1
    )  # seeds seed, seed+1, seed+2 (mod 2**64) differ
    assert torch.equal(torch.random.get_rng_state(), state)
