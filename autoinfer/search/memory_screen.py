"""The memory screen: a memory model per model file (autoinfer.model.memory) predicts each configuration's peak,
is recalibrated from the peaks of finished trials, and a configuration confidently over the budget is recorded as
predicted_infeasible instead of being run (never silently dropped: such records cost no measurement and do not
count against the budget). The fast configurations sit on the edge of the budget, where a blind sampler wastes its
trials on OOMs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autoinfer.engines.base import Measurement, Outcome, TrialConfig
from autoinfer.model.memory import MemoryModel, Prediction
from autoinfer.search.context import SearchContext
from autoinfer.store.records import MemoryCalibration
from autoinfer.store.trials import Store, write_trial


@dataclass
class MemoryScreen:
    ctx: SearchContext
    models: dict[str, MemoryModel] = field(default_factory=dict)  # by path; empty without a budget or a shape

    @classmethod
    def create(cls, ctx: SearchContext) -> "MemoryScreen":
        screen = cls(ctx)
        if ctx.side is not None:
            screen.models = {path: MemoryModel(shape, ctx.side, ctx.n_gpus) for path, shape in ctx.shapes.items()}
        return screen

    def predict(self, config: TrialConfig) -> Prediction | None:
        model = self.models.get(str(config.model))
        return model.predict(config) if model is not None else None

    def difference(self, config: TrialConfig, other: TrialConfig) -> tuple[float, float] | None:
        """Predicted peak of `config` minus `other`'s, with its standard deviation (None: no model for them)."""
        model = self.models.get(str(config.model))
        if model is None or str(other.model) != str(config.model):
            return None
        return model.difference(config, other)

    def skip(self, config: TrialConfig) -> Measurement | None:
        """A predicted_infeasible record when the configuration is confidently over the budget, else None."""
        search, budget = self.ctx.campaign.search, self.ctx.budget_mib
        pred = self.predict(config)
        if pred is None or not search.skip_predicted or budget is None or not pred.over(budget, search.z):
            return None
        reason = (f"predicted {pred.mib:.0f} ± {pred.std_mib:.0f} MiB of {self.ctx.side} memory, over the budget "
                  f"of {budget:.0f} MiB")
        return Measurement(Outcome.PREDICTED_INFEASIBLE, reason=reason,
                           metrics={"predicted_mib": pred.mib, "predicted_std_mib": pred.std_mib})

    def screen(self, trial: optuna.Trial, config: TrialConfig) -> Measurement | None:
        """Record the prediction on the trial; a predicted_infeasible measurement when it should not run."""
        pred = self.predict(config)
        if pred is not None:
            write_trial(trial, predicted_mib=round(pred.mib, 1), predicted_std_mib=round(pred.std_mib, 1))
        return self.skip(config)

    def calibrate(self, study: optuna.Study) -> None:
        """Refit each model's memory model to the peaks measured so far; store its error on the study."""
        if not self.models:
            return
        side, n_gpus = self.ctx.side, self.ctx.n_gpus
        by_model: dict[str, list[tuple[TrialConfig, Any]]] = {}
        study_store = Store(study)
        for t in study_store.records(states=(TrialState.COMPLETE, TrialState.PRUNED)):
            peak = t.rss_peak_mib if side == "host" else t.vram_per_gpu_mib if n_gpus > 1 else t.vram_peak_mib
            if peak and t.outcome in ("ok", "infeasible", "pruned") and t.config is not None and not t.stand_in:
                config = self.ctx.measured(t.trial_config)  # the peak is of the context the run created
                by_model.setdefault(str(config.model), []).append((config, peak))
        summary = {}
        for path, model in self.models.items():
            cal = model.calibrate(by_model.get(path, []))
            summary[Path(path).name] = MemoryCalibration(cal.n, cal.loo_rel_error, cal.noise_mib, side)
        study_store.write_study(memory_model=summary)
