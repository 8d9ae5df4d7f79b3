"""Position-indexed snapshots of the whole sequence state (GDN conv + recurrent state, KV prefix).

A prompt that shares a prefix with an earlier one resumes from the longest snapshot instead of recomputing it:
recurrent layers cannot drop a suffix the way a KV cache can, so without snapshots every new prompt pays the whole
prefill again. Snapshots are taken at multiples of the prefill chunk (and at the end of each prompt, with its
logits); the engine always prefills in chunk-aligned segments, so a resumed run does exactly the arithmetic of a
cold run and its logits are bit-identical.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from autoinfer.refengine.state import SequenceState


@dataclass(frozen=True)
class Snapshot:
    tokens: tuple[int, ...]
    state: SequenceState
    logits: torch.Tensor | None  # last-token logits, kept for end-of-prompt snapshots
    cost_s: float  # prefill time it took a cold run to reach this position


@dataclass
class SnapshotStats:
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    time_saved_s: float = 0.0
    stored: int = 0
    bytes: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class SnapshotCache:
    def __init__(self, chunk: int, max_snapshots: int = 64):
        self.chunk, self.max_snapshots = chunk, max_snapshots
        self.entries: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()
        self.stats = SnapshotStats()

    def lookup(self, tokens: list[int]) -> Snapshot | None:
        """The longest usable snapshot: a chunk-aligned prefix, or the whole prompt when its logits were kept."""
        key = tuple(tokens)
        whole = self.entries.get(key)
        found = whole if whole is not None and whole.logits is not None else None
        p = (len(tokens) - 1) // self.chunk * self.chunk  # leave ≥ 1 token to compute unless whole matched
        while found is None and p > 0:
            found = self.entries.get(key[:p])
            p -= self.chunk
        if found is None:
            self.stats.misses += 1
            return None
        self.entries.move_to_end(found.tokens)
        self.stats.hits += 1
        self.stats.tokens_reused += len(found.tokens)
        self.stats.time_saved_s += found.cost_s
        return found

    def store(self, state: SequenceState, logits: torch.Tensor | None, cost_s: float) -> None:
        key = tuple(state.tokens)
        if key in self.entries:
            old = self.entries.pop(key)
            self.stats.bytes -= old.state.nbytes()
            self.stats.stored -= 1
            logits = logits if logits is not None else old.logits
        snap = Snapshot(key, state.clone(), None if logits is None else logits.clone(), cost_s)
        self.entries[key] = snap
        self.stats.stored += 1
        self.stats.bytes += snap.state.nbytes()
        while len(self.entries) > self.max_snapshots:
            _, dropped = self.entries.popitem(last=False)
            self.stats.stored -= 1
            self.stats.bytes -= dropped.state.nbytes()
