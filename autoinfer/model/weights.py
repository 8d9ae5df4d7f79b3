"""Random tensor data in any GGML type, produced in bounded chunks so a 20 GB model never sits in memory.

Float and legacy block types (F32, F16, BF16, Q4_0 … Q8_0) are drawn as floats and quantized with `gguf.quants`.
K- and IQ-quants have no Python quantizer: their blocks are random bytes whose fp16 scale fields are overwritten with
one finite value, calibrated (by dequantizing a sample with `gguf.quants`) so the weights have the requested standard
deviation. Random bits under a sane scale are valid blocks and run through the real kernels at the real speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

# Elements generated at a time: 8 M floats = 32 MB of float32 before quantization.
CHUNK_ELEMENTS = 1 << 23

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANTIZED_IN_PYTHON = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


@dataclass(frozen=True)
class RawLayout:
    """Where a block keeps its fp16 scale (`d`) and, for K-quants with minimums, `dmin`.

    `dmin_per_d` balances the minimums against the mean of the unsigned quants so random blocks average to ~0.
    """

    d_offset: int
    dmin_offset: int | None = None
    dmin_per_d: float = 0.0


# Offsets from the block structs in ggml-common.h (block_q2_K … block_iq4_xs).
RAW_LAYOUTS: dict[str, RawLayout] = {
    "Q2_K": RawLayout(80, 82, 1.5),
    "Q3_K": RawLayout(108),
    "Q4_K": RawLayout(0, 2, 7.5),
    "Q5_K": RawLayout(0, 2, 15.5),
    "Q6_K": RawLayout(208),
    "IQ1_S": RawLayout(0),
    "IQ2_XXS": RawLayout(0),
    "IQ2_XS": RawLayout(0),
    "IQ2_S": RawLayout(0),
    "IQ3_XXS": RawLayout(0),
    "IQ3_S": RawLayout(0),
    "IQ4_NL": RawLayout(0),
    "IQ4_XS": RawLayout(0),
}
# IQ1_M has no scale field: its fp16 scale is spread over the top nibbles of the four uint16 words at byte 48.
IQ1_M_SCALES_OFFSET = 48

RAW_TYPES = (*RAW_LAYOUTS, "IQ1_M")
SUPPORTED_TYPES = (*FLOAT_TYPES, *QUANTIZED_IN_PYTHON, *RAW_TYPES)


def block_size(ggml_type: str) -> int:
    """Elements per block (1 for float types)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]][0]


def n_bytes(ggml_type: str, n_elements: int) -> int:
    """Bytes that `n_elements` values take in `ggml_type` (n_elements must be a whole number of blocks)."""
    elems, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    if n_elements % elems:
        raise ValueError(f"{n_elements} elements are not a whole number of {ggml_type} blocks of {elems}")
    return n_elements // elems * size


def _set_scales(blocks: np.ndarray, ggml_type: str, d: float) -> None:
    """Overwrite the scale fields of every block (rows of uint8) with the finite fp16 value `d`."""
    bits = int(np.float16(d).view(np.uint16))
    if ggml_type == "IQ1_M":
        for k in range(4):
            hi = IQ1_M_SCALES_OFFSET + 2 * k + 1
            blocks[:, hi] = (blocks[:, hi] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4)
        return
    layout = RAW_LAYOUTS[ggml_type]
    blocks[:, layout.d_offset : layout.d_offset + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    if layout.dmin_offset is not None:
        dmin = np.float16(d * layout.dmin_per_d).tobytes()
        blocks[:, layout.dmin_offset : layout.dmin_offset + 2] = np.frombuffer(dmin, np.uint8)


@cache
def raw_scale(ggml_type: str, std: float) -> float:
    """The block scale `d` that gives random `ggml_type` blocks the weight standard deviation `std`."""
    _, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    sample = np.random.default_rng(12345).integers(0, 256, (2048, size), dtype=np.uint8)
    _set_scales(sample, ggml_type, 1.0)
    unit_std = float(quants.dequantize(sample, GGMLQuantizationType[ggml_type]).std())
    return std / unit_std


def random_blocks(ggml_type: str, n_blocks: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """`n_blocks` random K/IQ blocks (uint8, one row per block) whose weights have standard deviation ~`std`."""
    _, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    _set_scales(blocks, ggml_type, raw_scale(ggml_type, std))
    return blocks


def draw_values(init: str, n: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """`n` float32 values for a tensor of kind `init`, ranges as a trained model has them (activations stay finite).

    normal: N(0, std) matrices; norm: stored as 1 + w (llama.cpp's converter adds the 1); ssm_a: -exp(A_log) with
    A_log = log U(1, 16); dt_bias: inverse softplus of U(1e-3, 0.1); conv: U(-0.5, 0.5) (kaiming bound for width 4).
    """
    if init == "normal":
        return rng.standard_normal(n, dtype=np.float32) * np.float32(std)
    if init == "norm":
        return np.float32(1.0) + rng.standard_normal(n, dtype=np.float32) * np.float32(std)
    if init == "ssm_a":
        return -rng.uniform(1.0, 16.0, n).astype(np.float32)
    if init == "dt_bias":
        return np.log(np.expm1(rng.uniform(1e-3, 0.1, n))).astype(np.float32)
    if init == "conv":
        return rng.uniform(-0.5, 0.5, n).astype(np.float32)
    raise ValueError(f"unknown init kind {init!r}")


def tensor_chunks(
    ggml_type: str, shape: tuple[int, ...], init: str, rng: np.random.Generator, std: float
) -> Iterator[np.ndarray]:
    """The data of one tensor (ggml `ne` order `shape`) as consecutive C-contiguous chunks of whole rows.

    K/IQ blocks can only hold N(0, std)-like weights; norms, biases and conv weights belong in a float type.
    """
    if ggml_type in RAW_TYPES and init != "normal":
        raise ValueError(f"{ggml_type} blocks cannot hold {init!r} values; store that tensor as F32")
    row = shape[0]
    n_rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    rows_per_chunk = max(1, CHUNK_ELEMENTS // row)
    qtype = GGMLQuantizationType[ggml_type]
    for start in range(0, n_rows, rows_per_chunk):
        rows = min(rows_per_chunk, n_rows - start)
        if ggml_type in RAW_TYPES:
            yield random_blocks(ggml_type, rows * row // block_size(ggml_type), rng, std)
            continue
        values = draw_values(init, rows * row, rng, std).reshape(rows, row)
        if ggml_type == "F32":
            yield values
        elif ggml_type == "F16":
            yield values.astype(np.float16)
        else:
            yield quants.quantize(values, qtype)
