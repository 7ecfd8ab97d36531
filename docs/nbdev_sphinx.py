"""A Sphinx extension that renders nbdev notebooks the way nbdev's Quarto site does, offline.

myst-nb reads the notebooks in `nbs/` with their stored outputs; on `source-read` this extension
first runs nbdev's own notebook processors over each one (`NBProcessor` with `add_show_docs`,
`hide_`, `hide_line`, `strip_ansi`, ...), then:

- turns every `show_doc(...)` cell (written by hand or added by `add_show_docs` after each
  exported function and class) into page markdown: a labelled heading, a source link, the
  signature with its parameter notes and the docstring, rendered by nbdev's `show_doc`;
- shows `#| export` cells' code without the directive line, drops `#| hide`, `#| exporti`,
  `#| default_exp` and `#| include: false` cells, and honours `#| echo: false` / `#| output: false`;
- turns Quarto callouts (`::: {.callout-note}`) into MyST admonitions;
- links backticked names of exported symbols (`` `SamplingParams` ``, `` `sample()` ``,
  `` `minillm.sampling` ``) to their show_doc entry or chapter, as nbdev's `add_links` does;
- gives the index page a hidden toctree of every notebook, in file-name order, and makes links into the
  built site (`docs/_build/html/x.html`, which the README needs) page links.

When the build ends it writes `index.html`, a redirect to the index notebook's page.
"""
import ast, dataclasses, importlib, inspect, json, re, tomllib, warnings
from dataclasses import dataclass, field
from pathlib import Path

from fastcore.nbio import dict2nb, nb2dict, mk_cell
from nbdev.process import NBProcessor, Processor
from nbdev.processors import (populate_language, add_show_docs, strip_ansi, hide_line, filter_stream_,
                              rm_header_dash, clean_magics, hide_, strip_hidden_metadata)
from nbdev.showdoc import show_doc
from fastcore.docments import MarkdownRenderer
from sphinx.util import logging

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
LANG_META = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
             "language_info": {"name": "python", "pygments_lexer": "ipython3"}}

_re_default_exp = re.compile(r"^\s*#\|\s*default_exp\s+(\S+)", re.M)
_re_export_to = re.compile(r"^[ \t]*#\|[ \t]*export[is]?[ \t]+(\S+)", re.M)
_re_fence = re.compile(r"^\s*(```|~~~)")
_re_heading = re.compile(r"^(#{1,6})\s+\S")
_re_backticks = re.compile(r"(?<![`\[])`([^`\s]+?)(\(\))?`(?![`\]])")  # nbdev's, but not `` or [`x`](...)
_re_callout = re.compile(r"^(:{3,})\s*\{\s*\.callout-(\w+)([^}]*)\}\s*$")
_re_title_attr = re.compile(r"""title\s*=\s*(["'])(.*?)\1""")
CALLOUTS = {"note", "tip", "warning", "caution", "important"}


def _settings():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    nbdev = cfg.get("tool", {}).get("nbdev", {})
    repo = cfg.get("project", {}).get("urls", {}).get("Repository", "").rstrip("/")
    return dict(lib=nbdev.get("lib_path", "minillm"), nbs=nbdev.get("nbs_path", "nbs"),
                branch=nbdev.get("branch", "main"), repo=repo)


def notebooks(nbs_path: Path):
    "The notebooks to render, in file-name order (nbdev's `nbglob` rule: no `_` or `.` names)."
    return sorted(p for p in Path(nbs_path).glob("*.ipynb") if not re.match(r"[_.]", p.name))


def default_exp(nb_dict) -> str | None:
    for c in nb_dict["cells"]:
        if c["cell_type"] == "code" and (m := _re_default_exp.search("".join(c["source"]))): return m.group(1)


def exported_modules(nb_dict) -> list[str]:
    "Every module a notebook exports to: its `default_exp`, then each `#| export other.module`, in order."
    mods = [m] if (m := default_exp(nb_dict)) else []
    for c in nb_dict["cells"]:
        if c["cell_type"] == "code" and (m := _re_export_to.search("".join(c["source"]))) and m.group(1) not in mods:
            mods.append(m.group(1))
    return mods


