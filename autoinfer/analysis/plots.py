"""The report's figures, each written as PNG and SVG. Every point drawn is a trial read from the study."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

from autoinfer import atomic  # noqa: E402
from autoinfer.analysis import fits as F  # noqa: E402


def _save(fig: plt.Figure, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    for ext in ("png", "svg"):
        with atomic.replacing(out / f"{name}.{ext}") as tmp:
            fig.savefig(tmp, dpi=120, format=ext)
    plt.close(fig)
    return out / f"{name}.png"


def _errorbars(rows: pd.DataFrame, x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = rows["tg_median"].to_numpy(float)
    low = np.where(np.isfinite(rows["tg_ci_low"]), y - rows["tg_ci_low"], 0.0)
    high = np.where(np.isfinite(rows["tg_ci_high"]), rows["tg_ci_high"] - y, 0.0)
    return rows[x].to_numpy(float), y, np.vstack([low, high])


def speed_vs_cpu(rows: pd.DataFrame, power: F.Fit | None, bandwidth: F.Fit | None, out: Path) -> Path:
    """tok/s against GB of weights in system RAM, with both fits and their 95% bootstrap bands."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x, y, err = _errorbars(rows, "cpu_gb")
    ax.errorbar(x, y, yerr=err, fmt="o", ms=4, color="0.25", ecolor="0.6", label="trials (median, 95% CI)")
    grid = np.linspace(float(np.min(x)), float(np.max(x)), 200)
    if power is not None:
        lo, hi = F.band(power, F.power_law_predict, grid)
        ax.plot(grid, F.power_law_predict(power.params, grid), color="C0",
                label=f"power law α={power.params['alpha']:.3g}, M={power.params['M']:.3g} GB")
        ax.fill_between(grid, lo, hi, color="C0", alpha=0.2)
    if bandwidth is not None:
        # Its prediction depends on the bytes on both sides, not on x alone: one point per trial, with its band.
        feats = rows[["active_cpu_gb", "active_gpu_gb"]].to_numpy(float)
        pred = F.bandwidth_predict(bandwidth.params, feats)
        lo, hi = F.band(bandwidth, F.bandwidth_predict, feats)
        ax.errorbar(x, pred, yerr=np.vstack([pred - lo, hi - pred]), fmt="x", color="C1", ecolor="C1", alpha=0.8,
                    label=f"bandwidth model: CPU {bandwidth.params['BW_cpu_GBps']:.3g} GB/s, "
                          f"GPU {bandwidth.params['BW_gpu_GBps']:.3g} GB/s")
    ax.set_xlabel("weights in system RAM (GB)")
    ax.set_ylabel("generation speed (tok/s)")
    ax.set_title("Decode speed vs weights left on the CPU")
    ax.legend(fontsize=8)
    return _save(fig, out, "speed_vs_cpu_gb")


