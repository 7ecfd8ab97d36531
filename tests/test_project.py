"The repository's generated files match their sources."

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_generated_from_the_index():
    assert (ROOT / "README.md").read_text() == runpy.run_path(str(ROOT / "scripts/readme.py"))[
        "readme"
    ]()
