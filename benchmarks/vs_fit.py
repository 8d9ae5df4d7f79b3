"""autoinfer's recommendation against llama.cpp's own fit, at the same VRAM budget (per GPU where several are
visible: one sweep sees them all, as a user's would).

    python benchmarks/vs_fit.py --model qwen35moe-35b-a3b-Q4_K.gguf --budgets 8192,12288,16384 --trials 12 \
        --rounds 5 --out benchmarks/results/vs-fit-h100.md

Per budget:
1. fit: llama-fit-params is asked to leave (free - budget) MiB free on each GPU, for the serving context (`--context`,
   the shipped campaign's serve.context by default); its placement (and tensor split) is run once and the fullest
   GPU's measured peak read, plus what the serving context adds (model.memory: llama-bench creates only the prompt's
   and the generation's); while that is over the budget the margin grows by the excess (a user of `--fit` would have
   to do the same to stay inside the budget). Each try is printed.
2. ours: `autoinfer sweep` of the shipped 8 GiB campaign with the budget, serving context and trial count set, in a
   fresh results folder; its recommendation is read with `autoinfer export --format json`. Both answers' llama-server
   commands at the serving context are then started once each and their peaks measured (sweep/deploy.py's check).
3. Both configurations run interleaved, `--rounds` rounds, each run a fresh llama-bench process, alternating which
   goes first; one score per run (the median of its repetitions). Printed: tg and pp medians, the ratio ours/fit with
   its 95% bootstrap CI and the Mann-Whitney p-value, the same ratio by round (the geometric mean of each round's
   ours/fit, its t interval and the paired t-test's p: a drift that moves both sides of a round cancels in it), and
   each side's peak VRAM. The result files are written again after the sweep and after every round, the budget
   marked `cut` until its rounds end: a run the device time cuts short keeps its sweep and the rounds it ran.
4. The bandwidth account: the weight bytes one decoded token reads on each side (the shared performance model's
   features), the host's measured read bandwidth (a multi-threaded sum over 2 GiB, as many threads as the
   configuration uses) and the GPU's (a device-to-device copy); the ceiling 1 / (cpu_GB/host_GB/s + gpu_GB/gpu_GB/s)
   is the tg no placement of those bytes can beat, and the table shows how close each answer comes to its own.
5. The measured account, once every budget ran: the shared performance model (autoinfer/model/performance.py) fitted
   without priors to every successful trial of the three sweeps and every interleaved run (one host, many GB/token
   on the CPU), so its CPU term is this host's measured seconds per GB of experts left in RAM. Per budget: the
   tg it gives each answer's placement, and how much faster a placement would be that kept 5% fewer expert bytes on
   the CPU, which no placement within the same budget can (the GPU is full at the boundary). Measurements whose host
   bytes are too alike (one budget's sweep) cannot tell the host's cost from the GPU's: the account says so and
   leaves that column out. Where it can tell, it says what room placement has left at fit's answer: the gain if the
   budget's slack at fit's measured peak held more host-read weights, and the VRAM beyond the budget a 1.15x faster
   placement would need; and what the host's knobs would have to give instead: the share of the host's seconds per
   token a 1.15x faster answer at fit's placement must cut. A configuration without threads (fit's) is modelled at
   the threads llama.cpp gives it, one per physical core.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from autoinfer.engines import base
from autoinfer.engines.base import RunContext, TrialConfig
from autoinfer.engines.knobs import llama_defaults
from autoinfer.engines.llama_common import env_words, server_args
from autoinfer.measure.gpu import measured_gpus, visible_gpus
from autoinfer.measure.stats import Comparison, compare, compare_paired
from autoinfer.model.memory import MemoryModel, measured_context
from autoinfer.model.performance import TG_TERMS, features_of, predict
from autoinfer.model.performance import fit as fit_coefficients
from autoinfer.model.shape import shape_from_gguf
from autoinfer.search.fit_baseline import FIT_SLACK_MIB
from autoinfer.store.trials import Store, load_study
from autoinfer.sweep.deploy import check_prompt, run_check

CAMPAIGN = Path(__file__).resolve().parents[1] / "autoinfer" / "experiments" / "qwen35moe-8gb.yaml"
MEASURE = {"n_prompt": 512, "n_gen": 64, "repetitions": 3}
# The account asks what 5% fewer host bytes would give: a slope read from measurements with a few % of tg noise, so
# they must read host bytes that differ by several times that (the sweeps of one budget end on one placement).
HOST_SPAN = 0.2
TARGET = 1.15  # the generation speed-up over fit the comparison is held to
MIB, GB = 2 ** 20, 1e9


@functools.cache  # one model file per run: its shape is read once
def _memory_model(model: Path) -> MemoryModel:
    return MemoryModel(shape_from_gguf(model))


def context_growth(model: Path, config: TrialConfig) -> float:
    """MiB the configuration's serving context (ctx_size) adds to its llama-bench peak, as the sweep counts it."""
    return _memory_model(model).context_growth(config, measured_context(config))


