"""The reference engine as one object: load a GGUF, place weights and experts, prefill (with snapshots), decode."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from autoinfer.errors import UserError
from autoinfer.model.arch import Architecture
from autoinfer.refengine.cache.experts import ExpertCache, ResidentExperts, host_banks
from autoinfer.refengine.cache.snapshots import SnapshotCache
from autoinfer.refengine.loader import ModelWeights, load, torch_dtype
from autoinfer.refengine.model import Qwen35Moe
from autoinfer.refengine.ops import gdn as gdn_ops
from autoinfer.refengine.ops import moe as moe_ops
from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.ops.quant.kernels import check_device
from autoinfer.refengine.state import SequenceState

DEVICES = ("cpu", "cuda")
WEIGHTS = ("dense", "gguf")  # dense: decoded to `dtype` at load; gguf: Q8_0/Q4_K/Q6_K matrices stay in their blocks


@dataclass(frozen=True)
class EngineOptions:
    """The knobs a sweep searches. expert_slots = 0 keeps every expert on the device. weights="gguf" keeps the
    quantized matrices in their GGUF blocks (Triton kernels read them); dtype is then the activations' dtype."""

    device: str = "cpu"
    dtype: str = "fp32"
    weights: str = "dense"
    gdn: str = "chunk"
    moe: str = "grouped"
    prefill_chunk: int = 64
    torch_threads: int | None = None
    expert_slots: int = 0
    cache_policy: str = "lru"
    prefetch: bool = False
    snapshots: bool = False

    def check(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError("device 'cuda' asked for, but this torch sees no CUDA GPU; use device: cpu")
        torch_dtype(self.dtype)
        gdn_ops.get(self.gdn)
        moe_ops.get(self.moe)
        if self.weights not in WEIGHTS:
            raise UserError(f"weights {self.weights!r} is not one of {', '.join(WEIGHTS)}")
        if self.weights == "gguf" or self.gdn in gdn_ops.TRITON or self.moe in moe_ops.READS_BLOCKS:
            check_device(self.device)
        if self.moe in moe_ops.READS_BLOCKS and self.weights != "gguf":
            raise UserError(f"moe variant {self.moe!r} reads experts kept in GGUF blocks: set weights: gguf "
                            "(or use moe: grouped with dense weights)")
        if self.prefill_chunk < 1:
            raise UserError(f"prefill_chunk must be ≥ 1 (got {self.prefill_chunk})")
        if self.expert_slots < 0:
            raise UserError(f"expert_slots must be ≥ 0 (got {self.expert_slots}); 0 keeps all experts resident")


def expert_bytes(cfg: Architecture, dtype: str) -> int:
    """Bytes of one routed expert (gate + up + down) in the compute dtype."""
    return 3 * cfg.hidden * cfg.expert_ffn * torch.tensor([], dtype=torch_dtype(dtype)).element_size()


def non_expert_bytes(cfg: Architecture, dtype: str) -> int:
    """Device bytes of everything but the routed experts, from the shapes (norms and routers are fp32)."""
    elt = torch.tensor([], dtype=torch_dtype(dtype)).element_size()
    E, D = cfg.hidden, cfg.head_dim
    attention = (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * D * E + cfg.n_heads * D * E
    gdn = (cfg.conv_dim + 2 * cfg.gdn_value_dim + 2 * cfg.gdn_v_heads) * E
    matrices = 2 * cfg.vocab * E + sum((attention if cfg.is_attention(i) else gdn) + 3 * cfg.shared_ffn * E
                                       for i in range(cfg.n_layers))
    small = E + cfg.n_layers * (3 * E + cfg.n_experts * E) + sum(  # fp32: norms, shared gate, routers, conv, decay
        2 * D if cfg.is_attention(i) else cfg.conv_dim * cfg.conv_kernel + 2 * cfg.gdn_v_heads + cfg.gdn_head_dim
        for i in range(cfg.n_layers))
    return matrices * elt + small * 4


def slots_for_budget(cfg: Architecture, dtype: str, budget_mib: float) -> int:
    """How many expert slots fit in a device budget after the non-expert weights; 0 if all experts fit."""
    other_bytes = non_expert_bytes(cfg, dtype)
    free = budget_mib * 2**20 - other_bytes
    each = expert_bytes(cfg, dtype)
    if free >= each * cfg.n_experts * cfg.n_layers:
        return 0
    slots = int(free // each)
    if slots < cfg.n_experts_used:
        raise UserError(f"a device budget of {budget_mib:.0f} MiB leaves room for {max(slots, 0)} experts after "
                        f"{other_bytes / 2**20:.0f} MiB of other weights; the model needs ≥ {cfg.n_experts_used}")
    return slots


class ReferenceEngine:
    def __init__(self, cfg: Architecture, weights: ModelWeights, options: EngineOptions):
        options.check()
        if options.torch_threads:
            torch.set_num_threads(options.torch_threads)
        self.cfg, self.options = cfg, options
        device = torch.device(options.device)
        banks = [ExpertBank(layer.moe.gate, layer.moe.up, layer.moe.down) for layer in weights.layers]
        # Everything but the routed experts goes to the device now; the experts are placed below.
        on_device = weights.map(lambda name, t: t if _is_routed_expert(name) else t.to(device))
        self.other_bytes = sum(t.numel() * t.element_size() for name, t in _tensors(on_device)
                               if not _is_routed_expert(name))
        if options.expert_slots and options.expert_slots < cfg.n_experts * cfg.n_layers:
            experts = ExpertCache(host_banks(banks, pin=device.type == "cuda"), options.expert_slots, device,
                                  options.cache_policy, options.prefetch)
        else:
            experts = ResidentExperts([ExpertBank(*(t.to(device) for t in (b.gate, b.up, b.down))) for b in banks])
        self.experts = experts
        self.model = Qwen35Moe(cfg, on_device, experts, gdn=options.gdn, moe=options.moe)
        self.snapshots = SnapshotCache(options.prefill_chunk) if options.snapshots else None

    @classmethod
    def from_gguf(cls, path: Path, options: EngineOptions) -> "ReferenceEngine":
        options.check()
        cached = options.device == "cuda" and options.expert_slots > 0
        cfg, weights = load(path, options.dtype, decode_on=options.device, pin_experts=cached,
                            keep_quant=options.weights == "gguf")
        return cls(cfg, weights, options)

    def new_state(self) -> SequenceState:
        return self.model.new_state()

    def prefill(self, tokens: list[int], state: SequenceState | None = None) -> tuple[torch.Tensor, SequenceState]:
        """Last-token logits after the prompt, computed in chunk-aligned segments (resuming from a snapshot).
        `tokens` is the whole prompt; a `state` passed in holds a prefix of it (state.position tokens)."""
        if not tokens:
            raise UserError("the prompt is empty; give at least one token")
        chunk, cost = self.options.prefill_chunk, 0.0
        if state is None and self.snapshots is not None:
            snap = self.snapshots.lookup(tokens)
            if snap is not None:
                state, cost = snap.state.clone(), snap.cost_s
                if snap.logits is not None and len(snap.tokens) == len(tokens):
                    return snap.logits.clone(), state
        if state is None:
            state = self.new_state()
        logits = None
        pos = state.position
        while pos < len(tokens):
            end = min(len(tokens), (pos // chunk + 1) * chunk)
            started = time.perf_counter()
            logits = self.model.forward(tokens[pos:end], state)
            self.sync()
            cost += time.perf_counter() - started
            pos = end
            if self.snapshots is not None and (end % chunk == 0 or end == len(tokens)):
                self.snapshots.store(state, logits if end == len(tokens) else None, cost)
        return logits, state

    def decode(self, token: int, state: SequenceState) -> torch.Tensor:
        return self.model.forward([token], state)

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy decoding: n new tokens after the prompt."""
        logits, state = self.prefill(prompt)
        out = []
        for _ in range(n):
            out.append(int(logits[-1].argmax()))
            if len(out) < n:
                logits = self.decode(out[-1], state)
        return out

    def sync(self) -> None:
        if self.options.device == "cuda":
            torch.cuda.synchronize()

    def stats(self) -> dict:
        out = {"experts": self.experts.stats.as_dict(), "expert_device_bytes": self.experts.device_bytes(),
               "other_device_bytes": self.other_bytes}
        if self.snapshots is not None:
            out["snapshots"] = self.snapshots.stats.as_dict()
        return out


def _is_routed_expert(name: str) -> bool:
    """layers.3.moe.gate, or layers.3.moe.gate.raw for a weight kept in GGUF blocks."""
    return ".moe." in name and name.split(".moe.", 1)[1].split(".")[0] in ("gate", "up", "down")


def _tensors(weights: ModelWeights):
    found: list[tuple[str, torch.Tensor]] = []
    weights.map(lambda name, t: found.append((name, t)) or t)
    return found
