"""The hardware class of a study: trials measured on different hardware are never ranked together.

The first worker that opens a study ties it to its machine's class (autoinfer.measure.host.fingerprint: GPU models
and memory, CPU model and usable cores, RAM size); a worker of another class is refused with the way out (its own
study). Every trial also records which host and class measured it, so `analyze` can still compare classes across
studies.

AUTOINFER_HARDWARE_CLASS replaces the measured fingerprint with a declared label. It exists to simulate a second
machine in tests, and to let a lab declare two machines equal on purpose; it is recorded as such on the study.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any, Mapping

import optuna

from autoinfer.errors import UserError
from autoinfer.measure.gpu import visible_gpus
from autoinfer.measure.host import Fingerprint, fingerprint
from autoinfer.store.records import HardwareClass, TrialHost
from autoinfer.store.trials import Store

OVERRIDE_ENV = "AUTOINFER_HARDWARE_CLASS"


def hardware_class() -> Fingerprint:
    """This worker's class (the GPUs it sees, not every GPU of the host), or the declared one when
    AUTOINFER_HARDWARE_CLASS is set."""
    declared = os.environ.get(OVERRIDE_ENV)
    return declared_class(declared) if declared else fingerprint(gpus=visible_gpus())


def declared_class(label: str) -> Fingerprint:
    """The class AUTOINFER_HARDWARE_CLASS=label declares."""
    return Fingerprint((("declared", label),), hashlib.sha256(label.encode()).hexdigest()[:12])


def describe(fields: Mapping[str, Any]) -> str:
    """One line: 'NVIDIA H100 80 GiB, AMD EPYC 9654 (16 cores), 128 GiB RAM'."""
    if "declared" in fields:
        return f"declared class {fields['declared']!r}"
    gpus = ", ".join(fields.get("gpus") or []) or "no GPU"
    return f"{gpus}; {fields.get('cpu_model')} ({fields.get('cpu_usable_cores')} cores); {fields.get('ram_gib')} GiB RAM"


def bind(study: optuna.Study, current: Fingerprint | None = None) -> Fingerprint:
    """Tie a new study to this machine's class, or refuse a machine whose class differs from the stored one."""
    current = current or hardware_class()
    study_store = Store(study)
    stored = study_store.study_record().hardware_class
    if stored is None:
        study_store.write_study(hardware_class=HardwareClass(current.digest, current.as_dict()))
        return current
    if stored.digest != current.digest:
        raise UserError(
            f"study {study.study_name!r} was measured on hardware class {stored.digest} "
            f"({describe(stored.fields)}); this machine is class {current.digest} ({describe(current.as_dict())}); "
            f"results of different hardware are never ranked together: join with your own study, e.g. "
            f"--study {study.study_name}-{current.digest}"
        )
    return current


def trial_host(current: Fingerprint) -> TrialHost:
    """What a trial records about the worker that measured it."""
    return TrialHost(socket.gethostname(), os.getpid(), current.digest, os.environ.get("CUDA_VISIBLE_DEVICES"))
