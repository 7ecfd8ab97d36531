#!/usr/bin/env python3
"""The GPU path, proven: every GPU check in one command, for a bare CUDA machine.

    PYTHONPATH=. python3 scripts/gpu_check.py OUT_DIR         # CUDA: at most 8 minutes on an H200
    PYTHONPATH=. python3 scripts/gpu_check.py OUT_DIR --long  # the long form: full workloads
    PYTHONPATH=. python3 scripts/gpu_check.py OUT_DIR --dry   # anywhere: tiny shapes, interpreter

It installs nothing. It writes OUT_DIR/gpu_check.json (every result, with the GPU, the versions
and the date), rewritten after every section and every measured row, so that a run cut short
keeps what it measured, and OUT_DIR/gpu_check.log as it goes:

0. aot: what chapter 8b's compile report found without a GPU (build/gpu_compile*.json), what only
   this run can check beyond it, and the same compile for this device's own limits;
1. pytest: the compiled Triton kernel tests and the CUDA-graph tests, in parallel workers, their
   output in the log line by line;
2. exactness: minillm against transformers on random-weight models with the shapes of the default
   model, Qwen3-0.6B and Llama-3.2-1B: greedy tokens in float32 and logits within tolerance in
   bfloat16, with prefix caching, chunked prefill, preemption and CUDA graphs on;
3. features: one row per path (sliding-window, recurrent, moe, fp8-kv, int8-kv, int8-weights,
   int4-weights, ngram-spec, draft-spec, structured-outputs, server): greedy tokens against their
   reference, whether decode steps replayed CUDA graphs (and if not, the engine's reason), the
   attention backend that ran;
4. kernels: paged decode (GB/s against the measured copy bandwidth, over batch and context; per
   call from Python and replayed from a CUDA graph) and varlen prefill (TFLOP/s), against the torch
   reference, and the triton_sdpa backend's library path (torch's SDPA) on fresh prompts;
5. tiles: a sweep of the kernels' tiles on this device (decode and prefill), so that one run
   yields the data to choose them;
6. engine: nano-vllm's workload (256 requests, prompts and outputs uniform in 100-1024, Qwen3-0.6B's
   shape, bfloat16, dummy weights, ignore_eos) through minillm with CUDA graphs, with and without
   chapter 17's async scheduling, and with the triton_sdpa backend (the long form: eager and the
   torch backend too), its floor at the measured bandwidth, a profile of its decode step (chapter
   17's step_profile: 256 requests at 512 tokens, kernels by kind, the host's ranges), and
   transformers' continuous batching on a subset it finishes, with output tokens/s and TTFT/TPOT;
7. loop: chapter 17 on this machine: the host's work per decode step with the forward free (this
   host's CPU, phase by phase), and the same requests offline and through `minillm serve` with
   every request streaming at once (Qwen3-0.6B's shape, bfloat16, dummy weights).

Each section has its own time budget (BUDGETS; --long multiplies them): one that fails or runs out
is recorded with its error and what it measured so far, and the others still run. The dry mode
runs the same code on tiny shapes so that the script cannot rot (CI runs it, through
tests/test_gpu_check.py). After a run on a GPU, its JSON is committed twice: as
bench-results/gpu/gpu_check-DATE.json and as bench-results/gpu/gpu_check.json (the latest, which
the book's GPU cells read; the device and the date are inside).
"""

import argparse
import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch  # noqa: E402  (importing torch does not import triton)

if "--dry" in sys.argv or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("gpu_check")

# each section's time budget in seconds on a GPU: 470 in all, the 8 minutes of an H200's check
BUDGETS = dict(
    aot=15, pytest=80, exactness=40, features=60, kernels=40, tiles=40, engine=105, loop=90
)
LONG, DRY = 4, 600  # --long multiplies the budgets; the dry mode's are wide (an interpreter, CI)


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class OverBudget(BaseException):
    """A section ran past its time budget: a BaseException, so that no `except Exception` on the
    way (the engine isolating a failed batch, a feature row's error) swallows it."""


def _over_budget(signum, frame):
    raise OverBudget()


@dataclasses.dataclass
class Run:
    """One run of the check: where it writes, how it runs, and its results, saved after every
    section and every row a section records."""

    out: Path
    dry: bool
    long: bool
    device: str
    workdir: Path
    results: dict

    def save(self):
        "Write gpu_check.json whole (a new file moved into place: a reader never sees half)."
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=float))
        tmp.replace(self.out / "gpu_check.json")

    def row(self, record: dict, key: str, row: dict):
        "Record one measured row of a section, and save."
        record.setdefault(key, []).append(row)
        log.info("%s %s", key, row)
        self.save()

    def section(self, name: str, fn):
        """Run a section under its budget; record its result, or its error and what it measured
        before; never let one section stop the others."""
        budget = DRY if self.dry else BUDGETS[name] * (LONG if self.long else 1)
        record = self.results[name] = {"budget_s": budget}
        log.info("== %s (budget %d s)", name, budget)
        t = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _over_budget)
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            fn(self, record)
        except OverBudget:
            log.error("%s: over its budget of %d s; what it measured is kept", name, budget)
            record["error"] = f"over its budget of {budget} s (what it measured is kept)"
        except Exception as e:
            log.error("%s failed: %s\n%s", name, e, traceback.format_exc())
            record["error"] = f"{type(e).__name__}: {e}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()
        record["seconds"] = round(time.perf_counter() - t, 1)
        log.info("%s: %.1f s", name, record["seconds"])
        self.save()


