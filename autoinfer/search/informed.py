"""The informed start: a new study begins with the largest placement predicted to fit (memory screen), its
neighbours, and llama-fit-params' own answer for the same budget as a labelled baseline; then the campaign's
sampler takes over. The default strategy (search/boundary.py) replaced it; `autoinfer replay` keeps it as a
baseline, and a campaign with `search.informed: false` gets its screening without the informed trials."""

from __future__ import annotations

import itertools
from typing import Any

import optuna

from autoinfer.engines.base import Measurement, TrialConfig
from autoinfer.model.placement import GPU_SPLITS, PLACEMENT_KEYS, cpu_expert_layers, realize
from autoinfer.search.context import SearchContext, allowed, typical
from autoinfer.search.fit_baseline import fit_label, fit_params_trial
from autoinfer.search.memory_screen import MemoryScreen
from autoinfer.search.strategy import learn
from autoinfer.store.trials import Store

PLACEMENT_PARAMS = ("n_gpu_layers", "n_cpu_moe", *PLACEMENT_KEYS)


class InformedStart:
    """Strategy object (autoinfer.search.strategy.Strategy) for one sweep."""

    name = "informed"

    def __init__(self, ctx: SearchContext, memory: MemoryScreen, dists: dict[str, Any]) -> None:
        self.ctx = ctx
        self.memory = memory
        self.dists = dists

    def start(self, study: optuna.Study) -> None:
        self.enqueue(study, self.dists)
        learn(self.memory, self.ctx.campaign, study)

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        return self.memory.screen(trial, config)

    def observe(self, study: optuna.Study) -> None:
        learn(self.memory, self.ctx.campaign, study)

    # -- the informed trials --------------------------------------------------------------------------------
    def enqueue(self, study: optuna.Study, searched: dict[str, Any]) -> int:
        """Queue the informed trials on a new study; returns how many. Notes say why fewer were possible."""
        study_store = Store(study)
        if not self.ctx.campaign.search.informed or study.get_trials(deepcopy=False):
            return 0
        if self.ctx.budget_mib is None or not self.memory.models:
            self.ctx.notes.append("no memory budget or no memory model: the search starts without informed trials")
            study_store.write_study(search_notes=tuple(self.ctx.notes))
            return 0
        model_name = next(iter(self.ctx.models))
        path = self.ctx.models[model_name]
        queued: list[tuple[dict[str, Any], str, dict[str, Any]]] = []  # parameters, label, llama-fit-params' fields
        plans = self.placements(path, model_name, searched)
        if plans:
            first, *rest = plans
            queued.append((first, "informed: largest placement predicted to fit", {}))
            queued += [(p, "informed: neighbour", {}) for p in rest[: self.ctx.campaign.search.neighbours]]
        else:
            self.ctx.notes.append(f"no placement in the space is predicted to fit in {self.ctx.budget_mib:.0f} MiB")
        if self.ctx.campaign.search.fit_params and self.ctx.side == "device":
            answer = fit_params_trial(self.ctx, path, searched, self._typical_params(searched, model_name),
                                      self.ctx.budget_mib)
            if isinstance(answer, str):
                self.ctx.notes.append(answer)
            else:
                queued.insert(1, (answer[0], fit_label(self.ctx, self.ctx.budget_mib), answer[1]))
        for params, label, fields in queued:
            study_store.enqueue(params, skip_if_exists=True, label=label, **fields)
        study_store.write_study(search_notes=tuple(self.ctx.notes))
        return len(queued)

    def placements(self, path: str, model_name: str, searched: dict[str, Any]) -> list[dict[str, Any]]:
        """Searched-parameter sets: the placement with the most weight bytes on the device that is predicted to
        fit (prediction + 1 std), then its neighbours (one or two expert layers either way, other patterns),
        ordered by how close they are. On several GPUs each placement takes the tensor and expert split that
        leave its fullest GPU emptiest."""
        model = self.memory.models[path]
        shape = self.ctx.shapes[path]
        base = self._typical_params(searched, model_name)
        ngl_values = sorted({min(v, shape.n_layers + 1) for v in allowed(self.ctx.campaign, "n_gpu_layers") or [99]},
                            reverse=True)
        combos = self._expert_combos(shape.n_layers)

        def params_of(ngl: int, combo: dict[str, Any]) -> dict[str, Any]:
            out = dict(base)
            if "n_gpu_layers" in searched:
                out["n_gpu_layers"] = next(v for v in allowed(self.ctx.campaign, "n_gpu_layers")
                                           if min(v, shape.n_layers + 1) == ngl)
            out.update({k: v for k, v in combo.items() if k in searched})
            return out

        def config_of(params: dict[str, Any]) -> TrialConfig:
            merged = {**self.ctx.campaign.fixed(), **params, "model": path}
            return realize(self.ctx.engine.as_run(TrialConfig.from_params(merged)), shape.n_layers)

        splits = [n for n in GPU_SPLITS if n in searched]
        variants = [dict(zip(splits, v)) for v in itertools.product(*(allowed(self.ctx.campaign, n) for n in splits))]
        for ngl in ngl_values:
            scored = []
            for size, combo in combos:  # on several GPUs, with the splits that leave the fullest GPU emptiest
                candidates = [params_of(ngl, {**combo, **v}) for v in variants]
                pred, params = min(((model.predict(config_of(p)), p) for p in candidates), key=lambda c: c[0].mib)
                scored.append((size, pred, params))
            fitting = [s for s in scored if s[1].mib + s[1].std_mib <= self.ctx.budget_mib]
            if not fitting:
                continue
            best_size = min(s[0] for s in fitting)
            primary = next(s for s in fitting if s[0] == best_size)
            near = sorted((s for s in scored if s is not primary and abs(s[0] - best_size) <= 2
                           and not s[1].over(self.ctx.budget_mib, self.ctx.campaign.search.z)),
                          key=lambda s: (abs(s[0] - best_size), s[0]))
            return [primary[2], *(s[2] for s in near)]
        return []

    def _typical_params(self, searched: dict[str, Any], model_name: str) -> dict[str, Any]:
        """The searched non-placement parameters of an informed or baseline trial."""
        params = {name: typical(self.ctx.campaign, name) for name in searched if name not in PLACEMENT_PARAMS}
        if "model" in searched:
            params["model"] = model_name
        for name, value in self.ctx.engine.preferred_values(self.ctx.side == "device").items():
            if name in searched and value in allowed(self.ctx.campaign, name):
                params[name] = value
        return params

    def _expert_combos(self, n_layers: int) -> list[tuple[int, dict[str, Any]]]:
        """(number of layers with experts in RAM, knob values) for every distinct expert placement in the space, in
        whole layers (partial_experts at its least: this fixed start moves a layer at a time)."""
        knobs = {name: allowed(self.ctx.campaign, name) or [None] for name in ("n_cpu_moe", "placement", "cpu_expert_layers")}
        partial = allowed(self.ctx.campaign, "partial_experts")
        seen: dict[frozenset[int], tuple[int, dict[str, Any]]] = {}
        for ncmoe, pattern, count in itertools.product(*knobs.values()):
            layers = set(range(min(ncmoe or 0, n_layers)))
            if count is not None:
                layers |= set(cpu_expert_layers(pattern or "first", count, n_layers))
            combo = {k: v for k, v in zip(knobs, (ncmoe, pattern, count)) if v is not None}
            if partial:
                combo["partial_experts"] = min(partial)
            seen.setdefault(frozenset(layers), (len(layers), combo))
        return sorted(seen.values(), key=lambda s: s[0])
