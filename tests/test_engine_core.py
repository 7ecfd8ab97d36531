"""Chapter 17: the engine core in a process of its own (`EngineCoreClient`), fed token ids over a
pipe, its text and stop strings made beside it; against transformers and the engine on a thread."""

import asyncio
import random
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.bench.offline import hf_greedy
from minillm.bench.random_models import random_model_dir
from minillm.engine.llm_engine import EngineConfig, EngineDeadError
from minillm.loader import load_hf_model
from minillm.server.admin import reset_prefix_cache_of
from minillm.server.engine_client import EngineCoreClient

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return str(random_model_dir(path, "SmolLM2-135M", num_hidden_layers=2, vocab_size=1024))


@pytest.fixture(scope="module")
def client(tiny):
    # chunks of 32 tokens and a pool of 12 blocks: prompts chunked, requests preempted
    config = EngineConfig(
        model=tiny, dtype="float32", max_num_batched_tokens=32, num_kv_blocks=12, max_num_seqs=8
    )
    client = EngineCoreClient(config)
    yield client
    client.shutdown()


async def streamed(aeng, prompts, params) -> list[dict]:
    "Each prompt's streamed text and ids, and its final output, through `aeng` (submit, outputs)."
    reqs = [aeng.engine.make_request(p, params) for p in prompts]
    got = [{"text": "", "ids": [], "final": None, "prompt_logprobs": None} for _ in prompts]
    async for i, out in aeng.submit(reqs).outputs():
        got[i]["text"] += out.delta_text
        got[i]["ids"] += out.delta_token_ids
        if out.finished:
            o = out.outputs[0]
            got[i]["final"] = (o.text, o.token_ids, o.finish_reason, o.stop_reason, o.logprobs)
            got[i]["prompt_logprobs"] = out.prompt_logprobs
    return got


def settled(client, timeout: float = 10.0):
    "The core's stats once it has nothing running (what it sends after its last step and aborts)."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = client.stats
        if stats.running == 0 and stats.free_blocks == stats.total_blocks:
            return stats
        time.sleep(0.05)
    return client.stats


def test_the_core_makes_transformers_greedy_tokens(client, tiny):
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 1024) for _ in range(n)] for n in (3, 40, 17, 9, 28, 5)]
    got = asyncio.run(streamed(client, prompts, GREEDY))
    hf = load_hf_model(tiny)
    for g, p in zip(got, prompts):
        want = hf_greedy(hf, p, 20)
        assert g["ids"] == want and g["final"][1] == want and g["final"][2] == "length"
    stats = settled(client)
    assert stats.preemptions > 0  # the small pool preempted some
    assert stats.free_blocks == stats.total_blocks and stats.running == 0


def test_stop_strings_end_requests_beside_the_core(client, tiny):
    """Text, ids, finish and stop reasons equal the engine's own (offline, where the engine stops
    a request itself); the core, told to abort, keeps no block."""
    prompts = ["Hello there", "The capital of France is", "1 2 3 4", "a b c"]
    offline = LLM(tiny, dtype="float32")
    free = offline.generate(prompts, GREEDY, use_tqdm=False)
    stops = [o.text[6:9] for o in free[:2]]  # strings the greedy text holds
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=stops)
    want = offline.generate(prompts, params, use_tqdm=False)
    got = asyncio.run(streamed(client, prompts, params))
    assert sum(o.finish_reason == "stop" for o in want) >= 2
    for g, w in zip(got, want):
        assert g["final"][:4] == (w.text, w.token_ids, w.finish_reason, w.outputs[0].stop_reason)
        assert (g["text"], g["ids"]) == (w.text, w.token_ids)  # the stream adds up to the end
    stats = settled(client)
    assert stats.free_blocks == stats.total_blocks and stats.running == 0


def fails_with_a_value_error(engine):
    raise ValueError("not on this engine")


