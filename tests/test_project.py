"The repository's generated files match their sources, and the package imports one way."

import ast
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_generated_from_the_index():
    readme = runpy.run_path(str(ROOT / "scripts/readme.py"))["readme"]
    assert (ROOT / "README.md").read_text() == readme()


def _module_imports() -> dict[str, set[str]]:
    "Each minillm module and the minillm modules it imports, at the top or inside a function."
    files = {}
    for path in (ROOT / "minillm").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    imports = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target.startswith("minillm") and target != name:
                    found.add(target)
        imports[name] = found
    return imports


def _circles(graph: dict[str, set[str]]) -> list[str]:
    "The shortest circle through each node that is on one."
    circles = []
    for start in graph:
        paths, seen = [[start]], {start}
        while paths and not any(p[-1] == start and len(p) > 1 for p in paths):
            nxt = []
            for p in paths:
                for m in graph.get(p[-1], ()):
                    if m == start:
                        nxt.append(p + [m])
                    elif m not in seen:
                        seen.add(m)
                        nxt.append(p + [m])
            paths = nxt
        circles += [" -> ".join(p) for p in paths if p[-1] == start and len(p) > 1][:1]
    return circles


def test_no_module_imports_in_a_circle():
    "Lazy imports count: a circle through a function-level import is a circle of the design."
    circles = _circles(_module_imports())
    assert not circles, circles


def _part(module: str) -> str:
    "A module's top-level part: `minillm.engine.scheduler` -> `engine`, `minillm.llm` -> `llm`."
    return module.split(".")[1] if "." in module else module


def test_the_package_is_layered():
    """No two top-level parts (folders, and modules at the top) import each other, directly or
    through others, function-level imports counted: the package is a stack of layers, each
    importing only those below it (the README's architecture section draws them)."""
    parts = {}
    for module, targets in _module_imports().items():
        part = _part(module)
        parts.setdefault(part, set()).update(_part(t) for t in targets if _part(t) != part)
    circles = _circles(parts)
    assert not circles, circles


# the parts the engine's core builds on; the rest (kernels, spec_decode, quantization, moe, ...)
# are features, which it reaches through engine.assembly only
ENGINE_BASE = {"engine", "core", "attention", "models", "parallel", "loader", "sampling"}
ENGINE_BASE |= {"detokenizer", "metrics", "utils", "triton_utils"}


def test_the_engine_reaches_features_through_its_assembly_module_only():
    imports = _module_imports()
    reached = {
        module: sorted(t for t in targets if _part(t) not in ENGINE_BASE)
        for module, targets in imports.items()
        if _part(module) == "engine" and module != "minillm.engine.assembly"
    }
    assert not {m: t for m, t in reached.items() if t}


def test_each_module_says_what_it_holds():
    "A module's docstring is its own: one notebook's summary is not reused by all it exports."
    docs = {}
    for path in sorted((ROOT / "minillm").rglob("*.py")):
        if path.name not in ("__init__.py", "_modidx.py"):
            doc = ast.get_docstring(ast.parse(path.read_text()))
            assert doc, f"{path.relative_to(ROOT)} has no docstring"
            docs.setdefault(doc, []).append(str(path.relative_to(ROOT / "minillm")))
    shared = {doc: paths for doc, paths in docs.items() if len(paths) > 1}
    assert not shared, shared


def test_chapters_pick_their_long_form_by_one_variable(monkeypatch, capsys):
    from minillm.course.chapter import LONG_FORM, ChapterRun

    monkeypatch.delenv(LONG_FORM, raising=False)
    assert ChapterRun().sized(8, 16) == 8 and "long form" not in capsys.readouterr().out
    for off in ("", "0"):
        monkeypatch.setenv(LONG_FORM, off)
        assert ChapterRun().sized(8, 16) == 8
    monkeypatch.setenv(LONG_FORM, "1")
    assert ChapterRun().sized(8, 16) == 16 and "long form" in capsys.readouterr().out


def test_export_writes_the_committed_package_and_never_a_half_module(tmp_path):
    """`nbdev-export` in a copy of the project: the package it writes is the committed one (nobody
    edited a generated module by hand), a module no notebook writes any more is removed, and no
    file is written in place: the export runs in a staged copy (minillm/_nbdev.py) and a module
    whose text did not change is not touched, so a server importing the package meanwhile never
    reads a stub."""
    import shutil
    import subprocess
    import sys

    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "nbs", tmp_path / "nbs", ignore=shutil.ignore_patterns("*.txt"))
    lib = tmp_path / "minillm"
    shutil.copytree(ROOT / "minillm", lib, ignore=shutil.ignore_patterns("__pycache__"))
    stale = lib / "engine" / "gone.py"
    stale.write_text('"Moved."\n\n# AUTOGENERATED! DO NOT EDIT! File to edit: ../../nbs/x.ipynb.\n')
    files = {p: p.stat().st_mtime_ns for p in lib.rglob("*.py") if p != stale}
    export = Path(sys.executable).parent / "nbdev-export"
    r = subprocess.run([str(export)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not stale.exists()
    for path, mtime in files.items():
        committed = ROOT / path.relative_to(tmp_path)
        assert path.read_text() == committed.read_text(), f"{committed} differs from its notebook"
        assert path.stat().st_mtime_ns == mtime, f"{path.name} was rewritten in place"


def test_no_function_is_longer_than_a_screen():
    "A function reads at once: at most 100 lines (a kernel's body included)."
    long = []
    for path in sorted((ROOT / "minillm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long
