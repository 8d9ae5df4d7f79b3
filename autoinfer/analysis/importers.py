"""Outside data → rows the analysis understands: llama-bench JSON/JSONL, a generic CSV, and the seed study's files.

Every row keeps its source file and line. A line that is not a result (a stderr fragment, a row without a speed,
a row of the wrong width) becomes a JunkRow with its reason: reported, never mixed in. Files that hold no
configuration measurements (logs, derived summaries, simulations) are refused with the reason.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from autoinfer.engines.base import Outcome
from autoinfer.engines.replay import PER_GPU_COLUMN, RESULT_COLUMNS, shape_path
from autoinfer.errors import UserError

# The seed study's hardware (PROVENANCE.txt; configs/rtx3070_8gb.json; qjl_*.json "gpu_name").
SEED_ENV = {"gpu_name": "NVIDIA GeForce RTX 3070", "gpu_memory_mib": 8192,
            "engine": "llama-cpp-python (seed scripts)", "origin": "qwen35-moe-offload"}
# Rows whose label names no quantisation ran the Q3_K_M file (phase 5 log: models/Qwen3.5-35B-A3B-Q3_K_M.gguf;
# scripts/autoresearch_results.json counts 458 Q3_K_M rows).
SEED_DEFAULT_QUANT = "Q3_K_M"
# The Rust benchmark's 13 columns: phase 9 and 12 rows follow it under a header that says otherwise.
RUST_SCHEMA = ("exp_id", "tok_s", "vram_mb", "n_ctx", "kv_type_k", "kv_type_v", "flash_attn", "n_gpu", "n_batch",
               "n_ubatch", "label", "status", "notes")

_ALIASES = {
    "tok_s": "tg", "tok_per_sec": "tg", "tps": "tg", "tg_tok_s": "tg", "tg": "tg",
    "pp": "pp", "pp_tok_s": "pp",
    "vram_mb": "vram_mib", "vram_peak_mb": "vram_mib", "vram_peak": "vram_mib", "vram_mib": "vram_mib",
    "vram_peak_mib": "vram_mib", "rss_mib": "rss_mib", "rss_peak_mib": "rss_mib",
    "n_gpu": "n_gpu_layers", "n_gpu_layers": "n_gpu_layers", "ngl": "n_gpu_layers",
    "n_batch": "batch", "batch": "batch", "batch_size": "batch",
    "n_ubatch": "ubatch", "ubatch": "ubatch", "ubatch_size": "ubatch",
    "kv_type_k": "type_k", "type_k": "type_k", "kv_type_v": "type_v", "type_v": "type_v",
    "n_threads": "threads", "threads": "threads", "n_ctx": "n_ctx", "ctx": "n_ctx",
    "gen": "n_gen", "gen_tokens": "n_gen", "n_gen": "n_gen", "tokens": "n_gen",
    "flash_attn": "flash_attn", "n_cpu_moe": "n_cpu_moe", "status": "status",
}
_QUANTS = {"iq2xxs": "IQ2_XXS", "iq2m": "IQ2_M", "iq3s": "IQ3_S", "iq4nl": "IQ4_NL", "iq4xs": "IQ4_XS",
           "q2k": "Q2_K", "q3km": "Q3_K_M"}
_REPLICATE = re.compile(r"(_final)?_r\d+$|_push_\d+$|_stability_\d+$")
_MEASURED = {"ok", "keep", "discard", "baseline", "usable"}


@dataclass(frozen=True)
class ImportedRow:
    """One configuration's measurement from outside, in the store's vocabulary."""

    source_file: str
    source_line: int
    params: dict[str, Any]  # TrialConfig field names plus extras (quant, n_ctx, variant, …)
    outcome: Outcome
    reason: str = ""
    tg_samples: tuple[float, ...] = ()
    pp_samples: tuple[float, ...] = ()
    vram_peak_mib: float | None = None
    rss_peak_mib: float | None = None
    env: dict[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class JunkRow:
    source_file: str
    source_line: int
    reason: str
    text: str


@dataclass(frozen=True)
class ImportResult:
    path: str
    kind: str
    rows: tuple[ImportedRow, ...]
    junk: tuple[JunkRow, ...]


def read_file(path: Path) -> ImportResult:
    """Recognise a file by its content and read it; UserError for a file that holds no measurements."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; give llama-bench JSON/JSONL, a CSV or a seed-study TSV/JSONL")
    text = path.read_text(errors="replace")
    if not text.strip():
        raise UserError(f"{path}: the file is empty; nothing to import")
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return read_seed_tsv(path, text)
    if suffix == ".csv":
        return read_generic_csv(path, text)
    if suffix == ".jsonl":
        return _read_jsonl(path, text)
    if suffix == ".json":
        return _read_json(path, text)
    if suffix in (".txt", ".log", ".md"):
        what = "a run log" if "log" in path.name.lower() else "a text file"
        raise UserError(f"{path}: {what}, not a results table; import the results TSV of the same run")
    raise UserError(f"{path}: unknown file type {suffix or '(none)'}; give .json/.jsonl (llama-bench), .csv or .tsv")


