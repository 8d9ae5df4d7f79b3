"""The reference engine's Triton kernels compiled for an H100 (sm_90) on any machine, no GPU needed: registers,
spills (local-memory loads/stores), shared memory, the widest global loads and the matrix instructions, per kernel
and tile configuration. What costs no device time: a kernel that spills, or whose weight loads are not 16 bytes
wide, is fixed before it is timed.

    python benchmarks/kernel_resources.py

Needs Triton's NVIDIA backend (ptxas and cuobjdump ship in the triton wheel); TRITON_INTERPRET must be unset.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from autoinfer.refengine.ops.gdn import triton_chunk
from autoinfer.refengine.ops.quant import gemv, kernels

TARGET = GPUTarget("cuda", 90, 32)
_INTS_ALIGNED = {"row_bytes", "x_stride", "out_stride", "N"}  # multiples of 16 for the model's shapes


def compile_kernel(kernel, pointers: dict[str, str], constants: dict, warps: int, stages: int = 3,
                   floats: tuple[str, ...] = ()):
    """Compile for sm_90 with every pointer (and the row strides) marked 16-byte divisible, as at run time; the
    scalars named in `floats` are fp32, the others i32."""
    signature = {name: pointers.get(name, "constexpr" if name in constants else "fp32" if name in floats else "i32")
                 for name in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if name in pointers or name in _INTS_ALIGNED}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})


def pointer_types(kernel, **types: str) -> dict[str, str]:
    """fp32 for every `*_ptr` argument of `kernel`, but the types given (which may also name other arguments)."""
    return {name: types.get(name, "*fp32") for name in kernel.arg_names if name.endswith("_ptr") or name in types}


def report(compiled) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as fh:
        fh.write(compiled.asm["cubin"])
    try:
        usage = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "--dump-sass", fh.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(fh.name)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    loads = Counter(re.findall(r"\bLDG\.E(?:\.(\d+|U8|U16|64|128))?", sass))
    mma = sorted(set(re.findall(r"\b(HGMMA\.\w+|HMMA\.\w+)", sass)))
    spills = len(re.findall(r"\bLDL", sass)), len(re.findall(r"\bSTL", sass))
    return (f"regs {regs.group(1) if regs else '?'}, stack {stack.group(1) if stack else '?'} B, "
            f"LDL/STL {spills[0]}/{spills[1]}, "
            f"smem {compiled.metadata.shared} B, loads {dict(loads)}, mma {mma or '-'}")


def gemv_rows() -> list[tuple[str, str]]:
    out = []
    for qtype in ("Q8_0", "Q4_K", "Q6_K"):
        words = "*i32" if qtype == "Q4_K" else "*u8"
        pointers = {"x_ptr": "*bf16", "w8": "*u8", "w16": "*i16", "w32": words, "i8": "*i8", "f16": "*fp16",
                    "v8": "*u8", "v16": "*i16", "v32": words, "vi8": "*i8", "vf16": "*fp16", "ids_ptr": "*i64",
                    "coef_ptr": "*fp32", "out_ptr": "*fp32"}
        # (what, rows, items, blocks per row, ids, reduce, glu): the 35B-A3B decode step's shapes
        for what, n, items, n_blocks, ids, reduce, glu in (
                ("lm_head 248320x2048", 248320, 1, 8, False, False, False),
                ("attn q 8192x2048", 8192, 1, 8, False, False, False),
                ("experts gate+up 8x512x2048", 512, 8, 8, True, False, True),
                ("experts down 8x2048x512", 2048, 8, 2, True, True, False)):
            nb = n_blocks * (8 if qtype == "Q8_0" else 1)
            cfg = gemv.default_config(qtype, n, nb, items, glu)
            constants = dict(QTYPE=gemv._QTYPE_ID[qtype], BN=cfg.rows, AP=triton.next_power_of_2(items),
                             NB=cfg.blocks, HAS_IDS=ids, REDUCE=reduce, GLU=glu, X_SHARED=not reduce)
            compiled = compile_kernel(gemv._gemv_kernel, pointers, constants, cfg.warps)
            out.append((f"qgemv {qtype} {what} (rows {cfg.rows}, blocks {cfg.blocks})", report(compiled)))
    return out


def gemm_rows() -> list[tuple[str, str]]:
    out = []
    for qtype in ("Q8_0", "Q4_K", "Q6_K"):
        qk, bb = kernels.BLOCKS[qtype]
        pointers = {"x_ptr": "*bf16", "u8": "*u8", "i8": "*i8", "f16": "*fp16", "out_ptr": "*bf16",
                    "x_rows_ptr": "*i64", "block_matrix_ptr": "*i32"}
        for bm, grouped in ((64, False), (16, True), (64, True)):
            bn = 64 if qk == 256 else 128
            constants = dict(QTYPE=kernels._QTYPE_ID[qtype], QK=qk, BB=bb, BM=bm, BN=bn, GROUPED=grouped,
                             SUB=min(32 if qtype == "Q6_K" else 64, qk))
            compiled = compile_kernel(kernels._gemm_kernel, pointers, constants, 4)
            what = "qgemm_grouped" if grouped else "qgemm"
            out.append((f"{what} {qtype} (BM {bm}, BN {bn}), bf16 activations", report(compiled)))
    return out


def gdn_rows() -> list[tuple[str, str]]:
    from autoinfer.refengine.ops.gdn import fused_decode

    pointers = pointer_types(fused_decode._decode_kernel, qkv_ptr="*bf16", b_ptr="*bf16", alpha_ptr="*bf16")
    compiled = compile_kernel(fused_decode._decode_kernel, pointers, dict(KW=4, DK=128, DV=128, BV=32), 4)
    out = [("gdn fused decode step dk=dv=128", report(compiled))]
    for kernel, constants, stages in (
            (triton_chunk._prepare_kernel, dict(DK=128, DV=128, C=64, BK=64), 3),
            (triton_chunk._state_kernel, dict(DK=128, DV=128, C=64, BV=32), 1),
            (triton_chunk._output_kernel, dict(DK=128, DV=128, C=64, BK=64, BV=64), 2)):
        compiled = compile_kernel(kernel, pointer_types(kernel, s_in="*fp32", s_out="*fp32"), constants, 4, stages)
        out.append((f"gdn triton_chunk {kernel.fn.__name__} dk=dv=128", report(compiled)))
    return out


def step_rows() -> list[tuple[str, str]]:
    """The rest of a decode step at the 35B-A3B's shapes and the tiles they launch with on a GPU: attention over the
    KV cache (16 splits), routing, the norms and the expert cache's fetch. A stack frame costs local memory for
    every thread the device can hold (2048 per multiprocessor), so a spill here would show in NVML, not in torch."""
    from autoinfer.refengine.cache import fetch
    from autoinfer.refengine.ops.attention import triton_decode as attn
    from autoinfer.refengine.ops.norm import triton_norm as norm
    from autoinfer.refengine.ops.route.triton_route import _logits_kernel, _topk_kernel

    cases = (
        ("attention decode _qk_kernel D=256", attn._qk_kernel,
         pointer_types(attn._qk_kernel, qg_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64",
                       q_out="*fp32", ck_ptr="*bf16", cv_ptr="*bf16"), dict(D=256, HALF=32), ("eps",)),
        ("attention decode _split_kernel D=256, 16 splits", attn._split_kernel,
         pointer_types(attn._split_kernel, ck_ptr="*bf16", cv_ptr="*bf16", pos_ptr="*i64"),
         dict(REP=8, D=256, BS=32, SPLITS=16), ("scale",)),
        ("attention decode _combine_kernel D=256, 16 splits", attn._combine_kernel,
         pointer_types(attn._combine_kernel, qg_ptr="*bf16", out_ptr="*bf16"), dict(D=256, SPLITS=16), ()),
        ("route _logits_kernel 256 experts (BN 2)", _logits_kernel, pointer_types(_logits_kernel, x_ptr="*bf16"),
         dict(BN=2, BE=512), ()),
        ("route _topk_kernel top 8 of 256", _topk_kernel,
         pointer_types(_topk_kernel, expert_ptr="*i64"), dict(K=8, KP=8, BLOCK=256), ()),
        ("norm _rms_norm_kernel 2048", norm._rms_norm_kernel,
         pointer_types(norm._rms_norm_kernel, x_ptr="*bf16", out_ptr="*bf16"), dict(GATED=False, BLOCK=2048), ("eps",)),
        ("norm _add_rms_norm_kernel 2048", norm._add_rms_norm_kernel,
         pointer_types(norm._add_rms_norm_kernel, x_ptr="*bf16", u_ptr="*bf16", h_ptr="*bf16", out_ptr="*bf16"),
         dict(SHARED=True, BLOCK=2048), ("eps",)),
        ("expert cache _fetch_kernel (8 experts, 64 KiB a program)", fetch._fetch_kernel,
         pointer_types(fetch._fetch_kernel, expert_ptr="*i64", table_ptr="*i32", spare_ptr="*i32",
                       rows_ptr="*i64", log_ptr="*i64",
                       **{n: "*i32" for n in ("g_src", "u_src", "d_src", "g_dst", "u_dst", "d_dst")}),
         dict(KP=8, CHUNK=16384, BLOCK=1024), ()))
    return [(what, report(compile_kernel(kernel, pointers, constants, 4, floats=floats)))
            for what, kernel, pointers, constants, floats in cases]


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles the kernels for sm_90")
    for what, line in gemv_rows() + gemm_rows() + gdn_rows() + step_rows():
        print(f"{what}: {line}", flush=True)


if __name__ == "__main__":
    main()
