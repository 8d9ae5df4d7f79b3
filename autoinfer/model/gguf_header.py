"""A bounded reader for the header of a GGUF file: metadata and tensor table, never the tensor data.

gguf's GGUFReader turns every array element into Python objects: a 152k-token tokenizer costs it ~12 s, and a
corrupted array length made it allocate memory until the host ran out. This reader checks every length against the
file size before using it, counts long arrays instead of materializing them (the tokenizer is not needed to size a
model), and takes type definitions (GGUFValueType, GGMLQuantizationType, GGML_QUANT_SIZES) from the gguf package.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)

# Arrays longer than this are counted, not read (tokenizer tokens/merges/types); layer-sized arrays are kept.
MAX_KEPT_ARRAY = 65536
MAX_ARRAY_DEPTH = 8  # arrays of arrays: real files nest one level; deeper only makes every later reader recurse
_SCALARS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF header (message says where)."""


@dataclass(frozen=True)
class ArrayCount:
    """Stands in for an array too long to keep: its element type and length."""

    element_type: str
    length: int


@dataclass(frozen=True)
class HeaderTensor:
    """One tensor-table entry; `shape` in ggml `ne` order, `offset` absolute in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]
    tensors: tuple[HeaderTensor, ...]
    data_offset: int
    file_bytes: int


class _Cursor:
    """Reads little- or big-endian values from a buffer, refusing to run past its end."""

    def __init__(self, buf: mmap.mmap, endian: str, max_kept_array: int) -> None:
        self.buf, self.endian, self.pos, self.max_kept = buf, endian, 0, max_kept_array

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFFormatError(f"{what} at byte {self.pos} runs past the end of the file ({len(self.buf)} bytes)")

    def scalar(self, code: str, what: str) -> object:
        size = struct.calcsize(code)
        self.need(size, what)
        (value,) = struct.unpack_from(self.endian + code, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"{what} at byte {self.pos - n} is not UTF-8") from None

    def plain(self, vtype: GGUFValueType, what: str) -> object:
        """A string or a number."""
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        return self.scalar(_SCALARS[vtype], what)

    def value(self, vtype: int, what: str) -> object:
        """One metadata value. Arrays of arrays are read with an explicit stack (no recursion), at most
        MAX_ARRAY_DEPTH deep."""
        vtype = _value_type(vtype, what)
        if vtype != GGUFValueType.ARRAY:
            return self.plain(vtype, what)
        first = self.array(what)
        if not isinstance(first, _Pending):
            return first
        stack = [first]
        while stack:
            top = stack[-1]
            if top.remaining == 0:
                stack.pop()
                continue
            top.remaining -= 1
            child = self.array(what)
            top.items.append(child.items if isinstance(child, _Pending) else child)
            if isinstance(child, _Pending):
                if len(stack) >= MAX_ARRAY_DEPTH:
                    raise GGUFFormatError(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
                stack.append(child)
        return first.items

    def array(self, what: str) -> "list[object] | ArrayCount | _Pending":
        """An array's header and, unless its elements are arrays themselves, its elements."""
        etype = _value_type(self.scalar("I", what), what)
        n = self.scalar("Q", what)
        if etype in _SCALARS:
            size = struct.calcsize(_SCALARS[etype])
            self.need(n * size, what)
            if n > self.max_kept:
                self.pos += n * size
                return ArrayCount(etype.name, n)
            values = struct.unpack_from(f"{self.endian}{n}{_SCALARS[etype]}", self.buf, self.pos)
            self.pos += n * size
            return list(values)
        self.need(n * 8, what)  # every element takes at least 8 bytes (a string length or an array header)
        if etype == GGUFValueType.ARRAY:
            return _Pending([], n)
        if n > self.max_kept:
            for _ in range(n):
                length = self.scalar("Q", what)
                self.need(length, what)
                self.pos += length
            return ArrayCount(etype.name, n)
        return [self.string(what) for _ in range(n)]


@dataclass
class _Pending:
    """An array of arrays being read: the elements so far and how many are still to come."""

    items: list[object]
    remaining: int


def _value_type(code: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise GGUFFormatError(f"{what}: unknown value type {code}") from None


def _tensor(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
    name = cur.string(f"name of tensor {index}")
    n_dims = cur.scalar("I", f"tensor {name}")
    if not 1 <= n_dims <= 4:
        raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions (GGML allows 1 to 4)")
    shape = tuple(cur.scalar("Q", f"tensor {name}") for _ in range(n_dims))
    if 0 in shape:
        raise GGUFFormatError(f"tensor {name} has a zero dimension {shape}")
    code = cur.scalar("I", f"tensor {name}")
    try:
        qtype = GGMLQuantizationType(code)
    except ValueError:
        raise GGUFFormatError(f"tensor {name} has unknown GGML type {code}") from None
    n_elements = 1
    for d in shape:
        n_elements *= d
    block, type_size = GGML_QUANT_SIZES[qtype]
    if n_elements % block:
        raise GGUFFormatError(f"tensor {name}: {n_elements} elements are not whole {qtype.name} blocks of {block}")
    return name, shape, qtype, n_elements // block * type_size, cur.scalar("Q", f"tensor {name}")


def read_header(path: Path, max_kept_array: int = MAX_KEPT_ARRAY) -> GGUFHeader:
    """Metadata and tensor table of the GGUF at `path`; GGUFFormatError for anything malformed or truncated.

    Arrays longer than `max_kept_array` appear as ArrayCount.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise GGUFFormatError(f"{size} bytes is too short for a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if struct.unpack_from("<I", buf, 0)[0] != GGUF_MAGIC:
                raise GGUFFormatError("bad magic")
            version = struct.unpack_from("<I", buf, 4)[0]
            endian = "<" if version & 0xFFFF else ">"  # a big-endian file reads as version << 24 here
            cur = _Cursor(buf, endian, max_kept_array)
            cur.pos = 4
            version = cur.scalar("I", "version")
            if version not in (2, 3):
                raise GGUFFormatError(f"GGUF version {version} (supported: 2, 3)")
            n_tensors = cur.scalar("Q", "tensor count")
            n_kv = cur.scalar("Q", "metadata count")
            cur.need(n_kv * 12 + n_tensors * 24, "metadata and tensor table")  # each takes at least that much
            metadata: dict[str, object] = {}
            for i in range(n_kv):
                key = cur.string(f"metadata key {i}")
                if key in metadata:
                    raise GGUFFormatError(f"metadata key {key!r} appears twice")
                metadata[key] = cur.value(cur.scalar("I", key), key)
            raw = [_tensor(cur, i) for i in range(n_tensors)]
            alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
            if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
                    or alignment & (alignment - 1)):
                raise GGUFFormatError(f"general.alignment {alignment!r} is not a power of two")
            data_offset = -(-cur.pos // alignment) * alignment
    if len({r[0] for r in raw}) != len(raw):
        raise GGUFFormatError("the tensor table names a tensor twice")
    tensors = []
    for name, shape, qtype, n_bytes, rel in raw:
        if rel % alignment:
            raise GGUFFormatError(f"tensor {name} starts at offset {rel}, not a multiple of the alignment {alignment}")
        if data_offset + rel + n_bytes > size:
            raise GGUFFormatError(
                f"tensor {name} ends at byte {data_offset + rel + n_bytes} but the file has {size} bytes (truncated)"
            )
        tensors.append(HeaderTensor(name, shape, qtype.name, n_bytes, data_offset + rel))
    return GGUFHeader(version, metadata, tuple(tensors), data_offset, size)