# ---------------------------------------------------------------- llama-bench

_BENCH_KEYS = ("model_filename", "n_prompt", "n_gen", "samples_ts")
_BENCH_MEASURE = {"n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
                  "samples_ns", "samples_ts"}
_BENCH_ENV = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends")
_FLASH = {-1: "auto", 0: "off", 1: "on"}


def _bench_params(rec: dict[str, Any]) -> dict[str, Any]:
    """llama-bench fields → TrialConfig parameter names (older builds: use_mmap instead of load_mode)."""
    overrides = str(rec.get("tensor_buft_overrides") or "")
    params: dict[str, Any] = {
        "model": rec["model_filename"],
        "n_gpu_layers": int(rec.get("n_gpu_layers", 99)),
        "n_cpu_moe": int(rec.get("n_cpu_moe", 0)),
        "override_tensors": [p for p in overrides.split(";") if p and p != "none"],
        "threads": int(rec["n_threads"]) if "n_threads" in rec else None,
        "batch": int(rec.get("n_batch", 2048)),
        "ubatch": int(rec.get("n_ubatch", 512)),
        "type_k": str(rec.get("type_k", "f16")),
        "type_v": str(rec.get("type_v", "f16")),
    }
    if "flash_attn" in rec:
        fa = rec["flash_attn"]
        params["flash_attn"] = _FLASH.get(int(fa), "auto") if not isinstance(fa, bool) else ("on" if fa else "off")
    if "load_mode" in rec:
        params["load_mode"] = str(rec["load_mode"])
    elif "use_mmap" in rec:
        params["load_mode"] = "mmap" if rec["use_mmap"] else "none"
    return params


def read_llama_bench(path: Path, records: list[tuple[int, Any]]) -> ImportResult:
    """llama-bench prints one record per test (pp, tg); records of one configuration become one row."""
    junk: list[JunkRow] = []
    grouped: dict[str, dict[str, Any]] = {}
    for line, rec in records:
        if not isinstance(rec, dict) or any(k not in rec for k in _BENCH_KEYS):
            missing = [k for k in _BENCH_KEYS if not isinstance(rec, dict) or k not in rec]
            junk.append(JunkRow(str(path), line, f"not a llama-bench record (missing {', '.join(missing)})",
                                _dump(rec)))
            continue
        try:
            n_prompt, n_gen = int(rec["n_prompt"]), int(rec["n_gen"])
            params = _bench_params(rec)
            samples = [float(v) for v in rec["samples_ts"]]
        except (TypeError, ValueError, OverflowError) as exc:
            junk.append(JunkRow(str(path), line, f"malformed llama-bench record ({exc})", _dump(rec)))
            continue
        if any(not math.isfinite(v) or v <= 0 for v in samples) or n_prompt < 0 or n_gen < 0:
            junk.append(JunkRow(str(path), line, "samples_ts holds a value that is not a positive finite rate",
                                _dump(rec)))
            continue
        if n_prompt and n_gen:
            junk.append(JunkRow(str(path), line, "combined prompt+generation test (-pg) is not a tg or pp sample",
                                _dump(rec)))
            continue
        key = json.dumps({k: v for k, v in rec.items() if k not in _BENCH_MEASURE}, sort_keys=True, default=str)
        entry = grouped.setdefault(key, {"line": line, "params": params, "tg": [], "pp": [],
                                         "env": {k: rec[k] for k in _BENCH_ENV if k in rec}})
        kind = "tg" if n_gen else "pp"
        entry[kind].extend(samples)
        entry["params"]["n_gen" if kind == "tg" else "n_prompt"] = n_gen or n_prompt
    rows = []
    for entry in grouped.values():
        params = entry["params"]
        params.setdefault("n_gen", 0)
        params.setdefault("n_prompt", 0)
        ok = bool(entry["tg"] or entry["pp"])
        rows.append(ImportedRow(str(path), entry["line"], params, Outcome.OK if ok else Outcome.BAD_OUTPUT,
                                "" if ok else "no samples_ts", tuple(entry["tg"]), tuple(entry["pp"]),
                                env=entry["env"]))
    return ImportResult(str(path), "llama-bench", tuple(rows), tuple(junk))


