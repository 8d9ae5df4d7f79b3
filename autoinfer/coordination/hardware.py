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

from autoinfer.campaign.spec import Campaign
from autoinfer.engines.base import capabilities
from autoinfer.errors import UserError
from autoinfer.measure.gpu import GpuInfo, list_gpus
from autoinfer.measure.host import Fingerprint, fingerprint
from autoinfer.model.placement import FOLLOW_LAYERS, split_shares
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


def visible_gpus() -> list[GpuInfo]:
    """The GPUs this worker may use: all of them, or those CUDA_VISIBLE_DEVICES names (NVML indices or UUIDs).

    Workers started per GPU (`autoinfer worker --gpus`) also set CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's numbering
    and NVML's agree.
    """
    gpus = list_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    picked = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        match = [g for g in gpus if (item.isdigit() and g.index == int(item)) or (not item.isdigit() and
                                                                                  g.uuid.startswith(item))]
        picked += [g for g in match if g not in picked]
    return picked


def measured_gpus() -> tuple[int, ...]:
    """NVML indices of the GPUs whose memory a trial's peaks are read from: every one this worker sees."""
    return tuple(g.index for g in visible_gpus())


def split_choices(n_gpus: int) -> list[str]:
    """Tensor splits worth trying on n GPUs: equal, the first GPU heavier (it also holds the output and KV cache
    with split_mode row), the last one heavier."""
    equal = ["1"] * n_gpus
    return ["/".join(equal), "/".join(["2", *equal[1:]]), "/".join([*equal[:-1], "2"])]


def check_split_counts(campaign: Campaign, n_gpus: int) -> None:
    """A tensor or expert split names one share per GPU; a share for a GPU this worker does not see is an error
    now, not a failed load in every trial."""
    for name in ("tensor_split", "expert_split"):
        spec = campaign.space.get(name)
        for value in spec if isinstance(spec, list) else [spec] if isinstance(spec, str) else []:
            if value != FOLLOW_LAYERS and len(split_shares(value)) != n_gpus:
                raise UserError(f"space.{name}: {value!r} gives {len(split_shares(value))} GPU share(s) but this "
                                f"worker sees {n_gpus} GPU(s); give one share per GPU (CUDA_VISIBLE_DEVICES, --gpus)")


def check_vram_budget(campaign: Campaign, n_gpus: int | None = None) -> None:
    """A device-memory budget needs a device: on a machine without a GPU every trial would pass it unmeasured and
    the sweep would recommend a configuration as fitting a budget nothing checked."""
    limit = campaign.constraints.vram_mib
    if limit is None:
        return
    n_gpus = len(visible_gpus()) if n_gpus is None else n_gpus
    if n_gpus == 0:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
        raise UserError(f"constraints.vram_mib is {limit:g} MiB but this machine has no NVIDIA GPU that NVML "
                        f"sees{where}; remove constraints.vram_mib for a CPU campaign, or run it on a GPU machine")


def multi_gpu_space(campaign: Campaign, n_gpus: int | None = None) -> Campaign:
    """The campaign with llama.cpp's multi-GPU knobs searched when this worker sees more than one GPU and the
    campaign does not set them itself: tensor_split and, where the campaign places experts, expert_split (which
    GPU holds the experts left on the device). Every worker of a study is of one hardware class, so they all see
    the same GPU count and the same space.

    split_mode stays llama.cpp's default (layer) unless the campaign searches it: on two H200s with llama.cpp
    0c1e570, `-sm row` fails to load a qwen35moe model (no split buffers) and `-sm tensor` aborts, so adding them
    would only spend trials on failures (benchmarks/results/multi-gpu-h200x2.md)."""
    if not capabilities(campaign.engine).runs_llama_tools:  # nothing runs on this worker's GPUs
        return campaign
    n_gpus = len(visible_gpus()) if n_gpus is None else n_gpus
    check_split_counts(campaign, n_gpus)
    if n_gpus < 2:
        return campaign
    added: dict[str, Any] = {"tensor_split": split_choices(n_gpus)}
    if any(k in campaign.space for k in ("n_cpu_moe", "placement", "cpu_expert_layers")):
        added["expert_split"] = [FOLLOW_LAYERS, *split_choices(n_gpus)]
    return campaign.model_copy(update={"space": {**added, **campaign.space}})
