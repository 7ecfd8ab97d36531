"""Chapter 13: quantized layers against dequantize-then-multiply, GGUF blocks against the gguf
package, the engine serving each scheme, and the KV cache in one byte."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from minillm import LLM, SamplingParams
from minillm.core.kv_cache_config import KVCacheConfig
from minillm.core.quantized_kv_cache import (
    QuantizedKVCache,
    check_kv_cache_dtype,
    dequantize_kv,
    quantize_kv,
)
from minillm.course.naive import greedy_divergence
from minillm.course.quantized import FakeQuantizedCache
from minillm.engine.llm_engine import EngineConfig
from minillm.loader import default_gguf_path, encode_chat, read_config, resolve_model_path
from minillm.models.decoder import ModelConfig, load_model, no_cache_attention
from minillm.quantization.layers import (
    CpuInt4Linear,
    Int4Linear,
    Int8Linear,
    int4_linear_class,
    quantize_int4,
    quantize_int8,
)
from minillm.quantization.loader import (
    GGUFTensors,
    blocks_to_float,
    load_gguf_quantized,
    quantize_model,
    read_blocks,
)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_layers_equal_dequantize_then_matmul(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(256, 96, bias=bias)
    x = torch.randn(rows, 256)
    for layer in (Int8Linear.from_float(linear), CpuInt4Linear.from_float(linear)):
        want = F.linear(x, layer.dequantize(), linear.bias)
        torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(layer(x[None])[0], want, atol=1e-4, rtol=1e-5)  # [1, rows, K]


def test_quantization_error_is_bounded():
    torch.manual_seed(0)
    w = torch.randn(32, 128) * 3
    q, s = quantize_int8(w)
    assert (
        q.dtype == torch.int8
        and ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all()
    )
    q4, scale, lo = quantize_int4(w)
    back = q4.float().view(32, -1, 32) * scale[..., None] + lo[..., None]
    assert int(q4.max()) <= 15
    assert ((back.view(32, 128) - w).abs().view(32, -1, 32) <= scale[..., None] / 2 + 1e-5).all()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_equal_the_gguf_package(kind):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 128)) * rng.uniform(0.01, 5, (6, 1))).astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    raw = quantize(w, qtype)
    ours = blocks_to_float(*read_blocks(raw, kind, 128))
    assert torch.equal(ours, torch.from_numpy(dequantize(raw, qtype)))


def test_the_default_file_is_read_exactly():
    g = GGUFTensors(default_gguf_path())
    for name, t in g.tensors.items():
        if t.tensor_type.name in ("Q4_0", "Q4_1", "Q8_0"):
            q, d, m = g.blocks(name)
            want = torch.from_numpy(dequantize(t.data, t.tensor_type))
            assert torch.equal(blocks_to_float(q, d, m), want.view(q.shape)), name


def test_gguf_model_matches_transformers_dequantized_weights():
    quantized = load_gguf_quantized(default_gguf_path(), resolve_model_path())
    float_model = load_model(None)
    params = dict(float_model.named_parameters())
    for i in (0, 17, 29):
        layer = quantized.model.layers[i]
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            w = layer.get_submodule(name).dequantize()
            ref = params[f"model.layers.{i}.{name}.weight"]
            torch.testing.assert_close(
                w, ref, atol=1e-6, rtol=1e-6
            )  # the row order is llama.cpp's undone
    ids = torch.tensor([1, 504, 3458, 282, 4649, 314])
    pos = torch.arange(len(ids))
    with torch.inference_mode():
        a = quantized.compute_logits(quantized(ids, pos, no_cache_attention)).log_softmax(-1)
        b = float_model.compute_logits(float_model(ids, pos, no_cache_attention)).log_softmax(-1)
    kl = F.kl_div(a, b, log_target=True, reduction="batchmean").item()
    assert kl < 0.01, kl  # only the LM head's int8 copy rounds a second time


@pytest.mark.parametrize("scheme", ["gguf", "int8", "int4"])
def test_the_engine_serves_each_scheme_without_leaks(scheme):
    llm = LLM(quantization=scheme, dtype="float32", kv_cache_memory_gb=0.1)
    assert llm.config.quantization == scheme
    questions = [[{"role": "user", "content": "What is the capital of France?"}]] * 2
    params = [
        SamplingParams(temperature=0, max_tokens=12),
        SamplingParams(temperature=0.8, seed=1, max_tokens=12),
    ]
    outs = llm.chat(questions[0], params[0], use_tqdm=False) + llm.generate(
        ["Hello"] * 3, params[1], use_tqdm=False
    )
    assert all(o.finished and o.token_ids for o in outs)
    if scheme in ("gguf", "int8"):
        assert "Paris" in outs[0].text
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_bad_quantization_settings_are_refused(model_dir):
    for kw, words in [
        (dict(quantization="int3"), "quantization must be one of"),
        (dict(quantization="gguf", model=str(model_dir)), ".gguf"),
        (dict(quantization="gguf", model="m.gguf", device="cuda"), "on CUDA quantize"),
        (dict(quantization="int8", device="mps"), "'cpu' or 'cuda'"),
        (dict(quantization="gguf", model="m.gguf", device="cuda:1"), "on CUDA quantize"),
        (dict(quantization="int8", tensor_parallel_size=2), "tensor parallelism"),
    ]:
        with pytest.raises(ValueError, match=words):
            EngineConfig(**kw).resolved()


def test_quantize_model_replaces_every_decoder_linear():
    model = quantize_model(load_model(None), "int4")
    kinds = {type(m).__name__ for m in model.model.layers.modules()}
    assert "Linear" not in kinds and "CpuInt4Linear" in kinds  # the layout of the model's device
    with pytest.raises(ValueError, match="'int8' or 'int4'"):
        quantize_model(load_model(None), "int3")


@pytest.mark.parametrize("group", [32, 64])
def test_one_int4_layout_per_device(group):
    # the CPU layer keeps only PyTorch's private layout and reads it back through the kernel; the
    # other keeps nibbles and unpacks them: from the same 4-bit values they hold the same weight
    torch.manual_seed(group)
    w = torch.randn(80, 320)  # 320 inputs: the read-back's 256-column steps end part-way
    q, scale, lo = quantize_int4(w, group)
    cpu, nibbles = (cls(q, scale, lo + 8 * scale, group) for cls in (CpuInt4Linear, Int4Linear))
    assert {name for name, _ in cpu.named_buffers()} == {"scales_zeros", "cpu_packed"}
    assert {name for name, _ in nibbles.named_buffers()} == {"scales_zeros", "qweight"}
    torch.testing.assert_close(cpu.dequantize(), nibbles.dequantize(), rtol=1e-6, atol=1e-6)
    x = torch.randn(3, 320)
    torch.testing.assert_close(cpu(x), nibbles(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu(x.half()), nibbles(x.half()), rtol=1e-2, atol=1e-2)
    assert int4_linear_class("cpu") is CpuInt4Linear and int4_linear_class("cuda:1") is Int4Linear


# the KV cache in one byte (kv_cache_dtype)

KV_QUESTIONS = [
    "What is the capital of France?",
    "Write a limerick about a cat who loves the sea and the sun.",
    "List three prime numbers.",
    "Why is the sky blue? Answer briefly.",
]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8", "fp8_e5m2"])
def test_kv_rows_round_trip_within_their_bound(kv_cache_dtype):
    storage = check_kv_cache_dtype(kv_cache_dtype)
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(32, 4, 64, generator=g) * torch.logspace(-4, 3, 32)[:, None, None]
    q, scale = quantize_kv(rows, storage)
    assert q.dtype == storage and scale.shape == rows.shape[:-1]
    error = (dequantize_kv(q, scale, torch.float32) - rows).abs()
    relative, tiny = {"int8": (0, 0.5), "fp8": (2**-4, 2**-10), "fp8_e5m2": (2**-3, 2**-17)}[
        kv_cache_dtype
    ]
    bound = torch.maximum(relative * rows.abs(), tiny * scale[..., None]) * (1 + 1e-5)
    assert (error <= bound).all()
    # each row's largest magnitude is stored exactly (it defines the scale)
    top = rows.abs().argmax(-1, keepdim=True)
    assert (error.gather(-1, top) <= 1e-6 * rows.abs().gather(-1, top)).all()


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_quantized_kv_cache_equals_transformers_with_the_same_rounding(
    model_dir, tokenizer, hf_model, eos_ids, kv_cache_dtype, backend
):
    # a pool small enough to preempt, prompts in chunks, the chat template's shared system prompt
    # from the prefix cache: tokens equal transformers' whose cache rounds K/V the same way, up to
    # near-ties. Those are wider than float32's (FakeQuantizedCache.near_tie: a value within an
    # ulp of a rounding boundary moves by a whole step; seen: 0.05 in a logit for int8 on an
    # AVX-512 CPU and, with one BLAS thread, 0.063 for fp8). A flip early in the answer carries on
    # through 30 layers and every later token: on an AVX-512/AMX Xeon, 0.168 in a logit for int8,
    # within two whole steps (four of the reference's half steps), which the test allows.
    llm = LLM(
        str(model_dir),
        dtype="float32",
        kv_cache_dtype=kv_cache_dtype,
        attention_backend=backend,
        num_kv_blocks=14,
        block_size=8,
        max_num_batched_tokens=24,
        max_num_seqs=3,
    )
    assert llm.engine.runner.attention_backend == backend
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in KV_QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=24)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert sum(o.num_cached_tokens for o in outs) > 0
    for prompt, out in zip(prompts, outs):
        cache = FakeQuantizedCache(kv_cache_dtype)
        near_tie = 4 * cache.near_tie
        greedy_divergence(hf_model, prompt, out.token_ids, eos_ids, near_tie, cache=cache)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests


def test_cpu_kernel_reads_a_quantized_pool_as_the_torch_backend_does():
    from minillm.attention.input_batch import build_flat_batch
    from minillm.attention.paged import TORCH_ATTENTION, PagedAttention
    from minillm.core.block_manager import Sequence
    from minillm.kernels.cpu_attention import CPU_ATTENTION, cpu_kernels_available

    if not cpu_kernels_available():
        pytest.skip("no C++ compiler here: the torch backend serves quantized pools")
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, bs = 6, 2, 64, 4
    for kv_cache_dtype in ("int8", "fp8", "fp8_e5m2"):
        pool = QuantizedKVCache(1, 16, bs, kv_heads, dim, kv_cache_dtype=kv_cache_dtype)
        lengths = [9, 1, 14]  # decodes after contexts written by an earlier prefill
        seqs, tables = [], [[3, 7, 1], [0], [2, 9, 4, 11]]
        for i, (n, table) in enumerate(zip(lengths, tables)):
            seqs.append(Sequence(i, list(range(n)), block_table=table))
        prefill = build_flat_batch(seqs, lengths, bs, "cpu")
        t = sum(lengths)
        k, v = (torch.randn(t, kv_heads, dim, generator=g) * 3 for _ in range(2))
        pool.write(0, k, v, prefill.metadata.slot_mapping)
        for s, n in zip(seqs, lengths):
            s.token_ids.append(0)
            s.num_computed_tokens = n
        step = build_flat_batch(seqs, [1, 1, 1], bs, "cpu")
        q = torch.randn(3, heads, dim, generator=g)
        outs = []
        for backend in (TORCH_ATTENTION, CPU_ATTENTION):
            attn = PagedAttention(pool, step.metadata, backend)
            outs.append(backend.attend(pool, 0, q, attn.prepared[0, None]))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)


def test_quantized_pools_hold_more_blocks_in_the_same_memory(model_dir):
    cfg = ModelConfig.from_hf(read_config(model_dir))
    float_bytes = KVCacheConfig(cfg, 16, torch.float32).block_bytes
    int8_bytes = KVCacheConfig(cfg, 16, torch.float32, "int8").block_bytes
    assert int8_bytes == 16 * 2 * cfg.num_layers * cfg.num_kv_heads * (cfg.head_dim + 4)
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="int8", kv_cache_memory_gb=0.05)
    cache = llm.engine.runner.cache
    assert (
        cache.num_blocks == int(0.05 * 2**30 // int8_bytes) > 3 * int(0.05 * 2**30 // float_bytes)
    )
    assert cache.nbytes == cache.num_blocks * int8_bytes and cache.k.dtype == torch.int8


def test_bad_kv_cache_settings_are_refused(monkeypatch):
    from minillm.engine.assembly import resolve_attention_backend

    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto' or one of"):
        LLM(dtype="float32", kv_cache_dtype="int4")
    # fp8 on a GPU without it (an A100, sm_80): refused by name, int8 offered
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="sm_80: use kv_cache_dtype='int8'"):
        resolve_attention_backend("triton", torch.device("cuda"), 64, "fp8")


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_triton_kernels_read_and_write_a_quantized_pool_as_the_torch_backend(kv_cache_dtype):
    """Chapter 8b's kernels on a one-byte pool: the rows quantized and stored with their scales as
    the torch backend stores them, and attention (prefill chunks after a cached prefix, decodes)
    over the dequantized rows, scales applied in the kernel."""
    from minillm.attention.input_batch import build_flat_batch
    from minillm.attention.paged import TORCH_ATTENTION, PagedAttention
    from minillm.core.block_manager import Sequence
    from minillm.kernels.triton_attention import TRITON_ATTENTION

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 32, 4
    pools = [
        QuantizedKVCache(1, 16, bs, kv_heads, dim, kv_cache_dtype=kv_cache_dtype) for _ in "ab"
    ]
    lengths, tables = [9, 1, 14], [[3, 7, 1], [0], [2, 9, 4, 11]]
    seqs = [
        Sequence(i, list(range(n)), block_table=t) for i, (n, t) in enumerate(zip(lengths, tables))
    ]
    first = build_flat_batch(seqs, [6, 1, 10], bs, "cpu")  # prompts, part of two of them
    k, v = (torch.randn(17, kv_heads, dim, generator=g) * 3 for _ in range(2))
    for pool, backend in zip(pools, (TORCH_ATTENTION, TRITON_ATTENTION)):
        backend.write(pool, 0, k, v, first.metadata.slot_mapping)
    for name in ("k", "v", "k_scale", "v_scale"):
        assert torch.equal(getattr(pools[1], name), getattr(pools[0], name)), name
    for s, n in zip(seqs, [6, 1, 10]):
        s.num_computed_tokens = n
    seqs[1].token_ids.append(0)  # a decode, and two prompts' last chunks
    step = build_flat_batch(seqs, [3, 1, 4], bs, "cpu")
    k, v = (torch.randn(8, kv_heads, dim, generator=g) * 3 for _ in range(2))
    q = torch.randn(8, heads, dim, generator=g)
    outs = []
    for pool, backend in zip(pools, (TORCH_ATTENTION, TRITON_ATTENTION)):
        attn = PagedAttention(pool, step.metadata, backend)
        outs.append(attn(0, q, k, v))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 16, 33])
def test_triton_kernels_equal_the_layers_reference(rows):
    # on CPU under TRITON_INTERPRET=1 (conftest.py); on a GPU, compiled
    from minillm.quantization.triton_linear import int4_matmul, int8_matmul

    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 128, generator=g)
    w = torch.randn(150, 128, generator=g) * 0.1  # 150 outputs: a partial tile of 64 columns
    int8 = Int8Linear(*quantize_int8(w))
    ours = int8_matmul(x, int8.qweight, int8.scales)
    torch.testing.assert_close(ours, x @ int8.dequantize().T, rtol=1e-4, atol=1e-4)
    for group in (32, 64, 128):
        q, scale, lo = quantize_int4(w, group)
        int4 = Int4Linear(q, scale, lo + 8 * scale, group)
        assert int4.qweight.shape == (150, 64)
        ours = int4_matmul(x, int4.qweight, int4.scales_zeros, group)
        torch.testing.assert_close(ours, x @ int4.dequantize().T, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="divisible by 32"):
        int8_matmul(torch.randn(2, 40), torch.zeros(8, 40, dtype=torch.int8), torch.ones(8))


@pytest.mark.parametrize("rows", [1, 33])
def test_triton_kernels_in_bfloat16(rows):
    # the tensor-core path: the dequantized tile in bfloat16, float32 sums, the output rounded once
    from minillm.quantization.triton_linear import int4_matmul, int8_matmul

    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 128, generator=g).bfloat16()
    w = torch.randn(150, 128, generator=g) * 0.1
    int8 = Int8Linear(*quantize_int8(w))
    ours = int8_matmul(x, int8.qweight, int8.scales)
    assert ours.dtype == torch.bfloat16
    ref = x.float() @ int8.dequantize().T
    torch.testing.assert_close(ours.float(), ref, rtol=1e-2, atol=1e-2)
    q, scale, lo = quantize_int4(w, 64)
    int4 = Int4Linear(q, scale, lo + 8 * scale, 64)
    ours = int4_matmul(x, int4.qweight, int4.scales_zeros, 64)
    ref = x.float() @ int4.dequantize().bfloat16().float().T
    torch.testing.assert_close(ours.float(), ref, rtol=1e-2, atol=1e-2)


def test_the_cpu_int4_layout_refuses_what_its_kernel_cannot_hold():
    q, scale, lo = quantize_int4(torch.randn(72, 64), 32)
    with pytest.raises(ValueError, match="outputs in 16s, not 72"):
        CpuInt4Linear(q, scale, lo + 8 * scale, 32)
    assert Int4Linear(q, scale, lo + 8 * scale, 32).qweight.shape == (72, 32)
