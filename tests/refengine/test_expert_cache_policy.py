"""The expert cache evicts what its policy names: lfu the least used resident expert outside the current step, the
least recent of equals; lru the least recent. The caches rank keys incrementally (a heap for lfu); a naive cache that
scans every slot per eviction, as the cache once did, must make the same decisions on any routing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autoinfer.refengine.cache.experts import ExpertCache, StepExpertCache
from autoinfer.refengine.ops.moe import ExpertBank

LAYERS, EXPERTS, K = 3, 8, 2
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"  # expert_cache_bookkeeping.log_step


class Scanning:
    """The reference rule: one eviction at a time, a scan of the resident keys in LRU order."""

    def _victims(self, protected, n):
        out = []
        for _ in range(n):
            if self.free:
                out.append(self.free.pop())
                continue
            candidates = (key for key in self.where if key not in protected)
            if self.policy == "lfu":
                key = min(candidates, key=lambda k: self.uses[k], default=None)
            else:
                key = next(candidates, None)
            assert key is not None
            self.prefetched.discard(key)
            self._evicted(key)
            out.append(self.where.pop(key))
        return out


class ScanningStep(Scanning, StepExpertCache):
    pass


class ScanningCache(Scanning, ExpertCache):
    pass


def _host() -> list[ExpertBank]:
    return [ExpertBank(*(torch.arange(EXPERTS, dtype=torch.float32).reshape(EXPERTS, 1, 1) + 100 * layer
                         for _ in range(3))) for layer in range(LAYERS)]


@pytest.fixture(scope="module")
def log_step():
    sys.path.insert(0, str(BENCHMARKS))
    from expert_cache_bookkeeping import log_step

    yield log_step
    sys.path.remove(str(BENCHMARKS))


steps = st.lists(st.lists(st.lists(st.integers(0, EXPERTS - 1), min_size=K, max_size=K, unique=True),
                          min_size=LAYERS, max_size=LAYERS), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps, st.sampled_from(["lru", "lfu"]), st.integers(3 * LAYERS * K, LAYERS * EXPERTS - 1))
def test_a_decode_step_s_evictions_match_the_scan(log_step, routing, policy, slots):
    fast = StepExpertCache(_host(), slots, torch.device("cpu"), policy, K)
    slow = ScanningStep(_host(), slots, torch.device("cpu"), policy, K)
    for step in map(torch.tensor, routing):
        for cache in (fast, slow):
            log_step(cache, step)  # what the device's fetch logs
            cache.after_step()
        assert fast.spares == slow.spares
        assert list(fast.where.items()) == list(slow.where.items())
        assert torch.equal(fast.mirror, slow.mirror)
    assert fast.stats.as_dict() == slow.stats.as_dict()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, LAYERS - 1),
                          st.lists(st.integers(0, EXPERTS - 1), min_size=1, max_size=3, unique=True)),
                min_size=1, max_size=60),
       st.sampled_from(["lru", "lfu"]), st.integers(3, 10))
def test_the_eager_cache_s_evictions_match_the_scan(lookups, policy, slots):
    fast = ExpertCache(_host(), slots, torch.device("cpu"), policy)
    slow = ScanningCache(_host(), slots, torch.device("cpu"), policy)
    for layer, experts in lookups:
        got = fast.ensure(layer, experts)
        assert got == slow.ensure(layer, experts)
        assert list(fast.where.items()) == list(slow.where.items())
        for e, slot in got.items():  # the slot holds that expert's weights
            assert float(fast.pool.gate[slot]) == float(fast.host[layer].gate[e])
    assert fast.stats.as_dict() == slow.stats.as_dict()


def test_the_bookkeeping_benchmark_times_both_policies(log_step, capsys):
    from expert_cache_bookkeeping import main

    assert main(["--slots", "1644", "--steps", "4", "--repeats", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 1644 ")]
    assert [r[1].strip() for r in rows] == ["lru", "lfu"]
    assert all(float(r[3]) > 0 for r in rows)
