import pytest, torch
from minillm.loader import resolve_model_path, load_tokenizer, load_hf_model, eos_token_ids

@pytest.fixture(scope="session")
def model_dir(): return resolve_model_path()

@pytest.fixture(scope="session")
def tokenizer(model_dir): return load_tokenizer(model_dir)

@pytest.fixture(scope="session")
def hf_model(model_dir): return load_hf_model(model_dir, dtype=torch.float32)

@pytest.fixture(scope="session")
def eos_ids(model_dir, tokenizer): return eos_token_ids(model_dir, tokenizer)
