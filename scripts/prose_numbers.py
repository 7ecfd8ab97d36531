"""Every number in the book's prose comes from a cell of the book.

For each notebook, every number in its markdown cells must appear, after rounding to the precision
the prose gives it, among the numbers its code cells print or are written with (a workload's size
is an input the reader sees in the code). A number in a sentence that names another chapter may
come from that chapter's outputs. What is not checked:

- code (fenced or inline), math, link targets, URLs and HTML tags;
- names that contain digits (Qwen3, sm_90, H200, fp8, 08b) and chapter or section references;
- the integers 0-2 and years;
- the reviewed exceptions in `prose_numbers_allow.txt` beside this file: constants of models and
  hardware, and figures from elsewhere, each with the source the prose names.

`python scripts/prose_numbers.py [NB ...]` prints each notebook's numbers that nothing backs.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOW = Path(__file__).with_name("prose_numbers_allow.txt")

# a number: 1,234 or 1234, a fraction, an exponent; not inside a name or a longer number
PROSE_NUMBER = re.compile(
    r"(?<![\w.,/])(?<![A-Za-z_]-)"  # not inside a name, a longer number or a path; 2-5 is a range
    r"(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?(?![\w.]*\d)"
)
ANY_NUMBER = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?")
CHAPTER = re.compile(r"\b[Cc]hapters? (\d+[a-z]?)((?:(?:,| and| or|-|/) ?\d+[a-z]?)*)")
BLOCKS = [re.compile(r"```.*?```", re.S), re.compile(r"\$\$.*?\$\$", re.S)]  # code, math
NOT_PROSE = [
    re.compile(r"`[^`]*`"),  # inline code
    re.compile(r"\$[^$\n]+\$"),  # inline math
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"https?://\S+"),
    re.compile(r"<[^>]+>"),  # HTML tags
    re.compile(r"\[\d+[a-z]?\."),  # the index's chapter links: [3. Prefill and decode]
    re.compile(r"^#+ \d+[a-z]?\.", re.M),  # a chapter's title: # 11. Tensor parallelism
    re.compile(r"\b[A-Za-z_]\w*\d[\w.\-]*"),  # names with digits: Qwen3-0.6B, sm_90, H200, fp8
    re.compile(r"\b\d+[a-df-wyz]\b"),  # chapter names: 08b, 12b (not 2x)
    re.compile(r"\b(?:[Ss]ections?|[Ss]tep|[Ee]xercise|[Pp]art) \d+\b"),
    CHAPTER,
]


def allowlist() -> dict[str, dict[str, str]]:
    "notebook -> {number as the prose writes it: why it needs no cell}, from ALLOW's lines."
    allowed = {}
    for line in ALLOW.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            notebook, number, reason = line.split(maxsplit=2)
            allowed.setdefault(notebook, {})[number] = reason
    return allowed


def parse(m: re.Match) -> tuple[float, int]:
    "A matched number's value, and the decimal place the text gives it (-2 for 1,200)."
    whole, frac, exp = m.group(1), m.group(2) or "", m.group(3)
    digits = whole.replace(",", "")
    value = float(digits + frac + (f"e{exp}" if exp else ""))
    if frac:
        places = len(frac) - 1
    elif exp:
        places = 99  # 1e-4 is exact
    else:
        places = -(len(digits) - len(digits.rstrip("0"))) if digits.strip("0") else 0
    return value, places


def prose_numbers(text: str) -> list[tuple[str, float, int, bool, str]]:
    "(text, value, places, is a percentage, chapters named, sentence) of each number stated."
    found = []
    for pattern in BLOCKS:
        text = pattern.sub(" ", text)
    for sentence in re.split(r"(?<=[.;:!?])\s+|\n\n|\n[-|*]", text):
        chapters = chapters_named(sentence)
        clean = sentence
        for pattern in NOT_PROSE:
            clean = pattern.sub(" ", clean)
        for m in PROSE_NUMBER.finditer(clean):
            value, places = parse(m)
            if (value <= 2 and places <= 0) or (1900 <= value <= 2100 and places == 0):
                continue
            percent = clean[m.end() : m.end() + 2].lstrip().startswith("%")
            found.append((m.group(0), value, places, percent, chapters, sentence))
    return found


def chapters_named(sentence: str) -> list[str]:
    names = []
    for m in CHAPTER.finditer(sentence):
        names.append(m.group(1))
        names += re.findall(r"\d+[a-z]?", m.group(2))
    return names


def backing_numbers(cells: list[dict]) -> set[float]:
    """The numbers a notebook's code cells print and are written with (in code, 40_000 is 40,000
    and 25e-6 also backs the 25 of "25 us")."""
    code, printed = [], []
    for c in cells:
        if c["cell_type"] != "code":
            continue
        code.append(re.sub(r"(?<=\d)_(?=\d)", "", "".join(c["source"])))
        for out in c.get("outputs", []):
            printed.append("".join(out.get("text", "")))
            for kind, data in out.get("data", {}).items():
                if kind.startswith("text/"):
                    printed.append("".join(data))
    numbers = {parse(m)[0] for m in ANY_NUMBER.finditer("\n".join(code + printed))}
    for m in ANY_NUMBER.finditer("\n".join(code)):
        if m.group(3):
            numbers.add(float(m.group(1).replace(",", "") + (m.group(2) or "")))
    return numbers


def backed(value: float, places: int, percent: bool, numbers: set[float]) -> bool:
    if places == 99:
        return value in numbers
    for x in numbers:
        for candidate in (x, 100 * x) if percent else (x,):
            if round(candidate, places) == round(value, places):
                return True
    return False


def chapter_of(path: Path) -> str:
    "nbs/08b_triton_kernel.ipynb -> '8b'."
    return path.stem.split("_")[0].lstrip("0") or "0"


def unbacked_in(cells: list[dict], backing: dict[str, set[float]], allowed: dict) -> list:
    """(number, sentence) of each number in `cells`' prose that their own code cells, a chapter
    the sentence names (`backing`: chapter -> its numbers) or `allowed` do not back."""
    own, missing = backing_numbers(cells), []
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for text, value, places, percent, chapters, sentence in prose_numbers(
            "".join(cell["source"])
        ):
            if text in allowed or backed(value, places, percent, own):
                continue
            if any(backed(value, places, percent, backing.get(ch, set())) for ch in chapters):
                continue
            missing.append((text, " ".join(sentence.split())))
    return missing


def unbacked(paths: list[Path]) -> dict[str, list[tuple[str, str]]]:
    "Each notebook's prose numbers (with their sentences) that nothing backs."
    allow = allowlist()
    book = {p: json.loads(p.read_text())["cells"] for p in sorted((ROOT / "nbs").glob("*.ipynb"))}
    backing = {chapter_of(p): backing_numbers(cells) for p, cells in book.items()}
    return {
        p.stem: unbacked_in(json.loads(p.read_text())["cells"], backing, allow.get(p.stem, {}))
        for p in paths
    }


def stale_allowances(paths: list[Path]) -> list[str]:
    "Allowlist entries whose number no longer appears in their notebook's prose."
    allow = allowlist()
    stale = []
    for path in paths:
        stated = set()
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                stated |= {n[0] for n in prose_numbers("".join(cell["source"]))}
        stale += [f"{path.stem}: {n}" for n in allow.get(path.stem, {}) if n not in stated]
    return stale


if __name__ == "__main__":
    paths = [Path(a).resolve() for a in sys.argv[1:]] or sorted((ROOT / "nbs").glob("*.ipynb"))
    report = unbacked(paths)
    for name, missing in report.items():
        for number, sentence in missing:
            print(f"{name}: {number}: {sentence}")
    for entry in stale_allowances(paths):
        print(f"allowed but not stated: {entry}")
    print(f"{sum(map(len, report.values()))} numbers in prose that no cell backs")
