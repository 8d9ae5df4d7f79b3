"""`autoinfer analyze`: a study → tables, fits, figures and a report a person reads top to bottom.

The recommendation and its evidence come first; then which model of speed the data supports, the top
configurations compared with CIs, memory, threads, parameter importance, and the data's provenance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import optuna
import pandas as pd

from autoinfer import atomic
from autoinfer.analysis import fits as F
from autoinfer.analysis import plots
from autoinfer.analysis.classes import ClassComparison, classes_frame, compare_classes, study_class
from autoinfer.analysis.dataset import config_table, load_frame, ok_rows
from autoinfer.campaign.spec import stored_campaign
from autoinfer.measure.stats import compare
from autoinfer.model.performance import DEFAULT_THREADS
from autoinfer.search.pareto import configurations, pp_weights, prompt_alternative, tg_pp_front
from autoinfer.store.trials import Store, flagged_trials
from autoinfer.sweep import deploy
from autoinfer.sweep.recommend import Recommendation, recommend

PLACEMENT = ("model", "n_gpu_layers", "n_cpu_moe", "override_tensors")


@dataclass(frozen=True)
class FitSet:
    """The placement fits that were possible on this study, and why the others were not."""

    fits: dict[str, F.Fit]
    skipped: dict[str, str]
    rows: pd.DataFrame  # the trials both placement models were fitted on
    threads: tuple[tuple[str, pd.DataFrame, F.Fit | None, str], ...]  # placement, trials, fit, why not fitted
    winner: dict[str, str | None]


@dataclass(frozen=True)
class Analysis:
    study: str
    frame: pd.DataFrame
    configs: pd.DataFrame
    pairs: pd.DataFrame
    fitset: FitSet
    importance: dict[str, float]
    importance_note: str
    figures: dict[str, Path]
    out: Path
    recommendation: Recommendation | None  # campaign.recommend's answer, read once for the figures, report and CLI
    classes: ClassComparison | None = None  # with --compare, or when the study's trials span several classes


def placement_label(row: pd.Series) -> str:
    parts = [Path(str(row.get("model", ""))).name, f"ngl {row.get('n_gpu_layers')}"]
    if row.get("n_cpu_moe"):
        parts.append(f"ncmoe {row.get('n_cpu_moe')}")
    if row.get("override_tensors"):
        parts.append(f"ot {row.get('override_tensors')}")
    return ", ".join(parts)


def no_success_reason(frame: pd.DataFrame) -> str:
    """'no successful trial' with the most common failure and one of its recorded reasons, counted over the trials
    that ran (a repeat was answered from an earlier trial, not run)."""
    frame = frame[frame["outcome"] != "repeat"]
    failed = frame[frame["outcome"] != "ok"]
    if failed.empty:
        return "no successful trial within the constraints"
    outcome, count = failed["outcome"].value_counts().index[0], int(failed["outcome"].value_counts().iloc[0])
    reasons = [r for r in failed.loc[failed["outcome"] == outcome, "reason"] if isinstance(r, str) and r]
    example = f"; e.g. {' '.join(reasons[0].split())[:200]}" if reasons else ""
    return f"no successful trial: {count} of {len(frame)} ended {outcome}{example}"


def _why_no_byte_accounting(frame: pd.DataFrame, ok: pd.DataFrame) -> str:
    if ok.empty:
        return no_success_reason(frame)
    models = sorted({str(m) for m in ok.get("model", pd.Series(dtype=str)).dropna()})
    missing = [m for m in models if not Path(m).is_file()]
    if missing:
        return f"model file(s) not on this machine: {', '.join(Path(m).name for m in missing)}"
    return f"the GGUF byte accounting of {', '.join(Path(m).name for m in models) or 'the model'} could not be read"


def _configurations(rows: pd.DataFrame) -> list[str]:
    """Each trial's configuration, for the hold-out to keep its trials together; a trial without one is its own."""
    keys = rows["config_key"] if "config_key" in rows else pd.Series("", index=rows.index)
    return [key or f"trial {i}" for i, key in enumerate(keys.fillna(""))]


