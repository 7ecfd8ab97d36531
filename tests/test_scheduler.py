"""Scheduler properties on random workloads, with a stand-in model.

The stand-in computes each next token from the KV cache's contents: a wrong block, a stale prefix
hit, a missed recomputation or a rejected draft token counted as computed changes the output."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention.input_batch import build_flat_batch
from minillm.core.block_manager import BlockManager
from minillm.core.request import Request, RequestStatus
from minillm.core.scheduler import Scheduler
from minillm.sampling import SamplingParams
from minillm.spec_decode.rejection_sampler import greedy_accept
from minillm.utils import cdiv

BS = 4
PIECES = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9]]


def next_token(kv: tuple) -> int:
    return hash(kv) % 50 + 10


def reference(prompt, max_tokens):
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tuple(kv_of(tokens, p) for p in range(len(tokens)))))
    return tokens[len(prompt) :]


def kv_of(tokens, p) -> int:
    "The stand-in K/V of position p: like real K/V, it depends on every token up to p."
    return hash(tuple(tokens[: p + 1])) % 2**40


class KVEchoModel:
    """Writes each new token's stand-in K/V into its slot; samples from what the cache holds for the
    whole sequence, and verifies draft tokens greedily against what it would have sampled."""

    def __init__(self, num_blocks):
        self.slots = torch.full((num_blocks * BS,), -1)

    def run(self, out):
        batch = build_flat_batch(out.requests, out.num_tokens, BS)
        self.slots[batch.metadata.slot_mapping] = torch.tensor(
            [
                kv_of(r.token_ids + r.spec_token_ids, p)
                for r, n in zip(out.requests, out.num_tokens)
                for p in range(r.num_computed_tokens, r.num_computed_tokens + n)
            ]
        )
        sampled = []
        for req, n, samples in zip(out.requests, out.num_tokens, out.samples):
            if not samples:
                sampled.append([])
                continue
            target = []
            for last in range(len(req.token_ids) - 1, req.num_computed_tokens + n):
                pos = torch.arange(last + 1)
                seen = self.slots[torch.tensor(req.block_table)[pos // BS] * BS + pos % BS]
                target.append(next_token(tuple(seen.tolist())))
            sampled.append(greedy_accept(target, req.spec_token_ids))
        return sampled


def guessing_proposer(seed: int, wrong: float = 0.3):
    "Drafts that continue the reference, each replaced by a random token with probability `wrong`."
    rng = random.Random(seed)

    def propose(out):
        drafts = []
        for req, n in zip(out.requests, out.num_tokens):
            tokens, guess = list(req.token_ids), []
            for _ in range(max(0, req.num_computed_tokens + n - len(req.token_ids))):
                t = next_token(tuple(kv_of(tokens, p) for p in range(len(tokens))))
                guess.append(rng.randint(10, 59) if rng.random() < wrong else t)
                tokens.append(guess[-1])
            drafts.append(guess)
        return drafts

    return propose


def run(sched, requests, arrivals, max_iters=20_000, propose=None):
    model = KVEchoModel(sched.bm.num_blocks)
    pending, it = sorted(zip(arrivals, range(len(requests))), reverse=True), 0
    while pending or sched.num_unfinished:
        while pending and pending[-1][0] <= it:
            sched.add(requests[pending.pop()[1]])
        it += 1
        assert it < max_iters, "the workload never finished"
        out = sched.schedule()
        assert (
            out.total_tokens <= sched.max_num_batched_tokens
            and len(out.requests) <= sched.max_num_seqs
        )
        assert len(set(map(id, out.requests))) == len(out.requests)
        if out.is_empty:
            continue
        if propose is not None:
            sched.set_drafts(out, propose(out))
        sched.update(out, model.run(out))
        for r in out.requests:
            if len(r.output_ids) >= r.max_tokens:
                sched.finish(r, "length")
    return it


def make(i, prompt, max_tokens):
    return Request(
        seq_id=i,
        token_ids=list(prompt),
        request_id=str(i),
        max_tokens=max_tokens,
        params=SamplingParams(temperature=0, max_tokens=max_tokens),
    )


workloads = st.lists(
    st.tuples(
        st.lists(st.sampled_from(range(len(PIECES))), max_size=4),  # shared pieces
        st.lists(st.integers(10, 60), max_size=9),  # own tail
        st.integers(1, 20),  # max_tokens
        st.integers(0, 12),
    ),  # arrival iteration
    min_size=1,
    max_size=10,
)


@given(
    work=workloads,
    extra_blocks=st.integers(0, 30),
    budget=st.integers(1, 48),
    max_seqs=st.integers(1, 8),
    caching=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_random_workloads(work, extra_blocks, budget, max_seqs, caching):
    check_workload(work, extra_blocks, budget, max_seqs, caching)


def check_workload(work, extra_blocks, budget, max_seqs, caching, k=0, propose=None) -> Scheduler:
    "Run a random workload; every request must end with the reference tokens, no block leaked."
    prompts = [[t for p in pieces for t in PIECES[p]] + tail or [7] for pieces, tail, _, _ in work]
    lengths = [len(p) + m for p, (_, _, m, _) in zip(prompts, work)]
    bm = BlockManager(
        max(cdiv(n, BS) for n in lengths) + extra_blocks, BS, enable_prefix_caching=caching
    )
    sched = Scheduler(bm, max_seqs, budget, num_speculative_tokens=k)
    requests = [make(i, p, m) for i, (p, (_, _, m, _)) in enumerate(zip(prompts, work))]
    run(sched, requests, [a for *_, a in work], propose=propose)
    assert all(r.status == RequestStatus.FINISHED and r.finish_reason == "length" for r in requests)
    assert bm.num_free_blocks == bm.num_blocks  # no block leaks
    for r, p in zip(requests, prompts):  # same tokens as alone, with room to spare
        assert r.output_ids == reference(p, r.max_tokens) and not r.spec_token_ids
    return sched


@given(
    work=workloads,
    extra_blocks=st.integers(0, 30),
    budget=st.integers(1, 48),
    max_seqs=st.integers(1, 8),
    caching=st.booleans(),
    k=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_random_workloads_with_draft_tokens(work, extra_blocks, budget, max_seqs, caching, k, seed):
    "Speculative decoding (chapter 12): rejected drafts roll back exactly, whatever the schedule."
    sched = check_workload(
        work, extra_blocks, budget, max_seqs, caching, k, guessing_proposer(seed)
    )
    assert 0 <= sched.num_accepted_tokens <= sched.num_draft_tokens


def test_preemption_happens_and_is_exact():
    prompts = [[10 + i] * 9 for i in range(6)]
    bm = BlockManager(8, BS)
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=64)
    requests = [make(i, p, 12) for i, p in enumerate(prompts)]
    run(sched, requests, [0] * 6)
    assert sched.num_preemptions > 0 and bm.num_free_blocks == 8
    assert [r.output_ids for r in requests] == [reference(p, 12) for p in prompts]


def test_chunked_prefill_respects_budget():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=4, max_num_batched_tokens=5)
    req = make(0, list(range(20, 43)), 3)
    sched.add(req)
    chunks = []
    while not req.output_ids:
        out = sched.schedule()
        chunks.append(out.num_tokens[0])
        sched.update(out, [[99] if s else [] for s in out.samples])
    assert chunks == [5, 5, 5, 5, 3]


def test_decodes_go_first():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=4, max_num_batched_tokens=8)
    a, b = make(0, [1, 2, 3], 5), make(1, list(range(30, 50)), 5)
    sched.add(a)
    out = sched.schedule()
    sched.update(out, [[7]])  # a has prefilled and decodes now
    sched.add(b)
    out = sched.schedule()
    assert out.requests == [a, b] and out.num_tokens == [1, 7]  # a's decode, then b's chunk


def test_abort_frees_everything():
    bm = BlockManager(32, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16)
    reqs = [make(i, list(range(10, 30)), 10) for i in range(3)]
    for r in reqs:
        sched.add(r)
    out = sched.schedule()
    sched.update(out, [[1] if s else [] for s in out.samples])
    for r in reqs:
        sched.finish(r, "abort")
    assert bm.num_free_blocks == 32 and not sched.num_unfinished
    assert all(r.finish_reason == "abort" for r in reqs)


def test_impossible_request_is_refused():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=4, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="needs up to 5 KV blocks"):
        sched.add(make(0, list(range(16)), 4))
