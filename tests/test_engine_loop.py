"""Chapter 17: a step's floor counted as the chapter says, and the host's work per step measured
with a forward that costs nothing (`minillm bench overhead`)."""

import subprocess
import sys

import pytest
import torch

from minillm.bench.engine_loop import host_overhead, workload_floor
from minillm.bench.random_models import MODEL_SHAPES
from minillm.course.chapter import chapter_exercises
from minillm.models.decoder import config_from_hf, kv_cache_bytes_per_token


def test_a_workloads_floor_is_its_weights_and_its_contexts_kv():
    cfg = config_from_hf(MODEL_SHAPES["Qwen3-0.6B"])
    assert kv_cache_bytes_per_token(cfg, torch.bfloat16) == 112 * 1024  # 28 x K, V x 8 x 128 x 2
    # steps read the weights; a request reads p, p + 1, ... p + n - 1 tokens
    assert workload_floor([10, 20], [3, 1], 5, 2) == 3 * 5 + 2 * (10 + 11 + 12 + 20)


def test_the_classic_wrong_floor_is_caught():
    checker = chapter_exercises("17")[
        "my_workload_floor(prompt_lens, output_lens, weight_bytes, kv_bytes_per_token)"
    ]

    def to_the_end(prompt_lens, output_lens, weight_bytes, kv):
        steps = max(output_lens)
        return steps * weight_bytes + kv * sum(
            steps * p + steps * (steps - 1) // 2 for p in prompt_lens
        )

    with pytest.raises(AssertionError, match="expected"):
        checker(to_the_end)


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["fused C++ step", "torch ops"])
def test_step_profile_splits_a_decode_step(tmp_path, cpu_kernels):
    """A profile of real decode steps: the runner's ranges hold time, the kinds sum to the busy
    time, the CPU's attention and matmuls are found by name, and the requests leave nothing
    behind."""
    from minillm.bench.engine_loop import step_profile
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM

    path = random_model_dir(tmp_path, "SmolLM2-135M", weights=False, num_hidden_layers=2)
    engine = dict(load_format="dummy", dtype="float32", num_kv_blocks=128, cpu_kernels=cpu_kernels)
    # prompts admitted over several steps: the first ones must not finish before the last start
    llm = LLM(str(path), max_num_batched_tokens=64, **engine)
    p = step_profile(llm, batch=6, context=40, steps=3)
    assert (
        p["running"] == 6
        and p["wall_ms"] > 0
        and p["runner_ms"]["forward"] > 0
        and p["runner_ms"]["sample"] > 0
    )
    assert p["busy_ms"] == pytest.approx(sum(p["kinds_ms"].values()))
    assert p["rest_ms"] == pytest.approx(p["wall_ms"] - p["busy_ms"])
    assert p["kinds_ms"]["attention"] > 0 and len(p["top_kernels_ms"]) == 10
    if not cpu_kernels:  # the C++ step does its matmuls inside one call
        assert p["kinds_ms"]["matmul"] > 0
    bm = llm.engine.block_manager
    assert not llm.engine.has_unfinished_requests() and bm.num_free_blocks == bm.num_blocks


def test_step_profile_refuses_what_it_cannot_see(tmp_path):
    from minillm.bench.engine_loop import step_profile
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM

    path = random_model_dir(tmp_path, "SmolLM2-135M", weights=False, num_hidden_layers=1)
    llm = LLM(str(path), load_format="dummy", dtype="float32", num_kv_blocks=64, max_num_seqs=4)
    with pytest.raises(ValueError, match="exceeds max_num_seqs 4"):
        step_profile(llm, batch=5, context=8)
    overlapped = LLM(str(path), load_format="dummy", dtype="float32", async_scheduling=True)
    with pytest.raises(ValueError, match="async_scheduling=False"):
        step_profile(overlapped, batch=2, context=8)


def test_kernel_kinds_by_name():
    from minillm.bench.engine_loop import kernel_kind

    names = {  # as a GPU profile names them (Triton's kernels keep their function's name)
        "_decode_kernel": "attention",
        "_merge_splits_kernel": "attention",
        "_prefill_kernel": "attention",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>": "attention",
        "_store_kv_kernel": "kv write",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
        "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN": "matmul",
        "_int8_matmul_kernel": "matmul",
        "gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4>": "matmul",
        "aten::addmm": "matmul",
        "mkldnn::_linear_pointwise": "matmul",
        "void at::native::vectorized_elementwise_kernel<4, at::native::SiLU>": "other",
        "void at::native::reduce_kernel<512, 1, ArgMaxOps<float>>": "other",
    }
    assert {name: kernel_kind(name) for name in names} == names


def test_host_overhead_runs_the_engine_around_a_free_forward():
    o = host_overhead(4, steps=4, repeats=2, prompt_len=8, vocab_size=1024)
    assert o.batch == 4 and 0 < o.low <= o.ms <= o.high
    assert str(o).startswith("host overhead at batch 4: ")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from minillm.cli import main; main()",
            "bench",
            "overhead",
            "--batch",
            "2",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--prompt-len",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "host overhead at batch 2:" in r.stdout, r.stderr[-2000:]


