"""`autoinfer engine bench`: each op variant and the whole engine, timed, checked against the reference, and set
against its bandwidth-limited floor (bytes it must move / the memory bandwidth measured here, now)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from autoinfer.model.arch import Architecture
from autoinfer.refengine.engine import ReferenceEngine
from autoinfer.refengine.loader import load, torch_dtype
from autoinfer.refengine.ops import gdn as gdn_ops
from autoinfer.refengine.ops import moe as moe_ops
from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.ops.moe.grouped import implementation
from autoinfer.refengine.ops.quant.kernels import interpreted
from autoinfer.refengine.ops.quant.qweight import QuantWeight
from autoinfer.refengine.options import EngineOptions


@dataclass(frozen=True)
class Row:
    what: str  # op or engine phase
    variant: str
    error: float | None  # max|x − ref| / max|ref| against the reference variant (None for the reference itself)
    time_ms: float  # median over repetitions
    floor_ms: float  # bytes moved / measured bandwidth
    detail: str = ""

    @property
    def floor_share(self) -> float:
        return self.floor_ms / self.time_ms if self.time_ms else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> tuple[float, object]:
    """Median seconds of `reps` calls after one warm-up, and the last result."""
    out = fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def memory_bandwidth(device: torch.device, mib: int | None = None) -> float:
    """Bytes/s of a large device copy (read + write), median of 5: the ceiling every memory-bound op is held to."""
    mib = mib or (1024 if device.type == "cuda" else 128)
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    s, _ = timed(lambda: dst.copy_(src), device, 5)
    return 2 * src.numel() * 4 / s


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref.float()).abs().max() / ref.float().abs().max())


def bench_gdn(cfg: Architecture, tokens: int, device: torch.device, bw: float, reps: int) -> list[Row]:
    H, d = cfg.gdn_v_heads, cfg.gdn_head_dim
    gen = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(tokens, H, d, generator=gen), dim=-1) / d**0.5
    k = F.normalize(torch.randn(tokens, H, d, generator=gen), dim=-1)
    v, g = torch.randn(tokens, H, d, generator=gen), -torch.rand(tokens, H, generator=gen)
    beta, state = torch.rand(tokens, H, generator=gen), torch.zeros(H, d, d)
    args = [t.to(device) for t in (q, k, v, g, beta, state)]
    moved = 4 * (4 * tokens * H * d + 2 * tokens * H + 2 * H * d * d)  # q k v out, g beta, state in/out (fp32)
    rows, ref = [], None
    triton_ok = device.type == "cuda" or interpreted()  # a Triton variant on a plain CPU would only raise
    for name in [gdn_ops.REFERENCE, *(n for n in gdn_ops.VARIANTS
                                      if n != gdn_ops.REFERENCE and (triton_ok or n not in gdn_ops.TRITON))]:
        s, (out, _) = timed(lambda: gdn_ops.get(name)(*args), device, reps)
        ref = out if ref is None else ref
        rows.append(Row(f"gdn T={tokens}", name, None if name == gdn_ops.REFERENCE else _rel(out, ref), s * 1e3,
                        moved / bw * 1e3, f"{H} heads × {d}²"))
    return rows


def bench_moe(cfg: Architecture, tokens: int, dtype: torch.dtype, device: torch.device, bw: float,
              reps: int) -> list[Row]:
    E, Fd, n, k = cfg.hidden, cfg.expert_ffn, cfg.n_experts, cfg.n_experts_used
    gen = torch.Generator().manual_seed(0)
    bank = ExpertBank(*(torch.randn(n, *s, generator=gen).div(s[-1] ** 0.5).to(dtype).to(device)
                        for s in ((Fd, E), (Fd, E), (E, Fd))))
    x = torch.randn(tokens, E, generator=gen).to(dtype).to(device)
    row = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(tokens)]).flatten().to(device)
    token = torch.arange(tokens, device=device).repeat_interleave(k)
    weight = torch.rand(tokens * k, generator=gen).to(device)
    used = int(torch.unique(row).numel())
    moved = used * 3 * E * Fd * bank.gate.element_size() + 2 * tokens * E * x.element_size()
    rows, ref = [], None
    # the bank here is dense: a variant that reads GGUF blocks is measured by the quantized-kernel tests instead
    for name in [moe_ops.REFERENCE, *(v for v in moe_ops.VARIANTS
                                      if v != moe_ops.REFERENCE and v not in moe_ops.READS_BLOCKS)]:
        s, out = timed(lambda: moe_ops.get(name)(x, token, row, weight, bank), device, reps)
        ref = out if ref is None else ref
        detail = f"{used} experts used; " + (implementation(x, bank) if name == "grouped" else "per token")
        rows.append(Row(f"moe N={tokens}", name, None if name == moe_ops.REFERENCE else _rel(out, ref), s * 1e3,
                        moved / bw * 1e3, detail))
    return rows


def decode_bytes(cfg: Architecture, engine: ReferenceEngine) -> int:
    """Weights one decoded token must read: everything but the embedding table and the unused experts."""
    embed = engine.model.w.embed
    table = embed.raw if isinstance(embed, QuantWeight) else embed
    return (engine.other_bytes - table.numel() * table.element_size()
            + cfg.n_layers * cfg.n_experts_used * engine.experts.expert_bytes)


def bench_engine(model: Path, options: EngineOptions, n_prompt: int, n_gen: int, reps: int, bw: float,
                 variants: list[tuple[str, str]]) -> list[Row]:
    """Prefill and decode of the whole model per (gdn, moe) variant; the first variant is the reference."""
    cached = options.device == "cuda" and options.expert_slots > 0
    cfg, weights = load(model, options.dtype, decode_on=options.device, pin_experts=cached,
                        keep_quant=options.weights == "gguf")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab, (n_prompt,), generator=gen).tolist()
    rows: list[Row] = []
    ref_logits: list[torch.Tensor] = []
    for gdn, moe in variants:
        rows += _bench_variant(cfg, weights, EngineOptions(**{**options.__dict__, "gdn": gdn, "moe": moe}), prompt,
                               n_gen, reps, bw, ref_logits)
        if options.device == "cuda":
            torch.cuda.empty_cache()  # the previous variant's resident experts are gone before the next loads
    gdn, moe = variants[-1]
    rows.append(_bench_snapshots(cfg, weights, EngineOptions(**{**options.__dict__, "gdn": gdn, "moe": moe}),
                                 prompt, bw))
    return rows


def _bench_snapshots(cfg: Architecture, weights, options: EngineOptions, prompt: list[int], bw: float) -> Row:
    """A second prompt sharing ¾ of the first resumes from a GDN/KV snapshot; its logits must equal a cold run's."""
    device = torch.device(options.device)
    shared = len(prompt) * 3 // 4
    second = prompt[:shared] + prompt[shared:][::-1]
    cold_engine = ReferenceEngine(cfg, weights, options)
    cold_s, (cold, _) = timed(lambda e=cold_engine: e.prefill(second), device, 1)
    del cold_engine  # its resident experts leave the device before the warm engine places its own
    warm_engine = ReferenceEngine(cfg, weights, EngineOptions(**{**options.__dict__, "snapshots": True}))
    warm_engine.prefill(prompt)
    _sync(device)
    t0 = time.perf_counter()
    warm, _ = warm_engine.prefill(second)
    _sync(device)
    warm_s = time.perf_counter() - t0
    st = warm_engine.snapshots.stats
    weight_bytes = warm_engine.other_bytes + warm_engine.experts.device_bytes()
    return Row("snapshot resume", f"{st.tokens_reused}/{len(second)} tokens reused", _rel(warm, cold),
               warm_s * 1e3, weight_bytes / bw * 1e3,
               f"cold {cold_s * 1e3:.1f} ms; hits {st.hits}, misses {st.misses}, saved {st.time_saved_s:.3f} s")


