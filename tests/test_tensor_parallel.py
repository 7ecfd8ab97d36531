"""Tensor parallelism on CPU with gloo and 2 ranks (chapter 11).

Greedy tokens with tensor_parallel_size=2 against transformers' on small random Llamas: one whose
KV heads split over the ranks, one whose single KV head is replicated (and whose vocabulary does
not divide by 2). The ranks' partial sums are added in another order than one matmul adds them, so
a divergence is allowed only at a near-tie of transformers' own logits, and reported. Then the
processes: workers exit cleanly, a worker's error or death reaches the caller as EngineDeadError,
Ctrl-C and a killed rank 0 leave no worker behind, and the same engine runs under torchrun.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch
from helpers import assert_equal_except_near_ties

from minillm.bench.random_models import random_model_dir
from minillm.engine.config import EngineDeadError
from minillm.llm import LLM
from minillm.loader import load_hf_model
from minillm.sampling import SamplingParams

STEPS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
SHAPES = {  # heads 4 : KV heads 2 (split), 4 : 1 (replicated), vocabularies even and odd
    "kv-split": dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
    "kv-replicated": dict(num_attention_heads=4, num_key_value_heads=1, vocab_size=1001),
}


def small_llama(path, **fields):
    shape = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        head_dim=32,
        max_position_embeddings=512,
    )
    return random_model_dir(path, "SmolLM2-135M", **{**shape, **fields})


@pytest.fixture(scope="module", params=sorted(SHAPES))
def model(request, tmp_path_factory):
    path = small_llama(tmp_path_factory.mktemp(request.param), **SHAPES[request.param])
    return path, load_hf_model(path, dtype=torch.float32)


def prompts_with_shared_prefix(n: int = 6) -> list[list[int]]:
    "Prompts of 20-70 tokens, the first four sharing a 32-token prefix (two full blocks of 16)."
    prefix = [(7 * i + 3) % 900 + 2 for i in range(32)]
    return [
        (prefix if i < 4 else []) + [(13 * i + 5 * j) % 900 + 2 for j in range(20 + 9 * i)]
        for i in range(n)
    ]


def test_greedy_tokens_equal_transformers(model):
    "Chunked prefill (16-token budget), prefix caching (a shared prefix), preemption (8 blocks)."
    path, hf = model
    prompts = prompts_with_shared_prefix()
    llm = LLM(
        str(path),
        tensor_parallel_size=2,
        dtype="float32",
        max_num_batched_tokens=16,
        num_kv_blocks=8,
        block_size=16,
    )
    try:
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert_equal_except_near_ties(outs, hf, prompts)
        assert llm.engine.scheduler.num_preemptions > 0
        assert all(len(o.token_ids) == STEPS for o in outs)
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests
        again = llm.generate(prompts[:4], GREEDY, use_tqdm=False)  # prefix cache hits
        assert any(o.num_cached_tokens >= 32 for o in again)
        assert [o.token_ids for o in again] == [o.token_ids for o in outs[:4]]
        stats = llm.engine.runner.tp.stats
        assert stats["all_reduce"].calls > 0 and stats["gather"].calls > 0
    finally:
        llm.shutdown()
    workers = llm.engine.runner.tp.workers
    assert [p.exitcode for p, _ in workers] == [0]  # asked to stop, and stopped cleanly


def test_each_rank_holds_its_share(model):
    path, hf = model
    llm = LLM(str(path), tensor_parallel_size=2, dtype="float32", num_kv_blocks=4)
    try:
        m, full = llm.engine.model, hf.config
        assert m.config.num_heads == full.num_attention_heads // 2
        assert m.config.num_kv_heads == max(1, full.num_key_value_heads // 2)
        assert m.config.vocab_size == full.vocab_size  # the sampler's vocabulary stays whole
        assert llm.engine.runner.cache.k.shape[3] == m.config.num_kv_heads
        assert m.model.embed_tokens.embedding.num_embeddings == (full.vocab_size + 1) // 2
    finally:
        llm.shutdown()


def test_impossible_degree_is_refused_before_anything_starts(tmp_path):
    path = small_llama(
        tmp_path / "m",
        hidden_size=192,
        intermediate_size=384,
        num_attention_heads=6,
        num_key_value_heads=3,
    )
    with pytest.raises(ValueError, match=r"possible sizes: \[1, 3, 6\]"):
        LLM(str(path), tensor_parallel_size=2)


def test_a_worker_error_reaches_the_caller(tmp_path):
    path = small_llama(tmp_path / "m", num_attention_heads=4, num_key_value_heads=2)
    llm = LLM(str(path), tensor_parallel_size=2, dtype="float32", num_kv_blocks=16)
    tp = llm.engine.runner.tp
    tp.send("not a batch")  # the worker's forward raises on it, reports, and exits
    tp.workers[0][0].join(timeout=60)
    with pytest.raises(EngineDeadError, match="worker 1 .*AttributeError"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert not llm.engine.requests and llm.engine.block_manager.num_free_blocks == 16
    with pytest.raises(EngineDeadError, match="has stopped"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    llm.shutdown()


def test_a_killed_worker_reaches_the_caller(tmp_path):
    path = small_llama(tmp_path / "m", num_attention_heads=4, num_key_value_heads=2)
    llm = LLM(str(path), tensor_parallel_size=2, dtype="float32", num_kv_blocks=16)
    worker = llm.engine.runner.tp.workers[0][0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=60)
    with pytest.raises(EngineDeadError, match="killed by signal 9"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    llm.shutdown()


SCRIPT = """
import faulthandler, json, signal, sys
from minillm.llm import LLM

faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if we hang
from minillm.sampling import SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], tensor_parallel_size=2, dtype="float32", num_kv_blocks=16)
    print(json.dumps({"workers": [p.pid for p, _ in llm.engine.runner.tp.workers]}), flush=True)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    if sys.argv[2] == "generate":
        print(json.dumps(llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].token_ids))
    elif sys.argv[2] == "forever":
        while True:
            llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return not any(alive(p) for p in pids)


CTRL_C_HANG = pytest.mark.xfail(
    strict=False,
    reason="open bug: in fresh-clone runs of the whole suite rank 0 sometimes stays in C code for "
    "over 20 s after SIGINT (stacks seen: gloo's broadcast in TensorParallel.send, oneDNN's matmul "
    "in PackedLinear); never reproduced alone. The stack dump below says where when it happens",
)


@pytest.mark.parametrize("how", [pytest.param("ctrl-c", marks=CTRL_C_HANG), "sigkill"])
def test_no_orphans_when_rank_0_stops(tmp_path, how):
    "Ctrl-C (SIGINT to the whole process group) and SIGKILL of rank 0: its worker exits too."
    path = small_llama(tmp_path / "m", num_attention_heads=4, num_key_value_heads=2)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), "forever"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        workers = json.loads(proc.stdout.readline())["workers"]
        time.sleep(1.0)  # inside generate
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.kill()
        try:
            proc.wait(timeout=20)  # it exits in about a second when it does
        except subprocess.TimeoutExpired:  # say where rank 0 is stuck (stderr: the test's output)
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            raise
        assert wait_gone(workers), "a worker outlived rank 0"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_torchrun(tmp_path):
    "The same script under torchrun: rank 0 generates, rank 1 becomes a worker and exits with it."
    path = small_llama(tmp_path / "m", num_attention_heads=4, num_key_value_heads=2)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("llm.engine.runner.tp.workers", "[]"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    out = subprocess.run(
        [*cmd, str(script), str(path), "generate"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    tokens = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(tokens) == STEPS
    hf = load_hf_model(path, dtype=torch.float32)
    assert_equal_except_near_ties([SimpleNamespace(token_ids=tokens)], hf, [[5, 6, 7, 8]])


def test_engines_release_their_workers(tmp_path):
    """`with` releases the workers; so does deleting the LLM; and a name rebound to a new
    tensor-parallel LLM (a notebook cell run twice) works while the old one still exists (each
    engine's groups are its own), the old one's workers gone once it is collected."""
    import gc

    path = small_llama(tmp_path / "m", num_attention_heads=4, num_key_value_heads=2)
    kw = dict(tensor_parallel_size=2, dtype="float32", num_kv_blocks=16)

    def workers(llm):
        return [p.pid for p, _ in llm.engine.runner.tp.workers]

    with LLM(str(path), **kw) as llm:
        first = workers(llm)
        want = llm.generate([[5, 6, 7, 8]], GREEDY, use_tqdm=False)[0].token_ids
    assert wait_gone(first), "a worker outlived its with block"
    llm = LLM(str(path), **kw)
    second = workers(llm)
    llm = LLM(str(path), **kw)  # the cell again: both engines exist while the new one starts
    gc.collect()
    assert wait_gone(second), "the replaced engine's worker outlived it"
    assert llm.generate([[5, 6, 7, 8]], GREEDY, use_tqdm=False)[0].token_ids == want
    third = workers(llm)
    del llm
    gc.collect()
    assert wait_gone(third), "a worker outlived its deleted LLM"
