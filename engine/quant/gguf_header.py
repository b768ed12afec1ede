"""A GGUF file's header read without gguf's GGUFReader: the metadata a load needs and the
tensor directory, skipping every other array by its length.

GGUFReader parses every field into numpy views, one per string and per array item: for a
262k-token vocabulary (three arrays of 262k items) that is ~3M objects and ~30 s of pure
Python holding the GIL, which stalls the event loop and the other models' engine threads
while a model loads beside them. Walking the header here takes well under a second.
transformers' own header reader (transformers.integrations.gguf) skips arrays too, but it
gives tensor names only, or refuses a file holding a type it cannot dequantize (Gemma 3's
Q5_0 tensors), where the kernels need every tensor's type and offset. The layout is
gguf's (gguf/gguf_reader.py, gguf/constants.py: GGUFValueType):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x      key: string | type u32 | value        (array: item type u32 | count u64 | items)
    n_tensors x name: string | n_dims u32 | dims u64 x n_dims | ggml type u32 | offset u64
    padding to general.alignment (32) | tensor data (offsets relative to here)

    string: length u64 | utf-8 bytes          (little-endian throughout)
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_STRING, _ARRAY = 8, 9  # an array of arrays is refused (KeyError), as transformers does
# GGUFValueType -> struct (and numpy) format of the fixed-size types
_NUMERIC = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
            11: "q", 12: "d"}


@dataclass(frozen=True)
class GGUFHeader:
    """`fields`: every scalar field, and the arrays asked for (strings as lists of str,
    numbers as numpy arrays); `tensors`: [name, ggml type name, dims, absolute byte offset]."""
    fields: dict
    tensors: list


def read_header(path: Path, arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    """The header of the GGUF at `path`, with the array fields named in `arrays`."""
    from gguf import GGMLQuantizationType

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
        walker = _Walker(memoryview(m))
        try:
            fields, tensors = walker.header(arrays)
        finally:
            walker.buf.release()
    align = fields.get("general.alignment", 32)
    start = -(-walker.at // align) * align  # the first multiple of align at or after it
    return GGUFHeader(fields, [[name, GGMLQuantizationType(kind).name, dims, start + offset]
                               for name, kind, dims, offset in tensors])


class _Walker:
    """A cursor over the header's bytes."""

    def __init__(self, buf: memoryview):
        self.buf, self.at = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        size = self.take("<Q")
        self.at += size
        return bytes(self.buf[self.at - size:self.at]).decode("utf-8")

    def header(self, arrays):
        magic, version, n_tensors, n_kv = self.take("<4sIQQ")
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"not a GGUF file of version 2 or 3 (magic {magic!r}, "
                             f"version {version})")
        fields = {}
        for _ in range(n_kv):
            key, kind = self.string(), self.take("<I")
            if kind != _ARRAY:
                fields[key] = self.value(kind)
                continue
            item, count = self.take("<IQ")
            if key in arrays:
                fields[key] = self.array(item, count)
            else:
                self.skip(item, count)
        tensors = []
        for _ in range(n_tensors):
            name, n_dims = self.string(), self.take("<I")
            dims = list(struct.unpack_from(f"<{n_dims}Q", self.buf, self.at))
            self.at += 8 * n_dims
            kind, offset = self.take("<IQ")
            tensors.append((name, kind, dims, offset))
        return fields, tensors

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        return self.take("<" + _NUMERIC[kind])

    def array(self, item: int, count: int):
        if item == _STRING:
            return [self.string() for _ in range(count)]
        dtype = np.dtype("<" + _NUMERIC[item])
        values = np.frombuffer(self.buf, dtype, count, self.at).copy()  # not a view of the map
        self.at += dtype.itemsize * count
        return values

    def skip(self, item: int, count: int):
        if item == _STRING:  # each string's length decides where the next one starts
            for _ in range(count):
                self.at += 8 + struct.unpack_from("<Q", self.buf, self.at)[0]
        else:
            self.at += struct.calcsize("<" + _NUMERIC[item]) * count