def run_pytest(run: Run, record: dict):
    """The compiled kernel and CUDA-graph tests, in parallel workers where pytest-xdist is there
    (Triton compiles each kernel variant on first use: one process does not finish in time), each
    line of their output in the log as it comes (on CPU, in dry mode, a few of them)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests/test_kernels.py", "tests/test_cuda_graphs.py"]
    if run.dry:  # the plumbing only: the suite runs these tests on CPU anyway
        cmd += ["-k", "store_kv or backend_choice"]
    else:
        try:
            import xdist  # noqa: F401

            cmd += ["-n", str(min(8, os.cpu_count() or 1))]
        except ImportError:
            log.info("pytest-xdist is not installed: the tests run in one process")
    record["command"] = " ".join(cmd[1:])
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: xdist's workers stop with it
    )
    lines = []
    try:
        for line in proc.stdout:
            log.info("pytest| %s", line.rstrip())
            lines.append(line)
        proc.wait()
    finally:
        if proc.poll() is None:  # over budget: what ran is in the log
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        tail = next((x.strip() for x in reversed(lines) if x.strip()), "")
        counts = re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed)", tail)
        record["summary"] = tail
        record["counts"] = {kind: int(n) for n, kind in counts}
        record["failed_tests"] = [x.split()[1] for x in lines if x.startswith("FAILED ")]
    record["returncode"] = proc.returncode
    record["ok"] = proc.returncode == 0 and record["counts"].get("passed", 0) > 0


# What chapter 8b's compile report (make gpu-compile, on any CPU) cannot check: only a GPU run can
BEYOND_THE_REPORT = {
    "launch": "that the compiled kernels run and compute the right values on a device (pytest, "
    "exactness)",
    "timing": "how fast they run: bandwidth, TFLOP/s, tokens/s (kernels, engine)",
    "graph capture": "that decode steps capture into CUDA graphs and replay exactly (pytest, "
    "exactness, features, engine)",
    "the driver's limits": "this GPU's own shared memory and register file, read from the device "
    "(aot, on a GPU)",
}


def run_aot(run: Run, record: dict):
    """The compile report's verdict as committed to build/, and on a GPU the same compile for this
    device's own limits and Triton."""
    record["beyond_the_report"] = BEYOND_THE_REPORT
    for report in sorted((ROOT / "build").glob("gpu_compile*.json")):
        rows = json.loads(report.read_text())
        verdict = dict(compiles=len(rows), triton=rows[0].get("triton") if rows else None)
        verdict["spills"] = sum(bool(r["spill_bytes"]) for r in rows)
        verdict["cannot_launch"] = sum(bool(r["error"]) for r in rows)
        record[report.name] = verdict
    if not run.dry:  # compiling needs the kernels as JIT functions, which the dry mode's are not
        from minillm.bench import gpu_compile
        from minillm.kernels import aot

        target = aot.Target.of_device(0)
        rows = [aot.compile_config(c, target) for c in gpu_compile.engine_configs()]
        record["this_gpu"] = dict(
            target=dataclasses.asdict(target),
            compiles=len(rows),
            spills=[r.config for r in rows if r.spill_bytes],
            cannot_launch=[aot.launch_error(r) for r in rows if r.error],
            max_registers=max(r.registers for r in rows),
        )
    mine = record.get("this_gpu", {})
    record["ok"] = run.dry or not (mine["spills"] or mine["cannot_launch"])


TINY = dict(num_hidden_layers=2, intermediate_size=256, vocab_size=1024)  # the dry mode's shapes


