"""Chapter 17: the host a step ahead of the device (async scheduling). On a CPU the forward runs on
a worker thread while the engine reads the step before, so ordering bugs show here: every path
keeps transformers' greedy tokens, and nothing leaks."""

import json
import random
import threading
import time

import pytest
import torch
from helpers import hf_greedy
from test_cuda_graphs import graph_llm
from test_engine import assert_poison_fails_alone, poison
from test_hybrid_models import GEMMA3
from test_linear_attention import QWEN3_5
from transformers import AutoModelForCausalLM

from minillm import LLM, SamplingParams
from minillm.bench.random_models import random_model_dir
from minillm.core.request import PLACEHOLDER
from minillm.engine.structured_output import GuidedDecodingParams
from minillm.loader import load_hf_model


def overlapped(path, jitter: float = 0.003, **kw) -> LLM:
    """An engine that plans a step ahead, its forward on a worker thread that waits up to `jitter`
    seconds first: the host's reads and the device's steps interleave differently each step."""
    llm = LLM(str(path), dtype="float32", async_scheduling=True, **kw)
    runner, rng = llm.engine.runner, random.Random(0)
    logits = runner.logits

    def late(batch):
        time.sleep(rng.random() * jitter)
        return logits(batch)

    runner.logits = late
    return llm


def prompts_of(lengths, seed=0, vocab=5000):
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]


def assert_nothing_held(llm):
    engine = llm.engine
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not engine.requests
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "setting",
    [
        {},
        {"max_num_batched_tokens": 16},  # every prompt in chunks
        {"num_kv_blocks": 10, "max_num_batched_tokens": 64},  # preemption
        {"max_num_seqs": 2},  # requests wait for others' rows
    ],
    ids=["batched", "chunked", "preempted", "queued"],
)
def test_greedy_tokens_equal_transformers(random_llama, setting):
    path, hf = random_llama
    llm = overlapped(path, **setting)
    prompts = prompts_of((5, 17, 31, 2, 40, 9, 23))
    again = [prompts[2], prompts[4][:35]]  # then prefix cache hits
    params = [
        SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(9)
    ]
    outs = llm.generate(prompts, params[:7], use_tqdm=False)
    outs += llm.generate(again, params[7:], use_tqdm=False)
    for o, p, q in zip(outs, prompts + again, params):
        assert o.token_ids == hf_greedy(hf, p, q.max_tokens) and o.finish_reason == "length"
    if "num_kv_blocks" in setting:
        assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.hits > 0
    assert_nothing_held(llm)


def test_the_host_reads_a_step_while_the_next_one_runs(random_llama):
    """The overlap itself: a forward waits until the engine has read the step before it; were the
    read after the forward (no overlap), the forward would wait in vain."""
    path, hf = random_llama
    llm = LLM(str(path), dtype="float32", async_scheduling=True)
    engine, runner = llm.engine, llm.engine.runner
    read, waited, behind = threading.Event(), [], set()
    logits, process, prepare = runner.logits, engine.process, runner.prepare

    def preparing(out):
        batch = prepare(out)
        if engine.overlap.busy:  # a step before it is in flight: the host reads it meanwhile
            behind.add(id(batch))
        return batch

    def after_a_read(batch):
        if id(batch) in behind:
            waited.append(read.wait(timeout=30))
            read.clear()
        return logits(batch)

    def reading(*args, **kw):
        outputs = process(*args, **kw)
        read.set()
        return outputs

    runner.logits, runner.prepare, engine.process = after_a_read, preparing, reading
    prompts = prompts_of((4, 9, 6))
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]
    assert len(waited) >= 6 and all(waited)


def test_stops_waste_one_row_and_nothing_else(random_llama):
    """A request that stops at a token read while the next step runs (a stop token, a stop string,
    its length) is cut there: the row it had in the next step is dropped, no placeholder reaches
    its output, and its blocks come back."""
    path, hf = random_llama
    llm = overlapped(path)
    prompts = prompts_of((6, 11, 8))
    reference = [hf_greedy(hf, p, 12) for p in prompts]
    words = llm.engine.tokenizer.convert_ids_to_tokens(reference[1])
    params = [
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[reference[0][4]]),
        SamplingParams(temperature=0, max_tokens=12, stop=[words[6]], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
    ]
    a, b, c = llm.generate(prompts, params, use_tqdm=False)
    stop_at = reference[0].index(reference[0][4]) + 1
    assert a.token_ids == reference[0][:stop_at] and a.finish_reason == "stop"
    assert b.finish_reason == "stop" and b.token_ids == reference[1][: len(b.token_ids)]
    assert words[6] not in b.text and len(b.token_ids) <= 7
    assert c.token_ids == reference[2][:5] and c.finish_reason == "length"
    assert all(PLACEHOLDER not in o.token_ids for o in (a, b, c))
    assert_nothing_held(llm)


