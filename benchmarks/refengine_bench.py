"""The reference engine against llama.cpp on one GPU, from scratch, in one command (≤ 8 minutes on an H100):

    LLAMA_BIN=/path/to/llama.cpp/cuda/bin python3 benchmarks/refengine_bench.py --out $OUT/refengine

Parts, each in its own try block (a failure is recorded with its reason and the next part runs; results are
rewritten to <out>/refengine-bench.md and .json after every part, so a run cut short keeps what it measured).
They run in the order --parts gives; by default the targets first (env, gdn, 35b, budget), then gemv and small:

1. env      device, copy bandwidth (device to device, bytes read + written) and pinned host-to-device bandwidth.
2. gemv     the quantized GEMV kernels on the 35B-A3B decode shapes: GB/s against the copy bandwidth, default
            tiling and the best of a few others.
3. gdn      the chunked GDN prefill kernel (gdn: triton_chunk) against flash-linear-attention's
            chunk_gated_delta_rule on the model's shapes, and the decode kernel against its
            fused_recurrent_gated_delta_rule; errors against the naive recurrence. Needs the fla-core wheel.
4. small    the synthetic `small` preset (Q4_K): readable path, GGUF-block kernels, and those with the decode step as
            a CUDA graph; logits and greedy tokens against the readable path; tg/pp interleaved with llama-bench.
5. 35b      the synthetic 35B-A3B (Q4_K, 19.6 GB, written first): all on the GPU against llama-bench -ngl 99,
            interleaved rounds, ratio CIs, the fraction of the weight-bandwidth floor; then the same file under a
            device budget (--budget-mib, experts streamed from pinned host memory through the expert cache with
            prefetch) against llama-bench with --llama-budget-args (the best llama.cpp configuration autoinfer found
            for that budget: pass it), with hit rates and the measured device peak.
6. profile  one 35B decode step under torch.profiler (CUDA graph, eager, and under the budget): kernels a step, device
            busy time against the step's span, the costliest kernels by name and grid, copies and host waits.

A part whose estimated time no longer fits --time-limit is skipped and says so. llama-bench comes from LLAMA_BIN
(or --llama-bin); without one the llama.cpp columns are left out. Ratios are ours / llama.cpp: medians of all
samples of the interleaved rounds, 95% bootstrap intervals.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

# --- results ---------------------------------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    status: str = "pending"  # ok | failed | skipped
    reason: str = ""
    lines: list[str] = field(default_factory=list)  # markdown
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Report:
    out: Path
    limit_s: float
    started: float = field(default_factory=time.monotonic)
    parts: list[Part] = field(default_factory=list)
    header: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.limit_s - (time.monotonic() - self.started)

    def run(self, name: str, fn: Callable[[Part], None], need_s: float = 0.0) -> Part:
        """fn(part) fills the part; an exception fails it with the reason; no time left skips it."""
        part = Part(name)
        self.parts.append(part)
        if self.left() < need_s:
            part.status, part.reason = "skipped", f"needs ~{need_s:.0f} s, {max(self.left(), 0):.0f} s left"
        else:
            log(f"== {name} ({self.left():.0f} s left)")
            t0 = time.monotonic()
            try:
                fn(part)
                part.status = "ok"
            except Exception as exc:  # noqa: BLE001 — every failure is recorded, the next part runs
                part.status, part.reason = "failed", f"{type(exc).__name__}: {exc}"
                part.data["traceback"] = traceback.format_exc()
                log(part.data["traceback"])
            part.seconds = time.monotonic() - t0
        log(f"== {name}: {part.status} {part.reason}")
        self.write()
        return part

    def markdown(self) -> str:
        lines = ["# Reference engine vs llama.cpp", *self.header, ""]
        for p in self.parts:
            lines.append(f"## {p.name}: {p.status}" + (f" ({p.reason})" if p.reason else "")
                         + (f", {p.seconds:.0f} s" if p.seconds else ""))
            lines += [*p.lines, ""]
        return "\n".join(lines)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "refengine-bench.md").write_text(self.markdown() + "\n")
        (self.out / "refengine-bench.json").write_text(json.dumps(
            {"header": self.header, "parts": [dataclasses.asdict(p) for p in self.parts]}, indent=1, default=str))


def log(text: str) -> None:
    print(text, flush=True)


# --- statistics ------------------------------------------------------------------------------------------------


def ratio_ci(ours: list[float], theirs: list[float], n: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """median(ours) / median(theirs) with a 95% bootstrap interval (each side resampled on its own)."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    boot = np.median(rng.choice(a, (n, a.size)), axis=1) / np.median(rng.choice(b, (n, b.size)), axis=1)
    return float(np.median(a) / np.median(b)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def fmt_ratio(r: tuple[float, float, float]) -> str:
    return f"{r[0]:.2f} ({r[1]:.2f}–{r[2]:.2f})"


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- llama-bench -----------------------------------------------------------------------------------------------


def parse_llama_bench(stdout: str) -> dict[str, list[float]]:
    """pp and tg samples (tok/s) from `llama-bench -o json` output."""
    start = stdout.find("[")
    records = json.loads(stdout[start:]) if start >= 0 else []
    out: dict[str, list[float]] = {"pp": [], "tg": []}
    for rec in records:
        kind = "tg" if int(rec.get("n_gen", 0)) > 0 else "pp"
        out[kind] += [float(v) for v in rec.get("samples_ts") or [rec["avg_ts"]]]
    return out


def llama_bench(binary: Path, model: Path, args: list[str], n_prompt: int, n_gen: int, reps: int,
                timeout_s: float = 300) -> dict[str, list[float]]:
    argv = [str(binary), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-o", "json",
            *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return parse_llama_bench(proc.stdout)


def find_llama_bench(llama_bin: str | None) -> Path | None:
    folder = llama_bin or os.environ.get("LLAMA_BIN")
    if not folder:
        return None
    binary = Path(folder) / "llama-bench"
    if not binary.is_file():
        raise SystemExit(f"no llama-bench in {folder}: point --llama-bin / LLAMA_BIN at llama.cpp's bin folder")
    return binary


# --- our engine ------------------------------------------------------------------------------------------------


def engine_rounds(engines: dict[str, Any], model: Path, llama: Path | None, llama_args: list[str], rounds: int,
                  reps: int, n_prompt: int, n_gen: int, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """Interleaved rounds: each engine configuration, then llama-bench, `rounds` times. Samples per name."""
    from autoinfer.refengine.timing import measure, random_tokens

    samples: dict[str, dict[str, list[float]]] = {name: {"pp": [], "tg": []} for name in engines}
    if llama is not None:
        samples["llama.cpp"] = {"pp": [], "tg": []}
    for r in range(rounds):
        for name, engine in engines.items():
            got = measure(engine, n_prompt, n_gen, reps, random_tokens(engine.cfg.vocab, seed + r), warm_up=r == 0)
            samples[name]["pp"] += got.pp
            samples[name]["tg"] += got.tg
            log(f"  round {r + 1} {name}: tg {med(got.tg):.1f}, pp {med(got.pp):.0f} tok/s")
        if llama is not None:
            got = llama_bench(llama, model, llama_args, n_prompt, n_gen, reps)
            samples["llama.cpp"]["pp"] += got["pp"]
            samples["llama.cpp"]["tg"] += got["tg"]
            log(f"  round {r + 1} llama.cpp: tg {med(got['tg']):.1f}, pp {med(got['pp']):.0f} tok/s")
    return samples


def speed_table(samples: dict[str, dict[str, list[float]]], floor_tg: float | None = None) -> list[str]:
    lines = ["| configuration | tg tok/s (median, n) | pp tok/s | tg / llama.cpp (95% CI) | pp / llama.cpp (95% CI) |"
             + (" tg / floor |" if floor_tg else ""), "|---|---|---|---|---|" + ("---|" if floor_tg else "")]
    ref = samples.get("llama.cpp")
    for name, s in samples.items():
        tg_r = fmt_ratio(ratio_ci(s["tg"], ref["tg"])) if ref and ref["tg"] and s["tg"] and name != "llama.cpp" else ""
        pp_r = fmt_ratio(ratio_ci(s["pp"], ref["pp"])) if ref and ref["pp"] and s["pp"] and name != "llama.cpp" else ""
        floor = f" {med(s['tg']) / floor_tg:.1%} |" if floor_tg else ""
        lines.append(f"| {name} | {med(s['tg']):.1f} ({len(s['tg'])}) | {med(s['pp']):.0f} | {tg_r} | {pp_r} |{floor}")
    return lines


def compare_logits(engines: dict[str, Any], prompt: list[int], steps: int) -> list[str]:
    """Every configuration's logits and greedy tokens against the first one's, on one prompt and `steps` steps."""
    names = list(engines)
    ref_name = names[0]
    runs = {}
    for name in names:
        engine = engines[name]
        logits, state = engine.prefill(prompt)
        first = logits.float().clone()
        tokens = []
        for _ in range(steps):
            tokens.append(int(logits[-1].argmax()))
            logits = engine.decode(tokens[-1], state)
        runs[name] = (first, tokens)
    lines = ["| configuration | prefill logits rel. error vs " + ref_name + " | greedy tokens equal |", "|---|---|---|"]
    for name in names[1:]:
        a, b = runs[name][0], runs[ref_name][0]
        err = float((a - b).abs().max() / b.abs().max())
        same = sum(x == y for x, y in zip(runs[name][1], runs[ref_name][1]))
        lines.append(f"| {name} | {err:.1e} | {same}/{steps} |")
    return lines


def floor_tok_s(engine, bandwidth: float) -> tuple[float, int]:
    """Tokens/s if a decode step only read its weights at `bandwidth`: everything but the embedding table and the
    unused experts (the issue's floor; the GDN state adds ~4 MB read + write per layer on top)."""
    from autoinfer.refengine.bench import decode_bytes

    per_token = decode_bytes(engine.cfg, engine)
    return bandwidth / per_token, per_token


# --- parts -----------------------------------------------------------------------------------------------------


def part_env(part: Part, ctx: dict) -> None:
    import torch
    import triton
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bw = 2 * src.numel() / (do_bench(lambda: dst.copy_(src), rep=200) / 1e3)
    host = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    h2d = host.numel() / (do_bench(lambda: dev.copy_(host, non_blocking=True), rep=100) / 1e3)
    ctx["bandwidth"] = bw
    part.data.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                     copy_gb_s=bw / 1e9, h2d_pinned_gb_s=h2d / 1e9)
    part.lines += [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
                   f"device copy {bw / 1e9:.0f} GB/s (read + write), pinned host→device {h2d / 1e9:.1f} GB/s"]


def part_gemv(part: Part, ctx: dict) -> None:
    import torch

    from autoinfer.refengine.ops.quant.qweight import BLOCKS, from_gguf

    bw = ctx["bandwidth"]
    halves = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}

    def weight(qtype: str, shape: tuple[int, ...], seed: int = 1):
        rng = np.random.default_rng(seed)
        values, nbytes = BLOCKS[qtype]
        raw = rng.integers(0, 256, size=(int(np.prod(shape[:-1])), shape[-1] // values, nbytes), dtype=np.uint8)
        for off in halves[qtype]:
            raw[:, :, off:off + 2] = rng.uniform(0.001, 0.02, size=raw.shape[:2]).astype(np.float16)[..., None].view(
                np.uint8)
        return from_gguf(raw.reshape(*shape[:-1], -1), qtype, shape).to("cuda")

    part.lines += ["Each product timed inside a CUDA graph (no launch overhead from Python, as in the decode graph), "
                   "rotating over copies of the weights that together exceed the L2 cache.", "",
                   "| qtype | product | MiB read | default tiling µs | GB/s | of copy bw | best tiling | best µs | "
                   "best of copy bw |", "|---|---|---|---|---|---|---|---|---|"]
    search_until = time.monotonic() + ctx["gemv_search_s"]  # other tilings are tried for this long
    for qtype in ("Q4_K", "Q6_K", "Q8_0"):
        part.lines += gemv_rows(qtype, weight, bw, search_until)
        torch.cuda.empty_cache()
    part.lines.append("Other tilings tried for Q4_K only, while time was left; the best column is the default where "
                      "none won.")


def graph_us(calls: list[Callable[[], Any]]) -> float:
    """µs per call of `calls` (each once, in order) recorded as one CUDA graph and replayed."""
    import torch
    from triton.testing import do_bench

    for fn in calls[:2]:
        fn()  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    return do_bench(graph.replay, rep=60) * 1e3 / len(calls)


def gemv_rows(qtype: str, weight: Callable, bw: float, search_until: float) -> list[str]:
    """The 35B-A3B decode products in `qtype`: default tiling, and for Q4_K the best of GEMV_GRID."""
    import torch

    from autoinfer.refengine.ops.quant import gemv

    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    ids = torch.randperm(256, device="cuda")[:8]
    coef = torch.rand(8, device="cuda")
    h = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)

    def copies(shape: tuple[int, ...]) -> list:
        one = weight(qtype, shape)
        n = max(1, min(24, -(-256 * 2**20 // one.nbytes())))  # ≥ 256 MiB in all: past the 50 MB L2
        return [one] + [weight(qtype, shape, seed) for seed in range(2, n + 1)]

    lm = [weight(qtype, (248320, 2048))]
    q, z, out = copies((8192, 2048)), copies((4096, 2048)), copies((2048, 4096))
    sg, su, sd = copies((512, 2048)), copies((512, 2048)), copies((2048, 512))
    n_exp = max(2, min(len(q), 3))  # expert stacks are 150 MiB each: a few
    gate, up, down = ([weight(qtype, shape, seed) for seed in range(n_exp)] for shape in
                      ((256, 512, 2048), (256, 512, 2048), (256, 2048, 512)))
    cases = [("lm_head 248320×2048", lm[0].nbytes(), [lambda c, w=w: gemv.qgemv(x, w, config=c) for w in lm],
              (248320, 8, 1, False)),
             ("attn q / GDN qkv 8192×2048", q[0].nbytes(), [lambda c, w=w: gemv.qgemv(x, w, config=c) for w in q],
              (8192, 8, 1, False)),
             ("GDN z 4096×2048", z[0].nbytes(), [lambda c, w=w: gemv.qgemv(x, w, config=c) for w in z],
              (4096, 8, 1, False)),
             ("GDN out 2048×4096", out[0].nbytes(), [lambda c, w=w: gemv.qgemv(x2, w, config=c) for w in out],
              (2048, 16, 1, False)),
             ("shared gate+up (GLU) 512×2048", 2 * sg[0].nbytes(),
              [lambda c, g=g, u=u: gemv.qgemv(x, g, up=u, config=c) for g, u in zip(sg, su)], (512, 8, 1, True)),
             ("shared down 2048×512", sd[0].nbytes(), [lambda c, w=w: gemv.qgemv(h[:1], w, config=c) for w in sd],
              (2048, 2, 1, False)),
             ("8 experts gate+up (GLU)", 16 * gate[0][0].nbytes(),
              [lambda c, g=g, u=u: gemv.qgemv(x, g, ids, up=u, config=c) for g, u in zip(gate, up)], (512, 8, 8, True)),
             ("8 experts down, summed", 8 * down[0][0].nbytes(),
              [lambda c, w=w: gemv.qgemv(h, w, ids, coef, torch.float32, config=c) for w in down], (2048, 2, 8, False))]
    cases = cases[-2:] + cases[:-2]  # the routed experts first: the tiling search is cut off when its time is up
    lines = []
    for label, nbytes, fns, (rows, blocks, items, glu) in cases:
        scale = 8 if qtype == "Q8_0" else 1  # Q8_0 blocks hold 32 values, K-quant blocks 256
        default = gemv.default_config(qtype, rows, blocks * scale, items, glu)
        t_default = graph_us([lambda fn=fn: fn(default) for fn in fns])
        best = (t_default, default)
        for rows_per, nb, warps in GEMV_GRID if qtype == "Q4_K" else ():  # other tilings: the model's type
            cfg = gemv.GemvConfig(rows_per, nb, warps)
            tile = rows_per * nb * triton_items(items) * (2 if glu else 1)  # row-blocks a step decodes
            if cfg == default or not 8 <= tile <= 128 or nb > blocks or time.monotonic() > search_until:
                continue
            t = graph_us([lambda fn=fn: fn(cfg) for fn in fns])
            best = min(best, (t, cfg), key=lambda b: b[0])
        lines.append(f"| {qtype} | {label} | {nbytes / 2**20:.1f} | {t_default:.1f} | {nbytes / t_default / 1e3:.0f} | "
                     f"{nbytes / t_default * 1e6 / bw:.1%} | rows {best[1].rows}, blocks {best[1].blocks}, warps "
                     f"{best[1].warps} | {best[0]:.1f} | {nbytes / best[0] * 1e6 / bw:.1%} |")
        log(lines[-1])
    return lines


GEMV_GRID = [(rows, blocks, warps) for rows in (1, 2, 4, 8, 16, 32) for blocks in (1, 2, 4) for warps in (2, 4, 8)]


def triton_items(items: int) -> int:
    return 1 << (items - 1).bit_length()


def part_gdn(part: Part, ctx: dict) -> None:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from autoinfer.refengine.ops import gdn as gdn_ops

    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as exc:
        fla = None
        part.lines.append(f"flash-linear-attention not importable ({exc}): install the fla-core wheel for the "
                          "comparison; ours alone below")
    T, H, d = 512, 32, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = F.normalize(torch.randn(T, H, d, device="cuda", generator=gen), dim=-1) / d**0.5
    k = F.normalize(torch.randn(T, H, d, device="cuda", generator=gen), dim=-1)
    v = torch.randn(T, H, d, device="cuda", generator=gen)
    g = -torch.rand(T, H, device="cuda", generator=gen) * 2
    beta = torch.rand(T, H, device="cuda", generator=gen)
    s0 = torch.randn(H, d, d, device="cuda", generator=gen) * 0.1
    ref_out, ref_state = gdn_ops.get("naive")(q, k, v, g, beta, s0)

    def rel(a, b) -> float:
        return float((a.float() - b.float()).abs().max() / b.float().abs().max())

    runs: dict[str, Callable[[], Any]] = {"ours triton_chunk fp32": lambda: gdn_ops.get("triton_chunk")(
        q, k, v, g, beta, s0)}
    if fla is not None:
        part.lines.append(f"flash-linear-attention (fla-core) {getattr(fla, '__version__', '?')}")
        for dtype in (torch.float32, torch.bfloat16):
            def fla_chunk(dtype=dtype):
                o, s = chunk_gated_delta_rule(q[None].to(dtype), k[None].to(dtype), v[None].to(dtype), g[None],
                                              beta[None].to(dtype), scale=1.0, initial_state=s0[None],
                                              output_final_state=True)
                return o[0], s[0]
            runs[f"fla chunk_gated_delta_rule {str(dtype)[6:]}"] = fla_chunk
    times: dict[str, list[float]] = {name: [] for name in runs}
    errors = {}
    for name, fn in runs.items():
        out, state = fn()
        errors[name] = (rel(out, ref_out), rel(state, ref_state))
    for _ in range(5):  # interleaved rounds
        for name, fn in runs.items():
            times[name].append(do_bench(fn, rep=30) * 1e3)
    ours = times["ours triton_chunk fp32"]
    part.lines += [f"Prefill T={T}, {H} value heads (q, k repeated per value head as the engine does), "
                   f"dk = dv = {d}; 5 interleaved rounds of do_bench", "",
                   "| kernel | µs (median) | rel. error out / state vs naive | time / ours (95% CI) |",
                   "|---|---|---|---|"]
    for name in runs:
        part.lines.append(f"| {name} | {med(times[name]):.0f} | {errors[name][0]:.1e} / {errors[name][1]:.1e} | "
                          f"{fmt_ratio(ratio_ci(times[name], ours))} |")
    dec = {"ours fused_recurrent (T=1)": lambda: gdn_ops.get("fused_recurrent")(q[:1], k[:1], v[:1], g[:1],
                                                                               beta[:1], s0)}
    if fla is not None:
        dec["fla fused_recurrent_gated_delta_rule (T=1)"] = lambda: fused_recurrent_gated_delta_rule(
            q[None, :1], k[None, :1], v[None, :1], g[None, :1], beta[None, :1], scale=1.0, initial_state=s0[None],
            output_final_state=True)
    dec_times = {name: [do_bench(fn, rep=30) * 1e3 for _ in range(5)] for name, fn in dec.items()}
    for name, t in dec_times.items():
        part.lines.append(f"| {name} | {med(t):.1f} | | {fmt_ratio(ratio_ci(t, dec_times[next(iter(dec))]))} |")
    part.data.update(times_us=times, errors=errors, decode_times_us=dec_times)


def load_weights(model: Path, weights: str, pin: bool, dtype: str = "bf16", device: str = "cuda"):
    """(cfg, CPU weights) of a file; pin: routed experts straight into pinned memory (for the expert cache)."""
    from autoinfer.refengine.loader import load

    t0 = time.monotonic()
    loaded = load(model, dtype, decode_on=device, pin_experts=pin, keep_quant=weights == "gguf")
    log(f"  loaded {model.name} ({weights}{', experts pinned' if pin else ''}) in {time.monotonic() - t0:.0f} s")
    return loaded


def build_engines(loaded: dict[str, Any], configs: dict[str, dict], dtype: str = "bf16",
                  device: str = "cuda") -> dict[str, Any]:
    """One engine per configuration from loaded[weights] = (cfg, CPU weights). Configurations without an expert
    cache share one device copy of the weights (an engine does not copy tensors already on its device)."""
    from autoinfer.refengine.engine import ReferenceEngine
    from autoinfer.refengine.options import EngineOptions

    on_device: dict[str, Any] = {}
    engines = {}
    for name, knobs in configs.items():
        options = EngineOptions(device=device, dtype=dtype, **knobs)
        cfg, weights = loaded[options.weights]
        if options.budget_mib is None and not options.expert_slots:
            if options.weights not in on_device:
                on_device[options.weights] = weights.map(lambda _, t: t.to(device))
            weights = on_device[options.weights]
        engines[name] = ReferenceEngine(cfg, weights, options)
    return engines


FAST = dict(weights="gguf", moe="fused", gdn="triton_chunk", norm="triton")


def part_small(part: Part, ctx: dict) -> None:
    from autoinfer.model.synth import cached_model

    model = cached_model("small", "Q4_K")
    configs = {"readable (bf16 decoded, chunk, grouped)": dict(gdn="chunk", moe="grouped"),
               "GGUF blocks + Triton (graphs off)": dict(FAST),
               "GGUF blocks + Triton, CUDA graph": dict(FAST, graphs=True, max_context=1024)}
    engines = build_engines({w: load_weights(model, w, pin=False) for w in ("dense", "gguf")}, configs)
    prompt = list(range(5, 5 + 300))
    part.lines += ["Correctness (prompt of 300 tokens, 24 greedy steps):", "", *compare_logits(engines, prompt, 24), ""]
    samples = engine_rounds(engines, model, ctx["llama"], ["-ngl", "99", "-fa", "1"], ctx["rounds"], ctx["reps"],
                            512, 64)
    floor, per_token = floor_tok_s(engines[list(configs)[-1]], ctx["bandwidth"])
    part.lines += [f"{model.name}: tg64 / pp512, {ctx['rounds']} interleaved rounds × {ctx['reps']} repetitions; "
                   f"llama-bench -ngl 99 -fa 1; weight floor {floor:.0f} tok/s ({per_token / 2**20:.1f} MiB a token)",
                   "", *speed_table(samples, floor)]
    part.data["samples"] = samples


def part_35b(part: Part, ctx: dict) -> None:
    import torch

    from autoinfer.model.synth import cached_model

    t0 = time.monotonic()
    model = ctx["model_35b_path"] or cached_model("35b-a3b", "Q4_K")
    part.lines.append(f"{model} ready in {time.monotonic() - t0:.0f} s")
    ctx["model_35b"] = model
    # Experts pinned at load: the budget part's expert cache copies from these same host tensors.
    ctx["loaded_35b"] = loaded = load_weights(model, "gguf", pin=True)
    configs = {"GGUF blocks + Triton, CUDA graph": dict(FAST, graphs=True, max_context=1024),
               "GGUF blocks + Triton, CUDA graph, prefill in chunks of 64": dict(FAST, graphs=True, max_context=1024,
                                                                                 prefill_chunk=64),
               "GGUF blocks + Triton (graphs off)": dict(FAST)}
    engines = build_engines({"gguf": loaded}, configs)
    floor, per_token = floor_tok_s(engines[next(iter(configs))], ctx["bandwidth"])
    part.lines += ["Correctness (prompt of 64 tokens, 16 greedy steps, graphs vs no graphs):", "",
                   *compare_logits(engines, list(range(7, 71)), 16), ""]
    del engines["GGUF blocks + Triton (graphs off)"]  # timed on the small model; here the time goes to llama-bench
    samples = engine_rounds(engines, model, ctx["llama"], ["-ngl", "99", "-fa", "1"], ctx["rounds"], ctx["reps"],
                            512, 64)
    part.lines += [f"All on the GPU, tg64 / pp512, {ctx['rounds']} interleaved rounds × {ctx['reps']} repetitions; "
                   f"llama-bench -ngl 99 -fa 1; weight floor {floor:.0f} tok/s ({per_token / 2**30:.2f} GiB a token "
                   f"at {ctx['bandwidth'] / 1e12:.2f} TB/s)", "", *speed_table(samples, floor)]
    part.data.update(samples=samples, floor_tok_s=floor, bytes_per_token=per_token,
                     device_peak_mib=torch.cuda.max_memory_allocated() / 2**20)
    engines.clear()
    gc.collect()  # the engines' device tensors and graph pools go before the budget part measures its peak
    torch.cuda.empty_cache()


def part_budget(part: Part, ctx: dict) -> None:
    import torch

    from autoinfer.refengine.cache.experts import CacheStats
    from autoinfer.refengine.timing import random_tokens

    if "loaded_35b" not in ctx:
        raise RuntimeError("the 35B part did not load the model")
    model, budget = ctx["model_35b"], ctx["budget_mib"]
    torch.cuda.reset_peak_memory_stats()
    configs = {f"budget {budget:.0f} MiB, CUDA graph (device lookups)": dict(FAST, budget_mib=budget, graphs=True,
                                                                             max_context=1024),
               f"budget {budget:.0f} MiB, prefetch 1 (graphs off)": dict(FAST, budget_mib=budget, prefetch=1,
                                                                         max_context=1024)}
    engines = build_engines({"gguf": ctx["loaded_35b"]}, configs)
    plan = next(iter(engines.values())).stats()["device_plan"]
    part.lines.append("Device plan: " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in plan.items()))
    part.lines += ["Correctness (prompt of 64 tokens, 16 greedy steps):", "",
                   *compare_logits(dict(reversed(list(engines.items()))), list(range(7, 71)), 16), ""]
    timed = dict(list(engines.items())[:1])  # the graph against llama.cpp; both in the hit-rate pass below
    samples = engine_rounds(timed, model, ctx["llama"], ctx["llama_budget_args"], ctx["rounds"], ctx["reps"],
                            512, 64)
    part.lines += [f"Under {budget:.0f} MiB; llama-bench {' '.join(ctx['llama_budget_args'])}", "",
                   *speed_table(samples), "", "Decode alone (64 tokens after a 512-token prompt, counters reset):", "",
                   "| configuration | expert hit rate | prefetched | prefetch used | MiB copied a token |",
                   "|---|---|---|---|---|"]
    experts = {}
    for name, engine in engines.items():
        tokens = random_tokens(engine.cfg.vocab, 99)
        logits, state = engine.prefill(tokens(512))
        engine.experts.stats = CacheStats()
        for t in tokens(64):
            engine.decode(t, state)
        st = engine.experts.stats
        experts[name] = st.as_dict()
        hit = "all experts resident" if st.hit_rate is None else f"{st.hit_rate:.1%}"
        part.lines.append(f"| {name} | {hit} | {st.prefetched} | {st.prefetch_used} | "
                          f"{st.bytes_fetched / 64 / 2**20:.1f} |")
    peak = torch.cuda.max_memory_reserved() / 2**20
    part.lines += ["", f"torch's peak reserved device memory {peak:.0f} MiB with both engines built (the budget holds "
                   "per engine; the CUDA context adds ~500 MiB outside torch's count). Routing uniform over the "
                   f"experts would hit about slots / experts ({plan['experts_on_device'] / plan['n_experts']:.0%}); "
                   "a rate above that is this stand-in's routing repeating from token to token: a real model's "
                   "routing, hence its hit rate and budgeted speed, differs."]
    part.data.update(samples=samples, plan=plan, peak_reserved_mib=peak, experts=experts)


def trace_summary(path: Path, steps: int) -> dict[str, Any]:
    """Per decode step from a torch.profiler chrome trace: kernels (count, device time by name and grid), the time
    the device was busy against the span from first kernel to last, host→device copies and host waits."""
    events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    by_name: dict[str, list[float]] = {}
    busy, end = 0.0, float("-inf")
    for e in kernels:
        grid = "x".join(str(g) for g in (e.get("args", {}).get("grid") or []))
        name = e["name"].split("(")[0].split("<")[0].replace("void ", "")[-48:]
        by_name.setdefault(f"{name} [{grid}]", []).append(e["dur"])
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = (end - kernels[0]["ts"]) if kernels else 0.0
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    waits = [e for e in runtime if any(w in e["name"] for w in ("Synchronize", "cudaMemcpy(", "cudaMemcpy "))
             or e["name"] == "cudaMemcpy"]
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {"kernels": len(kernels) / steps, "busy_us": busy / steps, "span_us": span / steps,
            "copies": len(copies) / steps, "copy_us": sum(e["dur"] for e in copies) / steps,
            "host_waits": len(waits) / steps, "host_wait_us": sum(e["dur"] for e in waits) / steps,
            "launch_calls": sum("Launch" in e["name"] for e in runtime) / steps,
            "top": [(name, len(d) / steps, sum(d) / steps, statistics.median(d)) for name, d in top[:24]]}


def profiled(fn: Callable[[], None], steps: int, trace: Path) -> tuple[float, dict[str, Any]]:
    """Wall ms per step of `steps` calls of fn (synchronised), then the same calls under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    return wall, trace_summary(trace, steps)


def profile_lines(label: str, wall_ms: float, s: dict[str, Any], tokens: int = 1) -> list[str]:
    """The profile of a step that consumes `tokens` tokens (a decode step 1, a prefill its prompt)."""
    lines = [f"### {label}: {wall_ms:.2f} ms a step without the profiler ({tokens * 1e3 / wall_ms:.1f} tok/s)", "",
             f"{s['kernels']:.0f} kernels a step, device busy {s['busy_us']:.0f} µs of a {s['span_us']:.0f} µs span "
             f"(first kernel to last); {s['launch_calls']:.0f} launch calls; {s['copies']:.1f} copies "
             f"({s['copy_us']:.0f} µs); {s['host_waits']:.1f} host waits ({s['host_wait_us']:.0f} µs)", "",
             "| kernel [grid] | launches a step | µs a step | median µs |", "|---|---|---|---|"]
    lines += [f"| {name} | {n:.1f} | {t:.0f} | {m:.1f} |" for name, n, t, m in s["top"]]
    return lines + [""]


def part_profile(part: Part, ctx: dict) -> None:
    """One decode step of the 35B model, profiled: all on the GPU (CUDA graph and eager) and under the budget; and
    a 512-token prefill (chunks of 64 and of 512)."""
    import torch

    from autoinfer.model.synth import cached_model

    if "loaded_35b" not in ctx:
        ctx["model_35b"] = ctx["model_35b_path"] or cached_model("35b-a3b", "Q4_K")
        ctx["loaded_35b"] = load_weights(ctx["model_35b"], "gguf", pin=True)
    folder = ctx["out"] / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    configs = {"graph": dict(FAST, graphs=True, max_context=1024), "eager": dict(FAST, max_context=1024)}
    engines = build_engines({"gguf": ctx["loaded_35b"]}, configs)
    prompt = list(range(7, 71))
    for name, engine in engines.items():
        logits, state = engine.prefill(prompt)
        for t in range(8):
            engine.decode(100 + t, state)  # warm: graph recorded, kernels compiled
        wall, summary = profiled(lambda: engine.decode(5, state), 8, folder / f"trace-{name}.json")
        part.lines += profile_lines(f"all on the GPU, {name}", wall, summary)
        part.data[name] = dict(summary, wall_ms=wall)
        log("\n".join(part.lines[-30:]))
    prompt_512 = list(range(11, 11 + 512))
    for chunk in (64, 512):  # a 512-token prefill, eager: in chunks of 64 tokens, and in one (the default)
        engine = build_engines({"gguf": ctx["loaded_35b"]}, {"p": dict(FAST, prefill_chunk=chunk,
                                                                       max_context=1024)})["p"]
        engine.prefill(prompt_512)
        wall, summary = profiled(lambda: engine.prefill(prompt_512), 1, folder / f"trace-prefill{chunk}.json")
        part.lines += profile_lines(f"all on the GPU, a 512-token prefill in chunks of {chunk}", wall, summary,
                                    len(prompt_512))
        part.data[f"prefill{chunk}"] = dict(summary, wall_ms=wall)
        del engine
    engines.clear()
    gc.collect()
    torch.cuda.empty_cache()
    budget = ctx["budget_mib"]
    engine = build_engines({"gguf": ctx["loaded_35b"]}, {"b": dict(FAST, budget_mib=budget, graphs=True,
                                                                   max_context=1024)})["b"]
    logits, state = engine.prefill(prompt)
    for t in range(8):
        engine.decode(100 + t, state)
    wall, summary = profiled(lambda: engine.decode(5, state), 4, folder / "trace-budget.json")
    part.lines += profile_lines(f"budget {budget:.0f} MiB, CUDA graph (device lookups)", wall, summary)
    part.data["budget"] = dict(summary, wall_ms=wall)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results")) / "refengine")
    p.add_argument("--llama-bin", default=None, help="llama.cpp's bin folder (default: $LLAMA_BIN)")
    p.add_argument("--parts", default="env,gdn,35b,budget,gemv,small",
                   help="run in this order: the targets first, the diagnostics (gemv tilings, small model) last")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--budget-mib", type=float, default=8192)
    p.add_argument("--llama-budget-args", default="-ngl 99 -ncmoe 28 -t 16 -fa 1",
                   help="llama-bench flags of the best llama.cpp configuration for the budget")
    p.add_argument("--time-limit", type=float, default=450,
                   help="seconds for the whole run (a device command may run 600 s, the GPU tests included)")
    p.add_argument("--gemv-search-s", type=float, default=60, help="seconds the gemv part tries other tilings")
    p.add_argument("--model-35b", type=Path, default=None,
                   help="an existing 35B-A3B Q4_K GGUF (default: the synthetic one, written once per machine)")
    args = p.parse_args(argv)
    report = Report(args.out, args.time_limit)
    ctx: dict[str, Any] = {"llama": find_llama_bench(args.llama_bin), "rounds": args.rounds, "reps": args.reps,
                           "budget_mib": args.budget_mib, "llama_budget_args": shlex.split(args.llama_budget_args),
                           "bandwidth": float("nan"), "model_35b_path": args.model_35b,
                           "gemv_search_s": args.gemv_search_s,
                           "out": args.out}
    report.header.append(f"`{' '.join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])}`; "
                         f"llama-bench: {ctx['llama'] or 'none (LLAMA_BIN unset)'}")
    parts = {"env": (part_env, 5), "gemv": (part_gemv, 60), "gdn": (part_gdn, 30), "small": (part_small, 60),
             "35b": (part_35b, 240), "budget": (part_budget, 100), "profile": (part_profile, 90)}
    for name in args.parts.split(","):
        if name not in parts:
            raise SystemExit(f"unknown part {name!r}: choose from {', '.join(parts)}")
        fn, need = parts[name]
        report.run(name, lambda part, fn=fn: fn(part, ctx), need)
    log(report.markdown())


if __name__ == "__main__":
    main()
