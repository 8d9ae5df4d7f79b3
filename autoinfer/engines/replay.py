"""Engine "replay": answers trials from a table of measured configurations, so search strategies can be compared
offline in seconds.

The table is a CSV: parameter columns (any campaign parameter: n_cpu_moe, placement, ubatch, …), then `tg`, `pp`
(tok/s medians) and `vram_mib` and/or `rss_mib` (peaks; `vram_gpu0_mib`, `vram_gpu1_mib`, … per GPU for tables
measured on several GPUs, where `vram_mib` is the largest of them); optional `tg_samples`/`pp_samples` (repetitions,
space-separated) give each row its measured noise, which replay draws from; an optional `outcome` column marks rows
that failed (oom, crash, …). A `<table>.shape.json` beside it (written by benchmarks/make_table.py) describes the
model so the memory model can be used on the table without the GGUF.

A row is one process's measurement, so replaying its samples again replays its luck: a configuration measured
twice (the search's `again`, a confirmation) agrees with itself where a fresh process would not. A table measured
in several processes per configuration (benchmarks/make_table.py --processes) says which in a `process` column:
each run then replays one of its configuration's processes, drawn at random, as a new process would measure it,
and the configuration is worth the median of its processes (sweep/replay_cli.py, truth). A generated table
knows more: its `<table>.noise-free.csv` (benchmarks/synthetic_tables.py) holds each row's tg and pp before noise and
the noise's standard deviations (log scale) per process and per repetition. With engine option `fresh_noise`, each
run draws its samples from those, around the row's noise-free value, as a new process would measure them; where the
sidecar has `slow_share` and `slow_log`, a process runs slow as a whole (tg and pp by exp(-slow_log)) with that
chance, as two threads on a 2-core host did (benchmarks/results/cpu-small-threads.md).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from autoinfer.engines.base import Engine, Measurement, Outcome, RunContext, TrialConfig, register
from autoinfer.engines.knobs import ANY, LLAMA_KNOBS, llama_preferred_values
from autoinfer.errors import UserError
from autoinfer.model.shape import ModelShape

#: Columns of a table that are measurements, never parameters (also for `autoinfer import`).
RESULT_COLUMNS = ("tg", "pp", "vram_mib", "rss_mib", "tg_samples", "pp_samples", "tg_sd", "pp_sd", "outcome", "reason",
                  "wall_s", "process")


def shape_path(table: Path) -> Path:
    return table.with_name(table.stem + ".shape.json")


def noise_free_path(table: Path) -> Path:
    """The sidecar with each row's tg and pp before noise (same row order), which only a generator can know."""
    return table.with_name(table.stem + ".noise-free.csv")


#: Columns of a noise-free sidecar that `fresh_noise` draws from: per kind, the value before noise and the log SDs.
FRESH_COLUMNS = tuple(f"{kind}{suffix}" for kind in ("tg", "pp") for suffix in ("", "_process_sd", "_repetition_sd"))
#: Optional columns of the sidecar: a process's chance to run slow as a whole, and the log factor it then loses.
SLOW_COLUMNS = ("slow_share", "slow_log")