def fit_study(frame: pd.DataFrame, seed: int = 0) -> FitSet:
    """Both placement models on the same trials (those with byte accounting), and the threads model per placement."""
    ok = ok_rows(frame)
    fits: dict[str, F.Fit] = {}
    skipped: dict[str, str] = {}
    features = ["cpu_gb", "active_cpu_gb", "active_gpu_gb"]
    have = all(c in ok.columns for c in features)
    rows = ok.dropna(subset=features) if have else ok.iloc[0:0]
    if rows.empty:
        reason = _why_no_byte_accounting(frame, ok)
        skipped = {"power_law": reason, "bandwidth": reason, "performance": reason}
    else:
        threads = rows["threads"].fillna(DEFAULT_THREADS) if "threads" in rows else np.full(len(rows), DEFAULT_THREADS)
        configs = _configurations(rows)
        for name, call in (("power_law", lambda: F.fit_power_law(rows["cpu_gb"], rows["tg_median"], seed, configs)),
                           ("bandwidth", lambda: F.fit_bandwidth(rows["active_cpu_gb"], rows["active_gpu_gb"],
                                                                 rows["tg_median"], seed, configs)),
                           ("performance", lambda: F.fit_performance(rows["active_cpu_gb"], rows["active_gpu_gb"],
                                                                     rows["cpu_layers"], threads, rows["tg_median"],
                                                                     seed, configs))):
            try:
                fits[name] = call()
            except ValueError as exc:
                skipped[name] = str(exc)
    threads: list[tuple[str, pd.DataFrame, F.Fit | None, str]] = []
    if "threads" in ok.columns:
        keys = [c for c in PLACEMENT if c in ok.columns]
        with_threads = ok.dropna(subset=["threads"])
        for _, group in with_threads.groupby(keys, sort=False, dropna=False):
            if group["threads"].nunique() < 2:
                continue
            label = placement_label(group.iloc[0])
            try:
                threads.append((label, group, F.fit_threads(group["threads"], group["tg_median"], seed,
                                                                   _configurations(group)), ""))
            except ValueError as exc:
                threads.append((label, group, None, str(exc)))
    return FitSet(fits, skipped, rows, tuple(threads), F.winner(list(fits.values())))


def pairwise(configs: pd.DataFrame, top: int = 5, seed: int = 0) -> pd.DataFrame:
    """The best configuration against each of the next ones (autoinfer.measure.stats.compare: ratio of medians with
    a bootstrap CI, Mann-Whitney p). `distinguishable` only when the CI excludes 1 and the test rejects."""
    if configs.empty:
        return pd.DataFrame()
    best = configs.iloc[0]
    rows = []
    for _, other in configs.iloc[1:top].iterrows():
        row: dict[str, Any] = {"best": best["config_key"], "other": other["config_key"],
                               "best_median": best["median"], "other_median": other["median"],
                               "ratio": best["median"] / other["median"], "n_best": best["n"], "n_other": other["n"],
                               "ratio_ci_low": math.nan, "ratio_ci_high": math.nan, "p_mannwhitney": math.nan,
                               "distinguishable": False}
        if best["n"] >= 2 and other["n"] >= 2:
            c = compare(best["samples"], other["samples"], seed=seed)
            row.update({"ratio_ci_low": c.ratio_ci[0], "ratio_ci_high": c.ratio_ci[1], "p_mannwhitney": c.p_value,
                        "distinguishable": bool(c.differ and c.ratio_ci[0] > 1.0)})
        rows.append(row)
    return pd.DataFrame(rows)


def importance(study: optuna.Study) -> tuple[dict[str, float], str]:
    """Optuna's PED-ANOVA importance of the searched parameters for the objective (it needs no scikit-learn),
    or an empty dict and the reason it cannot be computed."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    names = {k for t in study.get_trials(deepcopy=False) for k in t.distributions}
    if len(names) < 2:
        return {}, f"only {len(names)} searched parameter(s): nothing to rank"
    if not complete:
        return {}, f"no successful trial, so the {len(names)} searched parameters cannot be ranked"
    if len(complete) < 4:
        return {}, f"only {len(complete)} completed trial(s); importance needs at least 4"
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    try:
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator)), ""
    except (ValueError, RuntimeError) as exc:
        return {}, f"PED-ANOVA failed: {exc}"


def _finite(value: Any) -> Any:
    """JSON has no infinity: a non-finite float becomes null (an infinite bandwidth means a zero coefficient)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value


