#!/usr/bin/env bash
# The GPU evidence for the notes, in steps that each fit in a few minutes on one H100/H200 host:
#   LLAMA_BIN=DIR OUT=DIR bash benchmarks/gpu_evidence.sh STEP…
# STEP: model (synthesize the 35B-A3B-shaped Q4_K stand-in), table (placement grid → replay table),
#       knobs (two tables of secondary knobs at 10 placements: ubatch x type_k x threads; pattern x load mode x ubatch),
#       knobs4 (a third, never seen by the search: ubatch x type_k x threads x load mode at 10 placements, 160 rows,
#       ~20 minutes: run it again until it reports every row),
#       repack (a fourth, never seen by the search: weight repacking x flash attention x K cache at 10 placements,
#       80 rows, ~10 minutes),
#       partial (a fifth: part of one more layer's FFN in RAM (partial_experts 0/1/2) x threads at 18 placements
#       around the 8, 12 and 16 GiB boundaries, 108 rows, ~13 minutes),
#       partialprocs (partial's placements around the boundaries again at 16 threads, in 3 processes per configuration
#       (make_table.py --processes), 135 rows, ~15 minutes on an H200: no lucky process sets the target),
#       partialkv (a ninth, never seen by the search: partial's placements next to the 12 and 16 GiB boundaries x
#       threads 8/16 x K cache f16/q8_0, in 2 processes per configuration, 96 rows, ~10 minutes on an H200),
#       wholelayers (a sixth: whole layers in RAM (n_gpu_layers 20/28/36/99) x expert layers in RAM (0-40 in steps of
#       8, the last layers'), 24 rows, ~4 minutes: the memory model's predictions for the combination, and whether it
#       is dominated),
#       spread (a seventh, never seen by the search: the last or a spread of layers' experts in RAM x ubatch 256/1024
#       x threads 8/16 at 9 placements around the 8, 12 and 16 GiB boundaries, 72 rows, ~8 minutes),
#       threads (a tenth, never seen by the search: threads 4-16 in steps of 2 at the last 18 and 28 layers' experts
#       in RAM, in 2 processes per configuration, 28 rows, ~5 minutes: how a real host's threads curve bends, which no
#       earlier table could say with two thread counts),
#       vsfit (autoinfer's recommendation vs llama-fit-params at 8, 12 and 16 GiB, interleaved; BUDGETS, TRIALS,
#       SWEEP_WALL_S (seconds of search per sweep, 300) and ROUNDS set the run),
#       servermem (each budget's recommendation in $VSFIT_JSON, a vs_fit.py result: its peak in llama-bench, in the
#       printed llama-server and in the server's default slots, interleaved; benchmarks/server_memory.py),
#       hostknobs (each budget's recommendation in $VSFIT_JSON against its variants in the CPU thread pool's knobs
#       the campaigns leave at their defaults: --poll, --cpu-strict, --prio, and 14 threads; interleaved,
#       benchmarks/knob_variants.py),
#       hugepages (the host buffers of the weights in RAM at the 8 GiB placement: pinned, pageable, pageable on
#       transparent huge pages (huge_pages=1), mmap; ROUNDS rounds of fresh processes, ~100 s each on an H200,
#       benchmarks/huge_pages.py),
#       overhead (harness vs plain llama-bench), sweep (a short informed campaign within 8 GiB),
#       refengine (the reference engine's GPU tests, then benchmarks/refengine_bench.py: vs llama-bench on the
#       small and 35B models, all on the GPU and within 8 GiB),
#       refcontext (the reference engine in refengine-8gb.yaml's space (triton_chunk, lru), at a 32768-token serving
#       context, one process per budget_mib in REF_BUDGETS: its JSON line (torch's peaks, the device's memory in use
#       at its start and end beside the allocator's share, expert-cache hits) and NVML's memory.used every 100 ms;
#       benchmarks/refcontext_report.py prints the table),
#       contest (experiments/contest-8gb.yaml shortened: each contender CONTEST_TRIALS trials without its own
#       confirmation or drift anchor, then the interleaved final between llama.cpp's and the reference engine's best),
#       multigpu (two GPUs: the device tests, split modes and expert splits per GPU),
#       sweep2gpu (a short informed campaign on two GPUs within 8 GiB each),
#       workers2gpu (`autoinfer worker --gpus 0,1` on a throwaway PostgreSQL: one worker per GPU, one measurement
#       at a time; PG_BIN names the PostgreSQL bin folder, e.g. Debian's /usr/lib/postgresql/15/bin).
# LLAMA_BIN is a CUDA llama.cpp bin folder (`autoinfer build --cuda` makes one); OUT receives tables and logs.
# On a GPU host without network, benchmarks/bare_host.sh brings what these steps need and runs them.
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
    knobs)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b-knobs.csv" \
        --grid cpu_expert_layers=4-40+4 ubatch=512,2048 type_k=f16,q8_0 threads=8,16 \
        --fixed n_gpu_layers=99 placement=first flash_attn=on load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --max-minutes "${KNOB_MINUTES:-9}" --resume
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b-load.csv" \
        --grid placement=first,last cpu_expert_layers=4-40+4 load_mode=mmap,none ubatch=256,1024 \
        --fixed n_gpu_layers=99 flash_attn=on threads=12 type_k=f16 \
        --n-prompt 512 --n-gen 32 --repetitions 2 --max-minutes "${KNOB_MINUTES:-9}" --resume
      ;;
    knobs4)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b-four-knobs.csv" \
        --grid cpu_expert_layers=4-40+4 ubatch=512,2048 type_k=f16,q8_0 threads=8,16 load_mode=mmap,none \
        --fixed n_gpu_layers=99 placement=last flash_attn=on \
        --n-prompt 512 --n-gen 32 --repetitions 2 --seed 7 --max-minutes "${KNOB_MINUTES:-9}" --resume
      ;;
    repack)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b-repack.csv" \
        --grid cpu_expert_layers=4-40+4 repack=1,0 flash_attn=on,off type_k=f16,q8_0 \
        --fixed n_gpu_layers=99 placement=last threads=16 ubatch=512 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --seed 11 --max-minutes "${KNOB_MINUTES:-11}" --resume
      ;;
    partial)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h100-35b-partial.csv" \
        --grid cpu_expert_layers=5,6,7,8,9,10,15,16,17,18,19,20,25,26,27,28,29,30 partial_experts=0,1,2 threads=12,16 \
        --fixed n_gpu_layers=99 placement=last flash_attn=on ubatch=512 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --seed 13 --max-minutes "${KNOB_MINUTES:-14}" --resume
      ;;
    partialprocs)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h200-35b-partial-processes.csv" \
        --grid cpu_expert_layers=6,7,8,9,10,16,17,18,19,20,26,27,28,29,30 partial_experts=0,1,2 \
        --fixed n_gpu_layers=99 placement=last flash_attn=on ubatch=512 load_mode=mmap threads=16 \
        --n-prompt 512 --n-gen 32 --repetitions 2 --processes 3 --seed 19 --max-minutes "${KNOB_MINUTES:-16}" --resume
      ;;
    partialkv)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h200-35b-partial-kv.csv" \
        --grid cpu_expert_layers=7,8,9,17,18,19 partial_experts=0,2 threads=8,16 type_k=f16,q8_0 \
        --fixed n_gpu_layers=99 placement=last flash_attn=on ubatch=512 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --processes 2 --seed 23 --max-minutes "${KNOB_MINUTES:-13}" --resume
      ;;
    wholelayers)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h200-35b-whole-layers.csv" \
        --grid n_gpu_layers=20,28,36,99 cpu_expert_layers=0-40+8 \
        --fixed placement=last flash_attn=on threads=16 ubatch=512 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --seed 17 --max-minutes "${KNOB_MINUTES:-6}" --resume
      ;;
    spread)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/h200-35b-spread.csv" \
        --grid cpu_expert_layers=7,8,9,17,18,19,27,28,29 placement=last,even ubatch=256,1024 threads=8,16 \
        --fixed n_gpu_layers=99 flash_attn=on type_k=f16 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --seed 19 --max-minutes "${KNOB_MINUTES:-10}" --resume
      ;;
    threads)
      python3 benchmarks/make_table.py --model "$BIG" --out "$OUT/gpu-35b-threads.csv" \
        --grid cpu_expert_layers=18,28 threads=4,6,8,10,12,14,16 \
        --fixed n_gpu_layers=99 placement=last flash_attn=on ubatch=512 type_k=f16 load_mode=mmap \
        --n-prompt 512 --n-gen 32 --repetitions 2 --processes 2 --seed 29 --max-minutes "${KNOB_MINUTES:-5}" --resume
      ;;
    vsfit)
      python3 benchmarks/vs_fit.py --model "$BIG" --budgets "${BUDGETS:-8192,12288,16384}" --trials "${TRIALS:-16}" \
        --sweep-wall-s "${SWEEP_WALL_S:-300}" --rounds "${ROUNDS:-5}" --out "$OUT/vs-fit-h100.md"
      ;;
    servermem)  # BUDGETS: which entries, in this order
      for budget in ${BUDGETS:-8192 12288 16384}; do
        echo "--- $budget MiB"
        python3 benchmarks/server_memory.py "${VSFIT_JSON:-benchmarks/results/vs-fit-h100-45f764b.json}" \
          --budget "$budget" --rounds "${ROUNDS:-3}"
      done
      ;;
    hostknobs)  # BUDGETS: which entries, in this order; VARY: the variants, as knob_variants.py's --vary flags
      for budget in ${BUDGETS:-8192}; do
        echo "--- $budget MiB"
        # shellcheck disable=SC2086  # VARY is a list of flags
        python3 benchmarks/knob_variants.py "${VSFIT_JSON:-benchmarks/results/vs-fit-h100-45f764b.json}" \
          --budget "$budget" ${VARY:---vary poll=0,100 --vary cpu_strict=1 --vary prio=2 --vary threads=14} \
          --rounds "${ROUNDS:-5}"
      done
      ;;
    hugepages)
      python3 benchmarks/huge_pages.py --llama-bin "$LLAMA_BIN" --model "$BIG" --rounds "${ROUNDS:-5}" \
        --out "$OUT/huge-pages.jsonl"
      python3 benchmarks/huge_pages.py --summary "$OUT/huge-pages.jsonl"
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
    refengine)  # LLAMA_BUDGET_ARGS: llama-bench flags of the best llama.cpp configuration within 8 GiB
      python3 -m pytest -q -p no:cacheprovider -m gpu tests/refengine/test_graphs.py \
        tests/refengine/test_quant_engine.py 2>&1 | tee "$OUT/refengine-gpu-tests.txt"
      python3 benchmarks/refengine_bench.py --out "$OUT/refengine" $([ -f "$BIG" ] && echo --model-35b "$BIG") \
        ${LLAMA_BUDGET_ARGS:+--llama-budget-args "$LLAMA_BUDGET_ARGS"}
      ;;
    refcontext)  # the reference engine at the serving context: its peaks per budget_mib in REF_BUDGETS
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits > "$OUT/refcontext-idle.txt"
      for budget in ${REF_BUDGETS:-5632 6656 7680}; do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/refcontext-nvml-$budget.txt" &
        sampler=$!
        rc=0
        python3 -m autoinfer.refengine.worker --model "$BIG" --device cuda --dtype bf16 --weights gguf --moe fused \
          --gdn triton_chunk --norm triton --budget-mib "$budget" --cache-policy lru --graphs on --prefetch 0 \
          --max-context 32768 --n-prompt 512 --n-gen 64 > "$OUT/refcontext-$budget.json" \
          2> "$OUT/refcontext-$budget.err" || rc=$?
        kill "$sampler" || true
        echo "budget_mib $budget rc $rc nvml peak $(sort -n "$OUT/refcontext-nvml-$budget.txt" | tail -1) MiB"
      done
      ;;
    contest)
      mkdir -p "$MODELS/contest"
      for campaign in qwen35moe-8gb refengine-8gb; do
        sed -e "s|^model:.*|model: $BIG|" -e "s|^  trials: .*|  trials: ${CONTEST_TRIALS:-6}|" \
          -e "s|^confirm:.*|confirm: {enabled: false}|" "experiments/$campaign.yaml" > "$MODELS/contest/$campaign.yaml"
        echo "drift: {every: null}" >> "$MODELS/contest/$campaign.yaml"
      done
      sed -e "s|^confirm:.*|confirm: {rounds: ${CONTEST_ROUNDS:-3}, max_rounds: 5, precision: 0.03}|" \
        experiments/contest-8gb.yaml > "$MODELS/contest/contest-8gb.yaml"
      export AUTOINFER_RESULTS="$MODELS/contest-results" COLUMNS=200  # its trial folders stay on the host
      # a failed deployment check exits 1 after the final: the statuses and the database below still say it all
      ai sweep "$MODELS/contest/contest-8gb.yaml" --quiet 2>&1 | tee "$OUT/contest.log" || echo "contest sweep rc $?"
      ai status --study qwen35moe-8gb > "$OUT/contest-llama-status.txt" 2>&1
      ai status --study refengine-8gb > "$OUT/contest-refengine-status.txt" 2>&1
      ai status --study contest-8gb > "$OUT/contest-status.txt" 2>&1
      ai export --format bench > "$OUT/contest-winner.sh"
      cp "$AUTOINFER_RESULTS/autoinfer.db" "$OUT/contest.db"
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
    workers2gpu)
      : "${PG_BIN:?set PG_BIN to a PostgreSQL bin folder (initdb, pg_ctl)}"
      PGROOT=$(mktemp -d /tmp/autoinfer-pg-XXXX); PGPORT=55432
      as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u autoinfer-pg -- "$@"; else "$@"; fi; }
      [ "$(id -u)" != 0 ] || id autoinfer-pg >/dev/null 2>&1 || useradd --system autoinfer-pg
      [ "$(id -u)" != 0 ] || chown autoinfer-pg "$PGROOT"
      as_pg "$PG_BIN/initdb" -D "$PGROOT/data" -A trust -U autoinfer --no-sync -E UTF8 >/dev/null
      printf "port = $PGPORT\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '$PGROOT'\nfsync = off\n" \
        >> "$PGROOT/data/postgresql.conf"
      as_pg "$PG_BIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/server.log" -w start >/dev/null
      URL="postgresql://autoinfer@127.0.0.1:$PGPORT/postgres"
      cat > "$MODELS/workers-2gpu.yaml" <<YAML
name: workers-2gpu
engine: llama-bench
model: $SMALL
space: {n_gpu_layers: 99, threads: [8, 16], ubatch: [256, 512], flash_attn: ["on", "off"]}
budget: {trials: 12}
measure: {n_prompt: 512, n_gen: 64, repetitions: 3, timeout_s: 120}
idle: {policy: "off"}
sampler: {name: random, seed: 0}
confirm: {top_k: 2, rounds: 4}
YAML
      export AUTOINFER_RESULTS="$MODELS/results" AUTOINFER_HOST_LOCK="$MODELS/host.lock"
      ai worker "$MODELS/workers-2gpu.yaml" --study workers-2gpu --storage "$URL" --gpus 0,1 | tee "$OUT/workers-2gpu.log"
      python3 benchmarks/worker_trials.py --study workers-2gpu --storage "$URL" | tee "$OUT/workers-2gpu.md"
      as_pg "$PG_BIN/pg_ctl" -D "$PGROOT/data" -m fast -w stop >/dev/null
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
