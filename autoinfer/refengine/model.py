"""The Qwen3.5/3.6-MoE network (hybrid Gated DeltaNet + gated attention, routed + shared experts) in one file.

Weights follow llama.cpp's GGUF conventions (see loader.py). Layer i:
    h   = x + Mixer(RMSNorm(x))            Mixer = gated full attention on layers in cfg.attention_layers, else GDN
    out = h + MoE(RMSNorm(h))
Norms, softmaxes, the conv and the delta-rule recurrence run in fp32; matmuls in the weights' dtype (or, for weights
kept in GGUF blocks, fp32 accumulation of the activations' dtype).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autoinfer.model.arch import Architecture
from autoinfer.refengine.loader import AttentionWeights, GdnWeights, ModelWeights, MoeWeights
from autoinfer.refengine.ops import gdn as gdn_ops
from autoinfer.refengine.ops import moe as moe_ops
from autoinfer.refengine.ops import norm as norm_ops
from autoinfer.refengine.ops.gdn.fused_decode import fused_gdn_decode
from autoinfer.refengine.ops.quant.gemv import qgemv
from autoinfer.refengine.ops.quant.kernels import GEMV_MAX_ROWS, dequantize, qlinear
from autoinfer.refengine.ops.quant.qweight import QuantWeight
from autoinfer.refengine.state import GdnState, KVCache, SequenceState

L2_EPS = 1e-6  # q/k L2 norm of the GDN layers (as in the FLA kernels and HF)


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


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


class Qwen35Moe:
    """Stateless over sequences: every call takes and updates a SequenceState."""

    def __init__(self, cfg: Architecture, weights: ModelWeights, experts, *, dtype: torch.dtype, gdn: str = "chunk",
                 moe: str = "grouped", norm: str = "torch"):
        self.cfg, self.w, self.experts = cfg, weights, experts
        self.gdn_fn, self.moe_fn, self.norm = gdn_ops.get(gdn), moe_ops.get(moe), norm_ops.get(norm)
        self.fused_gdn_decode = gdn in gdn_ops.TRITON  # Triton GDN variants fuse a whole decode step
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
        x = embed(self.w.embed, ids, self.dtype)
        for i, layer in enumerate(self.w.layers):
            normed = self.norm(x, layer.attn_norm, self.cfg.rms_eps, self.dtype)
            if isinstance(layer.mixer, AttentionWeights):
                mixed = self.attention(normed, layer.mixer, state.layers[i], positions)
            else:
                mixed = self.gated_deltanet(normed, layer.mixer, state.layers[i])
            x = x + mixed.to(x.dtype)
            normed = self.norm(x, layer.post_norm, self.cfg.rms_eps, self.dtype)
            x = x + self.moe(normed, layer.moe, i).to(x.dtype)
        if not all_logits:
            x = x[-1:]
        return linear(self.norm(x, self.w.out_norm, self.cfg.rms_eps, self.dtype), self.w.lm_head).float()

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
        qg = (linear(x, w.q)).view(T, cfg.n_heads, 2 * cfg.head_dim)
        q, gate = qg[..., :cfg.head_dim], qg[..., cfg.head_dim:].reshape(T, -1)
        q = self.rope(self.norm(q, w.q_norm, cfg.rms_eps), positions)
        k = self.rope(self.norm(linear(x, w.k).view(T, cfg.n_kv_heads, cfg.head_dim), w.k_norm, cfg.rms_eps),
                      positions)
        v = linear(x, w.v).view(T, cfg.n_kv_heads, cfg.head_dim)
        keys, values = cache.append(k.transpose(0, 1).to(self.dtype), v.transpose(0, 1), positions)  # [Hkv, S, D]
        # Grouped-query attention: the rep query heads of kv head j (heads j·rep .. j·rep + rep − 1) are one batch.
        rep, S = cfg.n_heads // cfg.n_kv_heads, keys.shape[1]
        q = q.transpose(0, 1).reshape(cfg.n_kv_heads, rep * T, cfg.head_dim)
        scores = (q @ keys.float().transpose(1, 2)) / math.sqrt(cfg.head_dim)  # [Hkv, rep·T, S]
        visible = torch.arange(S, device=x.device)[None, :] <= positions.repeat(rep)[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out = (probs @ values.float()).view(cfg.n_heads, T, cfg.head_dim).transpose(0, 1).reshape(T, -1)
        return linear((out * torch.sigmoid(gate.float())).to(self.dtype), w.o)

    # --- Gated DeltaNet ---------------------------------------------------------------------------------------
    def gated_deltanet(self, x: torch.Tensor, w: GdnWeights, state: GdnState) -> torch.Tensor:
        cfg, T = self.cfg, x.shape[0]
        Hk, Hv, d = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
        if T == 1 and self.fused_gdn_decode:  # everything between the projections and the output norm, fused
            out = fused_gdn_decode(linear(x, w.qkv), state.conv, w.conv, linear(x, w.beta), linear(x, w.alpha),
                                   w.dt_bias, w.a, state.recurrent, Hk)
        else:
            out = self.gdn_core(x, w, state)
        z = linear(x, w.z).view(T, Hv, d)
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
    def route(self, x: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = (x.float() @ router.T).softmax(-1)
        top, idx = probs.topk(self.cfg.n_experts_used, dim=-1)
        return top / top.sum(-1, keepdim=True), idx

    def moe(self, x: torch.Tensor, w: MoeWeights, layer: int) -> torch.Tensor:
        weight, expert = self.route(x, w.router)
        token = torch.arange(expert.numel(), device=x.device) // self.cfg.n_experts_used  # token of each choice
        routed = self.experts.run(layer, x, token, expert.flatten(), weight.flatten(), self.moe_fn)
        for ahead in range(layer + 1, min(layer + 1 + self.experts.prefetch, len(self.w.layers))):
            # The next layers' routers applied to this layer's input predict most of their choices.
            predicted = self.route(x, self.w.layers[ahead].moe.router)[1]
            self.experts.prefetch_layer(ahead, torch.unique(predicted).tolist())
        shared = linear(glu(x, w.shared_gate, w.shared_up), w.shared_down)
        return routed + torch.sigmoid(x.float() @ w.shared_gate_inp)[:, None] * shared.float()
