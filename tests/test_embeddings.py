"""Chapter 12b's POST /v1/embeddings through the official openai client (which asks for base64 by
default): each vector equals transformers' final hidden state, pooled; bad input is a 400 that
names the field; generation beside it is untouched and no KV block is held."""

import asyncio
import base64
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ask, minillm_serve, openai_client

from minillm.course.naive import greedy_divergence

TEXTS = ["The cat sat on the mat.", "A cat is sitting on a rug.", "Stocks fell sharply today."]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    # a short context: the too-long test embeds a whole one
    flags = "--served-model-name", "m", "--max-model-len", "1024"
    with minillm_serve(model_dir, log, *flags) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def reference(hf_model, ids: list[int], pooling: str = "LAST", normalize: bool = True):
    with torch.no_grad():
        states = hf_model.model(torch.tensor([ids])).last_hidden_state[0]
    v = states[-1] if pooling == "LAST" else states.mean(0)
    return F.normalize(v, dim=-1) if normalize else v


def post(server, **body) -> httpx.Response:
    # a full-context prefill takes minutes on a loaded 2-core machine
    return httpx.post(f"{server}/v1/embeddings", json={"model": "m", **body}, timeout=600)


def test_vectors_equal_transformers(client, tokenizer, hf_model):
    r = client.embeddings.create(model="m", input=TEXTS)  # base64 on the wire, decoded
    ids = [tokenizer(t).input_ids for t in TEXTS]
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "m"
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    for d, i in zip(r.data, ids):
        assert len(d.embedding) == hf_model.config.hidden_size
        torch.testing.assert_close(
            torch.tensor(d.embedding), reference(hf_model, i), atol=1e-5, rtol=0
        )
    floats = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in floats.data] == [d.embedding for d in r.data]


def test_token_ids_truncation_and_normalize(server, tokenizer, hf_model):
    ids = tokenizer(TEXTS[0]).input_ids
    by_text = post(server, input=TEXTS[0]).json()["data"][0]["embedding"]
    by_ids = post(server, input=ids).json()["data"][0]["embedding"]
    nested = post(server, input=[ids, ids[:3]]).json()["data"]
    assert by_ids == by_text == nested[0]["embedding"]
    cut = post(server, input=TEXTS[0], truncate_prompt_tokens=3).json()
    assert cut["usage"]["prompt_tokens"] == 3
    torch.testing.assert_close(
        torch.tensor(cut["data"][0]["embedding"]), reference(hf_model, ids[-3:]), atol=1e-5, rtol=0
    )
    raw = post(server, input=ids, normalize=False).json()["data"][0]["embedding"]
    torch.testing.assert_close(
        torch.tensor(raw), reference(hf_model, ids, normalize=False), atol=1e-4, rtol=1e-5
    )
    assert post(server, input=ids, use_activation=False).json()["data"][0]["embedding"] == raw


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("endianness", ["little", "big"])
def test_base64_dtypes_and_byte_orders(server, dtype, endianness):
    want = np.array(
        post(server, input=TEXTS[1], encoding_format="float").json()["data"][0]["embedding"]
    )
    body = dict(input=TEXTS[1], encoding_format="base64", embed_dtype=dtype, endianness=endianness)
    raw = base64.b64decode(post(server, **body).json()["data"][0]["embedding"])
    order = "<" if endianness == "little" else ">"
    if dtype == "bfloat16":  # the top half of a float32
        got = (np.frombuffer(raw, f"{order}u2").astype(np.uint32) << 16).view(np.float32)
    else:
        got = np.frombuffer(raw, f"{order}f{4 if dtype == 'float32' else 2}")
    tol = {"float32": 0, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": "hi", "dimensions": 10}, "dimensions"),
        ({"input": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "hi", "normalize": True, "use_activation": False}, "normalize"),
        ({"input": "hi", "messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"input": "hi", "priority": 3}, "priority"),
        ({"input": "hi", "pooling": "mean"}, "pooling"),
        ({"input": "hi", "encoding_format": "bytes"}, None),
    ],
)
def test_bad_requests_name_the_field(server, body, param):
    r = post(server, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


def test_too_long_input_says_to_truncate(server, tokenizer):
    info = httpx.get(f"{server}/v1/models").json()["data"][0]
    long = [1] * (info["max_model_len"] + 1)
    r = post(server, input=long)
    assert r.status_code == 400 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    assert post(server, input=long, truncate_prompt_tokens=-1).status_code == 200


def test_generation_beside_embeddings_is_untouched(server, client, hf_model, eos_ids):
    def chat():
        extra = {"return_token_ids": True}
        return client.chat.completions.create(
            model="m",
            messages=ask("Name three rivers."),
            temperature=0,
            max_tokens=24,
            extra_body=extra,
        ).model_dump()

    with ThreadPoolExecutor(4) as pool:
        chats = [pool.submit(chat) for _ in range(2)]
        vectors = [pool.submit(client.embeddings.create, model="m", input=TEXTS) for _ in range(4)]
        first = vectors[0].result().data
        assert all(v.result().data == first for v in vectors)  # the same passes, in turn
        for c in chats:  # batched with each other, between embedding passes: transformers' tokens
            r = c.result()
            tokens = r["choices"][0]["token_ids"]
            greedy_divergence(hf_model, r["prompt_token_ids"], tokens, eos_ids)
    metrics = httpx.get(f"{server}/metrics").text
    values = {
        l.split()[0]: float(l.split()[1])
        for l in metrics.splitlines()
        if l.startswith("minillm_kv")
    }
    assert values["minillm_kv_cache_free_blocks"] == values["minillm_kv_cache_total_blocks"]


def test_mean_pooling_from_the_pooler_config(random_llama):
    from minillm.engine.llm_engine import EngineConfig
    from minillm.server.api_server import build_app
    from minillm.server.async_engine import AsyncEngine

    path, hf = random_llama
    with pytest.raises(ValueError, match="pooling_type"):
        build_app(object(), pooler_config={"pooling_type": "CLS"})

    async def main():
        aeng = AsyncEngine(config=EngineConfig(model=str(path), dtype="float32"))
        app = build_app(aeng, pooler_config={"pooling_type": "MEAN", "normalize": False})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.post("/v1/embeddings", json={"input": [[5, 6, 7, 8]]})
        aeng.shutdown()
        return r.json()["data"][0]["embedding"]

    got = torch.tensor(asyncio.run(main()))
    want = reference(hf, [5, 6, 7, 8], "MEAN", normalize=False)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_the_cli_flag_parses(tmp_path):
    from minillm.cli import parser

    args = parser().parse_args(["serve", "--pooler-config", json.dumps({"pooling_type": "MEAN"})])
    assert args.pooler_config == {"pooling_type": "MEAN"}
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--pooler-config", "MEAN"])


def test_every_vllm_embedding_field_is_implemented_refused_or_inert():
    "vLLM's EmbeddingCompletionRequest and EmbeddingChatRequest fields (vLLM 0.11-0.13)."
    from minillm.server.embeddings import EMBEDDING_INERT, EMBEDDING_REFUSED, EmbeddingRequest

    vllm_fields = [
        *("model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens"),
        *("add_special_tokens", "priority", "request_id", "normalize", "embed_dtype"),
        *("endianness", "mm_processor_kwargs", "cache_salt", "messages"),
    ]
    tables = EmbeddingRequest.model_fields, EMBEDDING_REFUSED, EMBEDDING_INERT
    assert [f for f in vllm_fields if not any(f in t for t in tables)] == []
