"""Chapter 8c: decode steps through CUDAGraphDecoder give transformers' tokens.

On a GPU the engine captures and replays real graphs; on CPU the same static buffers and padding
run without capture, under the Triton interpreter."""

import random

import pytest
import torch
from helpers import hf_greedy
from test_hybrid_models import GEMMA3, SMOLLM3
from test_linear_attention import QWEN3_5
from test_moe import QWEN3_MOE

from minillm import LLM, SamplingParams
from minillm.bench.random_models import random_model_dir
from minillm.engine.cuda_graphs import CUDAGraphDecoder
from minillm.loader import load_hf_model
from minillm.models.moe import SparseMoeBlock
from minillm.spec_decode.proposers import truncated_model_dir


def graph_llm(path, **kw) -> LLM:
    """An engine whose decode steps go through CUDAGraphDecoder: captured on a GPU; on CPU the same
    static buffers and padding, run without capture under the Triton interpreter."""
    llm = LLM(
        str(path),
        attention_backend="triton",
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=256,
        dtype="float32",
        device="cuda" if torch.cuda.is_available() else "cpu",
        **kw,
    )
    engine = llm.engine
    if engine.runner.graphs is None:  # CPU: no capture, the same data path
        assert engine.config.enforce_eager and engine.runner.device.type == "cpu"
        engine.runner.graphs = CUDAGraphDecoder(
            engine.model,
            engine.runner.cache,
            4,
            engine.max_model_len,
            capture=False,
            states=engine.runner.states,
            num_drafts=engine.proposer.num_speculative_tokens if engine.proposer else 0,
        )
        if hasattr(engine.proposer, "cache"):  # a draft model: its one-token steps too
            proposer = engine.proposer
            args = proposer.model, proposer.cache, 4, engine.max_model_len
            proposer.graphs = CUDAGraphDecoder(*args, capture=False)
    return llm


def replays_of(llm: LLM) -> list[int]:
    "The token counts of the batches the graphs serve, from now on."
    graphs, replays = llm.engine.runner.graphs, []
    run = graphs.run
    graphs.run = lambda batch: replays.append(len(batch.input_ids)) or run(batch)
    return replays


def test_engine_decodes_through_graphs_and_equals_transformers(random_llama):
    path, hf = random_llama
    llm = graph_llm(path)
    replays = replays_of(llm)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(100, 5000, (n,), generator=g).tolist() for n in (5, 17, 31, 2, 40, 9)]
    outs = llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 12) for p in prompts]
    assert {4, 2} <= set(replays), (
        "decode steps of batch 4 and, at the end, 2 (padded) went through the graphs"
    )
    assert llm.engine.block_manager.num_free_blocks == 64


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_verification_through_graphs_of_its_own(random_llama, method, tmp_path):
    """The bug the 2026-12-04 H200 run found: a verification batch (each sequence's token and its
    drafts) has logits at every token, as a decode batch does, and went to the decode graphs,
    which gave every token its sequence's whole context (drafts saw later drafts) or failed on the
    shapes. Verification now has graphs of its own (up to 1 + k tokens a sequence, each
    sequence's count read on the device), and the tokens equal transformers'."""
    path, hf = random_llama
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    if method == "draft":  # the target's first layer drafts; its own steps replay graphs too
        spec = {"model": str(truncated_model_dir(path, tmp_path, 1)), "num_speculative_tokens": 3}
    llm = graph_llm(path, speculative_config=spec)
    graphs, served = llm.engine.runner.graphs, []
    run = graphs.run
    graphs.run = lambda b: served.append(max(b.metadata.query_lens)) or run(b)
    drafted, proposer = [], llm.engine.proposer
    if method == "draft":  # the draft model's one-token steps
        draft_run = proposer.graphs.run
        proposer.graphs.run = lambda b: drafted.append(len(b.input_ids)) or draft_run(b)
    prompts = [[(j % (3 + i)) + 20 * i + 40 for j in range(12 + 5 * i)] for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate(prompts + prompts[:3], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 16) for p in prompts + prompts[:3]]
    assert llm.engine.scheduler.num_accepted_tokens > 0  # drafts were verified, and kept
    assert max(served) > 1, "verifications replayed"  # (and, with n-gram, decode steps)
    assert method == "ngram" or drafted, "the draft's steps went through its graphs"
    assert llm.engine.block_manager.num_free_blocks == 64


