"""A grammar no token of the vocabulary can continue is the request's own error: a 400 that says
so (or, streamed, an error event), never a 500, and the engine goes on serving. Found on a GPU on
2026-12-04 (a random-weight model with a word-level tokenizer answered 500 "token 0 breaks the
request's grammar"); there, sampling an all-masked row would have been a device-side assert that
stops the engine. The word-level tokenizer spells only its words ("t0", "t1", ...), joined by
nothing: "yes" cannot start, and "t5 t6" dead-ends after "t5"."""

import json

import httpx
import pytest
from helpers import minillm_serve

from minillm import LLM, SamplingParams
from minillm.engine.structured_output import GrammarDeadEnd, GuidedDecodingParams


def test_offline_a_dead_start_is_refused_and_a_dead_end_fails_alone(random_llama):
    llm = LLM(str(random_llama[0]), dtype="float32", num_kv_blocks=32)
    dead = GuidedDecodingParams(choice=["yes", "no"])
    with pytest.raises(GrammarDeadEnd, match="cannot spell"):
        llm.generate([[3, 4, 5]], SamplingParams(guided_decoding=dead), use_tqdm=False)
    ends = SamplingParams(
        temperature=0, max_tokens=5, guided_decoding=GuidedDecodingParams(choice=["t5 t6"])
    )
    plain = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    cut, other = llm.generate([[3, 4, 5]] * 2, [ends, plain], use_tqdm=False)
    assert cut.finish_reason == "error" and "after 1 tokens" in cut.error
    assert cut.token_ids == llm.engine.tokenizer.encode("t5", add_special_tokens=False)
    assert other.finish_reason == "length" and len(other.token_ids) == 5
    assert llm.engine.block_manager.num_free_blocks == 32  # nothing leaked


@pytest.fixture(scope="module")
def server(random_llama, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with minillm_serve(random_llama[0], log, "--served-model-name", "m") as (base, _):
        yield base


def complete(server, choice, **body) -> httpx.Response:
    body = {"model": "m", "prompt": "t3 t4", "max_tokens": 5, "temperature": 0} | body
    body["structured_outputs"] = {"choice": choice}
    return httpx.post(f"{server}/v1/completions", json=body, timeout=120)


def test_served_dead_grammars_are_400s_and_the_engine_goes_on(server):
    for choice in (["yes", "no"], ["t5 t6"]):  # no first token; no token after the first
        r = complete(server, choice)
        assert r.status_code == 400, r.text
        assert "cannot spell" in r.json()["error"]["message"]
    with httpx.stream(
        "POST",
        f"{server}/v1/completions",
        json={
            "model": "m",
            "prompt": "t3 t4",
            "max_tokens": 5,
            "temperature": 0,
            "stream": True,
            "structured_outputs": {"choice": ["t5 t6"]},
        },
        timeout=120,
    ) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert "cannot spell" in events[-1]["error"]["message"] and events[-1]["error"]["code"] == 400
    assert complete(server, ["t5", "t7"]).json()["choices"][0]["text"].strip() in ("t5", "t7")
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def test_a_draft_that_leads_nowhere_is_not_allowed_where_it_was_drafted():
    """Speculation (chapter 12): the rows after each draft come from the grammar after it; a draft
    after which no token may come is forbidden in its own row, so the target cannot accept it."""
    import xgrammar as xgr

    from minillm.bench.random_models import word_tokenizer
    from minillm.engine.structured_output import StructuredOutputManager

    manager = StructuredOutputManager(word_tokenizer(64), 64, [1])

    def allowed(bitmask, row):
        return [t for t in range(64) if (int(bitmask[row, t // 32]) >> (t % 32)) & 1]

    grammar = manager.grammar(GuidedDecodingParams(choice=["t5 t6", "t7"]))  # t5: a dead end
    bitmask = xgr.allocate_token_bitmask(3, 64)
    assert grammar.fill_bitmask(bitmask, 0, [5, 6]) == 1 and allowed(bitmask, 0) == [7]
    only = manager.grammar(GuidedDecodingParams(choice=["t5 t6"]))  # nothing else: the request's
    with pytest.raises(GrammarDeadEnd, match="cannot spell"):
        only.fill_bitmask(xgr.allocate_token_bitmask(3, 64), 0, [5])
