"""Chapter 8b's compile report: Triton's compiler and NVIDIA's tools (shipped in Triton's wheel)
compile the engine's kernels for GPUs this machine does not have; what they report is read right."""

import dataclasses

import pytest
import torch

from minillm.kernels import aot
from minillm.kernels import triton_attention as ta


def test_occupancy_follows_the_allocation_rules():
    "NVIDIA's rules: registers per warp in units of 256, 64 warps and 32 blocks per SM at most."
    h100 = aot.TARGETS["sm_90"]
    assert aot.occupancy(h100, 255, 0, 4) == (8, "registers")  # 8192 registers a warp: 8 warps
    assert aot.occupancy(h100, 128, 0, 4) == (16, "registers")
    assert aot.occupancy(h100, 32, 0, 4) == (64, "warps")
    assert aot.occupancy(h100, 16, 0, 1) == (32, "blocks")  # one-warp blocks: 32 of them
    # 100 KiB a block (+ 1 KiB reserved): two blocks fit in 228 KiB
    assert aot.occupancy(h100, 64, 100 * 1024, 4) == (8, "shared memory")


def test_every_launch_the_backend_makes_is_listed_as_it_launches():
    configs = aot.engine_configs()
    kinds = {c.kernel for c in configs}
    assert kinds == {
        "_store_kv_kernel",
        "_decode_kernel",
        "_merge_splits_kernel",
        "_prefill_kernel",
    }
    for c in configs:
        constants = dict(c.constants)
        if c.kernel == "_prefill_kernel":  # the tiles plan_triton_attention cuts
            block = ta.prefill_block(c.dtype, constants["HEAD_DIM"])
            assert constants["BLOCK_M"] == constants["BLOCK_N"] == block
        if c.kernel == "_decode_kernel":
            assert constants["BLOCK_N"] == ta.DECODE_BLOCK_N
            assert constants["NUM_SPLITS"] in ta.NUM_SPLIT_CHOICES
    splits = {dict(c.constants)["NUM_SPLITS"] for c in configs if c.kernel == "_decode_kernel"}
    assert splits == set(ta.NUM_SPLIT_CHOICES)


@pytest.mark.parametrize("target", list(aot.TARGETS))
def test_a_kernel_compiles_for_each_target(target):
    config = next(c for c in aot.engine_configs() if c.kernel == "_store_kv_kernel")
    r = aot.compile_config(config, aot.TARGETS[target])
    assert not r.error and 0 < r.registers <= 255 and r.spill_bytes == 0
    assert r.warps_per_sm > 0 and r.target == target


def test_too_much_shared_memory_is_refused():
    "64-row float32 tiles at head_dim 256 overflow an A100's shared memory: smaller ones fit."
    config = next(
        c
        for c in aot.engine_configs()
        if c.kernel == "_prefill_kernel"
        and c.dtype == torch.float32
        and dict(c.constants)["HEAD_DIM"] == 256
    )
    assert dict(config.constants)["BLOCK_M"] < 64
    big = dict(config.constants) | {"BLOCK_M": 64, "BLOCK_N": 64}
    too_big = dataclasses.replace(config, constants=tuple(big.items()))
    r = aot.compile_config(too_big, aot.TARGETS["sm_80"])
    assert "shared memory" in r.error and r.shared > aot.TARGETS["sm_80"].smem_per_block
    assert not aot.compile_config(config, aot.TARGETS["sm_80"]).error
