"""The memory model's calibration against the GPU sweeps stored by benchmarks/vs_fit.py (`sweep_trials`): what it
predicts for a sweep's next trial from the peaks measured before it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from autoinfer.engines.base import create
from autoinfer.model.memory import MemoryModel
from autoinfer.model.shape import ModelShape
from autoinfer.trial_config import TrialConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _sweeps() -> list[list[tuple[TrialConfig, float]]]:
    """Each stored single-GPU sweep's measured trials in their order, as llama-bench ran them, with their peaks."""
    bench = create("llama-bench")
    sweeps = []
    for path in sorted((BENCHMARKS / "results").glob("vs-fit-h[12]00-*.json")):
        for budget in json.loads(path.read_text()):
            ran = [(bench.as_run(TrialConfig.from_params({**t["config"], "model": "m"})), t["vram_peak_mib"])
                   for t in budget.get("sweep_trials", []) if t.get("config") and t.get("vram_peak_mib")]
            if len(ran) > 5:
                sweeps.append(ran)
    return sweeps


def test_after_a_few_peaks_the_next_trial_is_predicted_within_a_few_mib():
    """The model calibrated on a sweep's first 1-5 measured peaks predicts the next one within 8 MiB at the median
    (measured: 3-6 MiB by the number of peaks). A configuration's peak repeats to the MiB between processes, so the
    mean follows the peaks; fitted at the few-trial noise of 5% of the peak, it missed them by 10-33 MiB, under the
    measured peak every time, and a boundary trial at 16 GiB went 24 MiB over the budget. The doubt stays: after one
    peak the predictive spread is still over 100 MiB."""
    shape = ModelShape.from_json((BENCHMARKS / "tables" / "h100-35b.shape.json").read_text())
    sweeps = _sweeps()
    assert len(sweeps) >= 10, len(sweeps)
    errors: dict[int, list[float]] = {}
    for ran in sweeps:
        for k in range(1, 6):
            model = MemoryModel(shape, "device")
            model.calibrate(ran[:k])
            config, peak = ran[k]
            prediction = model.predict(config)
            errors.setdefault(k, []).append(peak - prediction.mib)
            if k == 1:
                assert prediction.std_mib > 100, prediction
    medians = {k: statistics.median(abs(e) for e in v) for k, v in errors.items()}
    assert max(medians.values()) < 8, medians
