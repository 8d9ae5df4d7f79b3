"""Synthetic replay tables with random structure, for judging a search on tables it was not built on.

Each seed draws a model layout (layers, bytes per layer), a machine (bandwidths, thread scaling, whole-layer
cost), a memory slope and overhead, a knob space (which secondary knobs, which values), a random effect of every
knob value on tg and pp (on pp only for the knobs in DECODE_BLIND, none for PATTERN_ONLY), random pairwise
interactions and per-row noise; speeds follow the performance model's form (autoinfer.model.performance) and
peaks the memory model's terms (autoinfer.model.placement) with the random slopes. Not measurements: the search
must not be tuned on them, only judged.

A peak is a function of the configuration, as measured: rows of the H100 tables that differ only in threads or
load mode have the same peak to the MiB. (An earlier version added 20 MiB of noise per row, which made a
placement at the budget's edge fit or not by chance, for one knob combination and not its neighbour: nothing a
memory model can learn, and nothing llama.cpp does.) The speeds' noise is per row and per repetition; measured
rows scatter more (benchmarks/table_structure.py). Rows llama.cpp runs alike (a placement pattern with no layer's
experts in RAM, or every layer's: one command line) are one configuration listed under each name, with the first
name's measurement and noise-free speed. With a draw each, the best row of a table was often the luckiest of such
copies, a target only a search that measures the same command again could reach (synthetic-338 at 16 GiB: `first`
with no experts in RAM 6.6% over its noise-free value); and the pattern's random effect on the CPU-side time, meant
for which layers' experts sit in RAM, set their noise-free speeds up to 19% apart.
With slow processes planted (plant_slow_processes, its own random stream), a process of one knob value runs fast or
slow as a whole, as two threads on a 2-core host did: the noise a table of one process per row cannot show.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from autoinfer.engines.base import TrialConfig
from autoinfer.engines.replay import noise_free_path, shape_path
from autoinfer.model.memory import MemoryModel
from autoinfer.model.performance import PerformanceModel
from autoinfer.model.placement import command_key
from autoinfer.model.shape import ModelShape, TensorBytes

# Knobs with no effect of their own on decode speed: a decode step is one token, so the micro-batch size changes
# the prompt's speed and the compute buffer (memory, hence the placement), not the step (measured at a fixed
# placement: ubatch moved tg by +3.0 ± 3.6% and +0.9 ± 5.5%, benchmarks/table_structure.py).
DECODE_BLIND = ("ubatch",)
# Knobs that act only through the CPU-side time (cpu_pattern below): the placement pattern chooses which layers'
# experts sit in RAM, so with none there it changes nothing (the same tensors on the same devices), and a random
# effect of its own on every row would make identical configurations differ.
PATTERN_ONLY = ("placement",)


def random_shape(rng: np.random.Generator) -> ModelShape:
    """A qwen35moe-like layout: 24–48 layers, every 4th attention, experts of a random size (quantisation)."""
    n_layers = int(rng.choice([24, 32, 40, 48]))
    scale = float(rng.uniform(0.5, 1.3))  # ~Q2 … Q5 relative to Q4_K
    expert = [int(151e6 * scale), int(151e6 * scale), int(220e6 * scale)]
    tensors = [TensorBytes("token_embd.weight", None, "embeddings", int(286e6 * scale)),
               TensorBytes("output.weight", None, "output", int(286e6 * scale)),
               TensorBytes("output_norm.weight", None, "norm", 8192)]
    for i in range(n_layers):
        attention = (i + 1) % 4 == 0
        tensors += [TensorBytes(f"blk.{i}.attn_norm.weight", i, "norm", 8192),
                    TensorBytes(f"blk.{i}.attn_q.weight" if attention else f"blk.{i}.attn_qkv.weight", i,
                                "attention" if attention else "gdn", int(14e6 * scale)),
                    TensorBytes(f"blk.{i}.ffn_gate_inp.weight", i, "router", 2_097_152),
                    TensorBytes(f"blk.{i}.ffn_up_shexp.weight", i, "shared_expert", int(0.6e6 * scale)),
                    TensorBytes(f"blk.{i}.ffn_down_shexp.weight", i, "shared_expert", int(0.9e6 * scale))]
        tensors += [TensorBytes(f"blk.{i}.ffn_{p}_exps.weight", i, "routed_experts", n)
                    for p, n in zip(("up", "gate", "down"), expert)]
    return ModelShape(n_layers=n_layers, n_experts=256, n_experts_used=8, hidden=2048, vocab=248320, n_head=16,
                      n_head_kv=2, key_length=256, value_length=256, expert_ff=512,
                      attention_layers=tuple(i for i in range(n_layers) if (i + 1) % 4 == 0),
                      recurrent_state_bytes=4 * 32 * 128 * 128, tensors=tuple(tensors))


def random_space(rng: np.random.Generator, n_layers: int) -> dict[str, list]:
    """Placement axes plus a random subset of secondary knobs with random value sets."""
    step = int(rng.choice([2, 4])) if n_layers <= 32 else int(rng.choice([4, 5]))
    space = {"n_gpu_layers": [99] + sorted(rng.choice(np.arange(n_layers // 3, n_layers), 2, replace=False).tolist()),
             "placement": ["first", "last", "even"],
             "cpu_expert_layers": list(range(0, n_layers + 1, step))}
    if space["cpu_expert_layers"][-1] != n_layers:
        space["cpu_expert_layers"].append(n_layers)
    optional = {"threads": [[4, 8, 12, 16], [8, 16], [6, 12, 18, 24], [2, 4, 8]],
                "ubatch": [[128, 512, 2048], [256, 512, 1024], [512, 2048]],
                "type_k": [["f16", "q8_0"], ["f16", "q8_0", "q4_0"]],
                "load_mode": [["mmap", "none"]],
                "flash_attn": [["on", "off"]]}
    chosen = [k for k in optional if rng.random() < 0.75]
    while len(chosen) < 2:
        chosen = sorted(set(chosen) | {str(rng.choice(list(optional)))})
    for knob in chosen:
        options = optional[knob]
        space[knob] = options[int(rng.integers(len(options)))]
    return space


def _names(key: str | tuple[str, str]) -> tuple[str, ...]:
    """The knobs of an effect's key: one knob, or the pair of an interaction."""
    return (key,) if isinstance(key, str) else key


