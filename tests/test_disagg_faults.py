"""Chapter 14's fleet under faults, with real `minillm serve` processes: a producer killed at
points around a pull (the consumer computes the prompt itself: the same tokens), clients that
leave through the disaggregation proxy (every process's KV blocks and in-flight counts back to
zero, read from their /metrics), and a bounded soak through the router and the proxy (mixed
streaming, cancellations, more requests than the engines take at once): no block leaked, no
count stuck, no answer different from one engine's greedy output. MINILLM_SOAK=N runs N requests
(the long form); the default is 160."""

import asyncio
import datetime
import json
import os
import random
import socket
import statistics
import threading
import time
from contextlib import ExitStack

import httpx
from openai import AsyncOpenAI, OpenAI
from test_disagg import (
    assert_nothing_left,
    drain,
    expected,
    metric,
    minillm_exe,
    start_proxy,
    wait_for_producer,
)

from minillm.bench.online import ServerProcess, free_port
from minillm.engine.llm_engine import LLMEngine
from minillm.router.app import replica_command
from minillm.router.disagg import start_disaggregated
from minillm.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)
BLOCKS = 128
LONG = "The committee read every chapter of the report, line by line, and twice. " * 24


def flags(model_dir) -> list[str]:
    return ["--model", str(model_dir), "--dtype", "float32", "--num-kv-blocks", str(BLOCKS)]


