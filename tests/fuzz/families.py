"""One entry point per parser family, fed arbitrary bytes: each must return or raise UserError, nothing else.

Used by the hypothesis tests here and by benchmarks/fuzz.py (the long run that counts inputs per family).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from autoinfer.analysis.importers import read_file
from autoinfer.campaign.spec import load_campaign
from autoinfer.engines.base import TrialConfig
from autoinfer.engines.llama_bench import measurement_from_json
from autoinfer.engines.replay import ReplayEngine
from autoinfer.errors import UserError
from autoinfer.model.gguf_header import GGUFFormatError, read_header
from autoinfer.model.gguf_info import read_info
from autoinfer.model.shape import shape_from_gguf

VALID_CAMPAIGN = b"""name: fuzz
engine: replay
engine_options: {table: t.csv, seed: 1}
model: m
space:
  threads: {low: 1, high: 8}
  ubatch: [128, 256]
measure: {repetitions: 2, timeout_s: 30}
budget: {trials: 3}
"""
VALID_BENCH = json.dumps([
    {"model_filename": "m.gguf", "n_prompt": 64, "n_gen": 0, "samples_ts": [100.0, 101.5], "n_threads": 4},
    {"model_filename": "m.gguf", "n_prompt": 0, "n_gen": 16, "samples_ts": [10.0, 10.5], "n_threads": 4},
]).encode()
VALID_TABLE = b"threads,ubatch,tg,pp,rss_mib,tg_samples\n1,128,10,100,500,9 10 11\n2,256,12,110,600,\n4,128,15,130,700,\n"


def campaign(data: bytes, tmp: Path) -> None:
    path = tmp / "c.yaml"
    path.write_bytes(data)
    load_campaign(path)


def gguf(data: bytes, tmp: Path, data_bytes: int = 0) -> None:
    """Header reader, info maths and the placement shape of whatever the info reader accepts. `data_bytes` of
    tensor data follow the (mutated) header as a sparse hole: only the header is ever read."""
    path = tmp / "m.gguf"
    path.write_bytes(data)
    if data_bytes:
        with open(path, "r+b") as fh:
            fh.truncate(len(data) + data_bytes)
    try:
        read_header(path)
    except GGUFFormatError:
        pass
    info = read_info(path)
    info.to_dict()
    if info.n_experts and info.vocab_size:
        info.active_bytes_per_token()
    shape_from_gguf(path)


def importer(suffix: str) -> Callable[[bytes, Path], None]:
    def run(data: bytes, tmp: Path) -> None:
        path = tmp / f"in{suffix}"
        path.write_bytes(data)
        read_file(path)
    run.__name__ = f"import{suffix}"
    return run


def bench_output(data: bytes, tmp: Path) -> None:
    m = measurement_from_json(data.decode("utf-8", "replace"), TrialConfig(model="m.gguf", n_prompt=64, n_gen=16))
    assert all(v > 0 for v in (*m.tg_samples, *m.pp_samples))


def replay_table(data: bytes, tmp: Path) -> None:
    from autoinfer.engines.base import RunContext

    path = tmp / "t.csv"
    path.write_bytes(data)
    engine = ReplayEngine(path)
    params = {c: engine.df[c].iloc[0] for c in engine.params}
    config = TrialConfig.from_params({"model": "m", "n_prompt": 8, "n_gen": 8, "repetitions": 2,
                                      **{k: (v.item() if hasattr(v, "item") else v) for k, v in params.items()}})
    engine.run(config, RunContext(timeout_s=5, artifacts=tmp))


FAMILIES: dict[str, tuple[Callable[[bytes, Path], None], bytes]] = {
    "campaign YAML": (campaign, VALID_CAMPAIGN),
    "GGUF header+info+shape": (gguf, b""),  # seeded with a real tiny model by the caller
    "import llama-bench JSON": (importer(".json"), VALID_BENCH),
    "import CSV": (importer(".csv"), b"n_gpu_layers,threads,tg,pp,vram_mib\n99,4,10.5;11,100,2000\n0,8,3,40,10\n"),
    "import seed TSV": (importer(".tsv"), b"exp_id\ttok_s\tvram_mb\tn_gpu\tstatus\tlabel\n1\t29.9\t7000\t30\tok\tq3km_t8\n"),
    "llama-bench output": (bench_output, VALID_BENCH),
    "replay table": (replay_table, VALID_TABLE),
}


def check(func: Callable[[bytes, Path], None], data: bytes, tmp: Path) -> None:
    """The property: the input is accepted or refused with UserError; anything else propagates."""
    try:
        func(data, tmp)
    except UserError as exc:
        assert "\n" not in str(exc).strip(), str(exc)


def gguf_parts() -> tuple[bytes, bytes]:
    """The default tiny model (cached) split into its header and its tensor data."""
    from autoinfer.model.synth import cached_model

    path = cached_model("tiny")
    data = path.read_bytes()
    cut = read_header(path).data_offset
    return data[:cut], data[cut:]
