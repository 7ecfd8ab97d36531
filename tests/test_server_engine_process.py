"""test_server's tests, every one, against `minillm serve --engine-process`: the engine core in a
process of its own (chapter 17), driven by the same official openai client."""

from pathlib import Path

import pytest
from helpers import minillm_serve
from test_server import *  # noqa: F403 (its tests, collected here again with this server)
from test_server import KEY, NAME

SERVERS = {}  # "process": the server's process


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--api-key", KEY, "--served-model-name", NAME, "--num-kv-blocks", "400"]
    with minillm_serve(model_dir, log, *flags, "--engine-process") as (base, process):
        SERVERS["process"] = process
        yield base


def test_the_engine_core_runs_in_a_process_of_the_servers(server):
    "The tests above ran against this server: its engine core is a spawned child of its own."
    pid = SERVERS["process"].proc.pid
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended while we looked
            continue
        if int(fields[1]) == pid:
            children.append((stat.parent / "cmdline").read_bytes())
    assert any(b"multiprocessing" in c for c in children), children