def served(context: int | None) -> dict:
    """The trial parameters that name a serving context (none: the measurement's own)."""
    return {"ctx_size": context} if context else {}


def server_peak(config: TrialConfig) -> float | None:
    """The fullest GPU's peak of the configuration's llama-server command, started once and asked for a completion."""
    bench = base.create("llama-bench")
    check = run_check([*env_words(config), str(bench.tools.tool("llama-server")), *server_args(config, bench.tools)],
                      600, check_prompt(config), gpus=tuple(measured_gpus()))
    if not check.passed:
        raise SystemExit(f"llama-server of {describe(config)} failed: {check.reason}")
    return check.vram_peak_mib


def fit_config(model: Path, budget: float, tries: int, log, context: int | None = None
               ) -> tuple[TrialConfig, list[dict]]:
    """llama-fit-params' placement (and, on several GPUs, its tensor split) for `budget` MiB per GPU, asked again for
    less by the overshoot plus FIT_SLACK_MIB while the measured peak of the fullest GPU is over the budget (as the
    sweep's own baseline does, search/fit_baseline.py)."""
    engine = base.create("llama-bench")
    defaults = llama_defaults()  # the batch sizes `--fit` runs with when a user sets none
    history: list[dict] = []
    asked = budget
    for _ in range(tries):
        answer = engine.baseline(model, asked, max(MEASURE["n_prompt"] + MEASURE["n_gen"], context or 0),
                                 defaults["batch"], defaults["ubatch"])
        if isinstance(answer, str):
            raise SystemExit(answer)
        split = {"tensor_split": answer.tensor_split} if answer.tensor_split else {}
        config = TrialConfig.from_params({"model": model, "n_gpu_layers": answer.n_gpu_layers,
                                          "override_tensors": answer.override_tensors, **split, **MEASURE,
                                          **served(context)})
        m = engine.run(config, RunContext(timeout_s=600, artifacts=Path(tempfile.mkdtemp()), gpus=measured_gpus()))
        growth = context_growth(model, config) if context else 0.0
        peak = None if m.vram_peak_mib is None else m.vram_peak_mib + growth
        history.append({"asked_mib": asked, "argv": answer.how, "n_gpu_layers": answer.n_gpu_layers,
                        "overrides": len(answer.override_tensors), "tensor_split": answer.tensor_split,
                        "peak_mib": m.vram_peak_mib, "peak_per_gpu_mib": list(m.vram_per_gpu_mib),
                        "context_mib": growth, "tg": m.tg, "outcome": m.outcome.value})
        log(f"  fit try: asked for {asked:.0f} MiB per GPU → -ngl {answer.n_gpu_layers}, "
            f"{len(answer.override_tensors)} override(s)" + (f", -ts {answer.tensor_split}" if split else "")
            + f": peak {m.vram_peak_mib} MiB {list(m.vram_per_gpu_mib) or ''}"
            + (f" + {growth:.0f} for the {context}-token context" if context else "")
            + f", tg {m.tg} ({m.outcome.value})")
        if peak is not None and peak <= budget:
            return config, history
        asked -= (peak or budget) - budget + FIT_SLACK_MIB
    raise SystemExit(f"llama-fit-params stayed over {budget:.0f} MiB after {tries} tries")


