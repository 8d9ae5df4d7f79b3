"""What `status` shows about the search: the memory model's error, the informed start, why the last trials were
chosen, why the sweep ended, the Pareto front."""

from __future__ import annotations

import optuna

from autoinfer.search.pareto import front
from autoinfer.search.strategy import SAMPLED
from autoinfer.store.trials import Store

SHOWN_REASONS = 12  # the last trials whose choice `status` explains


def status_rows(study: optuna.Study) -> list[tuple[str, str]]:
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
    if kept.stopped:
        rows.append(("sweep stopped", kept.stopped))
    if kept.pareto_front is not None:
        for p in front(study):
            rows.append((f"pareto trial {p.trial.number}",
                         f"tg {p.tg:.2f}  pp {p.pp:.2f} tok/s  peak {p.mem_mib:.0f} MiB"))
    return rows
