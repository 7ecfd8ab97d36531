"Print a notebook's stored text outputs and save its images to a folder (to review a run)."

import base64
import json
import sys
from pathlib import Path

nb, out = Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/nb_images")
out.mkdir(parents=True, exist_ok=True)
for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
    for o in cell.get("outputs", []):
        if "image/png" in o.get("data", {}):
            (out / f"{nb.stem}_{i}.png").write_bytes(base64.b64decode(o["data"]["image/png"]))
            print(f"[cell {i}: image {out / f'{nb.stem}_{i}.png'}]")
        text = "".join(o.get("text", "")) or "".join(o.get("data", {}).get("text/plain", ""))
        if text and "image/png" not in o.get("data", {}):
            print(f"[cell {i}]", text[:1500])
