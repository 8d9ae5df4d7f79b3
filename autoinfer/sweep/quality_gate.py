"""Model-file quality in a sweep: KLD and perplexity per file as trial attributes, `max_kld` as a constraint.

Quality depends only on the file, so it is known before a trial runs: a file over `constraints.max_kld` is
recorded infeasible without being measured, and `objective: {tg: 1, kld: W}` multiplies a trial's score by
exp(-W·KLD).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import Measurement, Outcome, TrialConfig
from autoinfer.errors import UserError
from autoinfer.llama.quality import DEFAULT_CORPUS, Quality, QualitySettings, load_quality, measure_quality
from autoinfer.store.trials import write_trial


def _path(campaign: Campaign, value: str) -> Path:
    """Relative paths in a campaign file are relative to the file, like its model paths."""
    path = Path(value)
    if not path.is_absolute() and campaign.source and Path(campaign.source).is_file():
        path = Path(campaign.source).parent / path
    return path.resolve()


def settings_of(campaign: Campaign) -> QualitySettings:
    q = campaign.quality
    return QualitySettings(corpus=_path(campaign, q.corpus) if q.corpus else DEFAULT_CORPUS, ctx=q.ctx,
                           chunks=q.chunks)


def prepare(campaign: Campaign, models: dict[str, str]) -> dict[str, Quality]:
    """Quality per model file. Measured (cached per file) when the campaign constrains or weighs KLD; otherwise
    whatever earlier measurements stored, so the trials still carry it."""
    files = sorted(set(models.values()))
    needed = campaign.constraints.max_kld is not None or "kld" in campaign.objective_weights()
    if not needed:
        return {f: q for f in files if Path(f).is_file() and (q := load_quality(Path(f))) is not None}
    reference = campaign.quality.reference
    if len(files) < 2 and reference is None:
        raise UserError("constraints.max_kld and objective kld compare model files: list the quantization ladder "
                        "under model: (see `autoinfer model quantize`) or set quality.reference")
    measured = measure_quality([Path(f) for f in files], settings_of(campaign),
                               reference=_path(campaign, reference) if reference else None)
    return {str(path): q for path, q in measured.items()}


def annotate(trial: optuna.Trial, config: TrialConfig, qualities: dict[str, Quality],
             campaign: Campaign) -> Measurement | None:
    """Set the trial's kld/ppl attributes and its `kld` constraint; a Measurement when the file is over max_kld."""
    quality = qualities.get(str(config.model))
    if quality is None:
        return None
    write_trial(trial, kld=quality.kld, ppl=quality.ppl, kld_reference=quality.reference)
    limit = campaign.constraints.max_kld
    if limit is None:
        return None
    trial.set_constraint("kld", quality.kld - limit)
    if quality.kld <= limit:
        return None
    return Measurement(Outcome.INFEASIBLE, reason=f"KLD {quality.kld:.4g} of {Path(config.model).name} is over "
                                                  f"constraints.max_kld {limit:g}; not measured")
