"""Chapter 8c: decode steps through CUDAGraphDecoder give transformers' tokens.

On a GPU the engine captures and replays real graphs; on CPU the same static buffers and padding
run without capture, under the Triton interpreter."""

import torch
from helpers import hf_greedy

from minillm import LLM, SamplingParams
from minillm.engine.cuda_graphs import CUDAGraphDecoder


def test_engine_decodes_through_graphs_and_equals_transformers(random_llama):
    path, hf = random_llama
    llm = LLM(
        str(path),
        attention_backend="triton",
        num_kv_blocks=64,
        max_num_seqs=4,
        max_model_len=256,
        dtype="float32",
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    engine = llm.engine
    if engine.runner.graphs is None:  # CPU: no capture, the same data path
        assert engine.config.enforce_eager and engine.runner.device.type == "cpu"
        engine.runner.graphs = CUDAGraphDecoder(
            engine.model, engine.runner.cache, 4, engine.max_model_len, capture=False
        )
    graphs, replays = engine.runner.graphs, []
    run = graphs.run
    graphs.run = lambda batch: replays.append(len(batch.input_ids)) or run(batch)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(100, 5000, (n,), generator=g).tolist() for n in (5, 17, 31, 2, 40, 9)]
    outs = llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 12) for p in prompts]
    assert {4, 2} <= set(replays), (
        "decode steps of batch 4 and, at the end, 2 (padded) went through the graphs"
    )
    assert engine.block_manager.num_free_blocks == 64
