#!/usr/bin/env bash
# gpu_evidence.sh on a bare GPU host without network, in one command, from files brought along in .carry/ (ignored):
#   bash benchmarks/bare_host.sh pack                       # here, with network: fills .carry/
#   STEPS="vsfit threads" bash benchmarks/bare_host.sh run  # there, from the repository root
# pack: .carry/whl (wheels, for the host's Python 3.12, of the dependencies its image lacks: optuna, alembic, Mako,
#       colorlog, sqlalchemy, pydantic and its parts, gguf, typing_extensions, transformers and what it imports, at the
#       versions installed here) and
#       .carry/llama-src.tar.xz (the pinned llama.cpp source as `autoinfer build` keeps it, trimmed to the build's
#       inputs, ~8 MB).
# run:  the wheels, the source and a CUDA build (gpu_host.sh deps source build, ~5 minutes on 16 cores) with the 35B
#       stand-in synthesized beside it, then each of STEPS as its own gpu_evidence.sh run into EVIDENCE_OUT
#       (/tmp/ev), a line "step S rc N" after each and "evidence rc 0" at the end. The host's GPU, CPU model and flags
#       (AVX-512, AMX) go to host.txt there first: results of hosts of one kind differ, so each table names its host.
#       Not OUT: a run started in the background outlives the command that started it, and a folder that command's
#       runner collects may go read-only under it (a contest's database did, mid-sweep).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OUT=${EVIDENCE_OUT:-/tmp/ev}
case "${1:-}" in
  pack)
    mkdir -p .carry/whl
    names=(optuna alembic mako colorlog sqlalchemy pydantic pydantic-core annotated-types typing-inspection gguf
           typing-extensions
           transformers huggingface-hub tokenizers safetensors regex tqdm hf-xet httpx2 httpcore2 h11 anyio idna
           fsspec kernels tomlkit truststore shellingham annotated-doc)  # transformers: the generate command's tokenizer
    pins=()
    for name in "${names[@]}"; do
      version=$(python3 -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
      [ -n "$version" ] || { echo "$name is not installed here: pip install -e . first" >&2; exit 2; }
      pins+=("$name==$version")
    done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .carry/whl "${pins[@]}" || exit 1
    tree=$(python3 -c "from autoinfer.llama.build import pinned_source; print(pinned_source())") || exit 1
    parts=$(python3 -c "from autoinfer.llama.build import _SOURCE_DIRS; print(' '.join(_SOURCE_DIRS))")
    src=$(dirname "$(dirname "$(dirname "$tree")")")  # the cache's src/, which gpu_host.sh source unpacks into
    rel=${tree#"$src"/}
    # shellcheck disable=SC2086  # parts is a list of names
    tar -C "$src" -cf - $(for p in $parts; do [ -e "$tree/$p" ] && echo "$rel/$p"; done) | xz -T0 -6 \
      > .carry/llama-src.tar.xz || exit 1
    du -sh .carry/whl .carry/llama-src.tar.xz
    ;;
  run)
    export WHEELS=.carry/whl LLAMA_SRC=.carry/llama-src.tar.xz
    mkdir -p "$OUT"
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket"
      grep -o -w -E "avx512f|amx_tile|avx2" /proc/cpuinfo | sort | uniq -c; } > "$OUT/host.txt" 2>&1
    cat "$OUT/host.txt"
    # shellcheck source=benchmarks/gpu_host.sh
    source benchmarks/gpu_host.sh deps source || { echo "evidence rc setup"; exit 1; }
    (LLAMA_BIN=none bash benchmarks/gpu_evidence.sh model > "$OUT/model.log" 2>&1) &
    synth=$!
    # shellcheck source=benchmarks/gpu_host.sh
    source benchmarks/gpu_host.sh build > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo "evidence rc build"; exit 1; }
    wait "$synth" || { tail -5 "$OUT/model.log"; echo "evidence rc model"; exit 1; }
    echo "setup done $(date -u +%H:%M:%S)"
    for step in ${STEPS:?set STEPS to gpu_evidence.sh steps}; do
      LLAMA_BIN=$AUTOINFER_LLAMA_BIN bash benchmarks/gpu_evidence.sh "$step"
      echo "step $step rc $?"
    done
    echo "evidence rc 0"
    ;;
  *) echo "usage: bash benchmarks/bare_host.sh pack|run (STEPS=... for run)" >&2; exit 2 ;;
esac