def _dump(rec: Any) -> str:
    """A record's start, for the junk report (any JSON value, however nested)."""
    try:
        return json.dumps(rec, default=str)[:200]
    except (ValueError, RecursionError):
        return repr(rec)[:200]


def _read_json(path: Path, text: str) -> ImportResult:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deep to be llama-bench output") from None
    if isinstance(data, list) and any(isinstance(r, dict) and "samples_ts" in r for r in data):
        line_of = _json_record_lines(text, len(data))
        return read_llama_bench(path, list(zip(line_of, data)))
    if isinstance(data, dict) and ("power_law_model" in json.dumps(data) or "predictions" in json.dumps(data)):
        raise UserError(f"{path}: a derived summary (aggregates and predictions), not measured rows; "
                        "import the results TSV files it was computed from")
    if isinstance(data, dict) and {"n_gpu_layers", "estimated_tok_s"} & set(data):
        raise UserError(f"{path}: a hand-written recommended configuration, not a measurement")
    if isinstance(data, dict):
        raise UserError(f"{path}: a JSON object without llama-bench records (keys: {', '.join(list(data)[:6])}); "
                        "give the output of `llama-bench -o json`")
    raise UserError(f"{path}: JSON without llama-bench records; give the output of `llama-bench -o json`")


def _json_record_lines(text: str, n: int) -> list[int]:
    """Line number where each top-level object of a llama-bench JSON array starts (its `{` at indent 2)."""
    starts = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip() == "{"]
    return starts if len(starts) == n else [1] * n


def _read_jsonl(path: Path, text: str) -> ImportResult:
    records: list[tuple[int, Any]] = []
    junk: list[JunkRow] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((i, json.loads(line)))
        except (json.JSONDecodeError, RecursionError):
            junk.append(JunkRow(str(path), i, "not a JSON line", line[:200]))
    dicts = [r for _, r in records if isinstance(r, dict)]
    if any("samples_ts" in r for r in dicts):
        result = read_llama_bench(path, records)
    elif any("tps" in r for r in dicts):
        result = read_seed_jsonl(path, records)
    else:
        raise UserError(f"{path}: JSON lines without llama-bench (samples_ts) or seed (tps) records")
    return ImportResult(result.path, result.kind, result.rows, tuple(junk) + result.junk)


# ---------------------------------------------------------------- seed study

