#!/usr/bin/env bash
# The GPU evidence for the notes, in steps that each fit in a few minutes on one H100/H200 host:
#   LLAMA_BIN=DIR OUT=DIR bash benchmarks/gpu_evidence.sh STEP…
# STEP: model (synthesize the 35B-A3B-shaped Q4_K stand-in), table (placement grid → replay table),
#       overhead (harness vs plain llama-bench), sweep (a short informed campaign within 8 GiB),
#       refengine (reference engine vs llama-bench on the small and 35B models),
#       multigpu (two GPUs: the device tests, split modes and expert splits per GPU),
#       sweep2gpu (a short informed campaign on two GPUs within 8 GiB each).
# LLAMA_BIN is a CUDA llama.cpp bin folder (`autoinfer build --cuda` makes one); OUT receives tables and logs.
set -euo pipefail
: "${LLAMA_BIN:?set LLAMA_BIN to a CUDA llama.cpp bin folder}" "${OUT:?set OUT to an output folder}"
export AUTOINFER_LLAMA_BIN="$LLAMA_BIN" PYTHONUNBUFFERED=1
MODELS=${MODELS:-/tmp/autoinfer-models}
BIG="$MODELS/qwen35moe-35b-a3b-Q4_K.gguf"
SMALL="$MODELS/qwen35moe-small-Q8_0.gguf"
ai() { python3 -m autoinfer.cli "$@"; }
mkdir -p "$MODELS" "$OUT"

for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
    model)
      [ -f "$BIG" ] || ai model synth "$BIG" --preset 35b-a3b --qtype Q4_K
      [ -f "$SMALL" ] || ai model synth "$SMALL" --preset small --qtype Q8_0
      ;;
    table)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b.csv" \
        --grid n_gpu_layers=99 placement=first,last,even cpu_expert_layers=0-40+8 \
        --fixed flash_attn=on threads=16 ubatch=512 --n-prompt 512 --n-gen 64 --max-minutes 6 --resume
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b.csv" \
        --grid n_gpu_layers=20,28,36 placement=first cpu_expert_layers=0 \
        --fixed flash_attn=on threads=16 ubatch=512 --n-prompt 512 --n-gen 64 --resume
      ;;
    overhead)
      python3 benchmarks/overhead.py --model "$BIG" --llama-bin "$LLAMA_BIN" --ngl 99 --ncmoe 0,30 --threads 16 \
        --n-prompt 512 --n-gen 64 --repetitions 5 --pairs 3 --out "$OUT/overhead-h100.json"
      ;;
    sweep)
      sed -e "s|^model:.*|model: $BIG|" -e "s|^  trials: .*|  trials: 8|" -e "s|^  wall_s: .*|  wall_s: 300|" \
        experiments/qwen35moe-8gb.yaml > "$MODELS/qwen35moe-8gb-short.yaml"
      export AUTOINFER_RESULTS="$MODELS/results"
      ai sweep "$MODELS/qwen35moe-8gb-short.yaml" --study h100-8gb
      ai status --study h100-8gb
      ai export --study h100-8gb --format server
      cp "$AUTOINFER_RESULTS/autoinfer.db" "$OUT/h100-8gb.db"
      ;;
    refengine)
      python3 benchmarks/refengine_bench.py --model "$SMALL" --device cuda --dtype bf16 --out "$OUT/refengine"
      python3 benchmarks/refengine_bench.py --model "$BIG" --device cuda --dtype bf16 --budget-mib 16384 \
        --prefetch --out "$OUT/refengine"
      ;;
    multigpu)
      python3 -m pytest -q -p no:cacheprovider tests/worker/test_multi_gpu_device.py 2>&1 | tee "$OUT/multi-gpu-tests.txt"
      python3 benchmarks/make_table.py --model "$BIG" --n-prompt 512 --n-gen 64 --repetitions 3 \
        --out "$OUT/2gpu-35b-experts.csv" --grid tensor_split=1/1,2/1 expert_split=layers,1/1,2/1 \
        --fixed n_gpu_layers=99 placement=last cpu_expert_layers=24 flash_attn=on threads=16 ubatch=512
      ;;
    sweep2gpu)
      sed -e "s|^model:.*|model: $BIG|" -e "s|^  trials: .*|  trials: 8|" -e "s|^  wall_s: .*|  wall_s: 240|" \
        experiments/qwen35moe-8gb.yaml > "$MODELS/qwen35moe-2x8gb.yaml"
      export AUTOINFER_RESULTS="$MODELS/results"
      ai sweep "$MODELS/qwen35moe-2x8gb.yaml" --study 2gpu-8gb --quiet
      ai status --study 2gpu-8gb
      ai export --study 2gpu-8gb --format server
      cp "$AUTOINFER_RESULTS/autoinfer.db" "$OUT/2gpu-8gb.db"
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
