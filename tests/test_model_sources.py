"""Where a model comes from, as vLLM takes it: hub ids through the hub's cache (offline too), a
stand-in hub on loopback for downloads, dummy weights in a config's shapes, and the command line
that names them (`minillm serve MODEL`, `--load-format`, vLLM's `bench` commands)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import TINY_DECODER
from test_hybrid_models import GEMMA3
from test_linear_attention import QWEN3_5
from test_moe import QWEN3_MOE
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from minillm.bench.offline import hf_greedy
from minillm.bench.random_models import random_model_dir, word_tokenizer
from minillm.cli import main, parser, take_model_tag
from minillm.llm import LLM
from minillm.loader import ModelLoadError, dummy_state_dict, resolve_model_path
from minillm.sampling import SamplingParams

LLAMA = TINY_DECODER | dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    intermediate_size=96,
    num_hidden_layers=2,
    num_key_value_heads=2,
)
ARCHITECTURES = {"llama": LLAMA, "qwen3_5": QWEN3_5, "qwen3_moe": QWEN3_MOE, "gemma3": GEMMA3}
PROMPTS = [[5, 9, 33, 100, 7], [40, 41, 42, 300, 2, 2, 17]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def config_dir(path, fields: dict):
    "A model directory without weights: its config, generation config and a word tokenizer."
    return random_model_dir(path, fields, weights=False)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_dummy_weights_equal_transformers_given_the_same(arch, tmp_path):
    "No weight file: minillm's dummy weights, given to transformers too, give the same tokens."
    path = config_dir(tmp_path, ARCHITECTURES[arch])
    llm = LLM(str(path), load_format="dummy", dtype="float32", attention_backend="torch")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(dummy_state_dict(path), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    refs = [hf_greedy(hf.eval(), p, GREEDY.max_tokens) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in outs] == refs


def test_dummy_weights_are_seeded_by_name(tmp_path):
    "The same config, the same weights in any call; tensors of one shape differ (no copied layers)."
    path = config_dir(tmp_path, LLAMA)
    a, b = dummy_state_dict(path), dummy_state_dict(path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    q0, q1 = (
        a["model.layers.0.self_attn.q_proj.weight"],
        a["model.layers.1.self_attn.q_proj.weight"],
    )
    assert not torch.equal(q0, q1) and q0.abs().max() <= 1e-3


def test_load_formats_refused_by_name(tmp_path):
    path = config_dir(tmp_path, LLAMA)
    with pytest.raises(ValueError, match="load_format='pt' is not supported"):
        LLM(str(path), load_format="pt")
    with pytest.raises(ValueError, match="quantization='gguf'.*dummy"):
        LLM(str(path), load_format="dummy", quantization="gguf")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors weights.*'dummy'"):
        LLM(str(path))  # weights are needed unless they are dummy
    with pytest.raises(ModelLoadError, match="revision='v1' names a commit of a hub repository"):
        LLM(str(path), revision="v1", load_format="dummy")


def test_dummy_weights_quantized_on_load(tmp_path):
    "int8 quantizes the dummy weights as it would a checkpoint's."
    path = config_dir(tmp_path, LLAMA)
    llm = LLM(str(path), load_format="dummy", quantization="int8", dtype="float32")
    out = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache laid out as huggingface_hub lays it: models--org--tiny/snapshots/<commit>/ with
    refs/main naming the commit; and the tokens transformers gives for the model."""
    root = tmp_path_factory.mktemp("hub")
    src = random_model_dir(tmp_path_factory.mktemp("tiny"), LLAMA, seed=3)
    snapshot = root / "models--org--tiny" / "snapshots" / COMMIT
    shutil.copytree(src, snapshot)
    (root / "models--org--tiny" / "refs").mkdir()
    (root / "models--org--tiny" / "refs" / "main").write_text(COMMIT)
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    return root, [hf_greedy(hf, p, GREEDY.max_tokens) for p in PROMPTS]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    "`code` in a fresh interpreter (huggingface_hub reads its environment when imported)."
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=full,
    )


