"""Step 1 of the boundary search (search/boundary.py): the GPU shares a model allows with given knob values, and the
one to measure against the memory budget.

The fast configurations keep as many weights on the GPU as fit, so the search looks for the placement (GPU layers,
expert layers in RAM, part of one more layer's FFN) with the highest predicted speed (performance model) whose
predicted peak (memory model, calibrated on every measured peak) is within the budget, or, next to a placement
measured to fit, over it by less than the model's typical error (until the model's own errors say how large that is,
the spread of its predicted difference from the measured fit, at most a PROBE share of the budget): only a
measurement settles that. No safety step: the prediction decides, and measured peaks decide where they exist: a
placement using no more memory than one measured to fit fits, one using no less than one measured over does not.
The same placement measured with other knob values carries its peak over, corrected by the model's predicted
difference (whose error the measured pairs of one placement give, before any pair the difference's own size):
measured where that says it fits, not probed where it is over by more than its spread. After two wrong predictions
the next trial bisects the placements still unknown; while none is measured to fit, it is the fastest placement
predicted to fit with as much to spare as the latest prediction (the best calibrated) missed by, not the middle of
every placement from the smallest (on an H100 that went 2.9 GiB below a 76 MiB miss). A step that misses again
misses by more, so the steps go down. Whole layers leave the GPU only when no expert placement fits or the
performance model predicts that a whole-layer placement is faster.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autoinfer.model.performance import PerformanceModel
from autoinfer.model.placement import cpu_expert_layers, cpu_layers, partial_layer
from autoinfer.search.chance import KAPPA
from autoinfer.search.configs import Configs
from autoinfer.search.context import SearchContext
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.seen import Seen, peak_of
from autoinfer.store.records import TrialRecord
from autoinfer.trial_config import TrialConfig

GPU_SHARE = ("n_gpu_layers", "n_cpu_moe", "cpu_expert_layers", "partial_experts")
BISECT_AFTER = 2  # wrong memory predictions in one memory group before the next trial bisects instead
PROBE = 0.03  # a placement predicted this far over the budget is still measured once (the model's typical error)
PROBE_ERRORS = 2  # calibrated predictions measured before their errors, not PROBE, size the probe
MAD_SD = 1.4826  # standard deviations per median absolute deviation (normal errors)
HOST_BUFFERS = frozenset({"load_mode", "huge_pages"})  # together they say where the weights in RAM are held


@dataclass(frozen=True)
class Candidate:
    params: dict[str, Any]  # the GPU-share parameters
    config: TrialConfig
    mib: float
    speed: float
    whole: int  # repeating layers kept whole on the CPU


@dataclass(frozen=True)
class Carried:
    """A peak carried over from a trial of the same GPU share with other knob values."""

    mib: float
    sd: float
    trial: int
    moved: bool = False  # from another GPU share (Shares.carried_from), not the same share's trial


@dataclass(frozen=True)
class Placed:
    """The GPU share the boundary gives some knob values, and why."""

    params: dict[str, Any]  # the GPU-share parameters
    reason: str


class Shares:
    """The GPU shares of one sweep and what the measured peaks say of them. What it works out for a proposal
    (the boundary per knob values, the shares, the memory model's typical error) is kept until the next one
    (new_proposal)."""

    def __init__(self, ctx: SearchContext, memory: MemoryScreen, configs: Configs, values: dict[str, list[Any]],
                 share: list[str], neutral: frozenset[str], perf: dict[str, PerformanceModel],
                 weights: dict[str, float]) -> None:
        self.ctx = ctx
        self.memory = memory
        self.configs = configs
        self.values = values
        self.share = share  # the GPU-share parameters of the space
        self.neutral = neutral  # knobs that move no peak
        self.perf = perf
        self.weights = weights
        self._memo: dict[str, Placed | None] = {}  # the boundary per memory-relevant knob values
        self._bounded: dict[str, tuple] = {}  # bounds per memory-relevant knob values
        self._pools: dict[str, list[Candidate]] = {}  # the GPU shares per knob values (candidates)
        self._miss: float | None = None  # how far predicted peak differences missed (None: no pair)
        self.probe: float | None = None  # the memory model's typical error once measured (MiB)
        self._fixed = ctx.campaign.fixed()
        self._unpinned: dict[tuple, bool] = {}  # unpinned() per load mode and huge pages

    def new_proposal(self, seen: list[Seen], trials: list[TrialRecord]) -> None:
        """Forget the last proposal's answers; learn how far the memory model misses from the trials so far."""
        self._memo, self._pools, self._bounded = {}, {}, {}
        self._miss = self._difference_miss(seen) if self.share and self.memory.models else None
        self.probe = self.probe_margin(trials)

    def boundary_of(self, knobs: dict[str, Any], seen: list[Seen]) -> Placed | None:
        """_boundary once per proposal and memory-relevant knob values: the first values asked answer for all their
        memory-neutral twins."""
        key = self._memory_key(knobs)
        if key not in self._memo:
            self._memo[key] = self._boundary(knobs, seen)
        return self._memo[key]

    def _boundary(self, knobs: dict[str, Any], seen: list[Seen]) -> Placed | None:
        """The GPU share to measure with these other knob values (see the module docstring)."""
        candidates = self.candidates(knobs)
        if not candidates:
            return None
        budget = self.ctx.budget_mib
        if budget is None or not self.memory.models:
            best = max(candidates, key=lambda c: (c.speed, -c.mib))
            return Placed(best.params, "boundary: no memory budget, the most weights on the GPU")
        group, fit_at, nearest, over_at = self.bounds(knobs, seen)
        known = [c for c in candidates if c.mib <= fit_at]
        unknown, carried_fits, margins = [], {}, {}
        for c in candidates:
            if fit_at < c.mib < over_at:
                carried = self.carried(c, knobs, seen)
                margins[id(c)] = self._margin(c, nearest)
                if carried is not None and carried.mib <= budget:
                    unknown.append(c)  # measured neighbours say it fits, whatever the prediction says
                    carried_fits[id(c)] = carried
                elif c.mib <= budget + margins[id(c)] and (carried is None or
                                                           carried.mib - KAPPA * carried.sd <= budget):
                    unknown.append(c)
        pool = self.prefer_experts(known + unknown)
        if not pool:
            rest = [c for c in candidates if c.mib < over_at]
            if not rest:
                return None
            low = min(rest, key=lambda c: c.mib)
            return Placed(low.params, f"boundary: nothing is predicted to fit in {budget:.0f} MiB, the smallest "
                                      f"placement (predicted {low.mib:.0f} MiB)")
        best = max(pool, key=lambda c: (c.speed, -c.mib))
        if best.mib <= fit_at:
            return Placed(best.params, f"boundary: measured to fit ({best.mib:.0f} MiB predicted of "
                                       f"{budget:.0f})")
        missed = [s for s in group if s.fits is False and s.predicted_mib is not None and s.predicted_mib <= budget]
        misses = len(missed)
        if misses >= BISECT_AFTER:
            floor = max((c.speed for c in pool if c.mib <= fit_at), default=-math.inf)
            open_ = sorted((c for c in pool if c.mib > fit_at and c.speed >= floor), key=lambda c: c.mib)
            latest = (max((s for s in missed if s.peak_mib is not None), key=lambda s: s.number, default=None)
                      if fit_at == -math.inf else None)  # a step down while nothing is measured to fit
            if latest is not None:
                missed_by = latest.peak_mib - latest.predicted_mib
                spared = [c for c in open_ if c.mib + missed_by <= budget]
                if spared:
                    low = max(spared, key=lambda c: (c.speed, -c.mib))
                    return Placed(low.params, f"boundary: no placement measured to fit yet and {misses} predictions "
                                              f"were wrong, the latest by {missed_by:.0f} MiB: the fastest placement "
                                              f"predicted to fit with that much to spare ({low.mib:.0f} MiB)")
            mid = open_[len(open_) // 2]
            return Placed(mid.params, f"boundary: bisect the placements between the measured peaks "
                                      f"({mid.mib:.0f} MiB predicted, {misses} predictions were wrong)")
        if best.mib > budget and id(best) in carried_fits:
            carried = carried_fits[id(best)]
            return Placed(best.params, f"boundary: fastest placement carried over to fit ({best.mib:.0f} MiB "
                                       f"predicted, {carried.mib:.0f} ± {carried.sd:.0f} from trial "
                                       f"{carried.trial}'s measured peak with other knobs, of {budget:.0f})")
        if best.mib > budget:
            return Placed(best.params, f"boundary: probe the fastest placement, predicted {best.mib:.0f} MiB, over "
                                       f"{budget:.0f} by less than the memory model's typical error "
                                       f"({margins[id(best)]:.0f} MiB)")
        return Placed(best.params, f"boundary: fastest placement predicted to fit ({best.mib:.0f} of "
                                   f"{budget:.0f} MiB)")

    def bounds(self, knobs: dict[str, Any], seen: list[Seen]) -> tuple[list[Seen], float, Seen | None, float]:
        """The trials measured with these knob values (memory-neutral ones aside) whose fit is known; the largest
        prediction among those that fitted, that trial; the smallest prediction among those over the budget. A
        placement predicted to use no more than one that fitted fits; one predicted to use no less than one over
        does not. Once per proposal: the boundary and every move's reach ask for the same knob values."""
        key = self._memory_key(knobs)
        if key not in self._bounded:
            group = [s for s in seen if s.fits is not None and s.config is not None and self.alike(s.params, knobs)]
            measured = [(self.configs.predict(s.config), s) for s in group]
            fit_at, nearest = max(((m, s) for m, s in measured if s.fits), key=lambda ms: ms[0],
                                  default=(-math.inf, None))
            over_at = min((m for m, s in measured if not s.fits), default=math.inf)
            self._bounded[key] = (group, fit_at, nearest, over_at)
        return self._bounded[key]

    def _memory_key(self, knobs: dict[str, Any]) -> str:
        """The knob values that can move a peak (memory_values), as a key."""
        return json.dumps(self.memory_values(knobs), sort_keys=True, default=str)

    def memory_values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The knob values of `params` that can move a peak: the memory-neutral ones aside, but where the load mode
        and huge pages are among those, whether together they leave the weights in RAM outside the driver's pinned
        buffers (TrialConfig.host_weights_unpinned). With the last layer's experts in RAM, llama.cpp's compute
        buffer then holds one more layer's per-token tensors (the memory model's term, 20-60 MiB on an H100). Without
        it the pinned twins of a huge-page trial got its boundary and its prediction (8092 MiB at 8 GiB on an H100
        at 1195ee8; they measured 8070, vs-fit-h100.md), and where the start held the weights outside pinned buffers
        their pinned twins stayed one share below the one that fits them (tests/search/test_boundary.py)."""
        values = {k: v for k, v in params.items() if k not in self.neutral}
        if HOST_BUFFERS & self.neutral:
            values["host_weights_unpinned"] = self.unpinned(params)
        return values

    def unpinned(self, params: dict[str, Any]) -> bool:
        """TrialConfig.host_weights_unpinned of parameters (the campaign's fixed values beneath them)."""
        key = tuple(params.get(k, self._fixed.get(k)) for k in sorted(HOST_BUFFERS))
        if key not in self._unpinned:
            values = {k: v for k, v in zip(sorted(HOST_BUFFERS), key) if v is not None}
            self._unpinned[key] = TrialConfig.from_params({**values, "model": ""}).host_weights_unpinned()
        return self._unpinned[key]

    def alike(self, params: dict[str, Any], knobs: dict[str, Any]) -> bool:
        """Whether `params` has the values of `knobs` that can move a peak (memory_values)."""
        mine = self.memory_values(params)
        return all(mine.get(k) == v for k, v in self.memory_values(knobs).items())

    def carried(self, candidate: Candidate, knobs: dict[str, Any], seen: list[Seen]) -> Carried | None:
        """The candidate's peak carried over from the same GPU share measured with other knob values, with its
        standard deviation: that peak plus the difference between the two knob values (_knob_difference; the
        closest such trial, None where the share was never measured). The model's error for one placement is
        mostly the placement's own and cancels in the difference, so a placement measured over in one group is not
        probed again in every other group, and one the model puts just over the budget is measured where its
        measured neighbours say it fits. A trial llama.cpp runs alike (other memory-neutral knobs, a moot
        placement pattern) carries its peak exactly, and one measured over the budget carries it over without doubt
        to knob values predicted to need no less: on synthetic-1321 at 12 GiB the share measured 98 MiB over with
        ubatch 512 was given 21% to fit with ubatch 2048, from the predicted difference's own size as its spread."""
        # the same share measured in another group (the same group's measured peaks already bound the prediction)
        others = [s for s in seen if s.peak_mib is not None and s.config is not None
                  and all(s.params.get(n) == v for n, v in candidate.params.items())
                  and not self.alike(s.params, knobs)]
        if not others:
            return None
        full = {**knobs, **candidate.params}
        same = self.configs.same(full)
        best = None
        for s in others:
            if self.configs.same({**s.params, **{k: v for k, v in full.items() if k in self.neutral}}) == same \
                    and self.unpinned(s.params) == self.unpinned(full):
                return Carried(s.peak_mib, 0.0, s.number)  # llama.cpp runs them alike: the peak is the measured one
            diff = self._knob_difference(candidate.config, s.config, knobs, s, seen, self.share_key(s.params))
            if diff is None:
                continue
            mean, sd = diff
            if s.fits is False and mean >= 0.0:
                sd = 0.0  # no less memory than a peak measured over the budget: over, however large the doubt
            if best is None or sd < best.sd:
                best = Carried(s.peak_mib + mean, sd, s.number)
        return best

    def carried_from(self, candidate: Candidate, knobs: dict[str, Any], incumbent: Seen,
                      seen: list[Seen]) -> Carried | None:
        """A share never measured, with these knob values: the incumbent's measured peak plus the difference,
        where the knob values free memory at that share (None otherwise). The share's part of the difference is
        weight bytes, counted, with the model's spread; the knobs' part (compute buffers, KV cache) is estimated as
        carried estimates it (_knob_difference), from measured pairs where there are any. On synthetic-1040 at
        12 GiB the best row keeps 20 layers' experts in RAM with ubatch 128 (12149 MiB); the model put that share
        over the budget with every ubatch until ubatch 2048 was measured, and it came as the 14th trial; as this
        move, 7th (benchmarks/results/search-efficiency.md)."""
        if not incumbent.fits or incumbent.peak_mib is None or incumbent.config is None:
            return None
        at_own = self.configs.config({k: incumbent.params.get(k) for k in knobs} | candidate.params)
        share_part = self.memory.difference(at_own, incumbent.config)
        knob_part = self._knob_difference(candidate.config, at_own, knobs, incumbent, seen, None)
        if knob_part is None or share_part is None or knob_part[0] >= 0.0:
            return None
        return Carried(incumbent.peak_mib + share_part[0] + knob_part[0], math.hypot(share_part[1], knob_part[1]),
                       incumbent.number, moved=True)

    def _knob_difference(self, config: TrialConfig, other_config: TrialConfig, knobs: dict[str, Any], other: Seen,
                         seen: list[Seen], skip: str | None) -> tuple[float, float] | None:
        """The peak difference between `config` and `other_config` (one GPU share, with `knobs` and with `other`'s
        knob values), with its standard deviation: as measured in pairs at shares other than `skip`
        (_measured_difference), or where none was, the memory model's prediction. Its spread adds to the
        coefficients' uncertainty how far the predicted differences between measured pairs of one share missed (the
        model's form may not be llama.cpp's); before any such pair, the difference's own size: its sign is trusted,
        not its size. Without that prior the first trials of a new placement pattern probed the share just measured
        over with another (synthetic-297 at 12 GiB: trial 4 repeated trial 1's 12593 MiB,
        benchmarks/results/search-efficiency.md). None where the model cannot tell."""
        diff = self.memory.difference(config, other_config)
        if diff is None:
            return None
        return self._measured_difference(config, knobs, other, skip, seen, diff[0]) or \
            (diff[0], math.hypot(diff[1], self._miss if self._miss is not None else diff[0]))

    def _measured_difference(self, config: TrialConfig, knobs: dict[str, Any], other: Seen, skip: str | None,
                             seen: list[Seen], predicted: float) -> tuple[float, float] | None:
        """The peak difference between `knobs` and `other`'s knob values as measured at GPU shares other than `skip`
        (pairs of trials of one share with those two sets of values), moved to this share by the memory model's
        predicted change of the difference between the shares (`predicted` is its difference at this share), with its
        standard deviation: the size of that change and the spread of the pairs. None without such a pair. The KV
        cache and compute buffers a knob sizes hardly depend on where the experts are, and a measured difference
        knows what the model's form does not: on synthetic-781 at 8 GiB the model put flash attention with a q8_0
        K cache 15 MiB below f16 without it where the pairs measured 64, and the share measured 55 MiB over the
        budget with f16 was never tried with q8_0, which fitted with 9 MiB to spare
        (benchmarks/results/search-efficiency.md)."""
        theirs = {k: other.params.get(k) for k in knobs}
        shares: dict[str, tuple[list[Seen], list[Seen]]] = {}
        for s in seen:
            key = self.share_key(s.params)
            if s.peak_mib is None or s.config is None or str(s.config.model) != str(config.model) or key == skip:
                continue
            mine, others = shares.setdefault(key, ([], []))
            if self.alike(s.params, knobs):
                mine.append(s)
            elif self.alike(s.params, theirs):
                others.append(s)
        estimates, changes = [], []
        for mine, others in shares.values():
            there = self.memory.difference(mine[0].config, others[0].config) if mine and others else None
            if there is not None:
                changes.append(predicted - there[0])
                estimates.append(mine[0].peak_mib - others[0].peak_mib + changes[-1])
        if not estimates:
            return None
        spread = statistics.stdev(estimates) if len(estimates) > 1 else 0.0
        return statistics.fmean(estimates), math.hypot(statistics.fmean(abs(c) for c in changes), spread)

    def probe_margin(self, trials: list[TrialRecord]) -> float | None:
        """How far over the budget a placement predicted next to one measured to fit is still measured, once the
        memory model's typical error is known: KAPPA robust standard deviations of the errors of its calibrated
        predictions (after the study's first measured peak, the uncalibrated prior's), never more than PROBE of the
        budget. None until PROBE_ERRORS of them were measured (then _margin says). On an H100 the calibrated
        predictions missed by 1-50 MiB where 3% of 12 GiB is 369: 5 of 10 trials measured placements predicted over
        the budget, each over by what was predicted."""
        budget = self.ctx.budget_mib
        if budget is None:
            return None
        measured = sorted((t for t in trials if peak_of(t, self.ctx.side) and t.predicted_mib is not None),
                          key=lambda t: t.number)
        errors = [abs(peak_of(t, self.ctx.side) - t.predicted_mib) for t in measured[1:]]
        if len(errors) < PROBE_ERRORS:
            return None
        return min(PROBE * budget, KAPPA * MAD_SD * statistics.median(errors))

    def _margin(self, candidate: Candidate, nearest: Seen | None) -> float:
        """MiB over the budget `candidate` may be predicted and still be measured: none away from a measured fit of
        the same knob values (`nearest`, the one predicted largest); the model's typical error where its
        calibrated predictions were measured (probe_margin); before that, KAPPA standard deviations of the
        predicted difference from `nearest`, never more than PROBE of the budget. The two differ only in where the
        weights are, whose bytes are counted exactly, so its spread is the coefficients'. With the fixed PROBE
        there, one measured fit (llama-fit-params' answer) sent the next trial to a placement predicted 254-388
        MiB over the budget on an H100: 3 of 30 trials at 8, 12 and 16 GiB, each over by what was predicted
        (benchmarks/results/vs-fit-h100.md)."""
        if nearest is None:
            return 0.0
        if self.probe is not None:
            return self.probe
        cap = PROBE * self.ctx.budget_mib  # _boundary asks only with a budget, of a group of trials with configs
        diff = self.memory.difference(candidate.config, nearest.config)
        return cap if diff is None else min(cap, KAPPA * diff[1])

    def share_key(self, params: dict[str, Any]) -> str:
        """The GPU share's parameters of a trial, as a key."""
        return json.dumps({n: params.get(n) for n in self.share}, sort_keys=True, default=str)

    def _difference_miss(self, seen: list[Seen]) -> float | None:
        """Root mean square of measured minus predicted peak differences over pairs of trials of one GPU share
        whose predictions differ; None without such a pair."""
        by_share: dict[str, list[Seen]] = {}
        for s in seen:
            if s.peak_mib is not None and s.config is not None:
                by_share.setdefault(f"{s.config.model}|{self.share_key(s.params)}", []).append(s)
        misses = []
        for group in by_share.values():
            for a, b in itertools.combinations(group, 2):
                diff = self.memory.difference(a.config, b.config)
                if diff is not None and diff[0] != 0.0:
                    misses.append((a.peak_mib - b.peak_mib) - diff[0])
        return math.sqrt(statistics.fmean(m * m for m in misses)) if misses else None

    def prefer_experts(self, pool: list[Candidate]) -> list[Candidate]:
        """Expert placements only, unless none fits or a whole-layer one is predicted faster."""
        if not pool:
            return pool
        fewest = min(c.whole for c in pool)
        experts = [c for c in pool if c.whole == fewest]
        whole = [c for c in pool if c.whole > fewest]
        if whole and max(c.speed for c in whole) > max(c.speed for c in experts):
            return pool
        return experts

    def candidates(self, knobs: dict[str, Any]) -> list[Candidate]:
        """Every distinct GPU share in the space with these knob values: expert placements with all layers on the
        GPU, whole-layer placements without expert offload (the combination is dominated). Once per
        proposal: the boundary and the step down below the incumbent ask for the same knobs."""
        memo = json.dumps(knobs, sort_keys=True, default=str)
        if memo in self._pools:
            return self._pools[memo]
        ngls = self.values.get("n_gpu_layers", [None])
        top = max(ngls) if ngls != [None] else None
        experts = [n for n in ("n_cpu_moe", "cpu_expert_layers", "partial_experts") if n in self.share]
        out: dict[Any, Candidate] = {}
        for ngl in ngls:
            expert_values = [self.values[n] if ngl == top else [min(self.values[n])] for n in experts]
            for combo in itertools.product(*expert_values):
                params = dict(zip(experts, combo))
                if ngl is not None:
                    params["n_gpu_layers"] = ngl
                config = self.configs.config({**knobs, **params})
                path = str(config.model)
                if path not in self.perf:
                    continue
                n_layers = self.perf[path].shape.n_layers
                on_cpu = set(range(min(config.n_cpu_moe, n_layers)))
                if config.get("cpu_expert_layers"):
                    on_cpu |= set(cpu_expert_layers(config.get("placement") or "first",
                                                    config.get("cpu_expert_layers"), n_layers))
                whole = cpu_layers(config.n_gpu_layers, n_layers)
                split_layer = partial_layer(config.get("placement"), on_cpu, config.n_gpu_layers, n_layers)
                part = (split_layer, config.get("partial_experts")) if config.get("partial_experts") and \
                    split_layer is not None else None
                key = (path, whole, frozenset(on_cpu), part)
                if key in out:
                    continue
                pred = self.configs.predict(config)
                out[key] = Candidate(params, config, pred if pred is not None else 0.0,
                                     self.perf[path].score(config, self.weights), whole)
        self._pools[memo] = list(out.values())
        return self._pools[memo]
