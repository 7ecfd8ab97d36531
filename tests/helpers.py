"""Shared by the tests: transformers' greedy generation as the reference (chapter 7c's
`hf_greedy`), and a comparison that allows a divergence only where its top two logits nearly tie."""

import torch

from minillm.bench.offline import hf_greedy  # noqa: F401


def hf_reference(hf, prompt: list[int], steps: int):
    "transformers' greedy tokens and its scores (logits) at each step."
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=steps,
        pad_token_id=0,
        eos_token_id=None,
        output_scores=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(prompt) :].tolist(), [s[0].float() for s in out.scores]


def assert_equal_except_near_ties(outs, hf, prompts, steps: int | None = None) -> int:
    "Tokens equal transformers' up to a divergence at a near-tie (top two within 1e-4); counted."
    near_ties = 0
    for o, p in zip(outs, prompts):
        ref, scores = hf_reference(hf, p, steps or len(o.token_ids))
        i = next((i for i, (a, b) in enumerate(zip(o.token_ids, ref)) if a != b), None)
        if i is None:
            continue
        gap = float(scores[i][ref[i]] - scores[i][o.token_ids[i]])
        assert 0 <= gap <= 1e-4 * float(scores[i].abs().max()), (i, gap, o.token_ids, ref)
        near_ties += 1
    print(f"{near_ties} of {len(prompts)} sequences diverged at a near-tie")
    return near_ties
