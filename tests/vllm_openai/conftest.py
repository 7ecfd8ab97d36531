"""vLLM's OpenAI-server tests (vllm-project/vllm, tests/entrypoints/openai), rewritten here against
`minillm serve` on the default model: the same requests and the same assertions, each test naming
the vLLM test it follows. vLLM's `RemoteOpenAIServer` fixture becomes `RemoteServer`, a real
`minillm serve` process with the flags a test module asks for. `test_clients.py` adds the client
libraries people put in front of vLLM (langchain-openai, litellm, openai-agents).

`make test` runs the cases marked `quick`; `make test-vllm` runs all of them. A case that asserts
another model's text (vLLM's tiny random Llama, Qwen, Zephyr) is an `xfail(strict=True)` that says
which output it expects, so the list of them is the code, and one that starts passing is noticed."""

from pathlib import Path

import httpx
import pytest
from helpers import minillm_serve, openai_client


class RemoteServer:
    "What vLLM's tests call on their server: `url_for`, `get_client`, `get_async_client`."

    def __init__(self, base: str, model_name: str):
        self.base = base
        self.model_name = model_name

    def url_for(self, *parts: str) -> str:
        return "/".join([self.base, *(p.strip("/") for p in parts)])

    def get_client(self, **kwargs):
        return openai_client(self.base, **kwargs)

    def get_async_client(self, timeout: float = 300, **kwargs):
        import openai

        url = f"{self.base}/v1"
        return openai.AsyncOpenAI(
            base_url=url, api_key="none", max_retries=0, timeout=timeout, **kwargs
        )


def pytest_collection_modifyitems(items):
    "Cases not marked `quick` run only from `make test-vllm`."
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.vllm_full)


@pytest.fixture(scope="module")
def server_args(request) -> list[str]:
    "A module's extra `minillm serve` flags: its `SERVER_ARGS`, or a test's indirect parameter."
    if hasattr(request, "param"):
        return [request.param] if isinstance(request.param, str) else list(request.param)
    return list(getattr(request.module, "SERVER_ARGS", []))


@pytest.fixture(scope="module")
def server(model_dir, server_args, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-suite") / "server.log"
    with minillm_serve(model_dir, log, *server_args) as (base, _):
        name = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        yield RemoteServer(base, name)


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.model_name


@pytest.fixture(scope="module")
def client(server):
    return server.get_client()
