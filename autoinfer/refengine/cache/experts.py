"""Where routed experts live while the model runs.

`ResidentExperts`: every expert of every layer on the compute device. `ExpertCache`: experts stay in (pinned) host
memory (dense, or in their GGUF blocks) and are copied on use into N device slots shared by all layers, evicting
by LRU or LFU; optionally the likely experts of the next `prefetch` layers are copied early (predicted by applying
those layers' routers to the current hidden state) on a side CUDA stream while this layer computes. Both run a
layer's routed assignments through an op from ops/moe. `StepExpertCache`: the same slots and policy, but a decode
step looks its experts up on the device (cache/fetch.py: misses are read from pinned host memory inside the step,
into spare slots set aside per layer), so the step is one CUDA graph; the host updates its bookkeeping after it.
With misses: cpu, ExpertCache computes a miss that one token needs on the host instead (cache/host.py).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice

import torch

from autoinfer.errors import UserError
from autoinfer.refengine.cache.fetch import fetch_experts
from autoinfer.refengine.cache.host import HostExperts
from autoinfer.refengine.cache.pinned import PinnedArena
from autoinfer.refengine.ops.moe import ExpertBank, MoeFn
from autoinfer.refengine.ops.quant.qweight import QuantWeight
from autoinfer.refengine.options import MISSES, POLICIES


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    prefetched: int = 0
    prefetch_used: int = 0  # prefetched experts that a later demand found in their slot
    cpu_computed: int = 0  # misses computed on the host (misses: cpu), counted in misses too; nothing copied
    cpu_decoded: int = 0  # of those, the ones whose GGUF blocks had to be decoded (not in the host's LRU)

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate,
                "bytes_fetched": self.bytes_fetched, "prefetched": self.prefetched,
                "prefetch_used": self.prefetch_used, "cpu_computed": self.cpu_computed,
                "cpu_decoded": self.cpu_decoded}


class ResidentExperts:
    """All experts on the device: the bank of layer l is that layer's stacked expert tensors."""

    prefetch = 0  # layers ahead whose predicted experts are copied early: none, all are here

    def __init__(self, banks: list[ExpertBank]):
        self.banks = banks
        self.stats = CacheStats()

    def run(self, layer: int, x: torch.Tensor, token: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor,
            fn: MoeFn) -> torch.Tensor:
        return fn(x, token, expert, weight, self.banks[layer])

    def before_step(self) -> None:
        """Around a decode step recorded as a CUDA graph: nothing to look up, every expert is here."""

    after_step = before_step

    def device_bytes(self) -> int:
        return sum(_storage(t).numel() * _storage(t).element_size() for b in self.banks for t in (b.gate, b.up, b.down))

    @property
    def expert_bytes(self) -> int:
        return self.device_bytes() // sum(b.rows for b in self.banks)


