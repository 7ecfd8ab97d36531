"""The course site builds offline from the notebooks (as `make docs` does).

A page per notebook, an entry per exported symbol."""

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from docutils.nodes import make_id

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import nbdev_sphinx  # noqa: E402

NOTEBOOKS = nbdev_sphinx.notebooks(ROOT / "nbs")


class Page(HTMLParser):
    "The ids, links and loaded resources of one HTML page."

    def __init__(self, path: Path):
        super().__init__()
        self.ids, self.links, self.sources, self.loads, self.classes = set(), [], [], [], {}
        self.feed(path.read_text())

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
            self.classes[a["id"]] = a.get("class", "")
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "a" and "nbdev-source" in a.get("class", ""):
            self.sources.append(a["href"])
        for k in ("src", "href") if tag in ("script", "img", "iframe", "source", "link") else ():
            if a.get(k) and not (tag == "link" and a.get("rel") in ("canonical",)):
                self.loads.append(a[k])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-E",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-c",
            "docs",
            "nbs",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (
        f"sphinx-build failed (warnings are errors):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    )
    return out


@pytest.fixture(scope="module")
def pages(site):
    return {p.stem: Page(p) for p in site.glob("*.html")}


SOLUTIONS = "minillm.course.solutions"


def exported_symbols():
    """Every function and class that a module of the library exports (its `__all__`) and defines
    itself, but the exercises' answers (`minillm.course.solutions`), which stay out of sight."""
    import minillm

    for m in pkgutil.walk_packages(minillm.__path__, "minillm."):
        if m.name.rpartition(".")[2].startswith("_") or m.name.startswith(SOLUTIONS):
            continue
        mod = importlib.import_module(m.name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == mod.__name__:
                yield f"{mod.__name__}.{name}"


def test_every_notebook_has_a_page_in_the_navigation(site, pages):
    assert NOTEBOOKS and len(NOTEBOOKS) == len(list((ROOT / "nbs").glob("[!_.]*.ipynb")))
    index = pages["00_index"]
    for nb in NOTEBOOKS:
        assert nb.stem in pages, f"no page for {nb.name}"
        if nb.stem != "00_index":
            assert f"{nb.stem}.html" in index.links, f"{nb.name} is not in the navigation"
    assert (site / "index.html").read_text().count(
        "00_index.html"
    ) >= 1  # the site root opens the course map
    assert (site / "search.html").exists() and (site / "searchindex.js").exists()


def test_pages_come_in_notebook_order_with_previous_and_next(site):
    stems = [p.stem for p in NOTEBOOKS]
    for prev, page, nxt in zip(stems, stems[1:], stems[2:]):
        html = (site / f"{page}.html").read_text()
        nav = html[html.index('class="prev-next-area"') :]
        assert nav.index(f'href="{prev}.html"') < nav.index(f'href="{nxt}.html"'), page


def test_every_exported_symbol_has_a_show_doc_entry(pages):
    ids = {i: (name, p) for name, p in pages.items() for i in p.ids}
    symbols = list(exported_symbols())
    assert len(symbols) > 50
    missing = [s for s in symbols if make_id(s) not in ids]
    assert not missing, f"exported but not documented on any page: {missing}"
    for s in symbols:
        _page, p = ids[make_id(s)][0], ids[make_id(s)][1]
        assert "nbdev-showdoc" in p.classes[make_id(s)], s
    # every entry links to its source, with a line number
    src = [l for p in pages.values() for l in p.sources]
    assert len(src) >= len(symbols) and all(
        re.search(r"/blob/main/minillm/[\w/]+\.py#L\d+$", l) for l in src
    )


def test_links_resolve_and_backticked_names_link_to_entries(pages):
    to_entries = 0
    for name, p in pages.items():
        for href in p.links:
            if re.match(r"(https?:|mailto:|_)", href) or not href.partition("#")[2]:
                continue
            page, _, anchor = href.partition("#")
            target = pages.get(Path(page).stem) if page else p
            assert target is not None and anchor in target.ids, f"{name}.html: broken link {href}"
            to_entries += page != "" and anchor.startswith("minillm-")
    assert to_entries > 10, (
        "backticked symbol names in one chapter should link to entries in another"
    )


def test_nothing_is_loaded_from_the_network(site, pages):
    for name, p in pages.items():
        external = [u for u in p.loads if re.match(r"(https?:)?//", u)]
        assert not external, f"{name}.html loads {external}"
    html = (site / "01b_sampling.html").read_text()
    assert (
        'src="_static/mathjax/tex-chtml.js"' in html
        and (site / "_static/mathjax/tex-chtml.js").exists()
    )
    assert 'class="math notranslate nohighlight"' in html
    assert list((site / "_images").glob("*.png")), "the notebooks' plots"


def test_nbdev_conventions(site):
    html = (site / "01b_sampling.html").read_text()
    assert "#| export" not in html and "#|" not in html  # directives are not shown ...
    assert "GREEDY_EPS" in html  # ... but exported code is
    assert "from nbdev.showdoc import" not in html  # `#| hide` cells are not shown
    assert "show_doc(" not in html  # show_doc cells become entries


def test_quarto_callouts_become_admonitions():
    from fastcore.nbio import mk_cell

    cell = mk_cell(
        "Before.\n\n::: {.callout-tip}\n## Why blocks\nText.\n:::\n\n"
        '::: {.callout-warning title="Careful"}\nMore.\n:::\n\n'
        "::: {.callout-note}\nPlain.\n:::",
        "markdown",
    )
    nbdev_sphinx.callouts(cell)
    assert cell.source == (
        "Before.\n\n:::{admonition} Why blocks\n:class: tip\nText.\n:::\n\n"
        ":::{admonition} Careful\n:class: warning\n"
        "More.\n:::\n\n:::{note}\nPlain.\n:::"
    )
