"""minillm against its peers, vLLM's CPU build and llama.cpp, on the same token-id workloads, in one
interleaved run with repeats.

    .venv/bin/python scripts/bench_peers.py [--rounds 3] [--engines a,b] [--workloads mixed]

scripts/peers_setup.sh installs the peers first (in ~/.cache/minillm/peers, outside .venv). Every
engine loads once, warms up on a small workload of other prompts, then each round runs every
(workload, engine) pair once: workload by workload, the engines in an order that rotates by round,
so that a slow patch of a busy machine does not land on one engine only. Greedy, ignore_eos: every
engine generates exactly the requested tokens, and each engine's tokens are compared with minillm
float32's. The JSON is rewritten after every measurement, so a run stopped midway keeps what it
measured.

Engines:
  minillm       minillm float32, in this process (LLM + minillm.bench.offline.run_minillm)
  minillm_gguf  minillm quantization="gguf" on the shipped Q4_1 file (its mixed workload is skipped
                when its warm-up says it would take longer than --gguf-mixed-limit seconds)
  vllm          vLLM's CPU build: one long-lived subprocess in vLLM's venv (this file,
                --vllm-worker),
                reading one workload a line on stdin and answering one JSON line
  llama_f32     llama-server on an f32 GGUF of the same weights, POST /completion (token-id prompts)
  llama_q4_1    llama-server on the shipped Q4_1 GGUF

This file imports nothing outside the standard library at module level: vLLM's venv runs it as the
worker, and minillm is imported only in the parent.
"""

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("PEERS", Path.home() / ".cache/minillm/peers"))
ENGINES = ("minillm", "minillm_gguf", "vllm", "llama_f32", "llama_q4_1")
WORKLOADS = {  # name: random_workload's arguments
    "mixed": dict(num_requests=32),  # prompts 16-256, outputs 16-128, seed 0
    "one_stream": dict(num_requests=1, prompt_len=(128, 128), output_len=(128, 128), seed=0),
}
# as offline_benchmark's; minillm_gguf, whose prompts run at a few tokens/s, warms up on less
WARMUP = dict(num_requests=4, prompt_len=(16, 256), output_len=(2, 4), seed=1)
WARMUP_GGUF = dict(num_requests=2, prompt_len=(16, 32), output_len=(2, 4), seed=1)
# minillm_gguf's probe: its time on the mixed workload is estimated from this one's output tokens/s
PROBE_GGUF = dict(num_requests=8, prompt_len=(16, 32), output_len=(8, 8), seed=2)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


