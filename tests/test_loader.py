"Loading: the default model, local directories, and clear errors for bad input."

import json
import shutil

import pytest

from minillm.loader import (
    SUPPORTED_ARCHITECTURES,
    ModelLoadError,
    load_state_dict,
    read_config,
    resolve_model_path,
)


def test_default_model_is_a_cached_hf_directory(model_dir):
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in model_dir.iterdir()
    }
    assert resolve_model_path(model_dir) == model_dir  # a local directory loads as itself
    assert "quantization_config" not in read_config(model_dir)


def test_missing_path():
    with pytest.raises(ModelLoadError, match="does not exist.*Hugging Face model directory"):
        resolve_model_path("/no/such/model")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        resolve_model_path(tmp_path / "model.bin")


def test_corrupt_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="Cannot read GGUF"):
        resolve_model_path(tmp_path / "bad.gguf")
    assert not any(
        (tmp_path / "cache").glob("*/config.json")
    )  # nothing half-converted is left as a model


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        ModelLoadError, match="GPT2LMHeadModel.*not supported.*" + SUPPORTED_ARCHITECTURES[0]
    ):
        resolve_model_path(tmp_path)


def test_directory_without_config_or_weights(tmp_path, model_dir):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_path(tmp_path)
    shutil.copy(model_dir / "config.json", tmp_path)
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        resolve_model_path(tmp_path)


def test_corrupt_config_and_weights(tmp_path, model_dir):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        resolve_model_path(tmp_path)
    shutil.copy(model_dir / "config.json", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{broken}")
    with pytest.raises(ModelLoadError, match="Corrupt weights"):
        load_state_dict(tmp_path)
