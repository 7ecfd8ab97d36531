"""Shared by the tests: transformers' greedy generation as the reference (chapter 7c's
`hf_greedy`), and chapter 1c's comparison that allows a divergence only where transformers' top
two logits nearly tie."""

import sys
from contextlib import contextmanager
from pathlib import Path

from minillm.bench.offline import hf_greedy  # noqa: F401
from minillm.bench.online import ServerProcess, free_port
from minillm.course.naive import greedy_divergence


def assert_equal_except_near_ties(outs, hf, prompts, steps: int | None = None) -> int:
    "Tokens equal transformers' up to a divergence at a near-tie (top two within 1e-4); counted."
    near_ties = 0
    for o, p in zip(outs, prompts):
        tokens = o.token_ids if steps is None else o.token_ids[:steps]
        near_ties += greedy_divergence(hf, p, tokens) is not None
    print(f"{near_ties} of {len(prompts)} sequences diverged at a near-tie")
    return near_ties


@contextmanager
def minillm_serve(model_dir, log: Path, *flags: str):
    """A real `minillm serve` process for `model_dir` on a free localhost port: yields its base URL
    and the process (stopped on exit). `flags`: more command-line options."""
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "minillm"), "serve", "--port", str(port)]
    cmd += ["--model", str(model_dir), "--log-level", "warning", *flags]
    if "--dtype" not in flags:  # the correctness anchor (see conftest's float32_by_default)
        cmd += ["--dtype", "float32"]
    base = f"http://127.0.0.1:{port}"
    with ServerProcess(cmd, f"{base}/v1", log=str(log)) as proc:
        yield base, proc


def openai_client(base: str, api_key: str = "none", timeout: float = 300):
    "The official client on a server's base URL, with no retries (a test sees every failure)."
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=timeout)


def ask(question: str) -> list[dict]:
    "One user message."
    return [{"role": "user", "content": question}]


# the fields every tiny random-weight decoder of chapters 15-16's tests shares
TINY_DECODER = dict(
    vocab_size=512,
    hidden_size=64,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
