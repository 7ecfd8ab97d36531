#!/usr/bin/env python3
"""The GPU path, proven: every GPU check in one command, for a bare CUDA machine.

    PYTHONPATH=. python3 scripts/gpu_check.py OUT_DIR        # CUDA: about 5 minutes on an H200
    PYTHONPATH=. python3 scripts/gpu_check.py OUT_DIR --dry  # anywhere: tiny shapes, interpreter

It installs nothing. It writes OUT_DIR/gpu_check.json (every result, with the GPU, the versions
and the date) and OUT_DIR/gpu_check.log:

0. what chapter 8b's compile report found without a GPU (build/gpu_compile*.json), what only this
   run can check beyond it, and the same compile for this device's own limits;
1. the compiled Triton kernel tests and the CUDA-graph tests (pytest: real capture and replay);
2. exactness on the GPU: minillm against transformers on random-weight models with the shapes of
   the default model, Qwen3-0.6B and Llama-3.2-1B: greedy tokens in float32 and logits within
   tolerance in bfloat16, with prefix caching, chunked prefill, preemption and CUDA graphs on;
3. kernel benchmarks: paged decode (achieved GB/s against the measured copy bandwidth, over batch
   and context) and varlen prefill (TFLOP/s), against the torch reference;
4. the engine on nano-vllm's workload (256 requests, prompts and outputs uniform in 100-1024,
   Qwen3-0.6B's shape, bfloat16, random weights, ignore_eos): torch backend, triton eager, triton
   with CUDA graphs, and transformers' own continuous batching, with output tokens/s and TTFT/TPOT
   percentiles.

Each section runs on its own: one that fails is recorded with its error and the others still
run. The dry mode runs the same code on tiny shapes so that the script cannot rot (CI runs it,
through tests/test_gpu_check.py).
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


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def section(name):
    """Run a section, record its result or its error and its time; never let one section stop the
    others."""

    def wrap(fn):
        def run(results, *args):
            t = time.perf_counter()
            log.info("== %s", name)
            try:
                results[name] = fn(*args)
            except Exception as e:
                log.error("%s failed: %s\n%s", name, e, traceback.format_exc())
                results[name] = {"error": f"{type(e).__name__}: {e}"}
            results[name]["seconds"] = round(time.perf_counter() - t, 1)
            log.info("%s: %.1f s", name, results[name]["seconds"])

        return run

    return wrap


@section("pytest")
def run_pytest(dry: bool):
    """The compiled kernel and CUDA-graph tests (on CPU, in dry mode, a few of them under the
    interpreter)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/test_kernels.py",
        "tests/test_cuda_graphs.py",
    ]
    if dry:  # the plumbing only: the suite runs these tests on CPU anyway
        cmd += ["-k", "store_kv or backend_choice"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    log.info(r.stdout[-3000:])
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
    counts = {
        kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail)
    }
    return {
        "returncode": r.returncode,
        "summary": tail,
        "counts": counts,
        "ok": r.returncode == 0 and counts.get("passed", 0) > 0,
    }


# What chapter 8b's compile report (make gpu-compile, on any CPU) cannot check: only a GPU run can
BEYOND_THE_REPORT = {
    "launch": "that the compiled kernels run and compute the right values on a device (pytest, "
    "exactness)",
    "timing": "how fast they run: bandwidth, TFLOP/s, tokens/s (kernels, engine)",
    "graph capture": "that decode steps capture into CUDA graphs and replay exactly (pytest, "
    "exactness, engine)",
    "the driver's limits": "this GPU's own shared memory and register file, read from the device "
    "(aot, on a GPU)",
}


@section("aot")
def run_aot(dry: bool):
    """The compile report's verdict as committed to build/, and on a GPU the same compile for this
    device's own limits and Triton."""
    out = {"beyond_the_report": BEYOND_THE_REPORT}
    for report in sorted((ROOT / "build").glob("gpu_compile*.json")):
        rows = json.loads(report.read_text())
        verdict = dict(compiles=len(rows), triton=rows[0].get("triton") if rows else None)
        verdict["spills"] = sum(bool(r["spill_bytes"]) for r in rows)
        verdict["cannot_launch"] = sum(bool(r["error"]) for r in rows)
        out[report.name] = verdict
    if not dry:  # compiling needs the kernels as JIT functions, which the dry mode's are not
        from minillm.bench import gpu_compile
        from minillm.kernels import aot

        target = aot.Target.of_device(0)
        rows = [aot.compile_config(c, target) for c in gpu_compile.engine_configs()]
        out["this_gpu"] = dict(
            target=dataclasses.asdict(target),
            compiles=len(rows),
            spills=[r.config for r in rows if r.spill_bytes],
            cannot_launch=[aot.launch_error(r) for r in rows if r.error],
            max_registers=max(r.registers for r in rows),
        )
    out["ok"] = dry or not (out["this_gpu"]["spills"] or out["this_gpu"]["cannot_launch"])
    return out


