"""`scripts/gpu_check.py`: the GPU check on tiny shapes, interpreted, so that it cannot rot; its
time budgets keep what a section measured before it ran out; transformers' continuous-batching
knobs are named as the installed version names them."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from transformers.generation.configuration_utils import ContinuousBatchingConfig

from minillm.bench.offline import hf_cb_knobs

ROOT = Path(__file__).resolve().parents[1]
PATHS = [
    "sliding-window",
    "recurrent",
    "moe",
    "fp8-kv",
    "int8-kv",
    "int8-weights",
    "int4-weights",
    "ngram-spec",
    "draft-spec",
    "structured-outputs",
    "server",
]


def test_gpu_check_dry_mode(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", str(tmp_path), "--dry"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["meta"]["dry"] and (tmp_path / "gpu_check.log").stat().st_size > 0
    assert "pytest| " in (tmp_path / "gpu_check.log").read_text()  # line by line, as it ran
    for name in ("aot", "pytest", "exactness", "features", "kernels", "tiles", "engine", "loop"):
        assert res[name]["ok"] and res[name]["budget_s"] > 0, (name, res[name])
    assert set(res["aot"]["beyond_the_report"]) >= {"launch", "timing"}
    assert [m["shape"] for m in res["exactness"]["models"]] == [
        "SmolLM2-135M",
        "Qwen3-0.6B",
        "Llama-3.2-1B",
    ]
    assert [p["path"] for p in res["features"]["paths"]] == PATHS
    row = res["features"]["paths"][0]
    assert {"greedy_equal", "cuda_graphs", "attention_backend", "ok"} <= set(row)
    runs = {run["setup"]: run for run in res["engine"]["runs"]}
    assert set(runs) == {
        "triton + CUDA graphs",
        "triton + CUDA graphs, no async scheduling",
        "triton_sdpa + CUDA graphs",
        "transformers continuous batching",
    }
    fresh = [r for r in res["kernels"]["prefill"] if r["prefix"] == 0]
    assert fresh and all(r["sdpa_prompts"] == r["seqs"] for r in fresh)
    assert {"kernel", "dtype", "head_dim", "us", "chosen"} <= set(res["tiles"]["tiles"][0])
    assert {"bytes", "seconds", "graphs_fraction"} <= set(res["engine"]["floor"])
    profile = res["engine"]["profile"]
    assert "error" not in profile and profile["running"] == profile["batch"] == 4
    assert profile["wall_ms"] > 0 and profile["runner_ms"]["forward"] > 0  # (CPU: a fused step)
    assert all(
        run["output_tokens"] == res["engine"]["workload"]["output_tokens"] for run in runs.values()
    )
    assert [r["batch"] for r in res["loop"]["host_overhead"]] == [4]
    assert {"schedule", "prepare", "sample", "process"} <= set(
        res["loop"]["host_overhead"][0]["phases"]
    )
    assert res["loop"]["served"]["best_served_over_best_offline"] > 0
    assert res["loop"]["served"]["best_served_process_over_best_offline"] > 0


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_section_over_its_budget_keeps_what_it_measured(tmp_path, monkeypatch):
    gc = load_script()
    monkeypatch.setitem(gc.BUDGETS, "kernels", 1)
    run = gc.Run(tmp_path, False, False, "cpu", tmp_path, {"meta": {}})

    def slow(run, record):
        run.row(record, "decode", {"batch": 1})
        time.sleep(30)  # cut at 1 s

    run.section("kernels", slow)  # (were the alarm not raised, no error would be recorded)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())["kernels"]
    assert saved["decode"] == [{"batch": 1}] and "over its budget of 1 s" in saved["error"]
    run.section("kernels", lambda run, record: 1 / 0)  # an error: recorded, not raised
    assert "ZeroDivisionError" in run.results["kernels"]["error"]


def test_continuous_batching_knobs_in_the_installed_names():
    knobs = hf_cb_knobs(ContinuousBatchingConfig, 32, num_blocks=4, not_a_knob=1)
    ContinuousBatchingConfig(**knobs)  # the installed transformers takes them
    assert knobs["num_blocks"] == 4 and 32 in knobs.values() and "not_a_knob" not in knobs

    class Transformers517:  # 5.17's name for the page: block_size
        def __init__(self, block_size=256, num_blocks=None, max_batch_tokens=None):
            pass

    assert hf_cb_knobs(Transformers517, 32, num_blocks=4, auto_switch_to_flash=False) == {
        "block_size": 32,
        "num_blocks": 4,
    }
