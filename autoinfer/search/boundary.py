"""The search that starts from what is known: the memory boundary first, then few moves of the other knobs.

0. Baseline. On a GPU budget llama-fit-params' answer is measured first, asked again for less while it is over the
   budget (search/fit_baseline.py): llama.cpp's own fit is what the answer has to beat, and its peak is a measured
   one next to the budget. One that runs llama-fit-params' raw overrides (a placement the campaign's parameters
   cannot say) is left out of what the steps below reason about: its parameters do not name its placement. Such a
   placement is grafted onto the incumbent's knobs instead (search/graft.py) when that is likelier to beat the
   incumbent than the best local move.
1. Boundary. The fast configurations keep as many weights on the GPU as fit, so the first trials measure the
   fastest placement the memory model, calibrated on every measured peak, and the measured peaks say fits the budget
   (search/shares.py: no safety step; a peak carried over between knob values; after two wrong predictions a step
   down or a bisection).
2. Local moves. At the boundary, the other knobs (threads, load mode, ubatch, placement pattern, KV types, the splits
   over several GPUs, …) are changed one at a time around the best trial so far, the placement re-fitted to the
   boundary for each (a larger ubatch or KV cache needs room; a split moves weights between GPUs). The first trial
   takes llama.cpp's defaults, and the splits that leave the most room on the fullest GPU. Each move's chance to beat
   the incumbent comes from the performance model's ratio for its placement times the knob effects learned from every
   trial so far (search/effects.py: a mean and a standard deviation); a move is measured while that chance is above
   GATE (16%: one standard deviation short; search/chance.py), the likeliest first. A value never measured is
   expected to do what a typical value of its knob does (of an ordered knob: like its measured neighbours, and along
   their trend), with the prior's spread; a move already measured worse from an earlier incumbent is not measured
   again, nor one whose re-fitted placement costs more than the knobs can win back. The GPU share one step below the
   incumbent's (the placement predicted fastest after its own) is a move too, with a process's luck as its spread:
   where shares differ by less than a process's luck, or by a cost their bytes do not show, the most weights on the
   GPU are not always the fastest. An improvement moves the incumbent and the moves restart from it. Where the
   incumbent sits below the boundary (a step down beat it), each knob move is also measured at the incumbent's own
   share where that share is known to fit with it (the knobs it changes use no memory, or are predicted to use no
   more), and the share one step above the incumbent's, below the boundary's, is a move too.
   For a decode-only objective the moves of batch and ubatch, which size the prompt's batches and not a decode step,
   come after the others unless the memory they free is predicted to buy a faster placement (PROMPT_ONLY).
   A move may also go to a share faster than its boundary where that share's peak, carried over, may fit: from the
   share measured with other knob values, or, where no trial measured it, from the incumbent's peak by the predicted
   difference where the move frees memory. It is ranked by the chance to fit times the chance to beat the incumbent,
   and comes first too where its expected gain (the chance to fit times the expected improvement if it fits) is
   larger than the likeliest move's: a quarter's chance of a share 1.28x faster is worth more than an even chance
   of a knob value no trial has measured.
3. Whole layers leave the GPU only when no expert placement fits or the performance model predicts that a
   whole-layer placement is faster. Step 7's too: a configuration with more whole layers in RAM than the best trial
   is not explored, and a sampler's proposal of one is recorded as predicted_slower, not measured, while the model
   gives it less than GATE to beat it.
4. Model. Then the combination of knob values at the boundary most likely to beat the incumbent, while that
   chance is above GATE (knobs that help alone help together; where they do not, measuring says so and the
   model learns it).
5. Again. An incumbent measured once that no move or combination beat is measured once more (tagged
   `again_of`): one lucky measurement would otherwise end the search. A configuration's score pools the samples
   of all its trials.
6. Grid. Then the other combinations of the knobs at the boundary, the likeliest to beat the incumbent first,
   where the space has at most GRID_MAX of them.
7. Explore. When every combination at the boundary has been measured, configurations are drawn from the whole
   space, and of those not asked for and predicted within the budget the one whose random draw from its predicted
   gain over the incumbent is largest is measured (Thompson sampling: the models' doubt, not TPE's, decides what is
   tried off the boundary). When no draw is left the campaign's sampler (TPE) takes over. A configuration already
   measured is answered from its measurement, not run again (sweep/repeats.py).
What the search has tried is keyed by the command llama.cpp runs: a placement pattern is moot where no layer's
experts, or every layer's, are in RAM, and such a twin is neither a move nor a new peak.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autoinfer.engines.base import Measurement, Outcome, TrialConfig
from autoinfer.model.performance import PerformanceModel
from autoinfer.model.placement import GPU_SPLITS, cpu_layers
from autoinfer.search.chance import GATE, chance_to_beat, worth
from autoinfer.search.configs import Configs
from autoinfer.search.context import SearchContext, typical
from autoinfer.search.effects import RESIDUAL_SD, KnobEffects, numeric
from autoinfer.search.fit_baseline import FIT_SLACK_MIB, WAITING, fit_label, fit_params_trial, fit_trials, next_budget
from autoinfer.search.graft import graft
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.seen import Seen, configurations, seen_trials
from autoinfer.search.shares import GPU_SHARE, Candidate, Shares
from autoinfer.search.strategy import SAMPLED, learn
from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import Store, record_of, write_trial

# Order of the local moves: knobs whose effect is usually largest first (CPU-side experts make threads matter; the
# splits decide which GPU holds which experts: 77-89 tok/s at the same bytes on two H200s,
# benchmarks/results/multi-gpu-h200x2.md; the load mode decides pinned buffers and so the prompt's copy speed, huge
# pages how fast a decode step reads the experts in RAM, 1.22x pinned's on an H200 host; ubatch the prompt's batching).
KNOB_ORDER = ("threads", "expert_split", "tensor_split", "load_mode", "huge_pages", "ubatch", "placement", "type_k",
              "type_v", "flash_attn", "batch", "repack", "model")
PATTERN_PREFERENCE = ("last", "first", "even")  # llama.cpp's own fit leaves the last layers' experts in RAM
MEMORY_NEUTRAL = frozenset({"threads", "poll", "cpu_strict", "prio"})
# A decode step is one token: these size the prompt's batches (and the compute buffers, hence the placement), not the
# step (autoinfer/model/performance.py; measured at a fixed placement on an H100, ubatch moved tg by +3.0 ± 4.0% and
# +0.9 ± 5.5%, benchmarks/table_structure.py). For a decode-only objective their moves come after the others unless
# the memory they free is predicted to buy a faster placement.
PROMPT_ONLY = frozenset({"batch", "ubatch"})
DEVICE_NEUTRAL = frozenset({"load_mode", "huge_pages", "repack"})  # host buffers (pinned or not: Shares.memory_values)
DEFAULT_LOG_SD = 0.03  # spread of one trial's log median where it has too few samples to say (run-to-run noise)
LONG_AXIS = 6  # an ordered knob with more values than this moves a quarter of its range first
GRID_MAX = 4096  # combinations of the other knobs the strategy enumerates at the boundary before exploring
EXPLORE_DRAWS = 256  # configurations drawn from the space per exploring proposal (step 7)


def allowed_values(dist: BaseDistribution) -> list[Any]:
    """The values the strategy considers for a distribution: every one of an integer range, eight spread evenly on a
    log one, a float range's ends and middle (campaign.space.allowed answers which values belong to the space)."""
    if isinstance(dist, IntDistribution):
        if dist.log:
            return sorted({int(round(dist.low * (dist.high / dist.low) ** (i / 7))) for i in range(8)})
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution):
        return [dist.low, (dist.low + dist.high) / 2, dist.high]
    assert isinstance(dist, CategoricalDistribution)
    return list(dist.choices)


