"""A search that knows the model and the memory budget.

- Placement parameters (`placement`, `cpu_expert_layers`) become tensor overrides for engines that run llama.cpp.
- A memory model (autoinfer.model.placement) predicts each configuration's peak; it is recalibrated from the peaks
  of finished trials, and a configuration confidently over the budget is recorded as predicted_infeasible instead
  of being run (never silently dropped; those records cost no measurement and do not count against the budget).
- A new study starts with informed trials: the largest placement predicted to fit, its neighbours, and
  llama-fit-params' own answer for the same budget as a labelled baseline.
- A trial whose first repetition is far below the best so far is cut short (recorded as pruned).

The fast configurations sit on the edge of the budget, where a blind sampler wastes its trials on OOMs.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autoinfer.campaign.spec import Campaign, FloatRange, IntRange
from autoinfer.engines.base import Engine, Measurement, Outcome, TrialConfig
from autoinfer.errors import UserError
from autoinfer.measure.gpu import measured_gpus
from autoinfer.model.memory import MemoryModel, Prediction
from autoinfer.model.placement import (
    FOLLOW_LAYERS,
    PLACEMENT_KEYS,
    cpu_expert_layers,
    layers_on_cpu,
    parse_overrides,
    realize,
)
from autoinfer.model.shape import ModelShape
from autoinfer.store.records import MemoryCalibration
from autoinfer.store.trials import Store, record_of, write_trial

SHOWN_REASONS = 12  # the last trials whose choice `status` explains
SAMPLED = "sampler:"  # the reason of a trial the strategy left to the campaign's sampler
#: Keys of an informed trial's parameters that are llama-fit-params' own answer, recorded on the trial (TrialRecord)
FIT_KEYS = ("fit_override_tensors", "fit_tensor_split")
PLACEMENT_PARAMS = ("n_gpu_layers", "n_cpu_moe", *PLACEMENT_KEYS)


def _allowed(campaign: Campaign, name: str) -> list[Any] | None:
    """Every value a parameter may take in the campaign (None: not in the space)."""
    spec = campaign.space.get(name)
    if spec is None:
        return None
    if isinstance(spec, IntRange):
        return list(range(spec.low, spec.high + 1, spec.step))
    if isinstance(spec, FloatRange):
        return [spec.low, (spec.low + spec.high) / 2, spec.high]
    return list(spec) if isinstance(spec, list) else [spec]


def _typical(campaign: Campaign, name: str) -> Any:
    """The value an informed trial uses for a non-placement parameter: llama.cpp's default if allowed, else the
    middle value."""
    values = _allowed(campaign, name) or []
    default = TrialConfig.__dataclass_fields__.get(name)
    if default is not None and default.default in values:
        return default.default
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)[len(values) // 2]
    return values[0]


@dataclass
class SearchAid:
    """The campaign-side helpers the loop calls; one per sweep."""

    campaign: Campaign
    engine: Engine
    models: dict[str, str]
    shapes: dict[str, ModelShape] = field(default_factory=dict)
    memory: dict[str, MemoryModel] = field(default_factory=dict)
    side: str | None = None  # "device" (vram_mib budget) or "host" (ram_mib budget); None: no budget
    budget_mib: float | None = None  # per GPU on several GPUs
    n_gpus: int = 1  # GPUs this worker measures; the memory model predicts each one's peak
    notes: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, campaign: Campaign, engine: Engine, models: dict[str, str]) -> "SearchAid":
        aid = cls(campaign, engine, models)
        c = campaign.constraints
        aid.side, aid.budget_mib = ("device", c.vram_mib) if c.vram_mib else ("host", c.ram_mib) if c.ram_mib \
            else (None, None)
        aid.n_gpus = engine.n_gpus or max(len(measured_gpus()), 1)
        if aid.side == "device" and aid.n_gpus > 1:
            aid.notes.append(f"{aid.n_gpus} GPUs: the memory model predicts each GPU's peak against "
                             f"{c.vram_mib:.0f} MiB (layers shared by tensor_split, experts by expert_split)")
        needs_shape = aid.side is not None or any(k in campaign.space for k in PLACEMENT_KEYS)
        for path in dict.fromkeys(models.values()):
            shape = aid._shape(path) if needs_shape else None
            if shape is not None:
                aid.shapes[path] = shape
                if aid.side is not None:
                    aid.memory[path] = MemoryModel(shape, aid.side, aid.n_gpus)
        return aid

    def _shape(self, path: str) -> ModelShape | None:
        shape = self.engine.model_shape(path)
        if shape is None:
            self.notes.append(f"no model shape for {Path(path).name} (a replay table without its .shape.json): no "
                              "memory model, placements not translated")
        return shape

    # -- per trial ------------------------------------------------------------------------------------------
    def realize(self, config: TrialConfig, trial: optuna.Trial) -> TrialConfig:
        """Placement parameters → tensor overrides (for engines that do not take them as such); a
        llama-fit-params baseline gets its own overrides and tensor split."""
        asked = record_of(trial)
        split = asked.fit_tensor_split
        if split is not None:
            kept = tuple((k, v) for k, v in config.extra if k != "tensor_split")
            config = config.with_(extra=(*kept, ("tensor_split", split)))
        fit = asked.fit_override_tensors
        if fit is not None:
            extra = tuple((k, v) for k, v in config.extra if k not in PLACEMENT_KEYS)
            return config.with_(override_tensors=tuple(fit), extra=extra)
        if "placement" in self.engine.knobs or "cpu_expert_layers" in self.engine.knobs:
            return config
        shape = self.shapes.get(str(config.model))
        if shape is None:
            if config.get("placement") is not None or config.get("cpu_expert_layers") is not None:
                raise UserError(f"placement parameters need the model's layer count; cannot read {config.model}")
            return config
        return realize(config, shape.n_layers)

    def predict(self, config: TrialConfig) -> Prediction | None:
        model = self.memory.get(str(config.model))
        return model.predict(config) if model is not None else None

    def skip(self, config: TrialConfig) -> Measurement | None:
        """A predicted_infeasible record when the configuration is confidently over the budget, else None."""
        pred = self.predict(config)
        if pred is None or not self.campaign.search.skip_predicted or self.budget_mib is None:
            return None
        if not pred.over(self.budget_mib, self.campaign.search.z):
            return None
        reason = (f"predicted {pred.mib:.0f} ± {pred.std_mib:.0f} MiB of {self.side} memory, over the budget of "
                  f"{self.budget_mib:.0f} MiB")
        return Measurement(Outcome.PREDICTED_INFEASIBLE, reason=reason,
                           metrics={"predicted_mib": pred.mib, "predicted_std_mib": pred.std_mib})

    def before_run(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        """Record the prediction on the trial; a predicted_infeasible measurement when it should not run."""
        pred = self.predict(config)
        if pred is not None:
            write_trial(trial, predicted_mib=round(pred.mib, 1), predicted_std_mib=round(pred.std_mib, 1))
        return self.skip(config)

    def after_run(self, study: optuna.Study) -> None:
        """Recalibrate the memory model; keep the Pareto front on the study in multi-objective mode."""
        self.calibrate(study)
        if self.campaign.objective == "pareto":
            from autoinfer.search.pareto import remember

            remember(study)

    @staticmethod
    def max_skips(trial_budget: int) -> int:
        """Consecutive predicted_infeasible records after which the sweep stops: the space barely fits."""
        return max(50, 10 * trial_budget)

    def calibrate(self, study: optuna.Study) -> None:
        """Refit each model's memory model to the peaks measured so far; store its error on the study."""
        if not self.memory:
            return
        by_model: dict[str, list[tuple[TrialConfig, Any]]] = {}
        study_store = Store(study)
        for t in study_store.records(states=(TrialState.COMPLETE, TrialState.PRUNED)):
            peak = t.rss_peak_mib if self.side == "host" else \
                t.vram_per_gpu_mib if self.n_gpus > 1 else t.vram_peak_mib
            if peak and t.outcome in ("ok", "infeasible", "pruned") and t.config is not None:
                config = t.trial_config
                by_model.setdefault(str(config.model), []).append((config, peak))
        summary = {}
        for path, model in self.memory.items():
            cal = model.calibrate(by_model.get(path, []))
            summary[Path(path).name] = MemoryCalibration(cal.n, cal.loo_rel_error, cal.noise_mib, self.side)
        study_store.write_study(memory_model=summary)

    def pruner(self, study: optuna.Study, config: TrialConfig) -> Callable[[float], bool] | None:
        """A rule for the engine's first repetition: cut it when below prune_below × the best median so far."""
        below = self.campaign.search.prune_below
        kind = "tg" if config.n_gen else "pp"
        if below is None or kind not in self.campaign.objective_weights():
            return None
        medians = [statistics.median(t.samples(kind)) for t in Store(study).records(states=(TrialState.COMPLETE,))
                   if t.is_feasible_ok and t.samples(kind)]
        if not medians:
            return None
        threshold = below * max(medians)
        return lambda first: first < threshold

    # -- informed start -------------------------------------------------------------------------------------
    def enqueue_start(self, study: optuna.Study, searched: dict[str, Any]) -> int:
        """Queue the informed trials on a new study; returns how many. Notes say why fewer were possible."""
        study_store = Store(study)
        if not self.campaign.search.informed or study.get_trials(deepcopy=False):
            return 0
        if self.budget_mib is None or not self.memory:
            self.notes.append("no memory budget or no memory model: the search starts without informed trials")
            study_store.write_study(search_notes=tuple(self.notes))
            return 0
        model_name = next(iter(self.models))
        path = self.models[model_name]
        queued = []
        plans = self.placements(path, model_name, searched)
        if plans:
            first, *rest = plans
            queued.append((first, "informed: largest placement predicted to fit"))
            queued += [(p, "informed: neighbour") for p in rest[: self.campaign.search.neighbours]]
        else:
            self.notes.append(f"no placement in the space is predicted to fit in {self.budget_mib:.0f} MiB")
        baseline = self.fit_params_trial(path, model_name, searched) if self.campaign.search.fit_params else None
        if baseline is not None:
            queued.insert(1, baseline)
        for params, label in queued:
            fit = {key: params.pop(key) for key in FIT_KEYS if key in params}
            study_store.enqueue(params, skip_if_exists=True, label=label, **fit)
        study_store.write_study(search_notes=tuple(self.notes))
        return len(queued)

    def placements(self, path: str, model_name: str, searched: dict[str, Any]) -> list[dict[str, Any]]:
        """Searched-parameter sets: the placement with the most weight bytes on the device that is predicted to
        fit (prediction + 1 std), then its neighbours (one or two expert layers either way, other patterns),
        ordered by how close they are. On several GPUs each placement takes the tensor and expert split that
        leave its fullest GPU emptiest."""
        model = self.memory[path]
        shape = self.shapes[path]
        base = self._typical_params(searched, model_name)
        ngl_values = sorted({min(v, shape.n_layers + 1) for v in _allowed(self.campaign, "n_gpu_layers") or [99]},
                            reverse=True)
        combos = self._expert_combos(shape.n_layers)

        def params_of(ngl: int, combo: dict[str, Any]) -> dict[str, Any]:
            out = dict(base)
            if "n_gpu_layers" in searched:
                out["n_gpu_layers"] = next(v for v in _allowed(self.campaign, "n_gpu_layers")
                                           if min(v, shape.n_layers + 1) == ngl)
            out.update({k: v for k, v in combo.items() if k in searched})
            return out

        def config_of(params: dict[str, Any]) -> TrialConfig:
            merged = {**self.campaign.fixed(), **params, "model": path}
            return realize(TrialConfig.from_params(merged), shape.n_layers)

        splits = [n for n in ("tensor_split", "expert_split") if n in searched]
        variants = [dict(zip(splits, v)) for v in itertools.product(*(_allowed(self.campaign, n) for n in splits))]
        for ngl in ngl_values:
            scored = []
            for size, combo in combos:  # on several GPUs, with the splits that leave the fullest GPU emptiest
                candidates = [params_of(ngl, {**combo, **v}) for v in variants]
                pred, params = min(((model.predict(config_of(p)), p) for p in candidates), key=lambda c: c[0].mib)
                scored.append((size, pred, params))
            fitting = [s for s in scored if s[1].mib + s[1].std_mib <= self.budget_mib]
            if not fitting:
                continue
            best_size = min(s[0] for s in fitting)
            primary = next(s for s in fitting if s[0] == best_size)
            near = sorted((s for s in scored if s is not primary and abs(s[0] - best_size) <= 2
                           and not s[1].over(self.budget_mib, self.campaign.search.z)),
                          key=lambda s: (abs(s[0] - best_size), s[0]))
            return [primary[2], *(s[2] for s in near)]
        return []

    def _typical_params(self, searched: dict[str, Any], model_name: str) -> dict[str, Any]:
        """The searched non-placement parameters of an informed or baseline trial."""
        params = {name: _typical(self.campaign, name) for name in searched if name not in PLACEMENT_PARAMS}
        if "model" in searched:
            params["model"] = model_name
        for name, value in self.engine.preferred_values(self.side == "device").items():
            if name in searched and value in _allowed(self.campaign, name):
                params[name] = value
        return params

    def _expert_combos(self, n_layers: int) -> list[tuple[int, dict[str, Any]]]:
        """(number of layers with experts in RAM, knob values) for every distinct expert placement in the space."""
        knobs = {name: _allowed(self.campaign, name) or [None] for name in ("n_cpu_moe", "placement", "cpu_expert_layers")}
        seen: dict[frozenset[int], tuple[int, dict[str, Any]]] = {}
        for ncmoe, pattern, count in itertools.product(*knobs.values()):
            layers = set(range(min(ncmoe or 0, n_layers)))
            if count is not None:
                layers |= set(cpu_expert_layers(pattern or "first", count, n_layers))
            combo = {k: v for k, v in zip(knobs, (ncmoe, pattern, count)) if v is not None}
            seen.setdefault(frozenset(layers), (len(layers), combo))
        return sorted(seen.values(), key=lambda s: s[0])

    def fit_params_trial(self, path: str, model_name: str,
                         searched: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
        """llama-fit-params' placement for the same budget, as searched parameters (or raw overrides)."""
        if self.side != "device":
            return None
        fixed, m = self.campaign.fixed(), self.campaign.measure
        answer = self.engine.baseline(Path(path), self.campaign.constraints.vram_mib, m.n_prompt + m.n_gen,
                                      fixed.get("batch", 2048), fixed.get("ubatch", 512))
        if isinstance(answer, str):
            self.notes.append(answer)
            return None
        ngl, patterns, split = answer.n_gpu_layers, answer.override_tensors, answer.tensor_split
        self.notes.append(f"llama-fit-params: {answer.how} → -ngl {ngl}, {len(patterns)} override(s)"
                          + (f", -ts {split}" if split else ""))
        shape = self.shapes[path]
        layers = layers_on_cpu(patterns, shape.tensor_names)
        params = self._typical_params(searched, model_name)
        if "n_gpu_layers" in searched:
            params["n_gpu_layers"] = ngl if ngl in (_allowed(self.campaign, "n_gpu_layers") or []) else max(
                _allowed(self.campaign, "n_gpu_layers"))
        last = cpu_expert_layers("last", len(layers), shape.n_layers)
        only_cpu = all(r.device is None for r in parse_overrides(patterns))  # no per-GPU overrides
        if only_cpu and set(last) == set(layers) and "last" in (_allowed(self.campaign, "placement") or []) \
                and len(layers) in (_allowed(self.campaign, "cpu_expert_layers") or []):
            params.update({k: v for k, v in (("placement", "last"), ("cpu_expert_layers", len(layers))) if k in searched})
        else:
            for name in ("n_cpu_moe", "cpu_expert_layers"):
                if name in searched:
                    params[name] = min(_allowed(self.campaign, name))
            if "placement" in searched:
                params["placement"] = _allowed(self.campaign, "placement")[0]
            params["fit_override_tensors"] = tuple(patterns)
        if FOLLOW_LAYERS in (_allowed(self.campaign, "expert_split") or []):  # as llama-fit-params placed them
            params["expert_split"] = FOLLOW_LAYERS
        if split is not None:
            if "tensor_split" in searched:
                params["tensor_split"] = _allowed(self.campaign, "tensor_split")[0]
            params["fit_tensor_split"] = split
        per_gpu = f" per GPU on {self.n_gpus} GPUs" if self.n_gpus > 1 else ""
        return params, f"baseline: llama-fit-params for {self.campaign.constraints.vram_mib:.0f} MiB{per_gpu}"


def status_rows(study: optuna.Study) -> list[tuple[str, str]]:
    """What `status` shows about the search: the memory model's error, the informed start, why the last trials
    were chosen, the Pareto front."""
    from autoinfer.search.pareto import front

    study_store = Store(study)
    kept = study_store.study_record()
    trials = study_store.records()
    rows = []
    for name, cal in kept.memory_model.items():
        err = cal.loo_median_rel_error
        rows.append(("memory model", f"{name} ({cal.side}): calibrated on {cal.trials} trials, "
                     + (f"leave-one-out median error {100 * err:.1f}%" if err is not None else "error not known yet")))
    for t in [t for t in trials if t.label]:
        rows.append((f"  trial {t.number}", f"{t.label} → {t.status}"))
    for note in kept.search_notes:
        rows.append(("search note", note))
    chosen = [t for t in trials if t.search_reason and t.is_finished]
    sampled = [t for t in chosen if t.search_reason.startswith(SAMPLED)]
    for t in [t for t in chosen if t not in sampled][-SHOWN_REASONS:]:
        rows.append((f"  search trial {t.number}", f"{t.search_reason} → {t.status}"))
    if sampled:
        rows.append(("  sampled", f"{len(sampled)} trial(s) chosen by the sampler once the strategy had no move left "
                                  f"(trials {sampled[0].number}–{sampled[-1].number})"))
    if kept.pareto_front is not None:
        for p in front(study):
            rows.append((f"pareto trial {p.trial.number}",
                         f"tg {p.tg:.2f}  pp {p.pp:.2f} tok/s  peak {p.mem_mib:.0f} MiB"))
    return rows