def test_refusals_and_calls_reach_their_caller_alone(client):
    with pytest.raises(ValueError, match="KV blocks"):  # checked here, against the pool's size
        client.engine.make_request([5, 6, 7], SamplingParams(max_tokens=400))
    # refused by the core (it holds the KV connector): a 400 for that request, no other's
    bad = client.engine.make_request([5, 6, 7], GREEDY, kv_transfer_params={"transfer_id": "t"})
    good = client.engine.make_request([5, 6, 7], GREEDY)

    async def both():
        async def one(req):
            try:
                return [o async for _, o in client.submit([req]).outputs()][-1]
            except ValueError as e:
                return e

        return await asyncio.gather(one(bad), one(good))

    refused, done = asyncio.run(both())
    assert isinstance(refused, ValueError) and "kv_role" in str(refused)
    assert done.finished and len(done.token_ids) == 20

    async def calls():
        flushed = await client.call(reset_prefix_cache_of)
        with pytest.raises(ValueError, match="not on this engine"):
            await client.call(fails_with_a_value_error)
        return flushed

    assert asyncio.run(calls()) >= 0
    assert client.alive and client.num_sinks == 0 and not client.output.states


def test_a_dead_core_fails_every_request_at_once(tiny):
    client = EngineCoreClient(EngineConfig(model=tiny, dtype="float32"))
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    async def run():
        sub = client.submit([client.engine.make_request([5, 6, 7], long)])
        outputs = sub.outputs()
        await outputs.__anext__()  # it runs
        client.process.kill()
        with pytest.raises(EngineDeadError, match="exited"):
            async for _ in outputs:
                pass

    try:
        asyncio.run(asyncio.wait_for(run(), 60))
        assert not client.alive
        with pytest.raises(EngineDeadError):
            asyncio.run(streamed(client, [[1, 2]], GREEDY))
    finally:
        client.shutdown()


def test_logprobs_and_grammars_cross_the_pipe_as_on_a_thread(client, tiny):
    """Logprobs of the output and of the prompt, and a grammar (compiled beside the core to check
    it, and in the core to follow it): the same outputs as the engine on the server's thread."""
    from minillm.engine.structured_output import GuidedDecodingParams
    from minillm.server.async_engine import AsyncEngine

    words = GuidedDecodingParams(choice=["t5", "t7"])  # words of the tiny tokenizer
    asks = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=1),
        SamplingParams(temperature=0, max_tokens=8, guided_decoding=words, logprobs=0),
    ]
    thread = AsyncEngine(config=EngineConfig(model=tiny, dtype="float32"))
    try:
        for params in asks:
            want = asyncio.run(streamed(thread, ["Pick a color:"], params))[0]
            got = asyncio.run(streamed(client, ["Pick a color:"], params))[0]
            assert got == want
    finally:
        thread.shutdown()
    with pytest.raises(ValueError):  # a grammar that does not compile: refused before it is sent
        bad = GuidedDecodingParams(regex="(unclosed")
        client.engine.make_request([5, 6], SamplingParams(max_tokens=4, guided_decoding=bad))


EXITS_WITHOUT_SHUTDOWN = """
import sys
from minillm.engine.llm_engine import EngineConfig
from minillm.server.engine_client import EngineCoreClient

if __name__ == "__main__":
    client = EngineCoreClient(EngineConfig(model=sys.argv[1], dtype="float32"))
    print(client.process.pid, flush=True)
    raise SystemExit("a program that fails before it shuts the client down")
"""


def test_a_program_that_never_shuts_the_core_down_still_exits(tiny, tmp_path):
    "The core is a daemon: the program's exit ends it, and the program does not wait on it."
    import os
    import subprocess
    import sys

    script = tmp_path / "exits.py"
    script.write_text(EXITS_WITHOUT_SHUTDOWN)
    done = subprocess.run(
        [sys.executable, str(script), tiny], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and "fails before" in done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the engine core outlived its program"


def test_tensor_parallelism_is_refused_by_name(tiny):
    with pytest.raises(ValueError, match="tensor-parallel"):
        EngineCoreClient(EngineConfig(model=tiny, dtype="float32", tensor_parallel_size=2))
