"""The Qwen3.5/3.6-MoE network (hybrid Gated DeltaNet + gated attention, routed + shared experts) in one file.

Weights follow llama.cpp's GGUF conventions (see loader.py). Layer i:
    h   = x + Mixer(RMSNorm(x))            Mixer = gated full attention on layers in cfg.attention_layers, else GDN
    out = h + MoE(RMSNorm(h))
Each residual step is fused with the norm after it (ops/norm ADD_VARIANTS), so a layer hands the next its output and
that output already normed.
Norms, softmaxes, the conv and the delta-rule recurrence run in fp32; matmuls in the weights' dtype (or, for weights
kept in GGUF blocks, fp32 accumulation of the activations' dtype).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from autoinfer.model.arch import Architecture
from autoinfer.refengine.loader import AttentionWeights, GdnWeights, ModelWeights, MoeWeights
from autoinfer.refengine.ops import gdn as gdn_ops
from autoinfer.refengine.ops import moe as moe_ops
from autoinfer.refengine.ops import norm as norm_ops
from autoinfer.refengine.ops import route as route_ops
from autoinfer.refengine.ops.attention.triton_decode import triton_attention_decode
from autoinfer.refengine.ops.gdn.fused_decode import fused_gdn_decode
from autoinfer.refengine.ops.quant.gemv import qgemv
from autoinfer.refengine.ops.quant.kernels import GEMV_MAX_ROWS, dequantize, qlinear
from autoinfer.refengine.ops.quant.qweight import QuantWeight
from autoinfer.refengine.state import GdnState, KVCache, SequenceState

L2_EPS = 1e-6  # q/k L2 norm of the GDN layers (as in the FLA kernels and HF)
# A prompt chunk's attention scores (fp32) are computed in blocks of query rows no larger than this. Whole, they grow
# with the keys held: at a 32768-token static state one 512-token chunk's were 1 GiB, with more copies for the mask and
# softmax (benchmarks/results/contest-h100-ctx32768.md: peaks 4.7 GiB above the device plan on an H100).
SCORES_BLOCK_BYTES = 64 * 2**20


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of query rows q [Hkv, R, D] at `positions` [R] over keys and values [Hkv, S, D], all
    fp32: each row sees the keys at or before its position (a static state's later ones are empty)."""
    scores = (q @ keys.transpose(1, 2)) / math.sqrt(q.shape[-1])  # [Hkv, R, S]
    visible = torch.arange(keys.shape[1], device=q.device)[None, :] <= positions[:, None]
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ values


def linear(x: torch.Tensor, w: torch.Tensor | QuantWeight) -> torch.Tensor:
    """x @ wᵀ, for a dense weight or one kept in its GGUF blocks (then a Triton kernel decodes it on the fly)."""
    return qlinear(x, w) if isinstance(w, QuantWeight) else x @ w.T


