import ctypes
import gc
import os
import sys

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test's fixture values are let go once it has run: pytest keeps every test's arguments
    (`item.funcargs`) for the whole session, so each module's engines, KV pools and servers stayed
    alive to the end of a worker's run, 7 GB a worker by the end of `make test` (two of them and
    their servers near a 24 GB machine's limit). A fixture's own scope still holds its value."""
    yield
    item.funcargs.clear()  # before teardown: the last test of a module lets its values go too


@pytest.fixture(scope="module", autouse=True)
def return_memory(request):
    """What a test module's engines, pools and models held goes back to the system when it ends
    (glibc keeps the heap pages of freed objects until asked). MINILLM_TEST_RSS=FILE: each
    module's resident memory after it, a line each. An engine freezes the heap it starts with
    (`freeze_gc_heap`): unfrozen here, so that what the module's engines held can be collected."""
    yield
    gc.unfreeze()
    gc.collect()
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    if os.environ.get("MINILLM_TEST_RSS"):
        rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
        with open(os.environ["MINILLM_TEST_RSS"], "a") as f:
            f.write(f"{request.module.__name__} {rss} MB\n")
