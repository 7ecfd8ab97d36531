"""Chapter 8b's Triton kernels against chapter 4's torch reference.

On CPU under TRITON_INTERPRET=1 (set by conftest.py), on a GPU as compiled kernels. Shapes are
small so the interpreter stays fast."""

from dataclasses import replace

import pytest
import torch
from helpers import hf_greedy

from minillm import LLM, SamplingParams
from minillm.attention.paged import PagedAttention
from minillm.core.kv_cache import PagedKVCache
from minillm.course.paged import random_paged_batch
from minillm.kernels.triton_attention import (
    TRITON_ATTENTION,
    paged_attention_triton,
    plan_triton_attention,
    store_kv,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def lengths_around(block_size):
    return [1, block_size - 1, block_size, block_size + 1, 300]


def compare(cases, H, Hkv, D, block_size, dtype=torch.float32, num_splits=None, window=None):
    """Triton and torch attention over the same pool; the reference runs in float32 on the same
    (rounded) values. `window`: a sliding-window layer's (chapter 15)."""
    pool, batch, q, k, v, _ = random_paged_batch(cases, H, Hkv, D, block_size, dtype=dtype)
    md = replace(batch.metadata, sliding_window=window)
    ref_pool = PagedKVCache(1, pool.k.shape[1], block_size, Hkv, D)
    ref_pool.k.copy_(pool.k)
    ref_pool.v.copy_(pool.v)
    ref_pool.sliding_windows = [window]
    expected = PagedAttention(ref_pool, batch.metadata)(0, q.float(), k.float(), v.float())
    if DEVICE == "cuda":
        pool.k, pool.v, q, k, v = (x.cuda() for x in (pool.k, pool.v, q, k, v))
        md = type(md)(**{f: (x.cuda() if torch.is_tensor(x) else x) for f, x in vars(md).items()})
    store_kv(pool, 0, k, v, md.slot_mapping)
    out = paged_attention_triton(pool, 0, q, plan_triton_attention(pool, md, num_splits))
    assert out.dtype == dtype
    torch.testing.assert_close(
        out.float().cpu(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


SHAPES = [(D, group, bs) for D in (64, 128) for group in (1, 3, 4, 8) for bs in (16, 32)]
SHAPES += [(256, 4, 16)]  # Gemma 3's head_dim: the smallest tiles of the table


@pytest.mark.parametrize("D,group,block_size", SHAPES)
def test_decode(D, group, block_size):
    "Every context length around a block boundary, with and without split-K."
    cases = [(n - 1, 1) for n in lengths_around(block_size)]
    for num_splits in (1, 4):
        compare(cases, 2 * group, 2, D, block_size, num_splits=num_splits)


@pytest.mark.parametrize("D,group,block_size", SHAPES)
def test_prefill_with_cached_prefix(D, group, block_size):
    """Fresh prompts of every length, and chunks after a cached prefix that ends on, before and
    after a boundary."""
    fresh = [(0, n) for n in lengths_around(block_size)]
    chunks = [(block_size - 1, 2), (block_size, block_size + 1), (block_size + 1, 70), (130, 5)]
    compare(fresh[1:] + chunks, 2 * group, 2, D, block_size)  # length 1 is a decode: above


def test_mixed_batch_decodes_and_chunks():
    compare([(0, 37), (45, 20), (64, 1), (15, 1), (0, 1), (31, 33)], 8, 2, 64, 16)


@pytest.mark.parametrize("window", [1, 7, 16, 40, 512])
def test_sliding_window(window):
    """Chapter 15's windowed layers: decodes (with and without split-K) and prompt chunks whose
    rows' windows start in different key tiles than their tile's first row."""
    cases = [(0, 37), (45, 20), (64, 1), (300, 1), (15, 1), (31, 33), (130, 5), (0, 1)]
    for num_splits in (1, 4):
        compare(cases, 8, 2, 64, 16, num_splits=num_splits, window=window)
    compare([(200, 1), (0, 40), (90, 17)], 8, 2, 256, 16, window=window)  # Gemma 3's head_dim


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    compare([(0, 40), (17, 1), (100, 1), (33, 12)], 8, 2, 64, 16, dtype=dtype)
    compare([(n - 1, 1) for n in (1, 16, 17, 300)], 4, 1, 128, 32, dtype=dtype, num_splits=2)
    compare([(0, 40), (33, 1), (20, 9)], 4, 2, 256, 16, dtype=dtype)


@pytest.mark.parametrize("D,group", [(64, 1), (64, 3), (128, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_sdpa_takes_every_route(D, group, dtype):
    """The triton_sdpa backend against the reference on a batch with fresh prompts long enough
    for SDPA, a short one, chunks after a cached prefix (one as long as a prompt) and decodes; and
    on a sliding-window layer, where every prompt stays with Triton."""
    from minillm.kernels.triton_sdpa import (
        SDPA_MIN_TOKENS,
        TRITON_SDPA_ATTENTION,
        plan_triton_sdpa,
    )

    n = SDPA_MIN_TOKENS
    cases = [(0, n), (0, n + 37), (0, n - 1), (20, n + 5), (45, 3), (64, 1), (300, 1)]
    H, Hkv, bs = 2 * group, 2, 16
    pool, batch, q, k, v, _ = random_paged_batch(cases, H, Hkv, D, bs, dtype=dtype)
    for window in (None, 40):
        md = replace(batch.metadata, sliding_window=window)
        ref = PagedKVCache(1, pool.k.shape[1], bs, Hkv, D)
        ref.k.copy_(pool.k)
        ref.v.copy_(pool.v)
        expected = PagedAttention(ref, md)(0, q.float(), k.float(), v.float())
        tri = PagedKVCache(1, pool.k.shape[1], bs, Hkv, D, dtype, DEVICE)
        tri.k.copy_(pool.k)
        tri.v.copy_(pool.v)
        mdd = type(md)(
            **{f: (x.to(DEVICE) if torch.is_tensor(x) else x) for f, x in vars(md).items()}
        )
        plan = plan_triton_sdpa(tri, mdd)
        assert plan.fresh == ([] if window else [(0, n), (n, n + 37)])
        got = PagedAttention(tri, mdd, TRITON_SDPA_ATTENTION)(
            0, q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
        )
        assert got.dtype == dtype
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(got.float().cpu(), expected, atol=tol, rtol=tol)


def kernels_engine(path, backend: str, max_num_batched_tokens: int) -> LLM:
    "An engine in float32 on the kernels' device, with `backend` and a pool of 64 blocks."
    llm = LLM(
        str(path),
        attention_backend=backend,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=64,
        device=DEVICE,
        dtype="float32",
    )
    assert llm.engine.config.attention_backend == backend
    return llm


def test_engine_with_triton_sdpa_backend_equals_transformers(random_llama, monkeypatch):
    """Prompts through SDPA whole, chunked (a first chunk fresh, the next over the pool), after a
    prefix-cache hit (Triton's), then decodes: transformers' tokens, and no block kept."""
    from minillm.kernels import triton_sdpa

    routed = []
    fresh_prompts = triton_sdpa.fresh_prompts
    monkeypatch.setattr(
        triton_sdpa, "fresh_prompts", lambda *a: routed.append(fresh_prompts(*a)) or routed[-1]
    )
    path, hf = random_llama
    llm = kernels_engine(path, "triton_sdpa", max_num_batched_tokens=96)
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(100, 5000, (48,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 5000, (n,), generator=g).tolist() for n in (30, 100)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for _ in range(2):  # the second round hits the prefix cache
        for p in prompts:  # one at a time: the first of them runs whole through SDPA
            assert llm.generate([p], params, use_tqdm=False)[0].token_ids == hf_greedy(hf, p, 8)
        assert llm.engine.block_manager.num_free_blocks == 64
    assert any(routed), "no prompt went through SDPA"


def test_store_kv_skips_negative_slots_and_accepts_qkv_slices():
    "On the device the kernels run on (compiled Triton refuses CPU pointers)."
    ref, pool = (
        PagedKVCache(1, 4, 16, 2, 64, device=DEVICE),
        PagedKVCache(1, 4, 16, 2, 64, device=DEVICE),
    )
    qkv = torch.randn(
        6, 3 * 128, device=DEVICE
    )  # k and v as column slices of a fused projection, as the model makes them
    k, v = qkv[:, 128:256].view(6, 2, 64), qkv[:, 256:].view(6, 2, 64)
    slots = torch.tensor([3, 17, -1, 40, 63, -1], device=DEVICE)
    ref.write(0, k[slots >= 0], v[slots >= 0], slots[slots >= 0])
    store_kv(pool, 0, k, v, slots)
    assert torch.equal(pool.k, ref.k) and torch.equal(pool.v, ref.v)


def test_bad_head_dim_is_a_clear_error():
    "Refused before any kernel runs, on any device."
    pool = PagedKVCache(1, 4, 16, 1, 48, device=DEVICE)
    _, batch, q, k, v, _ = random_paged_batch([(0, 3)], 2, 1, 48, 16)
    q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        store_kv(pool, 0, k, v, batch.metadata.slot_mapping.to(DEVICE))
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        PagedAttention(pool, batch.metadata, TRITON_ATTENTION)(0, q, k, v)


def test_engine_with_triton_backend_equals_transformers(random_llama):
    """Chunked prefill, prefix-cache hits and batched decode, all through the kernels, give
    transformers' tokens."""
    path, hf = random_llama
    llm = kernels_engine(path, "triton", max_num_batched_tokens=48)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(100, 5000, (40,), generator=g).tolist()
    prompts = [
        shared + torch.randint(100, 5000, (n,), generator=g).tolist() for n in (3, 30, 70)
    ] + [shared[:17]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for _ in range(2):  # the second round hits the prefix cache
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]
        assert llm.engine.block_manager.num_free_blocks == 64


def test_backend_choice(monkeypatch):
    from minillm.engine.assembly import resolve_attention_backend

    cpu = torch.device("cpu")
    assert (
        resolve_attention_backend("auto", cpu, 64) == "cpu"
    )  # the C++ kernel of chapter 8a builds here
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert (
        resolve_attention_backend("triton", cpu, 64) == "triton"
    )  # CPU tensors: only in the interpreter
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        resolve_attention_backend("triton", cpu, 80)
    with pytest.raises(ValueError, match="from 16 to 256"):  # past the compile report's tiles
        resolve_attention_backend("triton", cpu, 512)
    monkeypatch.delenv("TRITON_INTERPRET")
    for name in ("triton", "triton_sdpa"):
        with pytest.raises(ValueError, match=f"'{name}' needs the triton package, a CUDA device"):
            resolve_attention_backend(name, cpu, 64)
    with pytest.raises(ValueError, match="choose one of auto, torch, cpu, triton, triton_sdpa"):
        resolve_attention_backend("flash", cpu, 64)
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        assert resolve_attention_backend("auto", cuda, 128) == "triton"
        assert (
            resolve_attention_backend("auto", cuda, 80) == "torch"
        )  # not a power of two: the reference
        with pytest.raises(ValueError, match="needs the model on the CPU"):
            resolve_attention_backend("cpu", cuda, 64)