def synthetic_table(folder: Path, seed: int, slow_processes: bool = False) -> Path:
    """Write synthetic-<seed>.csv (+ .shape.json and .meta.json with the budgets it allows) into folder; with
    `slow_processes`, synthetic-<seed>-slow.csv, the same table with slow processes planted (plant_slow_processes)."""
    rng = np.random.default_rng(1000 + seed)
    shape = random_shape(rng)
    space = random_space(rng, shape.n_layers)
    knobs = [k for k in space if k not in ("n_gpu_layers", "cpu_expert_layers")]
    memory = MemoryModel(shape, "device")
    perf = PerformanceModel(shape)
    # the machine: bandwidths, thread scaling, whole-layer cost, memory slopes
    t0, cpu_s_gb, gpu_s_gb = 1 / rng.uniform(150, 400), 1 / rng.uniform(20, 90), 1 / rng.uniform(1500, 3500)
    whole_s = rng.uniform(0.4e-3, 2.0e-3)
    thread_k, thread_sat, thread_slow = rng.uniform(0.5, 4.0), rng.choice([6, 8, 12, 16]), rng.uniform(0.0, 0.4)
    slopes = {"weights": rng.uniform(0.98, 1.06), "cache": rng.uniform(0.8, 1.5), "compute": rng.uniform(0.5, 2.5),
              "offload_copy": rng.uniform(0.0, 1.2)}
    overhead = rng.uniform(200, 900)
    # random effects of knob values (log-scale), pattern effects on the CPU-side time, pairwise interactions
    random = [k for k in knobs if k not in PATTERN_ONLY]
    effects = {k: {str(v): rng.normal(0, rng.choice([0.01, 0.03, 0.06])) for v in space[k]} for k in random}
    cpu_pattern = {p: rng.uniform(0.85, 1.15) for p in space["placement"]}
    pairs = [tuple(p) for p in itertools.combinations(random, 2) if rng.random() < 0.4]
    inter = {(a, b): {(str(x), str(y)): rng.normal(0, 0.03) for x in space[a] for y in space[b]} for a, b in pairs}
    noise = rng.uniform(0.01, 0.04)
    rows, noise_free = [], []
    commands: dict[str, tuple[dict, dict]] = {}  # one measurement and one true speed per command line
    names = list(space)
    for values in itertools.product(*(space[n] for n in names)):
        params = dict(zip(names, values))
        config = TrialConfig.from_params({"model": "m", "n_prompt": 512, "n_gen": 64, **params})
        f = perf.features(config)
        threads = f.threads if "threads" in params else 8.0
        thread_factor = (1 + thread_k / threads) * (1 + thread_slow * max(0.0, threads - thread_sat) / thread_sat)
        t = (t0 + cpu_s_gb * f.cpu_gb * thread_factor * cpu_pattern[params["placement"]] + gpu_s_gb * f.gpu_gb
             + whole_s * f.cpu_layers)
        log_effect = {k: effects[k][str(params[k])] for k in random}
        log_effect.update({(a, b): inter[(a, b)][(str(params[a]), str(params[b]))] for a, b in pairs})
        tg = np.exp(sum(v for k, v in log_effect.items() if not set(DECODE_BLIND) & set(_names(k)))) / t
        ub = f.ubatch
        copy = (1.0 if params.get("load_mode", "none") == "none" else 4.0) / 25
        pp = np.exp(0.5 * sum(log_effect.values())) / (1 / 9000 + copy * f.cpu_total_gb / ub
                                                       + whole_s * f.cpu_layers / 20)
        parts = memory.predict(config).parts
        vram = sum(slopes[k] * parts[k] for k in slopes) + overhead  # a peak is deterministic (table_structure.py)
        tg_s = tg * np.exp(rng.normal(0, noise, 3)) * np.exp(rng.normal(0, noise))
        pp_s = pp * np.exp(rng.normal(0, 2 * noise, 3))
        measured = {"tg": float(np.median(tg_s)), "pp": float(np.median(pp_s)), "vram_mib": round(vram, 1),
                    "tg_samples": " ".join(f"{v:.3f}" for v in tg_s), "pp_samples": " ".join(f"{v:.2f}" for v in pp_s)}
        key = command_key(config, shape.n_layers)
        measured, free = commands.setdefault(key, (measured, {"tg": float(tg), "pp": float(pp)}))
        rows.append({**params, **measured})
        noise_free.append({**free, "command": key})
    df = pd.DataFrame(rows)
    sds = {"tg_process_sd": noise, "tg_repetition_sd": noise, "pp_process_sd": 0.0, "pp_repetition_sd": 2 * noise}
    free = pd.DataFrame(noise_free).assign(**sds)
    if slow_processes:  # its own stream: the table without them stays the one judged before
        df, free = plant_slow_processes(df, free, random, np.random.default_rng(5000 + seed))
    path = Path(folder) / (f"synthetic-{seed}-slow.csv" if slow_processes else f"synthetic-{seed}.csv")
    df.to_csv(path, index=False)
    free.drop(columns="command").to_csv(noise_free_path(path), index=False)  # fresh_noise draws from these
    shape_path(path).write_text(shape.to_json())
    low, high = df["vram_mib"].min(), df["vram_mib"].max()
    budgets = [b for b in (8192, 12288, 16384) if low < b < high]
    source = f"synthetic seed {seed}" + (", with slow processes" if slow_processes else "")
    path.with_suffix(".meta.json").write_text(pd.Series({"source": source,
                                                         "budgets_mib": budgets}).to_json())
    return path


