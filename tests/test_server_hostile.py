"""The server under hostile, heavy traffic: generated bodies, disconnects, overload, a dying engine.

Against a real `minillm serve` (a subprocess, on a small random Llama so that steps are fast):
- fuzzing (hypothesis, derandomized): never a 5xx, never a hang, every error OpenAI-shaped, while an
  innocent client streams beside the fuzzer and always gets exactly its offline tokens;
- a soak of a few hundred mixed requests with random disconnects: afterwards no KV block, queued
  request or awaited output is left, and the server's memory stays flat.
In-process: overload answers 503 with Retry-After; a dead engine fails every waiting client at once.
"""

import asyncio
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers import minillm_serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.llm import LLM
from minillm.sampling import SamplingParams

KEY = "hostile-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
INNOCENT_PROMPT = [17, 99, 1234, 555, 42, 7, 7, 7]
INNOCENT = {
    "prompt": INNOCENT_PROMPT,
    "max_tokens": 24,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def hostile_server(random_llama, tmp_path_factory):
    path, _ = random_llama
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    flags = ["--api-key", KEY, "--num-kv-blocks", "512", "--max-num-seqs", "32"]
    with minillm_serve(path, log, *flags) as (base, proc):
        yield base, proc.proc.pid, log


@pytest.fixture(scope="module")
def innocent_text(random_llama):
    path, _ = random_llama
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return LLM(str(path)).generate([INNOCENT_PROMPT], params, use_tqdm=False)[0].text


def metrics(base: str) -> dict:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("minillm_")
    }


