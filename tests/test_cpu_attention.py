"""Chapter 8a's C++ kernel against chapter 4's reference; the engine with it vs transformers."""

import pytest
import torch
from helpers import hf_greedy

from minillm.attention.paged import TORCH_ATTENTION, PagedAttention
from minillm.course.paged import random_paged_batch
from minillm.kernels.cpu_attention import CPU_ATTENTION
from minillm.llm import LLM
from minillm.sampling import SamplingParams

TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def both(cases, heads, kv_heads, head_dim, block_size, dtype, seed=0, window=None):
    """The same batch through the reference and the CPU backend (each on its own copy of the pool);
    `window`: a sliding-window layer's (chapter 15)."""
    outs, pools = [], []
    for backend in (TORCH_ATTENTION, CPU_ATTENTION):
        pool, batch, q, k, v, _ = random_paged_batch(
            cases, heads, kv_heads, head_dim, block_size, dtype, seed
        )
        pool.sliding_windows = [window]
        if (
            backend is TORCH_ATTENTION and dtype != torch.float32
        ):  # the reference in float32, from the same values
            pool.k, pool.v = pool.k.float(), pool.v.float()
            q, k, v = q.float(), k.float(), v.float()
        outs.append(PagedAttention(pool, batch.metadata, backend)(0, q, k, v))
        pools.append(pool)
    return outs, pools


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim",
    [(9, 3, 64), (16, 8, 128), (4, 4, 32), (8, 1, 96), (6, 2, 80), (4, 2, 256)],
)
@pytest.mark.parametrize("block_size", [16, 32])
def test_decodes_and_chunks_match_the_reference(dtype, heads, kv_heads, head_dim, block_size):
    edge = [
        (0, 1),
        (block_size - 1, 1),
        (block_size, 1),
        (block_size + 1, 1),
        (3 * block_size, 1),
        (300, 1),
    ]
    # short chunks (speculative verification, small prompts) go to the kernel, causal within them
    short = [(0, 2), (block_size - 1, 3), (40, 5), (100, 16), (7, 1), (0, 16), (48, 17)]
    alone = [(200, 8)]  # one sequence: the kernel splits its KV heads over the threads
    for cases in (edge, [(0, 37), (45, 20), (64, 1), (5, 1), (0, block_size)], short, alone):
        (ref, out), (ref_pool, pool) = both(cases, heads, kv_heads, head_dim, block_size, dtype)
        torch.testing.assert_close(out.float(), ref, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
        assert torch.equal(pool.k.float(), ref_pool.k) and torch.equal(pool.v.float(), ref_pool.v)


@pytest.mark.parametrize("window", [1, 5, 16, 40, 512])
def test_sliding_window_matches_the_reference(window):
    "Decodes and short chunks (the kernel) and long chunks (SDPA) of a windowed layer."
    cases = [(0, 37), (45, 20), (64, 1), (300, 1), (15, 1), (31, 8), (130, 5), (0, 1), (200, 3)]
    for heads, kv_heads, head_dim in [(8, 2, 64), (4, 1, 256)]:
        (ref, out), _ = both(cases, heads, kv_heads, head_dim, 16, torch.float32, window=window)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_kernel_reads_strided_query_rows():
    "q and k, v as views of a fused qkv projection, as the model passes them."
    cases = [(10, 1), (33, 1), (70, 1)]
    pool, batch, q, k, v, _ = random_paged_batch(cases, 8, 2, 64, 16)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], 1)
    qs, ks, vs = qkv.split([8 * 64, 2 * 64, 2 * 64], 1)
    out = PagedAttention(pool, batch.metadata, CPU_ATTENTION)(
        0, qs.view(-1, 8, 64), ks.view(-1, 2, 64), vs.view(-1, 2, 64)
    )
    ref_pool, *_ = random_paged_batch(cases, 8, 2, 64, 16)
    ref = PagedAttention(ref_pool, batch.metadata, TORCH_ATTENTION)(0, q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_engine_with_cpu_backend_equals_transformers(random_llama):
    path, hf = random_llama
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(100, 5000, (n,), generator=g).tolist() for n in (5, 17, 31, 2, 40, 9, 64)
    ]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for kw in (
        dict(),
        dict(num_kv_blocks=12, max_num_batched_tokens=24, block_size=8),
    ):  # + preemption, chunks
        llm = LLM(str(path), attention_backend="cpu", **kw)
        assert llm.config.attention_backend == "cpu"
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 10) for p in prompts]
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_auto_picks_the_cpu_kernel(random_llama):
    path, _ = random_llama
    assert LLM(str(path)).config.attention_backend == "cpu"


def test_a_stale_build_lock_does_not_hang_the_next_load():
    """A build killed midway leaves torch's `lock` file in the build folder; torch waits on it
    with no timeout. The next load (another process) must go on."""
    import subprocess
    import sys

    from filelock import FileLock

    from minillm.kernels.cpu_attention import kernels_build_dir, load_cpu_kernels

    load_cpu_kernels()  # built (or found) here, so that the child only loads it
    build = kernels_build_dir()
    with FileLock(f"{build}.lock"):  # as a killed build leaves it, with no build running
        (build / "lock").touch()
    code = "from minillm.kernels.cpu_attention import load_cpu_kernels; load_cpu_kernels()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert not (build / "lock").exists()