def read_table(path: Path) -> pd.DataFrame:
    """Load and check a replay table; UserError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"replay table {path} does not exist; make one with benchmarks/make_table.py")
    try:
        df = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"replay table {path} is not a readable CSV ({str(exc).splitlines()[0]})") from None
    if not {"tg", "pp"} & set(df.columns):
        raise UserError(f"replay table {path} has no 'tg' or 'pp' column; add the measured tok/s")
    if not parameter_columns(df):
        raise UserError(f"replay table {path} has no parameter columns besides {', '.join(RESULT_COLUMNS)}")
    for column in df.columns:
        if df[column].isna().all():
            raise UserError(f"replay table {path}: column {column!r} is empty; fill it in or delete it")
        if pd.api.types.is_bool_dtype(df[column]):  # True/False: a choice between two labels, not a number
            df[column] = df[column].astype(str)
    for column in ("tg", "pp", "vram_mib", "rss_mib", "wall_s"):
        if column in df and not pd.api.types.is_numeric_dtype(df[column]):
            bad = [v for v in df[column].dropna() if _not_number(v)]
            if bad:
                raise UserError(f"replay table {path}: column {column!r} holds {str(bad[0])[:40]!r}, not a number; "
                                "give tok/s and MiB as numbers")
            df[column] = [float(str(v)) for v in df[column]]  # long digit strings become inf, refused below
        if column in df and not np.isfinite(df[column].dropna().to_numpy(dtype=float)).all():
            raise UserError(f"replay table {path}: column {column!r} holds an infinite value; give finite numbers")
        if column in df and (df[column].dropna() < 0).any():
            raise UserError(f"replay table {path}: column {column!r} holds a negative value; rates and MiB are >= 0")
    if "process" in df:
        process = pd.to_numeric(df["process"], errors="coerce")
        if process.isna().any() or (process < 0).any() or not (process == process.round()).all():
            raise UserError(f"replay table {path}: column 'process' holds a value that is not a whole number >= 0; "
                            "number each configuration's processes 0, 1, …")
        twice = df.duplicated([*parameter_columns(df), "process"])
        if twice.any():
            raise UserError(f"replay table {path}: row {int(twice.idxmax())} repeats another row's configuration and "
                            "process number; give each process of a configuration its own number")
    if "outcome" in df:
        known = {o.value for o in Outcome}
        bad = [v for v in df["outcome"].dropna() if str(v) not in known]
        if bad:
            raise UserError(f"replay table {path}: outcome {str(bad[0])[:40]!r} is not one of {', '.join(sorted(known))}")
    for column in ("tg_samples", "pp_samples"):
        if column in df:
            for value in df[column].dropna():
                if _not_number_list(value):
                    raise UserError(f"replay table {path}: {column} {str(value)[:40]!r} is not space-separated "
                                    "numbers")
    return df


def _not_number(value: object) -> bool:
    try:
        float(str(value))
    except ValueError:
        return True
    return False


def _not_number_list(value: object) -> bool:
    """Not a space-separated list of finite, non-negative numbers."""
    return not isinstance(value, str) or any(_not_number(v) or not 0 <= float(v) < math.inf for v in value.split())


PER_GPU_COLUMN = re.compile(r"vram_gpu(\d+)_mib")


def parameter_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in RESULT_COLUMNS and not PER_GPU_COLUMN.fullmatch(c)]


def configurations(df: pd.DataFrame) -> pd.Series:
    """Each row's configuration as a number: rows of one configuration (its processes, in a table with a `process`
    column) share it."""
    return df.groupby(parameter_columns(df), dropna=False, sort=False).ngroup()


def _per_gpu(row: pd.Series) -> tuple[float, ...]:
    """A row's per-GPU peaks in GPU order; empty unless every GPU's is there."""
    columns = sorted((int(m.group(1)), c) for c in row.index if (m := PER_GPU_COLUMN.fullmatch(c)))
    values = [_number(row[c]) for _, c in columns]
    return tuple(v for v in values if v is not None) if None not in values else ()


def _samples(value: Any) -> tuple[float, ...]:
    if isinstance(value, str) and value.strip():
        return tuple(float(v) for v in value.split())
    return ()


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


class ReplayEngine(Engine):
    """Looks a configuration up in the table (exact match, else the nearest row) and replays its noise."""

    name = "replay"

    def __init__(self, table: str | Path, seed: int = 0, match: str = "nearest", fresh_noise: bool = False) -> None:
        if match not in ("nearest", "exact"):
            raise UserError(f"engine_options.match {match!r} is not one of nearest, exact")
        self.table_path = Path(table)
        self.df = read_table(self.table_path)
        if not isinstance(fresh_noise, bool):
            raise UserError(f"engine_options.fresh_noise {fresh_noise!r} is not true or false")
        self.fresh = _fresh_noise(self.table_path, len(self.df)) if fresh_noise else None
        self.params = parameter_columns(self.df)
        self.knobs = {name: LLAMA_KNOBS.get(name, ANY) for name in self.params}
        #: GPUs the table was measured on (its per-GPU peak columns, else one), never this host's: a one-GPU table
        #: replayed on a host of four was predicted per GPU at a quarter of its peaks. The memory model predicts each.
        self.n_gpus = sum(1 for c in self.df.columns if PER_GPU_COLUMN.fullmatch(c)) or 1
        self.match = match
        self.rng = np.random.default_rng(seed)
        numeric = {c: pd.api.types.is_numeric_dtype(self.df[c]) for c in self.params}
        self._numeric = [c for c in self.params if numeric[c]]
        self._categorical = [c for c in self.params if not numeric[c]]
        spans = {c: float(self.df[c].max() - self.df[c].min()) or 1.0 for c in self._numeric}
        self._spans = np.array([spans[c] for c in self._numeric])
        self._num_values = self.df[self._numeric].to_numpy(dtype=float)
        self._cat_values = self.df[self._categorical].astype(str).to_numpy()
        #: per row, the rows of its configuration's processes (a table with a `process` column); empty without one
        self._process_of: dict[int, list[int]] = {}
        if "process" in self.df:
            config = configurations(self.df)
            members = {c: rows.tolist() for c, rows in config.groupby(config).indices.items()}
            self._process_of = {i: members[c] for i, c in enumerate(config)}

    def preferred_values(self, device_budget: bool) -> dict[str, Any]:
        """The table holds llama.cpp measurements: what llama.cpp prefers."""
        return llama_preferred_values(device_budget)

    def check(self) -> None:
        """A table engine runs anywhere."""

    def resolve_models(self, entries: list[str]) -> dict[str, str]:
        """Model entries are labels here: the table already holds the measurements."""
        return {entry: entry for entry in entries}

    def model_shape(self, model: str) -> ModelShape | None:
        """The model's shape from the table's sidecar, or None when the table has none."""
        path = shape_path(self.table_path)
        return ModelShape.from_json(path.read_text()) if path.is_file() else None

    def row_for(self, config: TrialConfig) -> tuple[int, float]:
        """Index of the matching row and its distance (0 for an exact match)."""
        values = config.to_params()
        missing = [c for c in self.params if c not in values]
        if missing:
            raise UserError(f"replay table {self.table_path} needs parameter {missing[0]!r}; put it in the campaign space")
        dist = np.zeros(len(self.df))
        if self._numeric:
            target = np.array([float(values[c]) for c in self._numeric])
            dist += (np.abs(self._num_values - target) / self._spans).sum(axis=1)
        if self._categorical:
            target_c = np.array([str(values[c]) for c in self._categorical])
            dist += (self._cat_values != target_c).sum(axis=1)
        index = int(np.argmin(dist))
        return index, float(dist[index])

    def run(self, config: TrialConfig, ctx: RunContext) -> Measurement:
        started = time.monotonic()
        index, distance = self.row_for(config)
        if self._process_of:  # a new process: one of the configuration's measured processes
            index = int(self.rng.choice(self._process_of[index]))
        if distance > 0 and self.match == "exact":
            return Measurement(Outcome.REJECTED, reason="no exact row for this configuration in the replay table",
                               wall_s=time.monotonic() - started)
        row = self.df.iloc[index]
        metrics = {"replay_row": index, "replay_distance": distance}
        vram, rss = _number(row.get("vram_mib")), _number(row.get("rss_mib"))
        # the nearest row stands in where the table lacks the configuration, and says so (Measurement.stand_in): on
        # the first H100 table `-ngl 28` with the last 16 layers' experts in RAM replays `-ngl 99`'s 12762 MiB, where
        # an H200 measured it at 6912 (benchmarks/tables/h200-35b-whole-layers.csv)
        of_row = {"vram_peak_mib": vram, "vram_per_gpu_mib": _per_gpu(row), "rss_peak_mib": rss,
                  "stand_in": distance > 0, "metrics": metrics}
        outcome = str(row.get("outcome", "ok") or "ok") if not pd.isna(row.get("outcome", "ok")) else "ok"
        wall = _number(row.get("wall_s"))
        if outcome != Outcome.OK.value:
            return Measurement(Outcome(outcome), reason=f"replayed from row {index}", **of_row,
                               wall_s=wall or time.monotonic() - started)
        free = self.fresh.loc[row.name] if self.fresh is not None else None  # the row before noise (fresh_noise)
        slow = self._slow(free)
        tg = self._draw(row, "tg", config.repetitions if config.n_gen else 0, free, slow)
        pp = self._draw(row, "pp", config.repetitions if config.n_prompt else 0, free, slow)
        first = tg or pp
        if first and ctx.on_first_sample is not None and ctx.on_first_sample(first[0]):
            return Measurement(Outcome.PRUNED, reason="first repetition far below the best so far",
                               tg_samples=tg[:1], pp_samples=() if tg else pp[:1], **of_row,
                               wall_s=(wall or 0.0) / max(config.repetitions, 1))
        lacks = f"the table has no row for this configuration: row {index}, the nearest, stands in" if distance else ""
        return Measurement(Outcome.OK, reason=lacks, tg_samples=tg, pp_samples=pp, **of_row,
                           wall_s=wall if wall is not None else time.monotonic() - started)

    def _slow(self, free: pd.Series | None) -> float:
        """The log factor this run's process loses as a whole (`free`, the row's sidecar, with slow processes), else
        0."""
        if free is None or "slow_share" not in free:
            return 0.0
        return float(free["slow_log"]) if self.rng.random() < free["slow_share"] else 0.0

    def _draw(self, row: pd.Series, kind: str, n: int, free: pd.Series | None, slow: float) -> tuple[float, ...]:
        """n repetitions: drawn as a fresh process would measure them (`free`, the row's sidecar, under fresh_noise;
        `slow`, the log factor the process loses), else resampled from the row's samples when it has them, else its
        median repeated."""
        if n == 0 or kind not in row or pd.isna(row[kind]):
            return ()
        if free is not None:
            shift = self.rng.normal(0.0, free[f"{kind}_process_sd"]) - slow  # one per run: the process's own luck
            logs = shift + self.rng.normal(0.0, free[f"{kind}_repetition_sd"], n)
            return tuple(float(v) for v in free[kind] * np.exp(logs))
        samples = _samples(row.get(f"{kind}_samples"))
        if samples:
            return tuple(float(v) for v in self.rng.choice(samples, size=n, replace=True))
        return (float(row[kind]),) * n


@register("replay")
def _factory(**options: Any) -> ReplayEngine:
    if "table" not in options:
        raise UserError("engine 'replay' needs engine_options.table: the CSV of measured configurations")
    unknown = set(options) - {"table", "seed", "match", "fresh_noise"}
    if unknown:
        raise UserError(f"engine_options.{min(unknown)}: engine 'replay' takes only table, seed, match and fresh_noise")
    return ReplayEngine(**options)


def _fresh_noise(table: Path, rows: int) -> pd.DataFrame:
    """The noise-free sidecar that fresh_noise draws from; UserError where the table has none (a measured table)."""
    path = noise_free_path(table)
    if not path.is_file():
        raise UserError(f"engine_options.fresh_noise needs {path.name} beside the table (each row's speeds before "
                        f"noise, as benchmarks/synthetic_tables.py writes it); a measured table has none: leave the "
                        f"option out")
    free = pd.read_csv(path)
    missing = [c for c in FRESH_COLUMNS if c not in free]
    if missing or len(free) != rows:
        raise UserError(f"{path} needs {rows} rows and columns {', '.join(FRESH_COLUMNS)}"
                        + (f" (missing {', '.join(missing)})" if missing else f", not {len(free)} rows")
                        + "; write it again with benchmarks/synthetic_tables.py")
    slow = [c for c in SLOW_COLUMNS if c in free]
    if slow and len(slow) < len(SLOW_COLUMNS):
        raise UserError(f"{path} has {slow[0]} without {', '.join(c for c in SLOW_COLUMNS if c not in slow)}: slow "
                        "processes need both (the chance and the log factor); write it again with "
                        "benchmarks/synthetic_tables.py")
    return free