def plant_slow_processes(df: pd.DataFrame, free: pd.DataFrame, knobs: list[str],
                         rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Processes of one knob value that run fast or slow as a whole, as two threads on a 2-core host did
    (benchmarks/results/cpu-small-threads.md: 0.62-1.30x one thread by the process, a row's repetitions agreeing).
    The knob is threads where the table has it, else a random one of `knobs`; the value the fastest noise-free row
    has, so the trap lies on the way to the answer. A process of it runs slow (tg and pp alike, by a factor of
    0.61-0.86) with a chance of 10-40%: the median process stays fast and the noise-free value is its speed. Each
    command line's one row (its process) is drawn slow or not with that chance; `free` gets `slow_share` and
    `slow_log` for fresh_noise's draws (autoinfer/engines/replay.py)."""
    knob = "threads" if "threads" in knobs else str(rng.choice(knobs))
    value = df.loc[free["tg"].idxmax(), knob]
    share, slow_log = float(rng.uniform(0.1, 0.4)), float(rng.uniform(0.15, 0.5))
    planted = (df[knob] == value).to_numpy()
    slow_commands = {c for c in sorted(set(free["command"][planted])) if rng.random() < share}
    slow = free["command"].isin(slow_commands).to_numpy()
    factor = np.exp(-slow_log)
    df = df.copy()
    for kind in ("tg", "pp"):
        df.loc[slow, kind] *= factor
        df.loc[slow, f"{kind}_samples"] = [" ".join(f"{float(v) * factor:.3f}" for v in samples.split())
                                           for samples in df.loc[slow, f"{kind}_samples"]]
    return df, free.assign(slow_share=np.where(planted, share, 0.0), slow_log=np.where(planted, slow_log, 0.0))
