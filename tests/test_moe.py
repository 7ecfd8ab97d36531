"""Chapter 16: mixture-of-experts models against transformers (Qwen3-MoE renormalized or not, with a
dense layer, and Mixtral) through chunked prefill, prefix caching, preemption and speculation; the
three ways of running experts against transformers' block; the experts split over two ranks."""

import random

import pytest
import torch
from helpers import TINY_DECODER, hf_greedy, minillm_serve, openai_client

from minillm.bench.random_models import random_model_dir
from minillm.llm import LLM
from minillm.loader import ModelLoadError, load_hf_model
from minillm.models.decoder import config_from_hf
from minillm.models.moe import SparseMoeBlock, experts_grouped, experts_loop
from minillm.moe.routing import route
from minillm.sampling import SamplingParams

QWEN3_MOE = TINY_DECODER | dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[1],  # a dense layer between two mixtures
    num_hidden_layers=3,
    num_key_value_heads=2,
    head_dim=16,
)
MIXTRAL = TINY_DECODER | dict(
    architectures=["MixtralForCausalLM"],
    model_type="mixtral",
    intermediate_size=32,
    num_local_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_key_value_heads=2,
)
FAMILIES = {
    "qwen3_moe": QWEN3_MOE,
    "qwen3_moe_unnormalized": QWEN3_MOE | {"norm_topk_prob": False},
    "mixtral": MIXTRAL,
}
MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def build(tmp_path_factory, name):
    path = random_model_dir(tmp_path_factory.mktemp(name), FAMILIES[name], seed=1)
    rng = random.Random(0)
    shared = [rng.randrange(2, 512) for _ in range(20)]
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randrange(3, 60))] for _ in range(5)]
    prompts += [shared + [rng.randrange(2, 512) for _ in range(n)] for n in (3, 11)]
    hf = load_hf_model(path)
    return path, prompts, [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return build(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return build(tmp_path_factory, "qwen3_moe")


def check(llm, prompts, refs, params=GREEDY):
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests


def test_greedy_equals_transformers(family):
    "Chunks of 16 tokens, blocks of 4, a second round through the prefix cache."
    path, prompts, refs = family
    llm = LLM(str(path), attention_backend="torch", max_num_batched_tokens=16, block_size=4)
    check(llm, prompts, refs)
    check(llm, prompts, refs)
    assert llm.engine.block_manager.hits > 0


def test_cpu_backend(qwen):
    "Chapter 8a's attention kernel and 13b's packed weights (the router among them)."
    path, prompts, refs = qwen
    check(LLM(str(path), attention_backend="cpu", max_num_batched_tokens=16), prompts, refs)


def test_preemption(family):
    path, prompts, refs = family
    llm = LLM(str(path), num_kv_blocks=40, block_size=4, max_num_batched_tokens=16)
    check(llm, prompts, refs)
    assert llm.engine.scheduler.num_preemptions > 0


def test_speculation(qwen):
    "Draft tokens verified through the experts (several rows a sequence) give the same tokens."
    path, prompts, refs = qwen
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    llm = LLM(str(path), speculative_config=spec)
    repeats = [p * 3 for p in prompts[:3]]  # prompt lookup finds drafts in repeated text
    hf = load_hf_model(path)
    outs = llm.generate(repeats, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, MAX_TOKENS) for p in repeats]
    assert sum(o.num_accepted_tokens for o in outs) > 0


def test_served_through_the_openai_client(qwen, tmp_path):
    """`minillm serve` on the MoE directory: a greedy completion equal to transformers', and a
    structured output (a choice of one-token words: the test tokenizer has no spaces inside words)
    obeyed."""
    path, prompts, refs = qwen
    with minillm_serve(path, tmp_path / "serve.log") as (base, _):
        client = openai_client(base)
        name = client.models.list().data[0].id
        r = client.completions.create(
            model=name, prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0
        )
        ids = [int(word[1:]) for word in r.choices[0].text.split()]  # the words are t<id>
        assert ids == refs[0]
        r = client.completions.create(
            model=name,
            prompt=prompts[1],
            max_tokens=4,
            temperature=0,
            extra_body={"guided_choice": ["t7", "t9"]},
        )
        assert r.choices[0].text.strip() in ("t7", "t9")


def test_fused_kernel_in_the_engine(qwen):
    "Every mixture through the Triton kernels (the interpreter here), two prompts."
    path, prompts, refs = qwen
    llm = LLM(str(path), max_num_batched_tokens=16, block_size=4)
    blocks = [m for m in llm.engine.model.modules() if isinstance(m, SparseMoeBlock)]
    for block in blocks:
        block.impl = "triton"
    check(llm, prompts[:2], refs[:2])
    assert len(blocks) == 2


@pytest.mark.parametrize("first, held", [(0, 8), (2, 3)])
def test_three_ways_against_transformers_block(first, held):
    "Loop, grouped and fused against transformers' Qwen3-MoE block; a shard adds only its experts."
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from minillm.moe.triton_moe import fused_moe

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        hidden_size=32, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3
    )
    block = Qwen3MoeSparseMoeBlock(cfg)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(37, 32)
    with torch.no_grad():
        weights, experts = route(x @ block.gate.weight.T, 3, False)
        held_ids = range(first, first + held)
        mask = sum(experts == e for e in held_ids).bool()  # the choices this shard runs
        w13 = block.experts.gate_up_proj[first : first + held].contiguous()
        w2 = block.experts.down_proj[first : first + held].contiguous()
        want = block.experts(x, experts.masked_fill(~mask, cfg.num_experts), weights)
        for run in (experts_loop, experts_grouped, fused_moe):
            assert torch.allclose(run(x, w13, w2, weights, experts, first), want, atol=1e-5), run


