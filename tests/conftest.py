import os, pytest, torch
# Chapter 8's Triton kernels run on CPU tensors only in the interpreter; it must be chosen before triton is imported.
if not torch.cuda.is_available(): os.environ.setdefault("TRITON_INTERPRET", "1")
from minillm.loader import resolve_model_path, load_tokenizer, load_hf_model, eos_token_ids

@pytest.fixture(scope="session")
def model_dir(): return resolve_model_path()

@pytest.fixture(scope="session")
def tokenizer(model_dir): return load_tokenizer(model_dir)

@pytest.fixture(scope="session")
def hf_model(model_dir): return load_hf_model(model_dir, dtype=torch.float32)

@pytest.fixture(scope="session")
def eos_ids(model_dir, tokenizer): return eos_token_ids(model_dir, tokenizer)