# ---------------------------------------- vLLM worker
def vllm_worker(model: str, engine_args: dict):
    """Runs in vLLM's venv. Loads the model once, then for each JSON line on stdin
    ({"prompts": [[ids]], "output_lens": [n]}) generates and answers one JSON line
    ({"seconds": s, "tokens": [[ids]]}) on the real stdout; vLLM's own output goes to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout, and so do its engine-core processes, which inherit fd 1
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, **engine_args)
    load_s = time.perf_counter() - t0

    def run(prompts, output_lens):
        ps = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        sp = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]
        t = time.perf_counter()
        outs = llm.generate(ps, sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - t

    import torch

    info = dict(
        ready=True,
        load_seconds=load_s,
        vllm=vllm.__version__,
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        env={k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "OMP_", "KMP_"))},
    )
    print(json.dumps(info), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        tokens, secs = run(cmd["prompts"], cmd["output_lens"])
        print(json.dumps(dict(seconds=secs, tokens=tokens)), file=out, flush=True)


# ---------------------------------------- engines
class MinillmEngine:
    def __init__(self, name, **kwargs):
        from minillm import LLM

        self.name, self.kwargs = name, kwargs
        t = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.load_seconds = time.perf_counter() - t

    def config(self):
        import torch

        import minillm

        c = self.llm.config
        return dict(
            kind="minillm, in process",
            llm_kwargs=self.kwargs,
            model_path=str(self.llm.model_path),
            dtype=str(self.llm.engine.runner.dtype).removeprefix("torch."),
            attention_backend=c.attention_backend,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            enable_prefix_caching=c.enable_prefix_caching,
            torch=torch.__version__,
            torch_threads=torch.get_num_threads(),
            minillm_file=minillm.__file__,
            load_seconds=self.load_seconds,
        )

    def run(self, w):
        from minillm.bench.offline import run_minillm

        return run_minillm(self.llm, w)

    def pause(self):
        "In this process: it takes no CPU between its turns."

    resume = pause

    def close(self):
        self.llm.shutdown()


class VllmEngine:
    def __init__(self, python, model, engine_args, log_path, timeout=900):
        self.engine_args = engine_args
        env = dict(
            os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1"
        )
        env.setdefault("VLLM_CACHE_ROOT", str(PEERS / "vllm-cache"))  # its compile cache
        env.pop("PYTHONPATH", None)
        self.cmd = [
            str(python),
            str(Path(__file__).resolve()),
            "--vllm-worker",
            "--vllm-model",
            str(model),
            "--vllm-engine-args",
            json.dumps(engine_args),
        ]
        self.log = open(log_path, "a")
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.info = self._read(timeout)
        self.load_seconds = time.perf_counter() - t

    def _read(self, timeout):
        result = {}

        def reader():
            result["line"] = self.proc.stdout.readline()

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        th.join(timeout)
        line = result.get("line")
        if not line:
            raise RuntimeError(
                f"vLLM worker gave no answer (exit code {self.proc.poll()}); see {self.log.name}"
            )
        return json.loads(line)

    def config(self):
        return dict(
            kind="vLLM CPU, one long-lived subprocess",
            command=self.cmd,
            engine_args=self.engine_args,
            worker=self.info,
            load_seconds=self.load_seconds,
            log=self.log.name,
        )

    def run(self, w):
        self.proc.stdin.write(json.dumps(dict(prompts=w.prompts, output_lens=w.output_lens)) + "\n")
        self.proc.stdin.flush()
        r = self._read(3600)
        return r["tokens"], r["seconds"]

    def pause(self):
        stop_group(self.proc, resume=False)

    def resume(self):
        stop_group(self.proc, resume=True)

    def close(self):
        self.resume()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps(dict(cmd="quit")) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except Exception:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def stop_group(proc, resume: bool):
    """Freeze (SIGSTOP) or thaw (SIGCONT) an engine's whole process group: a loaded engine that
    waits for its turn must not take CPU from the one being measured (vLLM's CPU worker spins on a
    core while idle)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT if resume else signal.SIGSTOP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServerEngine:
    def __init__(self, server, model, threads, parallel, ctx, log_path, timeout=600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(server),
            "-m",
            str(model),
            "-t",
            str(threads),
            "-np",
            str(parallel),
            "-c",
            str(ctx),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self.parallel = parallel
        self.log = open(log_path, "a")
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.proc.returncode}; see {self.log.name}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline:
                raise RuntimeError(
                    f"llama-server not healthy after {timeout} s; see {self.log.name}"
                )
            time.sleep(0.5)
        self.load_seconds = time.perf_counter() - t
        version = subprocess.run([str(server), "--version"], capture_output=True, text=True)
        self.version = (version.stdout + version.stderr).strip().splitlines()
        self.request_fields = dict(
            temperature=0,
            top_k=1,
            ignore_eos=True,
            cache_prompt=False,
            return_tokens=True,
            stream=False,
        )

    def config(self):
        return dict(
            kind="llama.cpp llama-server, POST /completion with token-id prompts",
            command=self.cmd,
            request_fields=self.request_fields,
            version=self.version,
            load_seconds=self.load_seconds,
            log=self.log.name,
        )

    def _one(self, prompt, n):
        body = json.dumps(dict(prompt=prompt, n_predict=n, **self.request_fields)).encode()
        req = urllib.request.Request(
            self.url + "/completion", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())

    def run(self, w):
        with ThreadPoolExecutor(max(1, min(len(w.prompts), self.parallel))) as pool:
            t = time.perf_counter()
            outs = list(pool.map(self._one, w.prompts, w.output_lens))
            secs = time.perf_counter() - t
        return [o["tokens"] for o in outs], secs

    def pause(self):
        stop_group(self.proc, resume=False)

    def resume(self):
        stop_group(self.proc, resume=True)

    def close(self):
        self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# ---------------------------------------- machine
