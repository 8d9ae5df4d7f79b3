#!/usr/bin/env bash
# Make a GPU host without network ready for the GPU benchmarks, from files brought along:
#   source benchmarks/gpu_host.sh STEP…      (sourced: the exported PYTHONPATH and AUTOINFER_* stay set)
# STEP: deps     install the wheels in $WHEELS (pip --no-index) into $SITE and put it and the repository on PYTHONPATH
#       source   unpack $LLAMA_SRC (a tarball of the pinned llama-cpp-python sdist's vendor/llama.cpp tree, as
#                `autoinfer build` keeps it under the cache) into the cache, so no download is needed; trim it to
#                the build's inputs (autoinfer.llama.build._SOURCE_DIRS), not further: tools/ui runs scripts/*.cmake
#       build    `autoinfer build --cuda` (cached per commit and flags; smoke-run on this GPU)
#       pack     the CUDA build folder as $PACK_OUT/llama-cuda.tar.xz.part-* (15 MiB parts)
#       unpack   a build packed by `pack` ($PACK_IN/llama-cuda.tar.xz.part-*) into the cache
# Afterwards AUTOINFER_LLAMA_BIN names the CUDA build's bin folder.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${AUTOINFER_CACHE:-$HOME/.cache/autoinfer}
SITE=${SITE:-/tmp/autoinfer-site}
export AUTOINFER_CACHE=$CACHE PYTHONUNBUFFERED=1

_cuda_build() { ls -d "$CACHE"/llama/*-cuda* 2>/dev/null | grep -v '/\.tmp-' | head -1; }

for step in "$@"; do
  echo "=== gpu_host $step $(date -u +%H:%M:%S)"
  case "$step" in
    deps)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${WHEELS:?set WHEELS to a folder of wheels}"/*.whl || return 1
      export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
      ;;
    source)
      mkdir -p "$CACHE/src" && tar -xJf "${LLAMA_SRC:?set LLAMA_SRC to the source tarball}" -C "$CACHE/src" || return 1
      ;;
    build)
      python3 -m autoinfer.cli build --cuda --cuda-arch "${CUDA_ARCH:-90}" || return 1
      ;;
    pack)
      mkdir -p "${PACK_OUT:?set PACK_OUT}"
      build=$(_cuda_build); [ -n "$build" ] || { echo "no CUDA build to pack" >&2; return 1; }
      tar -C "$CACHE/llama" -cJf - "$(basename "$build")" | split -b 15M - "$PACK_OUT/llama-cuda.tar.xz.part-"
      ;;
    unpack)
      mkdir -p "$CACHE/llama" && cat "${PACK_IN:?set PACK_IN}"/llama-cuda.tar.xz.part-* | tar -xJf - -C "$CACHE/llama" \
        || return 1
      ;;
    *) echo "unknown step $step" >&2; return 2 ;;
  esac
done
build=$(_cuda_build)
if [ -n "$build" ]; then export AUTOINFER_LLAMA_BIN="$build/bin"; fi
