"""GGUF blocks -> the C++ kernels' layout (kernels/cpu/quant_kernels.h), bit for bit.

Every format is the same thing underneath: per sub-block of a row, w = scale * code + offset
with small unsigned codes. The loader takes each format's blocks apart into that once:

    format  codes  sub  scale        offset        ggml dequantizes as
    Q4_0    4 bit  32   d            -8 d          d * (q - 8)
    Q4_1    4 bit  32   d            m             d * q + m
    Q5_0    8 bit  32   d            -16 d         d * (q - 16)  (5-bit q, a byte each)
    Q8_0    8 bit  32   d            -128 d        d * q        (code = q + 128)
    Q4_K    4 bit  32   d * sc       -dmin * mn    d*sc * q - dmin*mn
    Q6_K    8 bit  16   d * sc       -32 d * sc    d*sc * (q - 32)

Scales and offsets stay fp16 where every value is exactly an fp16 (the legacy formats),
else fp32 (the K formats' products); codes are packed 4 or 8 bits as stored or wider
(Q6_K's 6-bit codes take a byte each). No float copy of a weight is ever made.
"""
from __future__ import annotations

import numpy as np

# name -> (weights per block, bytes per block)
FORMATS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q8_0": (32, 34),
           "Q4_K": (256, 144), "Q6_K": (256, 210)}
GROUP = 128  # weights per group of codes (kp: in_features rounded up to this)


def unpack(blocks: np.ndarray, fmt: str):
    """blocks uint8 [n, row bytes] -> (codes uint8 [n, k], scales, offsets fp32 [n, k / sub],
    bits, sub, fused): `fused` where ggml rounds scale * code + offset once."""
    if fmt not in FORMATS:
        raise ValueError(f"no packed kernel for {fmt}; expected one of {sorted(FORMATS)}")
    size, nbytes = FORMATS[fmt]
    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, nbytes)
    codes, scales, offsets, bits, sub, fused = _UNPACK[fmt](b)
    return (codes.reshape(n, -1), scales.reshape(n, -1).astype(np.float32),
            offsets.reshape(n, -1).astype(np.float32), bits, sub, fused)


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """ggml's nibble order: `run` bytes give `run` low-nibble weights, then their highs."""
    q = qs.reshape(qs.shape[0], -1, 1, run) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(15)).reshape(qs.shape[0], -1)


def _q4_0(b):
    d = _half(b, 0)
    return _nibbles(b[:, 2:], 16), d, -8 * d, 4, 32, True


def _q4_1(b):
    return _nibbles(b[:, 4:], 16), _half(b, 0), _half(b, 2), 4, 32, False


def _q5_0(b):
    """Four bytes after d hold every weight's fifth bit (bit i for weight i), then the
    low nibbles in ggml's order."""
    d = _half(b, 0)
    high = np.unpackbits(b[:, 2:6], axis=1, bitorder="little")
    return _nibbles(b[:, 6:], 16) | (high << np.uint8(4)), d, -16 * d, 8, 32, True


def _q8_0(b):
    d = _half(b, 0)
    codes = (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return codes, d, -128 * d, 8, 32, True


def _q4_k(b):
    from gguf.quants import Q4_K

    sc, mn = Q4_K.get_scale_min(b[:, 4:16])
    scales = _half(b, 0) * sc.astype(np.float32)
    offsets = -(_half(b, 2) * mn.astype(np.float32))
    return _nibbles(b[:, 16:], 32), scales, offsets, 4, 32, False


def _q6_k(b):
    ql, qh, sc = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8)
    low = _nibbles(ql, 64).reshape(-1, 2, 128)  # per half of 128: ql's low then high nibbles
    high = qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    codes = low | ((high & np.uint8(3)).reshape(-1, 2, 128) << np.uint8(4))
    scales = _half(b, 208) * sc.astype(np.float32)
    return codes.reshape(-1, 256), scales, -32 * scales, 8, 16, True


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def pack(codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray, bits: int, sub: int):
    """Pad rows to whole groups (code, scale and offset 0) and lay them out as the kernels
    read them (kernels/cpu/quant_kernels.h): (codes uint8 [n, kp * bits / 8], scales,
    offsets [n, kp / sub])."""
    n, k = codes.shape
    kp = -(-k // GROUP) * GROUP
    codes = np.pad(codes, ((0, 0), (0, kp - k)))
    scales = np.pad(scales, ((0, 0), (0, (kp - k) // sub)))
    offsets = np.pad(offsets, ((0, 0), (0, (kp - k) // sub)))
    as_half = _exact_in_half(scales) and _exact_in_half(offsets)
    dtype = np.float16 if as_half else np.float32
    return pack_codes(codes, bits), scales.astype(dtype), offsets.astype(dtype)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """One code per byte [n, kp] in weight order -> the kernels' [n, kp * bits / 8]."""
    n, kp = codes.shape
    # a group's 4 blocks x 2 halves of 16 -> its "lo" run (first halves) and "hi" run
    runs = codes.reshape(n, kp // GROUP, 4, 2, 16).transpose(0, 1, 3, 2, 4)
    if bits == 4:  # byte i: lo[i] low nibble, hi[i] high nibble
        return np.ascontiguousarray(runs[:, :, 0] | (runs[:, :, 1] << np.uint8(4))).reshape(n, -1)
    return np.ascontiguousarray(runs).reshape(n, -1)


def unpack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """The kernels' packed codes [n, kp * bits / 8] -> one code per byte [n, kp], in
    weight order."""
    n = codes.shape[0]
    if bits == 4:
        shifted = codes.reshape(n, -1, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        codes = shifted & np.uint8(15)
    runs = codes.reshape(n, -1, 2, 4, 16)  # group, run (lo/hi), block, position
    return np.ascontiguousarray(runs.transpose(0, 1, 3, 2, 4)).reshape(n, -1)


def _exact_in_half(values: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.array_equal(values.astype(np.float16).astype(np.float32), values))
