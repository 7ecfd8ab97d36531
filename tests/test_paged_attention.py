"Paged attention against contiguous attention, and the model on a paged cache against transformers."

import pytest
import torch
from helpers import hf_greedy

from minillm.attention.input_batch import build_flat_batch
from minillm.attention.paged import PagedAttention
from minillm.core.block_manager import BlockManager, Sequence
from minillm.core.kv_cache import PagedKVCache
from minillm.course.paged import advance, forward_flat, random_paged_batch
from minillm.loader import encode_chat
from minillm.models.decoder import causal_attention, load_model


@pytest.mark.parametrize(
    "cases",
    [
        [(0, 37), (45, 20), (64, 1)],  # prefill, chunk after a cached prefix, one decode
        [
            (15, 1),
            (16, 1),
            (17, 1),
            (0, 1),
            (100, 1),
        ],  # decodes only, around block boundaries (batched path)
        [(0, 5), (31, 1), (32, 1), (8, 9)],  # mixed
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 1)])
def test_paged_equals_contiguous(cases, heads):
    H, Hkv = heads
    pool, batch, q, k, v, full = random_paged_batch(cases, H, Hkv, 16, block_size=16)
    out = PagedAttention(pool, batch.metadata)(0, q, k, v)
    cu = batch.metadata.cu_seqlens_q.tolist()
    for i, ((fk, fv), (cached, new)) in enumerate(zip(full, cases)):
        ref = causal_attention(q[None, cu[i] : cu[i + 1]], fk[None], fv[None], cached)[0]
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], ref, atol=1e-5, rtol=1e-5)


def test_flat_batch_layout():
    bm = BlockManager(8, 4)
    a, b = Sequence(0, [10, 11, 12, 13, 14, 15]), Sequence(1, [20, 21, 22])
    bm.allocate(a, 6)
    bm.allocate(b, 3)
    a.num_computed_tokens = 4
    batch = build_flat_batch([a, b], [2, 3], 4)
    assert batch.input_ids.tolist() == [14, 15, 20, 21, 22]
    assert batch.positions.tolist() == [4, 5, 0, 1, 2]
    assert batch.metadata.cu_seqlens_q.tolist() == [
        0,
        2,
        5,
    ] and batch.metadata.context_lens.tolist() == [6, 3]
    assert batch.metadata.slot_mapping.tolist() == [
        a.block_table[1] * 4,
        a.block_table[1] * 4 + 1,
    ] + [b.block_table[0] * 4 + i for i in range(3)]
    assert batch.logits_indices.tolist() == [1, 4]


def test_flat_batch_refuses_a_sequence_without_its_blocks_or_tokens():
    "Each of the three conditions names the sequence that breaks it, wherever it is in the batch."
    bm = BlockManager(8, 4)
    seqs = [Sequence(i, list(range(10 * i, 10 * i + 5))) for i in range(3)]
    for s in seqs:
        bm.allocate(s, 4)  # one block: the fifth token has none
    build_flat_batch(seqs, [4, 4, 4], 4)  # the first four tokens fit
    with pytest.raises(ValueError, match=r"sequence 1: tokens \[0, 5\)"):
        build_flat_batch(seqs, [4, 5, 4], 4)
    with pytest.raises(ValueError, match=r"sequence 2: tokens \[0, 0\)"):
        build_flat_batch(seqs, [4, 4, 0], 4)
    bm.allocate(seqs[0], 8)  # room for drafts after its five tokens, but none drafted
    seqs[0].num_computed_tokens = 4
    with pytest.raises(ValueError, match=r"sequence 0: tokens \[4, 6\)"):
        build_flat_batch(seqs, [2, 4, 4], 4)
    seqs[0].spec_token_ids = [7]
    assert build_flat_batch(seqs, [2, 4, 4], 4).input_ids.tolist()[:2] == [4, 7]


def test_model_on_paged_cache_equals_transformers(model_dir, tokenizer, hf_model):
    """Prompts of different lengths prefilled in one flat batch, decoded together; prefix hits on a
    second round."""
    model = load_model(model_dir)
    questions = [
        "What is 2+2?",
        "Tell me a fun fact about octopuses.",
        "Hi",
        "Translate 'good morning' to French.",
    ]
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    refs = [hf_greedy(hf_model, p, 10) for p in prompts]
    bm = BlockManager(64, 16)
    cache = PagedKVCache.for_model(model.config, 64, 16)
    for round_ in range(2):  # the second round hits the prefix cache
        seqs = [Sequence(i, list(p)) for i, p in enumerate(prompts)]
        hits = [bm.match_prefix(s) for s in seqs]
        for s, hit in zip(seqs, hits):
            s.num_computed_tokens = hit
        assert (sum(hits) > 0) == (round_ == 1)
        for s in seqs:
            bm.allocate(s, len(s) - s.num_computed_tokens)
        new = [len(s) - s.num_computed_tokens for s in seqs]
        logits = forward_flat(model, cache, seqs, new)
        advance(seqs, new)
        for _ in range(9):
            for s, t in zip(seqs, logits.argmax(-1).tolist()):
                s.token_ids.append(t)
                bm.cache_blocks(s)
                bm.allocate(s, 1)
            logits = forward_flat(model, cache, seqs, [1] * len(seqs))
            advance(seqs, [1] * len(seqs))
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.token_ids.append(t)
        assert [s.token_ids[len(p) :] for s, p in zip(seqs, prompts)] == refs
        for s in seqs:
            bm.cache_blocks(s)
            bm.free(s)
        assert bm.num_free_blocks == bm.num_blocks