def our_config(model: Path, budget: float, trials: int, wall_s: float, work: Path,
               log, context: int | None = None) -> tuple[TrialConfig, dict, str]:
    """The recommendation of a fresh `autoinfer sweep` at this budget, within `trials` and `wall_s`, and the sweep's
    whole output (the log keeps its last lines; the JSON record keeps all of it, alternatives included). The drift
    anchor is off and the confirmation keeps the campaign's finalists (and the sweep's own llama-fit-params
    baseline) without extra rounds: the interleaved comparison that follows is the check across processes, and the
    GPU time goes to it. The confirmation also re-measures the leader's measured twins in how the weights kept in RAM
    are held (autoinfer/sweep/confirm.py, HOST_BUFFER_KNOBS): runs before it (vs-fit-h100.md, 6442b1d and f0898b6)
    left out the answer's placement on huge pages, which ran 1.05x and 1.21x (by round) mmap's generation
    interleaved afterwards on those hosts."""
    spec = yaml.safe_load(CAMPAIGN.read_text())
    spec.update(model=str(model), name=f"vs-fit-{budget:.0f}")
    spec["constraints"]["vram_mib"] = budget
    spec["budget"] = {"trials": trials, "wall_s": wall_s}
    spec["drift"] = {"every": None}
    spec.pop("serve", None)
    if context:
        spec["serve"] = {"context": context}
    spec["confirm"] = {**spec.get("confirm", {}), "max_rounds": spec.get("confirm", {}).get("rounds", 3)}
    path = work / f"vs-fit-{budget:.0f}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "AUTOINFER_RESULTS": str(work / "results")}
    study = f"vs-fit-{budget:.0f}"
    cli = [sys.executable, "-m", "autoinfer.cli"]
    sweep = subprocess.run([*cli, "sweep", str(path), "--study", study, "--quiet"], env=env, text=True,
                           capture_output=True, check=False)
    log("\n".join("  sweep: " + line for line in sweep.stdout.strip().splitlines()[-12:]))
    if sweep.returncode not in (0, 1):  # 1: the deployment check failed, the recommendation still stands
        raise SystemExit(f"autoinfer sweep exited {sweep.returncode}: {sweep.stderr.strip()[-400:]}")
    exported = subprocess.run([*cli, "export", "--study", study, "--format", "json"], env=env, text=True,
                              capture_output=True, check=True)
    answer = json.loads(exported.stdout)
    return TrialConfig.from_params({**answer["config"], **MEASURE}), answer, sweep.stdout


def interleave(a: TrialConfig, b: TrialConfig, rounds: int,
               after_round: Callable[[dict], None] = lambda runs: None) -> dict[str, dict[str, list[float]]]:
    """`rounds` fresh-process runs of each, alternating order; one tg/pp score per run and its peak VRAM.
    `after_round` gets the runs so far before the first round and after each (main keeps them: a run cut short keeps
    its rounds)."""
    engine = base.create("llama-bench")
    out = {side: {"tg": [], "pp": [], "peak": [], "peak_per_gpu": []} for side in ("ours", "fit")}
    after_round(out)
    for r in range(rounds):
        for side, config in ([("ours", a), ("fit", b)] if r % 2 == 0 else [("fit", b), ("ours", a)]):
            m = engine.run(config, RunContext(timeout_s=600, artifacts=Path(tempfile.mkdtemp()), gpus=measured_gpus()))
            if m.tg is None:
                raise SystemExit(f"round {r}: {side} failed: {m.reason}")
            out[side]["tg"].append(float(np.median(m.tg_samples)))
            out[side]["pp"].append(float(np.median(m.pp_samples)))
            out[side]["peak"].append(m.vram_peak_mib)  # the fullest GPU's
            out[side]["peak_per_gpu"].append(list(m.vram_per_gpu_mib))
        after_round(out)
    return out


