"""Chapter 8b's compile report: Triton's compiler and NVIDIA's tools (shipped in Triton's wheel)
compile the engine's kernels for GPUs this machine does not have; what they report is read right,
and what the report compiles is what the engine launches."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from minillm.bench import gpu_compile
from minillm.course.paged import random_paged_batch
from minillm.engine.llm_engine import EngineConfig
from minillm.kernels import aot
from minillm.kernels import triton_attention as ta
from minillm.quantization import triton_linear as qt
from minillm.quantization.layers import Int4Linear, Int8Linear, quantize_int4, quantize_int8


def test_occupancy_follows_the_allocation_rules():
    "NVIDIA's rules: registers per warp in units of 256, 64 warps and 32 blocks per SM at most."
    h100 = aot.TARGETS["sm_90"]
    assert aot.occupancy(h100, 255, 0, 4) == (8, "registers")  # 8192 registers a warp: 8 warps
    assert aot.occupancy(h100, 128, 0, 4) == (16, "registers")
    assert aot.occupancy(h100, 32, 0, 4) == (64, "warps")
    assert aot.occupancy(h100, 16, 0, 1) == (32, "blocks")  # one-warp blocks: 32 of them
    # 100 KiB a block (+ 1 KiB reserved): two blocks fit in 228 KiB
    assert aot.occupancy(h100, 64, 100 * 1024, 4) == (8, "shared memory")


class Recorder:
    "Stands in for a JIT kernel: records each launch's keywords as a KernelConfig, runs nothing."

    def __init__(self, fn, dtype, launches):
        self.fn, self.dtype, self.launches = fn, dtype, launches

    def __getitem__(self, grid):
        def launch(*args, **keywords):
            keywords = keywords | (dict(UPCAST=False) if "UPCAST" in keywords else {})
            self.launches.append(aot.KernelConfig.of(self.fn, self.dtype, keywords).constants)

        return launch


def record(monkeypatch, module, names, dtype) -> list:
    launches = []
    for name in names:
        monkeypatch.setattr(module, name, Recorder(getattr(module, name), dtype, launches))
    return launches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", aot.HEAD_DIMS)
def test_the_report_compiles_what_the_backend_launches(monkeypatch, dtype, head_dim):
    "Every launch of a mixed batch (prefill, decode, split-K decode) is one the report compiles."
    heads, block_size = (8, 2), 16
    compiled = {c.constants for c in aot.attention_configs(dtype, head_dim, heads, block_size)}
    names = ("_store_kv_kernel", "_decode_kernel", "_merge_splits_kernel", "_prefill_kernel")
    launches = record(monkeypatch, ta, names, dtype)
    cases = [(0, 37), (45, 20), (30, 1)]  # a prompt, a chunk after a cached prefix, a decode
    pool, batch, q, k, v, _ = random_paged_batch(cases, *heads, head_dim, block_size, dtype=dtype)
    md = batch.metadata
    ta.store_kv(pool, 0, k, v, md.slot_mapping)
    for splits in ta.NUM_SPLIT_CHOICES:
        ta.paged_attention_triton(pool, 0, q, ta.plan_triton_attention(pool, md, splits))
    assert set(launches) == compiled


def test_the_report_compiles_what_the_quantized_layers_launch(monkeypatch):
    compiled = {c.constants for c in gpu_compile.quantized_configs(torch.bfloat16)}
    launches = record(
        monkeypatch, qt, ("_int8_matmul_kernel", "_int4_matmul_kernel"), torch.bfloat16
    )
    w = torch.randn(64, 128) * 0.1
    int8 = Int8Linear(*quantize_int8(w))
    q, scale, lo = quantize_int4(w, 32)
    int4 = Int4Linear(q, scale, lo + 8 * scale, 32)
    for rows in (1, 16, 17, 100):
        x = torch.randn(rows, 128).bfloat16()
        qt.int8_matmul(x, int8.qweight, int8.scales)
        qt.int4_matmul(x, int4.qweight, int4.scales_zeros, 32)
    assert set(launches) == compiled


def test_the_report_compiles_what_the_fused_experts_launch(monkeypatch):
    "Chapter 16's two MoE kernels, whatever the top k (a runtime argument, not a constexpr)."
    from minillm.moe import triton_moe as tm

    compiled = {c.constants for c in gpu_compile.moe_configs(torch.bfloat16)}
    launches = record(monkeypatch, tm, ("_gate_up_kernel", "_down_kernel"), torch.bfloat16)
    for top_k in (1, 2, 8):
        experts = torch.randint(0, 8, (5, top_k))
        weights = torch.rand(5, top_k)
        x = torch.randn(5, 32).bfloat16()
        w13, w2 = torch.randn(8, 64, 32).bfloat16(), torch.randn(8, 32, 32).bfloat16()
        tm.fused_moe(x, w13, w2, weights, experts)
    assert set(launches) == compiled


def test_the_report_model_uses_the_engines_block_size():
    assert aot.BLOCK_SIZE == EngineConfig().block_size
    labels = [c.label for c in gpu_compile.engine_configs()]
    assert len(set(labels)) == len(labels)  # one row per launch


# Compiling needs the kernels as JIT functions: conftest.py's TRITON_INTERPRET=1 makes them
# interpreted ones, so the compiling checks run in one Python process without it.
COMPILE_CHECKS = """
import dataclasses, json, torch
from minillm.bench import gpu_compile
from minillm.kernels import aot

