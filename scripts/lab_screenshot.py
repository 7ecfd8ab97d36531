"""Open the course as a reader does, in JupyterLab, and screenshot a chapter (make lab-screenshot).

    python scripts/lab_screenshot.py [NOTEBOOK ...]      (default: 01b_sampling.ipynb)

Starts the same JupyterLab that `make lab` starts (the project's .venv, bound to 127.0.0.1, the
notebooks folder), opens each notebook in headless Chromium and saves the first screen to
docs/_build/screenshots/lab-NOTEBOOK.png. Exits 1 if JupyterLab does not come up or a notebook's
cells are not on the page. Needs Chromium (Debian: apt-get install -y chromium).
"""

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs/_build/screenshots"
# JupyterLab without its network calls: no news feed, no update check, no extension manager on PyPI
LAB_OFFLINE = [
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium(*args, profile: str) -> subprocess.CompletedProcess:
    exe = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if not exe:
        sys.exit("Chromium not found: apt-get install -y chromium")
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=25000",
        "--window-size=1400,900",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def main(notebooks: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lab = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/jupyter"),
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--ServerApp.root_dir={ROOT / 'nbs'}",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--allow-root",
            *LAB_OFFLINE,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    failed = False
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            print("JupyterLab did not start")
            return 1
        with tempfile.TemporaryDirectory() as profile:
            for nb in notebooks:
                url = f"http://127.0.0.1:{port}/lab/tree/{nb}"
                shot = OUT / f"lab-{Path(nb).stem}.png"
                chromium(f"--screenshot={shot}", url, profile=profile)
                dom = chromium("--dump-dom", url, profile=profile).stdout
                cells = dom.count("jp-Cell ")
                print(f"{nb}: {shot} ({cells} cells on the page)")
                failed |= not shot.exists() or cells == 0
    finally:
        lab.terminate()
        lab.wait(timeout=30)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["01b_sampling.ipynb"]))