def test_aborts_while_a_step_is_in_flight(random_llama):
    path, hf = random_llama
    llm = overlapped(path)
    engine = llm.engine
    prompts = prompts_of((7, 12, 5, 9))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    for _ in range(4):
        engine.step()
    assert engine.overlap.busy and any(r.num_placeholders for r in reqs)
    for r in reqs[::2]:
        assert engine.abort_request(r.request_id)
        assert PLACEHOLDER not in r.token_ids and r.num_placeholders == 0
    while engine.has_unfinished_requests():
        engine.step()
    assert [r.finish_reason for r in reqs] == ["abort", "length"] * 2
    assert [r.output_ids for r in reqs[1::2]] == [hf_greedy(hf, p, 20) for p in prompts[1::2]]
    assert_nothing_held(llm)


def test_a_failing_batch_runs_again_one_by_one(random_llama):
    path, hf = random_llama
    llm = overlapped(path, max_num_batched_tokens=64)
    poison(llm)
    assert_poison_fails_alone(llm, hf)


def test_grammars_and_penalties_see_the_token_just_read(random_llama):
    """What sampling reads from a request's past tokens (a grammar's state, repetition penalties)
    is read after the step before was: the grammar holds, and penalised greedy tokens equal
    transformers' with the same penalty."""
    path, _ = random_llama
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    llm = overlapped(path)
    prompts = prompts_of((6, 13))
    penalised = SamplingParams(
        temperature=0, max_tokens=12, repetition_penalty=1.5, ignore_eos=True
    )
    choice = GuidedDecodingParams(choice=["t5", "t81"])  # words the tokenizer spells
    guided = SamplingParams(temperature=0, max_tokens=12, guided_decoding=choice)
    outs = llm.generate(prompts + prompts, [penalised] * 2 + [guided] * 2, use_tqdm=False)
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p])
        ref = hf.generate(ids, max_new_tokens=12, do_sample=False, repetition_penalty=1.5)
        assert o.token_ids == ref[0, len(p) :].tolist()
    assert {o.text.strip() for o in outs[2:]} <= {"t5", "t81"}
    assert all(o.finish_reason == "stop" for o in outs[2:])
    assert_nothing_held(llm)


@pytest.mark.parametrize("family", ["gemma3", "qwen3.5"])
def test_sliding_windows_and_recurrent_states(family, tmp_path):
    """Gemma 3's sliding-window groups, and Qwen3.5's recurrent states, whose step commits its new
    states: a step ahead, the states a step reads are those the step before wrote."""
    path = random_model_dir(tmp_path, {"gemma3": GEMMA3, "qwen3.5": QWEN3_5}[family], seed=1)
    hf = load_hf_model(path)
    prompts = prompts_of((1, 9, 30, 4, 17, 2), vocab=512)
    llm = overlapped(path, max_num_seqs=4, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 14) for p in prompts]
    assert_nothing_held(llm)


def test_through_the_graphs_data_path(random_llama):
    """The GPU's default: a step ahead with decode steps through CUDAGraphDecoder (on CPU its
    static buffers without capture): the placeholders filled before the batch is copied in."""
    path, hf = random_llama
    llm = graph_llm(path, async_scheduling=True)
    served = []
    run = llm.engine.runner.graphs.run
    llm.engine.runner.graphs.run = lambda batch: served.append(batch) or run(batch)
    prompts = prompts_of((5, 17, 31, 2, 40, 9))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 10) for p in prompts]
    assert served and llm.engine.overlap is not None
    assert_nothing_held(llm)


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative"),
        ({"tensor_parallel_size": 2}, "tensor parallelism"),
    ],
)
def test_what_cannot_run_ahead_is_refused_by_name(random_llama, setting, named):
    with pytest.raises(ValueError, match=f"async_scheduling cannot run with {named}"):
        LLM(str(random_llama[0]), async_scheduling=True, **setting)


def test_off_by_default_on_a_cpu_and_on_when_asked(random_llama):
    assert LLM(str(random_llama[0])).engine.overlap is None
    assert LLM(str(random_llama[0]), async_scheduling=True).engine.config.async_scheduling


