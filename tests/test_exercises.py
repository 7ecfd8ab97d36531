"The exercises' checkers pass the answers and fail the classic wrong ones; make exercises works."

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.course.chapter import chapter_exercises, run_exercises

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [
    "1a",
    "1b",
    "1c",
    "2",
    "3",
    "4a",
    "4b",
    "5",
    "6",
    "7a",
    "7b",
    "7c",
    "8a",
    "8b",
    "8c",
    "9",
    "9b",
    "10",
    "11",
    "12",
    "12b",
    "13",
    "13b",
    "14",
    "15",
    "15b",
    "16",
    "17",
]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_answers_pass(chapter):
    import importlib

    answers = importlib.import_module(
        f"minillm.course.solutions.ch{chapter.zfill(3 if chapter[-1].isalpha() else 2)}"
    )
    for signature, checker in chapter_exercises(chapter).items():
        name = signature.split("(")[0]
        if hasattr(answers, name):
            checker(getattr(answers, name))


def test_the_package_answer_is_out_of_reach():
    """An answer that calls the package's own function fails while the checker runs, however it
    was imported; the function is back afterwards."""
    from minillm import sampling
    from minillm.sampling import apply_top_k_top_p

    def borrowed(logits, top_k, top_p):
        k = torch.where(top_k > 0, top_k, logits.shape[-1])
        return apply_top_k_top_p(logits, k, top_p)

    def borrowed_from_the_module(logits, top_k, top_p):
        k = torch.where(top_k > 0, top_k, logits.shape[-1])
        return sampling.apply_top_k_top_p(logits, k, top_p)

    checker = chapter_exercises("1b")["my_top_k_top_p(logits, top_k, top_p)"]
    for answer in (borrowed, borrowed_from_the_module):
        with pytest.raises(AssertionError, match="is the package's answer"):
            checker(answer)
    assert sampling.apply_top_k_top_p is apply_top_k_top_p  # back, in the module and the closure
    logits = torch.randn(2, 9)
    assert borrowed(logits, torch.tensor([0, 3]), torch.ones(2)).isfinite().sum() == 9 + 3


def _reject_first(p, d, g, keep_draft=False):
    "Rejection sampling that, on rejection, draws from p with the draft left in when `keep_draft`."
    for i, x in enumerate(d):
        if torch.rand((), generator=g) >= p[i, x]:
            rest = p[i].clone()
            if not keep_draft:
                rest[x] = 0
            return d[:i] + [int(torch.multinomial(rest, 1, generator=g))]
    return None


WRONG_REJECTION = {
    "every draft kept": lambda p, d, g: d + [int(torch.multinomial(p[len(d)], 1, generator=g))],
    "resampled with the draft in": lambda p, d, g: (
        _reject_first(p, d, g, keep_draft=True)
        or d + [int(torch.multinomial(p[len(d)], 1, generator=g))]
    ),
    "no bonus token": lambda p, d, g: _reject_first(p, d, g) or list(d),
    "bonus from the first row": lambda p, d, g: (
        _reject_first(p, d, g) or d + [int(torch.multinomial(p[0], 1, generator=g))]
    ),
}


@pytest.mark.parametrize("wrong", WRONG_REJECTION)
def test_wrong_rejection_samplers_fail(wrong):
    checker = chapter_exercises("12")["my_rejection_sample(probs, drafts, generator)"]
    with pytest.raises(AssertionError):
        checker(WRONG_REJECTION[wrong])


def test_make_exercises_writes_stubs_then_checks(tmp_path):
    path = tmp_path / "ch12.py"
    assert not run_exercises("12", path)  # writes the stubs
    assert "def my_rejection_sample(probs, drafts, generator):" in path.read_text()
    assert not run_exercises("12", path)  # stubs: not written yet
    answers = "from minillm.course.solutions.ch12 import"
    path.write_text(f"{answers} *  # noqa\n{answers} my_ngram_draft  # noqa\n")
    run = f"from minillm.course.chapter import run_exercises as r; print(r('12', '{path}'))"
    r = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().splitlines()[-1] == "True", r.stdout + r.stderr


def _symmetric_int4(w, group_size):
    "int8's scheme in 4 bits: levels around zero, half of them wasted on an all-positive group."
    groups = w.view(w.shape[0], -1, group_size)
    scale = groups.abs().amax(-1) / 7
    q = (torch.round(groups / scale[..., None]) + 8).clamp(0, 15).view_as(w)
    return q.to(torch.uint8), scale, -8 * scale


def _levels(w, group_size, steps=15, rounding=torch.round):
    groups = w.float().view(w.shape[0], -1, group_size)
    lo, scale = groups.amin(-1), (groups.amax(-1) - groups.amin(-1)) / steps
    q = rounding((groups - lo[..., None]) / scale[..., None]).clamp(0, 15)
    return q.view_as(w).to(torch.uint8), scale, lo