class ExpertCache:
    """N device slots in front of host-resident experts. misses: "copy" copies every missed expert into a slot;
    "cpu" computes a missed expert that one token of the call needs (every miss of a decode step) on the host and
    leaves the slots as they are: admitting it would be the very copy that computing on the host avoids. A missed
    expert that several tokens need (in a prefill) is still copied: one copy serves all of them, while host work
    grows with each."""

    def __init__(self, host: list[ExpertBank], slots: int, device: torch.device, policy: str = "lru",
                 prefetch: int = 0, misses: str = "copy"):
        if policy not in POLICIES:
            raise UserError(f"expert cache policy {policy!r} is not one of {', '.join(POLICIES)}")
        if misses not in MISSES:
            raise UserError(f"misses {misses!r} is not one of {', '.join(MISSES)}")
        if slots < 1:
            raise UserError(f"expert_slots must be ≥ 1 for the expert cache (got {slots})")
        self.host, self.policy, self.prefetch, self.device = host, policy, prefetch, torch.device(device)
        ref = host[0]
        self.pool = ExpertBank(*(_empty_rows(t, slots, self.device) for t in (ref.gate, ref.up, ref.down)))
        self.slots = slots
        self.room = slots  # slots a prefill's round may fill
        self.where: OrderedDict[tuple[int, int], int] = OrderedDict()  # (layer, expert) → slot, LRU order
        self.uses: dict[tuple[int, int], int] = {}
        # lfu: each resident key's place in the LRU order (a tick) and a heap of (uses, tick, key), the least used
        # and, among those, the least recent first; an entry whose tick is no longer its key's is skipped. A scan of
        # every slot per eviction cost 31 ms a decode step at 2554 slots (benchmarks/expert_cache_bookkeeping.py).
        self.ticks: dict[tuple[int, int], int] = {}
        self.tick = 0
        self.ranked: list[tuple[int, int, tuple[int, int]]] = []
        self.free = list(range(slots))
        self.pending: dict[int, torch.cuda.Event] = {}  # slot → copy still in flight on the side stream
        self.prefetched: set[tuple[int, int]] = set()
        self.last_used: set[tuple[int, int]] = set()  # the experts the latest layer computed with
        self.expert_bytes = sum(_storage(t)[0].numel() * _storage(t).element_size() for t in (ref.gate, ref.up, ref.down))
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.on_host = HostExperts(host) if misses == "cpu" else None
        self.stats = CacheStats()

    def device_bytes(self) -> int:
        return self.slots * self.expert_bytes

    def _used(self, key: tuple[int, int], count: bool = True) -> None:
        """A resident key used (count) or just placed: the end of the LRU order, and its lfu rank."""
        if count:
            self.uses[key] += 1
        self.where.move_to_end(key)
        if self.policy == "lfu":
            self.tick += 1
            self.ticks[key] = self.tick
            heapq.heappush(self.ranked, (self.uses[key], self.tick, key))
            if len(self.ranked) > 4 * len(self.where) + 1024:  # drop the entries that went stale
                self.ranked = [(self.uses[k], self.ticks[k], k) for k in self.where]
                heapq.heapify(self.ranked)

    def _victims(self, protected: set[tuple[int, int]], n: int) -> list[int]:
        """n slots: free ones first, then those of the keys the policy evicts, none of them in `protected`."""
        slots = [self.free.pop() for _ in range(min(n, len(self.free)))]
        if len(slots) == n:
            return slots
        if self.policy == "lfu":
            keys, held = [], []
            while len(keys) < n - len(slots) and self.ranked:
                entry = heapq.heappop(self.ranked)
                _, tick, key = entry
                if self.ticks.get(key) != tick:
                    continue
                if key in protected:
                    held.append(entry)
                else:
                    keys.append(key)
            for entry in held:
                heapq.heappush(self.ranked, entry)
        else:  # the oldest unprotected keys: a scan of a few keys, not of thousands of slots
            keys = list(islice((key for key in self.where if key not in protected), n - len(slots)))
        if len(keys) < n - len(slots):
            raise RuntimeError("expert cache: every slot holds an expert the current step needs")
        for key in keys:
            self.prefetched.discard(key)
            self._evicted(key)
            self.ticks.pop(key, None)
            slots.append(self.where.pop(key))
        return slots

    def _evicted(self, key: tuple[int, int]) -> None:
        """Called when `key` leaves its slot."""

    def _load(self, key: tuple[int, int], protected: set[tuple[int, int]], stream) -> int:
        slot = self._victims(protected, 1)[0]
        unfinished = self.pending.pop(slot, None)  # an evicted prefetch may still be copying into this slot
        if unfinished is not None and stream is None:
            torch.cuda.current_stream(self.device).wait_event(unfinished)
        layer, e = key
        src = self.host[layer]
        ctx = torch.cuda.stream(stream) if stream is not None else nullcontext()
        with ctx:
            for dst, t in zip((self.pool.gate, self.pool.up, self.pool.down), (src.gate, src.up, src.down)):
                _storage(dst)[slot].copy_(_storage(t)[e], non_blocking=True)
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
                self.pending[slot] = event
        self.where[key] = slot
        self._placed(key, slot)
        self.uses.setdefault(key, 0)
        self._used(key, count=False)
        self.stats.bytes_fetched += self.expert_bytes
        return slot

    def _placed(self, key: tuple[int, int], slot: int) -> None:
        """Called when `key` was copied into `slot`."""

    def ensure(self, layer: int, experts: list[int]) -> dict[int, int]:
        """Make these experts of `layer` resident (len ≤ slots); returns expert → slot."""
        keys = [(layer, e) for e in experts]
        protected = set(keys)
        self.last_used = protected
        out = {}
        for key in keys:
            if key in self.where:
                self.stats.hits += 1
                if key in self.prefetched:
                    self.stats.prefetch_used += 1
                    self.prefetched.discard(key)
                slot = self.where[key]
            else:
                self.stats.misses += 1
                slot = self._load(key, protected, None)
            event = self.pending.pop(slot, None)
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
            self._used(key)
            out[key[1]] = slot
        return out

    def prefetch_layer(self, layer: int, experts: list[int]) -> None:
        """Start copying predicted experts of `layer` that are not resident, without waiting for them.

        Called after the current layer's experts were queued: the copies wait for that work (their slots may be
        read by it), then overlap with the next layer's attention/GDN. The current layer's experts are kept."""
        missing = [(layer, e) for e in experts if (layer, e) not in self.where]
        missing = missing[: max(0, self.slots - len(self.last_used))]
        if not missing:
            return
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        for key in missing:
            self._load(key, set(missing) | self.last_used, self.copy_stream)
            self.prefetched.add(key)
            self.stats.prefetched += 1

    def run(self, layer: int, x: torch.Tensor, token: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor,
            fn: MoeFn) -> torch.Tensor:
        """Experts of this layer in rounds of at most `room` slots (a long prefill can need more than fit). Misses
        computed on the host are read back before the device work is queued, and run while the device runs it."""
        used, counts = torch.unique(expert, return_counts=True)
        needed = used.tolist()
        to_host = []
        if self.on_host is not None:
            to_host = [e for e, n in zip(needed, counts.tolist()) if n == 1 and (layer, e) not in self.where]
        if to_host:
            rows = torch.isin(expert, torch.tensor(to_host, device=expert.device)).nonzero().squeeze(1)
            host_token = token[rows]
            host_args = (x[host_token].cpu(), expert[rows].cpu(), weight[rows].cpu())
            self.stats.misses += len(to_host)
            self.stats.cpu_computed += len(to_host)
            needed = [e for e in needed if e not in to_host]
        self.last_used = set()
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if not needed else None
        for start in range(0, len(needed), self.room):
            group = needed[start:start + self.room]
            slot_of = self.ensure(layer, group)
            table = torch.full((self.host[layer].gate.shape[0],), -1, dtype=torch.long)
            table[list(slot_of)] = torch.tensor(list(slot_of.values()))
            rows = table.to(expert.device)[expert]
            pick = rows >= 0
            part = fn(x, token[pick], rows[pick], weight[pick], self.pool)
            y = part if y is None else y + part
        if to_host:
            out, decoded = self.on_host.run(layer, *host_args)
            self.stats.cpu_decoded += decoded
            y = y.index_add(0, host_token, out.to(y.device))
        return y


