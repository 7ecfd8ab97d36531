"The `minillm` command line."

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import minillm_serve

MINILLM = str(Path(sys.executable).parent / "minillm")


@pytest.mark.parametrize("cmd", ["serve", "generate", "chat", "bench offline"])
def test_help(cmd):
    out = subprocess.run(
        [MINILLM, *cmd.split(), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--max-num-seqs" in out and "--model" in out


def test_bench_modes():
    out = subprocess.run(
        [MINILLM, "bench", "online", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert all(f in out for f in ("--base-url", "--rates", "--ignore-eos", "--output", "--plot"))
    from minillm.cli import _default_bench_mode, parser

    for argv, mode in [
        (["bench"], "offline"),
        (["bench", "--num-requests", "4"], "offline"),
        (["bench", "online"], "online"),
    ]:
        args = parser().parse_args(_default_bench_mode(argv))
        assert args.mode == mode and args.num_requests == (4 if "4" in argv else 32)


def test_generate_streams_the_answer(model_dir):
    out = subprocess.run(
        [
            MINILLM,
            "generate",
            "What is the capital of France?",
            "--max-tokens",
            "24",
            "--model",
            str(model_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "Paris" in out


def test_chat_reads_turns_until_eof(model_dir):
    out = subprocess.run(
        [MINILLM, "chat", "--max-tokens", "16", "--model", str(model_dir)],
        input="What is the capital of France?\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "Paris" in out


def test_bad_model_path_is_a_clear_error():
    r = subprocess.run(
        [MINILLM, "generate", "hi", "--model", "/no/such/model"], capture_output=True, text=True
    )
    assert r.returncode != 0 and "does not exist" in r.stderr


def test_engine_flags_reach_the_engine_config():
    from minillm.cli import engine_kwargs, parser
    from minillm.engine.llm_engine import EngineConfig

    args = parser().parse_args(
        [
            "serve",
            "--attention-backend",
            "triton",
            "--enforce-eager",
            "--no-prefix-caching",
            "--block-size",
            "32",
            "--tensor-parallel-size",
            "2",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 2}',
            "--quantization",
            "int4",
            "--kv-cache-dtype",
            "fp8",
            "--no-async-scheduling",
        ]
    )
    cfg = EngineConfig(**engine_kwargs(args))
    assert cfg.async_scheduling is False
    assert (
        cfg.attention_backend,
        cfg.enforce_eager,
        cfg.enable_prefix_caching,
        cfg.block_size,
        cfg.tensor_parallel_size,
        cfg.speculative_config,
        cfg.quantization,
        cfg.kv_cache_dtype,
    ) == (
        "triton",
        True,
        False,
        32,
        2,
        {"method": "ngram", "num_speculative_tokens": 2},
        "int4",
        "fp8",
    )
    assert EngineConfig(**engine_kwargs(parser().parse_args(["serve"]))) == EngineConfig()


def test_speculative_config_must_be_a_json_object(capsys):
    from minillm.cli import parser

    for bad in ("ngram", "[1, 2]"):
        with pytest.raises(SystemExit):
            parser().parse_args(["serve", "--speculative-config", bad])
        assert "--speculative-config must be" in capsys.readouterr().err


def test_uvicorn_access_log_can_be_disabled(random_llama, tmp_path):
    "--disable-uvicorn-access-log (vLLM's flag): no line per request, which is there without it."
    lines = {}
    for flags in ([], ["--disable-uvicorn-access-log"]):
        log = tmp_path / f"serve{len(flags)}.log"
        with minillm_serve(random_llama[0], log, "--log-level", "info", *flags) as (base, _):
            assert httpx.get(f"{base}/v1/models").status_code == 200
        lines[bool(flags)] = [s for s in log.read_text().splitlines() if "GET /v1/models" in s]
    assert lines[False] and not lines[True], lines