def _num(value: Any) -> float | None:
    """A finite number or None (empty cell, text)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _label_params(label: str, notes: str) -> dict[str, Any]:
    """What the seed encoded only in labels and notes: quantisation, threads, generated tokens."""
    out: dict[str, Any] = {}
    tokens = label.lower().split("_")
    quant = next((_QUANTS[t] for t in tokens if t in _QUANTS), None)
    out["quant"] = quant or SEED_DEFAULT_QUANT
    threads = re.search(r"(?:^|_)t(?:hr|hreads)?(\d+)(?:_|$)", label.lower()) or re.search(r"threads=(\d+)", notes)
    if threads:
        out["threads"] = int(threads.group(1))
    gen = re.search(r"\bgen=(\d+)", notes)
    if gen:
        out["n_gen"] = int(gen.group(1))
    return out


def _status_outcome(status: str, tg: float | None, notes: str) -> tuple[Outcome, str] | None:
    """The seed's status words → Outcome; None for a row that is not a measurement at all."""
    s = status.strip().lower().split("|")[-1]
    if s in _MEASURED or s == "":
        if tg is None:
            return None
        if tg > 0:
            return Outcome.OK, ""
        return Outcome.BAD_OUTPUT, notes[:200] or "tok/s 0 with status ok"
    if s == "oom":
        return Outcome.OOM, notes[:200] or "out of memory"
    if s in ("crash", "error"):
        if "load model" in notes.lower():
            return Outcome.LOAD_FAILED, notes[:200]
        return Outcome.CRASH, notes[:200] or "crash"
    if s == "timeout":
        return Outcome.TIMEOUT, notes[:200] or "timeout"
    if s in ("no_json", "fail"):
        return Outcome.BAD_OUTPUT, notes[:200] or s
    return None


def _seed_row(path: Path, line: int, cells: dict[str, str], label: str, env: dict[str, Any]) -> ImportedRow | JunkRow:
    canon: dict[str, str] = {}
    for name, value in cells.items():
        key = _ALIASES.get(name.strip().lower())
        if key and key not in canon:
            canon[key] = value
    notes = " ".join(v.strip().replace("\n", " ") for k, v in cells.items()
                     if k in ("notes", "description", "desc", "error"))
    text = "\t".join(cells.values())[:200]
    tg = _num(canon.get("tg"))
    if canon.get("tg") is None or tg is None:
        return JunkRow(str(path), line, "no tok/s value", text)
    status = canon.get("status", "ok")
    verdict = _status_outcome(status, tg, notes)
    if verdict is None:
        return JunkRow(str(path), line, f"status {status!r} is not a measurement", text)
    ngl = _num(canon.get("n_gpu_layers"))
    if ngl is None:
        return JunkRow(str(path), line, "no n_gpu_layers value", text)
    params: dict[str, Any] = {"n_gpu_layers": int(ngl), "n_cpu_moe": 0}
    for key in ("batch", "ubatch", "threads", "n_ctx", "n_gen"):
        value = _num(canon.get(key))
        if value is not None:
            params[key] = int(value)
    for key in ("type_k", "type_v"):
        if canon.get(key):
            params[key] = canon[key].strip()
    if "flash_attn" in canon:
        params["flash_attn"] = "on" if canon["flash_attn"].strip().lower() in ("true", "1", "on") else "off"
    params.update({k: v for k, v in _label_params(label, notes).items() if k not in params or k == "quant"})
    params["model"] = f"Qwen3.5-35B-A3B-{params['quant']}.gguf"
    params["variant"] = _REPLICATE.sub("", label) if label else ""
    outcome, reason = verdict
    vram = _num(canon.get("vram_mib"))
    return ImportedRow(str(path), line, params, outcome, reason, (tg,) if outcome is Outcome.OK else (),
                       vram_peak_mib=vram if vram else None, env=env, label=label)


