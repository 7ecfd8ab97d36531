"Shared by the tests: transformers' greedy generation as the reference, random paged batches."
import collections, torch
from minillm.block_manager import BlockManager, Sequence
from minillm.paged_attention import PagedKVCache, build_flat_batch

def hf_greedy(hf_model, prompt_ids, max_new_tokens, eos_token_ids=None) -> list[int]:
    """transformers' greedy tokens after `prompt_ids`. With eos_token_ids=None it generates exactly
    max_new_tokens, through EOS, as minillm does with ignore_eos. The attention mask is explicit:
    without it transformers guesses padding from the pad id, which is <|im_end|> in SmolLM2."""
    gc = hf_model.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = eos_token_ids
    try:
        out = hf_model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0)
    finally:
        gc.eos_token_id = saved
    return out[0, len(prompt_ids):].tolist()

def random_batch(cases, H, Hkv, D, block_size, seed=0, dtype=torch.float32):
    "Sequences with `cached` tokens already in a shuffled paged pool and `new` tokens to attend."
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + n) // block_size) for c, n in cases) + 3
    pool, bm = PagedKVCache(1, num_blocks, block_size, Hkv, D, dtype), BlockManager(num_blocks, block_size)
    bm.empty = collections.deque(torch.randperm(num_blocks, generator=g).tolist())
    seqs, full = [], []
    for i, (cached, new) in enumerate(cases):
        seq = Sequence(i, [0] * (cached + new)); bm.allocate(seq, cached + new)
        k, v = (torch.randn(cached + new, Hkv, D, generator=g).to(dtype) for _ in range(2))
        if cached:
            pos = torch.arange(cached)
            pool.write(0, k[:cached], v[:cached], torch.tensor(seq.block_table)[pos // block_size] * block_size + pos % block_size)
        seq.num_computed_tokens = cached
        seqs.append(seq); full.append((k, v))
    batch = build_flat_batch(seqs, [n for _, n in cases], block_size)
    q = torch.randn(len(batch.input_ids), H, D, generator=g).to(dtype)
    new_k = torch.cat([k[c:] for (k, _), (c, _) in zip(full, cases)])
    new_v = torch.cat([v[c:] for (_, v), (c, _) in zip(full, cases)])
    return pool, batch, q, new_k, new_v, full
