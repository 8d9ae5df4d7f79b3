"""Every op variant against its naive reference on fresh random inputs, with the error bound stated per dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoinfer.refengine.ops import gdn, moe
from autoinfer.refengine.ops.moe import ExpertBank
from autoinfer.refengine.ops.moe.grouped import grouped_experts

# Relative error = max|variant − reference| / max|reference|.
GDN_BOUND = 1e-5  # fp32 only: the recurrence always runs in fp32
MOE_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def gdn_inputs(T: int, H: int = 4, dk: int = 16, dv: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(T, H, dk, generator=gen), dim=-1) / dk**0.5
    k = F.normalize(torch.randn(T, H, dk, generator=gen), dim=-1)
    v = torch.randn(T, H, dv, generator=gen)
    g = -torch.rand(T, H, generator=gen) * 2  # strong and weak decays
    beta = torch.rand(T, H, generator=gen)
    state = torch.randn(H, dk, dv, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_gdn_matches_recurrent(T):
    args = gdn_inputs(T, seed=T)
    ref_out, ref_state = gdn.get(gdn.REFERENCE)(*args)
    out, state = gdn.get("chunk")(*args)
    assert out.shape == ref_out.shape and state.shape == ref_state.shape
    assert rel(out, ref_out) <= GDN_BOUND
    assert rel(state, ref_state) <= GDN_BOUND


@pytest.mark.parametrize("T", [1, 5, 70])
@pytest.mark.parametrize("dk, dv", [(16, 32), (24, 40)])  # 24/40: not powers of two, so the masks are exercised
def test_fused_recurrent_gdn_kernel_matches_recurrent(T, dk, dv):
    args = gdn_inputs(T, dk=dk, dv=dv, seed=T + dk)
    before = args[-1].clone()
    ref_out, ref_state = gdn.get(gdn.REFERENCE)(*args)
    out, state = gdn.get("fused_recurrent")(*args)
    assert out.shape == ref_out.shape and state.shape == ref_state.shape
    assert rel(out, ref_out) <= GDN_BOUND
    assert rel(state, ref_state) <= GDN_BOUND
    assert torch.equal(args[-1], before)  # the input state is left as it was: the kernel writes a new one


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_triton_chunk_gdn_kernel_matches_recurrent(T):
    """Tails shorter than a chunk, exactly one chunk, and a state carried over several chunks."""
    args = gdn_inputs(T, seed=T + 1)
    before = args[-1].clone()
    ref_out, ref_state = gdn.get(gdn.REFERENCE)(*args)
    out, state = gdn.get("triton_chunk")(*args)
    assert out.shape == ref_out.shape and state.shape == ref_state.shape
    assert rel(out, ref_out) <= GDN_BOUND
    assert rel(state, ref_state) <= GDN_BOUND
    assert torch.equal(args[-1], before)


@pytest.mark.parametrize("variant", ["chunk", "triton_chunk"])
def test_chunked_gdn_resumes_from_its_own_state(variant):
    q, k, v, g, beta, state = gdn_inputs(130, seed=7)
    whole, _ = gdn.get(variant)(q, k, v, g, beta, state)
    first, mid = gdn.get(variant)(q[:64], k[:64], v[:64], g[:64], beta[:64], state)
    second, _ = gdn.get(variant)(q[64:], k[64:], v[64:], g[64:], beta[64:], mid)
    assert rel(torch.cat([first, second]), whole) <= GDN_BOUND


def moe_inputs(N: int, dtype: torch.dtype, rows: int = 8, k: int = 2, E: int = 64, Fd: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, E, generator=gen).to(dtype)
    bank = ExpertBank(*(torch.randn(rows, *s, generator=gen).div(s[-1] ** 0.5).to(dtype)
                        for s in ((Fd, E), (Fd, E), (E, Fd))))
    token = torch.arange(N).repeat_interleave(k)
    row = torch.stack([torch.randperm(rows, generator=gen)[:k] for _ in range(N)]).flatten()
    weight = torch.rand(N * k, generator=gen)
    return x, token, row, weight, bank


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ["grouped_mm", "padded_bmm"])
@pytest.mark.parametrize("N", [1, 37])
def test_grouped_moe_matches_per_token_loop(dtype, impl, N):
    args = moe_inputs(N, dtype, seed=N)
    if impl == "grouped_mm":
        from autoinfer.refengine.ops.moe.grouped import implementation

        if implementation(args[0], args[4]) != "grouped_mm":
            pytest.skip(f"torch.nn.functional.grouped_mm does not run {dtype} on this device")
    ref = moe.get(moe.REFERENCE)(*args)
    out = grouped_experts(*args, impl=impl)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert rel(out, ref) <= MOE_BOUND[dtype]


def test_grouped_moe_splits_banks_beyond_the_group_limit(monkeypatch):
    """Banks with more rows than one grouped_mm call accepts (large expert caches) are cut into calls."""
    from autoinfer.refengine.ops.moe import grouped

    args = moe_inputs(37, torch.float32, rows=8, seed=11)
    if grouped.implementation(args[0], args[4]) != "grouped_mm":
        pytest.skip("torch.nn.functional.grouped_mm does not run float32 on this device")
    whole = grouped_experts(*args, impl="grouped_mm")
    monkeypatch.setattr(grouped, "MAX_GROUPS", 3)
    split = grouped_experts(*args, impl="grouped_mm")
    assert rel(split, moe.get(moe.REFERENCE)(*args)) <= MOE_BOUND[torch.float32]
    assert rel(split, whole) <= 1e-6


def test_loop_reference_is_the_moe_definition():
    x, token, row, weight, bank = moe_inputs(3, torch.float32, seed=3)
    expected = torch.zeros_like(x)
    for a in range(token.shape[0]):
        t, r = int(token[a]), int(row[a])
        h = F.silu(bank.gate[r] @ x[t]) * (bank.up[r] @ x[t])
        expected[t] += weight[a] * (bank.down[r] @ h)
    assert rel(moe.get("loop")(x, token, row, weight, bank), expected) <= 1e-6


@pytest.mark.parametrize("shape, gated", [((3, 256), False), ((2, 4, 40), True), ((1, 2048), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rms_norm_matches_torch(shape, gated, dtype):
    from autoinfer.refengine.ops import norm

    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    weight = torch.rand(shape[-1], generator=gen) + 0.5
    gate = torch.randn(*shape, generator=gen).to(dtype) if gated else None
    ref = norm.get(norm.REFERENCE)(x, weight, 1e-6, dtype, gate=gate)
    out = norm.get("triton")(x, weight, 1e-6, dtype, gate=gate)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel(out.float(), ref.float()) <= (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("Hk, Hv, d, KW", [(2, 4, 16, 4), (1, 2, 32, 3)])
def test_fused_gdn_decode_matches_the_torch_step(Hk, Hv, d, KW):
    """Conv over the window, SiLU, L2 norms, gates and one recurrence step, as model.gdn_core does them in torch."""
    from autoinfer.refengine.ops.gdn.fused_decode import fused_gdn_decode

    gen = torch.Generator().manual_seed(Hv + KW)
    key, value = Hk * d, Hv * d
    C = 2 * key + value
    qkv, b, alpha = torch.randn(1, C, generator=gen), torch.randn(1, Hv, generator=gen), torch.randn(1, Hv, generator=gen)
    conv, weight = torch.randn(KW - 1, C, generator=gen), torch.randn(C, KW, generator=gen) * 0.5
    dt_bias, a = torch.randn(Hv, generator=gen), -torch.rand(Hv, generator=gen) * 3
    state = torch.randn(Hv, d, d, generator=gen)

    window = torch.cat([conv, qkv])  # the torch path of model.gdn_core for T = 1
    act = F.silu((window.T * weight).sum(-1))
    q, k, v = act.split([key, key, value])
    q = F.normalize(q.view(Hk, d), dim=-1, eps=0).repeat(Hv // Hk, 1)[None] / d**0.5
    k = F.normalize(k.view(Hk, d), dim=-1, eps=0).repeat(Hv // Hk, 1)[None]
    g = a * F.softplus(alpha + dt_bias)
    ref_out, ref_state = gdn.get("naive")(q, k, v.view(1, Hv, d), g, torch.sigmoid(b), state)

    conv_state, recurrent = conv.clone(), state.clone()
    out = fused_gdn_decode(qkv, conv_state, weight, b, alpha, dt_bias, a, recurrent, Hk)
    assert rel(out, ref_out) <= 1e-5 and rel(recurrent, ref_state) <= 1e-5
    assert torch.equal(conv_state, window[1:])  # the window moved on by the new token


@pytest.mark.parametrize("n_experts, E, k", [(256, 2048, 8), (12, 40, 3)])
def test_triton_route_matches_torch(n_experts, E, k):
    """Top-k experts (descending), their renormalised probabilities and the shared expert's gate, for one token."""
    from autoinfer.refengine.ops import route

    gen = torch.Generator().manual_seed(n_experts)
    x = torch.randn(1, E, generator=gen).to(torch.bfloat16)
    router, gate = torch.randn(n_experts, E, generator=gen) * 0.05, torch.randn(E, generator=gen) * 0.05
    ref_expert, ref_weight, ref_gate = route.get(route.REFERENCE)(x, router, gate, k)
    expert, weight, gate_out = route.get("triton")(x, router, gate, k)
    assert torch.equal(expert, ref_expert) and expert.dtype == torch.int64
    assert rel(weight, ref_weight) <= 1e-5 and rel(gate_out, ref_gate) <= 1e-5
    assert weight.shape == (1, k) and gate_out.shape == (1,)