out = {}
store = aot.attention_configs(torch.bfloat16, 128)[0]
out["store"] = {t: dataclasses.asdict(aot.compile_config(store, x)) for t, x in aot.TARGETS.items()}
prefill = aot.attention_configs(torch.float32, 256)[-1]
big = dict(prefill.constants) | {"BLOCK_M": 64, "BLOCK_N": 64}
too_big = dataclasses.replace(prefill, constants=tuple(big.items()))
out["too_big"] = dataclasses.asdict(aot.compile_config(too_big, aot.TARGETS["sm_80"]))
out["fits"] = dataclasses.asdict(aot.compile_config(prefill, aot.TARGETS["sm_80"]))
small = dataclasses.replace(aot.TARGETS["sm_90"], name="sm_90 (48 KiB)", smem_per_block=48 << 10)
for name, dtype, head_dim in [("fp32_256", torch.float32, 256), ("bf16_64", torch.bfloat16, 64)]:
    try:
        aot.check_attention_launches(dtype, (32, 8), head_dim, 16, small)
        out[name] = ""
    except ValueError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_CHECKS], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("target", list(aot.TARGETS))
def test_a_kernel_compiles_for_each_target(compiled, target):
    r = compiled["store"][target]
    assert not r["error"] and 0 < r["registers"] <= 255 and r["spill_bytes"] == 0
    assert r["warps_per_sm"] > 0 and r["target"] == target


def test_too_much_shared_memory_is_refused(compiled):
    "64-row float32 tiles at head_dim 256 overflow an A100's shared memory: the table's fit."
    config = aot.attention_configs(torch.float32, 256)[-1]
    assert config.kernel.endswith("_prefill_kernel") and dict(config.constants)["BLOCK_M"] < 64
    r = compiled["too_big"]
    assert "shared memory" in r["error"] and r["shared"] > aot.TARGETS["sm_80"].smem_per_block
    assert not compiled["fits"]["error"]


def test_the_engines_check_refuses_what_a_gpu_cannot_launch(compiled):
    "The model runner's check on CUDA, here for a made-up GPU with 48 KiB of shared memory."
    words = r"cannot launch on sm_90 \(48 KiB\): needs \d+ B of shared memory.*'torch'"
    assert re.search(words, compiled["fp32_256"])
    assert compiled["bf16_64"] == ""  # small tiles fit
