"""The expert-cache lookup of a decode step on the device, so the step needs no host synchronisation (and can be one
CUDA graph): for each of a layer's k chosen experts, the slot that holds it (a device table, layer × expert → slot or
−1); a missing one is read straight from pinned host memory (mapped into the device's address space) into a spare
slot the host set aside for this layer, so it is cached from then on: the r-th miss among the k choices (in choice
order) takes spare r. Returns the pool row each choice reads, and logs the choices and their rows so the host can
update its bookkeeping (and set new spares aside) between steps.

`fetch_naive` is the definition in torch (host-side indexing); `fetch_experts` is one Triton launch whose programs
split each missing expert's bytes (gate, up, down) into chunks; programs of experts that hit return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoinfer.refengine.ops.quant.kernels import check_device


def fetch_naive(expert: torch.Tensor, table: torch.Tensor, host: list[torch.Tensor], pool: list[torch.Tensor],
                spare: torch.Tensor, log: torch.Tensor) -> torch.Tensor:
    """expert [k]; table [n_experts] (this layer's slots, −1 where absent); host / pool: the gate, up and down
    storages [n_experts, bytes] and [slots, bytes]; spare [k]: free pool rows for the misses. Writes log[0] = expert,
    log[1] = the rows; returns the pool row of each choice [k] int64."""
    slots = table[expert].long()
    miss = slots < 0
    rank = (miss.cumsum(0) - 1).clamp(min=0)
    rows = torch.where(miss, spare.long()[rank], slots)
    for a in miss.nonzero().flatten().tolist():
        for src, dst in zip(host, pool):
            dst[rows[a]].copy_(src[int(expert[a])])
    log[0].copy_(expert)
    log[1].copy_(rows)
    return rows


@triton.jit
def _fetch_kernel(expert_ptr, table_ptr, spare_ptr, rows_ptr, log_ptr, g_src, u_src, d_src, g_dst, u_dst, d_dst,
                  g_words, u_words, d_words, K, KP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    a, c, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e = tl.load(expert_ptr + a)
    slot = tl.load(table_ptr + e).to(tl.int64)
    choices = tl.arange(0, KP)
    others = tl.load(table_ptr + tl.load(expert_ptr + choices, mask=choices < K, other=0), mask=choices < K, other=0)
    rank = tl.sum(((others < 0) & (choices < a)).to(tl.int32), axis=0)  # misses among the choices before a
    row = tl.where(slot >= 0, slot, tl.load(spare_ptr + rank).to(tl.int64))
    if (c == 0) & (which == 0):
        tl.store(rows_ptr + a, row)
        tl.store(log_ptr + a, e)
        tl.store(log_ptr + K + a, row)
    if slot < 0:
        if which == 0:
            src, dst, n = g_src, g_dst, g_words
        elif which == 1:
            src, dst, n = u_src, u_dst, u_words
        else:
            src, dst, n = d_src, d_dst, d_words
        src = src + e.to(tl.int64) * n
        dst = dst + row * n
        for start in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ok = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=ok), mask=ok)


def _words(t: torch.Tensor, unit: torch.dtype) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).view(unit)


def fetch_experts(expert: torch.Tensor, table: torch.Tensor, host: list[torch.Tensor], pool: list[torch.Tensor],
                  spare: torch.Tensor, log: torch.Tensor) -> torch.Tensor:
    """fetch_naive in one launch, with no host synchronisation; host storages must be pinned (or, under the
    interpreter, CPU tensors like the rest)."""
    check_device(expert.device)
    k = expert.numel()
    row_bytes = [src[0].numel() * src.element_size() for src in host]
    unit = torch.int32 if all(b % 4 == 0 for b in row_bytes) else torch.int16 if all(b % 2 == 0 for b in row_bytes) \
        else torch.uint8
    src = [_words(t, unit) for t in host]
    dst = [_words(t, unit) for t in pool]
    n = [t.shape[1] for t in src]
    block = 1024 if expert.is_cuda else 4096
    chunk = 16 * block if expert.is_cuda else max(n)  # GPU: ~64 KiB a program, many in flight over PCIe
    rows = torch.empty(k, dtype=torch.int64, device=expert.device)
    _fetch_kernel[(k, triton.cdiv(max(n), chunk), 3)](expert, table, spare, rows, log, *src, *dst, *n, k,
                                                       KP=triton.next_power_of_2(k), CHUNK=chunk, BLOCK=block)
    return rows
