"Shared by the tests: transformers' greedy generation as the reference."
import torch

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