@dataclass
class Site:
    "What every page needs to know about the others: which module each notebook exports, every show_doc label."
    lib: str
    repo: str
    branch: str
    mod2doc: dict = field(default_factory=dict)   # "minillm.sampling" -> "01b_sampling"
    labels: dict = field(default_factory=dict)    # "minillm.sampling.SamplingParams" -> docname
    pages: dict = field(default_factory=dict)     # docname -> processed notebook JSON

    def namespace(self, mods: list[str]) -> dict:
        "Names visible to a notebook's `show_doc` cells: every module of the library, its own last (they win)."
        ns = {}
        for m in list(self.mod2doc) + [f"{self.lib}.{mod}" for mod in mods]:
            try: ns.update(vars(importlib.import_module(m)))
            except Exception as e: logger.warning(f"nbdev_sphinx: cannot import {m}: {type(e).__name__}: {e}")
        return ns

    def source_link(self, obj) -> str | None:
        o = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
        try:
            path = Path(inspect.getsourcefile(o)).resolve().relative_to(ROOT)
            line = inspect.getsourcelines(o)[1]
        except (TypeError, OSError, ValueError): return None
        return f"{self.repo}/blob/{self.branch}/{path.as_posix()}#L{line}" if self.repo else None


def label_of(obj, nm: str, mod: str | None, lib: str) -> str:
    "The cross-reference label of a show_doc entry: the symbol's full dotted name."
    o = obj.fget if isinstance(obj, property) else obj
    modname = getattr(inspect.unwrap(o), "__module__", None) or (f"{lib}.{mod}" if mod else lib)
    return f"{modname}.{nm}"


class OwnDocRenderer(MarkdownRenderer):
    "nbdev's markdown renderer, without a docstring a class only inherits (pydantic's `BaseModel` has a long one)."
    def __init__(self, sym, **kwargs):
        super().__init__(sym, **kwargs)
        if inspect.isclass(sym) and _no_own_doc(sym): self.docs = ""
        if inspect.isclass(sym) and hasattr(sym, "model_fields"):  # pydantic: its fields, not `**data:Any`
            self.dm = _wrap_sig(self.nm, inspect.signature(sym))


def _wrap_sig(nm: str, sig: inspect.Signature, width: int = 100) -> str:
    "`def nm(...)`, parameters packed into lines of at most `width`, as nbdev lays out long signatures."
    lines, cur = [], ""
    for p in [str(p) for p in sig.parameters.values()]:
        if cur and len(cur) + len(p) + 2 > width - 4: lines.append(cur + ","); cur = ""
        cur = f"{cur}, {p}" if cur else p
    if cur: lines.append(cur)
    ret = "" if sig.return_annotation is inspect.Signature.empty else f"->{inspect.formatannotation(sig.return_annotation)}"
    return f"def {nm}(\n" + "\n".join("    " + l for l in lines) + f"\n){ret}:" if lines else f"def {nm}(){ret}:"


def _no_own_doc(cls) -> bool:
    "No docstring of its own: none, or the `Name(field: type, ...)` one that `@dataclass` writes."
    doc = cls.__doc__
    return not doc or (dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}("))


def render_entry(site: Site, obj, nm: str, level: int, label: str) -> str:
    "One show_doc entry as MyST markdown, from nbdev's `show_doc` renderer."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = show_doc(obj, renderer=OwnDocRenderer, name=nm, title_level=level)
        body = r._repr_markdown_()
    for w in caught: logger.warning(f"nbdev_sphinx: show_doc({nm}): {w.message}")
    if inspect.isclass(obj): body = re.sub(r"^(```python\n)def ", r"\1class ", body)
    src = site.source_link(obj)
    link = f"[source]({src}){{.nbdev-source}}\n\n" if src else ""
    return f"({label})=\n{'#' * level} {nm}\n\n{link}{body}\n"


class render_show_docs(Processor):
    "Replace each `show_doc(...)` cell with its rendered entry, a heading one level below the prose around it."
    def __init__(self, nb, site: Site, mods: list[str], docname: str):
        super().__init__(nb)
        self.site, self.mods, self.docname, self.level, self._ns = site, mods, docname, 1, None

    @property
    def ns(self):
        if self._ns is None: self._ns = self.site.namespace(self.mods)
        return self._ns

    def cell(self, cell):
        if cell.cell_type == "markdown":
            in_fence = False
            for line in cell.source.splitlines():
                if _re_fence.match(line): in_fence = not in_fence
                elif not in_fence and (m := _re_heading.match(line)): self.level = len(m.group(1))
            return
        if cell.cell_type != "code" or not re.match(r"\s*show_doc\(", cell.source): return
        calls = []
        def rec(sym, renderer=None, name=None, title_level=None): calls.append((sym, name))
        try: exec(cell.source, {**self.ns, "show_doc": rec})
        except Exception as e:
            logger.warning(f"nbdev_sphinx: {cell.source.strip()} failed: {type(e).__name__}: {e}", location=self.docname)
            del cell["source"]; return
        level = min(self.level + 1, 6)
        mds = []
        for sym, name in calls:
            nm = name or _source_name(cell.source, len(mds)) or getattr(sym, "__qualname__", str(sym))
            label = label_of(sym, nm, (self.mods or [None])[0], self.site.lib)
            if label in self.site.labels and self.site.labels[label] != self.docname:
                logger.warning(f"nbdev_sphinx: {label} is documented twice", location=self.docname)
            self.site.labels[label] = self.docname
            mds.append(render_entry(self.site, sym, nm, level, label))
        cell.cell_type, cell.source = "markdown", "\n".join(mds)
        for k in ("outputs", "execution_count"): cell.pop(k, None)


def _source_name(src: str, i: int) -> str | None:
    "The name written in the i-th `show_doc(name)` call of a cell, as nbdev's `_get_nm` reads it."
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "show_doc"]
    return ast.unparse(calls[i].args[0]) if i < len(calls) and calls[i].args else None


