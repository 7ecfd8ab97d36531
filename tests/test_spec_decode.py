"""Speculative decoding (chapter 12) on a random Llama: greedy tokens with drafts equal
transformers' (a divergence only at a near-tie: the verification pass computes k + 1 positions in
one batch), for both proposers, under chunked prefill, prefix caching and preemption; stop
conditions inside accepted drafts; max_tokens exact; seeded sampling reproducible; a rejection
sampler whose output follows the target distribution; bad configurations refused; nothing leaks.
"""

import pytest
import torch
from helpers import assert_equal_except_near_ties

from minillm.attention.input_batch import SampleRows
from minillm.core.block_manager import Sequence
from minillm.engine.sampler import SamplerOutput
from minillm.engine.stats import engine_stats
from minillm.llm import LLM
from minillm.sampling import SamplingParams
from minillm.server.metrics import ServerMetrics
from minillm.spec_decode.proposers import ngram_draft, truncated_model_dir
from minillm.spec_decode.rejection_sampler import greedy_accept, rejection_sample, verify_drafts

STEPS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def prompts(n: int = 6) -> list[list[int]]:
    "Repetitive prompts of 20-60 tokens (prompt lookup finds matches), four with a 32-token prefix."
    prefix = [(i % 7) + 10 for i in range(32)]
    return [
        (prefix if i < 4 else []) + [(j % (3 + i)) + 20 * i + 40 for j in range(20 + 7 * i)]
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def draft_dir(random_llama, tmp_path_factory):
    path, _ = random_llama
    return truncated_model_dir(path, tmp_path_factory.mktemp("draft"), 1)


def spec_configs(draft_dir):
    return {"ngram": NGRAM, "draft": {"model": str(draft_dir), "num_speculative_tokens": 3}}


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_tokens_equal_transformers(random_llama, draft_dir, method):
    "Chunked prefill (a 24-token budget), a shared prefix, preemption (10 blocks of 16)."
    path, hf = random_llama
    llm = LLM(
        str(path),
        dtype="float32",
        speculative_config=spec_configs(draft_dir)[method],
        max_num_batched_tokens=24,
        num_kv_blocks=10,
    )
    ps = prompts()
    outs = llm.generate(ps, GREEDY, use_tqdm=False)
    assert_equal_except_near_ties(outs, hf, ps, STEPS)
    assert all(len(o.token_ids) == STEPS for o in outs)
    assert llm.engine.scheduler.num_preemptions > 0
    drafts = sum(o.num_draft_tokens for o in outs)
    accepted = sum(o.num_accepted_tokens for o in outs)
    print(f"{method}: {accepted} of {drafts} drafts accepted")
    assert 0 < accepted <= drafts
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests
    again = llm.generate(ps[:4], GREEDY, use_tqdm=False)  # prefix-cache hits, drafts again
    assert any(o.num_cached_tokens >= 32 for o in again)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[:4]]


def test_the_draft_models_pool_is_in_the_kv_budget(random_llama, draft_dir):
    "Both pools, the target's and the draft's (as many blocks), fit kv_cache_memory_gb together."
    path, _ = random_llama
    budget = 0.01
    plain = LLM(str(path), kv_cache_memory_gb=budget).engine.runner.cache
    llm = LLM(
        str(path), kv_cache_memory_gb=budget, speculative_config=spec_configs(draft_dir)["draft"]
    )
    target, draft = llm.engine.runner.cache, llm.engine.proposer.cache
    assert draft.num_blocks == target.num_blocks < plain.num_blocks
    assert (
        target.nbytes + draft.nbytes
        <= budget * 2**30
        < target.nbytes + draft.nbytes + (target.nbytes + draft.nbytes) / target.num_blocks
    )


def test_same_tokens_with_and_without_speculation(random_llama):
    path, hf = random_llama
    ps = prompts(3)
    plain = LLM(str(path), dtype="float32").generate(ps, GREEDY, use_tqdm=False)
    spec = LLM(str(path), dtype="float32", speculative_config=NGRAM)
    outs = spec.generate(ps, GREEDY, use_tqdm=False)
    for o, p in zip(outs, plain):
        if o.token_ids != p.token_ids:  # allowed only where transformers' logits nearly tie
            assert_equal_except_near_ties([o], hf, [ps[plain.index(p)]], STEPS)


def test_stop_inside_accepted_drafts_and_max_tokens(random_llama):
    path, _ = random_llama
    ps = prompts(3)
    plain = LLM(str(path), dtype="float32").generate(ps, GREEDY, use_tqdm=False)
    spec = LLM(str(path), dtype="float32", speculative_config=NGRAM)
    for p, ref in zip(ps, plain):
        stop = ref.token_ids[STEPS // 2]  # a token in the middle of the reference output
        params = SamplingParams(temperature=0, max_tokens=STEPS, stop_token_ids=[stop])
        out = spec.generate([p], params, use_tqdm=False)[0]
        first = ref.token_ids.index(stop)
        assert out.token_ids == ref.token_ids[: first + 1] and out.finish_reason == "stop"
        for limit in (1, 2, 5):
            short = SamplingParams(temperature=0, max_tokens=limit, ignore_eos=True)
            out = spec.generate([p], short, use_tqdm=False)[0]
            assert out.token_ids == ref.token_ids[:limit] and out.finish_reason == "length"
    bm = spec.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_seeded_sampling_reproduces(random_llama, draft_dir):
    path, _ = random_llama
    for config in spec_configs(draft_dir).values():
        llm = LLM(str(path), dtype="float32", speculative_config=config)
        params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=STEPS, seed=7)
        runs = [llm.generate(prompts(3), params, use_tqdm=False) for _ in range(2)]
        assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
        assert all(len(o.token_ids) >= 1 for o in runs[0])


