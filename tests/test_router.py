"""Chapter 14: the router's policies, and the router in front of real replicas (greedy tokens equal
one engine's, a dead replica routed around, nothing left in the replicas' pools)."""

import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import minillm_serve
from openai import OpenAI

from minillm.bench.online import ServerProcess, free_port
from minillm.cli import engine_argv, engine_kwargs, parser
from minillm.router.app import replica_queue
from minillm.router.policy import (
    LeastLoaded,
    PrefixAware,
    Replica,
    RoundRobin,
    chunk_hashes,
    make_policy,
    routing_key,
)


def fleet(n=3):
    return [Replica(f"http://r{i}") for i in range(n)]


def test_round_robin_and_least_loaded():
    reps = fleet()
    rr = RoundRobin()
    assert [rr.choose(reps, "").url for _ in range(4)] == [
        "http://r0",
        "http://r1",
        "http://r2",
        "http://r0",
    ]
    reps[0].in_flight, reps[1].queue = 2, 1
    assert LeastLoaded().choose(reps, "") is reps[2]
    reps[2].queue = 5  # the replica's own queue counts when it exceeds the router's count
    assert LeastLoaded().choose(reps, "") is reps[1]


def test_prefix_aware_sticks_within_its_balance_and_forgets_beyond_capacity():
    reps = fleet()
    policy = PrefixAware(chunk_chars=8, balance=1, capacity=6)
    a = policy.choose(reps, "shared-prefix-one|question 1")
    a.in_flight = 1
    assert policy.choose(reps, "shared-prefix-one|question 2") is a  # 1 over the least: allowed
    a.in_flight = 2
    b = policy.choose(reps, "shared-prefix-one|question 3")  # 2 over: diverted
    assert b is not a and b.load == 0
    a.in_flight = b.in_flight = 0
    # the diverted request re-assigned the shared chunks to b: later requests follow it there
    assert policy.choose(reps, "shared-prefix-one|question 4") is b
    assert len(policy.owner) <= 6
    # an unhealthy replica is not offered by the router; the policy only sees candidates
    assert policy.choose([r for r in reps if r is not b], "shared-prefix-one|q") is not b


def test_chunk_hashes_are_chained_and_whole():
    assert chunk_hashes("x" * 63) == []
    assert len(chunk_hashes("x" * 128)) == 2
    a, b = chunk_hashes("A" * 64 + "C" * 64), chunk_hashes("B" * 64 + "C" * 64)
    assert a[1] != b[1]  # the same second chunk after different first ones


def test_routing_key_and_bad_policy():
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    assert routing_key(chat) == "<system>S\n<user>U"
    assert routing_key({"prompt": "hello"}) == "hello"
    assert routing_key({"prompt": [1, 2]}) == "[1, 2]"
    assert routing_key("not a dict") == ""
    with pytest.raises(ValueError, match="routing policy must be one of"):
        make_policy("random")


def test_replica_queue_reads_prometheus_text():
    text = "minillm_requests_running 3.0\nminillm_requests_waiting 2.0\nother_metric 7.0\n"
    assert replica_queue(text) == 5


def test_engine_flags_pass_through_to_replicas():
    args = parser().parse_args(
        ["router", "--replicas", "2", "--block-size", "32", "--no-prefix-caching",
         "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
         "--no-async-scheduling"]
    )  # fmt: skip
    serve_args = parser().parse_args(["serve", *engine_argv(args)])
    assert engine_kwargs(serve_args) == engine_kwargs(args)
    assert engine_argv(parser().parse_args(["router", "--replicas", "1"])) == []


def minillm_exe() -> str:
    return str(Path(sys.executable).parent / "minillm")


def free_and_total(url: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            values[s.name] = s.value
    return values["minillm_kv_cache_free_blocks"], values["minillm_kv_cache_total_blocks"]


def test_router_in_front_of_real_replicas(model_dir, tmp_path):
    from minillm import LLM, SamplingParams

    flags = ("--kv-cache-memory-gb", "0.1", "--dtype", "float32")
    with (
        minillm_serve(model_dir, tmp_path / "r0.log", *flags) as (url0, proc0),
        minillm_serve(model_dir, tmp_path / "r1.log", *flags) as (url1, _),
    ):
        port = free_port()
        cmd = [minillm_exe(), "router", "--port", str(port), "--replica", url0, "--replica", url1]
        cmd += ["--log-level", "warning", "--policy", "prefix_aware"]
        base = f"http://127.0.0.1:{port}"
        with ServerProcess(cmd, f"{base}/v1", log=str(tmp_path / "router.log")):
            client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            model = client.models.list().data[0].id
            one = LLM(str(model_dir), dtype="float32", kv_cache_memory_gb=0.1)
            greedy = SamplingParams(temperature=0, max_tokens=16)
            system = "You are a terse assistant who answers in a few words. " * 3
            for i, q in enumerate(["Name a fruit.", "Name a color.", "Name a city."]):
                messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
                expected = one.chat(messages, greedy, use_tqdm=False)[0].text
                if i % 2:  # streamed through the router, chunk by chunk
                    stream = client.chat.completions.create(
                        model=model, messages=messages, temperature=0, max_tokens=16, stream=True
                    )
                    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                else:
                    reply = client.chat.completions.create(
                        model=model, messages=messages, temperature=0, max_tokens=16
                    )
                    text = reply.choices[0].message.content
                assert text == expected
            completion = client.completions.create(
                model=model, prompt="1, 2, 3,", max_tokens=8, temperature=0
            )
            assert (
                completion.choices[0].text
                == one.generate(
                    ["1, 2, 3,"], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False
                )[0]
                .outputs[0]
                .text
            )
            # a replica's error passes through unchanged
            with pytest.raises(Exception) as err:
                client.completions.create(model=model, prompt="x", max_tokens=-1)
            assert getattr(err.value, "status_code", None) == 400
            # a client that leaves mid-stream: the replica aborts the request
            long_request = {"model": model, "prompt": "Count:", "max_tokens": 400, "stream": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=long_request) as r:
                next(r.iter_raw())
            deadline = time.time() + 30
            while time.time() < deadline and any(
                free_and_total(u)[0] != free_and_total(u)[1] for u in (url0, url1)
            ):
                time.sleep(0.2)
            for u in (url0, url1):
                free, total = free_and_total(u)
                assert free == total, f"{u}: {total - free} KV blocks still held"
            # a dead replica is routed around
            proc0.proc.kill()
            proc0.proc.wait()
            for q in ["Name a fruit.", "Name a color.", "Name a tree.", "Name a dog."]:
                messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
                reply = client.chat.completions.create(
                    model=model, messages=messages, temperature=0, max_tokens=4
                )
                assert reply.choices[0].finish_reason in ("stop", "length")
            health = httpx.get(f"{base}/health").json()
            assert health["healthy_replicas"] == [url1]
            metrics = httpx.get(f"{base}/metrics").text
            assert f'minillm_router_replica_healthy{{replica="{url0}"}} 0.0' in metrics


def test_router_refuses_bad_command_lines():
    import subprocess

    for args, words in [
        (["router"], "--replica URL"),
        (["router", "--replica", "http://x", "--replicas", "2"], "not both"),
        (["router", "--replica", "http://x", "--policy", "random"], "routing policy"),
    ]:
        out = subprocess.run([minillm_exe(), *args], capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and words in out.stderr, out.stderr
