"""Chapter 15b: Qwen3.5's Gated DeltaNet layers against transformers: the rule alone, and the whole
model's greedy tokens through every attention backend, prompt chunks, batched decodes and
preemption; the state slots given back; what recurrent states cannot do, refused by name."""

import logging
import random
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_DECODER, hf_greedy

from minillm.attention.paged import TORCH_ATTENTION
from minillm.bench.random_models import random_model_dir
from minillm.core.block_manager import Sequence
from minillm.core.state_cache import StateSlotManager, check_state_model
from minillm.engine.config import EngineConfig
from minillm.engine.model_runner import profile_run
from minillm.llm import LLM
from minillm.loader import load_hf_model
from minillm.models.decoder import load_model
from minillm.models.gated_delta import chunked_gated_delta, l2norm, recurrent_gated_delta
from minillm.sampling import SamplingParams

QWEN3_5 = TINY_DECODER | dict(
    architectures=["Qwen3_5ForCausalLM"],
    model_type="qwen3_5_text",
    intermediate_size=128,
    num_hidden_layers=8,  # layers 4 and 8 full attention, the rest Gated DeltaNet
    num_key_value_heads=2,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,  # each key head serves two value heads
    linear_num_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
)
MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    "(directory, prompts, transformers' greedy tokens) of a random-weight Qwen3.5."
    path = random_model_dir(tmp_path_factory.mktemp("qwen3_5"), QWEN3_5, seed=1)
    with torch.no_grad():  # norms away from their initial zeros (1 + w), so they are tested
        hf = load_hf_model(path)
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        hf.save_pretrained(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randrange(1, 70))] for _ in range(8)]
    hf = load_hf_model(path)
    return path, prompts, [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


def check(llm, prompts, refs):
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and len(bm.free_slots) == bm.num_slots
    assert not llm.engine.requests


@pytest.mark.parametrize("chunk", [16, 512])
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_greedy_equals_transformers(qwen, backend, chunk):
    "Prompts in chunks of 16 (each continuing the states the last left) or whole, decodes batched."
    path, prompts, refs = qwen
    llm = LLM(str(path), attention_backend=backend, max_num_batched_tokens=chunk, block_size=4)
    check(llm, prompts, refs)


def test_triton_attention_layers(qwen):
    "The attention layers through the Triton kernels (the interpreter here), three prompts."
    path, prompts, refs = qwen
    llm = LLM(str(path), attention_backend="triton", max_num_batched_tokens=16, block_size=4)
    check(llm, prompts[:3], refs[:3])


def test_preemption_starts_states_again(qwen):
    path, prompts, refs = qwen
    llm = LLM(str(path), num_kv_blocks=40, block_size=4, max_num_batched_tokens=16)
    check(llm, prompts, refs)
    assert llm.engine.scheduler.num_preemptions > 0


def test_fewer_slots_than_requests(qwen):
    "Four slots for eight requests: the rest wait for a slot; nothing is mixed up."
    path, prompts, refs = qwen
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=16, block_size=4)
    assert llm.engine.block_manager.num_slots == 4
    check(llm, prompts, refs)


def test_bfloat16_runs_close_to_float32(qwen):
    "The model's dtype for the projections and the convolution; the rule's state stays float32."
    path, prompts, refs = qwen
    llm = LLM(str(path), dtype="bfloat16", max_num_batched_tokens=16, block_size=4)
    assert llm.engine.runner.states.rule.dtype == torch.float32
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    first = [o.outputs[0].token_ids[0] for o in outs]
    assert sum(a == r[0] for a, r in zip(first, refs)) >= 6  # a random model's near ties aside


