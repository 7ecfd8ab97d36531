"The load generator against a real `minillm serve`, a minimal foreign server, `transformers serve`."

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from test_server import KEY, NAME, server  # noqa: F401  (the module-scoped `minillm serve` fixture)

from minillm.bench.online import (
    ServerProcess,
    arrival_times,
    best_under,
    first_model,
    free_port,
    run_load,
    serving_workload,
    summarize,
    sweep,
)

BIN = Path(sys.executable).parent


def check_run(run: dict, n: int):
    "Consistency of one run's summary and its per-request records."
    assert run["completed"] + run["failed"] == n == len(run["requests"])
    ok = [r for r in run["requests"] if r["success"]]
    assert run["output_tokens"] == sum(r["output_tokens"] for r in ok)
    assert math.isclose(run["request_throughput"], run["completed"] / run["duration_s"])
    assert math.isclose(run["output_throughput"], run["output_tokens"] / run["duration_s"])
    for r in ok:
        assert (
            0 < r["ttft"] <= r["e2e"] <= run["duration_s"]
            and len(r["itl"]) <= r["output_tokens"] - 1
        )
        assert (
            r["ttft"] + sum(r["itl"]) <= r["e2e"] + 1e-9
        )  # the last token came before the stream ended
    for m in ("ttft", "tpot", "itl", "e2e"):
        assert run[f"p50_{m}_s"] <= run[f"p90_{m}_s"] <= run[f"p99_{m}_s"]
    vals = [r["ttft"] for r in ok]
    assert min(vals) <= run["mean_ttft_s"] <= max(vals) and min(vals) <= run["p50_ttft_s"] <= max(
        vals
    )


@pytest.fixture(scope="module")
def tok(model_dir):
    from minillm.loader import load_tokenizer

    return load_tokenizer(model_dir)


def test_sweep_against_minillm(server, tok, tmp_path):
    base = f"{server}/v1"
    assert first_model(base, KEY) == NAME
    res = sweep(
        base,
        [math.inf, 8.0],
        tok,
        NAME,
        num_requests=4,
        prompt_len=(8, 40),
        output_len=(3, 8),
        extra_body={"ignore_eos": True},
        api_key=KEY,
        warmup=1,
        progress=False,
    )
    for i, run in enumerate(res["runs"]):
        check_run(run, 4)
        assert run["failed"] == 0
        reqs = serving_workload(tok, 4, (8, 40), (3, 8), seed=i)
        for r, q in zip(run["requests"], reqs):
            assert (
                r["output_tokens"] == q.output_len == r["output_len"]
            )  # ignore_eos: every request ran to max_tokens
            assert r["prompt_len"] == q.prompt_len  # the server's count equals ours
        starts = [r["start"] for r in run["requests"]]
        for s, at in zip(starts, arrival_times(4, run["rate"], seed=i)):
            assert at <= s  # never sent early
    path = tmp_path / "r.json"
    path.write_text(json.dumps(res))
    assert json.loads(path.read_text()) == res
    assert best_under(res, bound=1e9)["rate"] == math.inf and best_under(res, bound=0.0) is None


def test_failures_are_counted(server, tok):
    reqs = serving_workload(tok, 2, (8, 8), (2, 2))
    results, duration = run_load(f"{server}/v1", "no-such-model", reqs, api_key=KEY)
    assert all(not r.success and "404" in r.error for r in results)
    s = summarize(results, duration)
    assert (s["completed"], s["failed"], s["request_throughput"]) == (0, 2, 0.0) and math.isnan(
        s["p99_ttft_s"]
    )