def family_through_graphs(tmp_path, shape, lengths, max_tokens, setup=lambda llm: None):
    """A random-weight model of `shape` through the graphs, prompts of `lengths`: the engine (after
    `setup`), its outputs and the batches the graphs served; the tokens equal transformers'."""
    path = random_model_dir(tmp_path, shape, seed=1)
    hf = load_hf_model(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 512) for _ in range(n)] for n in lengths]
    llm = graph_llm(path)
    setup(llm)
    graphs, served = llm.engine.runner.graphs, []
    run = graphs.run
    graphs.run = lambda batch: served.append(batch) or run(batch)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, max_tokens) for p in prompts]
    assert served, "decode steps went through the graphs"
    return llm, served


@pytest.mark.parametrize("family", ["gemma3", "smollm3"])
def test_sliding_windows_and_rope_free_layers_through_graphs(family, tmp_path):
    """Gemma 3's five sliding-window layers to one global (two KV cache groups, each with its own
    static block tables in the graphs) and SmolLM3's layers without RoPE: decode steps through the
    graphs give transformers' tokens, prompts and outputs running far past the window."""
    shape = {"gemma3": GEMMA3, "smollm3": SMOLLM3}[family]
    llm, served = family_through_graphs(tmp_path, shape, (3, 9, 30, 17), 16)
    groups = len(llm.engine.runner.kv_config.groups)
    assert {len(b.group_metadata) for b in served} == {groups - 1}, "all its groups, replayed"
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_recurrent_states_through_graphs(tmp_path):
    """Qwen3.5's Gated DeltaNet layers under the graphs: each row's state slot and freshness from
    static buffers, padding rows on the scratch slot, the new states committed after the step;
    a one-token prompt (its first step a decode-shaped batch that starts from nothing) included.
    Six prompts through four rows: sequences finish and others take their slots."""
    llm, served = family_through_graphs(tmp_path, QWEN3_5, (1, 9, 30, 4, 17, 2), 12)
    assert max(len(b.input_ids) for b in served) == 4
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and len(bm.free_slots) == bm.num_slots


def test_experts_through_graphs(tmp_path):
    """Qwen3-MoE's mixtures through the fused Triton kernels (the interpreter here) under the
    graphs: the experts aligned on the device, the grid sized for any routing, so one graph serves
    every step; greedy-equal to transformers."""

    def fused(llm):  # what a GPU runs
        for block in llm.engine.model.modules():
            if isinstance(block, SparseMoeBlock):
                block.impl = "triton"

    llm, _ = family_through_graphs(tmp_path, QWEN3_MOE, (3, 20, 9), 10, fused)
    assert sum(isinstance(m, SparseMoeBlock) for m in llm.engine.model.modules()) == 2


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_one_byte_kv_through_graphs(random_llama, kv_cache_dtype):
    """Chapter 13's one-byte KV pool under the graphs: rows quantized and stored with their scales
    by the step, dequantized in the kernels; the tokens equal the same pool's run eagerly."""
    path, _ = random_llama
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 5000, (n,), generator=g).tolist() for n in (5, 17, 31, 2)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    kw = dict(kv_cache_dtype=kv_cache_dtype)
    eager = LLM(
        str(path),
        attention_backend="triton",
        enforce_eager=True,
        num_kv_blocks=64,
        dtype="float32",
        **kw,
    )
    want = [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    llm = graph_llm(path, **kw)
    served = replays_of(llm)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want
    assert served and llm.engine.runner.attention_backend == "triton"