def machine_info():
    from minillm.bench.measure import machine_peaks

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("Flags", "").split())
    t = time.perf_counter()
    peaks = machine_peaks()
    return dict(
        model_name=fields.get("Model name"),
        cpus=os.cpu_count(),
        avx512f="avx512f" in flags,
        avx2="avx2" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx_tile="amx_tile" in flags,
        hostname=platform.node(),
        python=platform.python_version(),
        loadavg_at_start=os.getloadavg(),
        peaks=dict(
            bandwidth_gb_s=peaks["bandwidth"] / 1e9,
            float32_gflops=peaks["float32"] / 1e9,
            bfloat16_gflops=peaks.get("bfloat16", 0) / 1e9,
            threads=peaks.get("threads"),
            measure_seconds=time.perf_counter() - t,
        ),
    )


def round_peaks() -> dict:
    """The read bandwidth and the float32 GEMM rate now, with every engine stopped: this machine's
    move from minute to minute, so each round measures its own (best of 5 each; GEMMs of 512, 1024
    and 2048, the best of them, since the fastest size also moves)."""
    from minillm.bench.roofline import measure_bandwidth, measure_peak_flops

    return dict(
        bandwidth_gb_s=measure_bandwidth() / 1e9,
        float32_gflops=max(measure_peak_flops(n) for n in (512, 1024, 2048)) / 1e9,
    )


def source_state():
    "The commit minillm was measured at, and its files that differ from it (what was measured)."

    def git(*a):
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return r.stdout.rstrip() if r.returncode == 0 else None

    changed = git("status", "--porcelain", "--", "minillm")
    return dict(
        commit=git("rev-parse", "HEAD"), uncommitted=changed.splitlines() if changed else []
    )


