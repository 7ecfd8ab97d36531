import os

import pytest
import torch

# Triton kernels run on CPU tensors only in the interpreter, chosen before triton's import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from minillm.loader import eos_token_ids, load_hf_model, load_tokenizer, resolve_model_path


@pytest.fixture(scope="session", autouse=True)
def float32_by_default():
    """The correctness anchor is float32, and dtype "auto" picks bfloat16 on CPUs with native bf16
    (AVX512_BF16, AMX): without this, which tests compare bf16 with transformers' float32 would
    depend on the machine. Tests of bfloat16 ask for it by name."""
    from minillm.engine import config

    native = config.cpu_has_native_bf16
    config.cpu_has_native_bf16 = lambda: False
    yield
    config.cpu_has_native_bf16 = native


@pytest.fixture(scope="session")
def model_dir():
    return resolve_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    return load_hf_model(model_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def eos_ids(model_dir, tokenizer):
    return eos_token_ids(model_dir, tokenizer)


@pytest.fixture(scope="session")
def random_llama(tmp_path_factory):
    """A small randomly initialised Llama (GQA 4:2, head_dim 32) with a word-level tokenizer.

    It needs neither the default model nor a network, so the kernel and CUDA-graph tests also run
    on a bare GPU machine."""
    from minillm.bench.random_models import random_model_dir

    path = random_model_dir(
        tmp_path_factory.mktemp("random-llama"),
        "SmolLM2-135M",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
    )
    return path, load_hf_model(path, dtype=torch.float32)