def run_exactness(run: Run, record: dict):
    """Greedy tokens in float32 against transformers, every mechanism on; bfloat16 logits within
    tolerance."""
    from minillm.bench.offline import hf_greedy
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM
    from minillm.loader import load_hf_model
    from minillm.models.decoder import no_cache_attention
    from minillm.sampling import SamplingParams
    from minillm.utils import cdiv

    device, tiny = run.device, TINY if run.dry else {}
    for shape in ("SmolLM2-135M", "Qwen3-0.6B", "Llama-3.2-1B"):
        path = random_model_dir(run.workdir / shape, shape, device=device, **tiny)
        hf = load_hf_model(path, dtype=torch.float32, device=device)
        rng = random.Random(0)
        system = [rng.randrange(2, 900) for _ in range(40)]  # a shared prefix: prefix-cache hits
        prompts = [
            system + [rng.randrange(2, 900) for _ in range(rng.randint(3, 60 if run.dry else 200))]
            for _ in range(6)
        ]
        steps = 8 if run.dry else 24
        refs = [hf_greedy(hf, p, steps) for p in prompts]
        need = sum(cdiv(len(p) + steps, 16) for p in prompts)
        llm = LLM(
            str(path),
            dtype="float32",
            device=device,
            max_num_batched_tokens=64,
            block_size=16,
            num_kv_blocks=max(need // 2, max(cdiv(len(p) + steps, 16) for p in prompts) + 1),
            max_num_seqs=8,
        )
        params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        outs += llm.generate(prompts[:2], params, use_tqdm=False)  # again: prefix-cache hits
        same = sum(o.token_ids == r for o, r in zip(outs, refs + refs[:2]))
        eng = llm.engine
        row = dict(
            shape=shape,
            greedy_equal=f"{same}/{len(outs)}",
            preemptions=eng.scheduler.num_preemptions,
            cached_tokens=sum(o.num_cached_tokens for o in outs[-2:]),
            attention_backend=eng.runner.attention_backend,
            cuda_graphs=eng.runner.graphs is not None,
            pool_free=eng.block_manager.num_free_blocks == eng.block_manager.num_blocks,
        )
        del llm, eng
        hf16 = load_hf_model(path, dtype=torch.bfloat16, device=device)
        llm16 = LLM(str(path), dtype="bfloat16", device=device, num_kv_blocks=64)
        m = llm16.engine.model
        ids = torch.tensor(prompts[0], device=device)
        with torch.inference_mode():
            ours = m.compute_logits(
                m(ids, torch.arange(len(ids), device=device), no_cache_attention)
            )
            theirs = hf16(ids[None]).logits[0].float()
        row["bf16_max_logit_diff"] = float((ours - theirs).abs().max())
        row["bf16_logit_scale"] = float(theirs.abs().max())
        row["bf16_within_tolerance"] = row["bf16_max_logit_diff"] <= 0.05 * row["bf16_logit_scale"]
        row["ok"] = same == len(outs) and row["bf16_within_tolerance"] and row["pool_free"]
        run.row(record, "models", row)
        del hf, hf16, llm16, m
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    record["ok"] = all(r["ok"] for r in record["models"])


def tiny_families() -> dict:
    """The tiny random-weight decoders of the test suite (tests/test_model_sources.py's), the same
    shapes CI checks on CPU: a llama, Gemma 3's sliding windows, Qwen3.5's recurrent layers,
    Qwen3-MoE's experts."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_model_sources import ARCHITECTURES

    return ARCHITECTURES


# path -> (family, the engine's options, what its tokens are held to)
FEATURES = {
    "sliding-window": ("gemma3", {}, "transformers"),
    "recurrent": ("qwen3_5", {}, "transformers"),
    "moe": ("qwen3_moe", {}, "transformers"),
    "fp8-kv": ("llama", dict(kv_cache_dtype="fp8"), "eager"),
    "int8-kv": ("llama", dict(kv_cache_dtype="int8"), "eager"),
    "int8-weights": ("llama", dict(quantization="int8"), "eager"),
    "int4-weights": ("llama", dict(quantization="int4"), "eager"),
    "ngram-spec": (
        "llama",
        dict(
            speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3)
        ),
        "transformers",
    ),
    "draft-spec": ("llama", "draft", "transformers"),
    "structured-outputs": ("llama", {}, "eager"),
}
CHOICES = ["t5", "t7", "t9"]  # words the word-level tokenizer spells, one token each


def feature_row(run: Run, path: str, model: Path, prompts: list, refs: list | None, kw: dict):
    """One path through the engine on the device: its greedy tokens against `refs` (transformers')
    or, where None, against the same engine run eagerly; whether its decode steps replayed CUDA
    graphs, and if not, why."""
    from minillm.llm import LLM
    from minillm.sampling import SamplingParams

    guided = None
    if path == "structured-outputs":
        from minillm.engine.structured_output import GuidedDecodingParams

        guided = GuidedDecodingParams(choice=CHOICES)
    params = SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=guided is None, guided_decoding=guided
    )
    base = (
        dict(
            dtype="float32", device=run.device, max_num_seqs=8, num_kv_blocks=128, max_model_len=512
        )
        | kw
    )

    def generate(**more):
        llm = LLM(str(model), **base, **more)
        runner, steps = llm.engine.runner, [0]
        if runner.graphs is not None:
            replay = runner.graphs.run
            runner.graphs.run = lambda batch: steps.__setitem__(0, steps[0] + 1) or replay(batch)
        outs = llm.generate(prompts, params, use_tqdm=False)
        bm = llm.engine.block_manager
        return llm, outs, steps[0], bm.num_free_blocks == bm.num_blocks

    if refs is None:
        _, outs, _, _ = generate(attention_backend="torch", enforce_eager=True)
        refs = [o.token_ids for o in outs]
    llm, outs, steps, pool_free = generate()
    tokens = [o.token_ids for o in outs]
    runner = llm.engine.runner
    same = sum(t == r for t, r in zip(tokens, refs))
    row = dict(
        path=path,
        greedy_equal=f"{same}/{len(refs)}",
        cuda_graphs=steps > 0,
        graph_steps=steps,
        async_scheduling=llm.engine.overlap is not None,
        attention_backend=runner.attention_backend,
        pool_free=pool_free,
    )
    if steps == 0:
        row["not_captured"] = (
            "no CUDA device"
            if run.device != "cuda"
            else runner.graphs_refused()
            or f"the {runner.attention_backend} backend ran (graphs need triton)"
        )
    if guided is not None:
        row["in_choices"] = all(o.text.strip() in CHOICES for o in outs)
    fast = run.device != "cuda" or (steps > 0 and runner.attention_backend == "triton")
    row["ok"] = same == len(refs) and pool_free and row.get("in_choices", True) and fast
    return row


def run_features(run: Run, record: dict):
    "Every path on the device: its tokens, and whether the fast path (graphs, triton) served it."
    from minillm.bench.offline import hf_greedy
    from minillm.bench.random_models import random_model_dir
    from minillm.loader import load_hf_model
    from minillm.spec_decode.proposers import truncated_model_dir

    families, models, refs = tiny_families(), {}, {}
    rng = random.Random(0)
    shared = [rng.randrange(2, 500) for _ in range(24)]  # a shared prefix: prefix-cache hits
    prompts = [shared + [(j % (3 + i)) + 20 * i + 40 for j in range(10 + 9 * i)] for i in range(4)]
    prompts += [[rng.randrange(2, 500) for _ in range(n)] for n in (3, 40)]
    for path, (family, kw, reference) in FEATURES.items():
        if family not in models:
            models[family] = random_model_dir(run.workdir / family, families[family], seed=1)
            hf = load_hf_model(models[family], dtype=torch.float32, device=run.device)
            refs[family] = [hf_greedy(hf, p, 12) for p in prompts]
            del hf
        if kw == "draft":
            draft = truncated_model_dir(models[family], run.workdir / "draft", 1)
            kw = dict(speculative_config=dict(model=str(draft), num_speculative_tokens=3))
        expected = refs[family] if reference == "transformers" else None
        try:
            row = feature_row(run, path, models[family], prompts, expected, kw)
        except Exception as e:
            row = dict(path=path, ok=False, error=f"{type(e).__name__}: {e}")
        row["reference"] = reference
        run.row(record, "paths", row)
    run.row(record, "paths", probe_server(run, models["llama"]))
    record["ok"] = all(r["ok"] for r in record["paths"])


def probe_server(run: Run, model: Path) -> dict:
    """`minillm serve` on the device, probed over HTTP as a client would: a completion, a chat, a
    stream, a structured output, /metrics."""
    import httpx

    from minillm.bench.online import ServerProcess, free_port

    port = free_port()
    cmd = [sys.executable, "-c", "from minillm.cli import main; main()", "serve", str(model)]
    cmd += ["--chat-template", "{% for m in messages %}{{ m['content'] }} {% endfor %}"]
    cmd += [
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--device",
        run.device,
        "--num-kv-blocks",
        "128",
        "--max-model-len",
        "512",
        "--served-model-name",
        "m",
    ]
    row, base = dict(path="server", reference="HTTP"), f"http://127.0.0.1:{port}"
    try:
        with ServerProcess(cmd, f"{base}/v1", log=str(run.out / "server.log"), timeout=120):
            body = dict(model="m", prompt="t3 t4 t5", max_tokens=8, temperature=0)
            probes = {
                "completion": ("/v1/completions", body),
                "chat": (
                    "/v1/chat/completions",
                    dict(
                        model="m",
                        max_tokens=8,
                        temperature=0,
                        messages=[{"role": "user", "content": "t3 t4"}],
                    ),
                ),
                "stream": ("/v1/completions", body | dict(stream=True)),
                "structured-output": (
                    "/v1/completions",
                    body | dict(structured_outputs={"choice": CHOICES}),
                ),
            }
            for name, (route, payload) in probes.items():
                r = httpx.post(base + route, json=payload, timeout=60)
                good = r.status_code == 200
                if name == "stream":
                    good = good and r.text.rstrip().endswith("data: [DONE]")
                if name == "structured-output" and good:
                    good = r.json()["choices"][0]["text"].strip() in CHOICES
                row[name] = r.status_code if good else f"{r.status_code}: {r.text[:200]}"
            metrics = httpx.get(base + "/metrics", timeout=30)
            row["metrics"] = metrics.status_code
            good = metrics.status_code == 200 and "vllm:" in metrics.text
            row["ok"] = good and all(row[n] == 200 for n in probes)
    except Exception as e:
        row |= dict(ok=False, error=f"{type(e).__name__}: {e}")
    return row


def paged_case(seqs: int, new: int, prefix: int, heads: tuple, block_size: int, dtype, device: str):
    """A batch of `seqs` sequences, each `new` query tokens after `prefix` cached ones, in a
    shuffled random pool on `device`."""
    from minillm.attention.paged import AttentionMetadata
    from minillm.core.kv_cache import PagedKVCache
    from minillm.utils import cdiv

    H, Hkv, D = heads
    length, i32 = prefix + new, dict(dtype=torch.int32, device=device)
    per_seq = cdiv(length, block_size)
    pool = PagedKVCache(1, seqs * per_seq, block_size, Hkv, D, dtype, device)
    pool.k.normal_()
    pool.v.normal_()
    md = AttentionMetadata(
        cu_seqlens_q=torch.arange(0, (seqs + 1) * new, new, **i32),
        context_lens=torch.full((seqs,), length, **i32),
        block_tables=torch.randperm(seqs * per_seq, device=device).view(seqs, per_seq).int(),
        slot_mapping=torch.empty(0, dtype=torch.long, device=device),
        query_lens=[new] * seqs,
        context_lens_list=[length] * seqs,
        query_starts=list(range(0, seqs * new, new)),
    )
    return pool, md, torch.randn(seqs * new, H, D, dtype=dtype, device=device)


def timed(dry: bool, f) -> float:
    "Seconds a call of `f` takes (triton's do_bench); NaN in dry mode, where `f` runs once."
    if dry:
        f()
        return float("nan")
    from triton.testing import do_bench

    return do_bench(f) * 1e-3


def timed_graph(dry: bool, f, calls: int = 20) -> float:
    """Seconds a call, replayed from a CUDA graph of `calls` calls: the device's time alone (dry
    mode: `f` runs once, eagerly)."""
    if dry:
        return timed(dry, f)
    f()  # compiled and warm before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            f()
    return timed(dry, graph.replay) / calls


def run_kernels(run: Run, record: dict):
    """Decode GB/s against the copy bandwidth and prefill TFLOP/s, triton against the torch
    reference."""
    from minillm.attention.paged import paged_attention_torch
    from minillm.bench.kernels import decode_attention_bytes, device_bandwidth
    from minillm.kernels.triton_attention import paged_attention_triton, plan_triton_attention

    dry, device = run.dry, run.device
    heads, bs = ((4, 2, 32), 16) if dry else ((16, 8, 128), 16)
    dtype = torch.float32 if dry else torch.bfloat16

    def bench(f):
        return timed(dry, f)

    def bench_graph(f):
        return timed_graph(dry, f)

    bandwidth = float("nan") if dry else device_bandwidth()  # a copy of 1 GiB
    record |= dict(copy_bandwidth_GBps=bandwidth / 1e9, heads=list(heads), dtype=str(dtype))
    torch.manual_seed(0)
    for batch, context in (
        [(2, 20)] if dry else [(b, c) for b in (1, 8, 64, 256) for c in (512, 2048, 8192)]
    ):
        pool, md, q = paged_case(batch, 1, context - 1, heads, bs, dtype, device)
        plan = plan_triton_attention(pool, md)
        out = paged_attention_triton(pool, 0, q, plan)
        small = batch * context <= 2**19  # the reference pads and copies: only where that fits
        err = (
            float((out.float() - paged_attention_torch(pool, 0, q, md).float()).abs().max())
            if small
            else float("nan")
        )
        nbytes = decode_attention_bytes(batch, context, *heads, q.element_size())
        t_tri = bench(lambda: paged_attention_triton(pool, 0, q, plan))
        t_ref = bench(lambda: paged_attention_torch(pool, 0, q, md)) if small else float("nan")
        t_graph = bench_graph(lambda: paged_attention_triton(pool, 0, q, plan))
        run.row(
            record,
            "decode",
            dict(
                batch=batch,
                context=context,
                splits=plan.num_splits,
                max_error=err,
                triton_us=t_tri * 1e6,
                torch_us=t_ref * 1e6,
                triton_graph_us=t_graph * 1e6,  # the device's time, without the launch
                triton_GBps=nbytes / t_tri / 1e9,
                fraction_of_copy_bandwidth=nbytes / t_tri / bandwidth,
                graph_fraction_of_copy_bandwidth=nbytes / t_graph / bandwidth,
            ),
        )
        pool = None  # freed before the next case allocates its own
    for seqs, chunk, prefix in (
        [(2, 17, 5), (2, 64, 0)] if dry else [(8, 1024, 0), (4, 2048, 2048), (32, 256, 1024)]
    ):
        pool, md, q = paged_case(seqs, chunk, prefix, heads, bs, dtype, device)
        plan = plan_triton_attention(pool, md)
        err = float(
            (
                paged_attention_triton(pool, 0, q, plan).float()
                - paged_attention_torch(pool, 0, q, md).float()
            )
            .abs()
            .max()
        )
        flops = 4 * heads[0] * heads[2] * seqs * sum(prefix + i + 1 for i in range(chunk))
        t_tri = bench(lambda: paged_attention_triton(pool, 0, q, plan))
        t_ref = bench(lambda: paged_attention_torch(pool, 0, q, md))
        row = dict(
            seqs=seqs,
            chunk=chunk,
            prefix=prefix,
            max_error=err,
            triton_us=t_tri * 1e6,
            torch_us=t_ref * 1e6,
            triton_TFLOPs=flops / t_tri / 1e12,
            torch_TFLOPs=flops / t_ref / 1e12,
        )
        if prefix == 0:  # the triton_sdpa backend's library path reads the batch's own K/V
            row |= sdpa_prefill(pool, md, q, seqs, chunk, dry, flops)
        run.row(record, "prefill", row)
        pool = None  # freed before the next case allocates its own
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    errors = [r["max_error"] for r in record["decode"] + record["prefill"]]
    errors += [r["sdpa_error"] for r in record["prefill"] if "sdpa_error" in r]
    record["ok"] = all(not (e > tol) for e in errors)


def sdpa_prefill(pool, md, q, seqs: int, chunk: int, dry: bool, flops: int) -> dict:
    """The triton_sdpa backend on fresh prompts (SDPA on the batch's K/V, chapter 8b): its time,
    TFLOP/s and error against the torch reference, K/V read back from the pool the case filled."""
    from minillm.attention.paged import gather_kv, paged_attention_torch
    from minillm.kernels.triton_sdpa import attention_triton_sdpa, plan_triton_sdpa

    pairs = [gather_kv(pool, 0, md.block_tables[s], chunk) for s in range(seqs)]
    k, v = (torch.cat([pair[i] for pair in pairs]) for i in (0, 1))
    plan = plan_triton_sdpa(pool, md)
    out = attention_triton_sdpa(pool, 0, q, plan, k, v)
    err = float((out.float() - paged_attention_torch(pool, 0, q, md).float()).abs().max())
    t = timed(dry, lambda: attention_triton_sdpa(pool, 0, q, plan, k, v))
    return dict(
        sdpa_prompts=len(plan.fresh), sdpa_error=err, sdpa_us=t * 1e6, sdpa_TFLOPs=flops / t / 1e12
    )


# the tiles tried per kernel: decode (keys a tile, warps), prefill (queries and keys a tile, warps)
DECODE_TILES = [dict(BLOCK_N=n, num_warps=w) for n in (16, 32, 64, 128) for w in (4, 8)]
PREFILL_TILES = [
    dict(BLOCK_M=m, BLOCK_N=n, num_warps=w) for m in (32, 64, 128) for n in (32, 64) for w in (4, 8)
]


def run_tiles(run: Run, record: dict):
    """A tile sweep of chapter 8b's kernels on this device: each candidate of `DECODE_TILES` and
    `PREFILL_TILES` put in the kernels' table (`TILES`) in turn, timed replayed from a CUDA graph,
    on one decode case (batch 64 at 2048 tokens) and one prefill case (8 x 1024); bfloat16 at
    head_dim 128 (the long form: 64, 128 and 256, float16 too). A candidate that does not compile
    or launch here is recorded with its error. The table is restored after."""
    from minillm.bench.kernels import decode_attention_bytes
    from minillm.kernels import triton_attention as ta

    dry, device = run.dry, run.device
    dtypes = [torch.float32] if dry else [torch.bfloat16, torch.float16][: 2 if run.long else 1]
    head_dims = [32] if dry else ([64, 128, 256] if run.long else [128])
    decode_case, prefill_case = ((2, 20), (2, 17)) if dry else ((64, 2048), (8, 1024))
    torch.manual_seed(0)
    for dtype in dtypes:
        for head_dim in head_dims:
            heads = (16, 8, head_dim) if not dry else (4, 2, head_dim)
            for kernel, candidates in (("decode", DECODE_TILES), ("prefill", PREFILL_TILES)):
                key = (kernel, dtype.itemsize, max(head_dim, 64))
                chosen = ta.TILES[key]
                for tile in candidates[:2] if dry else candidates:
                    ta.TILES[key] = tile
                    row = dict(kernel=kernel, dtype=str(dtype), head_dim=head_dim, **tile)
                    row["chosen"] = tile == chosen
                    try:
                        if kernel == "decode":
                            batch, context = decode_case
                            pool, md, q = paged_case(
                                batch, 1, context - 1, heads, 16, dtype, device
                            )
                            plan = ta.plan_triton_attention(pool, md)
                            t = timed_graph(
                                dry, lambda: ta.paged_attention_triton(pool, 0, q, plan)
                            )
                            nbytes = decode_attention_bytes(
                                batch, context, *heads, q.element_size()
                            )
                            row |= dict(us=t * 1e6, GBps=nbytes / t / 1e9)
                        else:
                            seqs, chunk = prefill_case
                            pool, md, q = paged_case(seqs, chunk, 0, heads, 16, dtype, device)
                            plan = ta.plan_triton_attention(pool, md)
                            t = timed_graph(
                                dry, lambda: ta.paged_attention_triton(pool, 0, q, plan)
                            )
                            flops = 4 * heads[0] * head_dim * seqs * chunk * (chunk + 1) // 2
                            row |= dict(us=t * 1e6, TFLOPs=flops / t / 1e12)
                    except Exception as e:  # out of shared memory, registers...
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    finally:
                        ta.TILES[key] = chosen
                        pool = None
                    run.row(record, "tiles", row)
    record["ok"] = any("error" not in r for r in record.get("tiles", []))


def hf_with_dummy_weights(path: Path, dtype, device):
    "transformers' model of `path`'s config with minillm's dummy weights (load_format='dummy')."
    from transformers import AutoConfig, AutoModelForCausalLM

    from minillm.loader import dummy_state_dict

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.load_state_dict(dummy_state_dict(path, device), strict=False)  # a tied head: not listed
    hf.tie_weights()
    return hf.eval()


def run_engine(run: Run, record: dict):
    """nano-vllm's workload through minillm (triton with CUDA graphs, with and without async
    scheduling, and triton_sdpa; the long form adds triton eager and the torch backend) on dummy
    weights, against its floor (chapter 17: every step reads the weights and the running
    sequences' K/V, at the copy bandwidth the kernels section measured), and transformers'
    continuous batching on as many of the same requests as it finishes in time (all of them in the
    long form)."""
    from minillm.bench.engine_loop import step_profile, workload_floor
    from minillm.bench.offline import random_workload, run_hf_continuous
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM
    from minillm.models.decoder import kv_cache_bytes_per_token
    from minillm.sampling import SamplingParams

    device, dry = run.device, run.dry
    tiny = TINY if dry else {}
    path = random_model_dir(run.workdir / "engine-qwen3", "Qwen3-0.6B", weights=False, **tiny)
    n, lo, hi = (2, 4, 8) if dry else (256, 100, 1024)
    w = random_workload(n, (lo, hi), (lo, hi), seed=0, vocab=(2, 1000 if dry else 100000))
    dtype = "float32" if dry else "bfloat16"
    record["workload"] = dict(
        requests=n,
        prompt=[lo, hi],
        output=[lo, hi],
        output_tokens=w.output_tokens,
        dtype=dtype,
        weights="dummy",
    )
    graphs = dict(attention_backend="triton", enforce_eager=False)
    setups = {  # chapter 17's overlap (on by default on CUDA), and without it
        "triton + CUDA graphs": graphs,
        "triton + CUDA graphs, no async scheduling": dict(graphs, async_scheduling=False),
        # chapter 8b's library path for prompts with nothing cached
        "triton_sdpa + CUDA graphs": dict(graphs, attention_backend="triton_sdpa"),
    }
    if run.long:  # (eager ran at half the graphs' speed on the H200, 2026-12-04)
        setups["triton eager"] = dict(attention_backend="triton", enforce_eager=True)
        setups["torch"] = dict(attention_backend="torch", enforce_eager=True)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in w.output_lens]
    for name, kw in setups.items():
        t = time.perf_counter()
        llm = LLM(
            str(path),
            load_format="dummy",
            dtype=dtype,
            device=device,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            gpu_memory_utilization=0.5,
            **kw,
        )
        llm.generate(w.prompts[:2], params[:2], use_tqdm=False)  # warm-up
        ready = time.perf_counter() - t
        t = time.perf_counter()
        outs = llm.generate(w.prompts, params, use_tqdm=False)
        secs = time.perf_counter() - t
        lat = [o.metrics for o in outs]
        tokens = sum(len(o.token_ids) for o in outs)
        model = llm.engine.model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        per_token = kv_cache_bytes_per_token(model.config, getattr(torch, dtype))
        run.row(
            record,
            "runs",
            dict(
                setup=name,
                seconds=secs,
                output_tokens=tokens,
                tokens_per_s=tokens / secs,
                ttft_p50=percentile([x.ttft for x in lat], 50),
                ttft_p99=percentile([x.ttft for x in lat], 99),
                tpot_p50=percentile([x.tpot for x in lat], 50),
                tpot_p99=percentile([x.tpot for x in lat], 99),
                startup_s=ready,
                attention_backend=llm.engine.runner.attention_backend,
                cuda_graphs=llm.engine.runner.graphs is not None,
                async_scheduling=llm.engine.overlap is not None,
                num_kv_blocks=llm.engine.block_manager.num_blocks,
            ),
        )
        if name == "triton + CUDA graphs":  # where a step's time goes (chapter 17's step_profile)
            batch, context = (4, 8) if dry else (256, 512)
            try:
                record["profile"] = dict(setup=name, **step_profile(llm, batch, context))
            except Exception as e:  # the other setups still run
                log.exception("step_profile failed")
                record["profile"] = dict(setup=name, error=f"{type(e).__name__}: {e}")
            run.save()
        del llm, outs
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    subset = n if run.long or dry else 32  # transformers finishes these within the budget
    hf = hf_with_dummy_weights(path, getattr(torch, dtype), device)
    run_hf_continuous(hf, random_workload(2, (lo, lo + 4), (2, 4), seed=1, vocab=(2, 1000)))
    part = dataclasses.replace(w, prompts=w.prompts[:subset], output_lens=w.output_lens[:subset])
    tokens, secs = run_hf_continuous(hf, part, max_batch_tokens=8192)
    theirs = sum(map(len, tokens)) / secs
    run.row(
        record,
        "runs",
        dict(
            setup="transformers continuous batching",
            requests=subset,
            seconds=secs,
            output_tokens=sum(map(len, tokens)),
            tokens_per_s=theirs,
        ),
    )
    ours = [r for r in record["runs"] if r["setup"] == "triton + CUDA graphs"][0]
    record["graphs_vs_transformers"] = ours["tokens_per_s"] / theirs  # (transformers: a subset)
    bandwidth = run.results.get("kernels", {}).get("copy_bandwidth_GBps", float("nan")) * 1e9
    floor = workload_floor([len(p) for p in w.prompts], w.output_lens, weight_bytes, per_token)
    floor_s = floor / bandwidth
    record["floor"] = dict(
        bytes=floor,
        bandwidth_GBps=bandwidth / 1e9,
        seconds=floor_s,
        tokens_per_s=w.output_tokens / floor_s,
        graphs_fraction=ours["tokens_per_s"] * floor_s / w.output_tokens,
    )
    record["ok"] = all(r["output_tokens"] == w.output_tokens for r in record["runs"][:-1])


def run_loop(run: Run, record: dict):
    """Chapter 17 on this machine: `host_overhead` at batches 64 and 256 (the engine's own work per
    decode step, the forward free, graphs off so that the free forward runs), and
    `served_against_offline`: the same requests through `LLM.generate` and through `minillm serve`
    with every one streaming at once, the engine on the server's thread and in a process of its
    own (Qwen3-0.6B's shape on dummy weights)."""
    from minillm.bench.engine_loop import host_overhead, served_against_offline
    from minillm.bench.random_models import random_model_dir
    from minillm.bench.vllm_bench import random_dataset
    from minillm.loader import load_tokenizer

    dry = run.dry
    for batch in (4,) if dry else (64, 256):
        steps, repeats, vocab = (4, 2, 1024) if dry else (32, 5, 49152)
        o = host_overhead(batch, steps, repeats, vocab_size=vocab)
        row = dict(batch=batch, ms=o.ms, low=o.low, high=o.high, phases=o.phases)
        run.row(record, "host_overhead", row)
    path = random_model_dir(
        run.workdir / "loop-qwen3", "Qwen3-0.6B", weights=False, **(TINY if dry else {})
    )
    n, length = (4, 8) if dry else (256, 128)
    requests = random_dataset(load_tokenizer(path), n, length, length, seed=0)
    both = served_against_offline(
        str(path),
        requests,
        repeats=1 if dry else 2,
        warmup=0 if dry else 1,
        log=str(run.out / "served.log"),
        load_format="dummy",
        dtype="float32" if dry else "bfloat16",
        device=run.device,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.5,
        # the engine on the server's thread, and in a process of its own (chapter 17)
        servers={"served": [], "served_process": ["--engine-process"]},
    )
    offline = max(both["offline_tok_s"])
    record["served"] = dict(requests=n, prompt=length, output=length, **both)
    for name in ("served", "served_process"):
        served = max(both[f"{name}_tok_s"])
        record["served"][f"best_{name}_over_best_offline"] = served / offline
        log.info(
            "%s %.0f tok/s against %.0f offline (%.2f)", name, served, offline, served / offline
        )
    record["ok"] = all(t == sum(m for _, m in requests) for t in both["output_tokens"])


SECTIONS = {
    "aot": run_aot,
    "pytest": run_pytest,
    "exactness": run_exactness,
    "features": run_features,
    "kernels": run_kernels,
    "tiles": run_tiles,
    "engine": run_engine,
    "loop": run_loop,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="the folder for gpu_check.json and gpu_check.log")
    p.add_argument(
        "--dry",
        action="store_true",
        help="tiny shapes, the Triton interpreter, no timings: runs on any CPU",
    )
    p.add_argument("--long", action="store_true", help="full workloads, budgets x%d" % LONG)
    p.add_argument("--only", default=None, help="comma-separated sections: " + ",".join(SECTIONS))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(out / "gpu_check.log", mode="w"), logging.StreamHandler()],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request of a load
    device = "cuda" if torch.cuda.is_available() and not args.dry else "cpu"
    if not args.dry and device != "cuda":
        sys.exit("gpu_check: no CUDA device; run with --dry for the CPU dry mode")
    only = args.only.split(",") if args.only else list(SECTIONS)
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        sys.exit(f"gpu_check: no section {unknown[0]!r}; the sections: {', '.join(SECTIONS)}")
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        dry=args.dry,
        long=args.long,
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__,
        triton=triton_version,
        transformers=transformers.__version__,
        python=platform.python_version(),
        commit=subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or None,
    )
    log.info("gpu_check: %s", meta)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        run = Run(out, args.dry, args.long, device, Path(d), {"meta": meta})
        run.save()
        for name in [s for s in SECTIONS if s in only]:
            run.section(name, SECTIONS[name])
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    run.save()
    failed = [k for k, v in run.results.items() if isinstance(v, dict) and "error" in v]
    log.info("done in %.0f s; sections that failed: %s", meta["seconds"], failed or "none")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