def read_seed_tsv(path: Path, text: str) -> ImportResult:
    """A results TSV of the seed study; the schema drifts by phase (PROVENANCE.txt), so rows are read by width."""
    lines = text.splitlines()
    header = [h.strip() for h in lines[0].split("\t")]
    lowered = {h.lower() for h in header}
    if "cache_hit" in lowered:
        raise UserError(f"{path}: an expert-offload SIMULATION table (cache_hit column), not llama.cpp measurements")
    if "compression_ratio" in lowered:
        raise UserError(f"{path}: KV-compression micro-benchmarks without a llama.cpp configuration; nothing to import")
    if not lowered & {"tok_s", "tok_per_sec"}:
        raise UserError(f"{path}: no tok_s/tok_per_sec column in the header; not a seed results table")
    phase = re.search(r"phase(\d+)", path.name)
    env = {**SEED_ENV, **({"phase": int(phase.group(1))} if phase else {})}
    rows: list[ImportedRow] = []
    junk: list[JunkRow] = []
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        line = raw
        repaired = "\t" not in raw and raw.count("\\t") >= 10
        if repaired:
            line = raw.replace("\\t", "\t")
        cells = line.split("\t")
        if len(cells) == len(header):
            names = header
        elif len(cells) == len(RUST_SCHEMA):
            names = list(RUST_SCHEMA)
        else:
            junk.append(JunkRow(str(path), number, f"{len(cells)} fields, the header has {len(header)}: "
                                                   "not a result row", raw[:200]))
            continue
        mapping = dict(zip(names, cells))
        # Phase 5 kept its labels in `notes` (next to a `description`); elsewhere notes are prose.
        label = mapping.get("label") or (mapping.get("notes", "") if "description" in mapping else "")
        row = _seed_row(path, number, mapping, label.strip(), env)
        if isinstance(row, ImportedRow) and repaired:
            row = ImportedRow(row.source_file, row.source_line, row.params, row.outcome,
                              (row.reason + " [repaired: literal \\t separators]").strip(), row.tg_samples,
                              row.pp_samples, row.vram_peak_mib, row.rss_peak_mib, row.env, row.label)
        (rows if isinstance(row, ImportedRow) else junk).append(row)
    return ImportResult(str(path), "seed-tsv", tuple(rows), tuple(junk))


def read_seed_jsonl(path: Path, records: list[tuple[int, Any]]) -> ImportResult:
    """The seed's phase-4 v2 JSON lines (tps, ngl, ctx, batch, ubatch, type_k, type_v, desc, status)."""
    rows: list[ImportedRow] = []
    junk: list[JunkRow] = []
    env = {**SEED_ENV, "phase": 4}
    for line, rec in records:
        if not isinstance(rec, dict):
            junk.append(JunkRow(str(path), line, "not a JSON object", _dump(rec)))
            continue
        cells = {k: "" if v is None else str(v) for k, v in rec.items() if k not in ("preview", "tokens")}
        if "tokens" in rec:
            cells["gen_tokens"] = str(rec["tokens"])
        row = _seed_row(path, line, cells, "", env)
        (rows if isinstance(row, ImportedRow) else junk).append(row)
    return ImportResult(str(path), "seed-jsonl", tuple(rows), tuple(junk))


# ---------------------------------------------------------------- generic CSV

_MEASURE_COLUMNS = {*RESULT_COLUMNS, "status"}


def _samples(cell: str) -> tuple[float, ...] | None:
    """'12.5', '12.5;12.7;12.1' or '12.5 12.7' → samples; None if any part is not a non-negative number."""
    parts = [p for p in re.split(r"[;|\s]", cell.strip()) if p.strip()]
    values = [_num(p) for p in parts]
    if any(v is None or v < 0 for v in values):
        return None
    return tuple(float(v) for v in values if v is not None)


def read_generic_csv(path: Path, text: str) -> ImportResult:
    """Parameter columns (TrialConfig names or anything else) plus result columns (the replay table's: tg/pp and
    their samples, memory peaks, wall time, outcome), which never become parameters; samples may be ';'-joined.
    A table written by benchmarks/make_table.py brings its sidecars' shared parameters and model shape."""
    try:
        return _read_generic_csv(path, text)
    except csv.Error as exc:
        raise UserError(f"{path}: not a readable CSV ({exc}); save it as plain comma-separated text") from None


