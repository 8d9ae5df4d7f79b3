#!/usr/bin/env bash
# The reference engine's GPU benchmark from a bare device host (no network), in one command:
#   OUT=DIR bash benchmarks/gpu_refengine.sh [benchmarks/refengine_bench.py arguments…]
# Brought along in the ignored folder .carry/: whl/ (wheels of gguf, pyyaml, tqdm, filelock, nvidia-ml-py, psutil,
# rich, markdown-it-py, mdurl, pygments) and either llama-cuda.tar.xz.part-* (a CUDA build of llama.cpp packed by
# `gpu_host.sh pack`) or llama-src.tar.xz (the llama.cpp source tree as `autoinfer build` keeps it under the cache).
# With only the source, llama.cpp is built at low priority beside the benchmark (so pass parts that need no
# llama-bench) and packed into $OUT for the next run. The 35B-A3B stand-in is synthesized on first use.
# TESTS: pytest paths run first with -m gpu (the kernels and graphs against their references on this GPU).
set -uo pipefail
: "${OUT:?set OUT to an output folder}"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
export WHEELS=.carry/whl LLAMA_SRC=.carry/llama-src.tar.xz PACK_IN=.carry PACK_OUT="$OUT" XZ_OPT=-T0
# shellcheck source=benchmarks/gpu_host.sh
source benchmarks/gpu_host.sh deps || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS 2>&1 | tee "$OUT/gpu-tests.txt" | tail -25
fi
builder=""
if ls .carry/llama-cuda.tar.xz.part-* >/dev/null 2>&1; then
  source benchmarks/gpu_host.sh unpack || exit 1
else
  source benchmarks/gpu_host.sh source || exit 1
  (nice -n 19 python3 -c "from autoinfer.llama.build import build; build(cuda=True, cuda_arch='90')" \
     >/tmp/llama-build.log 2>&1 && source benchmarks/gpu_host.sh pack) &
  builder=$!
fi
LLAMA_BIN=${AUTOINFER_LLAMA_BIN:-} python3 benchmarks/refengine_bench.py --out "$OUT/refengine" "$@" 2>&1 \
  | tee "$OUT/bench.log"
rm -rf "$OUT/refengine/traces"
if [ -n "$builder" ]; then
  wait "$builder" || { echo "llama.cpp build failed"; tail -30 /tmp/llama-build.log; }
  ls -la "$OUT"
fi
