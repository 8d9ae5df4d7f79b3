"""The decode step as one CUDA graph: `Qwen35Moe.step` for one token, recorded once over a static state and
replayed for every token, so a step costs one launch instead of hundreds of small ones.

The graph reads the token id and its position from two device scalars written before each replay, and updates the
state's caches in place (a static state keeps its tensors at fixed addresses). What it records must never wait for
the device: the engine allows graphs only with op variants that read nothing back to the host (ops' CAPTURE_SAFE)
and with every expert resident or in the step expert cache (cache/experts.py StepExpertCache: lookups on the device,
misses read from pinned host memory into spare slots, the host's bookkeeping between steps). Recording runs the step once more on a side stream first (Triton compiles there,
not inside the capture), over the emptied state (the graph reads positions from the device, so where it is
recorded does not matter, and a full static state has no room for the two steps); the state is restored afterwards,
so recording changes nothing a caller can see.
"""

from __future__ import annotations

import torch

from autoinfer.errors import UserError
from autoinfer.refengine.state import KVCache, SequenceState


def capacity(state: SequenceState) -> int | None:
    """Positions a static state holds (None for a dynamic one)."""
    caches = [layer for layer in state.layers if isinstance(layer, KVCache)]
    if not caches or not all(c.static for c in caches):
        return None
    return caches[0].k.shape[1]


class DecodeGraph:
    def __init__(self, model, state: SequenceState):
        self.capacity = capacity(state)
        if self.capacity is None:
            raise ValueError("a CUDA graph of the decode step needs a static state (fixed tensor addresses)")
        device = model.device
        self.state = state
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, dtype=torch.long, device=device)
        saved = state.clone()
        state.reset_()  # the two recording steps need two free positions: a full state (warm-up) has none
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            model.step(self.ids, self.positions, state)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.step(self.ids, self.positions, state)
        state.load_(saved)

    def run(self, token: int) -> torch.Tensor:
        """Logits [1, V] after consuming `token` at the state's next position."""
        if self.state.position >= self.capacity:
            raise UserError(f"the sequence reached the static cache's {self.capacity} positions; raise the engine's "
                            "max_context")
        self.ids.fill_(token)
        self.positions.fill_(self.state.position)
        self.graph.replay()
        self.state.advance([token])
        return self.logits.clone()