@section("exactness")
def run_exactness(dry: bool, device: str, workdir: Path):
    """Greedy tokens in float32 against transformers, every mechanism on; bfloat16 logits within
    tolerance."""
    from minillm.bench.offline import hf_greedy
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM
    from minillm.loader import load_hf_model
    from minillm.models.decoder import no_cache_attention
    from minillm.sampling import SamplingParams
    from minillm.utils import cdiv

    tiny = dict(num_hidden_layers=2, intermediate_size=256, vocab_size=1024) if dry else {}
    rows = []
    for shape in ("SmolLM2-135M", "Qwen3-0.6B", "Llama-3.2-1B"):
        path = random_model_dir(workdir / shape, shape, device=device, **tiny)
        hf = load_hf_model(path, dtype=torch.float32, device=device)
        rng = random.Random(0)
        system = [rng.randrange(2, 900) for _ in range(40)]  # a shared prefix: prefix-cache hits
        prompts = [
            system + [rng.randrange(2, 900) for _ in range(rng.randint(3, 60 if dry else 200))]
            for _ in range(6)
        ]
        steps = 8 if dry else 24
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
        outs += llm.generate(
            prompts[:2], params, use_tqdm=False
        )  # again: the prefix cache holds them
        same = sum(o.token_ids == r for o, r in zip(outs, refs + refs[:2]))
        eng = llm.engine
        row = dict(
            shape=shape,
            greedy_equal=f"{same}/{len(outs)}",
            preemptions=eng.scheduler.num_preemptions,
            cached_tokens=sum(o.num_cached_tokens for o in outs[-2:]),
            attention_backend=eng.config.attention_backend,
            cuda_graphs=not eng.config.enforce_eager,
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
        log.info("%s", row)
        rows.append(row)
        del hf, hf16, llm16, m
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    ok = all(
        r["greedy_equal"].split("/")[0] == r["greedy_equal"].split("/")[1]
        and r["bf16_within_tolerance"]
        and r["pool_free"]
        for r in rows
    )
    return {"ok": ok, "models": rows}


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


@section("kernels")
def run_kernels(dry: bool, device: str):
    """Decode GB/s against the copy bandwidth and prefill TFLOP/s, triton against the torch
    reference."""
    from minillm.attention.paged import paged_attention_torch
    from minillm.bench.kernels import decode_attention_bytes
    from minillm.kernels.triton_attention import paged_attention_triton, plan_triton_attention

    heads, bs = ((4, 2, 32), 16) if dry else ((16, 8, 128), 16)
    dtype = torch.float32 if dry else torch.bfloat16

    def bench(f):
        if dry:
            f()
            return float("nan")
        from triton.testing import do_bench

        return do_bench(f) * 1e-3  # seconds

    bandwidth = float("nan")
    if not dry:
        src = torch.empty(2**30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        bandwidth = 2 * src.numel() / bench(lambda: dst.copy_(src))
        del src, dst
    torch.manual_seed(0)
    decode = []
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
        decode.append(
            dict(
                batch=batch,
                context=context,
                splits=plan.num_splits,
                max_error=err,
                triton_us=t_tri * 1e6,
                torch_us=t_ref * 1e6,
                triton_GBps=nbytes / t_tri / 1e9,
                fraction_of_copy_bandwidth=nbytes / t_tri / bandwidth,
            )
        )
        log.info("decode %s", decode[-1])
        pool = None  # freed before the next case allocates its own
    prefill = []
    for seqs, chunk, prefix in (
        [(2, 17, 5)] if dry else [(8, 1024, 0), (4, 2048, 2048), (32, 256, 1024)]
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
        prefill.append(
            dict(
                seqs=seqs,
                chunk=chunk,
                prefix=prefix,
                max_error=err,
                triton_us=t_tri * 1e6,
                torch_us=t_ref * 1e6,
                triton_TFLOPs=flops / t_tri / 1e12,
                torch_TFLOPs=flops / t_ref / 1e12,
            )
        )
        log.info("prefill %s", prefill[-1])
        pool = None  # freed before the next case allocates its own
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    ok = all(not (r["max_error"] > tol) for r in decode + prefill)
    return {
        "ok": ok,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "decode": decode,
        "prefill": prefill,
        "heads": list(heads),
        "dtype": str(dtype),
    }


@section("engine")
def run_engine(dry: bool, device: str, workdir: Path):
    """nano-vllm's workload through minillm (three attention setups) and transformers' continuous
    batching."""
    from minillm.bench.offline import random_workload, run_hf_continuous
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM
    from minillm.loader import load_hf_model
    from minillm.sampling import SamplingParams

    tiny = dict(num_hidden_layers=2, intermediate_size=256, vocab_size=1024) if dry else {}
    path = random_model_dir(workdir / "engine-qwen3", "Qwen3-0.6B", device=device, **tiny)
    n, lo, hi = (2, 4, 8) if dry else (256, 100, 1024)
    w = random_workload(n, (lo, hi), (lo, hi), seed=0, vocab=(2, 1000 if dry else 100000))
    dtype = "float32" if dry else "bfloat16"
    setups = {
        "torch": dict(attention_backend="torch", enforce_eager=True),
        "triton eager": dict(attention_backend="triton", enforce_eager=True),
        "triton + CUDA graphs": dict(attention_backend="triton", enforce_eager=False),
    }
    rows = {}
    for name, kw in setups.items():
        llm = LLM(
            str(path),
            dtype=dtype,
            device=device,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            gpu_memory_utilization=0.5,
            **kw,
        )
        params = [
            SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in w.output_lens
        ]
        llm.generate(w.prompts[:2], params[:2], use_tqdm=False)  # warm-up
        t = time.perf_counter()
        outs = llm.generate(w.prompts, params, use_tqdm=False)
        secs = time.perf_counter() - t
        lat = [o.metrics for o in outs]
        rows[name] = dict(
            seconds=secs,
            output_tokens=sum(len(o.token_ids) for o in outs),
            tokens_per_s=sum(len(o.token_ids) for o in outs) / secs,
            ttft_p50=percentile([x.ttft for x in lat], 50),
            ttft_p99=percentile([x.ttft for x in lat], 99),
            tpot_p50=percentile([x.tpot for x in lat], 50),
            tpot_p99=percentile([x.tpot for x in lat], 99),
            config=dict(
                attention_backend=llm.config.attention_backend,
                enforce_eager=llm.config.enforce_eager,
                num_kv_blocks=llm.config.num_kv_blocks,
            ),
        )
        log.info("%s: %s", name, rows[name])
        del llm, outs
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    hf = load_hf_model(path, dtype=getattr(torch, dtype), device=device)
    run_hf_continuous(
        hf, random_workload(2, (lo, lo + 4), (2, 4), seed=1, vocab=(2, 1000))
    )  # warm-up
    tokens, secs = run_hf_continuous(hf, w, max_batch_tokens=8192)
    rows["transformers continuous batching"] = dict(
        seconds=secs, output_tokens=sum(map(len, tokens)), tokens_per_s=sum(map(len, tokens)) / secs
    )
    log.info("transformers: %s", rows["transformers continuous batching"])
    best = rows["triton + CUDA graphs"]["tokens_per_s"]
    return {
        "workload": dict(
            requests=n, prompt=[lo, hi], output=[lo, hi], output_tokens=w.output_tokens, dtype=dtype
        ),
        "runs": rows,
        "graphs_vs_transformers": best / rows["transformers continuous batching"]["tokens_per_s"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="the folder for gpu_check.json and gpu_check.log")
    p.add_argument(
        "--dry",
        action="store_true",
        help="tiny shapes, the Triton interpreter, no timings: runs on any CPU",
    )
    p.add_argument(
        "--only", default=None, help="comma-separated sections: aot,pytest,exactness,kernels,engine"
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(out / "gpu_check.log", mode="w"), logging.StreamHandler()],
    )
    device = "cuda" if torch.cuda.is_available() and not args.dry else "cpu"
    if not args.dry and device != "cuda":
        sys.exit("gpu_check: no CUDA device; run with --dry for the CPU dry mode")
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    results = {
        "meta": dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            dry=args.dry,
            device=torch.cuda.get_device_name()
            if device == "cuda"
            else platform.processor() or "cpu",
            torch=torch.__version__,
            triton=triton_version,
            transformers=transformers.__version__,
            python=platform.python_version(),
        )
    }
    log.info("gpu_check: %s", results["meta"])
    sections = {"aot", "pytest", "exactness", "kernels", "engine"}
    only = set(args.only.split(",")) if args.only else sections
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        if "aot" in only:
            run_aot(results, args.dry)
        if "pytest" in only:
            run_pytest(results, args.dry)
        if "exactness" in only:
            run_exactness(results, args.dry, device, workdir)
        if "kernels" in only:
            run_kernels(results, args.dry, device)
        if "engine" in only:
            run_engine(results, args.dry, device, workdir)
    results["meta"]["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=float))
    failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    log.info(
        "done in %.0f s; sections that failed: %s", results["meta"]["seconds"], failed or "none"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