def wait_idle(base: str, timeout: float = 60) -> dict:
    """Metrics once nothing is left in the server: no running, waiting, queued or awaited request,
    every block free."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(base)
        idle = (
            m["minillm_kv_cache_free_blocks"] == m["minillm_kv_cache_total_blocks"]
            and m["minillm_requests_running"] == m["minillm_requests_waiting"] == 0
            and m["minillm_requests_queued"] == 0
            and m["minillm_requests_awaited"] == 0
        )
        if idle:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not become idle: {m}")
        time.sleep(0.2)


def stream_text(base: str, body: dict, timeout: float = 120) -> str:
    "The text of a streamed completion, checked to end with [DONE] and to carry no error event."
    text, done = [], False
    with httpx.stream(
        "POST", f"{base}/v1/completions", json=body, headers=AUTH, timeout=timeout
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                obj = json.loads(line[6:])
                assert "error" not in obj, obj
                text += [c["text"] for c in obj["choices"]]
    assert done
    return "".join(text)


class Innocent:
    "A client that streams the same greedy request over and over while the test runs."

    def __init__(self, base: str):
        self.base, self.results, self.errors = base, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                self.results.append(stream_text(self.base, INNOCENT))
            except Exception as e:  # recorded, and the test fails on it
                self.errors.append(repr(e))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=180)
        assert not self.thread.is_alive(), "the innocent client hung"


# Hypothesis strategies: plausible fields with hostile values, unknown fields, wrong types.
SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\ud83d", "\x00", "\u200b", "é" * 3, "😀"])
TEXT = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.text(max_size=8), SURROGATES), max_size=5).map("".join),
)
BIG_INTS = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-46, 1e300, 0.5, 2.0]),
)
SCALARS = st.one_of(st.none(), st.booleans(), BIG_INTS, FLOATS, TEXT)
ANY_JSON = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
TOKEN_LISTS = st.lists(st.one_of(st.integers(0, 2000), BIG_INTS), min_size=0, max_size=12)
VALID_IDS = st.lists(st.integers(0, 5000), min_size=1, max_size=40)
VALID_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=60)


def mostly(valid, hostile):
    """Seven times in eight a valid value, else a hostile one (a body has many fields: some are
    hostile)."""
    return st.one_of(*[valid] * 7, hostile)


PROMPTS = mostly(
    st.one_of(VALID_TEXT, VALID_IDS, st.lists(VALID_TEXT, min_size=1, max_size=3)),
    st.one_of(TEXT, TOKEN_LISTS, st.lists(TOKEN_LISTS, max_size=3), ANY_JSON),
)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": mostly(VALID_TEXT, SCALARS)}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "file", "x"])}),
    ANY_JSON,
)
CONTENT = mostly(
    st.one_of(VALID_TEXT, st.lists(PART, min_size=1, max_size=2)),
    st.one_of(TEXT, SCALARS, ANY_JSON),
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": mostly(
            st.sampled_from(["user", "system", "assistant"]),
            st.sampled_from(["developer", "tool", "wizard"]),
        ),
        "content": CONTENT,
    },
    optional={"tool_calls": ANY_JSON, "name": TEXT},
)
SAMPLING = {
    "max_tokens": mostly(st.integers(1, 12), st.one_of(BIG_INTS, FLOATS, SCALARS)),
    "temperature": mostly(st.floats(0, 2), st.one_of(FLOATS, SCALARS)),
    "top_p": mostly(st.floats(0.01, 1), FLOATS),
    "top_k": mostly(st.integers(-1, 100), BIG_INTS),
    "min_p": mostly(st.floats(0, 1), FLOATS),
    "n": mostly(st.integers(1, 3), BIG_INTS),
    "seed": mostly(st.integers(0, 2**32), BIG_INTS),
    "stop": mostly(
        st.lists(VALID_TEXT, max_size=3),
        st.one_of(TEXT, st.text(min_size=500, max_size=600), ANY_JSON),
    ),
    "stop_token_ids": mostly(
        st.lists(st.integers(0, 5000), max_size=3), st.one_of(TOKEN_LISTS, ANY_JSON)
    ),
    "min_tokens": mostly(st.integers(0, 3), BIG_INTS),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
    "stream_options": mostly(st.just({"include_usage": True}), ANY_JSON),
    "logprobs": mostly(st.just(False), st.one_of(st.booleans(), BIG_INTS)),
    "logit_bias": mostly(st.just({}), ANY_JSON),
    "response_format": mostly(st.just({"type": "text"}), ANY_JSON),
    "tools": mostly(st.just([]), ANY_JSON),
    "echo": mostly(st.just(False), st.booleans()),
    "user": TEXT,
    "metadata": ANY_JSON,
    "presence_penalty": mostly(st.just(0.0), FLOATS),
    "best_of": mostly(st.just(1), BIG_INTS),
    "model": mostly(st.none(), st.just("x")),
    "unknown_field": ANY_JSON,
}
COMPLETION = st.fixed_dictionaries({"prompt": PROMPTS}, optional=SAMPLING)
CHAT = st.fixed_dictionaries(
    {"messages": mostly(st.lists(MESSAGE, min_size=1, max_size=3), ANY_JSON)}, optional=SAMPLING
)
BODIES = st.one_of(
    st.tuples(st.just("/v1/completions"), COMPLETION),
    st.tuples(st.just("/v1/chat/completions"), CHAT),
    st.tuples(st.just("/v1/completions"), COMPLETION),
    st.tuples(st.just("/v1/chat/completions"), CHAT),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), ANY_JSON),
)


def send(base: str, path: str, body, disconnect_after: int | None = None) -> int:
    """Send one body (dumped with ensure_ascii, so lone surrogates travel as \\ud800 escapes); check
    the answer's shape."""
    data = json.dumps(body, allow_nan=True).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    with httpx.stream("POST", f"{base}{path}", content=data, headers=headers, timeout=120) as r:
        if r.status_code >= 400:
            err = json.loads(r.read())["error"]
            assert (
                isinstance(err["message"], str)
                and err["code"] == r.status_code
                and len(err["message"]) < 2000
            )
            return r.status_code
        if r.headers["content-type"].startswith("text/event-stream"):
            for i, line in enumerate(r.iter_lines()):
                if disconnect_after is not None and i >= disconnect_after:
                    return r.status_code  # hang up in the middle
                if line.startswith("data: ") and line != "data: [DONE]":
                    assert "error" not in json.loads(line[6:]), line
        else:
            assert json.loads(r.read())["choices"]
        return r.status_code


@settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(case=BODIES, disconnect=st.one_of(st.none(), st.integers(0, 4)))
def fuzz_one(base: str, statuses: list, case, disconnect):
    path, body = case
    status = send(base, path, body, disconnect)
    statuses.append(status)
    assert status < 500, (path, body)


