"""test_server's tests, every one, against `minillm serve --engine-process`: the engine core in a
process of its own (chapter 17), driven by the same official openai client."""

import pytest
from helpers import minillm_serve
from test_server import *  # noqa: F403 (its tests, collected here again with this server)
from test_server import KEY, NAME


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    flags = ["--api-key", KEY, "--served-model-name", NAME, "--num-kv-blocks", "400"]
    with minillm_serve(model_dir, log, *flags, "--engine-process") as (base, _):
        yield base
