"""Chapter 13b's matmul kernels and one-call decoder: panels against F.linear, GGUF blocks against
the gguf package's dequantization, the decoder against the eager path, the engine through it against
transformers' greedy generate for every family it serves, and the AVX2 build on a wider CPU."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize
from helpers import hf_greedy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import save_random_model

from minillm.bench.random_models import word_tokenizer
from minillm.kernels.cpu_decoder import GGUF_KINDS, CpuDecoder, CpuLinear, load_decoder_kernels
from minillm.llm import LLM
from minillm.loader import default_gguf_path
from minillm.sampling import SamplingParams


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    n_out=st.integers(1, 70),
    n_in=st.integers(1, 70),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_panel_linear_equals_f_linear(rows, n_out, n_in, bias, seed):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(n_out, n_in, generator=g), torch.randn(rows, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(b)
    torch.testing.assert_close(
        CpuLinear.from_float(lin.weight, lin.bias)(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5
    )


def test_each_row_is_computed_alone():
    "A row's result does not depend on the rows beside it: the batch cannot change a token."
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(200, 96)
    x = torch.randn(37, 200, generator=g)
    panel = CpuLinear.from_float(lin.weight, lin.bias)
    together = panel(x)
    for i in (0, 7, 8, 36):
        assert torch.equal(panel(x[i : i + 1])[0], together[i])


def random_blocks(kind: str, rows: int, k: int, seed: int):
    "Blocks of `kind` (quantized by the gguf package, or random bytes for the K-quants), floats."
    rng, qtype = np.random.default_rng(seed), GGMLQuantizationType[kind]
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        blocks = quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    else:
        per_block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows, k // per_block * size), dtype=np.uint8)
        view = blocks.reshape(rows, -1, size)
        scales = rng.uniform(1e-4, 1e-2, (rows, view.shape[1], 2)).astype(np.float16)
        at = slice(0, 4) if kind == "Q4_K" else slice(208, 210)
        view[..., at] = scales[..., : (at.stop - at.start) // 2].view(np.uint8)
    floats = dequantize(blocks, qtype).reshape(rows, k).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(blocks)), torch.from_numpy(floats)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(sorted(GGUF_KINDS)),
    rows=st.integers(1, 50),
    runs=st.integers(1, 3),
    x_rows=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_gguf_blocks_multiply_as_the_gguf_package_reads_them(kind, rows, runs, x_rows, seed):
    "Both forms of the block matmul (a few rows of x, many) against x times gguf's own floats."
    k = runs * (256 if kind.endswith("_K") else 32)
    blocks, floats = random_blocks(kind, rows, k, seed)
    assert torch.equal(
        load_decoder_kernels().dequantize_blocks(blocks, GGUF_KINDS[kind], k), floats
    )
    x = torch.randn(x_rows, k, generator=torch.Generator().manual_seed(seed))
    err = (CpuLinear([blocks], [GGUF_KINDS[kind]], k, rows)(x) - x @ floats.T).abs()
    assert bool((err <= 1e-5 * (x.abs() @ floats.abs().T) + 1e-6).all())  # as in the AVX2 check


def test_segments_of_different_types_and_a_bias():
    (b1, f1), (b2, f2) = random_blocks("Q4_K", 24, 512, 1), random_blocks("Q6_K", 21, 512, 2)
    b3, f3 = random_blocks("Q8_0", 5, 512, 3)
    bias = torch.randn(50)
    kinds = [GGUF_KINDS[k] for k in ("Q4_K", "Q6_K", "Q8_0")]
    layer = CpuLinear([b1, b2, b3], kinds, 512, 50, bias)
    floats, g = torch.cat([f1, f2, f3]), torch.Generator().manual_seed(4)
    for x_rows in (1, 3, 16, 17, 40):
        x = torch.randn(x_rows, 512, generator=g)
        err = (layer(x) - (x @ floats.T + bias)).abs()
        # float32 sums of 512 products in another order: bounded by their magnitudes, not flat
        assert bool((err <= 1e-5 * (x.abs() @ floats.abs().T + bias.abs()) + 1e-6).all()), x_rows


def test_bad_input_is_refused_by_name():
    ops = load_decoder_kernels()
    with pytest.raises(RuntimeError, match="float32"):
        ops.pack_panels(torch.zeros(4, 4, dtype=torch.float64))
    layer = CpuLinear.from_float(torch.zeros(20, 8))
    with pytest.raises(RuntimeError, match=r"float32 \[\.\.\., 8\]"):
        layer(torch.zeros(2, 9))
    with pytest.raises(RuntimeError, match="bytes of one row"):
        CpuLinear([torch.zeros(4, 17, dtype=torch.uint8)], [GGUF_KINDS["Q4_0"]], 32, 4)
    with pytest.raises(RuntimeError, match="not one these kernels read"):
        CpuLinear([torch.zeros(4, 22, dtype=torch.uint8)], [6], 32, 4)


@pytest.mark.parametrize("family", ["llama", "llama-tied", "llama3-rope", "qwen2", "qwen3"])
def test_engine_through_the_decoder_equals_transformers(tmp_path, family):
    """Greedy tokens equal transformers' with decode batches through the decoder, prompt chunks
    through the model, preemption (a pool too small for all) and prefix caching."""
    hf = save_random_model(tmp_path, family)
    word_tokenizer(256).save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(2, 256, (20,), generator=g).tolist()
    prompts = [shared + torch.randint(2, 256, (n,), generator=g).tolist() for n in (3, 30, 11, 50)]
    want = [hf_greedy(hf, p, 12) for p in prompts]
    llm = LLM(str(tmp_path), max_num_batched_tokens=32, num_kv_blocks=14, block_size=8)
    assert llm.engine.runner.decoder is not None
    calls = []
    forward = llm.engine.runner.decoder.forward
    llm.engine.runner.decoder.forward = lambda *a: calls.append(1) or forward(*a)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert calls and llm.engine.scheduler.num_preemptions > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_enforce_eager_and_other_dtypes_keep_the_eager_path(tmp_path):
    save_random_model(tmp_path, "llama")
    word_tokenizer(256).save_pretrained(tmp_path)
    eager = LLM(str(tmp_path), enforce_eager=True).engine.runner
    assert eager.decoder is None and eager.governor is not None
    pytorch = LLM(str(tmp_path), cpu_kernels=False).engine.runner
    assert pytorch.decoder is None and pytorch.governor is None
    assert not any(type(m).__name__ == "CpuLinear" for m in pytorch.model.modules())
    assert LLM(str(tmp_path), dtype="bfloat16").engine.runner.decoder is None
    assert LLM(str(tmp_path), attention_backend="torch").engine.runner.decoder is None
    runner = LLM(str(tmp_path), kv_cache_dtype="int8").engine.runner
    assert isinstance(runner.decoder, CpuDecoder)  # built, but the int8 pool is not its
    assert not runner.decoder.can_run(_one_decode(runner), runner.cache)


def _one_decode(runner):
    from minillm.attention.input_batch import build_flat_batch
    from minillm.core.block_manager import Sequence

    seq = Sequence(0, [5, 6, 7], block_table=[0])
    seq.num_computed_tokens = 2
    return build_flat_batch([seq], [1], runner.cache.block_size)


def test_the_gguf_file_served_from_its_blocks_equals_float32():
    """The shipped Q4_1 file through the block kernels gives the float32 model's greedy tokens:
    the float directory was made by dequantizing this file, so the weights are the same."""
    gguf = LLM(quantization="gguf")
    assert gguf.config.dtype == "float32" and gguf.engine.runner.decoder is not None
    assert type(gguf.engine.model.lm_head) is CpuLinear
    assert gguf.engine.model.lm_head.weight0 is gguf.engine.model.model.embed_tokens.blocks
    prompts = [[1, 504, 3458, 282, 4649, 314] * k for k in (1, 5, 30)]  # the last is prefilled
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in LLM(dtype="float32").generate(prompts, params, use_tqdm=False)]
    assert [o.token_ids for o in gguf.generate(prompts, params, use_tqdm=False)] == want
    assert default_gguf_path().suffix == ".gguf"


AVX2_CHECK = """
import torch
from minillm.kernels.cpu_attention import cpu_flags
from minillm.kernels.cpu_decoder import GGUF_KINDS, CpuLinear
from test_cpu_decoder import random_blocks
assert "-march=haswell" in cpu_flags()
torch.manual_seed(0)
for kind in sorted(GGUF_KINDS):
    k = 512
    blocks, floats = random_blocks(kind, 37, k, 0)
    for x_rows in (1, 3, 6, 9, 40):
        x = torch.randn(x_rows, k)
        err = (CpuLinear([blocks], [GGUF_KINDS[kind]], k, 37)(x) - x @ floats.T).abs()
        # a sum of k products, added in another order: its error scales with the sum of |products|
        # (4.3e-7 of it at worst against float64 over 30 seeds)
        assert bool((err <= 1e-5 * (x.abs() @ floats.abs().T) + 1e-6).all()), (kind, x_rows)
w = torch.randn(40, 24)
for x_rows in (1, 5, 11):
    x = torch.randn(x_rows, 24)
    torch.testing.assert_close(CpuLinear.from_float(w)(x), x @ w.T, rtol=1e-5, atol=1e-5)
print("avx2 ok")
"""


@pytest.mark.skipif(
    "avx512f" not in open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else True,
    reason="the AVX2 build is the native one on this CPU, which every other test runs",
)
def test_the_avx2_build_on_a_wider_cpu(tmp_path):
    """MINILLM_CPU_ISA=avx2 builds the kernels for AVX2 (16-register tiles, 8-float vectors): on an
    AVX-512 CPU both builds run, so both are tested. A fresh process: one build per process."""
    env = {**os.environ, "MINILLM_CPU_ISA": "avx2", "PYTHONPATH": os.path.dirname(__file__)}
    out = subprocess.run(
        [sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0 and "avx2 ok" in out.stdout, out.stderr[-3000:]