def test_rejection_sampling_follows_the_target_distribution():
    "The first token of a step, over many seeded draws, has the target's law whatever the draft."
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    second = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.6])
    probs = torch.stack([p, second, p])
    n = 30_000
    for draft in ([0, 4], [2, 4], [4, 0]):
        first = torch.zeros(5)
        for _ in range(n):
            first[rejection_sample(probs, draft, gen)[0]] += 1
        assert (first / n - p).abs().max() < 0.015  # about five standard errors
    assert greedy_accept([1, 2, 3], [1, 2]) == [1, 2, 3] and greedy_accept([1, 5], [2]) == [1]


def test_batched_greedy_verification_is_greedy_accept_per_request():
    """verify_drafts checks every greedy request at once on the device; each row of its output
    is `greedy_accept` of the request's own drafts and target tokens."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        seqs, rows = [], []
        for i in range(int(torch.randint(1, 6, (), generator=gen))):
            k = int(torch.randint(0, 5, (), generator=gen))
            drafts = torch.randint(0, 4, (k,), generator=gen).tolist()  # a small vocabulary: hits
            seqs.append(Sequence(i, [1, 2, 3], spec_token_ids=drafts))
            rows.append(i)
        num_logits = [1 + len(s.spec_token_ids) for s in seqs]
        sampled = SampleRows.of(seqs, rows, num_logits)
        logits = torch.randn(sum(num_logits), 4, generator=gen)
        for s in seqs:
            s.params = SamplingParams(temperature=0)
        got = SamplerOutput(verify_drafts(logits[sampled.picked], sampled)).tolist()
        target = logits[sampled.picked].argmax(-1).tolist()
        want = [
            greedy_accept(target[sp.start : sp.stop], s.spec_token_ids)
            for s, sp in zip(seqs, sampled.spans)
        ]
        assert got == want, trial


def test_ngram_draft():
    assert ngram_draft([1, 2, 3, 9, 1, 2], 3, 2) == [3, 9, 1]
    assert ngram_draft([1, 2, 3, 1, 2, 7, 1, 2], 2, 2) == [7, 1]  # the latest occurrence
    assert ngram_draft([5, 6, 7], 3, 3) == [] and ngram_draft([4], 2, 2) == []


def test_bad_configs_are_refused(random_llama, tmp_path):
    path, _ = random_llama
    bad = [
        ({"method": "medusa", "num_speculative_tokens": 2}, "needs 'method'"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, r"\[1, 16\]"),
        ({**NGRAM, "prompt_lookup_min": 5}, "prompt_lookup_min <= prompt_lookup_max"),
        ({**NGRAM, "draft_tokens": 2}, "does not take"),
        ({"model": str(tmp_path / "none"), "num_speculative_tokens": 2}, "does not exist"),
    ]
    for config, message in bad:
        with pytest.raises(ValueError, match=message):
            LLM(str(path), dtype="float32", speculative_config=config)


def test_abort_and_metrics(random_llama):
    path, _ = random_llama
    llm = LLM(str(path), dtype="float32", speculative_config=NGRAM)
    engine, metrics = llm.engine, ServerMetrics()
    for i, p in enumerate(prompts(4)):
        engine.add_request(p, GREEDY, request_id=str(i))

    def step():
        outputs = engine.step()
        metrics.on_step(engine_stats(engine), outputs)

    for _ in range(6):
        step()
    engine.abort_request("0")
    while engine.has_unfinished_requests():
        step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    text = metrics.render().decode()
    drafts = engine.scheduler.num_draft_tokens
    assert drafts > 0 and f"minillm_spec_decode_num_draft_tokens_total {float(drafts)}" in text


def test_a_draft_identical_to_the_target_is_always_accepted(random_llama, tmp_path):
    "The draft model's cache, positions and catch-up are right: the target as its own draft."
    path, _ = random_llama
    itself = truncated_model_dir(path, tmp_path / "itself", 2)  # all of its layers
    llm = LLM(
        str(path),
        dtype="float32",
        speculative_config={"model": str(itself), "num_speculative_tokens": 3},
        max_num_batched_tokens=24,
    )
    outs = llm.generate(prompts(4), GREEDY, use_tqdm=False)
    drafts = sum(o.num_draft_tokens for o in outs)
    accepted = sum(o.num_accepted_tokens for o in outs)
    assert drafts > 0 and accepted >= 0.9 * drafts  # only a near-tie could reject one
