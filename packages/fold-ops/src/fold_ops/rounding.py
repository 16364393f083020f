"""A Python float rounded to a floating dtype, on the host: no tensor, no device value read.

``torch.tensor(x, dtype=dtype).item()`` does the same but dispatches two ops per call (and a
host-synchronization probe counts ``item``). Round to nearest, ties to even, as a cast does.
"""

from __future__ import annotations

import struct

import torch

__all__ = ["round_to"]


def round_to(value: float, dtype: torch.dtype) -> float:
    """``value`` as ``dtype`` holds it (fp32, bf16, fp16; fp64 and others unchanged). Like
    PyTorch's cast of a Python float, bf16 and fp16 round from the fp32 value."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return float(value)
    try:
        f32 = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:  # beyond fp32's range
        f32 = float("inf") if value > 0 else float("-inf")
    if dtype == torch.float16:
        try:
            return struct.unpack("<e", struct.pack("<e", f32))[0]
        except OverflowError:  # beyond fp16's range
            return float("inf") if f32 > 0 else float("-inf")
    if dtype == torch.float32:
        return f32
    bits = struct.unpack("<I", struct.pack("<f", f32))[0]
    if (bits >> 23) & 0xFF != 0xFF:  # finite: keep the top 16 bits, ties to even
        bits = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", bits))[0]
