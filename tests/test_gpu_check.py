"`scripts/gpu_check.py --dry`: the GPU check on tiny shapes, interpreted, so that it cannot rot."

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    assert res["pytest"]["ok"] and res["exactness"]["ok"] and res["kernels"]["ok"]
    assert res["aot"]["ok"] and set(res["aot"]["beyond_the_report"]) >= {"launch", "timing"}
    assert [m["shape"] for m in res["exactness"]["models"]] == [
        "SmolLM2-135M",
        "Qwen3-0.6B",
        "Llama-3.2-1B",
    ]
    runs = res["engine"]["runs"]
    assert set(runs) == {
        "torch",
        "triton eager",
        "triton + CUDA graphs",
        "transformers continuous batching",
    }
    assert all(
        run["output_tokens"] == res["engine"]["workload"]["output_tokens"] for run in runs.values()
    )
