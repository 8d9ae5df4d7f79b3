"""llama-fit-params' placement with the search's knobs: where llama.cpp's fit answered with overrides the searched
placement cannot say (part of a layer in RAM), that placement measured with the incumbent's other knob values.

llama-fit-params fills the GPU tensor by tensor, the search by whole layers' experts: at 12 GiB on an H100 its answer
left one layer's down projection in RAM beside 17 whole layers, read 3.5% fewer bytes per token on the host than the
sweep's 18 whole layers, and ran 1.07x as fast (CI 0.94-1.18), while the sweep's knobs (no mmap: pinned host experts)
ran the prompt 3.6x faster (benchmarks/results/vs-fit-h100.md). Neither answer had both. A graft is one trial: the
best measured trial of that placement (the baseline or an earlier graft) with the incumbent's knobs, when the knob
effects give it a chance to beat the incumbent and its peak, carried over by the memory model's predicted difference
from the surest measured peak of that placement (an earlier graft's over the budget included), fits the budget. It
runs the raw overrides like the baseline, so the boundary search leaves it out of what it reasons about and it is
judged by its score, in the confirmation among the others."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from autoinfer.model.placement import GPU_SPLITS
from autoinfer.search.chance import chance_to_beat
from autoinfer.search.effects import KnobEffects
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.store import trials as store
from autoinfer.store.records import TrialRecord
from autoinfer.trial_config import TrialConfig

# moot under raw overrides, which carry llama-fit-params' own tensor split; the overrides are of one model's tensors
NOT_GRAFTED = frozenset({"placement", *GPU_SPLITS, "model"})


@dataclass(frozen=True)
class Graft:
    params: dict[str, Any]
    fields: dict[str, Any]  # the record fields that carry the raw overrides
    chance: float  # to beat the incumbent
    reason: str


def graft(records: Sequence[TrialRecord], incumbent: int, incumbent_params: dict[str, Any], incumbent_score: float,
          knobs: Sequence[str], effects: KnobEffects, memory: MemoryScreen, budget: float | None,
          weights: dict[str, float], modelled: Callable[[TrialConfig, TrialConfig], float]) -> Graft | None:
    """The graft to measure next, or None: no raw-override placement measured within the budget, the incumbent's
    knobs already measured with it, or its peak over the budget. Its predicted gain over the incumbent is the
    measured ratio of the placement's best trial to the incumbent, times what the performance model (`modelled`: the
    log ratio of two configurations' scores) and the knob effects say the incumbent's knobs change on that placement;
    the caller weighs its chance against the local moves'."""
    raw = [t for t in records if t.fit_override_tensors is not None]
    scored = [(store.score({"tg": t.samples("tg"), "pp": t.samples("pp"), "kld": t.kld_samples}, weights), t)
              for t in raw if t.is_feasible_ok]
    scored = [(s, t) for s, t in scored if s is not None and s > 0]
    if not scored:
        return None
    score, base = max(scored, key=lambda st: st[0])
    moved = {k: incumbent_params[k] for k in knobs if k not in NOT_GRAFTED and k in incumbent_params}
    same = [t for t in raw if t.fit_override_tensors == base.fit_override_tensors
            and t.fit_tensor_split == base.fit_tensor_split]  # that placement's trials
    if any(all(t.params.get(k) == v for k, v in moved.items()) for t in same):
        return None  # measured, running or queued already
    if "model" in knobs and incumbent_params.get("model") != base.params.get("model"):
        return None  # the overrides name one model's tensors
    if base.config is None:
        return None
    ran = base.trial_config
    config = TrialConfig.from_params({**ran.to_params(), **moved})
    peak = _carried(config, same, memory)
    if budget is not None and (peak is None or peak > budget):
        return None
    mean, sd = effects.diff(moved, {k: base.params.get(k) for k in moved})
    gain = math.log(score / incumbent_score) + modelled(config, ran) + mean
    p = chance_to_beat(gain, sd)
    changed = ", ".join(f"{k} {base.params.get(k)} → {v}" for k, v in moved.items() if base.params.get(k) != v)
    reason = (f"graft: trial {base.number}'s placement (llama-fit-params' {len(base.fit_override_tensors)} "
              f"overrides) with trial {incumbent}'s knobs ({changed}), predicted ×{math.exp(gain):.2f} ± {sd:.2f} of "
              f"trial {incumbent} ({p:.0%} to beat it)"
              + (f", peak {peak:.0f} MiB of {budget:.0f} carried over from the measured ones" if budget else ""))
    fields = {"fit_override_tensors": base.fit_override_tensors}
    if base.fit_tensor_split is not None:
        fields["fit_tensor_split"] = base.fit_tensor_split
    return Graft({**base.params, **moved}, fields, p, reason)


def _carried(config: TrialConfig, same: Sequence[TrialRecord], memory: MemoryScreen) -> float | None:
    """The peak of `config` carried over from the measured peak of the trial of the same overrides whose predicted
    difference to it is the surest, over the budget or not: a graft measured over the budget makes the next one with
    like knobs predicted over too, instead of each knob value costing a trial over it."""
    best: tuple[float, float] | None = None
    for t in same:
        peak = t.budget_peak("device")
        if peak is None or t.config is None or t.stand_in:
            continue
        diff = memory.difference(config, t.trial_config)
        if diff is not None and (best is None or diff[1] < best[1]):
            best = (peak + diff[0], diff[1])
    return None if best is None else best[0]