# ---------------------------------------- driver
def agreement(tokens, ref):
    """Fraction of requests with the same tokens as `ref`, and the mean share of each output that
    its common prefix with `ref` covers."""
    same = sum(a == b for a, b in zip(tokens, ref)) / len(ref)
    prefix = []
    for a, b in zip(tokens, ref):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix.append(k / max(1, len(b)))
    return same, sum(prefix) / len(prefix)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated subset of {','.join(ENGINES)}",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}",
    )
    ap.add_argument("--output", default=str(REPO / "bench-results/peers.json"))
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="llama-server -t (default: all cores)"
    )
    ap.add_argument("--llama-parallel", type=int, default=32, help="llama-server -np")
    ap.add_argument(
        "--torch-threads",
        type=int,
        help="torch.set_num_threads for minillm in this process (default: torch's own, one a core)",
    )
    ap.add_argument(
        "--llama-ctx", type=int, default=16384, help="llama-server -c (shared by its slots)"
    )
    ap.add_argument(
        "--prefix-caching",
        action="store_true",
        help="leave prefix caching on in minillm and vLLM (off by default: the rounds repeat the "
        "same prompts, which a prefix cache would serve from memory, and llama.cpp runs with "
        "cache_prompt false)",
    )
    ap.add_argument(
        "--gguf-mixed-limit",
        type=float,
        default=300,
        help="skip minillm_gguf's mixed workload when its estimate is above this many seconds",
    )
    ap.add_argument(
        "--vllm-kv-cache-gb",
        type=int,
        default=2,
        help="VLLM_CPU_KVCACHE_SPACE for the worker (GiB), unless already set",
    )
    # the vLLM worker's mode (run by vLLM's venv python)
    ap.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-model", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-engine-args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        return vllm_worker(args.vllm_model, json.loads(args.vllm_engine_args))

    engines = [e for e in args.engines.split(",") if e]
    workloads = [w for w in args.workloads.split(",") if w]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}; choose from {ENGINES}")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {tuple(WORKLOADS)}")
    if "minillm" not in engines:
        log("minillm float32 is not in --engines: no greedy agreement will be computed")

    sys.path.insert(0, str(REPO))
    from minillm.bench.offline import random_workload
    from minillm.loader import default_gguf_path, resolve_model_path

    out_path = Path(args.output).resolve()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    logs = out_path.parent / (out_path.stem + "-logs")
    logs.mkdir(exist_ok=True)
    peers_file = PEERS / "peers.json"
    peers = json.loads(peers_file.read_text()) if peers_file.exists() else {}
    needs_peers = [e for e in engines if e in ("vllm", "llama_f32", "llama_q4_1")]
    if needs_peers and not peers:
        sys.exit(
            f"{peers_file} is missing: run scripts/peers_setup.sh first (needed by {needs_peers})"
        )

    started = time.time()
    result = dict(
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        argv=sys.argv,
        rounds=args.rounds,
        machine=None,
        workloads={},
        engines={},
        results={e: {} for e in engines},
        order=[],
        peaks_by_round=[],
        notes=[],
    )

    def save():
        result["wall_seconds"] = time.time() - started
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out_path)

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    log("measuring the machine's peaks")
    result["machine"] = machine_info()
    result["minillm_source"] = source_state()
    save()

    ws = {name: random_workload(**WORKLOADS[name]) for name in workloads}
    for name, w in ws.items():
        result["workloads"][name] = dict(
            random_workload_args=WORKLOADS[name],
            num_requests=len(w.prompts),
            prompt_tokens=sum(map(len, w.prompts)),
            output_tokens=w.output_tokens,
        )
    warmup = random_workload(**WARMUP)
    result["warmup_workload"] = dict(random_workload_args=WARMUP, minillm_gguf=WARMUP_GGUF)

    hf_dir = resolve_model_path(None)
    q41 = default_gguf_path()
    caching = args.prefix_caching
    live = {}
    skip = {}  # (engine, workload) -> reason

    def start(name):
        log(f"starting {name}")
        if name == "minillm":
            return MinillmEngine(name, dtype="float32", enable_prefix_caching=caching)
        if name == "minillm_gguf":
            return MinillmEngine(
                name, quantization="gguf", dtype="float32", enable_prefix_caching=caching
            )
        if name == "vllm":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.vllm_kv_cache_gb))
            engine_args = dict(dtype="float32", seed=0, enable_prefix_caching=caching)
            return VllmEngine(peers["vllm_python"], hf_dir, engine_args, logs / "vllm.log")
        if name in ("llama_f32", "llama_q4_1"):
            model = peers["gguf_f32"] if name == "llama_f32" else peers.get("gguf_q4_1", q41)
            return LlamaServerEngine(
                peers["llama_server"],
                model,
                args.threads,
                args.llama_parallel,
                args.llama_ctx,
                logs / f"{name}.log",
            )
        raise ValueError(name)

    try:
        for name in engines:
            try:
                eng = start(name)
                _, wsecs = eng.run(
                    random_workload(**WARMUP_GGUF) if name == "minillm_gguf" else warmup
                )
                cfg = eng.config()
                cfg["warmup_seconds"] = wsecs
                log(f"{name}: loaded in {cfg.get('load_seconds', 0):.1f} s, warm-up {wsecs:.1f} s")
                if name == "minillm_gguf" and "mixed" in ws:
                    # Its time on the mixed workload, from a probe of 8 requests of 8 tokens
                    # (batching hardly speeds its blocks up, chapter 13).
                    probe = random_workload(**PROBE_GGUF)
                    _, psecs = eng.run(probe)
                    est = psecs / probe.output_tokens * ws["mixed"].output_tokens
                    cfg["mixed_probe"] = dict(random_workload_args=PROBE_GGUF, seconds=psecs)
                    cfg["mixed_estimate_seconds"] = est
                    if est > args.gguf_mixed_limit:
                        skip[(name, "mixed")] = (
                            f"skipped: estimated {est:.0f} s (> --gguf-mixed-limit "
                            f"{args.gguf_mixed_limit:g} s) from a probe of 8 requests x 8 tokens "
                            f"at {probe.output_tokens / psecs:.1f} output tokens/s"
                        )
                        log(f"{name}: {skip[(name, 'mixed')]}")
                eng.pause()
                live[name] = eng
                result["engines"][name] = cfg
            except Exception as e:
                log(f"{name} failed to start: {e!r}")
                result["engines"][name] = dict(error=repr(e), traceback=traceback.format_exc())
            save()

        reference = {}  # workload -> minillm float32's tokens (its first run)
        names = [e for e in engines if e in live]
        for r in range(args.rounds):
            result["peaks_by_round"].append(round_peaks())
            log(f"round {r}: {result['peaks_by_round'][-1]}")
            for wname in workloads:
                w = ws[wname]
                k = r % len(names) if names else 0
                for name in names[k:] + names[:k]:
                    entry = result["results"][name].setdefault(
                        wname,
                        dict(
                            output_tokens=w.output_tokens,
                            seconds=[],
                            tokens_per_s=[],
                            produced_tokens=[],
                        ),
                    )
                    if (name, wname) in skip:
                        entry["skipped"] = skip[(name, wname)]
                        continue
                    load = os.getloadavg()[0]
                    try:
                        live[name].resume()
                        tokens, secs = live[name].run(w)
                        live[name].pause()
                    except Exception as e:
                        log(f"round {r} {wname} {name} failed: {e!r}")
                        entry.setdefault("errors", []).append(repr(e))
                        save()
                        continue
                    entry["seconds"].append(secs)
                    entry["tokens_per_s"].append(w.output_tokens / secs)
                    entry["produced_tokens"].append(sum(map(len, tokens)))
                    if name == "minillm" and wname not in reference:
                        reference[wname] = tokens
                    elif name == "minillm":
                        entry.setdefault("same_tokens_as_first_run", []).append(
                            agreement(tokens, reference[wname])[0]
                        )
                    elif wname in reference:
                        same, prefix = agreement(tokens, reference[wname])
                        entry.setdefault("same_tokens_as_minillm_f32", []).append(same)
                        entry.setdefault("common_prefix_share", []).append(prefix)
                    else:
                        entry.setdefault("pending_tokens", tokens)  # compared once minillm has run
                    result["order"].append(
                        dict(
                            round=r,
                            workload=wname,
                            engine=name,
                            seconds=secs,
                            loadavg_1m_before=load,
                        )
                    )
                    log(
                        f"round {r} {wname:10s} {name:12s} {secs:7.2f} s "
                        f"{w.output_tokens / secs:7.1f} tokens/s"
                    )
                    save()
            # engines that ran before minillm in the first round: compare now
            for name in names:
                for wname, entry in result["results"][name].items():
                    pending = entry.pop("pending_tokens", None)
                    if pending is not None and wname in reference:
                        same, prefix = agreement(pending, reference[wname])
                        entry.setdefault("same_tokens_as_minillm_f32", []).insert(0, same)
                        entry.setdefault("common_prefix_share", []).insert(0, prefix)
    finally:
        for name, eng in live.items():
            try:
                eng.close()
            except Exception as e:
                log(f"closing {name}: {e!r}")
        for name in result["results"]:
            for entry in result["results"][name].values():
                entry.pop("pending_tokens", None)

    summary = {}
    for name, per in result["results"].items():
        for wname, entry in per.items():
            if entry["tokens_per_s"]:
                summary.setdefault(name, {})[wname] = statistics.median(entry["tokens_per_s"])
            elif "skipped" in entry:
                summary.setdefault(name, {})[wname] = None
    result["median_tokens_per_s"] = summary
    result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    save()

    width = max(map(len, engines)) + 2
    print(
        f"{'tokens/s (median of ' + str(args.rounds) + ')':{width + 4}s}"
        + "".join(f"{w:>14s}" for w in workloads)
    )
    for name in engines:
        cells = []
        for wname in workloads:
            v = summary.get(name, {}).get(wname)
            cells.append(
                f"{v:14.1f}" if v else f"{'skipped' if (name, wname) in skip else '-':>14s}"
            )
        print(f"{name:{width + 4}s}" + "".join(cells))
    print(f"wrote {out_path} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