def embed(table: torch.Tensor | QuantWeight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of the embedding table; a table kept in GGUF blocks decodes only those rows."""
    return dequantize(table[ids], dtype) if isinstance(table, QuantWeight) else table[ids]


def glu(x: torch.Tensor, gate: torch.Tensor | QuantWeight, up: torch.Tensor | QuantWeight) -> torch.Tensor:
    """SiLU(x gateᵀ) ⊙ (x upᵀ); one kernel for both when they are GGUF blocks and x is a decode step."""
    if isinstance(gate, QuantWeight) and x.shape[0] <= GEMV_MAX_ROWS:
        return qgemv(x, gate, up=up)
    return F.silu(linear(x, gate)) * linear(x, up)


def fuse_projections(weights: ModelWeights) -> ModelWeights:
    """Layers whose input projections (GDN: qkv, z, β, α; attention: q, k, v) are kept in GGUF blocks of one type
    and width: those stacked into one matrix (in_proj) and each made a view of its rows, so a decode step reads them
    in one GEMV launch instead of three or four. The stacked bytes replace the separate ones (no copy stays)."""
    layers = []
    for layer in weights.layers:
        m = layer.mixer
        names = ("qkv", "z", "beta", "alpha") if isinstance(m, GdnWeights) else ("q", "k", "v")
        parts = [getattr(m, name) for name in names]
        if all(isinstance(p, QuantWeight) and (p.qtype, p.shape[-1]) == (parts[0].qtype, parts[0].shape[-1])
               for p in parts):
            raw = torch.cat([p.raw for p in parts])
            views, start = {}, 0
            for name, p in zip(names, parts):
                views[name] = QuantWeight(raw[start:start + p.shape[0]], p.qtype, p.shape)
                start += p.shape[0]
            m = replace(m, **views, in_proj=QuantWeight(raw, parts[0].qtype, (start, parts[0].shape[-1])))
            layer = replace(layer, mixer=m)
        layers.append(layer)
    return replace(weights, layers=tuple(layers))


class Qwen35Moe:
    """Stateless over sequences: every call takes and updates a SequenceState."""

    def __init__(self, cfg: Architecture, weights: ModelWeights, experts, *, dtype: torch.dtype, gdn: str = "chunk",
                 moe: str = "grouped", norm: str = "torch"):
        self.cfg, self.w, self.experts = cfg, fuse_projections(weights), experts
        self.gdn_fn, self.moe_fn, self.norm = gdn_ops.get(gdn), moe_ops.get(moe), norm_ops.get(norm)
        self.add_norm = norm_ops.get_add(norm)
        # Triton routing with the Triton experts (both need CUDA or the interpreter), torch's otherwise.
        self.route = route_ops.get("triton" if moe in moe_ops.READS_BLOCKS else route_ops.REFERENCE)
        self.tokens: dict[int, torch.Tensor] = {}
        # Triton GDN variants fuse a whole decode step, and attention's (ops/attention) with them
        self.triton_decode = gdn in gdn_ops.TRITON
        self.dtype, self.device = dtype, weights.out_norm.device
        half = cfg.rope_dims // 2
        self.inv_freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64, device=self.device) / half)

    def new_state(self, capacity: int = 256, static: bool = False) -> SequenceState:
        return SequenceState.empty(self.cfg, self.device, self.dtype, capacity, static)

    def forward(self, tokens: list[int], state: SequenceState, all_logits: bool = False) -> torch.Tensor:
        """Consume `tokens` after what `state` holds; logits [T, V] (or [1, V] for the last token) in fp32."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(state.position, state.position + len(tokens), device=self.device)
        logits = self.step(ids, positions, state, all_logits)
        state.advance(tokens)
        return logits

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, state: SequenceState,
             all_logits: bool = False) -> torch.Tensor:
        """The network on device tensors: token ids and their positions in, logits out, the state's caches updated
        in place. Reads no value back to the host, so with a static state and capture-safe op variants it can be
        recorded as a CUDA graph (graphs.py)."""
        cfg, layers = self.cfg, self.w.layers
        x = embed(self.w.embed, ids, self.dtype)
        normed = self.norm(x, layers[0].attn_norm, cfg.rms_eps, self.dtype)
        for i, layer in enumerate(layers):
            if isinstance(layer.mixer, AttentionWeights):
                mixed = self.attention(normed, layer.mixer, state.layers[i], positions)
            else:
                mixed = self.gated_deltanet(normed, layer.mixer, state.layers[i])
            x, normed = self.add_norm(x, mixed, layer.post_norm, cfg.rms_eps, self.dtype)
            routed, shared, gate = self.moe(normed, layer.moe, i)
            after = layers[i + 1].attn_norm if i + 1 < len(layers) else self.w.out_norm  # the next norm
            x, normed = self.add_norm(x, routed, after, cfg.rms_eps, self.dtype, shared=shared, gate=gate)
        if not all_logits:
            normed = normed[-1:]
        return linear(normed, self.w.lm_head).float()

    # --- gated full attention -------------------------------------------------------------------------------
    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """NeoX-style rotary embedding on the first rope_dims dims of each head; x [T, heads, D]."""
        angles = positions[:, None].double() * self.inv_freq[None, :]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
        half = self.cfg.rope_dims // 2
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def attention(self, x: torch.Tensor, w: AttentionWeights, cache: KVCache, positions: torch.Tensor) -> torch.Tensor:
        cfg, T = self.cfg, x.shape[0]
        if T == 1 and self.triton_decode:  # a decode step with the Triton kernels: norms to gate in 3 launches
            if w.in_proj is not None:
                qg, k, v = linear(x, w.in_proj).split([w.q.shape[0], w.k.shape[0], w.v.shape[0]], dim=-1)
            else:
                qg, k, v = linear(x, w.q), linear(x, w.k), linear(x, w.v)
            cache.reserve(1)
            out = triton_attention_decode(qg, k, v, w.q_norm, w.k_norm, self.inv_freq, cfg.rms_eps, cache.k, cache.v,
                                          positions)
            return linear(out, w.o)
        qg = (linear(x, w.q)).view(T, cfg.n_heads, 2 * cfg.head_dim)
        q, gate = qg[..., :cfg.head_dim], qg[..., cfg.head_dim:].reshape(T, -1)
        q = self.rope(self.norm(q, w.q_norm, cfg.rms_eps), positions)
        k = self.rope(self.norm(linear(x, w.k).view(T, cfg.n_kv_heads, cfg.head_dim), w.k_norm, cfg.rms_eps),
                      positions)
        v = linear(x, w.v).view(T, cfg.n_kv_heads, cfg.head_dim)
        keys, values = cache.append(k.transpose(0, 1).to(self.dtype), v.transpose(0, 1), positions)  # [Hkv, S, D]
        if T > 1:  # a prompt chunk (never in a CUDA graph) reads only the positions a static state holds so far
            keys, values = keys[:, :cache.length], values[:, :cache.length]
        keys, values = keys.float(), values.float()
        # Grouped-query attention: the rep query heads of kv head j (heads j·rep .. j·rep + rep − 1) are one batch.
        rep, S = cfg.n_heads // cfg.n_kv_heads, keys.shape[1]
        q, rows = q.transpose(0, 1).reshape(cfg.n_kv_heads, rep * T, cfg.head_dim), positions.repeat(rep)
        block = max(1, SCORES_BLOCK_BYTES // (cfg.n_kv_heads * S * 4))
        out = torch.cat([attend(q[:, i:i + block], keys, values, rows[i:i + block]) for i in range(0, rep * T, block)],
                        dim=1)
        out = out.view(cfg.n_heads, T, cfg.head_dim).transpose(0, 1).reshape(T, -1)
        return linear((out * torch.sigmoid(gate.float())).to(self.dtype), w.o)

    # --- Gated DeltaNet ---------------------------------------------------------------------------------------
    def gated_deltanet(self, x: torch.Tensor, w: GdnWeights, state: GdnState) -> torch.Tensor:
        cfg, T = self.cfg, x.shape[0]
        Hk, Hv, d = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
        if T == 1 and self.triton_decode:  # everything between the projections and the output norm, fused
            if w.in_proj is not None:  # the four input projections in one launch
                sizes = [w.qkv.shape[0], w.z.shape[0], w.beta.shape[0], w.alpha.shape[0]]
                qkv, z, b, a = linear(x, w.in_proj).split(sizes, dim=-1)
            else:
                qkv, z, b, a = linear(x, w.qkv), linear(x, w.z), linear(x, w.beta), linear(x, w.alpha)
            out = fused_gdn_decode(qkv, state.conv, w.conv, b, a, w.dt_bias, w.a, state.recurrent, Hk)
        else:
            out, z = self.gdn_core(x, w, state), linear(x, w.z)
        z = z.reshape(T, Hv, d)
        out = self.norm(out, w.norm, cfg.rms_eps, self.dtype, gate=z)  # RMSNorm(o) ⊙ SiLU(z) per head
        return linear(out.reshape(T, -1), w.out)

    def gdn_core(self, x: torch.Tensor, w: GdnWeights, state: GdnState) -> torch.Tensor:
        """Causal conv, SiLU, L2 norms and gates, then the gated delta rule: o [T, Hv, dv] fp32."""
        cfg, T = self.cfg, x.shape[0]
        Hk, Hv, d = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
        mixed = torch.cat([state.conv, linear(x, w.qkv).float()])  # [K−1+T, C]: the causal window
        state.conv.copy_(mixed[-(cfg.conv_kernel - 1):])  # caches are updated in place (static states)
        windows = mixed.unfold(0, cfg.conv_kernel, 1)  # [T, C, K]
        qkv = F.silu((windows * w.conv).sum(-1))
        q, k, v = qkv.split([cfg.gdn_key_dim, cfg.gdn_key_dim, cfg.gdn_value_dim], dim=-1)
        # Value heads are in tiled order: value head j reads key head j mod Hk.
        q = l2_norm(q.view(T, Hk, d)).repeat(1, Hv // Hk, 1) / math.sqrt(d)
        k = l2_norm(k.view(T, Hk, d)).repeat(1, Hv // Hk, 1)
        v = v.view(T, Hv, d)
        beta = torch.sigmoid(linear(x, w.beta).float())
        g = w.a * F.softplus(linear(x, w.alpha).float() + w.dt_bias)  # log decay, ≤ 0
        out, recurrent = self.gdn_fn(q, k, v, g, beta, state.recurrent)
        state.recurrent.copy_(recurrent)
        return out

    # --- mixture of experts ----------------------------------------------------------------------------------
    def moe(self, x: torch.Tensor, w: MoeWeights,
            layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(routed experts' sum [T, E] fp32, shared expert [T, E], its gate σ(x · shared_gate_inp) [T]): the MoE
        output is routed + gate · shared, which the residual step after it forms."""
        k = self.cfg.n_experts_used
        expert, weight, gate = self.route(x, w.router, w.shared_gate_inp, k)
        routed = self.experts.run(layer, x, self.token_of(x.shape[0]), expert.flatten(), weight.flatten(),
                                  self.moe_fn)
        for ahead in range(layer + 1, min(layer + 1 + self.experts.prefetch, len(self.w.layers))):
            # The next layers' routers applied to this layer's input predict most of their choices.
            nxt = self.w.layers[ahead].moe
            predicted = self.route(x, nxt.router, nxt.shared_gate_inp, k)[0]
            self.experts.prefetch_layer(ahead, torch.unique(predicted).tolist())
        shared = linear(glu(x, w.shared_gate, w.shared_up), w.shared_down)
        return routed, shared, gate

    def token_of(self, n: int) -> torch.Tensor:
        """The token of each of the n·k routing choices (0, …, 0, 1, …): made once per n (a decode step's is part of
        its CUDA graph's inputs)."""
        if n not in self.tokens:
            k = self.cfg.n_experts_used
            self.tokens[n] = torch.arange(n * k, device=self.device) // k
        return self.tokens[n]
