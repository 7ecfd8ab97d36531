"""Chapter 8d's panel matmul and one-call decoder: against F.linear, against the eager path, and the
engine through it against transformers' greedy generate for every family it serves."""

import pytest
import torch
import torch.nn.functional as F
from helpers import hf_greedy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import save_random_model

from minillm.bench.random_models import word_tokenizer
from minillm.kernels.cpu_decoder import CpuDecoder, PanelLinear, load_decoder_kernels
from minillm.llm import LLM
from minillm.sampling import SamplingParams


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    n_out=st.integers(1, 70),
    n_in=st.integers(1, 70),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_panel_linear_equals_f_linear(rows, n_out, n_in, bias, seed):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(n_out, n_in, generator=g), torch.randn(rows, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(b)
    torch.testing.assert_close(PanelLinear(lin)(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_each_row_is_computed_alone():
    "A row's result does not depend on the rows beside it: the batch cannot change a token."
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(200, 96)
    x = torch.randn(37, 200, generator=g)
    panel = PanelLinear(lin)
    together = panel(x)
    for i in (0, 7, 8, 36):
        assert torch.equal(panel(x[i : i + 1])[0], together[i])


def test_bad_input_is_refused_by_name():
    ops = load_decoder_kernels()
    with pytest.raises(RuntimeError, match="float32"):
        ops.pack_panels(torch.zeros(4, 4, dtype=torch.float64))
    panels = ops.pack_panels(torch.zeros(20, 8))
    with pytest.raises(RuntimeError, match=r"\[\.\.\., in\]"):
        ops.panel_linear(torch.zeros(2, 9), panels, 20)


@pytest.mark.parametrize("family", ["llama", "llama-tied", "llama3-rope", "qwen2", "qwen3"])
def test_engine_through_the_decoder_equals_transformers(tmp_path, family):
    """Greedy tokens equal transformers' with decode batches through the decoder, prompt chunks
    through the model, preemption (a pool too small for all) and prefix caching."""
    hf = save_random_model(tmp_path, family)
    word_tokenizer(256).save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(2, 256, (20,), generator=g).tolist()
    prompts = [shared + torch.randint(2, 256, (n,), generator=g).tolist() for n in (3, 30, 11, 50)]
    want = [hf_greedy(hf, p, 12) for p in prompts]
    llm = LLM(str(tmp_path), max_num_batched_tokens=32, num_kv_blocks=14, block_size=8)
    assert llm.engine.runner.decoder is not None
    calls = []
    forward = llm.engine.runner.decoder.forward
    llm.engine.runner.decoder.forward = lambda *a: calls.append(1) or forward(*a)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert calls and llm.engine.scheduler.num_preemptions > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_enforce_eager_and_other_dtypes_keep_the_eager_path(tmp_path):
    save_random_model(tmp_path, "llama")
    word_tokenizer(256).save_pretrained(tmp_path)
    assert LLM(str(tmp_path), enforce_eager=True).engine.runner.decoder is None
    assert LLM(str(tmp_path), dtype="bfloat16").engine.runner.decoder is None
    assert LLM(str(tmp_path), attention_backend="torch").engine.runner.decoder is None
    runner = LLM(str(tmp_path), kv_cache_dtype="int8").engine.runner
    assert isinstance(runner.decoder, CpuDecoder)  # built, but the int8 pool is not its
    assert not runner.decoder.can_run(_one_decode(runner), runner.cache)


def _one_decode(runner):
    from minillm.engine.block_manager import Sequence
    from minillm.engine.input_batch import build_flat_batch

    seq = Sequence(0, [5, 6, 7], block_table=[0])
    seq.num_computed_tokens = 2
    return build_flat_batch([seq], [1], runner.cache.block_size)