def pareto(rows: pd.DataFrame, budget_mib: float | None, budget_source: str, out: Path) -> Path:
    """tok/s against peak device memory; the front is the fastest trial at or under each memory level."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    data = rows.dropna(subset=["vram_peak_mib"]).sort_values("vram_peak_mib")
    ax.scatter(data["vram_peak_mib"], data["tg_median"], s=14, color="0.5", label="trials")
    front_x, front_y, best = [], [], -math.inf
    for _, r in data.iterrows():
        if r["tg_median"] > best:
            best = r["tg_median"]
            front_x.append(r["vram_peak_mib"])
            front_y.append(best)
    ax.step(front_x, front_y, where="post", color="C2", label="Pareto front")
    ax.scatter(front_x, front_y, color="C2", s=20)
    if budget_mib:
        ax.axvline(budget_mib, color="C3", ls="--", label=f"{budget_source}: {budget_mib:.0f} MiB")
    ax.set_xlabel("peak device memory (MiB)")
    ax.set_ylabel("generation speed (tok/s)")
    ax.set_title("Speed vs device memory")
    ax.legend(fontsize=8)
    return _save(fig, out, "pareto_vram")


def tg_pp_front(points: pd.DataFrame, budget_mib: float | None, recommended: int | None, out: Path) -> Path:
    """Generation against prompt tok/s of the configurations within the budget, on log axes (where a campaign objective
    tg^(1-w)·pp^w is a straight line), the front no trial beats on both, each front point labelled with the prompt
    weights w it is best for, and the recommendation marked. `points`: trial, tg, pp, front, w_low, w_high.
    SVG groups `trials`, `front` and `recommendation` hold the drawn points (so a reader or a test finds them)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(points["pp"], points["tg"], s=14, color="0.6", label="configurations within the budget", gid="trials")
    front = points[points["front"]].sort_values("pp")
    ax.plot(front["pp"], front["tg"], color="C2", lw=1)
    ax.scatter(front["pp"], front["tg"], s=30, color="C2", label="front: none faster on both", gid="front")
    for i, (_, r) in enumerate(front.iterrows()):
        weights = (f"best for w {r['w_low']:.2f}–{r['w_high']:.2f}" if np.isfinite(r["w_low"])
                   else "best for no weight")
        ax.annotate(f"trial {int(r['trial'])}: {weights}", (r["pp"], r["tg"]), xytext=(5, 5 if i % 2 else -11),
                    textcoords="offset points", fontsize=7)  # alternating sides: neighbours are often close
    rec = points[points["trial"] == recommended]
    if len(rec):
        ax.scatter(rec["pp"], rec["tg"], s=160, marker="*", color="C3", zorder=3,
                   label=f"recommended (trial {recommended})", gid="recommendation")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.15, y=0.08)  # room for the labels of the points at the edges
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1-2-5 steps
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("prompt processing (pp tok/s)")
    ax.set_ylabel("generation (tg tok/s)")
    within = f"within {budget_mib:.0f} MiB" if budget_mib else "(no memory budget)"
    ax.set_title(f"Generation vs prompt {within}; objective tg^(1-w)·pp^w")
    ax.legend(fontsize=8)
    return _save(fig, out, "tg_pp_front")


def history(frame: pd.DataFrame, out: Path) -> Path:
    """The objective of each completed trial in order, and the best so far."""
    fig, ax = plt.subplots(figsize=(7, 4))
    done = frame[np.isfinite(frame["value"].astype(float))]
    ax.scatter(done["trial"], done["value"], s=12, color="0.5", label="trial objective")
    best = done["value"].astype(float).cummax()
    ax.step(done["trial"], best, where="post", color="C0", label="best so far")
    failed = frame[~np.isfinite(frame["value"].astype(float))]
    if len(failed):
        ax.scatter(failed["trial"], np.zeros(len(failed)), marker="x", color="C3", s=14,
                   label=f"no score ({len(failed)}: failed, pruned or infeasible)")
    ax.set_xlabel("trial number")
    ax.set_ylabel("objective (tok/s)")
    ax.set_title("Optimization history")
    ax.legend(fontsize=8)
    return _save(fig, out, "history")


def thread_scaling(groups: Sequence[tuple[str, pd.DataFrame, F.Fit | None, str]], out: Path) -> Path:
    """tok/s against threads per placement, with the threads model where it was fitted."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, rows, fit, _) in enumerate(groups):
        color = f"C{i % 10}"
        ax.scatter(rows["threads"], rows["tg_median"], s=14, color=color, label=label)
        if fit is not None:
            t = np.linspace(float(rows["threads"].min()), float(rows["threads"].max()), 100)
            ax.plot(t, F.threads_predict(fit.params, t), color=color)
            if fit.extra.get("more_threads_slower"):
                ax.axvline(fit.params["t_opt"], color=color, ls=":", lw=1)
    ax.set_xlabel("threads")
    ax.set_ylabel("generation speed (tok/s)")
    ax.set_title("Thread scaling per placement (dotted: model optimum where more threads got slower)")
    ax.legend(fontsize=7)
    return _save(fig, out, "thread_scaling")


def importance_bars(importances: dict[str, float], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(importances) + 1.2))
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names], color="C0")
    ax.set_xlabel("PED-ANOVA importance (share of objective variation, 0–1)")
    ax.set_title("Parameter importance")
    return _save(fig, out, "importance")