def test_fused_kernel_in_bfloat16():
    "The model's dtype in, float32 accumulation inside: close to the loop in bfloat16."
    from minillm.moe.triton_moe import fused_moe

    torch.manual_seed(0)
    x = torch.randn(19, 64).bfloat16()
    w13, w2 = (torch.randn(6, 96, 64) * 0.1).bfloat16(), (torch.randn(6, 64, 48) * 0.1).bfloat16()
    weights, experts = route(torch.randn(19, 6), 2, True)
    want = experts_loop(x.float(), w13.float(), w2.float(), weights, experts)
    got = fused_moe(x, w13, w2, weights, experts)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, atol=3e-2, rtol=3e-2)


def test_expert_parallel_two_ranks(qwen):
    "The experts split over two gloo ranks (the dense layer split as chapter 11 splits it)."
    path, prompts, refs = qwen
    with LLM(str(path), tensor_parallel_size=2, max_num_batched_tokens=16, block_size=4) as llm:
        check(llm, prompts[-4:], refs[-4:])


def test_checkpoint_tensors_keep_the_ranks_experts(qwen):
    from dataclasses import replace

    from minillm.loader import load_state_dict, read_config
    from minillm.models.moe import Qwen3MoeForCausalLM

    path = qwen[0]
    cfg = replace(config_from_hf(read_config(path)), expert_shard=(1, 4))
    state = load_state_dict(path, "cpu")
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    stacked = model.checkpoint_tensors(state)["model.layers.0.mlp.experts.gate_up_proj"]
    want = [
        state[f"model.layers.0.mlp.experts.{e}.{p}.weight"]
        for e in (2, 3)
        for p in ("gate_proj", "up_proj")
    ]
    assert torch.equal(stacked.flatten(0, 1), torch.cat(want))


def test_refused_by_name(qwen):
    "What this chapter has not built says so."
    with pytest.raises(ValueError, match="have no mlp.gate_up_proj to quantize"):
        LLM(str(qwen[0]), quantization="int8")
    with pytest.raises(ModelLoadError, match="sliding_window=4096 is not supported"):
        config_from_hf(MIXTRAL | {"sliding_window": 4096})
    with pytest.raises(ValueError, match="possible sizes"):
        LLM(str(qwen[0]), tensor_parallel_size=3)
