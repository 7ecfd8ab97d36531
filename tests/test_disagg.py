"""Chapter 14's disaggregated serving: prefill on one engine, KV blocks pulled by another that
decodes. Greedy tokens equal one engine's whatever happens to the transfer, and no block, copy or
request is left behind on either side."""

import json
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from minillm.bench.online import ServerProcess, free_port
from minillm.engine.llm_engine import EngineConfig, LLMEngine
from minillm.router.disagg import prefill_body, splittable, start_disaggregated
from minillm.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = [
    "The three laws of thermodynamics, explained to a child: " * 5,
    "A recipe for bread. Ingredients: flour, water, salt, yeast. Steps: " * 3,
    "Hello",
    "List the planets of the solar system in order from the sun: Mercury,",
]


def drain(*engines):
    while any(e.has_unfinished_requests() for e in engines):
        for e in engines:
            if e.has_unfinished_requests():
                e.step()


def wait_for_producer(consumer: LLMEngine):
    deadline = time.monotonic() + 30
    while not consumer.kv_connector.producer_alive():
        assert time.monotonic() < deadline, "the producer never reached the consumer"
        time.sleep(0.1)


def assert_nothing_left(*engines):
    for e in engines:
        assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
        assert not e.has_unfinished_requests() and not e.requests
    for e in engines:
        if e.config.kv_role == "producer":
            assert not e.kv_connector.outbox
        elif e.config.kv_role == "consumer":
            assert not e.kv_connector.pending and not e.kv_connector.ready


@pytest.fixture(scope="module")
def engines(model_dir):
    address = f"127.0.0.1:{free_port()}"
    kw = dict(model=str(model_dir), dtype="float32")
    consumer = LLMEngine(kv_role="consumer", kv_transfer_address=address, num_kv_blocks=12, **kw)
    producer = LLMEngine(kv_role="producer", kv_transfer_address=address, num_kv_blocks=64, **kw)
    plain = LLMEngine(num_kv_blocks=64, **kw)
    wait_for_producer(consumer)
    yield producer, consumer, plain
    for e in (producer, consumer, plain):
        e.shutdown()


def prefill_all(producer: LLMEngine, prompts, prefix: str):
    for i, p in enumerate(prompts):
        params = {"transfer_id": f"{prefix}{i}"}
        producer.add_request(p, SamplingParams(max_tokens=1), kv_transfer_params=params)
        drain(producer)


def decode_all(consumer: LLMEngine, prompts, prefix: str) -> list:
    reqs = [
        consumer.add_request(p, GREEDY, kv_transfer_params={"transfer_id": f"{prefix}{i}"})
        for i, p in enumerate(prompts)
    ]
    drain(consumer)
    return reqs


def expected(plain: LLMEngine, prompts, params=GREEDY) -> list[list[int]]:
    reqs = [plain.add_request(p, params) for p in prompts]
    drain(plain)
    return [r.output_ids for r in reqs]


def test_transferred_prompts_decode_like_one_engine(engines):
    producer, consumer, plain = engines
    want = expected(plain, PROMPTS)
    prefill_all(producer, PROMPTS, "a")
    before = consumer.kv_connector.stats()
    link, made = consumer.kv_connector.link, []
    make_group = link.group
    link.group = lambda n: made.append(n) or make_group(n)
    # the consumer's pool (12 blocks) holds two at a time: landed requests wait for room
    reqs = decode_all(consumer, PROMPTS, "a")
    assert [r.output_ids for r in reqs] == want
    after = consumer.kv_connector.stats()
    assert after["done"] - before["done"] == 3  # "Hello" is one token: nothing to send
    sent = sum(r.prompt_len - 1 - r.num_cached_tokens for r in reqs if r.prompt_len > 1)
    assert after["tokens"] - before["tokens"] == sent
    assert producer.kv_connector.stats()["tokens"] == consumer.kv_connector.stats()["tokens"]
    # the three transfers went over one data-plane group, which both sides still hold
    assert len(made) <= 1, made
    assert consumer.kv_connector.group_id == producer.kv_connector.group_id is not None
    assert_nothing_left(producer, consumer, plain)