def winner_sentence(fitset: FitSet) -> str:
    fits, win = fitset.fits, fitset.winner
    if not fits:
        reasons = set(fitset.skipped.values())
        if len(reasons) == 1:  # one cause for every model: say it once
            return f"No placement model was fitted: {reasons.pop()}."
        return "No placement model was fitted: " + "; ".join(f"{k}: {v}" for k, v in fitset.skipped.items()) + "."
    if len(fits) == 1:
        (name, fit), = fits.items()
        return f"Only the {name} model could be fitted ({fit.n} trials, hold-out error {fit.holdout_mape:.1f}%)."
    by_aicc, by_hold = win["by_aicc"], win["by_holdout"]
    other = min((n for n in fits if n != by_aicc), key=lambda n: fits[n].aicc)  # the runner-up
    delta = fits[other].aicc - fits[by_aicc].aicc
    hold = ", ".join(f"{n} {f.holdout_mape:.1f} ± {f.holdout_se:.1f}%" for n, f in fits.items())
    agree = "and" if by_aicc == by_hold else f"but the {by_hold} model wins"
    return (f"The {by_aicc} model explains the speeds best by AICc (lower by {delta:.1f} than {other}) {agree} "
            f"by k-fold hold-out error per configuration ({hold}; within one standard error the model with fewer "
            f"terms wins), on {fits[by_aicc].n} trials.")


def write_fits_json(fitset: FitSet, study: str, ceilings: dict[str, float | None], path: Path) -> None:
    data = {
        "study": study,
        "fits": {name: fit.to_dict() for name, fit in fitset.fits.items()},
        "skipped": fitset.skipped,
        "winner": fitset.winner,
        "summary": winner_sentence(fitset),
        "threads": [{"placement": label, **(fit.to_dict() if fit else {"fitted": False})}
                    for label, _, fit, _ in fitset.threads],
        "ceilings_GBps": ceilings,
    }
    atomic.write_text(path, json.dumps(_finite(data), indent=2) + "\n")