def test_steps_sampled_here_and_there_alternate(random_llama):
    """Steps whose sampling reads what the host reads (here: repetition penalties) are sampled
    after the read; the others on the device, ahead. Requests of both kinds come and go, so the
    loop switches between the two, both ways, and every token is still transformers'."""
    path, _ = random_llama
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    llm = overlapped(path)
    engine = llm.engine
    plain = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    penalised = SamplingParams(temperature=0, max_tokens=5, repetition_penalty=1.3, ignore_eos=True)
    prompts = prompts_of((7, 12, 5, 9))
    reqs = [engine.add_request(prompts[0], plain)]
    for _ in range(3):
        engine.step()
    reqs.append(engine.add_request(prompts[1], penalised))  # here, then ahead again
    for _ in range(9):
        engine.step()
    reqs += [engine.add_request(prompts[2], plain), engine.add_request(prompts[3], penalised)]
    while engine.has_unfinished_requests():
        engine.step()
    for req, p in zip(reqs, prompts):
        ids, penalty = torch.tensor([p]), req.params.repetition_penalty
        ref = hf.generate(
            ids, max_new_tokens=req.params.max_tokens, do_sample=False, repetition_penalty=penalty
        )
        assert req.output_ids == ref[0, len(p) :].tolist()
    assert_nothing_held(llm)


def test_a_step_that_fails_once_takes_the_step_after_it_down_and_both_run_again(random_llama):
    """A decode step fails on the device (once, as a transient fault) while the step after it is
    already queued: that one cannot run (its inputs were that step's tokens), both are rewound,
    the failed step's requests run again one by one and the next plan takes over; no request
    fails and every token is transformers'."""
    path, hf = random_llama
    llm = overlapped(path)
    runner, calls = llm.engine.runner, []
    forward = runner.forward

    def fails_once(batch):
        calls.append(len(batch.input_ids))
        if len(calls) == 4:
            raise RuntimeError("a transient fault")
        return forward(batch)

    runner.forward = fails_once
    prompts = prompts_of((6, 14, 9))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 10) for p in prompts]
    assert all(o.finish_reason == "length" for o in outs) and calls[3] == 3  # a decode step
    assert_nothing_held(llm)


def test_served_a_step_ahead(random_llama, tmp_path):
    """`minillm serve --async-scheduling`: concurrent streams and completions give the offline
    engine's greedy texts, a guided choice holds, and a client that leaves mid-stream gets its
    request aborted while steps are in flight, its blocks back."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from helpers import minillm_serve
    from test_server import metrics, wait_pool_free

    path, _ = random_llama
    offline = LLM(str(path), dtype="float32")
    prompts = [f"t{i} t{i + 3} t{2 * i}" for i in range(1, 9)]
    refs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    log = tmp_path / "server.log"
    with minillm_serve(path, log, "--served-model-name", "m", "--async-scheduling") as (base, _):

        def one(i):
            body = {"model": "m", "prompt": prompts[i], "max_tokens": 12, "temperature": 0}
            if i % 2:
                return httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()[
                    "choices"
                ][0]["text"]
            body["stream"] = True
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
                chunks = [l[6:] for l in r.iter_lines() if l.startswith("data: {")]
            return "".join(json.loads(c)["choices"][0]["text"] for c in chunks)

        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(one, range(8)))
        assert texts == [r.text for r in refs]
        body = {"model": "m", "prompt": "t3 t4", "max_tokens": 5, "temperature": 0}
        body["structured_outputs"] = {"choice": ["t5", "t81"]}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
        assert r.json()["choices"][0]["text"].strip() in {"t5", "t81"}
        long = {"model": "m", "prompt": "t1 t2", "max_tokens": 400, "ignore_eos": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=long | {"stream": True}) as r:
            lines = r.iter_lines()
            assert any(next(lines).startswith("data: ") for _ in range(6))
            assert (
                metrics(base)["minillm_kv_cache_free_blocks"]
                < metrics(base)["minillm_kv_cache_total_blocks"]
            )
        wait_pool_free(base)


def test_logprobs_a_step_ahead_equal_the_plain_loop(random_llama):
    "A request's logprobs and prompt logprobs are the same a step ahead as in chapter 7b's loop."
    path, _ = random_llama
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=2, prompt_logprobs=1)
    prompt = prompts_of((9,))
    plain = LLM(str(path), dtype="float32").generate(prompt, params, use_tqdm=False)[0]
    ahead = overlapped(path).generate(prompt, params, use_tqdm=False)[0]
    assert ahead.token_ids == plain.token_ids
    assert ahead.outputs[0].logprobs == plain.outputs[0].logprobs
    assert ahead.prompt_logprobs == plain.prompt_logprobs


def test_an_engine_a_step_ahead_is_freed_when_let_go(random_llama):
    """Nothing keeps an engine alive once its user lets go, and no cycle waits for the garbage
    collector: its finalizer's stops hold nothing of it (an overlap loop's bound method did, and
    every engine's 1 GiB pool stayed), and its loop holds it by a weak proxy (a cycle kept pools
    until a full collection, and a test worker ran out of memory)."""
    import gc
    import weakref

    gc.disable()
    try:
        llm = LLM(str(random_llama[0]), dtype="float32", async_scheduling=True)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
        engine = weakref.ref(llm.engine)
        del llm
        assert engine() is None
    finally:
        gc.enable()