def compare_runs(runs: dict[str, dict[str, list[float]]]) -> dict[str, Comparison]:
    """ours against fit from the interleaved runs: tg and pp as two samples (the ratio of medians), and by round."""
    ours, fit = runs["ours"], runs["fit"]
    return {"tg": compare(ours["tg"], fit["tg"]), "pp": compare(ours["pp"], fit["pp"]),
            "tg_by_round": compare_paired(ours["tg"], fit["tg"]), "pp_by_round": compare_paired(ours["pp"], fit["pp"])}


def peaks(runs: dict[str, dict[str, list]], counted: dict[str, float] | None = None) -> dict[str, float]:
    """Each side's highest measured peak over its interleaved runs (the fullest GPU's), plus what the serving context
    adds to that side's (`counted`, by side, where the run served one)."""
    counted = counted or {}
    return {side: max(p for p in runs[side]["peak"] if p is not None) + counted.get(side, 0.0) for side in runs}


def table_row(budget: float, runs: dict[str, dict[str, list[float]]], ratios: dict[str, Comparison],
              peak: dict[str, float]) -> str:
    """One budget's line of the vs-fit table (write() gives its header)."""
    def ci(c: Comparison) -> str:
        return f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}]"

    return (f"| {budget:.0f} | {np.median(runs['fit']['tg']):.1f} | {np.median(runs['ours']['tg']):.1f} "
            f"| {ci(ratios['tg'])} p={ratios['tg'].p_value:.3f} "
            f"| {ci(ratios['tg_by_round'])} p={ratios['tg_by_round'].p_value:.3f} "
            f"| {np.median(runs['fit']['pp']):.0f} | {np.median(runs['ours']['pp']):.0f} "
            f"| {ci(ratios['pp'])} | {ci(ratios['pp_by_round'])} | {peak['fit']:.0f} | {peak['ours']:.0f} |")


