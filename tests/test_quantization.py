"""Chapter 13: quantized layers against dequantize-then-multiply, GGUF blocks against the gguf
package, and the engine serving each scheme."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from minillm import LLM, SamplingParams
from minillm.engine.llm_engine import EngineConfig
from minillm.loader import default_gguf_path, resolve_model_path
from minillm.model import load_model, no_cache_attention
from minillm.quantization.layers import Int4Linear, Int8Linear, quantize_int4, quantize_int8
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
    for layer in (Int8Linear.from_float(linear), Int4Linear.from_float(linear)):
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
        (dict(quantization="int8", device="cuda"), "CPU only"),
        (dict(quantization="int8", tensor_parallel_size=2), "tensor parallelism"),
    ]:
        with pytest.raises(ValueError, match=words):
            EngineConfig(**kw).resolved()


def test_quantize_model_replaces_every_decoder_linear():
    model = quantize_model(load_model(None), "int4")
    kinds = {type(m).__name__ for m in model.model.layers.modules()}
    assert "Linear" not in kinds and "Int4Linear" in kinds