HUB_RUN = """
import json, sys
from minillm.llm import LLM
from minillm.loader import ModelLoadError
from minillm.sampling import SamplingParams

model, revision = sys.argv[1], (sys.argv[2] or None)
greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
try:
    llm = LLM(model, revision=revision, dtype="float32", attention_backend="torch")
except ModelLoadError as e:
    print(json.dumps({"error": str(e)}))
else:
    outs = llm.generate(%r, greedy, use_tqdm=False)
    print(json.dumps({"name": llm.engine.model_name, "path": str(llm.model_path),
                      "tokens": [o.outputs[0].token_ids for o in outs]}))
""" % (PROMPTS,)


def hub_run(root, model: str, revision: str = "", **env) -> dict:
    code = HUB_RUN.replace("sys.argv[1]", repr(model)).replace("sys.argv[2]", repr(revision))
    r = run_python(code, **{"HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_hub_id_from_the_cache_offline(hub_cache):
    "A cached hub id loads offline, at its main branch or at a commit, under its id as its name."
    root, refs = hub_cache
    for revision in ("", COMMIT):
        got = hub_run(root, "org/tiny", revision)
        assert got["tokens"] == refs and got["name"] == "org/tiny", got
        assert got["path"].endswith(f"models--org--tiny/snapshots/{COMMIT}")


def test_hub_id_offline_and_not_cached_says_what_to_do(hub_cache):
    root, _ = hub_cache
    error = hub_run(root, "org/absent")["error"]
    assert "'org/absent' is not in the hub cache" in error and "HF_HUB_OFFLINE" in error
    assert "hf download org/absent" in error
    error = hub_run(root, "org/tiny", "v9")["error"]
    assert "'org/tiny' at revision 'v9'" in error


def test_a_missing_local_path_says_it_does_not_exist(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(str(tmp_path / "absent"))


def test_serve_takes_the_model_first():
    "`minillm serve MODEL` as vLLM takes it; --model may repeat it, never contradict it."
    args = parser().parse_args(["serve", "org/tiny", "--port", "9"])
    take_model_tag(args)
    assert args.model == "org/tiny"
    args = parser().parse_args(["serve", "org/tiny", "--model", "org/tiny"])
    take_model_tag(args)
    assert args.model == "org/tiny"
    args = parser().parse_args(["serve", "org/tiny", "--model", "org/other"])
    with pytest.raises(ValueError, match="two models given"):
        take_model_tag(args)
    args = parser().parse_args(["serve", "--model", "org/other", "--load-format", "dummy"])
    take_model_tag(args)
    assert args.model == "org/other" and args.load_format == "dummy"


def test_vllm_bench_throughput_and_latency(tmp_path, capsys):
    "vLLM's flags, summary lines and result keys, on dummy weights."
    path = config_dir(tmp_path / "m", LLAMA)
    out = tmp_path / "t.json"
    flags = ["--model", str(path), "--load-format", "dummy", "--dtype", "float32"]
    main(
        ["bench", "throughput", *flags, "--dataset-name", "random", "--num-prompts", "6"]
        + ["--random-input-len", "20", "--random-output-len", "5", "--random-range-ratio", "0.5"]
        + ["--seed", "3", "--output-json", str(out)]
    )
    r = json.loads(out.read_text())
    keys = {"elapsed_time", "num_requests", "total_num_tokens", "requests_per_second"}
    assert keys | {"tokens_per_second"} <= set(r) and r["num_requests"] == 6
    assert 6 * 3 <= r["total_num_output_tokens"] <= 6 * 8  # 5 tokens, give or take half
    text = capsys.readouterr().out
    assert (
        "requests/s," in text
        and f"Total num output tokens:  {r['total_num_output_tokens']}" in text
    )
    # and chapter 17's floor: what the run's steps must read, at this machine's bandwidth
    assert "Floor: " in text and r["floor_output_tokens_per_second"] > r["output_tokens_per_second"]
    out = tmp_path / "l.json"
    main(
        ["bench", "latency", *flags, "--input-len", "8", "--output-len", "4", "--batch-size", "2"]
        + ["--num-iters-warmup", "1", "--num-iters", "3", "--output-json", str(out)]
    )
    r = json.loads(out.read_text())
    assert len(r["latencies"]) == 3 and set(r["percentiles"]) == {
        "10",
        "25",
        "50",
        "75",
        "90",
        "99",
    }
    text = capsys.readouterr().out
    assert "Avg latency:" in text and "Floor: " in text
    assert 0 < r["floor_seconds"] < r["avg_latency"]  # no run reads less than its floor


def test_vllm_random_dataset_draws_as_vllm(tokenizer):
    "Lengths in vLLM's interval, consecutive ids from an offset, the same for the same seed."
    from minillm.bench.vllm_bench import random_dataset

    reqs = random_dataset(tokenizer, 50, 100, 20, range_ratio=0.25, seed=1, prefix_len=4)
    special = tokenizer.num_special_tokens_to_add()
    assert all(4 + 75 - special <= len(p) <= 4 + 125 for p, _ in reqs)
    assert all(15 <= n <= 25 for _, n in reqs)
    assert len({tuple(p[:4]) for p, _ in reqs}) == 1  # the shared prefix
    vocab = tokenizer.vocab_size
    assert all((b - a) % vocab == 1 for p, _ in reqs for a, b in zip(p[4:], p[5:]))
    assert reqs == random_dataset(tokenizer, 50, 100, 20, range_ratio=0.25, seed=1, prefix_len=4)
    with pytest.raises(ValueError, match="range-ratio"):
        random_dataset(tokenizer, 5, 10, 5, range_ratio=1.0)
    with pytest.raises(SystemExit, match="'sharegpt'"):
        main(["bench", "throughput", "--dataset-name", "sharegpt"])


class StandInHub:
    """The hub's HTTP API for one repository, served on loopback: enough of it for
    `snapshot_download` (the revision, the file tree, each file by commit). It logs what it
    serves."""

    def __init__(self, repo: str, files: dict[str, bytes], commit: str = COMMIT):
        import hashlib
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hub, self.served = self, []
        oids = {name: hashlib.sha1(data).hexdigest() for name, data in files.items()}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, body: bytes, headers: dict):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                api = f"/api/models/{repo}"
                if path in (f"{api}/revision/main", f"{api}/revision/{commit}"):
                    siblings = [{"rfilename": n} for n in files]
                    body = {"id": repo, "sha": commit, "siblings": siblings}
                    return self.reply(200, json.dumps(body).encode(), {})
                if path.startswith(f"{api}/revision/"):
                    err = {"X-Error-Code": "RevisionNotFound"}
                    return self.reply(404, b'{"error": "Invalid rev id"}', err)
                if path.startswith(f"{api}/tree/{commit}"):
                    tree = [
                        {"type": "file", "path": n, "size": len(d), "oid": oids[n]}
                        for n, d in files.items()
                    ]
                    return self.reply(200, json.dumps(tree).encode(), {})
                prefix = f"/{repo}/resolve/{commit}/"
                if path.startswith(prefix) and path[len(prefix) :] in files:
                    name = path[len(prefix) :]
                    hub.served.append((self.command, name))
                    headers = {"X-Repo-Commit": commit, "ETag": f'"{oids[name]}"'}
                    return self.reply(200, files[name], headers)
                hub.served.append((self.command, path))
                return self.reply(404, b'{"error": "Repository not found"}', {})

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_a_hub_id_downloads_only_what_the_engine_reads(hub_cache, tmp_path):
    "From a stand-in hub on loopback (HF_ENDPOINT), never a real network."
    root, refs = hub_cache
    snapshot = root / "models--org--tiny" / "snapshots" / COMMIT
    files = {p.name: p.read_bytes() for p in snapshot.iterdir()}
    files |= {"pytorch_model.bin": b"unread", "model-q4.gguf": b"unread", "README.md": b"# tiny"}
    hub = StandInHub("org/tiny", files)
    try:
        env = dict(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")
        cache = tmp_path / "cache"
        got = hub_run(cache, "org/tiny", **env)
        assert got["tokens"] == refs and got["name"] == "org/tiny", got
        fetched = {name for _, name in hub.served}
        assert "model.safetensors" in fetched and "config.json" in fetched
        assert not fetched & {"pytorch_model.bin", "model-q4.gguf", "README.md"}, hub.served
        # the download is cached: offline, the same model
        assert hub_run(cache, "org/tiny", HF_HUB_OFFLINE="1")["tokens"] == refs
        error = hub_run(tmp_path / "other", "org/tiny", "v9", **env)["error"]
        assert "revision 'v9'" in error and "no such revision" in error
    finally:
        hub.close()


def test_generation_config_gives_the_defaults_a_request_leaves_unset(tmp_path):
    "vLLM's --generation-config auto: the model's sampling defaults; a request's own values win."
    from minillm.server.protocol import CompletionRequest, ServerLimits

    path = config_dir(tmp_path, LLAMA)
    sampling = dict(temperature=0.0, top_k=20, top_p=0.8, repetition_penalty=1.1)
    GenerationConfig(eos_token_id=1, pad_token_id=0, do_sample=True, **sampling).save_pretrained(
        path
    )
    llm = LLM(str(path), load_format="dummy", dtype="float32")
    assert llm.engine.sampling_defaults == sampling
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_k, params.repetition_penalty) == (0.0, 20, 1.1)
    out = llm.generate(PROMPTS[:1], use_tqdm=False)[0].outputs[0].token_ids  # the defaults: greedy
    explicit = SamplingParams(max_tokens=16, **sampling)
    assert out == llm.generate(PROMPTS[:1], explicit, use_tqdm=False)[0].outputs[0].token_ids
    body = CompletionRequest(prompt="t5", temperature=0.7)
    params = body.sampling_params(16, ServerLimits(), llm.engine.sampling_defaults)
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 20, 0.8)
    assert params.repetition_penalty == 1.1
    vllm = LLM(str(path), load_format="dummy", generation_config="vllm")
    assert vllm.engine.sampling_defaults == {} and vllm.get_default_sampling_params().top_k == -1
    with pytest.raises(ValueError, match="generation_config='nowhere'"):
        LLM(str(path), load_format="dummy", generation_config="nowhere")


def test_what_minillm_does_not_load_is_refused_by_name(tmp_path):
    "Pre-quantized checkpoints, LoRA adapters: an error that names them, never a silent load."
    path = config_dir(tmp_path, LLAMA | {"quantization_config": {"quant_method": "awq", "bits": 4}})
    with pytest.raises(ModelLoadError, match="pre-quantized checkpoint.*'awq'"):
        LLM(str(path), load_format="dummy")
    llm = LLM(str(config_dir(tmp_path / "plain", LLAMA)), load_format="dummy")
    with pytest.raises(ValueError, match="lora_request: minillm serves no LoRA adapters"):
        llm.generate(PROMPTS, GREEDY, lora_request=object())
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--enable-lora"])


def multimodal_dir(path, arch: str) -> tuple:
    "A tiny random multimodal checkpoint (a vision tower beside the language model) on disk."
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    if arch == "qwen3_5":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4)
        vision |= dict(out_hidden_size=64, temporal_patch_size=2, spatial_merge_size=2)
        text = {k: v for k, v in QWEN3_5.items() if k != "architectures"}
        model = Qwen3_5ForConditionalGeneration(
            Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
        )
    else:
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
        vision |= dict(num_attention_heads=2, image_size=28, patch_size=14)
        text = {k: v for k, v in GEMMA3.items() if k != "architectures"}
        config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
        model = Gemma3ForConditionalGeneration(config)
    model.eval().save_pretrained(path)
    GenerationConfig(eos_token_id=1, pad_token_id=0).save_pretrained(path)
    word_tokenizer(text["vocab_size"]).save_pretrained(path)
    return path, model


@pytest.mark.parametrize("arch", ["qwen3_5", "gemma3"])
def test_a_multimodal_checkpoint_serves_its_language_model(arch, tmp_path):
    "Qwen3.5's and Gemma 3's released form: the language model's greedy tokens, as transformers'."
    path, hf = multimodal_dir(tmp_path, arch)
    refs = [hf_greedy(hf, p, GREEDY.max_tokens) for p in PROMPTS]
    llm = LLM(str(path), dtype="float32", attention_backend="torch")
    assert llm.engine.model.config.architecture.endswith("ForCausalLM")
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == refs