def _down_the_columns(w, group_size):
    from minillm.quantization.layers import quantize_int4

    q, scale, lo = quantize_int4(w.T.contiguous(), group_size)
    return q.T, scale, lo


WRONG_INT4 = {
    "symmetric": _symmetric_int4,
    "16 steps": lambda w, g: _levels(w, g, steps=16),
    "truncated": lambda w, g: _levels(w, g, rounding=torch.floor),
    "groups down the columns": _down_the_columns,
}


@pytest.mark.parametrize("wrong", WRONG_INT4)
def test_wrong_int4_quantizers_fail(wrong):
    checker = chapter_exercises("13")["my_quantize_int4(w, group_size)"]
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        checker(WRONG_INT4[wrong])


def test_swapped_nibbles_fail():
    checker = chapter_exercises("13")["my_pack_nibbles(q)"]
    with pytest.raises(AssertionError):
        checker(lambda q: (q[:, 1::2] | (q[:, 0::2] << 4)).to(torch.uint8))


def test_a_cached_prefix_that_takes_the_last_tokens_block_fails():
    from minillm.course.solutions.ch04a import my_block_hashes

    def through_the_last(tokens, cached, bs):
        hashes = my_block_hashes(tokens, bs)
        return bs * next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))

    with pytest.raises(AssertionError):
        chapter_exercises("4a")["my_cached_prefix(token_ids, cached, block_size)"](through_the_last)


WRONG_TP = {
    "my_row_shard(weight, rank, size)": lambda w, r, n: w.chunk(n, 0)[r],  # split by outputs
    "my_row_partial(x, shard, rank, size)": lambda x, s, r, n: (
        x[:, : s.shape[1]] @ s.T
    ),  # rank 0's x
    "my_embed_partial(ids, shard, rank, size)": lambda ids, s, r, n: s[
        (ids - r * len(s)).clamp(0, len(s) - 1)
    ],  # foreign ids clamped, not masked
    "my_vocab_slice(vocab_size, rank, size)": lambda v, r, n: (r * (v // n), (r + 1) * (v // n)),
}


@pytest.mark.parametrize("signature", WRONG_TP)
def test_wrong_tensor_parallel_answers_fail(signature):
    with pytest.raises(AssertionError):
        chapter_exercises("11")[signature](WRONG_TP[signature])


def _copy(producer, consumer, pairs):
    for p, c in pairs:
        consumer[c] = producer[p]


WRONG_REMAP = {  # (producer, producer_table, consumer, consumer_table, start_block, num_tokens)
    "under the producer's block numbers": lambda p, pt, c, ct, s, n: _copy(
        p, c, [(b, b) for b in pt[s:]]
    ),
    "the cached prefix overwritten": lambda p, pt, c, ct, s, n: _copy(p, c, zip(pt, ct)),
    "the last, partial block left out": lambda p, pt, c, ct, s, n: _copy(
        p, c, zip(pt[s : n // p.shape[1]], ct[s : n // p.shape[1]])
    ),
}


@pytest.mark.parametrize("wrong", WRONG_REMAP)
def test_wrong_remaps_fail(wrong):
    signature = next(s for s in chapter_exercises("14") if s.startswith("my_land_blocks"))
    with pytest.raises(AssertionError):
        chapter_exercises("14")[signature](WRONG_REMAP[wrong])


def _walk_drafts(matcher, bitmask, row, drafts, undo, stop_at_eos=True):
    "Grammar.fill_bitmask with its mistakes switchable: `undo` gives how many steps to roll back."
    matcher.fill_next_token_bitmask(bitmask, row)
    tried = accepted = filled = 0
    for d in drafts:
        tried += 1
        if not matcher.accept_token(d):
            break
        accepted += 1
        if matcher.is_terminated() and stop_at_eos:
            break
        filled += 1
        if not matcher.is_terminated():
            matcher.fill_next_token_bitmask(bitmask, row + filled)
    steps = undo(tried, accepted)
    if steps:
        matcher.rollback(steps)
    return 1 + filled


WRONG_GRAMMAR_WALKS = {
    "never rolled back": lambda m, b, r, d: _walk_drafts(m, b, r, d, lambda t, a: 0),
    "the refused draft rolled back too": lambda m, b, r, d: _walk_drafts(
        m, b, r, d, lambda t, a: t
    ),
    "one step short": lambda m, b, r, d: _walk_drafts(m, b, r, d, lambda t, a: max(a - 1, 0)),
    "a row after the stop token": lambda m, b, r, d: _walk_drafts(
        m, b, r, d, lambda t, a: a, stop_at_eos=False
    ),
}


@pytest.mark.parametrize("wrong", WRONG_GRAMMAR_WALKS)
def test_wrong_grammar_walks_fail(wrong):
    checker = chapter_exercises("12b")["my_fill_bitmask(matcher, bitmask, row, drafts)"]
    with pytest.raises((AssertionError, RuntimeError)):  # xgrammar refuses a rollback too far
        checker(WRONG_GRAMMAR_WALKS[wrong])
