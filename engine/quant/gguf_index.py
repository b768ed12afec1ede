"""A GGUF file's tensor directory (name, type, shape, where its bytes start), saved once
beside the file's converted config so later loads map the tensors without parsing the
metadata again.

    index = build_index(path)            # the header walked, big arrays skipped
    save_index(index, meta_dir)          # tensors.json
    architecture, tensors = map_tensors(path, load_index(meta_dir))   # np.memmap views

The index is read by engine.quant.gguf_header, not gguf's GGUFReader, which parses the
whole vocabulary (tens of seconds holding the GIL) to reach the tensor directory after it.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine.quant.gguf_header import GGUFHeader, read_header

INDEX_FILE = "tensors.json"
_PLAIN = {"F32": np.float32, "F16": np.float16}  # the unquantized types these models use


def build_index(path: Path) -> dict:
    """{architecture, tensors: [[name, type, dims, byte offset]]}."""
    return header_index(read_header(path))


def header_index(header: GGUFHeader) -> dict:
    """build_index's result from a header already read (a first load's conversion)."""
    return {"architecture": header.fields.get("general.architecture"),
            "tensors": header.tensors}


def save_index(index: dict, meta_dir: Path) -> None:
    """Write it whole or not at all: another process may load the same file meanwhile."""
    staging = meta_dir / f".{INDEX_FILE}.{os.getpid()}"
    staging.write_text(json.dumps(index))
    os.replace(staging, meta_dir / INDEX_FILE)


def load_index(meta_dir: Path) -> dict | None:
    file = meta_dir / INDEX_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def map_tensors(path: Path, index: dict) -> tuple[str | None, Iterator[tuple]]:
    """(architecture, (name, GGMLQuantizationType, dims, data) per tensor): `data` is a
    view of the file's map shaped as GGUFReader shapes it (plain types by element,
    quantized ones by byte rows)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    data = np.memmap(path, mode="r")

    def tensors():
        for name, kind, dims, offset in index["tensors"]:
            qtype = GGMLQuantizationType[kind]
            shape = tuple(reversed(dims))
            block, type_size = GGML_QUANT_SIZES[qtype]
            size = math.prod(dims) * type_size // block
            raw = data[offset:offset + size]
            if raw.size != size:
                raise ValueError(f"tensor {name}: the file ends before its data")
            if kind in _PLAIN:
                yield name, qtype, dims, raw.view(_PLAIN[kind]).reshape(shape)
            else:
                yield name, qtype, dims, raw.reshape(quant_shape_to_byte_shape(shape, qtype))

    return index["architecture"], tensors()