class order_show_docs(Processor):
    "`add_show_docs` inserts a cell's show_docs in reverse (each right after the cell): put them back in source order."
    def begin(self):
        cells, out, run = self.nb.cells, [], []
        for c in cells + [None]:
            if c is not None and getattr(c, "has_sd", False): run.append(c); continue
            out += run[::-1] + ([c] if c is not None else []); run = []
        self.nb.cells[:] = out


def quarto_cell_options(cell):
    "Directives nbdev's processors leave to Quarto: hide what Quarto hides, map the rest to myst-nb tags."
    if cell.cell_type != "code": return
    d = cell.directives_ or {}
    if d.keys() & {"exporti", "default_exp"} or str(d.get("include", "")).lower() == "false" or not cell.source.strip():
        del cell["source"]; return
    tags = cell.metadata.setdefault("tags", [])
    if str(d.get("echo", "")).lower() == "false": tags.append("remove-input")
    if str(d.get("output", "")).lower() == "false": tags.append("remove-output")


def callouts(cell):
    "Quarto callouts (`::: {.callout-tip title=...}`, or a `##` title line) become MyST admonitions."
    if cell.cell_type != "markdown" or ".callout-" not in cell.source: return
    lines, out, i = cell.source.splitlines(), [], 0
    while i < len(lines):
        m = _re_callout.match(lines[i])
        if not m: out.append(lines[i]); i += 1; continue
        colons, kind, attrs = m.groups()
        kind = kind if kind in CALLOUTS else "note"
        title = (t.group(2) if (t := _re_title_attr.search(attrs)) else None)
        i += 1
        while i < len(lines) and not lines[i].strip(): i += 1
        if title is None and i < len(lines) and (h := re.match(r"^#{1,6}\s+(.*)$", lines[i])): title, i = h.group(1), i + 1
        out += [f"{colons}{{admonition}} {title}", f":class: {kind}"] if title else [f"{colons}{{{kind}}}"]
    cell.source = "\n".join(out)


def description(cell):
    "nbdev's title cell: `# Title` then `> description`, shown as Quarto shows it, a subtitle."
    if cell.cell_type == "markdown" and cell.idx_ == 0:
        cell.source = re.sub(r"^(#\s+.*\n+)>\s*(.+)$", r"\1{.nbdev-description}\n\2", cell.source, count=1, flags=re.M)


class site_links(Processor):
    "Links into the built site, which the README needs (`docs/_build/html/index.html`), are page links on the site."
    def __init__(self, nb, root: str): super().__init__(nb); self.root = root
    def cell(self, cell):
        if cell.cell_type != "markdown": return
        page = lambda m: f"]({self.root if m[1] == 'index' else m[1]}.ipynb{m[2] or ''})"
        cell.source = re.sub(r"\]\(docs/_build/html/([\w.-]+)\.html(#[^)\s]*)?\)", page, cell.source)