def test_a_producer_killed_around_a_pull_changes_no_token(model_dir, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    kw = dict(model=str(model_dir), dtype="float32", num_kv_blocks=BLOCKS)
    consumer = LLMEngine(kv_role="consumer", kv_transfer_address=address, **kw)
    plain = LLMEngine(**kw)
    consumer.kv_connector.link.timeout = datetime.timedelta(seconds=3)
    prompts = [f"Case {i}. {LONG}" for i in range(4)]
    want = expected(plain, prompts, GREEDY)
    outcomes = []
    try:
        for i, (prompt, delay) in enumerate(zip(prompts, (0.0, 0.005, 0.03, 0.5))):
            with ExitStack() as stack:
                port = free_port()
                role = ["--kv-role", "producer", "--kv-transfer-address", address]
                cmd = replica_command(port, [*flags(model_dir), *role])
                log = str(tmp_path / f"producer{i}.log")
                server = ServerProcess(cmd, f"http://127.0.0.1:{port}/v1", log=log)
                stack.enter_context(server)
                wait_for_producer(consumer)
                body = {
                    "prompt": prompt,
                    "max_tokens": 1,
                    "kv_transfer_params": {"transfer_id": f"k{i}"},
                }
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
                assert r.status_code == 200, r.text
                before = consumer.kv_connector.stats()
                req = consumer.add_request(
                    prompt, GREEDY, kv_transfer_params={"transfer_id": f"k{i}"}
                )
                killer = threading.Timer(delay, server.proc.kill)
                killer.start()
                drain(consumer)
                killer.join()
                assert req.output_ids == want[i], f"killed after {delay} s"
                after = consumer.kv_connector.stats()
                outcomes.append({k: after[k] - before[k] for k in after if after[k] != before[k]})
        assert_nothing_left(consumer, plain)
    finally:
        consumer.shutdown()
        plain.shutdown()
    print("outcomes by kill time:", outcomes)


def raw_stream(port: int, prompt: str, max_tokens: int) -> socket.socket:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def settled(urls: dict, in_flight: dict) -> str:
    "'' when every engine's pool is free and idle and no proxy counts a request; else what is not."
    left = []
    for name, url in urls.items():
        free = metric(url, "minillm_kv_cache_free_blocks")
        busy = metric(url, "minillm_requests_running") + metric(url, "minillm_requests_waiting")
        if free != BLOCKS or busy:
            left.append(f"{name}: {BLOCKS - free:.0f} blocks held, {busy:.0f} requests")
    for name, (url, gauge) in in_flight.items():
        if (n := metric(url, gauge)) != 0:
            left.append(f"{name}: {n:.0f} in flight")
    return "; ".join(left)


def wait_settled(urls: dict, in_flight: dict, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while left := settled(urls, in_flight):
        assert time.monotonic() < deadline, f"left behind: {left}"
        time.sleep(0.2)


def test_clients_that_leave_through_the_proxy_leave_nothing(model_dir, tmp_path):
    with ExitStack() as stack:
        urls, _ = start_disaggregated(stack, flags(model_dir), log_dir=str(tmp_path))
        base, port = start_proxy(stack, urls, tmp_path)
        gauges = {"proxy": (base, "minillm_disagg_in_flight")}
        for i, when in enumerate(
            ["at once", "during the transfer", "after the first event", "mid-stream"] * 2
        ):
            s = raw_stream(port, f"Client {i}. {LONG}", 48)
            if when == "during the transfer":
                time.sleep(0.3)  # the prefill has run; the consumer is pulling or decoding
            elif when != "at once":
                data = b""
                while data.count(b"data:") < (1 if when == "after the first event" else 6):
                    data += s.recv(65536)
            s.close()
            wait_settled(urls, gauges)
        client = OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        alone = OpenAI(base_url=f"{urls['decode']}/v1", api_key="x", max_retries=0)
        kw = dict(model=client.models.list().data[0].id, prompt=LONG, max_tokens=8, temperature=0)
        assert (
            client.completions.create(**kw).choices[0].text
            == alone.completions.create(**kw).choices[0].text
        )


PROMPTS = [f"Question {i}: {topic}" for i, topic in enumerate(
    ["Why is the sky blue?", "Name three rivers.", "Count to ten:", "What is a prime number?",
     "Describe a cat. " * 6, "Write a haiku about rain.", "1, 1, 2, 3, 5, 8,", LONG]
)]  # fmt: skip


async def soak(base: str, model: str, n: int, want: dict, seed: int = 0) -> dict:
    """`n` requests, 24 at a time, each a random prompt and length, streamed or not; one in five
    streams is dropped after a few events. Returns the latencies of the finished ones and the
    answers that differ from `want`."""
    rng = random.Random(seed)
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=300)
    gate, latencies, wrong, dropped = asyncio.Semaphore(24), [], [], 0

    async def one(i: int):
        nonlocal dropped
        prompt, max_tokens = rng.choice(PROMPTS), rng.choice((4, 8, 16))
        stream, drop = rng.random() < 0.6, rng.random() < 0.2
        kw = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        async with gate:
            start = time.perf_counter()
            if stream:
                text, events = "", await client.completions.create(stream=True, **kw)
                async for event in events:
                    text += event.choices[0].text if event.choices else ""
                    if drop and len(text) > 3:
                        await events.close()
                        dropped += 1
                        return
            else:
                text = (await client.completions.create(**kw)).choices[0].text
            latencies.append(time.perf_counter() - start)
        if text != want[prompt, max_tokens]:
            wrong.append((prompt, max_tokens, text))

    await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()
    return dict(latencies=latencies, wrong=wrong, dropped=dropped)


def test_soak_through_the_router_and_the_proxy(model_dir, tmp_path):
    n = int(os.environ.get("MINILLM_SOAK", "160"))
    with ExitStack() as stack:
        engine_flags = flags(model_dir) + ["--max-num-seqs", "8"]
        urls, _ = start_disaggregated(stack, engine_flags, log_dir=str(tmp_path))
        proxy, _ = start_proxy(stack, urls, tmp_path)
        port = free_port()
        plain = f"http://127.0.0.1:{port}"
        cmd = replica_command(port, engine_flags)
        stack.enter_context(ServerProcess(cmd, f"{plain}/v1", log=str(tmp_path / "plain.log")))
        port = free_port()
        router = f"http://127.0.0.1:{port}"
        cmd = [minillm_exe(), "router", "--port", str(port), "--log-level", "warning"]
        cmd += ["--replica", proxy, "--replica", plain, "--policy", "least_loaded"]
        stack.enter_context(ServerProcess(cmd, f"{router}/v1", log=str(tmp_path / "router.log")))
        direct = OpenAI(base_url=f"{plain}/v1", api_key="x", max_retries=0)
        model = direct.models.list().data[0].id
        want = {
            (p, m): direct.completions.create(model=model, prompt=p, max_tokens=m, temperature=0)
            .choices[0]
            .text
            for p in PROMPTS
            for m in (4, 8, 16)
        }
        start = time.perf_counter()
        result = asyncio.run(soak(router, model, n, want))
        seconds = time.perf_counter() - start
        engines = {**urls, "plain": plain}
        gauges = {
            "proxy": (proxy, "minillm_disagg_in_flight"),
            "router": (router, "minillm_router_in_flight"),
        }
        wait_settled(engines, gauges)
        lat = sorted(result["latencies"])
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        done = metric(urls["decode"], 'minillm_kv_transfers_total{outcome="done"}')
        print(
            f"soak: {n} requests in {seconds:.1f} s, {len(lat)} finished, {result['dropped']} "
            f"dropped by their clients, {len(result['wrong'])} wrong; latency p50 "
            f"{statistics.median(lat):.2f} s, p99 {p99:.2f} s; {done:.0f} KV transfers"
        )
        assert not result["wrong"], result["wrong"][:3]
        assert len(lat) + result["dropped"] == n
