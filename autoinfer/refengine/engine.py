"""The reference engine as one object: load a GGUF, place weights and experts, prefill (with snapshots), decode."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from autoinfer.errors import UserError
from autoinfer.model.arch import Architecture
from autoinfer.refengine.budget import DevicePlan, is_routed_expert
from autoinfer.refengine.cache.experts import ExpertCache, ResidentExperts, StepExpertCache, host_banks
from autoinfer.refengine.cache.snapshots import SnapshotCache
from autoinfer.refengine.graphs import DecodeGraph
from autoinfer.refengine.loader import ModelWeights, load, torch_dtype
from autoinfer.refengine.model import Qwen35Moe
from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.options import EngineOptions
from autoinfer.refengine.state import SequenceState


class ReferenceEngine:
    def __init__(self, cfg: Architecture, weights: ModelWeights, options: EngineOptions):
        options.check()
        if options.torch_threads:
            torch.set_num_threads(options.torch_threads)
        self.cfg, self.options = cfg, options
        device = torch.device(options.device)
        self.plan = DevicePlan.from_weights(cfg, [(name, t.numel() * t.element_size()) for name, t in _tensors(weights)],
                                            options)
        # budget_mib: the expert slots are what the budget holds after everything else (recorded in stats())
        slots = self.plan.slots(options.budget_mib) if options.budget_mib is not None else options.expert_slots
        banks = [ExpertBank(layer.moe.gate, layer.moe.up, layer.moe.down) for layer in weights.layers]
        # Everything but the routed experts goes to the device now; the experts are placed below.
        on_device = weights.map(lambda name, t: t if is_routed_expert(name) else t.to(device))
        self.other_bytes = self.plan.other_bytes
        if slots and slots < cfg.n_experts * cfg.n_layers and options.graphs:  # lookups on the device
            experts = StepExpertCache(host_banks(banks, pin=True), slots, device, options.cache_policy,
                                      cfg.n_experts_used)
        elif slots and slots < cfg.n_experts * cfg.n_layers:
            experts = ExpertCache(host_banks(banks, pin=device.type == "cuda"), slots, device,
                                  options.cache_policy, options.prefetch, options.misses)
        else:
            experts = ResidentExperts([ExpertBank(*(t.to(device) for t in (b.gate, b.up, b.down))) for b in banks])
        self.experts = experts
        self.model = Qwen35Moe(cfg, on_device, experts, dtype=torch_dtype(options.dtype), gdn=options.gdn,
                               moe=options.moe, norm=options.norm)
        self.snapshots = SnapshotCache(options.prefill_chunk) if options.snapshots else None
        self.static: SequenceState | None = None  # graphs on: the one state the decode graph is recorded over
        self.graph: DecodeGraph | None = None

    @classmethod
    def from_gguf(cls, path: Path, options: EngineOptions) -> "ReferenceEngine":
        options.check()
        cached = options.device == "cuda" and (options.expert_slots > 0 or options.budget_mib is not None)
        cfg, weights = load(path, options.dtype, decode_on=options.device, pin_experts=cached,
                            keep_quant=options.weights == "gguf")
        return cls(cfg, weights, options)

    def new_state(self) -> SequenceState:
        """An empty sequence holding max_context positions from the start, so a measured peak holds the context the
        device plan counts (a dynamic state grows beyond it). With graphs on it is always the same static state,
        emptied: the decode graph is recorded over its tensors once, so the engine runs one sequence at a time."""
        if not self.options.graphs:
            return self.model.new_state(self.options.max_context)
        if self.static is None:
            self.static = self.model.new_state(self.options.max_context, static=True)
        else:
            self.static.reset_()
        return self.static

    def prefill(self, tokens: list[int], state: SequenceState | None = None) -> tuple[torch.Tensor, SequenceState]:
        """Last-token logits after the prompt, computed in chunk-aligned segments (resuming from a snapshot).
        `tokens` is the whole prompt; a `state` passed in holds a prefix of it (state.position tokens)."""
        if not tokens:
            raise UserError("the prompt is empty; give at least one token")
        chunk, cost = self.options.prefill_chunk, 0.0
        if state is None and self.snapshots is not None:
            snap = self.snapshots.lookup(tokens)
            if snap is not None:
                state, cost = self._resume(snap.state), snap.cost_s
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

    def _resume(self, snapshot: SequenceState) -> SequenceState:
        if not self.options.graphs:
            return snapshot.clone()
        state = self.new_state()
        state.load_(snapshot)
        return state

    def decode(self, token: int, state: SequenceState) -> torch.Tensor:
        if not self.options.graphs:
            return self.model.forward([token], state)
        if state is not self.static:
            raise UserError("with graphs on, decode continues the engine's own state (from new_state or prefill)")
        self.experts.before_step()
        if self.graph is None:
            self.graph = DecodeGraph(self.model, state)
        logits = self.graph.run(token)
        self.experts.after_step()
        return logits

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
        if self.options.budget_mib is not None:
            out["device_plan"] = self.plan.describe(self.options.budget_mib)
        if self.snapshots is not None:
            out["snapshots"] = self.snapshots.stats.as_dict()
        return out


def _tensors(weights: ModelWeights):
    found: list[tuple[str, torch.Tensor]] = []
    weights.map(lambda name, t: found.append((name, t)) or t)
    return found