def test_fuzzed_bodies_never_hurt_an_innocent_client(hostile_server, innocent_text):
    base, _, log = hostile_server
    statuses = []
    with Innocent(base) as innocent:
        fuzz_one(base, statuses)
    assert not innocent.errors, innocent.errors[:3]
    assert innocent.results and all(t == innocent_text for t in innocent.results)
    print({s: statuses.count(s) for s in set(statuses)}, len(innocent.results), "innocent streams")
    assert {200, 400} <= set(statuses)  # the fuzzer reached both sides
    wait_idle(base)
    assert "Traceback" not in log.read_text()


def test_bad_bytes_and_paths_get_openai_errors(hostile_server):
    base, _, _ = hostile_server
    cases = [
        (b"{'prompt': 1", "/v1/completions", 400),
        (b"\xff\xfe\x00", "/v1/completions", 400),
        (b"[" * 100_000, "/v1/completions", 400),
        (b'{"prompt": "' + b"9" * 5000 + b'"}', "/v1/no-such-endpoint", 404),
        (b'{"prompt": ' + b"9" * 5000 + b"}", "/v1/completions", 400),
    ]
    for data, path, status in cases:
        r = httpx.post(
            f"{base}{path}",
            content=data,
            headers={**AUTH, "Content-Type": "application/json"},
            timeout=60,
        )
        assert r.status_code == status and r.json()["error"]["code"] == status, (
            data[:20],
            r.text[:200],
        )
    # earlier tool calls of any shape (the fuzzer's find: a bool once reached the prompt's code)
    for message in [
        {"role": "assistant", "content": None, "tool_calls": True},
        {"role": "assistant", "content": None, "tool_calls": [5]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": 5}]},
        {"role": "tool", "content": "4", "tool_call_id": 5},
    ]:
        body = {"messages": [{"role": "user", "content": "hi"}, message], "max_tokens": 2}
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == 400, (message, r.text[:200])
    r = httpx.get(f"{base}/v1/completions", headers=AUTH)
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.post(f"{base}/v1/completions", content=b"x" * (5 * 2**20), headers=AUTH, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    bad = {
        "prompt": "hi",
        "stop_token_ids": ["x"] * 20_000,
    }  # a 100 kB body of bad items: a short answer
    r = httpx.post(f"{base}/v1/completions", json=bad, headers=AUTH, timeout=60)
    assert r.status_code == 400 and len(r.content) < 2000
    wait_idle(base)


def test_disconnected_non_streamed_request_is_aborted(hostile_server):
    base, _, _ = hostile_server
    aborted = 'minillm_requests_finished_total{finish_reason="abort"}'
    before = wait_idle(base).get(aborted, 0)
    body = {
        "prompt": [5] * 8,
        "max_tokens": 500,
        "ignore_eos": True,
        "n": 32,
    }  # 16,000 tokens to generate
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/completions", json=body, headers=AUTH, timeout=0.5)
    assert wait_idle(base)[aborted] - before == 32  # all 32 were aborted when the client left


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def soak_round(base: str, seed: int, n: int = 150):
    """n mixed requests from 16 concurrent clients: valid and invalid, streamed and not, some
    abandoned midway."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        body = {
            "prompt": [rng.randrange(1, 5000) for _ in range(rng.randint(1, 60))],
            "max_tokens": rng.randint(1, 40),
            "temperature": rng.choice([0, 0.7, 1.0]),
            "ignore_eos": True,
            "n": rng.choice([1, 1, 1, 2, 3]),
            "stream": rng.random() < 0.6,
            "seed": rng.randrange(10**6),
        }
        if rng.random() < 0.15:
            body[rng.choice(["top_p", "temperature", "n"])] = rng.choice([-1, 1e300, "x", 10**9])
        path = "/v1/completions"
        if rng.random() < 0.3:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": f"message {i}"}]
            del body["prompt"]
        jobs.append((path, body, rng.choice([None, None, 0, 1, 3])))

    def run(job):
        path, body, disconnect = job
        if disconnect is not None and not body["stream"]:
            try:  # a client that gives up before the answer
                httpx.post(f"{base}{path}", json=body, headers=AUTH, timeout=0.05)
            except httpx.TimeoutException:
                pass
            return 0
        return send(base, path, body, disconnect)

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(run, jobs))
    assert all(s < 500 for s in statuses)
    return statuses


def test_soak_leaves_nothing_behind(hostile_server, innocent_text):
    base, pid, log = hostile_server
    with Innocent(base) as innocent:
        soak_round(base, seed=1)
        wait_idle(base)
        before = rss_mb(pid)
        soak_round(base, seed=2)
        soak_round(base, seed=3)
    after = wait_idle(base)
    assert not innocent.errors and all(t == innocent_text for t in innocent.results)
    grown = rss_mb(pid) - before
    print(f"server RSS {before:.0f} MB -> {before + grown:.0f} MB over 300 more requests; {after}")
    assert grown < 100, f"the server's memory grew by {grown:.0f} MB"
    assert "Traceback" not in log.read_text()


# In-process: overload and a dying engine, through the ASGI app.


def app_client(app):
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=60
    )


def test_overload_answers_503_with_retry_after(random_llama):
    from minillm.engine.llm_engine import EngineConfig
    from minillm.server.api_server import build_app
    from minillm.server.async_engine import AsyncEngine
    from minillm.server.protocol import ServerLimits

    path, _ = random_llama

    async def main():
        aeng = AsyncEngine(config=EngineConfig(model=str(path), max_num_seqs=2))
        app = build_app(aeng, limits=ServerLimits(max_waiting_requests=4))
        gate = threading.Event()
        step = aeng.engine.step
        aeng.engine.step = lambda: gate.wait() and step()  # hold the engine until the queue is full
        async with app_client(app) as client:
            body = {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True}
            first = [
                asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(4)
            ]
            while aeng.num_queued < 4:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/completions", json=body)
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["type"] == "server_overloaded"
            gate.set()
            assert [r.status_code for r in await asyncio.gather(*first)] == [200] * 4
            text = (await client.get("/metrics")).text
            assert 'minillm_requests_rejected_total{reason="overloaded"} 1.0' in text
        aeng.shutdown()

    asyncio.run(main())


def test_a_dead_engine_fails_everyone_at_once(random_llama):
    from minillm.engine.llm_engine import EngineConfig
    from minillm.server.api_server import build_app
    from minillm.server.async_engine import AsyncEngine, EngineDeadError

    path, _ = random_llama

    async def main():
        aeng = AsyncEngine(config=EngineConfig(model=str(path)))
        app = build_app(aeng)
        gate = threading.Event()

        def broken_step():
            gate.wait()
            raise SystemError("the scheduler's state is corrupt")

        aeng.engine.step = broken_step
        async with app_client(app) as client:
            assert (await client.get("/health")).status_code == 200
            body = {"prompt": [1, 2, 3], "max_tokens": 50}
            waiting = [
                asyncio.ensure_future(client.post("/v1/completions", json=body)),
                asyncio.ensure_future(
                    client.post("/v1/completions", json={**body, "stream": True})
                ),
            ]
            while aeng.num_queued < 2:
                await asyncio.sleep(0.01)
            gate.set()
            plain, streamed = await asyncio.wait_for(
                asyncio.gather(*waiting), timeout=30
            )  # at once, not never
            assert plain.status_code == 503 and "corrupt" in plain.json()["error"]["message"]
            assert '"error"' in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
            assert (await client.get("/health")).status_code == 503
            assert (await client.post("/v1/completions", json=body)).status_code == 503
        assert not aeng.alive and isinstance(aeng.error, EngineDeadError)

    asyncio.run(main())


def test_no_command_enters_once_the_engine_has_stopped(random_llama):
    """The thread closes its queue before it fails what is queued: a later submit, call or abort
    is refused at once (nothing could wait for it forever), and nothing is left counted queued."""
    from minillm import SamplingParams
    from minillm.engine.llm_engine import EngineConfig
    from minillm.server.async_engine import AsyncEngine, EngineDeadError

    path, _ = random_llama

    async def main():
        aeng = AsyncEngine(config=EngineConfig(model=str(path)))
        req = aeng.engine.make_request([1, 2, 3], SamplingParams(max_tokens=2), "late")
        aeng.shutdown()
        assert not aeng._send("abort", ["late"])
        with pytest.raises(EngineDeadError):
            aeng.submit([req])
        with pytest.raises(EngineDeadError):
            await aeng.call(lambda engine: None)
        assert aeng.num_queued == 0 and aeng._commands.empty()

    asyncio.run(main())