def _table_sidecars(path: Path) -> dict[str, Any]:
    """What benchmarks/make_table.py writes beside a table: the parameters every row shares (.meta.json `fixed`,
    n_prompt, n_gen) and the model's byte accounting (.shape.json), which becomes the rows' model so that `analyze`
    places the weights of a table measured elsewhere without its GGUF."""
    shared: dict[str, Any] = {}
    meta = path.with_suffix(".meta.json")
    if meta.is_file():
        try:
            data = json.loads(meta.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{meta}: not valid JSON ({exc.msg}, line {exc.lineno}); fix it or move it away from "
                            f"{path.name}") from None
        fixed = (data.get("fixed") or {}) if isinstance(data, dict) else None
        if not isinstance(fixed, dict):
            raise UserError(f"{meta}: expected an object with `fixed` parameters (name: value), as "
                            f"benchmarks/make_table.py writes it; fix it or move it away from {path.name}")
        shared.update({k: data[k] for k in ("n_prompt", "n_gen") if k in data})
        shared.update(fixed)
    shape = shape_path(path)
    if shape.is_file():
        shared["model"] = str(shape.resolve())
    return shared


def _read_generic_csv(path: Path, text: str) -> ImportResult:
    reader = csv.reader(io.StringIO(text.replace("\x00", "")))
    header = next(reader, None)
    if not header:
        raise UserError(f"{path}: no header row; the first line must name the columns (tg, pp, parameters)")
    names = [_ALIASES.get(h.strip().lower(), h.strip()) for h in header]
    if not {"tg", "pp"} & set(names):
        raise UserError(f"{path}: no tg or pp column (also accepted: tok_s, tg_tok_s, pp_tok_s); "
                        f"columns are {', '.join(repr(h)[1:-1] for h in header)[:300]}")
    shared = {k: v for k, v in _table_sidecars(path).items() if k not in names}
    rows: list[ImportedRow] = []
    junk: list[JunkRow] = []
    outcomes = {o.value for o in Outcome}
    for number, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        text_row = ",".join(cells)[:200]
        if len(cells) != len(names):
            junk.append(JunkRow(str(path), number, f"{len(cells)} fields, the header has {len(names)}", text_row))
            continue
        mapping = dict(zip(names, cells))
        # the repetitions when the table has them (a replay table's tg_samples), else the one value per row
        tg = _samples(mapping.get("tg_samples") or mapping.get("tg", ""))
        pp = _samples(mapping.get("pp_samples") or mapping.get("pp", ""))
        if tg is None or pp is None:
            junk.append(JunkRow(str(path), number, "tg/pp is not a number (or ';'-joined numbers)", text_row))
            continue
        outcome_text = (mapping.get("outcome") or mapping.get("status") or "ok").strip().lower()
        if outcome_text not in outcomes:
            junk.append(JunkRow(str(path), number, f"outcome {outcome_text!r} is not one of "
                                                   f"{', '.join(sorted(outcomes))}", text_row))
            continue
        outcome = Outcome(outcome_text)
        if outcome is Outcome.OK and not (tg or pp):
            junk.append(JunkRow(str(path), number, "outcome ok without a tg or pp value", text_row))
            continue
        params = {**shared, **{k: _param_value(v) for k, v in mapping.items()
                               if k not in _MEASURE_COLUMNS and not PER_GPU_COLUMN.fullmatch(k)}}
        if "override_tensors" in params:
            params["override_tensors"] = [p for p in str(params["override_tensors"]).split(";") if p]
        vram, rss = _num(mapping.get("vram_mib")), _num(mapping.get("rss_mib"))
        rows.append(ImportedRow(str(path), number, params, outcome, mapping.get("reason", ""), tg, pp, vram, rss))
    return ImportResult(str(path), "csv", tuple(rows), tuple(junk))


def _param_value(cell: str) -> Any:
    value = cell.strip()
    number = _num(value)
    if number is None:
        return value
    return int(number) if number.is_integer() and "." not in value else number


def read_folder(folder: Path) -> tuple[list[ImportResult], dict[str, str]]:
    """Every importable file under a folder, and for each refused file the reason (nothing is silently dropped)."""
    results: list[ImportResult] = []
    refused: dict[str, str] = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        try:
            results.append(read_file(path))
        except UserError as exc:
            refused[str(path)] = str(exc)
    return results, refused


def read_files(paths: Iterable[Path]) -> list[ImportResult]:
    """Read every file first, so one unreadable file stops the import before anything is stored."""
    return [read_file(Path(p)) for p in paths]