def test_every_failure_falls_back_to_computing_the_prompt(engines):
    producer, consumer, plain = engines
    prompt = "Why is the sky blue? Explain scattering in simple words. " * 3
    want = expected(plain, [prompt, prompt + "Short answer."])
    refused = consumer.kv_connector.stats()["refused"]
    # never prefilled on the producer
    missing = consumer.add_request(prompt, GREEDY, kv_transfer_params={"transfer_id": "none"})
    # prefilled, but for a different prompt under the same id
    producer.add_request(
        prompt, SamplingParams(max_tokens=1), kv_transfer_params={"transfer_id": "x"}
    )
    drain(producer)
    other = consumer.add_request(
        prompt + "Short answer.", GREEDY, kv_transfer_params={"transfer_id": "x"}
    )
    drain(consumer)
    assert [missing.output_ids, other.output_ids] == want
    assert consumer.kv_connector.stats()["refused"] - refused == 2
    assert_nothing_left(producer, consumer, plain)


def test_abort_while_the_blocks_travel(engines):
    producer, consumer, plain = engines
    prompt = "Once upon a time in a land far away, " * 6
    producer.add_request(
        prompt, SamplingParams(max_tokens=1), kv_transfer_params={"transfer_id": "ab"}
    )
    drain(producer)
    req = consumer.add_request(prompt, GREEDY, kv_transfer_params={"transfer_id": "ab"})
    assert consumer.kv_connector.num_pending == 1 and consumer.has_unfinished_requests()
    assert consumer.abort_request(req.request_id)
    assert not consumer.has_unfinished_requests()
    deadline = time.monotonic() + 30
    while consumer.kv_connector.landed.empty():  # the pull runs on: its blocks still land
        assert time.monotonic() < deadline, "the transfer never ended"
        time.sleep(0.05)
    consumer.step()  # and are dropped, unplaced
    assert req.finish_reason == "abort"
    assert_nothing_left(producer, consumer, plain)


def test_a_consumer_without_producer_computes_alone(model_dir):
    consumer = LLMEngine(
        model=str(model_dir), dtype="float32", num_kv_blocks=32, kv_role="consumer",
        kv_transfer_address=f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    plain = LLMEngine(model=str(model_dir), dtype="float32", num_kv_blocks=32)
    try:
        want = expected(plain, PROMPTS[:2])
        reqs = decode_all(consumer, PROMPTS[:2], "n")
        assert [r.output_ids for r in reqs] == want
        assert consumer.kv_connector.stats()["failed"] == 2
        assert_nothing_left(consumer, plain)
    finally:
        consumer.shutdown()
        plain.shutdown()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kv_role="both", kv_transfer_address="h:1"), "kv_role must be one of"),
        (dict(kv_role="consumer"), "needs kv_transfer_address"),
        (dict(kv_role="consumer", kv_transfer_address="localhost"), "must be host:port"),
        (dict(kv_role="producer", kv_transfer_address="::1:1", tensor_parallel_size=2), "tensor"),
        (
            dict(kv_role="producer", kv_transfer_address="localhost:1", kv_cache_dtype="int8"),
            "dtype",
        ),
        (dict(kv_role="consumer", kv_transfer_address="10.0.0.2:1"), "kv_transfer_secret"),
        (dict(kv_role="consumer", kv_transfer_address="example.org:1"), "off loopback"),
    ],
)
def test_bad_kv_transfer_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs).resolved()


def test_kv_transfer_params_are_checked(engines):
    producer, _, plain = engines
    with pytest.raises(ValueError, match="needs an engine started with a kv_role"):
        plain.make_request("Hi", kv_transfer_params={"transfer_id": "a"})
    for bad in ({"id": "a"}, {"transfer_id": 3}, {"transfer_id": ""}, ["a"]):
        with pytest.raises(ValueError, match="transfer_id"):
            producer.make_request("Hi", kv_transfer_params=bad)


def test_the_proxy_splits_only_what_it_can():
    assert splittable({"prompt": "a"}) and splittable({"prompt": [1, 2]})
    assert splittable({"messages": [{"role": "user", "content": "a"}]})
    assert not splittable({"prompt": ["a", "b"]}) and not splittable({"prompt": "a", "n": 2})
    assert not splittable({"prompt": "a", "prompt_logprobs": 1}) and not splittable([1])
    body = {"prompt": "a", "max_tokens": 50, "stream": True, "stream_options": {}, "min_tokens": 5}
    assert prefill_body(body, "t") == {
        "prompt": "a", "max_tokens": 1, "stream": False, "kv_transfer_params": {"transfer_id": "t"}
    }  # fmt: skip


