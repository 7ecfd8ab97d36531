"Every number in the book's prose comes from a cell of the book (scripts/prose_numbers.py)."

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "nbs").glob("*.ipynb"))
pn = runpy.run_path(str(ROOT / "scripts/prose_numbers.py"))


def test_every_prose_number_is_backed():
    report = pn["unbacked"](NOTEBOOKS)
    missing = [
        f"{nb}: {number} in: {sentence}"
        for nb, found in report.items()
        for number, sentence in found
    ]
    assert not missing, "numbers in prose that no cell prints:\n" + "\n".join(missing)


def test_the_allowlist_has_no_stale_entries():
    assert not pn["stale_allowances"](NOTEBOOKS)


def md(text: str) -> dict:
    return {"cell_type": "markdown", "source": [text]}


def code(source: str, printed: str = "") -> dict:
    out = [{"output_type": "stream", "name": "stdout", "text": [printed]}] if printed else []
    return {"cell_type": "code", "source": [source], "outputs": out}


@pytest.mark.parametrize(
    "prose, printed, flagged",
    [
        ("Decoding runs at 24.8 tokens/s.", "24.79 tokens/s", []),  # rounded to the prose's places
        ("Decoding runs at 24.9 tokens/s.", "24.79 tokens/s", ["24.9"]),
        ("It hit 96% of lookups.", "hit rate 0.9612", []),  # a share printed as a fraction
        ("It hit 97% of lookups.", "hit rate 0.9612", ["97"]),
        ("The pool holds 1,456 blocks.", "1456 blocks", []),
        ("The pool holds 1,465 blocks.", "1456 blocks", ["1,465"]),
        ("About 2,000 us a token.", "1985 us", []),  # 2,000 is stated to the thousand
        ("About 3,000 us a token.", "1985 us", ["3,000"]),
        ("Qwen3-0.6B on an sm_90 H200 in fp8, chapter 12b, 2026.", "", []),  # names, not numbers
        ("The file is `93 MB` in code, $2^{10}$ in math.", "", []),
        ("It is 5.6 to 17.7 times cheaper.", "5.6x\n17.7x", []),
        ("It is 5.6 to 17.8 times cheaper.", "5.6x\n17.7x", ["17.8"]),
        ("A pull takes 97-360 us.", "97 us\n360 us", []),  # both ends of a range are checked
        ("A pull takes 97-361 us.", "97 us\n360 us", ["361"]),
        ("Within 1e-4, at 2e-3.", "tolerance 1e-4", ["2e-3"]),
    ],
)
def test_the_checker(prose, printed, flagged):
    cells = [md(prose), code("print(x)", printed)]
    assert [n for n, _ in pn["unbacked_in"](cells, {}, {})] == flagged


def test_inputs_and_other_chapters_back_numbers():
    cells = [md("A 384-token prefix, as chapter 10 measured 709 ms."), code("prefix_len = 384")]
    assert pn["unbacked_in"](cells, {"10": {709.0}}, {}) == []
    assert [n for n, _ in pn["unbacked_in"](cells, {"9": {709.0}}, {})] == ["709"]
    assert pn["unbacked_in"]([md("An H200 does 989 TFLOP/s.")], {}, {"989": "data sheet"}) == []