def ceiling_reached(bound: dict[str, dict], runs: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """Each side's median tg over the ceiling its placement's bytes allow (ceiling())."""
    return {side: float(np.median(runs[side]["tg"])) / bound[side]["tg_ceiling"] for side in bound}


def account_row(budget: float, bound: dict[str, dict], runs: dict[str, dict[str, list[float]]]) -> str:
    """One budget's line of the bandwidth table (write() gives its header): host GB per token and ceiling (reached)."""
    reached = ceiling_reached(bound, runs)
    return (f"| {budget:.0f} | {bound['fit']['cpu_gb_per_token']:.3f} | {bound['ours']['cpu_gb_per_token']:.3f} "
            f"| {bound['fit']['tg_ceiling']:.1f} ({reached['fit']:.0%}) "
            f"| {bound['ours']['tg_ceiling']:.1f} ({reached['ours']:.0%}) |")


@functools.cache  # the host's bandwidth at a thread count: measured once per run
def host_read_gbps(threads: int) -> float:
    """Best of five multi-threaded sums over 2 GiB of host memory (GB/s read)."""
    import torch
    torch.set_num_threads(threads)
    data = torch.ones(2**29, dtype=torch.float32)
    best = min(_timed(lambda: float(data.sum())) for _ in range(5))
    return data.numel() * 4 / best / 1e9


GPU_COPY = """
import time, torch
src = torch.empty(2**29, dtype=torch.float32, device="cuda")
dst = torch.empty_like(src)
best = float("inf")
for _ in range(11):
    t = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t)
print(2 * src.numel() * 4 / best / 1e9)
"""


def gpu_copy_gbps() -> float:
    """Best of eleven device-to-device copies of 2 GiB, bytes read and written (GB/s), in a child process, so no
    CUDA context or cached allocation of this process stays on the GPU while fit and the sweep measure peaks."""
    done = subprocess.run([sys.executable, "-c", GPU_COPY], check=True, capture_output=True, text=True, timeout=300)
    return float(done.stdout.strip())


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ceiling(model: Path, config: TrialConfig, host_gbps: float, gpu_gbps: float) -> dict:
    """Bytes one token reads on each side and the tg they allow at the measured bandwidths."""
    f = features_of(shape_from_gguf(model), config)
    seconds = f.cpu_gb / host_gbps + f.gpu_gb / gpu_gbps
    return {"cpu_gb_per_token": round(f.cpu_gb, 4), "gpu_gb_per_token": round(f.gpu_gb, 4),
            "tg_ceiling": round(1 / seconds, 1)}


def sweep_records(work: Path, study: str) -> list:
    """The trial records of one budget's sweep."""
    os.environ["AUTOINFER_RESULTS"] = str(work / "results")
    return Store(load_study(study, None)).records()


def sweep_observations(work: Path, studies: list[str]) -> list[tuple[TrialConfig, float]]:
    """(configuration, tg median) of every successful feasible trial of the sweeps."""
    return [(t.trial_config, float(np.median(t.samples("tg"))))
            for name in studies for t in sweep_records(work, name) if t.is_feasible_ok and t.samples("tg")]


def trial_summary(t) -> dict:
    """One sweep trial as the evidence keeps it: what ran (huge pages as run, and how much of the process got them;
    the whole configuration, so the measured account can be fitted again from the file), its medians and peaks, and
    why the search chose it."""
    median = {kind: float(np.median(t.samples(kind))) if t.samples(kind) else None for kind in ("tg", "pp")}
    return {"number": t.number, "state": t.state.name, "outcome": t.outcome, "feasible": t.is_feasible_ok,
            "params": t.shown_params, "config": dict(t.config or {}), "tg_median": median["tg"],
            "pp_median": median["pp"], "vram_peak_mib": t.vram_peak_mib, "rss_peak_mib": t.rss_peak_mib,
            "huge_pages_mib": t.metrics.get("huge_pages_mib"), "search_reason": t.search_reason, "reason": t.reason}


def _host_s_per_gb(coef: np.ndarray, f) -> float:
    """The fitted model's host seconds per GB read at the configuration's threads (a + b/T + e·T)."""
    terms = dict(zip(TG_TERMS, coef))
    return (terms["cpu_s_per_gb"] + terms["cpu_thread_s_per_gb"] / f.threads
            + terms["cpu_sync_s_per_gb_thread"] * f.threads)


def placement_room(coef: np.ndarray, f, slack_mib: float, target: float) -> tuple[float, float | None]:
    """What placement could still give fit's answer by the fitted model: the tg gain if the budget's slack at its
    measured peak held more of the weights it reads on the host, and the VRAM beyond that slack a `target`× faster
    placement would need (None: not even with every weight on the GPU). Moving one GB that a token reads saves the
    host's cost per GB at its threads less the GPU's; a GB resident on the host is read cpu_gb / cpu_total_gb per
    token (the active experts' share)."""
    saved = _host_s_per_gb(coef, f) - dict(zip(TG_TERMS, coef))["gpu_s_per_gb"]
    seconds = 1 / float(predict(coef, f.tg_row()[None])[0])
    read_share = f.cpu_gb / f.cpu_total_gb
    moved = min(slack_mib * MIB / GB * read_share, f.cpu_gb)  # the slack may hold more than the host has
    filled = float(seconds / (seconds - saved * moved) - 1)
    needed_gb = (seconds - seconds / target) / saved if saved > 0 else float("inf")
    if needed_gb > f.cpu_gb:
        return filled, None
    return filled, float(needed_gb / read_share * GB / MIB - slack_mib)


def host_room(coef: np.ndarray, f, target: float) -> float | None:
    """What the host would have to give at fit's placement, by the fitted model: the share of the host's seconds
    per token (its cost per GB read at its threads, times the GB it reads) that a `target`x faster answer must cut
    with the same bytes on each side (None: more than all of them). Host knobs (huge pages, load mode, threads) act
    there and nowhere else."""
    host = _host_s_per_gb(coef, f) * f.cpu_gb
    seconds = 1 / float(predict(coef, f.tg_row()[None])[0])
    cut = (seconds - seconds / target) / host if host > 0 else float("inf")
    return float(cut) if cut < 1 else None


def measured_account(model: Path, observations: list[tuple[TrialConfig, float]],
                     answers: dict[float, dict[str, TrialConfig]],
                     fit_peaks: dict[float, float]) -> tuple[list[str], dict]:
    """The performance model fitted to this host's measurements; per budget the tg it gives each answer, the gain
    5% fewer CPU-side expert bytes would bring, and what room placement (placement_room) and the host's knobs
    (host_room) would need to give at fit's answer."""
    shape = shape_from_gguf(model)
    features = [features_of(shape, config) for config, _ in observations]
    rows = np.array([f.tg_row() for f in features])
    coef = fit_coefficients(rows, [tg for _, tg in observations])
    fitted = predict(coef, rows)
    errors = [abs(p - tg) / tg for p, (_, tg) in zip(fitted, observations)]
    host = [f.cpu_gb for f in features]
    span = (max(host) - min(host)) / max(float(np.median(host)), 1e-9)
    identified = span >= HOST_SPAN
    lines = [f"performance model fitted to {len(observations)} measurements of this host: "
             + ", ".join(f"{name} {value:.3g}" for name, value in zip(TG_TERMS, coef))
             + f"; median |error| {np.median(errors):.1%}"]
    if not identified:
        lines.append(f"these measurements read {min(host):.3f}-{max(host):.3f} host GB/token ({span:.0%} of their "
                     f"median, under {HOST_SPAN:.0%}): too alike to tell the host's cost per GB from the GPU's, so "
                     "the model's split between them is not evidence and the last column is left out; measure "
                     "several budgets in one run")
    lines += ["", "| budget MiB | side | host GB/token | measured tg | model tg | model tg with 5% fewer host bytes |",
              "|---|---|---|---|---|---|"]
    data = {"coef": dict(zip(TG_TERMS, map(float, coef))), "median_rel_error": float(np.median(errors)),
            "host_gb_span": span, "host_cost_identified": identified}
    for budget, sides in answers.items():
        for side, (config, measured) in sides.items():
            f = features_of(shape, config)
            less = dataclasses.replace(f, cpu_gb=0.95 * f.cpu_gb)
            model_tg, fewer = (float(predict(coef, x.tg_row()[None])[0]) for x in (f, less))
            gain = f"{fewer:.1f} (+{fewer / model_tg - 1:.1%})" if identified else "not identified"
            lines.append(f"| {budget:.0f} | {side} | {f.cpu_gb:.3f} | {measured:.1f} | {model_tg:.1f} | {gain} |")
            data[f"{budget:.0f}-{side}"] = {"cpu_gb": f.cpu_gb, "measured": measured, "model": model_tg,
                                            "fewer_host_bytes": fewer if identified else None}
    if not identified:
        return lines, data
    lines += ["", f"What placement could still give fit's answer, by this model: its tg with the budget's slack at "
              f"its measured peak filled with weights it reads on the host, and the VRAM beyond that slack a "
              f"{TARGET}x faster placement would need; and what share of the host's seconds per token a "
              f"{TARGET}x faster answer at fit's placement would have to cut (the host knobs' part).", "",
              "| budget MiB | fit peak MiB | slack MiB | model tg gain, slack filled | "
              f"VRAM beyond the budget for {TARGET}x | host time cut for {TARGET}x at fit's placement |",
              "|---|---|---|---|---|---|"]
    for budget, sides in answers.items():
        slack = budget - fit_peaks[budget]
        at_fit = features_of(shape, sides["fit"][0])
        filled, beyond = placement_room(coef, at_fit, slack, TARGET)
        cut = host_room(coef, at_fit, TARGET)
        more = ("unreachable: more than every weight on the GPU" if beyond is None
                else "none: the slack holds it" if beyond <= 0 else f"{beyond:.0f} MiB")
        host = "unreachable: more than all of it" if cut is None else f"{cut:.1%}"
        lines.append(f"| {budget:.0f} | {fit_peaks[budget]:.0f} | {slack:.0f} | {filled:+.1%} | {more} | {host} |")
        data[f"{budget:.0f}-fit"] |= {"slack_mib": slack, "slack_filled_gain": filled, "vram_beyond_for_target": beyond,
                                      "host_time_cut_for_target": cut}
    return lines, data


def as_ran(config: TrialConfig) -> TrialConfig:
    """The configuration as the models see it: without `-t` llama.cpp runs its own default thread count
    (llama_defaults), not the performance model's generic DEFAULT_THREADS (fit's answers leave threads to llama.cpp)."""
    return config if config.threads else config.with_(threads=llama_defaults()["threads"])


def describe(config: TrialConfig) -> str:
    knobs = {k: v for k, v in config.to_params().items() if k not in ("model", "override_tensors", *MEASURE)}
    layers = f"{len(config.override_tensors)} override(s)" if config.override_tensors else "no overrides"
    return f"{layers}; " + " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))


def budget_list(text: str) -> list[float]:
    """MiB budgets separated by commas or spaces (gpu_evidence.sh's other steps take BUDGETS with spaces)."""
    try:
        budgets = [float(b) for b in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give budgets in MiB, e.g. 8192,12288") from None
    if not budgets or min(budgets) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive budgets in MiB, e.g. 8192,12288")
    return budgets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--budgets", type=budget_list, default="8192,12288,16384")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--sweep-wall-s", type=float, default=300, help="wall-time budget of each sweep's search")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fit-tries", type=int, default=4)
    ap.add_argument("--context", type=int, default=(yaml.safe_load(CAMPAIGN.read_text()).get("serve") or {}).get(
        "context"), help="tokens of context the servers must hold (default: the shipped campaign's serve.context; "
        "0: the measurement's own)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    if not visible_gpus():
        raise SystemExit("vs_fit needs an NVIDIA GPU: llama-fit-params places layers on one")
    work = Path(tempfile.mkdtemp(prefix="vs-fit-"))
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    rows, accounts, records, account = [], [], [], []
    interleaved: list[tuple[TrialConfig, float]] = []
    answers: dict[float, dict[str, tuple[TrialConfig, float]]] = {}
    fit_peaks: dict[float, float] = {}
    gpu_gbps = gpu_copy_gbps()
    for budget in args.budgets:
        started = time.monotonic()
        log(f"== budget {budget:.0f} MiB")
        fit, history = fit_config(args.model.resolve(), budget, args.fit_tries, log, args.context)
        log(f"  fit found in {time.monotonic() - started:.0f} s")
        ours, answer, sweep_output = our_config(args.model.resolve(), budget, args.trials, args.sweep_wall_s, work, log,
                                                args.context)
        log(f"  sweep done at {time.monotonic() - started:.0f} s\n  fit:  {describe(fit)}\n  ours: {describe(ours)}")
        sides = {"ours": ours, "fit": fit}
        growth = {side: context_growth(args.model.resolve(), c) if args.context else 0.0 for side, c in sides.items()}
        servers = {side: server_peak(c) for side, c in sides.items()}
        log("  llama-server at the serving context: " + "; ".join(
            f"{side} peaked {servers[side]} MiB (llama-bench's peak + {growth[side]:.0f} counted)" for side in sides))
        swept = {"budget_mib": budget, "serve_context": args.context, "context_mib": growth,
                 "server_peak_mib": servers, "fit_tries": history, "fit": fit.to_params() | {"model": str(fit.model)},
                 "ours": ours.to_params() | {"model": str(ours.model)}, "sweep_trial": answer.get("trial"),
                 "sweep_output": sweep_output.splitlines(),
                 "sweep_trials": [trial_summary(t) for t in sweep_records(work, f"vs-fit-{budget:.0f}")]}

        def keep(runs: dict) -> None:
            """The budget so far, marked cut: where the device time ends during the rounds, the sweep and the rounds
            run stay in the result files (vs_fit_rounds.py leaves such a record out of its tables)."""
            rounds = len(runs["ours"]["tg"])
            write(args, rows, accounts, account, lines, records + [{**swept, "runs": runs, "cut": (
                f"{rounds} of {args.rounds} rounds run when this was written")}], show=False)

        runs = interleave(ours, fit, args.rounds, after_round=keep)
        log(f"  interleaved runs done at {time.monotonic() - started:.0f} s")
        ratios = compare_runs(runs)
        peak = peaks(runs, growth)
        modelled = {"ours": as_ran(ours), "fit": as_ran(fit)}
        bound = {side: ceiling(args.model.resolve(), config, host_read_gbps(config.threads), gpu_gbps)
                 for side, config in modelled.items()}
        reached = ceiling_reached(bound, runs)
        log(f"  bandwidth: GPU copy {gpu_gbps:.0f} GB/s; " + "; ".join(
            f"{side} reads {b['cpu_gb_per_token']:.3f} GB/token on the host, {b['gpu_gb_per_token']:.3f} on the GPU: "
            f"ceiling {b['tg_ceiling']:.1f} tok/s, reached {reached[side]:.0%}" for side, b in bound.items()))
        accounts.append(account_row(budget, bound, runs))
        rows.append(table_row(budget, runs, ratios, peak))
        log(rows[-1])
        answers[budget] = {side: (modelled[side], float(np.median(runs[side]["tg"]))) for side in ("fit", "ours")}
        interleaved += [(modelled[side], tg) for side in ("fit", "ours") for tg in runs[side]["tg"]]
        records.append({**swept, "runs": runs, **{k: c.to_dict() for k, c in ratios.items()}, "bandwidth": bound,
                        "gpu_copy_gbps": round(gpu_gbps)})
        observations = sweep_observations(work, [f"vs-fit-{b:.0f}" for b in answers]) + interleaved
        fit_peaks[budget] = peak["fit"]
        account, records[-1]["measured_account"] = measured_account(args.model.resolve(), observations, answers,
                                                                    fit_peaks)
        log("\n".join(account))
        write(args, rows, accounts, account, lines, records)  # after every budget: a run cut short keeps its results
    return 0


def write(args: argparse.Namespace, rows: list[str], accounts: list[str], account: list[str], lines: list[str],
          records: list[dict], show: bool = True) -> None:
    table = ["| budget MiB | fit tg | ours tg | tg ours/fit [95% CI] | tg by round [95% CI] | fit pp512 | ours pp512 "
             "| pp ours/fit [95% CI] | pp by round [95% CI] | fit peak MiB | ours peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
             "| budget MiB | fit host GB/token | ours host GB/token | fit tg ceiling (reached) | ours tg ceiling (reached) |",
             "|---|---|---|---|---|", *accounts, *(["", "## Measured account", "", *account] if account else [])]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    context = (f"Serving context {args.context} tokens: each peak is llama-bench's plus the KV cache that context adds "
               "(model.memory), and the log has each llama-server's own peak at it.\n\n" if args.context else "")
    args.out.write_text(f"# autoinfer vs llama-fit-params, {args.rounds} interleaved rounds, {args.model.name}\n\n"
                        + context + "\n".join(table) + "\n\n## Log\n\n```\n" + "\n".join(lines) + "\n```\n")
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    if show:
        print("\n".join(table), flush=True)


if __name__ == "__main__":
    sys.exit(main())