class add_links(Processor):
    "Link backticked names of documented symbols and of the library's modules (nbdev's `add_links`, for Sphinx)."
    def __init__(self, nb, site: Site, mods: list[str]):
        super().__init__(nb)
        self.site, self.mods = site, mods

    def begin(self):
        own = tuple(f"{self.site.lib}.{m}." for m in self.mods) or ("\0",)
        table = {}
        for label in sorted(self.site.labels, key=lambda l: not l.startswith(own)):  # this chapter's symbols win
            parts = label.split(".")
            for k in range(len(parts)):  # SamplingParams, sampling.SamplingParams, minillm.sampling.SamplingParams
                table.setdefault(".".join(parts[k:]), f"#{label}")
        for m, doc in self.site.mod2doc.items(): table.setdefault(m, f"{doc}.ipynb")
        self.table = table

    def target(self, name):
        if name in self.table: return self.table[name]
        head = name.rpartition(".")[0]  # Cls.method without an entry of its own: the class's entry
        return self.table[head] if head in self.table and head not in self.site.mod2doc else None

    def link(self, m):
        t = self.target(m.group(1))
        return m.group(0) if t is None else f"[{m.group(0)}]({t})"

    def cell(self, cell):
        if cell.cell_type != "markdown": return
        lines, in_fence = cell.source.splitlines(), False
        for i, l in enumerate(lines):
            if _re_fence.match(l): in_fence = not in_fence
            elif not (in_fence or l.startswith("    ") or _re_heading.match(l)): lines[i] = _re_backticks.sub(self.link, l)
        cell.source = "\n".join(lines)


def process(site: Site, path: Path, docname: str):
    nb_dict = json.loads(path.read_text())
    mod = exported_modules(nb_dict)
    nb = dict2nb(nb_dict)
    NBProcessor(nb=nb, procs=[populate_language, add_show_docs, order_show_docs, strip_ansi, hide_line, filter_stream_, rm_header_dash,
                              clean_magics, hide_, strip_hidden_metadata, quarto_cell_options,
                              render_show_docs(nb, site, mod, docname), callouts, description], process=True)
    return nb, mod


def builder_inited(app):
    "Process every notebook up front: links on one page need the show_doc labels of all the others."
    s = _settings()
    site = Site(lib=s["lib"], repo=s["repo"], branch=s["branch"])
    srcdir = Path(app.srcdir)
    nbs = notebooks(srcdir)
    for p in nbs:
        for mod in exported_modules(json.loads(p.read_text())): site.mod2doc[f"{site.lib}.{mod}"] = p.stem
    root = app.config.root_doc
    processed = {p.stem: process(site, p, p.stem) for p in nbs}
    for docname, (nb, mod) in processed.items():
        NBProcessor(nb=nb, procs=[site_links(nb, root), add_links(nb, site, mod)], rm_directives=False, process=True)
        if docname == root:
            entries = "\n".join(p.stem for p in nbs if p.stem != root)
            nb.cells.append(mk_cell(f"```{{toctree}}\n:hidden:\n:caption: The course\n\n{entries}\n```", "markdown"))
        nb.metadata.update(LANG_META)
        d = nb2dict(nb)
        for c in d["cells"]:
            for k in [k for k in c if k.endswith("_")] + ["idx_"]: c.pop(k, None)
        site.pages[docname] = json.dumps(d)
    app.env.nbdev_site = site
    app.nbdev_site = site


def source_read(app, docname, source):
    site = getattr(app, "nbdev_site", None)
    if site and docname in site.pages: source[0] = site.pages[docname]


def doctree_read(app, doctree):
    "Mark show_doc sections so the stylesheet can draw them as nbdev does."
    from docutils import nodes
    labels = {l.lower() for l in getattr(app, "nbdev_site", Site("", "", "")).labels}
    for sec in doctree.findall(nodes.section):
        if set(n.lower() for n in sec.get("names", [])) & labels: sec["classes"].append("nbdev-showdoc")


def build_finished(app, exc):
    "A site root that opens the course map."
    if exc is None and app.builder.format == "html" and app.config.root_doc != "index":
        page = f"{app.config.root_doc}.html"
        (Path(app.outdir) / "index.html").write_text(
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={page}">'
            f'<title>{app.config.project}</title></head>\n<body><a href="{page}">{app.config.project}</a></body></html>\n')


def setup(app):
    app.connect("builder-inited", builder_inited)
    app.connect("source-read", source_read)
    app.connect("doctree-read", doctree_read)
    app.connect("build-finished", build_finished)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
