"""Screenshot the built site in headless Chromium; check that viewing it fetches nothing remote.

    python scripts/screenshots.py [PAGE ...]      (make screenshots; after make docs)

PAGE is a page name without .html, with a query if it needs one (search?q=BlockManager);
default: the index and two chapters. The site in docs/_build/html/ is served on 127.0.0.1;
Chromium's proxy is a local trap that records every request bound elsewhere and answers none, so
a page that would load anything from the network is caught, not silently served from a cache.
PNGs land in docs/_build/screenshots/: PAGE.png (the first screen) and PAGE-partN.png (the whole
page, in parts). Needs Chromium (Debian: apt-get install -y chromium). Exits 1 if a page
requested anything external or its math did not render.
"""

import functools
import http.server
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE, OUT = ROOT / "docs/_build/html", ROOT / "docs/_build/screenshots"
DEFAULT_PAGES = ["00_index", "01b_sampling", "04a_block_manager"]
FULL = 16000  # px: the window height of the whole-page shot (long chapters are cut off below it)
# Chromium's own services (updates, clock, sign-in), called whatever page it shows: not the page's.
BROWSER_OWN = re.compile(
    r"\b(accounts\.google\.com|update\.googleapis\.com|clients\d*\.google\.com|"
    r"safebrowsing\.googleapis\.com|optimizationguide-pa\.googleapis\.com|"
    r"content-autofill\.googleapis\.com|redirector\.gvt1\.com)[:/]"
)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Trap(socketserver.StreamRequestHandler):
    "A proxy that writes down what it was asked for and refuses it."

    seen: list = []

    def handle(self):
        line = self.rfile.readline(4096).decode("latin-1").strip()
        if line and not BROWSER_OWN.search(line):
            Trap.seen.append(line)
        self.wfile.write(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )


def serve(handler, **kw):
    srv = socketserver.ThreadingTCPServer(
        ("127.0.0.1", 0), functools.partial(handler, **kw) if kw else handler
    )
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def chromium(*args, profile):
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
        "--disable-features=OptimizationHints,Translate",
        f"--user-data-dir={profile}",
        "--proxy-server=http://127.0.0.1:%d" % TRAP_PORT,
        "--virtual-time-budget=8000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def split(full: Path, tile=1800):
    """Cut the whole-page shot into screen-sized parts that an image viewer shows legibly, without
    the blank tail."""
    from PIL import Image

    for old in full.parent.glob(full.name.replace("-full.png", "-part*.png")):
        old.unlink()
    img = Image.open(full).convert("L")
    bg = img.getpixel((img.width // 2, img.height - 300))
    col = img.crop((img.width // 4, 0, 3 * img.width // 4, img.height)).point(
        lambda v: 255 if abs(v - bg) > 8 else 0
    )
    rows = [
        y for y, v in enumerate(col.resize((1, img.height), Image.Resampling.BOX).tobytes()) if v
    ]
    last = 0  # the page ends where a blank run of 600 px starts (the footer may follow)
    for y in rows:
        if last and y - last > 600:
            break
        last = y
    height = min(img.height, last + 40)
    parts, img = [], Image.open(full)
    for i, top in enumerate(range(0, height, tile)):
        parts.append(full.parent / full.name.replace("-full.png", f"-part{i + 1}.png"))
        img.crop((0, top, img.width, min(top + tile, height))).save(parts[-1])
    full.unlink()
    return parts


def main(pages):
    global TRAP_PORT
    if not (SITE / "index.html").exists():
        sys.exit("no site: run make docs first")
    OUT.mkdir(parents=True, exist_ok=True)
    _, port = serve(Quiet, directory=str(SITE))
    _, TRAP_PORT = serve(Trap)
    failed = False
    with tempfile.TemporaryDirectory() as profile:
        for page in pages:
            path, _, query = page.partition(
                "?"
            )  # search?q=BlockManager shows the search page's results
            url = f"http://127.0.0.1:{port}/{path}.html" + (f"?{query}" if query else "")
            page = re.sub(r"[^\w.-]+", "-", page)
            Trap.seen.clear()
            dom = chromium("--dump-dom", url, profile=profile).stdout
            chromium(
                f"--screenshot={OUT / page}.png", "--window-size=1400,900", url, profile=profile
            )
            chromium(
                f"--screenshot={OUT / page}-full.png",
                f"--window-size=1400,{FULL}",
                url,
                profile=profile,
            )
            tiles = split(OUT / f"{page}-full.png")
            has_math = "math notranslate" in dom
            rendered = dom.count("<mjx-container")
            print(
                f"{page}: {OUT / page}.png (first screen), "
                f"{len(tiles)} parts {OUT / page}-part*.png; "
                f"math {'rendered x%d' % rendered if has_math else 'none on page'}; "
                f"external requests: {len(Trap.seen)}"
            )
            for r in Trap.seen:
                print("   ", r)
            if Trap.seen or (has_math and not rendered):
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT_PAGES))
