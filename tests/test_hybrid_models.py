"""Chapter 15's models against transformers' greedy generate: Gemma 3 (sliding-window and global
layers, on random weights and on the real file) and SmolLM3 (layers without RoPE), through every
attention backend, chunked prefill, prefix caching and preemption."""

import random

import pytest
import torch
from helpers import TINY_DECODER, hf_greedy, minillm_serve, openai_client

from minillm.bench.random_models import random_model_dir
from minillm.core.kv_cache_config import KVCacheConfig
from minillm.llm import LLM
from minillm.loader import ModelLoadError, gemma_gguf_path, load_hf_model, read_config
from minillm.models.decoder import config_from_hf
from minillm.sampling import SamplingParams

WINDOW = 8  # small, so that prompts and outputs run far past it
GEMMA3 = TINY_DECODER | dict(
    architectures=["Gemma3ForCausalLM"],
    model_type="gemma3_text",
    intermediate_size=128,
    num_hidden_layers=6,  # five sliding-window layers, then a global one
    num_key_value_heads=1,
    head_dim=32,
    query_pre_attn_scalar=32,
    sliding_window=WINDOW,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
)
SMOLLM3 = TINY_DECODER | dict(
    architectures=["SmolLM3ForCausalLM"],
    model_type="smollm3",
    intermediate_size=128,
    num_hidden_layers=8,  # layers 4 and 8 without RoPE
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=5e6,
    pad_token_id=0,
)
MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def random_model(tmp_path_factory, name, shape):
    "(directory, prompts, transformers' greedy tokens) of a random-weight model."
    path = random_model_dir(tmp_path_factory.mktemp(name), shape, seed=1)
    rng = random.Random(0)
    # a shared prefix (prefix caching), prompts shorter and far longer than the window
    shared = [rng.randrange(2, 512) for _ in range(20)]
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randrange(3, 60))] for _ in range(5)]
    prompts += [shared + [rng.randrange(2, 512) for _ in range(n)] for n in (3, 11, 30)]
    hf = load_hf_model(path)
    return path, prompts, [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return random_model(tmp_path_factory, "gemma3", GEMMA3)


@pytest.fixture(scope="module", params=["gemma3", "smollm3"])
def model(request, tmp_path_factory, gemma3):
    return (
        gemma3 if request.param == "gemma3" else random_model(tmp_path_factory, "smollm3", SMOLLM3)
    )


def check(llm, prompts, references):
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == references
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not llm.engine.requests  # nothing leaks


def chunks_and_prefix_cache(model, backend, keep=slice(None)):
    """Prompt chunks of 16 tokens, blocks of 4, a second round that hits the prefix cache; `keep`:
    the prompts to run (the interpreter's kernels are slow)."""
    path, prompts, refs = model
    prompts, refs = prompts[keep], refs[keep]
    llm = LLM(str(path), attention_backend=backend, max_num_batched_tokens=16, block_size=4)
    check(llm, prompts, refs)
    check(llm, prompts[-2:], refs[-2:])
    assert llm.engine.block_manager.hits > 0


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_backends_chunks_and_prefix_cache(model, backend):
    chunks_and_prefix_cache(model, backend)


def test_triton_windows(gemma3):
    "The triton kernels' windows (in the interpreter here); SmolLM3's NoPE does not reach them."
    chunks_and_prefix_cache(gemma3, "triton", keep=slice(5, None))  # the three with a shared prefix


def test_preemption(model):
    path, prompts, refs = model
    llm = LLM(str(path), num_kv_blocks=72, block_size=4, max_num_batched_tokens=20)
    check(llm, prompts, refs)
    assert llm.engine.scheduler.num_preemptions > 0


def test_unsupported_variants_are_refused():
    "Gemma 2's attention softcapping and scaled RoPE are named, not silently computed wrong."
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping"):
        config_from_hf(GEMMA3 | {"attn_logit_softcapping": 50.0})
    with pytest.raises(ModelLoadError, match="activation 'relu'"):
        config_from_hf(GEMMA3 | {"hidden_activation": "relu"})
    scaled = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    rope = GEMMA3["rope_parameters"] | {"full_attention": scaled}
    with pytest.raises(ModelLoadError, match="RoPE"):
        config_from_hf(GEMMA3 | {"rope_parameters": rope})


def test_gemma3_270m_file_equals_transformers():
    "The real model (Q4_K_M, dequantized to float32), the chapter's prompts."
    llm = LLM("gemma-3-270m", dtype="float32")
    tok = llm.tokenizer
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a village,"]
    ids = [tok(p).input_ids for p in prompts]
    hf = load_hf_model(llm.engine.model_path)
    assert read_config(llm.engine.model_path)["architectures"] == ["Gemma3ForCausalLM"]
    refs = [hf_greedy(hf, p, 16) for p in ids]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == refs
    assert outs[0].outputs[0].text.startswith(" the capital of the country of France")


def test_windows_give_blocks_back(gemma3):
    """A prompt far past the window: the sliding groups hold only the blocks of their window while
    it decodes, the full group every block, and the tokens stay transformers'."""
    from minillm.core.hybrid_kv_cache import NULL_BLOCK

    path, prompts, refs = gemma3
    llm = LLM(str(path), block_size=4, max_num_batched_tokens=16)
    engine, prompt = llm.engine, prompts[1] + prompts[2] + prompts[3]
    hf = load_hf_model(path)
    ref = hf_greedy(hf, prompt, MAX_TOKENS)
    req = engine.add_request(prompt, GREEDY)
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.token_ids if out.finished else tokens
        if req.num_computed_tokens > WINDOW + 8 and not req.finished:
            full, *sliding = [req.block_table, *req.group_tables]
            assert NULL_BLOCK not in full and len(sliding) == 5  # five groups of one layer
            # at most the window's blocks and a chunk's (16 tokens) while the prompt runs; the
            # window's and the one being filled while it decodes
            decoding = req.num_computed_tokens >= len(prompt)
            most = WINDOW // 4 + 2 if decoding else (WINDOW - 1 + 16) // 4 + 2
            for table in sliding:
                live = [b for b in table if b != NULL_BLOCK]
                assert table[: len(table) - len(live)] == [NULL_BLOCK] * (len(table) - len(live))
                assert len(live) <= most
    assert tokens == ref and len(prompt) > 3 * WINDOW


def test_minillm_serve_answers_on_the_gemma3_file(tmp_path):
    """`minillm serve --model gemma-3-270m` through the official client: a greedy completion, and
    a chat request refused by name (the base model's file carries no chat template)."""
    import openai

    with minillm_serve("gemma-3-270m", tmp_path / "serve.log") as (base, _):
        client = openai_client(base)
        name = client.models.list().data[0].id
        r = client.completions.create(
            model=name, prompt="The capital of France is", max_tokens=8, temperature=0
        )
        assert r.choices[0].text.startswith(" the capital of the country of France")
        with pytest.raises(openai.BadRequestError, match="chat template"):
            client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )


