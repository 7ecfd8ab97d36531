"""minillm replicas behind the production routers, vLLM's (`vllm-router`) and SGLang's gateway
(`sglang-router`), both from PyPI: the worker endpoints they call (/health, /get_load,
/flush_cache), the fields they add to every request (SGLang's), their cache-aware and power-of-two
policies, and a replica killed under them. Answers go through the official openai client and must
equal one engine's greedy answers."""

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import minillm_serve, openai_client
from prometheus_client.parser import text_string_to_metric_families

from minillm.bench.online import free_port

ROUTERS = {  # the command that starts each; both take the same flags
    "vllm-router": [str(Path(sys.executable).parent / "vllm-router")],
    "sglang-router": [sys.executable, "-m", "sglang_router.launch_router"],
}
# two groups of prompts, each sharing a long prefix: what a cache-aware router keeps together
PREFIXES = [
    "You are a careful assistant for a bakery. Answer in one short sentence. " * 3,
    "You are a terse assistant for a train station. Answer in one short sentence. " * 3,
]
QUESTIONS = ["When do you open?", "What is cheapest?", "Where is it?", "Can I pay by card?"]
PROMPTS = [p + q for p in PREFIXES for q in QUESTIONS]


@pytest.fixture(scope="module")
def replicas(model_dir, tmp_path_factory):
    "Two `minillm serve` replicas: their base URLs and processes."
    logs = tmp_path_factory.mktemp("replicas")
    with ExitStack() as stack:
        started = [
            stack.enter_context(
                minillm_serve(model_dir, logs / f"r{i}.log", "--served-model-name", "m")
            )
            for i in range(2)
        ]
        yield started


@contextmanager
def production_router(kind: str, urls: list[str], policy: str, log: Path):
    "Router `kind` in front of `urls`: yields its base URL once it answers /health."
    port = free_port()
    cmd = [*ROUTERS[kind], "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    cmd += ["--worker-urls", *urls, "--prometheus-port", str(free_port())]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{kind} did not become healthy")
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def answers(base: str, prompts: list[str]) -> list[str]:
    # generous: on a 2-core AVX2 machine with both test workers busy, one answer through a router
    # took over 120 s in a fresh-clone run (the same test alone: 60 s for both routers)
    client = openai_client(base, timeout=300)
    outs = []
    for p in prompts:
        r = client.completions.create(model="m", prompt=p, max_tokens=8, temperature=0)
        outs.append(r.choices[0].text)
    return outs


def samples(base: str) -> dict:
    "A replica's vLLM-named metrics: {(sample name, sorted labels): value}."
    text = httpx.get(f"{base}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:")
    }


def served(base: str) -> float:
    "Requests a replica finished, from its vLLM-named metric."
    return sum(v for (name, _), v in samples(base).items() if name == "vllm:request_success_total")


def test_the_worker_endpoints_a_router_calls(replicas):
    base = replicas[0][0]
    load = httpx.get(f"{base}/get_load").json()
    assert load == {"load": 0, "running": 0, "waiting": 0}
    info = httpx.get(f"{base}/get_server_info").json()
    assert info["served_model_name"] == "m" and info["block_size"] == 16
    answers(base, PROMPTS[:2])  # the second finds the first one's prefix cached
    got, m = samples(base), (("model_name", "m"),)
    assert got["vllm:num_requests_running", m] == got["vllm:kv_cache_usage_perc", m] == 0  # idle
    assert got["vllm:prompt_tokens_total", m] > 2 * len(PREFIXES[0]) // 8  # tokens, not requests
    assert served(base) == 2  # counted by finished_reason, as vLLM does
    assert got["vllm:prefix_cache_hits_total", m] > 0
    assert got["vllm:time_to_first_token_seconds_count", m] == 2
    flushed = httpx.post(f"{base}/flush_cache").json()["flushed_blocks"]
    assert flushed > 0
    assert httpx.post(f"{base}/flush_cache").json()["flushed_blocks"] == 0


@pytest.mark.parametrize("kind", ROUTERS)
@pytest.mark.parametrize("policy", ["cache_aware", "power_of_two"])
def test_replicas_behind_a_production_router(replicas, kind, policy, tmp_path):
    urls = [base for base, _ in replicas]
    expected = answers(urls[0], PROMPTS)  # one engine's greedy answers
    before = [served(u) for u in urls]
    with production_router(kind, urls, policy, tmp_path / "router.log") as router:
        assert answers(router, PROMPTS * 2) == expected * 2
        spread = [served(u) - b for u, b in zip(urls, before)]
        print(kind, policy, "requests per replica:", spread)
        assert sum(spread) == 2 * len(PROMPTS)
        if policy == "power_of_two":
            assert min(spread) > 0  # both replicas served
        assert httpx.post(f"{router}/flush_cache").status_code == 200


@pytest.mark.parametrize("kind", ROUTERS)
def test_a_killed_replica_is_routed_around(model_dir, kind, tmp_path):
    with ExitStack() as stack:
        started = [
            stack.enter_context(
                minillm_serve(model_dir, tmp_path / f"r{i}.log", "--served-model-name", "m")
            )
            for i in range(2)
        ]
        urls = [base for base, _ in started]
        expected = answers(urls[0], PROMPTS[:4])
        log = tmp_path / "router.log"
        router = stack.enter_context(production_router(kind, urls, "round_robin", log))
        assert answers(router, PROMPTS[:4]) == expected
        os.kill(started[1][1].proc.pid, signal.SIGKILL)
        started[1][1].proc.wait(10)
        assert answers(router, PROMPTS[:4] * 2) == expected * 2  # every one answered, by the other