def test_cli_online_writes_json(server, tmp_path):
    out = tmp_path / "cli.json"
    r = subprocess.run(
        [
            str(BIN / "minillm"),
            "bench",
            "online",
            "--base-url",
            f"{server}/v1",
            "--api-key",
            KEY,
            "--rates",
            "inf",
            "--num-requests",
            "2",
            "--min-prompt",
            "8",
            "--max-prompt",
            "16",
            "--min-output",
            "2",
            "--max-output",
            "4",
            "--ignore-eos",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["model"] == NAME and res["runs"][0]["completed"] == 2 and "req/s" in r.stdout


def test_vllm_bench_serve_against_minillm(server, model_dir, tmp_path):
    "vLLM's `bench serve` command line, table and result keys, against `minillm serve`."
    flags = ["--base-url", server, "--model", NAME, "--tokenizer", str(model_dir)]
    flags += ["--dataset-name", "random", "--num-prompts", "3", "--random-input-len", "16"]
    flags += ["--random-output-len", "4", "--ignore-eos", "--save-result"]
    flags += ["--result-dir", str(tmp_path), "--result-filename", "serve.json"]
    r = subprocess.run(
        [str(BIN / "minillm"), "bench", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPENAI_API_KEY": KEY},
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "serve.json").read_text())
    assert res["completed"] == 3 and res["total_output_tokens"] == 12 and not res["errors"]
    assert res["median_ttft_ms"] <= res["p99_ttft_ms"] and res["mean_e2el_ms"] > 0
    assert "Serving Benchmark Result" in r.stdout
    assert f"{'Successful requests:':<40} {3:<10}" in r.stdout


# A server that is not ours: another chunking, a known schedule, strict about unknown fields.
FIRST, GAP = 0.3, 0.05


def other_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "other-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        unknown = set(body) - {
            "model",
            "prompt",
            "max_tokens",
            "temperature",
            "stream",
            "stream_options",
        }
        if unknown:
            return JSONResponse({"detail": f"Unexpected fields: {unknown}"}, status_code=422)
        n = body["max_tokens"]

        async def events():
            await asyncio.sleep(FIRST)
            for i in range(n):
                if i:
                    await asyncio.sleep(GAP)
                choice = {"index": 0, "text": f" w{i}", "finish_reason": None}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            last = {"index": 0, "text": "", "finish_reason": "length"}
            yield f"data: {json.dumps({'choices': [last], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def other_server():
    port = free_port()
    srv = uvicorn.Server(
        uvicorn.Config(other_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True


def test_timings_against_another_server(other_server, tok):
    res = sweep(
        other_server,
        [math.inf, 20.0],
        tok,
        num_requests=6,
        prompt_len=(8, 16),
        output_len=(2, 6),
        warmup=0,
        progress=False,
    )
    assert res["model"] == "other-model"
    for run in res["runs"]:
        check_run(run, 6)
        for r in run["requests"]:
            assert (
                r["success"]
                and r["prompt_len"] == 7
                and r["output_tokens"] == r["output_len"] == len(r["itl"]) + 1
            )
            # what the server's sleeps guarantee whatever the machine's load (chunks may arrive
            # together, so single gaps have no lower bound; the last cannot come before it was sent)
            assert (
                r["ttft"] >= FIRST
                and r["ttft"] + sum(r["itl"]) >= FIRST + (r["output_tokens"] - 1) * GAP
            )
    # it refuses ignore_eos, and the refusals are counted, not hidden
    results, _ = run_load(
        other_server,
        "other-model",
        serving_workload(tok, 2, (8, 8), (2, 2)),
        extra_body={"ignore_eos": True},
    )
    assert all(not r.success and "422" in r.error for r in results)


def test_transformers_serve(model_dir, tok):
    """transformers' own OpenAI server: text prompts only, no ignore_eos, but a generation_config
    field that can turn EOS off."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    cmd = [
        str(BIN / "transformers"),
        "serve",
        str(model_dir),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    with ServerProcess(cmd, base, timeout=240, env=dict(os.environ, HF_HUB_OFFLINE="1")):
        no_eos = {"generation_config": json.dumps({"eos_token_id": [], "pad_token_id": 2})}
        res = sweep(
            base,
            [math.inf],
            tok,
            num_requests=2,
            prompt_len=(8, 24),
            output_len=(3, 6),
            extra_body=no_eos,
            warmup=1,
            progress=False,
        )
    run = res["runs"][0]
    check_run(run, 2)
    assert run["failed"] == 0
    for r, q in zip(run["requests"], serving_workload(tok, 2, (8, 24), (3, 6), seed=0)):
        assert r["output_tokens"] == q.output_len and r["prompt_len"] == q.prompt_len
