"Properties of the batched sampler and of stop detection (no model needed except the tokenizer)."

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minillm.detokenizer import TextStream
from minillm.sampling import (
    SamplingParams,
    SamplingTensors,
    filtered_probs,
    make_generator,
    row_argmax,
    sample,
)

V = 64


def logits_for(seed):
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 3


@given(seed=st.integers(0, 10_000), k=st.integers(1, V))
def test_top_k_keeps_exactly_k(seed, k):
    assert int((filtered_probs(logits_for(seed), SamplingParams(top_k=k)) > 0).sum()) == k


@given(seed=st.integers(0, 10_000), p=st.floats(0.01, 0.99))
def test_top_p_keeps_smallest_set_reaching_p(seed, p):
    logits = logits_for(seed)
    kept = filtered_probs(logits, SamplingParams(top_p=p)) > 0
    probs = logits.softmax(-1).sort(descending=True).values
    n = int(kept.sum())
    assert probs[:n].sum() >= p - 1e-5 and (n == 1 or probs[: n - 1].sum() < p + 1e-5)
    assert torch.equal(
        kept, logits >= logits[kept].min()
    )  # the kept tokens are the most likely ones


@given(seed=st.integers(0, 10_000), min_p=st.floats(0.0, 1.0))
def test_min_p_threshold(seed, min_p):
    probs = logits_for(seed).softmax(-1)
    kept = filtered_probs(logits_for(seed), SamplingParams(min_p=min_p)) > 0
    assert torch.equal(kept, probs >= min_p * probs.max())


def test_near_zero_temperature_is_greedy():
    logits = torch.stack([logits_for(s) for s in range(16)])
    for t in (0.0, 1e-6, 1e-4):
        st_ = SamplingTensors.from_params([SamplingParams(temperature=t)] * 16, V)
        assert torch.equal(
            sample(logits, st_, [make_generator(i) for i in range(16)]), logits.argmax(-1)
        )


def test_samples_follow_the_distribution():
    logits = logits_for(0) / 3
    st_ = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * 20_000, V)
    tokens = sample(logits.expand(20_000, -1), st_)
    freq = torch.bincount(tokens, minlength=V).float() / 20_000
    assert (freq - logits.softmax(-1)).abs().max() < 0.02


def test_seeds_are_per_request():
    logits = (logits_for(1) / 3).expand(3, -1)  # flat enough that two seeds differ
    params = [SamplingParams(seed=11), SamplingParams(temperature=0.7), SamplingParams(seed=12)]

    def draw(ps):
        return torch.stack(
            [
                sample(
                    logits[: len(ps)],
                    SamplingTensors.from_params(ps, V),
                    [make_generator(p.seed) for p in ps],
                )
                for _ in range(50)
            ],
            1,
        )

    batch = draw(params)
    alone = draw([params[0]])
    assert torch.equal(batch[0], alone[0])
    assert not torch.equal(batch[0], batch[2])


def test_rows_keep_their_own_parameters():
    logits = logits_for(2).expand(2, -1)
    params = [SamplingParams(top_k=2, seed=1), SamplingParams(temperature=0)]
    st_ = SamplingTensors.from_params(params, V)
    gens = [make_generator(1), None]
    for _ in range(50):
        a, b = sample(logits, st_, gens).tolist()
        assert a in logits[0].topk(2).indices.tolist() and b == int(logits[0].argmax())


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-1),
        dict(top_p=0.0),
        dict(top_p=1.01),
        dict(top_k=-5),
        dict(max_tokens=0),
        dict(max_tokens=-1),
        dict(min_p=-0.1),
        dict(n=0),
        dict(seed=1.5),
        dict(temperature=None),
        dict(stop=[1]),
        dict(stop_token_ids=[-1]),
        dict(min_tokens=5, max_tokens=2),
        dict(temperature=1e300),
        dict(top_p=1e-46),
        dict(seed=2**64),
        dict(seed=-(2**63) - 1),
        dict(stop="\ud800"),
        dict(stop_token_ids=[2**63]),
    ],
)
def test_invalid_params_raise(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def feed(tokenizer, text, **kw):
    stream = TextStream(tokenizer, SamplingParams(max_tokens=1000, **kw))
    deltas = []
    for t in tokenizer(text).input_ids:
        deltas.append(stream.append(t))
        if stream.finished:
            break
    return stream, deltas


def test_stop_string_spanning_two_tokens(tokenizer):
    text = "Hello world. Goodbye world."
    ids = tokenizer(text).input_ids
    pieces = [tokenizer.decode([t]) for t in ids]
    # a stop string made of the end of one token and the start of the next
    i = next(i for i, p in enumerate(pieces[:-1]) if len(p) > 1 and len(pieces[i + 1]) > 1)
    stop = pieces[i][-1] + pieces[i + 1][:2]
    stream, deltas = feed(tokenizer, text, stop=[stop])
    assert stream.finish_reason == "stop" and stream.stop_reason == stop
    assert stream.text == text[: text.index(stop)] == "".join(deltas)
    stream, _ = feed(tokenizer, text, stop=[stop], include_stop_str_in_output=True)
    assert stream.text == text[: text.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(tokenizer):
    ids = tokenizer("a b c d e").input_ids
    stream = TextStream(
        tokenizer, SamplingParams(stop_token_ids=[ids[1]], min_tokens=0, max_tokens=10)
    )
    for t in ids[:2]:
        stream.append(t)
    assert stream.finish_reason == "stop" and stream.stop_reason == ids[1]
    stream = TextStream(
        tokenizer, SamplingParams(stop_token_ids=[ids[0]], min_tokens=2, max_tokens=10)
    )
    stream.append(ids[0])
    assert not stream.finished  # too early to stop


def test_extreme_but_valid_params_sample_sensibly():
    """top_k beyond the vocabulary (even beyond int64) means all; the smallest top_p keeps the most
    likely token."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [
        SamplingParams(top_k=2**70),
        SamplingParams(top_p=1.2e-38, seed=1),
        SamplingParams(temperature=3e38),
    ]
    st_ = SamplingTensors.from_params(params, 50)
    assert st_.top_k.tolist()[0] == 50
    for _ in range(20):
        tokens = sample(logits, st_, [None, make_generator(1), None])
        assert tokens[1] == logits[1].argmax() and ((0 <= tokens) & (tokens < 50)).all()
    assert torch.equal(
        filtered_probs(logits[1], params[1]) > 0, torch.arange(50) == logits[1].argmax()
    )


@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 9),
    width=st.one_of(st.integers(1, 1023), st.integers(1024, 5000)),  # torch's path, the blocks'
    levels=st.sampled_from([2, 5, 1000]),
    specials=st.integers(0, 6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_row_argmax_is_torchs_first_maximum(seed, rows, width, levels, specials, dtype):
    "Ties (few levels), NaNs, infinities, any width and dtype: the index torch's argmax gives."
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, width), generator=g).to(dtype)
    at = torch.randint(0, rows * width, (specials,), generator=g)
    values = torch.tensor([float("nan"), float("inf"), float("-inf")])[at % 3].to(dtype)
    x.view(-1)[at] = values
    assert torch.equal(row_argmax(x), x.argmax(-1))
    wider = torch.cat([x, x], 1)[:, :width]  # a view whose rows are not contiguous with each other
    assert torch.equal(row_argmax(wider), wider.argmax(-1))