@dataclass(frozen=True)
class Reach:
    """A knob move's faster GPU share that may fit (Boundary._reach)."""

    params: dict[str, Any]
    chance: float  # to fit, times to beat the incumbent if it does
    worth: float  # to fit, times the expected log gain over the incumbent if it does (_worth)
    gain: float  # predicted log gain over the incumbent, if it fits
    sd: float
    why: str


@dataclass(frozen=True)
class Move:
    """One local move from the incumbent (Boundary._local) and what the models expect of it."""

    later: bool  # a prompt-only knob's move, after the others (PROMPT_ONLY)
    rank: int  # the knob's place in the search's knob order: the tie-break
    knob: str  # or "down"/"up" for a step of the GPU share
    value: Any
    params: dict[str, Any]
    gain: float  # predicted log gain over the incumbent
    sd: float
    why: str
    chance: float  # to beat the incumbent (for a reach, times its chance to fit)
    worth: float  # the expected log gain over the incumbent (_worth; for a reach, times its chance to fit)
    reach: bool = False  # to a share faster than the boundary, whose peak may not fit

    def order(self) -> tuple[bool, float, int]:
        """Likeliest first; chances within a percent are a tie, which the knob order decides."""
        return self.later, -round(self.chance, 2), self.rank


@dataclass(frozen=True)
class Choice:
    params: dict[str, Any]
    reason: str
    again_of: int | None = None  # a configuration measured again on purpose (its first trial)
    chance: float | None = None  # to beat the incumbent, where a model gave one
    fields: dict[str, Any] = field(default_factory=dict)  # record fields of a trial running raw overrides (graft)


