"""The experts' host copies packed into blocks whose sizes are powers of two (cache/pinned.py): the values and shapes
survive, no two tensors share bytes, and the blocks hold little more than the tensors, where torch's pinned
allocator rounds every tensor up to a power of two. Without a GPU the same packing runs in ordinary memory."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autoinfer.refengine.cache.pinned import ALIGN, PinnedArena, block_size
from autoinfer.refengine.ops.quant.qweight import QuantWeight

DTYPES = [torch.uint8, torch.bfloat16, torch.float32]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _pack(tensors: list[torch.Tensor], max_block: int) -> tuple[PinnedArena, list[torch.Tensor]]:
    arena = PinnedArena(sum(_nbytes(t) for t in tensors), pin=False, max_block=max_block)
    return arena, [arena.copy(t) for t in tensors]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.sampled_from(DTYPES)), min_size=1, max_size=40),
       st.sampled_from([2**10, 2**12, 2**14]))
def test_packed_copies_keep_their_values_apart_in_blocks_of_powers_of_two(specs, max_block):
    gen = torch.Generator().manual_seed(len(specs))
    tensors = [torch.randint(0, 200, (n,), generator=gen).to(dtype) for n, dtype in specs]
    arena, copies = _pack(tensors, max_block)
    assert all(b.numel() & (b.numel() - 1) == 0 for b in arena.blocks)
    for t, c in zip(tensors, copies):
        assert c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t)
        assert (c.data_ptr() - c.untyped_storage().data_ptr()) % ALIGN == 0
    for i, c in enumerate(copies):  # overwrite each copy; every other one must be untouched
        c.fill_(i % 7 + 1)
    assert all(torch.all(c == i % 7 + 1) for i, c in enumerate(copies))
    biggest = max(_nbytes(t) for t in tensors)
    data = sum(-(-_nbytes(t) // ALIGN) * ALIGN for t in tensors)
    assert arena.block_bytes <= data + len(arena.blocks) * (biggest + ALIGN) + 2 * biggest


def test_the_35b_experts_shape_packs_within_3_percent_where_per_tensor_rounding_took_78():
    """The 35B-A3B's 120 Q4_K expert tensors of 144 MiB in 4 GiB blocks, scaled down 1024 times (144 KiB tensors,
    4 MiB blocks): 2.2% above the tensors' bytes; rounding each tensor to a power of two, as torch's pinned allocator
    does, takes 256 for 144 (30 GiB for 16.9 at full size)."""
    size = 144 * 2**10
    tensors = [torch.full((size,), i % 251, dtype=torch.uint8) for i in range(120)]
    arena, copies = _pack(tensors, 4 * 2**20)
    data = 120 * size
    assert arena.block_bytes <= 1.03 * data
    assert [b.numel() for b in arena.blocks] == [4 * 2**20] * 4 + [2**20, 256 * 2**10]
    assert all(torch.equal(c, t) for c, t in zip(copies, tensors))


def test_a_quantized_weight_keeps_its_type_and_logical_shape():
    raw = torch.arange(4 * 2 * 144, dtype=torch.int64).remainder(256).to(torch.uint8).view(4, 2, 144)
    w = QuantWeight(raw, "Q4_K", (4, 2, 256))
    arena = PinnedArena(raw.numel(), pin=False)
    placed = arena.place(w)
    assert isinstance(placed, QuantWeight) and placed.qtype == "Q4_K" and placed.shape == (4, 2, 256)
    assert torch.equal(placed.raw, raw) and placed.raw.data_ptr() != raw.data_ptr()


@pytest.mark.parametrize("need, left, size", [
    (100, 100, 128),          # one tensor: the smallest power of two that holds it
    (100, 1000, 512),         # more to come: the largest power of two within what remains
    (300, 1000, 512),
    (600, 1000, 1024),        # a tensor larger than that power of two: the smallest that holds it
    (2**33, 2**34, 2**33),    # MAX_BLOCK caps a block, unless one tensor needs more
    (10, 2**40, 2**32),
])
def test_block_size(need, left, size):
    assert block_size(need, left) == size



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_copies_are_page_locked_and_the_allocator_holds_just_the_blocks():
    """torch's host allocator hands a block of a power of two out at its size: what it holds grows by the arena's
    blocks, not by each tensor rounded up."""
    size = 144 * 2**10 + 512  # not a power of two
    tensors = [torch.full((size,), i % 251, dtype=torch.uint8) for i in range(40)]
    before = torch.cuda.host_memory_stats().get("active_bytes.current", 0)
    arena, copies = _pack_pinned(tensors)
    assert all(c.is_pinned() for c in copies) and all(torch.equal(c, t) for c, t in zip(copies, tensors))
    assert torch.cuda.host_memory_stats()["active_bytes.current"] - before == arena.block_bytes
    assert arena.block_bytes < 40 * (1 << (size - 1).bit_length())


def _pack_pinned(tensors: list[torch.Tensor]) -> tuple[PinnedArena, list[torch.Tensor]]:
    arena = PinnedArena(sum(_nbytes(t) for t in tensors))
    return arena, [arena.copy(t) for t in tensors]