class StepExpertCache(ExpertCache):
    """The expert cache for a decode step recorded as a CUDA graph. A device table (layer × expert → slot, −1 where
    absent) mirrors where the experts are, and each layer has k spare slots set aside. In a decode step each layer's
    k choices are looked up on the device; a missing expert is read from pinned host memory straight into one of its
    layer's spares (cache/fetch.py), so the step never waits for the host and each miss crosses PCIe once. After the
    step the host reads the logged choices and rows back, counts hits, records the missed experts in the spares they
    now occupy, and sets new spares aside by evicting by the policy; the table and spares reach the device before the
    next step reads them. The spares (n_layers · k slots) are held back from the cached experts. Prefill (several
    tokens) runs as in ExpertCache, in the slots that are not spares."""

    def __init__(self, host: list[ExpertBank], slots: int, device: torch.device, policy: str, k: int):
        n_layers, n_experts = len(host), host[0].rows
        if slots < 3 * n_layers * k:  # spares, the experts a step uses, and as many again to evict for new spares
            raise UserError(f"an expert cache of {slots} slots under graphs: on needs ≥ {3 * n_layers * k} (3 × "
                            f"{n_layers} layers × {k} experts a token: spares, the experts of a step, and victims for "
                            "new spares); raise the budget or use graphs: off")
        super().__init__(host, slots, device, policy, prefetch=0)
        self.room = slots - n_layers * k
        self.spares = [[self.free.pop() for _ in range(k)] for _ in range(n_layers)]
        self.spare = torch.tensor(self.spares, dtype=torch.int32, device=self.device)
        self.mirror = torch.full((n_layers, n_experts), -1, dtype=torch.int32)
        self.table = self.mirror.to(self.device)
        self.log = torch.zeros(n_layers, 2, k, dtype=torch.long, device=self.device)  # [layer] = (experts, rows)
        self.dirty = False  # the mirror or the spares changed since the device copies were made
        self.host_storage = [[_storage(t) for t in (b.gate, b.up, b.down)] for b in host]
        self.pool_storage = [_storage(t) for t in (self.pool.gate, self.pool.up, self.pool.down)]

    def _evicted(self, key: tuple[int, int]) -> None:
        self.mirror[key] = -1
        self.dirty = True

    def _placed(self, key: tuple[int, int], slot: int) -> None:
        self.mirror[key] = slot
        self.dirty = True

    def run(self, layer: int, x: torch.Tensor, token: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor,
            fn: MoeFn) -> torch.Tensor:
        if x.shape[0] != 1:
            return super().run(layer, x, token, expert, weight, fn)
        rows = fetch_experts(expert, self.table[layer], self.host_storage[layer], self.pool_storage,
                             self.spare[layer], self.log[layer])
        return fn(x, token, rows, weight, self.pool)

    def before_step(self) -> None:
        """The table and the spares take the host's changes (admissions, evictions, prefill) before a decode step."""
        if self.dirty:
            self.table.copy_(self.mirror)
            self.spare.copy_(torch.tensor(self.spares, dtype=torch.int32))
            self.dirty = False

    def after_step(self) -> None:
        """Count the decode step's hits, record its misses where they were read to, then set new spares aside (waits
        for the step: its choices are read back). Nothing the step used is evicted for a spare: a later layer's hit
        would otherwise be taken for a miss, and its slot handed out twice."""
        step = [([(layer, e) for e in experts], rows) for layer, (experts, rows) in enumerate(self.log.tolist())]
        used = []
        for keys, rows in step:
            misses = 0
            for key, row in zip(keys, rows):
                if self.where.get(key) == row:
                    self.stats.hits += 1
                else:  # read from host memory into this layer's next spare
                    self.stats.misses += 1
                    self.stats.bytes_fetched += self.expert_bytes
                    self.where[key] = row
                    self._placed(key, row)
                    self.uses.setdefault(key, 0)
                    misses += 1
                self._used(key)
            used.append(misses)
        protected = {key for keys, _ in step for key in keys}
        victims = iter(self._victims(protected, sum(used)))  # in layer order, as one eviction per miss would be
        for layer, misses in enumerate(used):
            if misses:
                self.spares[layer] = self.spares[layer][misses:] + [next(victims) for _ in range(misses)]
                self.dirty = True


