"The exercises' checkers pass the answers and fail the classic wrong ones; make exercises works."

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.course.chapter import chapter_exercises, run_exercises

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ["12"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_answers_pass(chapter):
    import importlib

    answers = importlib.import_module(f"minillm.course.solutions.ch{chapter}")
    for signature, checker in chapter_exercises(chapter).items():
        name = signature.split("(")[0]
        if hasattr(answers, name):
            checker(getattr(answers, name))


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
