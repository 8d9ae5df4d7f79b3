"""Hardware classes side by side: a study never mixes classes (autoinfer.coordination.hardware), so a lab that ran one
campaign on two kinds of machine has one study per class, and this reads them together.

Each class gets its own best configuration (what to run on that machine), and every configuration measured on
both the reference class and another one gets the ratio of their medians with a bootstrap CI: how much faster the
same command line runs there. Absolute numbers never transfer between machines (shared/notes/anchors.md), so the
ratio is only given where both classes measured the very same configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import optuna
import pandas as pd

from autoinfer.analysis.dataset import CONFIG_COLUMNS, config_table, load_frame
from autoinfer.coordination.hardware import describe
from autoinfer.measure.stats import compare
from autoinfer.store.trials import Store


@dataclass(frozen=True)
class ClassComparison:
    reference: str  # the class every ratio is taken against (the analysed study's)
    classes: pd.DataFrame  # one row per class: its best configuration, median, CI, peak memory
    shared: pd.DataFrame  # one row per configuration measured on the reference and on another class


def study_class(study: optuna.Study) -> str:
    """The class a study is bound to; a study from before binding (an import) is a class of its own."""
    bound = Store(study).study_record().hardware_class
    return (bound.digest if bound is not None else "") or f"study {study.study_name}"


def classes_frame(studies: Sequence[optuna.Study], loaded: Mapping[str, pd.DataFrame] | None = None,
                  ) -> tuple[pd.DataFrame, dict[str, str]]:
    """The trials of several studies in one table with `study` and `hardware_class` columns, and a readable
    description of each class. Trials that carry no class of their own (imported rows) take their study's.
    `loaded`: frames already read (by study name), which are not read again nor changed."""
    frames, descriptions = [], {}
    for study in studies:
        bound = Store(study).study_record().hardware_class
        digest = study_class(study)
        descriptions.setdefault(digest, describe(bound.fields) if bound is not None else "unknown hardware")
        frame = (loaded or {}).get(study.study_name)
        frame = load_frame(study, placement=False) if frame is None else frame
        frame = frame.assign(study=study.study_name,
                             hardware_class=frame["hardware_class"].replace("", digest).fillna(digest))
        for other in set(frame["hardware_class"]) - set(descriptions):
            descriptions[other] = "unknown hardware"
        frames.append(frame)
    return pd.concat(frames, ignore_index=True), descriptions


def compare_classes(frame: pd.DataFrame, descriptions: dict[str, str], reference: str,
                    seed: int = 0) -> ClassComparison:
    """Per class its best configuration; per configuration shared with the reference class, other / reference."""
    tables = {c: config_table(frame[frame["hardware_class"] == c]) for c in frame["hardware_class"].unique()}
    rows: list[dict[str, Any]] = []
    for digest, table in tables.items():
        studies = sorted(set(frame.loc[frame["hardware_class"] == digest, "study"]))
        row: dict[str, Any] = {"hardware_class": digest, "description": descriptions.get(digest, ""),
                               "studies": ", ".join(studies), "configurations": len(table)}
        if not table.empty:
            best = table.iloc[0]
            row.update({**{c: best[c] for c in CONFIG_COLUMNS if c in table.columns}, "best_config": best["config_key"],
                        "median": best["median"], "ci_low": best["ci_low"], "ci_high": best["ci_high"],
                        "n": best["n"], "vram_peak_mib": best["vram_peak_mib"]})
        rows.append(row)
    classes = pd.DataFrame(rows)
    classes["reference"] = classes["hardware_class"] == reference
    shared: list[dict[str, Any]] = []
    ref = tables.get(reference, pd.DataFrame())
    for digest, table in tables.items():
        if digest == reference or table.empty or ref.empty:
            continue
        both = ref.merge(table[["config_key", "median", "n", "samples"]], on="config_key", suffixes=("_ref", "_other"))
        for _, r in both.iterrows():
            item = {**{c: r[c] for c in CONFIG_COLUMNS if c in both.columns}, "config_key": r["config_key"],
                    "hardware_class": digest, "reference_median": r["median_ref"],
                    "median": r["median_other"], "ratio": r["median_other"] / r["median_ref"],
                    "ratio_ci_low": math.nan, "ratio_ci_high": math.nan, "p_mannwhitney": math.nan,
                    "n_reference": r["n_ref"], "n": r["n_other"]}
            if r["n_ref"] >= 2 and r["n_other"] >= 2:
                c = compare(r["samples_other"], r["samples_ref"], seed=seed)
                item.update({"ratio_ci_low": c.ratio_ci[0], "ratio_ci_high": c.ratio_ci[1], "p_mannwhitney": c.p_value})
            shared.append(item)
    return ClassComparison(reference, classes, pd.DataFrame(shared))