def host_banks(banks: list[ExpertBank], pin: bool) -> list[ExpertBank]:
    """Experts kept in host memory; pinned when a CUDA device will copy from them asynchronously (those not pinned
    yet are packed into pinned blocks, cache/pinned.py)."""
    if not pin:
        return banks
    loose = [t for b in banks for t in (b.gate, b.up, b.down) if not t.is_pinned()]
    arena = PinnedArena(sum(_storage(t).numel() * _storage(t).element_size() for t in loose))
    return [ExpertBank(*(t if t.is_pinned() else arena.place(t) for t in (b.gate, b.up, b.down))) for b in banks]


def _storage(t: torch.Tensor | QuantWeight) -> torch.Tensor:
    """The tensor holding the bytes: a dense weight itself, or the raw blocks of a quantized one."""
    return t.raw if isinstance(t, QuantWeight) else t


def _empty_rows(t: torch.Tensor | QuantWeight, rows: int, device: torch.device) -> torch.Tensor | QuantWeight:
    """An uninitialised stack of `rows` matrices shaped like t's, in t's format."""
    data = torch.empty((rows, *_storage(t).shape[1:]), dtype=_storage(t).dtype, device=device)
    return QuantWeight(data, t.qtype, (rows, *t.shape[1:])) if isinstance(t, QuantWeight) else data
