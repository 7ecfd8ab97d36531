"Write README.md from the index notebook (nbdev-readme needs the quarto binary; we do without)."

import json
import re
from pathlib import Path

root = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^\s*#\s*\|.*$\n?", re.M)


def cell_markdown(cell) -> str:
    src = "".join(cell["source"])
    if cell["cell_type"] == "markdown":  # links between notebooks become links into nbs/
        return re.sub(r"\]\((\w+\.ipynb)\)", r"](nbs/\1)", src)
    if re.search(r"^\s*#\s*\|\s*hide", src, re.M):
        return ""
    out = "".join(
        "".join(o.get("text", "")) for o in cell.get("outputs", []) if o["output_type"] == "stream"
    )
    return f"```python\n{DIRECTIVE.sub('', src).strip()}\n```" + (
        f"\n\n```\n{out.rstrip()}\n```" if out else ""
    )


def readme(nb_path=root / "nbs/00_index.ipynb") -> str:
    cells = json.loads(nb_path.read_text())["cells"]
    return "\n\n".join(md for c in cells if (md := cell_markdown(c))) + "\n"


if __name__ == "__main__":
    (root / "README.md").write_text(readme())
