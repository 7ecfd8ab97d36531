"minillm's own forward pass against transformers: logits and greedy generations."

import json

import pytest
import torch
from helpers import hf_greedy
from safetensors.torch import save_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from minillm.course.contiguous import ContiguousKVCache, cached_generate
from minillm.course.naive import collect
from minillm.loader import ModelLoadError, encode_chat
from minillm.models.decoder import causal_attention, load_model
from minillm.sampling import SamplingParams

SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False)),
    "llama-tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(tie_word_embeddings=True, num_key_value_heads=4),
    ),
    "llama3-rope": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            )
        ),
    ),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=False)),
}


def save_random_model(path, family, seed=0):
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    hf = model_cls(config_cls(**{**SMALL, **extra})).eval()
    with (
        torch.no_grad()
    ):  # random init leaves norms at 1 and biases at 0: perturb them so they are tested
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(path)
    return hf


def forward_logits(model, ids):
    return model.compute_logits(
        ContiguousKVCache(model.config, 1, len(ids)).forward(model, torch.tensor([ids]))[0]
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_models_match_transformers(tmp_path, family, tokenizer):
    hf = save_random_model(tmp_path, family)
    ours = load_model(tmp_path)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(ours, ids) - ref).abs().max() < 1e-4
    # greedy generation with the cache: prefill, then one token at a time
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ref_tokens = hf_greedy(hf, ids, 30)
    assert (
        collect(cached_generate(ours, tokenizer, ids, params)).token_ids == ref_tokens
    )  # any tokenizer decodes ids < 256


def test_default_model_logits(model_dir, hf_model, tokenizer):
    ours = load_model(model_dir)
    ids = encode_chat(
        tokenizer, [{"role": "user", "content": "Explain the KV cache in one sentence."}]
    )
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    assert (forward_logits(ours, ids) - ref).abs().max() < 1e-4


@pytest.mark.parametrize("prompt", ["The quick brown fox", "def fibonacci(n):", None])
def test_default_model_greedy_equals_transformers(model_dir, hf_model, tokenizer, eos_ids, prompt):
    ours = load_model(model_dir)
    ids = (
        tokenizer(prompt).input_ids
        if prompt
        else encode_chat(tokenizer, [{"role": "user", "content": "Name three colors."}])
    )
    out = collect(
        cached_generate(ours, tokenizer, ids, SamplingParams(temperature=0, max_tokens=24), eos_ids)
    )
    ref = hf_greedy(hf_model, ids, 24, eos_ids)
    assert out.token_ids == ref


def test_batched_cache_matches_single(model_dir):
    "Two sequences of equal length in one contiguous cache give each one's own logits."
    model = load_model(model_dir)
    a, b = list(range(100, 120)), list(range(300, 320))
    cache = ContiguousKVCache(model.config, 2, 24)
    both = model.compute_logits(cache.forward(model, torch.tensor([a, b]))[:, -1])
    nxt = both.argmax(-1)
    step = model.compute_logits(cache.forward(model, nxt[:, None])[:, -1])
    for row, ids in enumerate((a, b)):
        single = forward_logits(model, ids + [int(nxt[row])])
        assert (single[-2] - both[row]).abs().max() < 1e-4 and (
            single[-1] - step[row]
        ).abs().max() < 1e-4


def test_causal_attention_offset():
    q, k, v = torch.randn(1, 3, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    out = causal_attention(q, k, v, q_start=2)
    for i in range(3):  # query i sits at position 2 + i and sees keys 0..2+i
        kk, vv = k[0, : 3 + i].repeat_interleave(2, 1), v[0, : 3 + i].repeat_interleave(2, 1)
        w = torch.einsum("hd,lhd->hl", q[0, i], kk).div(8**0.5).softmax(-1)
        assert torch.allclose(out[0, i], torch.einsum("hl,lhd->hd", w, vv), atol=1e-5)


def test_mismatched_checkpoint_names_the_tensors(tmp_path):
    save_random_model(tmp_path, "llama")
    from safetensors.torch import load_file

    state = load_file(tmp_path / "model.safetensors")
    state.pop("model.layers.1.mlp.up_proj.weight")
    state["model.layers.0.extra.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"missing \['model.layers.1.mlp.gate_up_proj.weight'\].*extra.weight"
    ):
        load_model(tmp_path)


def test_wrong_shape_is_reported(tmp_path):
    save_random_model(tmp_path, "llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(tmp_path)
