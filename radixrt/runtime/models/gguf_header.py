"""A GGUF file's header read in one pass: scalar metadata, array lengths, and the tensor infos.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array, in Python: seconds for
a 50k-128k-token vocabulary (16 of 16.5 s of SmolLM2's load, measured). The weights need none of it: this
parser keeps scalar and string values, skips arrays (their length only; a string array's entries are
walked by their length prefixes, never decoded), and returns each tensor's name, type, shape and offset.
The format (``gguf-py/gguf/constants.py``, ``docs/gguf.md`` in llama.cpp): magic ``GGUF``, version (2 or
3), tensor count and metadata count (uint64), the metadata key/value pairs, the tensor infos, then the
data from the next multiple of ``general.alignment`` (default 32). Little-endian files only.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

# metadata value types: struct format of the scalars; 8 = string, 9 = array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """``dims`` in ggml order (``dims[0]`` = columns); ``offset`` from the file's start, in bytes."""

    name: str
    type_id: int
    dims: tuple
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """``metadata``: scalars and strings by key; an array's value is ``("array", count)``. ``header_bytes``:
    the length of everything before the tensor data (what a cache of derived files is keyed on)."""

    metadata: dict
    tensors: list
    data_offset: int
    header_bytes: int


class _Cursor:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(
                f"{self.path}: not a readable GGUF file (truncated or corrupt? the header ends at byte {len(self.buf)})"
            )
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(
                f"{self.path}: not a readable GGUF file (truncated or corrupt? a string of {n} bytes "
                f"at byte {self.pos})"
            )
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_array(self) -> int:
        kind, count = self.take("I"), self.take("Q")
        if kind == _STRING:
            for _ in range(count):  # each entry: a uint64 length, then its bytes
                n = self.take("Q")
                self.pos += n
        elif kind == _ARRAY:
            for _ in range(count):
                self.skip_array()
        elif kind in _SCALAR:
            self.pos += struct.calcsize(_SCALAR[kind]) * count
        else:
            raise ValueError(f"{self.path}: not a readable GGUF file (unknown metadata type {kind})")
        if self.pos > len(self.buf):
            raise ValueError(
                f"{self.path}: not a readable GGUF file (truncated or corrupt? an array runs past the end)"
            )
        return count


def read_header(path: str) -> GGUFHeader:
    """Parse ``path``'s header (the file is memory-mapped; only the header's pages are read).

    Raises:
        ValueError: not a GGUF file, an unsupported version, or a truncated/corrupt header or tensor table
            (the message names the file and, for a tensor past the end, the tensor).
    """
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError(f"{path}: not a readable GGUF file (empty)") from None
    try:  # the mmap itself, not a memoryview: a view held by a raised error's frames would block close()
        return _parse(buf, path, len(buf))
    finally:
        buf.close()


def _parse(view, path: str, size: int) -> GGUFHeader:
    c = _Cursor(view, path)
    if size < 24 or bytes(view[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a readable GGUF file (no GGUF magic)")
    c.pos = 4
    version, n_tensors, n_kv = c.take("I"), c.take("Q"), c.take("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: not a readable GGUF file (version {version}; radixrt reads 2 and 3, little-endian)")
    meta: dict = {}
    for _ in range(n_kv):
        key, kind = c.string(), c.take("I")
        if kind == _STRING:
            meta[key] = c.string()
        elif kind == _ARRAY:
            meta[key] = ("array", c.skip_array())
        elif kind in _SCALAR:
            meta[key] = c.take(_SCALAR[kind])
        else:
            raise ValueError(f"{path}: not a readable GGUF file (key {key!r} has unknown type {kind})")
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("I")
        if n_dims > 4:
            raise ValueError(f"{path}: not a readable GGUF file (tensor {name} has {n_dims} dimensions)")
        dims = tuple(c.take("Q") for _ in range(n_dims))
        infos.append((name, c.take("I"), dims, c.take("Q")))
    align = int(meta.get("general.alignment", 32))
    header_bytes = c.pos
    data = (c.pos + align - 1) // align * align
    return GGUFHeader(meta, [TensorInfo(n, t, d, data + o) for n, t, d, o in infos], data, header_bytes)
