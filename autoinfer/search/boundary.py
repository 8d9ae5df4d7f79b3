"""The search that starts from what is known: the memory boundary first, then few moves of the other knobs.

1. Boundary. The fast configurations keep as many weights on the GPU as fit, so the first trials look for the
   placement (GPU layers, expert layers in RAM, splits) with the highest predicted speed (performance model)
   whose predicted peak (memory model, calibrated on every measured peak) is within the budget, or, next to a
   placement measured to fit, over it by less than the model's typical error (PROBE): only a measurement settles
   that. No safety step:
   the prediction decides, and measured peaks decide where they exist: a placement using no more memory
   than one measured to fit fits, one using no less than one measured over does not. After two wrong
   predictions the next trial bisects the placements still unknown.
2. Local moves. At the boundary, the other knobs (threads, load mode, ubatch, placement pattern, KV types, …)
   are changed one at a time around the best trial so far, the placement re-fitted to the boundary for each
   (a larger ubatch or KV cache needs room). An improvement moves the incumbent and the moves restart from it.
3. Whole layers leave the GPU only when no expert placement fits or the performance model predicts that a
   whole-layer placement is faster.
4. Pairs. When every single move from the incumbent is measured, two knobs change at once where the single moves'
   measured ratios multiply to a tie or better (effects that add in log-speed, interactions found by measuring).
5. Again. An incumbent measured once that no move or pair beat is measured once more (tagged `again_of`): one
   lucky measurement would otherwise end the search. A configuration's score pools the samples of all its trials.
6. Grid. Then the other combinations of the knobs at the boundary, most promising first by the product of the
   single moves' measured ratios (knobs can interact too strongly for single moves and pairs to show it), where
   the space has at most GRID_MAX of them.
7. When every combination at the boundary has been measured the campaign's sampler (TPE) takes over. A
   configuration already measured is answered from its measurement, not run again (sweep/repeats.py).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autoinfer.campaign.space import to_config
from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.model.performance import PerformanceModel
from autoinfer.model.placement import cpu_expert_layers, cpu_layers
from autoinfer.search.informed import SAMPLED, SearchAid, _typical
from autoinfer.store import trials as store
from autoinfer.store.trials import Store, record_of, write_trial

GPU_SHARE = ("n_gpu_layers", "n_cpu_moe", "cpu_expert_layers", "tensor_split", "expert_split")
# Order of the local moves: knobs whose effect is usually largest first (CPU-side experts make threads matter; the
# load mode decides pinned buffers and so the prompt's copy speed; ubatch the prompt's batching).
KNOB_ORDER = ("threads", "load_mode", "ubatch", "placement", "type_k", "type_v", "flash_attn", "batch", "repack",
              "model")
PATTERN_PREFERENCE = ("last", "first", "even")  # llama.cpp's own fit leaves the last layers' experts in RAM
MEMORY_NEUTRAL = frozenset({"threads", "poll", "cpu_strict", "prio"})
DEVICE_NEUTRAL = frozenset({"load_mode", "repack"})  # change host buffers, not the GPU's
BISECT_AFTER = 2  # wrong memory predictions in one memory group before the next trial bisects instead
PROBE = 0.03  # a placement predicted this far over the budget is still measured once (the model's typical error)
TIE = 0.95  # a pair of moves predicted within this ratio of the incumbent is worth a measurement (run-to-run noise)
LONG_AXIS = 6  # an ordered knob with more values than this moves a quarter of its range first
GRID_MAX = 4096  # combinations of the other knobs the strategy enumerates at the boundary before leaving it to TPE


def allowed_values(dist: BaseDistribution) -> list[Any]:
    """The values the strategy considers for a distribution (a float range: its ends and middle)."""
    if isinstance(dist, IntDistribution):
        if dist.log:
            return sorted({int(round(dist.low * (dist.high / dist.low) ** (i / 7))) for i in range(8)})
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution):
        return [dist.low, (dist.low + dist.high) / 2, dist.high]
    assert isinstance(dist, CategoricalDistribution)
    return list(dist.choices)


@dataclass(frozen=True)
class Seen:
    """A trial as the strategy uses it."""

    number: int
    params: dict[str, Any]
    score: float | None  # the objective, for a feasible OK trial
    fits: bool | None  # measured (or confidently predicted) within the budget; None: not known
    predicted_mib: float | None  # the memory model's prediction when the trial was chosen
    config: TrialConfig | None
    tg: float | None = None  # medians of an OK trial
    pp: float | None = None
    reason: str = ""
    runs: int = 1  # measured trials of this configuration whose samples the score pools


@dataclass(frozen=True)
class Candidate:
    params: dict[str, Any]  # the GPU-share parameters
    config: TrialConfig
    mib: float
    speed: float
    whole: int  # repeating layers kept whole on the CPU


@dataclass(frozen=True)
class Choice:
    params: dict[str, Any]
    reason: str
    again_of: int | None = None  # a configuration measured again on purpose (its first trial)


class Boundary:
    """Strategy object (autoinfer.search.strategy.Strategy) for one sweep."""

    name = "boundary"

    def __init__(self, campaign: Campaign, aid: SearchAid, dists: dict[str, BaseDistribution],
                 models: dict[str, str]) -> None:
        self.campaign = campaign
        self.aid = aid
        self.models = models
        self.values = {name: allowed_values(d) for name, d in dists.items()}
        self.weights = {k: v for k, v in campaign.objective_weights().items() if k in ("tg", "pp")} or {"tg": 1.0}
        self.perf = {path: PerformanceModel(shape, gpu=aid.side != "host") for path, shape in aid.shapes.items()}
        self.share = [n for n in GPU_SHARE if n in dists] if self.perf else []
        rank = {n: i for i, n in enumerate(KNOB_ORDER)}
        self.knobs = sorted((n for n in dists if n not in self.share), key=lambda n: (rank.get(n, len(rank)), n))
        self.neutral = MEMORY_NEUTRAL | (DEVICE_NEUTRAL if aid.side == "device" else frozenset())
        self.sampler = campaign.sampler.name

    # -- the interface -------------------------------------------------------------------------------------
    def start(self, study: optuna.Study) -> None:
        self.aid.after_run(study)
        self._queue(study)

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        if record_of(trial).search_reason is None:
            write_trial(trial, search_reason=f"{SAMPLED} {self.sampler} (every local move was measured)")
        return self.aid.before_run(trial, config)

    def observe(self, study: optuna.Study) -> None:
        self.aid.after_run(study)
        self._queue(study)

    # -- proposals -----------------------------------------------------------------------------------------
    def _queue(self, study: optuna.Study) -> None:
        """Queue the next proposal unless a trial is already waiting (a retry, a re-measurement, a proposal) or the
        trial budget is spent (a proposal left behind would sit in the study as a trial that never runs)."""
        trials = Store(study).records()
        if any(t.state == TrialState.WAITING for t in trials):
            return
        spent = sum((t.is_finished or t.state == TrialState.RUNNING) and not t.is_remeasurement for t in trials)
        if spent >= self.campaign.budget.trials:
            return
        choice = self.propose(study)
        if choice is not None:
            again = {"again_of": choice.again_of} if choice.again_of is not None else {}
            Store(study).enqueue(choice.params, search_reason=choice.reason, **again)

    def propose(self, study: optuna.Study) -> Choice | None:
        """The next configuration to measure and why; None when only the sampler is left."""
        seen = self._seen(study)
        tried = [s.params for s in seen] + [t.params for t in study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))]
        self._calibrate(seen)
        scored = [s for s in seen if s.score is not None]
        incumbent = max(scored, key=lambda s: s.score) if scored else None
        base = {n: incumbent.params[n] for n in self.knobs} if incumbent else self._typical()
        if self.share:
            at = self._boundary(base, seen)
            if at is not None and {**at.params, **base} not in tried:
                return Choice({**at.params, **base}, at.reason)
        origin = f"trial {incumbent.number}" if incumbent else "the start"
        for knob in self._order(incumbent):
            for value in self._moves(knob, base[knob]):
                knobs = {**base, knob: value}
                reason = f"local: {knob} {base[knob]} → {value} from {origin}"
                params = knobs
                if self.share:
                    at = self._boundary(knobs, seen)
                    if at is None:
                        continue
                    params = {**at.params, **knobs}
                    reason += f" ({at.reason})"
                if params not in tried:
                    return Choice(params, reason)
        if incumbent is None:
            return None
        pair = self._pair(incumbent, base, seen, tried)
        if pair is not None:
            return pair
        moves = [m for m in seen if m.score is not None and m.params != incumbent.params
                 and sum(m.params.get(k) != incumbent.params.get(k) for k in self.knobs) == 1]
        if incumbent.runs == 1 and moves:  # compared with measured moves: a lucky first measurement would end it
            return Choice(incumbent.params, f"again: no single move or pair from trial {incumbent.number} measured "
                                            "better, so it is measured once more before the search leaves it (one "
                                            "lucky measurement would otherwise end the local search)",
                          incumbent.number)
        return self._grid(incumbent, base, seen, tried)

    def _grid(self, incumbent: Seen, base: dict[str, Any], seen: list[Seen], tried: list[dict]) -> Choice | None:
        """The other combinations of the knobs at the boundary, most promising first (the product of the single
        moves' measured ratios; a value never measured counts as a tie): knobs can interact too strongly for
        single moves and pairs to show it (a larger ubatch slower alone, fastest with a quantized K cache), and
        the boundary is where the fastest configurations are. Not for spaces too large to enumerate."""
        if not self.knobs or math.prod(len(self.values[k]) for k in self.knobs) > GRID_MAX:
            return None
        ratio = self._single_moves(incumbent, base, seen)
        measured = {tuple(p.get(k) for k in self.knobs) for p in tried}  # at the boundary or anywhere else
        combos = sorted((c for c in itertools.product(*(self.values[k] for k in self.knobs)) if c not in measured),
                        key=lambda combo: -math.prod(ratio.get((k, v), 1.0) for k, v in zip(self.knobs, combo)))
        for combo in combos:
            knobs = dict(zip(self.knobs, combo))
            at = self._boundary(knobs, seen) if self.share else None
            if self.share and at is None:
                continue
            params = {**at.params, **knobs} if at else knobs
            if params not in tried:
                predicted = math.prod(ratio.get((k, v), 1.0) for k, v in zip(self.knobs, combo))
                return Choice(params, f"grid: the next combination at the boundary from trial {incumbent.number}, "
                                      f"predicted ×{predicted:.2f} by the single moves" + (f" ({at.reason})" if at else ""))
        return None

    def _single_moves(self, incumbent: Seen, base: dict[str, Any], seen: list[Seen]) -> dict[tuple[str, Any], float]:
        """(knob, value) → measured score ratio to the incumbent, for each move of one knob at its GPU share."""
        share = {n: incumbent.params.get(n) for n in self.share}
        out: dict[tuple[str, Any], float] = {}
        for s in seen:
            if s.score is None or any(s.params.get(n) != v for n, v in share.items()):
                continue
            moved = [k for k in self.knobs if s.params.get(k) != base[k]]
            if len(moved) == 1:
                out[(moved[0], s.params[moved[0]])] = s.score / incumbent.score
        return out

    def _pair(self, incumbent: Seen, base: dict[str, Any], seen: list[Seen], tried: list[dict]) -> Choice | None:
        """Two knobs changed at once, once every single move from the incumbent is measured: the single moves'
        measured ratios to the incumbent (same GPU share) predict each pair as their product (effects that add in
        log-speed); pairs predicted within TIE of the incumbent or better are measured, the most promising first."""
        effects: dict[str, list[tuple[Any, float]]] = {}
        for (knob, value), ratio in self._single_moves(incumbent, base, seen).items():
            effects.setdefault(knob, []).append((value, ratio))
        pairs = sorted(((ra * rb, (a, va, ra), (b, vb, rb))
                        for a, b in itertools.combinations(effects, 2)
                        for va, ra in effects[a] for vb, rb in effects[b]), key=lambda p: -p[0])
        for predicted, (a, va, ra), (b, vb, rb) in pairs:
            if predicted < TIE:
                break
            knobs = {**base, a: va, b: vb}
            at = self._boundary(knobs, seen) if self.share else None
            if self.share and at is None:
                continue
            params = {**at.params, **knobs} if at else knobs
            if params not in tried:
                return Choice(params, f"pair: {a} → {va} (×{ra:.2f}) and {b} → {vb} (×{rb:.2f}) from trial "
                                      f"{incumbent.number}, predicted ×{predicted:.2f}" + (f" ({at.reason})" if at else ""))
        return None

    def _order(self, incumbent: Seen | None) -> list[str]:
        """The knobs in move order, rotated so the knob that made the incumbent goes on first (a line search along
        it) and the knobs after it follow, before those already tried from the previous incumbent."""
        made = next((k for k in self.knobs if incumbent and incumbent.reason.startswith(f"local: {k} ")), None)
        if made is None:
            return list(self.knobs)
        i = self.knobs.index(made)
        return self.knobs[i:] + self.knobs[:i]

    def _typical(self) -> dict[str, Any]:
        out = {}
        preferred = self.aid.engine.preferred_values(self.aid.side == "device")
        for knob in self.knobs:
            values = self.values[knob]
            if knob == "placement":
                out[knob] = next((p for p in PATTERN_PREFERENCE if p in values), values[0])
            elif knob in preferred and preferred[knob] in values:
                out[knob] = preferred[knob]
            elif knob == "model":
                out[knob] = values[0]
            else:
                typical = _typical(self.campaign, knob)
                out[knob] = typical if typical in values else values[len(values) // 2]
        return out

    def _moves(self, knob: str, current: Any) -> list[Any]:
        """Values one step away (ordered knobs: the neighbours, a quarter of the range first on long axes;
        unordered: every other value)."""
        values = self.values[knob]
        if current not in values:
            return list(values)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not numeric:
            return [v for v in values if v != current]
        ordered = sorted(values)
        i = ordered.index(current)
        steps = [max(1, len(ordered) // 4), 1] if len(ordered) > LONG_AXIS else [1]
        out = []
        for step in steps:
            out += [ordered[j] for j in (i + step, i - step) if 0 <= j < len(ordered) and ordered[j] not in out]
        return out

    # -- the boundary ----------------------------------------------------------------------------------------
    def _boundary(self, knobs: dict[str, Any], seen: list[Seen]) -> Choice | None:
        """The GPU share to measure with these other knob values (see the module docstring)."""
        candidates = self._candidates(knobs)
        if not candidates:
            return None
        budget = self.aid.budget_mib
        if budget is None or not self.aid.memory:
            best = max(candidates, key=lambda c: (c.speed, -c.mib))
            return Choice(best.params, "boundary: no memory budget, the most weights on the GPU")
        group = [s for s in seen if s.fits is not None and s.config is not None
                 and all(s.params.get(k) == v for k, v in knobs.items() if k not in self.neutral)]
        measured = [(self._predict(s.config), s) for s in group]
        fit_at = max((m for m, s in measured if s.fits), default=-math.inf)
        over_at = min((m for m, s in measured if not s.fits), default=math.inf)
        known = [c for c in candidates if c.mib <= fit_at]
        limit = budget * (1 + PROBE) if fit_at > -math.inf else budget  # probe next to a measured fit only
        unknown = [c for c in candidates if fit_at < c.mib < over_at and c.mib <= limit]
        pool = self._prefer_experts(known + unknown)
        if not pool:
            rest = [c for c in candidates if c.mib < over_at]
            if not rest:
                return None
            low = min(rest, key=lambda c: c.mib)
            return Choice(low.params, f"boundary: nothing is predicted to fit in {budget:.0f} MiB, the smallest "
                                      f"placement (predicted {low.mib:.0f} MiB)")
        best = max(pool, key=lambda c: (c.speed, -c.mib))
        if best.mib <= fit_at:
            return Choice(best.params, f"boundary: measured to fit ({best.mib:.0f} MiB predicted of "
                                       f"{budget:.0f})")
        misses = sum(1 for s in group if s.fits is False and s.predicted_mib is not None
                     and s.predicted_mib <= budget)
        if misses >= BISECT_AFTER:
            floor = max((c.speed for c in pool if c.mib <= fit_at), default=-math.inf)
            open_ = sorted((c for c in pool if c.mib > fit_at and c.speed >= floor), key=lambda c: c.mib)
            mid = open_[len(open_) // 2]
            return Choice(mid.params, f"boundary: bisect the placements between the measured peaks "
                                      f"({mid.mib:.0f} MiB predicted, {misses} predictions were wrong)")
        return Choice(best.params, f"boundary: fastest placement predicted to fit ({best.mib:.0f} of "
                                   f"{budget:.0f} MiB)")

    def _prefer_experts(self, pool: list[Candidate]) -> list[Candidate]:
        """Expert placements only, unless none fits or a whole-layer one is predicted faster."""
        if not pool:
            return pool
        fewest = min(c.whole for c in pool)
        experts = [c for c in pool if c.whole == fewest]
        whole = [c for c in pool if c.whole > fewest]
        if whole and max(c.speed for c in whole) > max(c.speed for c in experts):
            return pool
        return experts

    def _candidates(self, knobs: dict[str, Any]) -> list[Candidate]:
        """Every distinct GPU share in the space with these knob values: expert placements with all layers on the
        GPU, whole-layer placements without expert offload (the combination is dominated), each split."""
        ngls = self.values.get("n_gpu_layers", [None])
        top = max(ngls) if ngls != [None] else None
        experts = [n for n in ("n_cpu_moe", "cpu_expert_layers") if n in self.share]
        splits = [n for n in ("tensor_split", "expert_split") if n in self.share]
        out: dict[Any, Candidate] = {}
        for ngl in ngls:
            expert_values = [self.values[n] if ngl == top else [min(self.values[n])] for n in experts]
            for combo in itertools.product(*expert_values, *(self.values[n] for n in splits)):
                params = dict(zip(experts + splits, combo))
                if ngl is not None:
                    params["n_gpu_layers"] = ngl
                config = self._config({**knobs, **params})
                path = str(config.model)
                if path not in self.perf:
                    continue
                n_layers = self.perf[path].shape.n_layers
                on_cpu = set(range(min(config.n_cpu_moe, n_layers)))
                if config.get("cpu_expert_layers"):
                    on_cpu |= set(cpu_expert_layers(config.get("placement") or "first",
                                                    config.get("cpu_expert_layers"), n_layers))
                whole = cpu_layers(config.n_gpu_layers, n_layers)
                key = (path, whole, frozenset(on_cpu), tuple(params.get(n) for n in splits))
                if key in out:
                    continue
                pred = self._predict(config)
                out[key] = Candidate(params, config, pred if pred is not None else 0.0,
                                     self.perf[path].score(config, self.weights), whole)
        return list(out.values())

    # -- what the trials say ---------------------------------------------------------------------------------
    def _config(self, params: dict[str, Any]) -> TrialConfig:
        return to_config(self.campaign, params, self.models)

    def _predict(self, config: TrialConfig) -> float | None:
        pred = self.aid.predict(config)
        return pred.mib if pred is not None else None

    def _seen(self, study: optuna.Study) -> list[Seen]:
        """The finished trials; the score, tg and pp of a configuration measured more than once pool the samples
        of all its successful trials."""
        out = []
        budget = self.aid.budget_mib
        weights = self.campaign.objective_weights()
        trials = [t for t in Store(study).records() if t.state.is_finished() and not t.stale and t.params]
        pooled: dict[str, dict[str, list[float]]] = {}
        runs: dict[str, int] = {}
        for t in trials:
            if t.is_feasible_ok:
                key = _key(t.params)
                samples = pooled.setdefault(key, {"tg": [], "pp": [], "kld": []})
                samples["tg"] += t.samples("tg")
                samples["pp"] += t.samples("pp")
                samples["kld"] += t.kld_samples
                runs[key] = runs.get(key, 0) + 1
        for t in trials:
            outcome = t.outcome
            config = t.trial_config if t.config is not None else None
            samples = pooled.get(_key(t.params)) if t.is_feasible_ok else None
            score = store.score(samples, weights) if samples else None
            peak = t.rss_peak_mib if self.aid.side == "host" else t.vram_peak_mib
            if outcome in ("oom", "infeasible", "predicted_infeasible"):
                fits = False
            elif outcome in ("ok", "pruned") and peak and budget is not None:
                fits = peak <= budget
            else:
                fits = None
            tg, pp = (statistics.median(samples[k]) if samples and samples[k] else None for k in ("tg", "pp"))
            out.append(Seen(t.number, dict(t.params), score, fits, t.predicted_mib, config, tg, pp,
                            str(t.search_reason or ""), runs.get(_key(t.params), 1)))
        return out

    def _calibrate(self, seen: list[Seen]) -> None:
        """Refit each model's performance model to the OK trials' medians, towards its priors."""
        by_path: dict[str, list[tuple[TrialConfig, float | None, float | None]]] = {}
        once = {_key(s.params): s for s in seen if s.score is not None and s.config is not None}  # pooled already
        for s in once.values():
            by_path.setdefault(str(s.config.model), []).append((s.config, s.tg, s.pp))
        for path, observations in by_path.items():
            if path in self.perf:
                self.perf[path].calibrate(observations)


def _key(params: dict[str, Any]) -> str:
    """A configuration's identity among the trials (its searched parameters)."""
    return json.dumps(params, sort_keys=True, default=str)