class Boundary:
    """Strategy object (autoinfer.search.strategy.Strategy) for one sweep."""

    name = "boundary"

    def __init__(self, ctx: SearchContext, memory: MemoryScreen, dists: dict[str, BaseDistribution]) -> None:
        self.ctx = ctx
        self.memory = memory
        self.campaign = campaign = ctx.campaign
        self.models = ctx.models
        self.values = {name: allowed_values(d) for name, d in dists.items()}
        self.weights = {k: v for k, v in campaign.objective_weights().items() if k in ("tg", "pp")} or {"tg": 1.0}
        self.perf = {path: PerformanceModel(shape, gpu=ctx.side != "host") for path, shape in ctx.shapes.items()}
        self.share = [n for n in GPU_SHARE if n in dists] if self.perf else []
        rank = {n: i for i, n in enumerate(KNOB_ORDER)}
        self.knobs = sorted((n for n in dists if n not in self.share), key=lambda n: (rank.get(n, len(rank)), n))
        neutral = MEMORY_NEUTRAL | (DEVICE_NEUTRAL if ctx.side == "device" else frozenset())
        self.deferred = PROMPT_ONLY if set(self.weights) == {"tg"} else frozenset()
        self.sampler = campaign.sampler.name
        self.fit_baseline = campaign.search.fit_params and ctx.side == "device" and bool(self.perf)
        self.grafts = self.fit_baseline  # its placement with the search's knobs (search/graft.py)
        self.configs = Configs(ctx, memory)
        self.shares = Shares(ctx, memory, self.configs, self.values, self.share, neutral, self.perf,
                             self.weights)

    # -- the interface -------------------------------------------------------------------------------------
    def start(self, study: optuna.Study) -> None:
        learn(self.memory, self.campaign, study)
        Store(study).write_study(search_notes=tuple(self.ctx.notes + self._notes()))
        self._queue(study)

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        asked = record_of(trial)  # a drift anchor's re-measurement or a retry runs as queued, not as the sampler's
        sampled = asked.search_reason is None and not asked.origin
        if sampled:
            write_trial(trial, search_reason=f"{SAMPLED} {self.sampler} (no local move or exploration draw was left)"
                        if asked.explore_after_repeats is None else f"{SAMPLED} drawn at random, unmeasured, after "
                        f"{asked.explore_after_repeats} suggestion(s) in a row of configurations already measured")
        skipped = self.memory.screen(trial, config)
        if skipped is None and sampled:
            skipped = self._whole_layers_lose(dict(trial.params), config, Store(trial.study).records())
        return skipped

    def _whole_layers_lose(self, params: dict[str, Any], config: TrialConfig,
                           trials: list[TrialRecord]) -> Measurement | None:
        """Step 3 for the sampler's proposals: one that keeps more whole layers in RAM than the best trial so far is
        not measured while the performance model (and the knob effects), with a process's luck, give it less than
        GATE to beat that trial. On an H200 (benchmarks/tables/h200-35b-whole-layers.csv) every whole-layer offload
        beside expert layers in RAM was slower than an expert placement of no more memory; after the local moves TPE
        proposed them trial after trial."""
        whole = self._whole(config)  # 0 for a model without a performance model
        if not self.share or not whole or self.ctx.side != "device":
            return None
        seen = self._seen(trials)
        scored = [s for s in seen if s.score is not None and s.config is not None]
        if not scored:
            return None
        best = max(scored, key=lambda s: s.score)
        fewer = self._whole(best.config)
        if fewer >= whole:
            return None
        gain, sd = self._gain(params, best, self._effects(seen))
        sd = math.hypot(sd, RESIDUAL_SD)
        chance = chance_to_beat(gain, sd)
        if chance > GATE:
            return None
        return Measurement(Outcome.PREDICTED_SLOWER, reason=(
            f"not measured: {whole} layers whole in RAM against {fewer} in trial {best.number}, the best so far, "
            f"predicted ×{math.exp(gain):.2f} ± {sd:.2f} of its speed ({chance:.0%} to beat it)"))

    def observe(self, study: optuna.Study) -> None:
        learn(self.memory, self.campaign, study)
        self._queue(study)

    def _notes(self) -> list[str]:
        """For `status`: how many trials one pass of one-knob moves takes against the trial budget (on synthetic
        tables the search missed its 12-trial target mostly where the knobs had ten moves or more,
        benchmarks/results/search-efficiency.md), and which knobs move last."""
        notes = []
        moves = {k: len(self.values[k]) - 1 for k in self.knobs if len(self.values[k]) > 1}
        if moves:
            total, budget = sum(moves.values()), self.campaign.budget.trials
            listed = ", ".join(f"{k} {n}" for k, n in moves.items())
            short = "" if budget > total else ": the budget ends before every knob value has been measured once"
            notes.append(f"{total} one-knob moves ({listed}): one pass over them takes at least {total + 1} trials, "
                         f"the budget {budget}{short}")
        deferred = [k for k in moves if k in self.deferred]
        if deferred:
            notes.append(f"objective tg: {' and '.join(deferred)} move after the other knobs unless the memory they "
                         "free is predicted to buy a faster placement (they size the prompt's batches, not a decode "
                         "step)")
        return notes

    # -- proposals -----------------------------------------------------------------------------------------
    def _queue(self, study: optuna.Study) -> None:
        """Queue the next proposal unless a trial is already waiting (a retry, a re-measurement, a proposal) or the
        trial budget is spent (a proposal left behind would sit in the study as a trial that never runs)."""
        trials = Store(study).records()
        if any(t.state == TrialState.WAITING for t in trials):
            return
        if sum(t.uses_budget for t in trials) >= self.campaign.budget.trials:
            return
        if self.fit_baseline:
            baseline = self._fit_baseline(study, trials)
            if baseline is not None:
                params, fields = baseline
                Store(study).enqueue(params, **fields)
                return
        choice = self.propose(trials)
        if choice is not None:
            again = {"again_of": choice.again_of} if choice.again_of is not None else {}
            Store(study).enqueue(choice.params, search_reason=choice.reason, **again, **choice.fields)

    def _fit_baseline(self, study: optuna.Study, trials: list[TrialRecord]) -> tuple[dict, dict] | None:
        """llama-fit-params' answer to measure next (search/fit_baseline.py): first, so the memory model's first
        measured peak is one next to the budget and the sweep's answer is compared with it; asked again after an
        overshoot. None once it fitted, failed or gave up, with a note saying why."""
        earlier = fit_trials(trials)
        budget, why = next_budget(self.ctx, earlier)
        answer: tuple[dict, dict] | str
        if budget is None:
            answer = f"llama-fit-params baseline: {why}"
        else:
            others = self._typical()
            path = self.models[others["model"]] if "model" in others else next(iter(self.models.values()))
            answer = fit_params_trial(self.ctx, path, self.values, others, budget)
            if not isinstance(answer, str) and any(self.configs.same(answer[0]) == self.configs.same(t.params) and
                                                   t.fit_override_tensors == answer[1].get("fit_override_tensors")
                                                   for t in earlier):
                answer = f"llama-fit-params gave the same answer for {budget:.0f} MiB as before: no other baseline"
        if isinstance(answer, str):
            if why != WAITING:
                self.fit_baseline = False
                self.ctx.notes.append(answer)
                Store(study).write_study(search_notes=tuple(self.ctx.notes + self._notes()))
            return None
        params, fields = answer
        label = fit_label(self.ctx, budget)
        after = "" if not earlier else (f" (asked for less by what the answers of trial(s) "
                                        f"{', '.join(str(t.number) for t in earlier)} overshot the budget, plus "
                                        f"{FIT_SLACK_MIB} MiB each)")
        Store(study).write_study(search_notes=tuple(self.ctx.notes + self._notes()))
        return params, {**fields, "label": label, "search_reason": f"{label}: what llama.cpp's own fit runs, the "
                                                                   f"answer to beat{after}"}

    def propose(self, trials: list[TrialRecord]) -> Choice | None:
        """The next configuration to measure and why, from the study's `trials`; None when only the sampler is
        left."""
        seen = self._seen(trials)
        pending = (TrialState.RUNNING, TrialState.WAITING)
        asked = [s.params for s in seen] + [t.params for t in trials
                                            if t.state in pending and t.fit_override_tensors is None]
        tried = {self.configs.same(p) for p in asked}
        self._calibrate(seen)
        self.shares.new_proposal(seen, trials)
        scored = [s for s in seen if s.score is not None]
        incumbent = max(scored, key=lambda s: s.score) if scored else None
        base = {n: incumbent.params[n] for n in self.knobs} if incumbent else self._start(self._typical())
        if self.share:
            at = self.shares.boundary_of(base, seen)
            if at is not None and self.configs.same({**at.params, **base}) not in tried:
                return Choice({**at.params, **base}, at.reason)
        if incumbent is None:  # nothing measured yet to compare with: the start, then the moves from it, in order
            params, _ = self._at_boundary(base, seen)
            if params is not None and self.configs.same(params) not in tried:
                splits = ", the GPU splits that leave the most room" if base.keys() & set(GPU_SPLITS) else ""
                return Choice(params, "start: every knob at llama.cpp's default where the space has it, else at a "
                                      f"middle value{splits}")
            for knob in self.knobs:
                for value in self._moves(knob, base[knob]):
                    params, why = self._at_boundary({**base, knob: value}, seen)
                    if params is not None and self.configs.same(params) not in tried:
                        return Choice(params, f"local: {knob} {base[knob]} → {value} from the start{why}")
            return None
        effects = self._effects(seen)
        local = self._local(incumbent, base, seen, tried, effects)
        grafted = graft(trials, incumbent.number, incumbent.params, incumbent.score, self.knobs,
                        effects, self.memory, self.ctx.budget_mib, self.campaign.objective_weights(),
                        self._modelled) if self.grafts else None
        if grafted is not None and grafted.chance > GATE and (local is None or grafted.chance > local.chance):
            return Choice(grafted.params, grafted.reason, chance=grafted.chance, fields=grafted.fields)
        if local is not None:
            return local
        combos = sorted(self._combinations(incumbent, seen, asked, tried, effects),
                        key=lambda c: -chance_to_beat(c[1], c[2]))
        if combos and chance_to_beat(combos[0][1], combos[0][2]) > GATE:
            params, gain, sd, why = combos[0]
            return Choice(params, f"model: the combination at the boundary most likely to beat trial "
                                  f"{incumbent.number} ({chance_to_beat(gain, sd):.0%}), predicted "
                                  f"×{math.exp(gain):.2f} ± {sd:.2f} by the effects of {effects.n} "
                                  f"configurations{why}")
        moves = [m for m in seen if m.score is not None and m.params != incumbent.params]
        if incumbent.runs == 1 and moves:  # compared with measured moves: a lucky first measurement would end it
            return Choice(incumbent.params, f"again: no move or combination the model expects to beat trial "
                                            f"{incumbent.number} is left, so it is measured once more before the "
                                            "search leaves it (one lucky measurement would otherwise end the local "
                                            "search)", incumbent.number)
        if combos:
            params, gain, sd, why = combos[0]
            return Choice(params, f"grid: the next combination at the boundary from trial {incumbent.number}, the "
                                  f"most likely to beat it ({chance_to_beat(gain, sd):.0%}), predicted "
                                  f"×{math.exp(gain):.2f} ± {sd:.2f}{why}")
        return self._explore(incumbent, effects, tried, len(trials))

    def _explore(self, incumbent: Seen, effects: KnobEffects, tried: set[str], asked: int) -> Choice | None:
        """Step 7: of EXPLORE_DRAWS configurations drawn at random from the space, those no trial asked for, that
        the engine runs and the memory model predicts within the budget, the one whose draw from its predicted gain
        over the incumbent (the models' mean, their spread with a process's luck) is largest: Thompson sampling, so
        the configurations the models give a chance come first, and each is still measured at a rate its doubt
        sets. More whole layers in RAM than the incumbent keep step 3's gate. None where nothing is left (TPE then
        proposes) or for a Pareto objective, which has no single incumbent to beat. TPE, which knows neither model,
        measured placements far below the boundary after the local moves: on h200-35b-partial-processes.csv,
        where the best rows keep a share below the boundary, it took 17.5 and 18.5 trials at 12 and 16 GiB at the
        median, 10.5 and 9.5 with this step (benchmarks/results/search-efficiency.md)."""
        if self.campaign.objective == "pareto" or incumbent.config is None:
            return None
        rng = random.Random(f"{self.campaign.sampler.seed}-{asked}")
        budget = self.ctx.budget_mib
        whole = self._whole(incumbent.config)
        drawn: set[str] = set()
        best = None
        for _ in range(EXPLORE_DRAWS):
            params = {name: rng.choice(values) for name, values in self.values.items()}
            key = self.configs.same(params)
            if key in tried or key in drawn:
                continue
            drawn.add(key)
            config = self.configs.config(params)
            pred = self.configs.predict(config)
            if (pred is not None and budget is not None and pred > budget) or self.ctx.engine.refusal(config):
                continue
            gain, sd = self._gain(params, incumbent, effects)
            sd = math.hypot(sd, RESIDUAL_SD)
            if self._whole(config) > whole and chance_to_beat(gain, sd) <= GATE:
                continue
            draw = rng.gauss(gain, sd)
            if best is None or draw > best[0]:
                best = (draw, params, gain, sd)
        if best is None:
            return None
        _, params, gain, sd = best
        chance = chance_to_beat(gain, sd)
        return Choice(params, f"explore: every combination at the boundary was measured; of {len(drawn)} "
                              "configurations drawn from the space that no trial asked for, the one whose draw from "
                              f"its predicted gain over trial {incumbent.number} was largest, predicted "
                              f"×{math.exp(gain):.2f} ± {sd:.2f} ({chance:.0%} to beat it)", chance=chance)

    def _whole(self, config: TrialConfig) -> int:
        """Repeating layers a configuration keeps whole in RAM (0 for a model without a performance model)."""
        perf = self.perf.get(str(config.model))
        return 0 if perf is None else cpu_layers(config.n_gpu_layers, perf.shape.n_layers)

    def _local(self, incumbent: Seen, base: dict[str, Any], seen: list[Seen], tried: set[str],
               effects: KnobEffects) -> Choice | None:
        """The single move from the incumbent most likely to beat it, among those that may, or a reach worth more
        (module docstring)."""
        moves: list[Move] = []
        at_own, _ = self._at_boundary(base, seen)
        below = at_own is not None and self.shares.share_key(at_own) != self.shares.share_key(incumbent.params)
        for rank, knob in enumerate(self.knobs):
            for value in self._moves(knob, base[knob]):
                params, why = self._at_boundary({**base, knob: value}, seen)
                own = self._at_share({**base, knob: value}, incumbent) if below else None
                if own is not None and (params is None or
                                        self.shares.share_key(own) != self.shares.share_key(params)):
                    places = [(params, why), (own, " (at the incumbent's own GPU share, which fits with it)")]
                else:
                    places = [(params, why)]
                for at, at_why in places:
                    if at is None or self.configs.same(at) in tried:
                        continue
                    gain, sd = self._gain(at, incumbent, effects)
                    chance = chance_to_beat(gain, sd)
                    if chance > GATE:
                        later = knob in self.deferred and self._placed(at, incumbent) <= 0.0
                        moves.append(Move(later, rank, knob, value, at, gain, sd, at_why, chance, worth(gain, sd)))
                if params is None or self.configs.same(params) in tried:
                    continue
                reach = self._reach({**base, knob: value}, params, incumbent, seen, tried, effects)
                if reach is not None and reach.chance > GATE:
                    moves.append(Move(False, rank, knob, value, reach.params, reach.gain, reach.sd, reach.why,
                                      reach.chance, reach.worth, reach=True))
        for direction, step in (("down", self._step_down(incumbent, base, tried)),
                                ("up", self._step_up(incumbent, base, seen, tried) if below else None)):
            if step is None:
                continue
            params, what = step
            gain, sd = self._gain(params, incumbent, effects)
            sd = math.hypot(sd, RESIDUAL_SD)
            chance = chance_to_beat(gain, sd)
            if chance > GATE:
                moves.append(Move(False, len(self.knobs), direction, what, params, gain, sd, "", chance,
                                  worth(gain, sd)))
        if not moves:
            return None
        m, worth_note = min(moves, key=Move.order), ""
        # a gamble on memory for a large gain may be worth more than the likeliest small move
        reach = max((r for r in moves if r.reach), key=lambda r: r.worth, default=None)
        if reach is not None and reach.worth > m.worth:
            worth_note = f"; expected ×{math.exp(reach.worth):.3f}, more than the likeliest move's ×{math.exp(m.worth):.3f}"
            m = reach
        after = (f", after the other knobs' moves ({m.knob} sizes the prompt's batches, not a decode step)"
                 if m.later else "")
        move = f"one GPU share {m.knob}, {m.value}," if m.knob in ("down", "up") else f"{m.knob} {base[m.knob]} → {m.value}"
        return Choice(m.params, f"local: {move} from trial {incumbent.number}, predicted ×{math.exp(m.gain):.2f} ± "
                                f"{m.sd:.2f} ({m.chance:.0%} to beat it){after}{m.why}{worth_note}", chance=m.chance)

    def _at_share(self, knobs: dict[str, Any], incumbent: Seen) -> dict[str, Any] | None:
        """The knobs at the incumbent's own GPU share, where that share is known to fit with them: the knobs changed
        use no memory, or the memory model predicts them to need no more than the incumbent's (a placement using no
        more than one measured to fit fits). None otherwise. Asked where the incumbent sits below the boundary of its
        own knob values (a step down beat it). A move re-fitted to the boundary goes back to the
        boundary's share, which may be the one the incumbent beat one step below it: on h100-35b-partial.csv at
        8 GiB the boundary with 12 threads had measured slower than with 16, 27 layers' experts in RAM (one share
        below) beat both with 16 threads, and 12 threads there, the best row, was left to TPE."""
        if not self.share or incumbent.config is None or not incumbent.fits:
            return None
        params = {**{n: incumbent.params[n] for n in self.share if n in incumbent.params}, **knobs}
        if self.shares.alike(incumbent.params, knobs):
            return params
        diff = self.memory.difference(self.configs.config(params), incumbent.config)
        return params if diff is not None and diff[0] <= 0.0 else None

    def _reach(self, knobs: dict[str, Any], at: dict[str, Any] | None, incumbent: Seen, seen: list[Seen],
               tried: set[str], effects: KnobEffects) -> Reach | None:
        """The likeliest GPU share faster than both the one the boundary gives these knob values (`at`) and the
        incumbent's, where that share's peak, carried over to these knob values, may fit: measured there with other
        knob values, or never measured and these values free memory (Shares.carried_from); None where there is none. Its
        chance to beat the incumbent is the chance that the carried peak fits times the chance to beat it if it
        does. The boundary measures a share only where its prediction, or its carried peak, fits, so a smaller
        ubatch whose freed memory the model underrates re-fits to the share below and, as a prompt-only knob, moves
        last: on synthetic-908 at 8 GiB the fastest share measured 833 MiB over with ubatch 512, ubatch 128 freed
        926 at the share below as the 10th trial, and the faster share with it came 11th; as this move, 9th
        (benchmarks/results/search-efficiency.md)."""
        budget = self.ctx.budget_mib
        if not self.share or budget is None or not self.memory.models or at is None:
            return None
        here = self.configs.config(at)
        path = str(here.model)
        if path not in self.perf:
            return None
        speed = self.perf[path].score(here, self.weights)
        _, fit_at, _, over_at = self.shares.bounds(knobs, seen)
        best = None
        for c in self.shares.prefer_experts(self.shares.candidates(knobs)):
            if c.speed <= speed or not fit_at < c.mib < over_at:
                continue
            carried = self.shares.carried(c, knobs, seen)
            if carried is None:  # never measured: the incumbent's peak carried over, where these knobs free memory
                carried = self.shares.carried_from(c, knobs, incumbent, seen)
                if carried is None:
                    continue
            elif carried.mib <= budget:
                continue  # the boundary's own (it fits as carried)
            params = {**c.params, **knobs}
            if self._placed(params, incumbent) <= 0.0 or self.configs.same(params) in tried:
                continue  # no faster than the incumbent's own share: nothing for the risk to buy
            fits = chance_to_beat(budget - carried.mib, carried.sd)  # the peak's chance to land within the budget
            gain, sd = self._gain(params, incumbent, effects)
            chance = fits * chance_to_beat(gain, sd)
            if best is None or chance > best.chance:
                best = Reach(params, chance, fits * worth(gain, sd), gain, sd,
                             f" (reach: a faster share, predicted {c.mib:.0f} MiB, its peak carried over from trial "
                             f"{carried.trial}{' at another share' if carried.moved else ''}: "
                             f"{carried.mib:.0f} ± {carried.sd:.0f} of {budget:.0f}, {fits:.0%} to fit)")
        return best



    def _step_down(self, incumbent: Seen, base: dict[str, Any], tried: set[str]) -> tuple[dict[str, Any], str] | None:
        """The incumbent's knobs with the next GPU share below its own (the placement predicted fastest after
        the incumbent's, among those predicted to fit), and the share's change in words; None where it was
        measured. The boundary assumes the most weights on the GPU are the fastest; the share just below is
        measured where the model's ratio, with a process's luck in the incumbent's measurement (RESIDUAL_SD),
        leaves it a chance. On an H100 table of parts of layers (h100-35b-partial.csv) the boundary at 16 GiB, 7
        layers plus layer 33's gate and down in RAM, measured 101 tok/s with 16 threads, 8 whole layers 127: the
        shares there differ by 1-3% by their bytes, one process from another by about 10%. Without this move the
        search measured the boundary and its threads twin, then left the rest to TPE."""
        if not self.share or incumbent.config is None or str(incumbent.config.model) not in self.perf:
            return None
        own = self.perf[str(incumbent.config.model)].score(incumbent.config, self.weights)
        budget = self.ctx.budget_mib
        pool = self.shares.prefer_experts([c for c in self.shares.candidates(base)
                                           if budget is None or c.mib <= budget])
        below = [c for c in pool if c.speed < own]
        if not below:
            return None
        return self._share_move(max(below, key=lambda c: (c.speed, -c.mib)), incumbent, base, tried)

    def _step_up(self, incumbent: Seen, base: dict[str, Any], seen: list[Seen],
                 tried: set[str]) -> tuple[dict[str, Any], str] | None:
        """Where the incumbent sits below the boundary of its knob values (a step down beat it), its knobs with the
        next GPU share above its own and below the boundary's (predicted faster than its own, within the budget and
        under every share measured over), and the share's change in words; None where there is none or it was
        measured. A knob move from such an incumbent re-fits to the boundary or stays at the incumbent's share,
        and the shares between are left to chance: on the planted table of tests/search/test_partial_layer.py the
        boundary with 8 threads measured slower than the share below it, that share with 8 threads beat the
        incumbent, and the share between them with 8 threads, the best row, was no move."""
        at = self.shares.boundary_of(base, seen)
        budget = self.ctx.budget_mib
        path = str(incumbent.config.model) if incumbent.config is not None else ""
        if at is None or path not in self.perf:
            return None
        perf = self.perf[path]
        own = perf.score(incumbent.config, self.weights)
        top = perf.score(self.configs.config({**at.params, **base}), self.weights)
        _, _, _, over_at = self.shares.bounds(base, seen)
        between = [c for c in self.shares.prefer_experts(self.shares.candidates(base)) if own < c.speed < top
                   and c.mib < over_at and (budget is None or c.mib <= budget)]
        if not between:
            return None
        return self._share_move(min(between, key=lambda c: (c.speed, c.mib)), incumbent, base, tried)

    def _share_move(self, step: Candidate, incumbent: Seen, base: dict[str, Any],
                    tried: set[str]) -> tuple[dict[str, Any], str] | None:
        """The incumbent's knobs at another GPU share, and the share's change in words; None where it was
        measured."""
        params = {**step.params, **base}
        if self.configs.same(params) in tried:
            return None
        what = ", ".join(f"{k} {incumbent.params.get(k)} → {v}" for k, v in step.params.items()
                         if incumbent.params.get(k) != v)
        return params, what

    def _combinations(self, incumbent: Seen, seen: list[Seen], asked: list[dict], tried: set[str],
                      effects: KnobEffects) -> list[tuple[dict[str, Any], float, float, str]]:
        """Every combination of the knobs not measured yet, at its boundary, with the predicted log gain over the
        incumbent and its standard deviation; none where the space is too large to enumerate. `asked`: the
        parameters of every trial so far; `tried`: their keys (Configs.same)."""
        if not self.knobs or math.prod(len(self.values[k]) for k in self.knobs) > GRID_MAX:
            return []
        measured = {tuple(p.get(k) for k in self.knobs) for p in asked}  # at the boundary or anywhere else
        out = []
        for combo in itertools.product(*(self.values[k] for k in self.knobs)):
            if combo in measured:
                continue
            params, why = self._at_boundary(dict(zip(self.knobs, combo)), seen)
            if params is not None and self.configs.same(params) not in tried:
                out.append((params, *self._gain(params, incumbent, effects), why))
        return out

    def _at_boundary(self, knobs: dict[str, Any], seen: list[Seen]) -> tuple[dict[str, Any] | None, str]:
        """The knobs with their GPU share (None where no share is possible) and the boundary's reason. Knobs that
        use no memory (threads, …) do not move the boundary: one answer per proposal serves all their values.
        Without a GPU share to re-fit (a fixed placement, the host), knobs predicted over the budget by more than the
        memory model's measured typical error are no proposal: other knob values are."""
        if not self.share:
            pred, budget = self.configs.predict(self.configs.config(knobs)), self.ctx.budget_mib
            over = pred is not None and budget is not None and pred > budget + (self.shares.probe or 0.0)
            return (None, "") if over else (dict(knobs), "")
        at = self.shares.boundary_of(knobs, seen)
        return (None, "") if at is None else ({**at.params, **knobs}, f" ({at.reason})")


    def _gain(self, params: dict[str, Any], incumbent: Seen, effects: KnobEffects) -> tuple[float, float]:
        """Predicted log(score / incumbent's score) and its standard deviation: the performance model's ratio
        for the two placements times the knob effects' ratio."""
        mean, sd = effects.diff({k: params.get(k) for k in self.knobs}, {k: incumbent.params.get(k) for k in self.knobs})
        return self._placed(params, incumbent) + mean, sd

    def _placed(self, params: dict[str, Any], incumbent: Seen) -> float:
        """The performance model's log ratio of the two configurations' scores (0 where it has none)."""
        return 0.0 if incumbent.config is None else self._modelled(self.configs.config(params), incumbent.config)

    def _modelled(self, config: TrialConfig, other: TrialConfig) -> float:
        """The performance model's log ratio of two configurations' scores (0 where it has none)."""
        perf, ref = self.perf.get(str(config.model)), self.perf.get(str(other.model))
        if perf is None or ref is None:
            return 0.0
        return math.log(perf.score(config, self.weights)) - math.log(ref.score(other, self.weights))

    def _effects(self, seen: list[Seen]) -> KnobEffects:
        """The knob effects fitted to every measured configuration's score over the performance model's."""
        once = configurations(seen)
        known = [s.log_var for s in once if s.log_var is not None]
        default = statistics.median(known) if known else DEFAULT_LOG_SD ** 2
        observations = []
        for s in once:
            perf = self.perf.get(str(s.config.model))
            predicted = perf.score(s.config, self.weights) if perf is not None else 1.0
            observations.append(({k: s.params.get(k) for k in self.knobs}, math.log(s.evidence / predicted),
                                 s.log_var if s.log_var is not None else default))
        return KnobEffects({k: self.values[k] for k in self.knobs}).fit(observations)

    def _start(self, typical: dict[str, Any]) -> dict[str, Any]:
        """The typical knob values with the GPU splits whose fastest placement predicted to fit is fastest, the
        lightest on its fullest GPU among equals: the split that leaves the most room for weights on the GPUs (the
        splits are moves after that, since no model predicts their speed at equal bytes)."""
        splits = [k for k in GPU_SPLITS if k in self.knobs]
        if not splits or not self.perf:
            return typical
        budget = self.ctx.budget_mib

        def boundary(combo: dict[str, Any]) -> tuple[float, float]:
            fits = [c for c in self.shares.candidates({**typical, **combo}) if budget is None or c.mib <= budget]
            best = max(fits, key=lambda c: (c.speed, -c.mib), default=None)
            return (-math.inf, -math.inf) if best is None else (best.speed, -best.mib)

        combos = [dict(zip(splits, v)) for v in itertools.product(*(self.values[k] for k in splits))]
        return {**typical, **max(combos, key=boundary)}

    def _typical(self) -> dict[str, Any]:
        out = {}
        preferred = self.ctx.engine.preferred_values(self.ctx.side == "device")
        for knob in self.knobs:
            values = self.values[knob]
            if knob == "placement":
                out[knob] = next((p for p in PATTERN_PREFERENCE if p in values), values[0])
            elif knob in preferred and preferred[knob] in values:
                out[knob] = preferred[knob]
            elif knob == "model":
                out[knob] = values[0]
            else:
                usual = typical(self.campaign, knob)
                out[knob] = usual if usual in values else values[len(values) // 2]
        return out

    def _moves(self, knob: str, current: Any) -> list[Any]:
        """Every other value, nearest first (an ordered knob's neighbours, a quarter of the range before them on long
        axes): which one is measured is the model's call, its chance to beat the incumbent, not the move set's. With
        the neighbours only, 16 threads measured faster than 12 ended the moves along threads where 4 was the best
        (synthetic-335 at 8 GiB: the 22nd trial, now the 10th); a configuration no neighbour move improves, short of
        the best, was on 43 of 183 synthetic table-budgets, against 18 with every value a move
        (benchmarks/results/search-efficiency.md)."""
        values = self.values[knob]
        if current not in values or not numeric(values):
            return [v for v in values if v != current]
        ordered = sorted(values)
        i = ordered.index(current)
        steps = [max(1, len(ordered) // 4), 1] if len(ordered) > LONG_AXIS else [1]
        out = []
        for step in steps:
            out += [ordered[j] for j in (i + step, i - step) if 0 <= j < len(ordered) and ordered[j] not in out]
        return out + [v for j, v in sorted(enumerate(ordered), key=lambda jv: (abs(jv[0] - i), -jv[0]))
                      if j != i and v not in out]

    # -- the boundary ----------------------------------------------------------------------------------------











    # -- what the trials say ---------------------------------------------------------------------------------






    def _seen(self, records: list[TrialRecord]) -> list[Seen]:
        return seen_trials(records, self.ctx.budget_mib, self.ctx.side, self.campaign.objective_weights(), self.weights)

    def _calibrate(self, seen: list[Seen]) -> None:
        """Refit each model's performance model to the OK trials' medians (and pruned trials' first repetition),
        towards its priors."""
        by_path: dict[str, list[tuple[TrialConfig, float | None, float | None]]] = {}
        for s in configurations(seen):
            by_path.setdefault(str(s.config.model), []).append((s.config, s.tg, s.pp))
        for path, observations in by_path.items():
            if path in self.perf:
                self.perf[path].calibrate(observations)