def test_features_written_for_one_group_refuse_by_name(gemma3):
    "What chapter 15 has not extended to KV cache groups says so, before it computes anything."
    path = str(gemma3[0])
    with pytest.raises(ValueError, match="tensor parallelism splits chapter 2's Llama family"):
        LLM(path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="one-byte pools"):
        LLM(path, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="KV transfer"):
        LLM(path, kv_role="producer", kv_transfer_address="127.0.0.1:1")
    with pytest.raises(ModelLoadError, match="quantization='gguf' builds chapter 2's Llama"):
        LLM(str(gemma_gguf_path()), quantization="gguf")


def test_kv_cache_config_groups_the_layers(gemma3):
    """Gemma 3's layers (five windowed, one global) in groups of one size, the global one first; a
    block's bytes are one group's; a graph gets a block table per group, so nothing keeps its
    decode steps from being captured (chapter 8c)."""
    kv = KVCacheConfig(config_from_hf(GEMMA3), 16, torch.float32)
    assert [g.sliding_window for g in kv.groups] == [None] + [WINDOW] * 5
    assert kv.hybrid and [g.layers for g in kv.groups] == [(5,), (0,), (1,), (2,), (3,), (4,)]
    assert kv.block_bytes == 16 * 2 * 1 * 32 * 4 and kv.state_bytes == 0  # 1 KV head of 32
    inputs = kv.graph_inputs(4, 100, "cpu")
    assert [t.shape for t in inputs.block_tables] == [(4, 7)] * 6 and inputs.state_slots is None
    runner = LLM(str(gemma3[0]), num_kv_blocks=32, attention_backend="triton").engine.runner
    assert runner.graphs_refused() is None


def test_configs_in_transformers_4_form():
    """Configs written before RoPE settings moved into `rope_parameters`: the bases come from the
    top level (and Gemma's `rope_local_base_freq`), SmolLM3's NoPE layers from their interval."""
    old_smol = {k: v for k, v in SMOLLM3.items()} | {"rope_theta": 5e6, "no_rope_layer_interval": 4}
    assert config_from_hf(old_smol).layer_rope_theta == (5e6, 5e6, 5e6, None) * 2
    old_gemma = {k: v for k, v in GEMMA3.items() if k != "rope_parameters"}
    old_gemma |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4}
    assert config_from_hf(old_gemma).layer_rope_theta == (1e4,) * 5 + (1e6,)
    assert config_from_hf(old_gemma).rope_theta == 1e6
    with pytest.raises(ModelLoadError, match="RoPE"):
        config_from_hf(old_gemma | {"rope_scaling": {"rope_type": "linear", "factor": 8.0}})


def test_a_hybrid_draft_model_is_refused(gemma3):
    path = str(gemma3[0])
    with pytest.raises(ValueError, match="a draft model is one of chapter 2's Llama family"):
        LLM(path, speculative_config={"model": path, "num_speculative_tokens": 2})