def _bench_variant(cfg: Architecture, weights, options: EngineOptions, prompt: list[int], n_gen: int, reps: int,
                   bw: float, ref_logits: list[torch.Tensor]) -> list[Row]:
    engine = ReferenceEngine(cfg, weights, options)
    device = torch.device(options.device)
    s_pp, (logits, _) = timed(lambda: engine.prefill(prompt), device, reps)
    err = _rel(logits, ref_logits[0]) if ref_logits else None
    if not ref_logits:
        ref_logits.append(logits)
    name = f"gdn={options.gdn} moe={options.moe}"
    weight_bytes = engine.other_bytes + engine.experts.device_bytes()
    pp = Row(f"engine pp{len(prompt)}", name, err, s_pp * 1e3, weight_bytes / bw * 1e3,
             f"{len(prompt) / s_pp:.1f} tok/s")

    def decode() -> None:
        state = engine.new_state()
        for t in prompt[:n_gen]:
            engine.decode(t, state)

    s_tg, _ = timed(decode, device, reps)
    floor = n_gen * decode_bytes(cfg, engine) / bw
    stats = engine.experts.stats
    tg = Row(f"engine tg{n_gen}", name, err, s_tg * 1e3, floor * 1e3,
             f"{n_gen / s_tg:.1f} tok/s (floor {n_gen / floor:.0f})"
             + ("" if stats.hit_rate is None else f"; expert hit rate {stats.hit_rate:.1%}")
             + (f", {stats.cpu_computed} misses computed on the host" if stats.cpu_computed else ""))
    return [pp, tg]


def run_bench(model: Path, options: EngineOptions, *, n_prompt: int = 512, n_gen: int = 32, reps: int = 3,
              engine_variants: list[tuple[str, str]] | None = None) -> tuple[float, list[Row]]:
    options.check()
    if options.torch_threads:
        torch.set_num_threads(options.torch_threads)
    device = torch.device(options.device)
    from autoinfer.refengine.loader import read_config

    cfg = read_config(model)
    bw = memory_bandwidth(device)
    dtype = torch_dtype(options.dtype)
    rows = bench_gdn(cfg, min(n_prompt, 256), device, bw, reps)
    for tokens in (1, n_prompt):
        rows += bench_moe(cfg, tokens, dtype, device, bw, reps)
    variants = engine_variants or [("naive", "loop"), ("chunk", "grouped")]
    rows += bench_engine(model, options, n_prompt, n_gen, reps, bw, variants)
    return bw, rows