def _kept_rows_trace(windows, seed, steps=250):
    """A scheduler over a small pool (a shared prefix, finishes, preemptions): every step, the flat
    batch from InputBatch's rows equals the one made from the sequences' lists."""
    import random

    from minillm.attention.input_batch import build_flat_batch
    from minillm.core.block_manager import BlockManager
    from minillm.core.hybrid_kv_cache import HybridBlockManager
    from minillm.core.request import Request
    from minillm.core.scheduler import Scheduler
    from minillm.engine.input_batch import InputBatch

    rng = random.Random(seed)
    if len(windows) > 1:
        bm = HybridBlockManager(20, 4, True, windows, max_num_batched_tokens=16)
    else:
        bm = BlockManager(20, 4, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=16)
    kept, prefix = InputBatch(windows, rows=1, width=1), list(range(1, 9))
    for i in range(steps):
        if rng.random() < 0.6:
            tail = [rng.randrange(50) for _ in range(rng.randint(1, 10))]
            sched.add(Request(i, prefix[: rng.randint(0, 8)] + tail, max_tokens=rng.randint(1, 16)))
        out = sched.schedule()
        if out.is_empty:
            continue
        tables = kept.block_tables(out.requests)
        a = build_flat_batch(out.requests, out.num_tokens, 4, tables=tables)
        b = build_flat_batch(out.requests, out.num_tokens, 4)
        assert torch.equal(a.positions, b.positions) and torch.equal(a.input_ids, b.input_ids)
        for x, y in zip([a.metadata, *a.group_metadata], [b.metadata, *b.group_metadata]):
            assert torch.equal(x.block_tables, y.block_tables), f"seed {seed}, step {i}"
            assert torch.equal(x.slot_mapping, y.slot_mapping), f"seed {seed}, step {i}"
        assert set(kept.row_of) == set(out.requests)  # the others' rows were given back
        sched.update(out, [[rng.randrange(50)] if s else [] for s in out.samples])
        for r in list(sched.running):
            if r.num_output_tokens >= r.max_tokens or rng.random() < 0.03:
                sched.finish(r, "length")
    return sched.num_preemptions, bm.hits


@pytest.mark.parametrize("windows", [[None], [None, 5]], ids=["one group", "full and sliding"])
def test_kept_rows_equal_tables_made_from_the_lists(windows):
    preemptions = hits = 0
    for seed in range(4):
        p, h = _kept_rows_trace(windows, seed)
        preemptions, hits = preemptions + p, hits + h
    assert preemptions > 10 and hits > 10  # the traces went through both


def test_host_tensor_is_torch_tensor_of_the_same_values():
    from minillm.utils import host_tensor

    for dtype, values in [
        (torch.long, [0, -1, 2**40]),
        (torch.int32, [3, -7]),
        (torch.float32, [0.1, 1e-30, -2.5]),
        (torch.bool, [True, False, True]),
        (torch.long, []),
    ]:
        got, want = host_tensor(values, dtype), torch.tensor(values, dtype=dtype)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_served_against_offline_runs_the_same_requests_both_ways(tmp_path):
    from minillm.bench.engine_loop import served_against_offline
    from minillm.bench.random_models import random_model_dir
    from minillm.bench.vllm_bench import random_dataset
    from minillm.loader import load_tokenizer

    model = str(random_model_dir(tmp_path, "SmolLM2-135M", num_hidden_layers=1, vocab_size=1024))
    requests = random_dataset(load_tokenizer(model), 6, 8, 5, range_ratio=0.5, seed=1)
    both = served_against_offline(
        model, requests, repeats=1, log=str(tmp_path / "serve.log"), dtype="float32"
    )
    made = sum(n for _, n in requests)  # ignore_eos: every request makes its output length
    assert both["output_tokens"] == [made]
    assert all(x > 0 for k in ("offline_tok_s", "served_tok_s", "served_tpot_ms") for x in both[k])


def test_served_against_offline_refuses_switches_by_name():
    from minillm.bench.engine_loop import served_against_offline

    with pytest.raises(ValueError, match="enforce_eager"):
        served_against_offline("unused", [], enforce_eager=True)


def test_gc_pauses_records_each_collection_while_the_engine_steps():
    import gc

    from minillm.bench.engine_loop import gc_pauses, null_engine, start_batch

    engine = null_engine(4, 9, prompt_len=8, vocab_size=1024, detokenize=False)
    start_batch(engine, 4, 9, prompt_len=8)
    callbacks, threshold = list(gc.callbacks), gc.get_threshold()
    gc.set_threshold(50)  # young collections every few steps
    try:
        pauses = gc_pauses(engine, 8)
    finally:
        gc.set_threshold(*threshold)
    assert set(pauses) == {0, 1, 2} and pauses[0]
    assert all(ms >= 0 for times in pauses.values() for ms in times)
    assert gc.callbacks == callbacks  # its watcher is gone
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_dropped_engine_is_freed_before_the_next_one_takes_memory(tmp_path, monkeypatch):
    """An engine freezes the heap it starts with (`freeze_gc_heap`), itself included: one dropped
    while in a reference cycle is freed when the next engine starts, before its runner takes its
    memory, and `shutdown` gives the heap back to the collector."""
    import gc
    import weakref

    import minillm.engine.llm_engine as llm_engine
    from minillm.bench.random_models import random_model_dir
    from minillm.llm import LLM

    path = random_model_dir(tmp_path, "SmolLM2-135M", weights=False, num_hidden_layers=1)
    engine = dict(load_format="dummy", dtype="float32", num_kv_blocks=16)
    first = LLM(str(path), **engine)
    assert gc.get_freeze_count() > 0
    first.engine.itself = first.engine  # a cycle: only the collector can free it
    ref = weakref.ref(first.engine)
    del first
    gc.collect()
    assert ref() is not None  # frozen: out of the collector's sight
    freed_first = []
    make = llm_engine.create_model_runner

    def runner(*args):
        freed_first.append(ref() is None)
        return make(*args)

    monkeypatch.setattr(llm_engine, "create_model_runner", runner)
    second = LLM(str(path), **engine)
    assert freed_first == [True]
    second.engine.itself = second.engine
    ref = weakref.ref(second.engine)
    second.shutdown()
    del second
    gc.collect()
    assert ref() is None