@pytest.mark.parametrize("shape, shared", [((3, 256), False), ((1, 2048), True), ((2, 40), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_add_rms_norm_matches_torch(shape, shared, dtype):
    """The residual step (with the σ-gated shared expert of an MoE output) and the norm after it, in one kernel."""
    from autoinfer.refengine.ops import norm

    gen = torch.Generator().manual_seed(shape[-1] + shared)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    update = torch.randn(*shape, generator=gen) if shared else torch.randn(*shape, generator=gen).to(dtype)
    weight = torch.rand(shape[-1], generator=gen) + 0.5
    extra = dict(shared=torch.randn(*shape, generator=gen).to(dtype), gate=torch.rand(shape[0], generator=gen)) \
        if shared else {}
    ref_h, ref = norm.get_add(norm.REFERENCE)(x, update, weight, 1e-6, dtype, **extra)
    h, out = norm.get_add("triton")(x, update, weight, 1e-6, dtype, **extra)
    assert h.dtype == x.dtype and out.dtype == dtype and out.shape == x.shape
    bound = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: one rounding step (the interpreter truncates)
    assert rel(h.float(), ref_h.float()) <= bound and rel(out.float(), ref.float()) <= bound


@pytest.mark.parametrize("row_bytes", [(576, 576, 288), (34, 34, 70), (7, 7, 9)])  # words of 4, 2 and 1 bytes
def test_expert_fetch_kernel_matches_torch(row_bytes):
    """Hits read their slot; the r-th miss is copied from host storage into spare r; choices and rows are logged."""
    from autoinfer.refengine.cache.fetch import fetch_experts, fetch_naive

    gen = torch.Generator().manual_seed(sum(row_bytes))
    n_experts, slots = 10, 9
    host = [torch.randint(0, 256, (n_experts, 3, b), generator=gen, dtype=torch.uint8) for b in row_bytes]
    table = torch.full((n_experts,), -1, dtype=torch.int32)
    table[torch.tensor([1, 4, 7])] = torch.tensor([5, 0, 2], dtype=torch.int32)
    expert = torch.tensor([4, 3, 7, 9])  # hit, miss, hit, miss
    spare = torch.tensor([8, 3, 6, 1], dtype=torch.int32)
    outs = []
    for fn in (fetch_naive, fetch_experts):
        pool = [torch.randint(0, 256, (slots, *t.shape[1:]), generator=gen, dtype=torch.uint8) for t in host]
        before = [t.clone() for t in pool]
        log = torch.full((2, 4), -7)
        rows = fn(expert, table, host, pool, spare, log)
        outs.append((rows, pool, before, log))
    (ref_rows, ref_pool, ref_before, ref_log), (rows, pool, before, log) = outs
    assert rows.tolist() == ref_rows.tolist() == [0, 8, 2, 3]
    assert torch.equal(log, ref_log) and log[0].tolist() == expert.tolist() and log[1].tolist() == rows.tolist()
    for t, b, src in zip(pool, before, host):
        assert torch.equal(t[8], src[3]) and torch.equal(t[3], src[9])
        untouched = [r for r in range(slots) if r not in (8, 3)]
        assert torch.equal(t[untouched], b[untouched])


@pytest.mark.parametrize("H, Hkv, D, half, cap, position", [(4, 2, 64, 16, 40, 0), (4, 1, 32, 8, 70, 37),
                                                             (2, 2, 32, 16, 16, 15)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_decode_matches_torch(H, Hkv, D, half, cap, position, dtype):
    """Norms, rotary, the cache writes at the position, attention over positions ≤ it and the output gate."""
    from autoinfer.refengine.ops import attention

    gen = torch.Generator().manual_seed(H + D + position)
    qg, k, v = (torch.randn(1, n, generator=gen).to(dtype) for n in (H * 2 * D, Hkv * D, Hkv * D))
    q_norm, k_norm = torch.rand(D, generator=gen) + 0.5, torch.rand(D, generator=gen) + 0.5
    inv_freq = 1e6 ** (-torch.arange(half, dtype=torch.float64) / half)
    caches = (torch.randn(Hkv, cap, D, generator=gen).to(dtype), torch.randn(Hkv, cap, D, generator=gen).to(dtype))
    pos = torch.tensor([position])
    outs = []
    for name in ("naive", "triton"):
        ck, cv = (c.clone() for c in caches)
        outs.append((attention.VARIANTS[name](qg, k, v, q_norm, k_norm, inv_freq, 1e-6, ck, cv, pos), ck, cv))
    (ref, ref_k, ref_v), (out, ck, cv) = outs
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and out.shape == (1, H * D)
    assert rel(out.float(), ref.float()) <= bound and rel(ck.float(), ref_k.float()) <= bound
    assert torch.equal(cv, ref_v)
