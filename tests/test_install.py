"""The runtime package needs only its declared runtime dependencies; importing it changes nothing.

A subprocess blocks every installed module that the dependency closure of `minillm` (without
extras) does not reach: nbdev, matplotlib, IPython, pytest, hypothesis, sphinx... are then
unimportable, as after a plain `pip install minillm`. In it the engine must import, serve `--help`,
and generate.
"""

import json
import subprocess
import sys
import textwrap
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def runtime_closure(dist: str = "minillm") -> set[str]:
    "Canonical names of `dist` and every distribution its requirements reach, extras not taken."
    seen, todo = set(), [dist]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # declared for another platform or python, or optional
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def dev_only_modules() -> list[str]:
    "Top-level modules that only distributions outside the runtime closure provide."
    runtime = runtime_closure()
    owners = metadata.packages_distributions()
    blocked = []
    for module, dists in owners.items():
        if module.startswith("_") or module == "minillm":
            continue
        if not any(canonicalize_name(d) in runtime for d in dists):
            blocked.append(module)
    return sorted(blocked)


def test_the_closure_blocks_what_only_development_needs():
    blocked = set(dev_only_modules())
    for dev in (
        "nbdev",
        "execnb",
        "matplotlib",
        "IPython",
        "hypothesis",
        "sphinx",
        "pytest",
        "fastcore",
    ):
        assert dev in blocked, f"{dev} is reachable from minillm's runtime dependencies"
    for runtime in ("torch", "transformers", "fastapi", "uvicorn", "safetensors"):
        assert runtime not in blocked


SCRIPT = """
import importlib.abc, json, os, sys
BLOCKED, RUNTIME = (set(x) for x in json.loads(sys.argv[1]))
canonical = lambda name: name.lower().replace("_", "-").replace(".", "-")

class Hide(importlib.abc.MetaPathFinder):
    "A finder that does not find blocked modules: absent to imports and to find_spec alike."
    def __init__(self, finder): self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED: return None
        return self.finder.find_spec(name, path, target)
    def find_distributions(self, *args, **kwargs):
        "Installed distributions, without those that only development needs."
        find = getattr(self.finder, "find_distributions", None)
        for d in find(*args, **kwargs) if find else ():
            if d.metadata["Name"] and canonical(d.metadata["Name"]) in RUNTIME: yield d
    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()

sys.meta_path[:] = [Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
env_before = dict(os.environ)
import torch
rng_before = torch.random.get_rng_state().clone()

from minillm import LLM, SamplingParams
import minillm.server.api_server, minillm.cli
from minillm.cli import main
try:
    main(["serve", "--help"])
except SystemExit as e:
    assert e.code == 0, e.code
llm = LLM(sys.argv[2], max_num_seqs=4)
params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
out = llm.generate(["Hello", [1, 2, 3]], params, use_tqdm=False)
assert [len(o.token_ids) for o in out] == [5, 5]
assert torch.equal(torch.random.get_rng_state(), rng_before), "the engine used torch's global RNG"
assert dict(os.environ) == env_before, "importing or running minillm changed the environment"
print("OK", sorted(m for m in BLOCKED if m in sys.modules))
"""


def test_engine_runs_without_development_packages(random_llama):
    path, _ = random_llama
    blocked = dev_only_modules()
    hidden = json.dumps([blocked, sorted(runtime_closure())])
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), hidden, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "OK []" in r.stdout and "usage: minillm serve" in r.stdout
