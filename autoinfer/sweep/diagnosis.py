"""Why a study has no answer: when every trial failed, the most common failure and what fixes it.

A sweep whose trials all fail ends with exit status 3 (SWEEP_FAILED) and this diagnosis instead of a
recommendation; `export` (exit 2: nothing to export) and `analyze` print the same line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autoinfer.store.records import TrialRecord
from autoinfer.store.trials import Store

#: Exit status of `autoinfer sweep` when no trial succeeded (README: exit statuses).
SWEEP_FAILED = 3

_FIXES = {
    "SIGILL": "run `autoinfer build` to smoke-run the build again (when repacked weights crash it, as AMX kernels do "
              "on many VMs, it turns repack off or rebuilds without AMX), or add `repack: 0` to the campaign's space",
    "SIGSEGV": "llama.cpp crashed: see `autoinfer doctor` for the build's smoke run; try `repack: 0` in the space, "
               "or rebuild with `autoinfer build`",
    "SIGBUS": "the model file changed or became unreadable while it ran: re-create or re-download it",
    "SIGABRT": "llama.cpp stopped on a failed check: the assertion is in the trial's stderr "
               "(results/<study>/trials/<n>/stderr.txt)",
    "SIGKILL": "killed from outside, mostly by the kernel's OOM killer: allow less memory use (smaller model, "
               "batch or context) or raise the machine's memory",
    "oom": "the configurations do not fit in memory: lower n_gpu_layers, batch or context, or raise the budget",
    "infeasible": "every configuration is over the campaign's budget: raise constraints.*, search smaller settings or "
                  "shorten serve.context",
    "predicted_infeasible": "the memory model predicts none fits: raise constraints.vram_mib/ram_mib, allow "
                            "more layers on the CPU or shorten serve.context",
    "load_failed": "llama.cpp cannot load the model: check it with `autoinfer model info FILE` and re-create it",
    "rejected": "the engine refuses these settings: remove the combination named in the reason from the space",
    "timeout": "trials ran past measure.timeout_s: raise it or measure fewer tokens",
    "bad_output": "the engine printed nothing parsable: see the trial's stdout in results/<study>/trials/<n>/",
    "crash": "see the trial's stderr in results/<study>/trials/<n>/ and `autoinfer doctor`",
    "pruned": "every trial was cut short as hopeless: lower search.prune_below",
    "predicted_slower": "the search left out whole-layer offloads the performance model says lose to the best trial: "
                        "set search.informed false to measure every proposal",
}


@dataclass(frozen=True)
class Diagnosis:
    failed: int  # finished trials, all failed
    cause: str  # "crash (SIGILL)", "oom", …
    count: int  # trials with that cause
    example: str  # the reason one of them recorded
    fix: str

    def line(self) -> str:
        if self.failed == 1:
            return f"its only trial failed: {self.cause} ({self.example}); fix: {self.fix}"
        return (f"all {self.failed} trials failed; most common: {self.cause} in {self.count} of them "
                f"({self.example}); fix: {self.fix}")


def _cause(trial: TrialRecord) -> tuple[str, str]:
    """(cause shown, key of its fix): a crash is named by its signal, everything else by its outcome."""
    outcome = str(trial.outcome or "crash")
    signal = trial.metrics.get("signal")
    if signal:
        return f"{outcome} ({signal})", signal
    return outcome, outcome


def diagnose(study: optuna.Study) -> Diagnosis | None:
    """None while some trial succeeded or none finished; otherwise the most common failure and its fix."""
    finished = [t for t in Store(study).records(states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED))
                if (t.outcome or "repeat") != "repeat"]  # a repeat was answered from another trial
    if not finished or any(t.outcome == "ok" and t.state is TrialState.COMPLETE for t in finished):
        return None
    causes = Counter(_cause(t) for t in finished)
    (cause, key), count = causes.most_common(1)[0]
    example = next(t for t in finished if _cause(t) == (cause, key))
    reason = str(example.reason).strip() or "no reason recorded"
    fix = _FIXES.get(key, _FIXES["crash"]).replace("<study>", study.study_name)
    return Diagnosis(len(finished), cause, count, f"trial {example.number}: {_clip(reason)}", fix)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
