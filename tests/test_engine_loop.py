"""Chapter 17: a step's floor counted as the chapter says, and the host's work per step measured
with a forward that costs nothing (`minillm bench overhead`)."""

import subprocess
import sys

import pytest
import torch

from minillm.bench.engine_loop import host_overhead, workload_floor
from minillm.bench.random_models import MODEL_SHAPES
from minillm.course.chapter import chapter_exercises
from minillm.models.decoder import config_from_hf, kv_cache_bytes_per_token


def test_a_workloads_floor_is_its_weights_and_its_contexts_kv():
    cfg = config_from_hf(MODEL_SHAPES["Qwen3-0.6B"])
    assert kv_cache_bytes_per_token(cfg, torch.bfloat16) == 112 * 1024  # 28 x K, V x 8 x 128 x 2
    # steps read the weights; a request reads p, p + 1, ... p + n - 1 tokens
    assert workload_floor([10, 20], [3, 1], 5, 2) == 3 * 5 + 2 * (10 + 11 + 12 + 20)


def test_the_classic_wrong_floor_is_caught():
    checker = chapter_exercises("17")[
        "my_workload_floor(prompt_lens, output_lens, weight_bytes, kv_bytes_per_token)"
    ]

    def to_the_end(prompt_lens, output_lens, weight_bytes, kv):
        steps = max(output_lens)
        return steps * weight_bytes + kv * sum(
            steps * p + steps * (steps - 1) // 2 for p in prompt_lens
        )

    with pytest.raises(AssertionError, match="expected"):
        checker(to_the_end)


def test_host_overhead_runs_the_engine_around_a_free_forward():
    o = host_overhead(4, steps=4, repeats=2, prompt_len=8, vocab_size=1024)
    assert o.batch == 4 and 0 < o.low <= o.ms <= o.high
    assert str(o).startswith("host overhead at batch 4: ")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from minillm.cli import main; main()",
            "bench",
            "overhead",
            "--batch",
            "2",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--prompt-len",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "host overhead at batch 2:" in r.stdout, r.stderr[-2000:]