def minillm_exe() -> str:
    return str(Path(sys.executable).parent / "minillm")


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start_proxy(stack, urls: dict, tmp_path) -> tuple[str, int]:
    "`minillm disagg` in front of running instances, once the producer has reached the consumer."
    port = free_port()
    cmd = [minillm_exe(), "disagg", "--port", str(port), "--log-level", "warning"]
    cmd += ["--prefill", urls["prefill"], "--decode", urls["decode"]]
    base = f"http://127.0.0.1:{port}"
    stack.enter_context(ServerProcess(cmd, f"{base}/v1", log=str(tmp_path / "proxy.log")))
    deadline = time.monotonic() + 60
    while metric(urls["decode"], "minillm_kv_transfer_peer_alive") != 1.0:
        assert time.monotonic() < deadline, "the producer never reached the consumer"
        time.sleep(0.2)
    return base, port


def test_proxy_in_front_of_real_instances(model_dir, tmp_path):
    from contextlib import ExitStack

    flags = ["--model", str(model_dir), "--dtype", "float32", "--num-kv-blocks", "128"]
    with ExitStack() as stack:
        urls, servers = start_disaggregated(stack, flags, log_dir=str(tmp_path))
        base, _ = start_proxy(stack, urls, tmp_path)
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        alone = OpenAI(base_url=f"{urls['decode']}/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        system = "You are a terse assistant who answers in a few words. " * 3
        for i, q in enumerate(["Name a fruit.", "Name a color."]):
            messages = [
                {"role": "system", "content": system + str(i)},
                {"role": "user", "content": q},
            ]
            stream = client.chat.completions.create(
                model=model, messages=messages, temperature=0, max_tokens=16, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            direct = alone.chat.completions.create(
                model=model, messages=messages, temperature=0, max_tokens=16
            )
            assert text == direct.choices[0].message.content
        assert metric(urls["decode"], 'minillm_kv_transfers_total{outcome="done"}') == 2
        # a client's error comes back as it is, from the prefill instance
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=model, prompt="Hi", temperature=-1)
        # the prefill instance dies: the decode instance answers alone, the same
        servers["prefill"].proc.kill()
        servers["prefill"].proc.wait()
        reply = client.completions.create(
            model=model, prompt="1, 2, 3,", max_tokens=8, temperature=0
        )
        direct = alone.completions.create(
            model=model, prompt="1, 2, 3,", max_tokens=8, temperature=0
        )
        assert reply.choices[0].text == direct.choices[0].text
        assert metric(base, 'minillm_disagg_requests_total{mode="prefill_failed"}') == 1
        assert metric(urls["decode"], "minillm_kv_cache_free_blocks") == 128


def test_unpulled_copies_never_outgrow_their_bound(engines):
    producer, consumer, plain = engines
    prompts = ["First, a long prompt about rivers and seas. " * 4, "Then one about mountains. " * 6]
    want = expected(plain, prompts)
    sender = producer.kv_connector
    bound, sender.max_bytes = sender.max_bytes, 1  # room for the newest copy only
    try:
        prefill_all(producer, prompts, "b")
        assert list(sender.outbox) == ["b1"]
    finally:
        sender.max_bytes = bound
    refused, done = consumer.kv_connector.stats()["refused"], consumer.kv_connector.stats()["done"]
    reqs = decode_all(consumer, prompts, "b")
    assert [r.output_ids for r in reqs] == want
    stats = consumer.kv_connector.stats()
    assert (stats["refused"] - refused, stats["done"] - done) == (1, 1)
    assert_nothing_left(producer, consumer, plain)


def test_control_messages_open_only_for_their_peer_and_number():
    from minillm.engine.kv_transfer import KVLink

    ours = KVLink("127.0.0.1:1", "consumer", "s3cret")
    peer = KVLink("127.0.0.1:1", "producer", "s3cret")
    other = KVLink("127.0.0.1:1", "producer", "guess")
    message = {"transfer_id": "t", "num_tokens": 40}
    signed = peer.sign(7, message)
    assert ours.open(7, signed.encode()) == message
    for n, text in [
        (8, signed),  # replayed under another number
        (7, signed[:-5]),  # truncated
        (7, other.sign(7, message)),  # the wrong secret
        (7, signed.replace('\\"t\\"', '\\"u\\"')),  # altered
        (7, json.dumps(message)),  # unsigned
        (7, "\x00\xff garbage"),
    ]:
        with pytest.raises(PermissionError):
            ours.open(n, text.encode(errors="surrogateescape"))


def test_a_hostile_control_plane_changes_no_token(model_dir):
    """A third party writes into the store while transfers run: random keys and values, pulls
    and replies of its own, replays and truncations of the peers' messages, and a second producer
    (the wrong secret) that holds another prompt's KV under the same transfer ids. Greedy tokens
    equal one engine's; every block comes back on every side; the forgeries are counted."""
    import datetime
    import random
    import threading

    import torch.distributed as dist

    address = f"127.0.0.1:{free_port()}"
    kw = dict(model=str(model_dir), dtype="float32", kv_transfer_address=address)
    consumer = LLMEngine(kv_role="consumer", num_kv_blocks=32, kv_transfer_secret="s3cret", **kw)
    producer = LLMEngine(kv_role="producer", num_kv_blocks=64, kv_transfer_secret="s3cret", **kw)
    rogue = LLMEngine(kv_role="producer", num_kv_blocks=64, kv_transfer_secret="guess", **kw)
    plain = LLMEngine(model=str(model_dir), dtype="float32", num_kv_blocks=64)
    for e in (consumer, producer, rogue):
        e.kv_connector.link.timeout = datetime.timedelta(seconds=3)
    stop, rng = threading.Event(), random.Random(0)

    def fuzz():
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), None, False, datetime.timedelta(seconds=5))
        seen = []
        while not stop.is_set():
            n = store.add("pulls", 0)
            for key in (f"pull{n}", f"reply{n}"):
                if store.check([key]):
                    try:
                        seen.append(store.get(key))
                    except Exception:  # deleted in between
                        pass
            key = f"{rng.choice(['pull', 'reply'])}{n + rng.randint(0, 3)}"
            old = rng.choice(seen) if seen else b"{}"
            value = rng.choice(
                [
                    old,  # a replay under another number
                    old[: rng.randint(0, len(old))],  # truncated
                    bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
                    json.dumps({"status": "ok", "num_blocks": 1, "chunk_blocks": 1}).encode(),
                ]
            )
            store.set(key, value)
            store.set(f"junk{rng.randrange(10**6)}", value)
            time.sleep(0.01)

    prompts = [
        f"Story {i}: the lighthouse keeper counted ships until dawn. " * (2 + i) for i in range(4)
    ]
    want = expected(plain, prompts)
    fuzzer = threading.Thread(target=fuzz, daemon=True)
    try:
        wait_for_producer(consumer)
        fuzzer.start()
        for i, p in enumerate(prompts):
            params = {"transfer_id": f"h{i}"}
            producer.add_request(p, SamplingParams(max_tokens=1), kv_transfer_params=params)
            rogue.add_request(p[::-1], SamplingParams(max_tokens=1), kv_transfer_params=params)
            drain(producer, rogue)
        reqs = decode_all(consumer, prompts, "h")
        assert [r.output_ids for r in reqs] == want
        stop.set()
        fuzzer.join(timeout=10)
        forged = [e.kv_connector.stats()["unauthenticated"] for e in (consumer, producer, rogue)]
        assert forged[1] > 0 and forged[2] > 0, forged  # both producers ignored forged pulls
        assert_nothing_left(consumer, plain)
        for e in (producer, rogue):
            assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
            assert not e.has_unfinished_requests()
    finally:
        stop.set()
        for e in (producer, rogue, consumer, plain):
            e.shutdown()


def test_a_deleted_consumer_releases_its_thread_and_port(model_dir):
    import gc

    address = f"127.0.0.1:{free_port()}"
    kw = dict(model=str(model_dir), dtype="float32", num_kv_blocks=8)
    consumer = LLMEngine(kv_role="consumer", kv_transfer_address=address, **kw)
    thread = consumer.kv_connector._thread
    del consumer
    gc.collect()
    thread.join(timeout=15)
    assert not thread.is_alive()
    consumer = LLMEngine(kv_role="consumer", kv_transfer_address=address, **kw)  # the port again
    consumer.shutdown()