def gpu_datasheet_bandwidth() -> dict[str, float | str] | None:
    """Peak memory bandwidth of this machine's first GPU from NVML (max memory clock × bus width × 2)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 — no NVIDIA driver here: there is no datasheet value to show
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        return {"gpu": name if isinstance(name, str) else name.decode(),
                "GBps": 2 * clock_mhz * 1e6 * bus_bits / 8 / 1e9}
    finally:
        pynvml.nvmlShutdown()


def _budget(study: optuna.Study, frame: pd.DataFrame) -> tuple[float | None, str]:
    campaign = stored_campaign(study)
    if campaign is not None and campaign.constraints.vram_mib:
        return float(campaign.constraints.vram_mib), "campaign budget"
    if "env_gpu_memory_mib" in frame.columns and frame["env_gpu_memory_mib"].notna().any():
        return float(frame["env_gpu_memory_mib"].dropna().iloc[0]), "GPU memory of the trials' machine"
    return None, ""


def _csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for col in ("tg_samples", "pp_samples"):
        out[col] = [";".join(f"{v:g}" for v in lst) for lst in out[col]]
    return out


def analyze(study: optuna.Study, out: Path, *, cpu_bw: float | None = None, gpu_bw: float | None = None,
            seed: int = 0, compare_with: Sequence[optuna.Study] = ()) -> Analysis:
    """Write trials.csv/.parquet, fits.json, figures (PNG+SVG), report.md and report.html under `out`; with
    `compare_with` (the same campaign's studies on other hardware) also classes.csv and the classes section."""
    out.mkdir(parents=True, exist_ok=True)
    frame = load_frame(study)
    frame.to_parquet(out / "trials.parquet", index=False)
    with atomic.replacing(out / "trials.csv") as tmp:
        _csv_frame(frame).to_csv(tmp, index=False)
    configs = config_table(frame)
    pairs = pairwise(configs, seed=seed)
    fitset = fit_study(frame, seed)
    datasheet = gpu_datasheet_bandwidth()
    ceilings = {"cpu_measured": cpu_bw, "gpu_measured": gpu_bw,
                "gpu_datasheet": datasheet["GBps"] if datasheet else None}
    write_fits_json(fitset, study.study_name, ceilings, out / "fits.json")
    imp, imp_note = importance(study)
    figures: dict[str, Path] = {}
    ok = ok_rows(frame)
    if not fitset.rows.empty:
        figures["speed_vs_cpu_gb"] = plots.speed_vs_cpu(fitset.rows, fitset.fits.get("power_law"),
                                                        fitset.fits.get("bandwidth"), out)
    if ok["vram_peak_mib"].notna().any():
        figures["pareto_vram"] = plots.pareto(ok, *_budget(study, frame), out)
    rec = recommend(study)
    workload, budget = _workload(study)
    if workload["front"].sum() >= 2:
        figures["tg_pp_front"] = plots.tg_pp_front(workload, budget, _recommended_row(workload, rec), out)
    if np.isfinite(frame["value"].astype(float)).any():
        figures["history"] = plots.history(frame, out)
    if fitset.threads:
        figures["thread_scaling"] = plots.thread_scaling(fitset.threads, out)
    if imp:
        figures["importance"] = plots.importance_bars(imp, out)
    classes = None
    if compare_with or frame.loc[frame["hardware_class"] != "", "hardware_class"].nunique() > 1:
        both, descriptions = classes_frame([study, *compare_with], loaded={study.study_name: frame})
        classes = compare_classes(both, descriptions, study_class(study), seed=seed)
        with atomic.replacing(out / "classes.csv") as tmp:
            classes.classes.to_csv(tmp, index=False)
        with atomic.replacing(out / "classes-shared.csv") as tmp:
            classes.shared.to_csv(tmp, index=False)
    analysis = Analysis(study.study_name, frame, configs, pairs, fitset, imp, imp_note, figures, out, rec, classes)
    md = render_markdown(analysis, study, datasheet, ceilings)
    atomic.write_text(out / "report.md", md)
    atomic.write_text(out / "report.html", render_html(md, f"autoinfer report: {study.study_name}"))
    return analysis


# ---------------------------------------------------------------- rendering

def _fmt(value: Any, digits: int = 4) -> str:
    """Significant digits, so 0.0123 GB and 7546 MiB both read right."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (float, np.floating)):
        return "∞" if math.isinf(value) else f"{value:.{digits}g}"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _figure(analysis: Analysis, name: str, caption: str) -> str:
    path = analysis.figures.get(name)
    return f"![{caption}]({path.name})\n\n[SVG]({path.with_suffix('.svg').name})" if path else ""


def _config_text(row: pd.Series) -> str:
    keys = [c for c in ("model", "quant", "n_gpu_layers", "n_cpu_moe", "override_tensors", "threads", "batch",
                        "ubatch", "type_k", "type_v", "flash_attn", "n_ctx") if c in row.index]
    parts = []
    for k in keys:
        v = row[k]
        if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        parts.append(f"{k}={Path(v).name if k == 'model' else v}")
    return ", ".join(parts)


def no_answer(frame: pd.DataFrame) -> str:
    """Why a study with trials has no recommendation."""
    if ok_rows(frame).empty and not ok_rows(frame.assign(drift_flagged=False)).empty:
        return "every successful trial was flagged by the drift anchor (measured while the machine had changed)"
    return "no configuration succeeded within the constraints"


def _recommendation(analysis: Analysis, study: optuna.Study, rec: Recommendation | None) -> list[str]:
    """The study's recommendation (campaign.recommend: the same answer as `status` and `export`) and its evidence."""
    configs, pairs, frame = analysis.configs, analysis.pairs, analysis.frame
    if rec is None:
        counts = frame["outcome"].value_counts().to_dict()
        return [f"Nothing to recommend: {no_answer(frame)}. "
                f"Outcomes: {', '.join(f'{k} {v}' for k, v in counts.items())}."]
    row = frame.loc[frame["trial"] == rec.trial].iloc[0]
    key = row["config_key"]
    pooled = configs.loc[configs["config_key"] == key] if not configs.empty else configs
    ci = f"95% CI {_fmt(rec.ci[0])}–{_fmt(rec.ci[1])}" if rec.ci else "no CI: a single sample"
    memory = f", peak {rec.memory_kind} {rec.memory_mib:.0f} MiB" if rec.memory_mib is not None else ""
    out = []
    if rec.busy:
        out.append(f"**Busy machine:** {rec.busy}.")
    speed = f"It runs at **{rec.speed:.2f} {rec.unit}**" if rec.unit else f"Objective **{rec.speed:.2f}**"
    out.append(f"**Use {_config_text(row)}** (trial {rec.trial}). {speed} (median of {rec.runs} run(s), {ci}"
               f"{memory}); {rec.why}.")
    if rec.alternative is not None:
        out.append(f"A {rec.alternative.line()}.")
    if (prompt := prompt_alternative(study, rec.trial)) is not None:
        out.append(f"A {prompt.line()}.")
    if not pooled.empty and pooled.iloc[0]["n"] > 1:
        c = pooled.iloc[0]
        out.append(f"Its generation samples over its search trials range {c['min']:.2f}–{c['max']:.2f} "
                   f"tok/s (mean {c['mean']:.2f}, standard deviation {_fmt(c['std'])}, n={c['n']}): quote the "
                   "median, not the maximum.")
    if not pairs.empty and pairs.iloc[0]["best"] == key:
        p = pairs.iloc[0]
        if math.isfinite(p["ratio_ci_low"]):
            if p["distinguishable"]:
                verdict = "faster: the CI excludes 1 and the rank test rejects equality"
            elif p["ratio_ci_low"] > 1.0:
                verdict = (f"not yet distinguishable: the CI excludes 1 but with {p['n_best']} and {p['n_other']} "
                           "samples the rank test cannot reject equality; measure more repetitions")
            else:
                verdict = "not distinguishable from it: the CI includes 1"
            out.append(f"Against the runner-up ({p['other_median']:.2f} tok/s) the ratio of medians is "
                       f"{p['ratio']:.3f} (95% CI {p['ratio_ci_low']:.3f}–{p['ratio_ci_high']:.3f}, Mann-Whitney "
                       f"p = {p['p_mannwhitney']:.3g}): {verdict}.")
        else:
            out.append(f"The runner-up reached {p['other_median']:.2f} tok/s; with a single sample on one side "
                       "the difference has no CI. Re-measure both, interleaved, before trusting the order.")
    out.append(f"The command (the same configuration): `autoinfer export --study {study.study_name} --format server`.")
    return out


def _classes_section(classes: ClassComparison | None) -> list[str]:
    if classes is None:
        return []
    md = ["## Hardware classes", "",
          "Each class ranked on its own (a study never mixes classes); the reference is this study's class.", "",
          _table(["class", "hardware", "studies", "configurations", "best configuration", "median tok/s", "95% CI",
                  "peak VRAM MiB"],
                 [[("**" + r["hardware_class"] + "** (reference)") if r["reference"] else r["hardware_class"],
                   r["description"], r["studies"], r["configurations"], _config_text(r), r.get("median"),
                   f"{_fmt(r.get('ci_low'))}–{_fmt(r.get('ci_high'))}", r.get("vram_peak_mib")]
                  for _, r in classes.classes.iterrows()]), ""]
    if classes.shared.empty:
        return md + ["No configuration was measured on both the reference class and another one, so no speed ratio "
                     "between the machines can be given: absolute numbers of different machines are not comparable "
                     "across different configurations.", ""]
    return md + ["The same configuration on another class, against the reference (ratio of medians, bootstrap CI):", "",
                 _table(["class", "configuration", "reference median", "median", "ratio", "95% CI",
                         "p (Mann-Whitney)"],
                        [[r["hardware_class"], _config_text(r), r["reference_median"], r["median"], r["ratio"],
                          f"{_fmt(r['ratio_ci_low'], 3)}–{_fmt(r['ratio_ci_high'], 3)}", r["p_mannwhitney"]]
                         for _, r in classes.shared.iterrows()]), ""]


def _workload(study: optuna.Study) -> tuple[pd.DataFrame, float | None]:
    """The configurations within the memory budget (each once, its trials pooled, drift-flagged trials left out)
    with their tg and pp medians, whether they are on the generation-vs-prompt front, and the prompt weights each
    front point is best for; and the budget."""
    campaign = stored_campaign(study)
    budget = campaign.constraints.vram_mib if campaign else None
    within = [(p, trials) for p, trials in configurations(study, flagged_trials(study))
              if budget is None or p.mem_mib <= budget]
    front = tg_pp_front([p for p, _ in within], budget)
    on = [p.trial.number for p in front]
    weights = pp_weights(front)
    rows = []
    for p, trials in sorted(within, key=lambda c: on.index(c[0].trial.number) if c[0].trial.number in on else len(on)):
        w_low, w_high = weights.get(p.trial.number, (math.nan, math.nan))
        rows.append({"trial": p.trial.number, "trials": trials, "tg": p.tg, "pp": p.pp, "mem_mib": p.mem_mib,
                     "front": p.trial.number in on, "w_low": w_low, "w_high": w_high})
    columns = ["trial", "trials", "tg", "pp", "mem_mib", "front", "w_low", "w_high"]
    return pd.DataFrame(rows, columns=columns), budget


def _recommended_row(workload: pd.DataFrame, rec: Recommendation | None) -> int | None:
    """The first trial of the recommended configuration, as the workload frame names it."""
    if rec is None:
        return None
    return next((int(r["trial"]) for _, r in workload.iterrows() if rec.trial in r["trials"]), None)


def _workload_section(analysis: Analysis, study: optuna.Study, rec: Recommendation | None) -> list[str]:
    """The generation-vs-prompt front within the memory budget, the recommendation marked: a prompt-heavy workload
    weighs pp more and may pick another point of it."""
    workload, budget = _workload(study)
    front = workload[workload["front"]]
    if len(front) < 2:
        return []
    marked = _recommended_row(workload, rec)
    within = f"within the budget of {budget:.0f} MiB" if budget else "(no memory budget set)"
    rows = [[", ".join(map(str, r["trials"])), r["tg"], r["pp"], r["mem_mib"], (r["tg"] * r["pp"]) ** 0.5,
             f"{r['w_low']:.2f}–{r['w_high']:.2f}" if np.isfinite(r["w_low"]) else "none",
             "recommended" if r["trial"] == marked else ""] for _, r in front.iterrows()]
    note = ("" if rec is None or marked in set(front["trial"]) else
            f" The recommendation (trial {rec.trial}) is not on this front: its configuration's medians are beaten "
            "on both by another, while the recommendation judges each configuration on its trustworthy runs "
            "(confirmation runs where it was confirmed).")
    return ["## Generation vs prompt processing", "",
            f"Configurations {within} that no other beats on both generation (tg) and prompt (pp) tok/s (each "
            "configuration once, the samples of its trials pooled, those the drift anchor flagged left out). The "
            "campaign's objective weighs them as `objective:` says; a workload that weighs prompts by w "
            "(`objective: {tg: 1-w, pp: w}`) is served best by the front point whose range holds w, and can pick it: "
            f"`autoinfer export --study {study.study_name} --objective pp` (or `balanced`)." + note, "",
            _table(["trials", "tg tok/s", "pp tok/s", "peak MiB", "sqrt(tg·pp)", "best for pp weight w", ""], rows),
            "", _figure(analysis, "tg_pp_front", "generation vs prompt tok/s within the budget"), ""]


def _recommended_key(frame: pd.DataFrame, rec: Recommendation | None) -> str | None:
    mine = frame.loc[frame["trial"] == rec.trial, "config_key"] if rec is not None else ()
    return mine.iloc[0] if len(mine) else None


def _left_out(frame: pd.DataFrame) -> str:
    """Which trials the tables, fits and figures leave out because the drift anchor flagged them (ok_rows)."""
    flagged = frame.loc[frame["drift_flagged"], "trial"] if "drift_flagged" in frame else ()
    if not len(flagged):
        return ""
    redone = frame.loc[frame["remeasure_of"].isin(flagged), "trial"] if "remeasure_of" in frame else ()
    again = f"; measured again as trial(s) {_numbers(redone)}" if len(redone) else ""
    return (f", without the trial(s) the drift anchor flagged ({_numbers(flagged)}: measured while the machine had "
            f"changed{again}), which the fits and figures leave out too")


def _numbers(trials: Any) -> str:
    return ", ".join(str(int(t)) for t in sorted(trials))


def render_markdown(analysis: Analysis, study: optuna.Study, datasheet: dict[str, Any] | None,
                    ceilings: dict[str, float | None]) -> str:
    frame, fitset = analysis.frame, analysis.fitset
    md: list[str] = [f"# autoinfer report: {study.study_name}", "", "## Recommendation", ""]
    rec = analysis.recommendation
    md += [" ".join(_recommendation(analysis, study, rec)), ""]
    check = deploy.stored(study)
    md += ["Deployment check (the recommended `llama-server` command, started once as printed and asked for a "
           f"completion): {check.line() if check else 'not run (it runs at the end of `autoinfer sweep`)'}.", ""]

    md += ["## What explains the speed", "", winner_sentence(fitset), ""]
    if fitset.fits:
        rows = []
        for name, fit in fitset.fits.items():
            for key, value in fit.params.items():
                lo, hi = fit.ci[key]
                rows.append([name, key, value, f"{_fmt(lo)}–{_fmt(hi)}", fit.aicc, f"{fit.holdout_mape:.1f}%", fit.n])
        md += [_table(["model", "parameter", "estimate", "95% bootstrap CI", "AICc", "hold-out MAPE", "trials"],
                      rows), ""]
    bw = fitset.fits.get("bandwidth")
    if bw is not None:
        gpu_ceiling = (f"{ceilings['gpu_measured']:.0f} GB/s measured" if ceilings.get("gpu_measured") else
                       f"{datasheet['GBps']:.0f} GB/s datasheet ({datasheet['gpu']}, NVML on the analysing machine)"
                       if datasheet else "no ceiling given (--gpu-bw) and no GPU on the analysing machine")
        cpu_ceiling = (f"{ceilings['cpu_measured']:.0f} GB/s measured" if ceilings.get("cpu_measured")
                       else "no ceiling given (--cpu-bw)")
        md += [f"Fitted bandwidths: CPU side **{_fmt(bw.params['BW_cpu_GBps'], 3)} GB/s** (ceiling: {cpu_ceiling}); "
               f"GPU side **{_fmt(bw.params['BW_gpu_GBps'], 3)} GB/s** (ceiling: {gpu_ceiling}); fixed cost per "
               f"token {bw.params['t0_s'] * 1e3:.3g} ms.", ""]
        if not bw.extra.get("identifiable", True):
            lo, hi = bw.extra["cpu_marginal_GBps_ci"] or (math.nan, math.nan)
            md += ["Every trial reads the same total bytes per token (one model file), so the fixed cost and the "
                   "two bandwidths are not separately determined. What is: each GB read per token moved from GPU to "
                   f"CPU costs as much as reading it at **{_fmt(bw.extra['cpu_marginal_GBps'], 3)} GB/s** "
                   f"(95% CI {_fmt(lo, 3)}–{_fmt(hi, 3)}).", ""]
    pw = fitset.fits.get("power_law")
    if pw is not None:
        md += [f"Power law with M free: α = {pw.params['alpha']:.3g} (CI {_fmt(pw.ci['alpha'][0], 3)}–"
               f"{_fmt(pw.ci['alpha'][1], 3)}) at M = {pw.params['M']:.3g} GB"
               + (" — at the edge of the search: the data cannot tell this power law from an exponential"
                  if pw.extra["M_at_search_bound"] else "")
               + f". What the data pins down is the slope: ln(tok/s) changes by "
               f"{pw.extra['log_slope_per_gb']:.3g} per GB moved to RAM (CI {pw.extra['log_slope_per_gb_ci'][0]:.3g}–"
               f"{pw.extra['log_slope_per_gb_ci'][1]:.3g}) around {pw.extra['at_gb']:.3g} GB. "
               "α depends on the M it is paired with:",
               "", _table(["M (GB)", "α", "Σ log residual²"],
                          [[r["M"], r["alpha"], r["rss_log"]] for r in pw.extra["alpha_vs_M"]]), ""]
    md += [_figure(analysis, "speed_vs_cpu_gb", "tok/s vs GB in RAM"), ""]

    md += ["## Top configurations", ""]
    if not analysis.configs.empty:
        top = analysis.configs.head(8)
        chosen = _recommended_key(frame, rec)
        md += ["Each configuration's search samples, pooled over its trials" + _left_out(frame) + ". "
               + ("The recommendation is marked: a confirmation measured the leaders again, interleaved, and its "
                  "runs decide between them, not these medians." if rec is not None and rec.confirmed else
                  "The recommendation is marked."), "",
               _table(["configuration", "median tok/s", "95% CI", "samples", "trials", "peak VRAM MiB", ""],
                      [[_config_text(r), r["median"], f"{_fmt(r['ci_low'])}–{_fmt(r['ci_high'])}", r["n"],
                        r["trials"], r["vram_peak_mib"], "recommended" if r["config_key"] == chosen else ""]
                       for _, r in top.iterrows()]), ""]
    if not analysis.pairs.empty:
        md += ["The fastest of this table against each runner-up (ratio of medians, bootstrap CI; distinguishable "
               "only when the CI excludes 1):", "",
               _table(["runner-up median", "ratio", "95% CI", "p (Mann-Whitney)", "distinguishable"],
                      [[r["other_median"], r["ratio"], f"{_fmt(r['ratio_ci_low'], 3)}–{_fmt(r['ratio_ci_high'], 3)}",
                        r["p_mannwhitney"], "yes" if r["distinguishable"] else "no"]
                       for _, r in analysis.pairs.iterrows()]), ""]

    md += _classes_section(analysis.classes)

    md += ["## Memory", "", _figure(analysis, "pareto_vram", "Pareto front tok/s vs VRAM")
           or "No trial recorded its device memory.", ""]
    md += _workload_section(analysis, study, rec)

    md += ["## Threads", ""]
    if fitset.threads:
        rows = []
        for label, group, fit, why in fitset.threads:
            if fit is None:
                best_t = group.loc[group["tg_median"].idxmax(), "threads"]
                rows.append([label, int(best_t), "—", "—", f"not fitted: {why}"])
                continue
            rows.append([label, int(fit.extra["best_threads_measured"]), fit.params["t_opt"],
                         f"{fit.holdout_mape:.1f}%", "**yes**" if fit.extra["more_threads_slower"] else "no"])
        md += [_table(["placement", "fastest measured threads", "model optimum", "hold-out MAPE",
                       "more threads slower"], rows), ""]
        slower = [label for label, _, fit, _ in fitset.threads if fit is not None and fit.extra["more_threads_slower"]]
        if slower:
            md += [f"More threads were slower for {len(slower)} placement(s): past the optimum the per-thread cost "
                   "outweighs the parallel gain; do not default to every core.", ""]
        md += [_figure(analysis, "thread_scaling", "thread scaling"), ""]
    else:
        md += ["No placement was measured at two or more thread counts.", ""]

    md += ["## Parameter importance", ""]
    if analysis.importance:
        md += [_table(["parameter", "importance"], [[k, v] for k, v in analysis.importance.items()]), "",
               _figure(analysis, "importance", "parameter importance"), ""]
    else:
        md += [f"Not computed: {analysis.importance_note}.", ""]

    md += ["## Search history", "", _figure(analysis, "history", "optimization history"), ""]

    counts = frame["outcome"].value_counts()
    md += ["## Data", "", f"{len(frame)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".", ""]
    kept = Store(study).study_record()
    imported = kept.imported_files
    if imported:
        md += ["Imported from: " + ", ".join(f"`{Path(p).name}`" for p in imported) + ".", ""]
        envs = [c for c in frame.columns if c.startswith("env_gpu_name")]
        if envs:
            md += ["Hardware of the imported rows: " + ", ".join(sorted(frame[envs[0]].dropna().astype(str).unique()))
                   + ".", ""]
    junk = kept.import_junk
    if junk:
        md += [f"{len(junk)} line(s) of the imported files were not results and were skipped:", "",
               _table(["file", "line", "reason"], [[Path(j.file).name, j.line, j.reason] for j in junk]), ""]
    md += ["Files: `trials.csv`, `trials.parquet` (one row per trial), `fits.json` (every fit with CIs, AICc, "
           "hold-out error).", ""]
    return "\n".join(md)


_CSS = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
        "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
        "text-align:left}img{max-width:100%}code{background:#f4f4f4;padding:0 .2rem}")


def render_html(md: str, title: str) -> str:
    """The same report as one HTML page; figures are referenced relatively, next to it."""
    from html import escape

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(md)
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n{body}</body></html>\n")