def test_recurrent_states_refuse_by_name(qwen, caplog):
    path = str(qwen[0])
    with pytest.raises(ValueError, match="speculative_config: Qwen3_5ForCausalLM keeps recurrent"):
        LLM(path, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    mixed = SimpleNamespace(architecture="Mixed", sliding_windows=[8, None])
    with pytest.raises(ValueError, match="sliding windows .* and recurrent states"):
        check_state_model(EngineConfig(), mixed)
    with pytest.raises(ValueError, match="kv_role: Qwen3_5ForCausalLM keeps recurrent"):
        LLM(path, kv_role="producer", kv_transfer_address="127.0.0.1:1")
    with pytest.raises(ValueError, match="tensor parallelism splits chapter 2's Llama family"):
        LLM(path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="have no self_attn.qkv_proj to quantize"):
        LLM(path, quantization="int8")
    with pytest.raises(ValueError, match="slots of recurrent states take .* lower max_num_seqs"):
        LLM(path, kv_cache_memory_gb=0.001)
    with caplog.at_level(logging.INFO, logger="minillm"):
        llm = LLM(path)
    assert "prefix caching is off" in caplog.text
    assert llm.engine.config.enable_prefix_caching is False


def test_profile_run_gives_the_recurrent_layers_states(qwen):
    "The memory profile (run on CUDA before sizing the pool) drives the linear layers too."
    model = load_model(qwen[0])
    pool_bytes = profile_run(model, TORCH_ATTENTION, 64, 40, 4, 16)
    kv_bytes = 2 * 2 * 2 * 16 * 32 * 4  # 2 attention layers, K and V, 2 heads of 32, float32
    assert pool_bytes > kv_bytes * 64 // 16  # the KV blocks and the states


def test_kv_cache_config_gives_each_sequence_a_state_slot(qwen):
    """The recurrent layers' share of the KV cache: a slot of states per sequence, in the graph
    buffers too; the runner says by name why its decode steps are not captured."""
    llm = LLM(str(qwen[0]), num_kv_blocks=16, block_size=4)
    kv = llm.engine.runner.kv_config
    assert not kv.hybrid and kv.state_layers == 6 and kv.state_bytes > 0
    assert kv.block_bytes == 4 * 2 * 2 * 2 * 32 * 4  # 2 attention layers, K and V, 2 heads of 32
    inputs = kv.graph_inputs(8, 30, "cpu")
    assert [t.shape for t in inputs.block_tables] == [(8, 8)] and inputs.state_slots.shape == (8,)
    assert "the cpu attention backend" in llm.engine.runner.graphs_refused()  # graphs: triton's


@pytest.mark.parametrize("chunk", [64, 5])
def test_rule_against_transformers(chunk):
    "Both forms of the rule against transformers' references, from a state, keys shared by heads."
    from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

    torch.manual_seed(0)
    n, hk, hv, dk, dv = 70, 2, 4, 8, 6
    q, k = torch.randn(1, n, hk, dk), torch.randn(1, n, hk, dk)
    v, g, beta = torch.randn(1, n, hv, dv), -torch.rand(1, n, hv), torch.rand(1, n, hv)
    s0 = torch.randn(1, hv, dk, dv)
    args = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = ref.torch_chunk_gated_delta_rule(q, k, v, g, beta, **args)
    qs = (l2norm(q) / dk**0.5).repeat_interleave(2, 2)[0].transpose(0, 1)
    ks = l2norm(k).repeat_interleave(2, 2)[0].transpose(0, 1)
    x = [qs, ks, v[0].transpose(0, 1), g[0].T, beta[0].T]
    out, state = chunked_gated_delta(*x, s0[0], chunk_size=chunk)
    assert torch.allclose(out.transpose(0, 1), want[0], atol=1e-5)
    assert torch.allclose(state, want_state[0], atol=1e-5)
    state, outs = s0.clone(), []
    for t in range(n):
        outs.append(recurrent_gated_delta(*[y[None, :, t] for y in x], state))
    assert torch.allclose(torch.stack(outs, 2)[0], out, atol=1e-5)


def test_slot_manager_random_walk():
    "Random allocations and frees: a slot has one holder at a time, and all come back."
    rng = random.Random(0)
    bm = StateSlotManager(num_blocks=64, block_size=4, num_slots=5)
    live = []
    for step in range(2000):
        if live and (rng.random() < 0.4 or len(live) == 5):
            bm.free(live.pop(rng.randrange(len(live))))
        else:
            seq = Sequence(step, [1] * rng.randint(1, 20))
            n = rng.randint(1, len(seq))
            if bm.can_allocate(seq, n):
                bm.allocate(seq, n)
                live.append(seq)
        held = [s.state_slot for s in live]
        assert len(set(held)) == len(held) and None not in held
        assert sorted(held + bm.free_slots) == list(range(5))
    for seq in live:
        bm.free(seq)
    assert len(bm.free_slots) == 5 and bm.num_free_blocks == bm.num_blocks
    with pytest.raises(RuntimeError, match="out of state slots"):
        held = [Sequence(i, [1]) for i in range(6)]
        for seq in held:
            bm.allocate(seq, 1)


def test_a_step_that_fails_late_leaves_the_states(qwen):
    """A step that fails after its forward pass (as sampling might) is run again request by
    request; the states it had computed were never written, so the others' tokens stay exact."""
    path, prompts, refs = qwen
    # a token id in no other request, that makes a step raise once its forward pass has run
    poison = next(t for t in range(2, 512) if all(t not in p + r for p, r in zip(prompts, refs)))
    llm = LLM(str(path), max_num_batched_tokens=16, block_size=4)
    runner = llm.engine.runner
    forward = runner.forward

    def fails_late(batch):
        logits = forward(batch)
        if (batch.input_ids == poison).any():
            raise RuntimeError("poisoned step")
        return logits

    runner.forward = fails_late
    bad = [5] * 30 + [poison, 9]  # poisoned in a later chunk, beside sequences well under way
    outs = llm.generate(prompts[:4] + [bad], GREEDY, use_tqdm=False)
    assert outs[-1].finish_reason == "error" and "poisoned step" in outs[-1].error
    assert [o.outputs[0].token_ids for o in outs[:4]] == refs[:4]
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and len(bm.free_slots) == bm.num_slots


def test_states_are_written_only_by_commit():
    """A step's conv and rule states wait in `pending`: nothing in the pool moves until `commit`
    (which the runner calls once the step has sampled), then exactly the step's slots move."""
    from minillm.attention.input_batch import build_flat_batch
    from minillm.core.state_cache import StatePool
    from minillm.models.qwen3_5 import Qwen3_5Config

    cfg = Qwen3_5Config.from_hf(QWEN3_5)
    pool = StatePool(cfg, 3, torch.float32, "cpu")
    torch.manual_seed(0)
    pool.rule.normal_(), pool.conv.normal_()
    seqs = [
        Sequence(0, list(range(2, 12)), num_computed_tokens=6, block_table=[0, 1, 2], state_slot=2),
        Sequence(1, [3, 4, 5], num_computed_tokens=2, block_table=[3], state_slot=0),
    ]
    batch = pool.batch(build_flat_batch(seqs, [4, 1], 4))  # a prompt chunk and a decode
    rule, conv = pool.rule.clone(), pool.conv.clone()
    hv, dk, dv, T = 4, 16, 16, 5
    batch.conv(0, torch.randn(T, cfg.conv_dim), torch.randn(cfg.conv_dim, cfg.conv_kernel))
    q, k = l2norm(torch.randn(T, hv, dk)), l2norm(torch.randn(T, hv, dk))
    batch.delta_rule(0, q, k, torch.randn(T, hv, dv), -torch.rand(T, hv), torch.rand(T, hv))
    assert torch.equal(pool.rule, rule) and torch.equal(pool.conv, conv)
    pool.commit()
    for slot in (0, 2):
        assert not torch.equal(pool.rule[0, slot], rule[0, slot])
        assert not torch.equal(pool.conv[0, slot], conv[0, slot])
    assert torch.equal(pool.rule[0, 1], rule[0, 1]) and torch.equal(pool.rule[1:], rule[1:])
    assert not pool.pending
