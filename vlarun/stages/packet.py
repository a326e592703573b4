"""Packets: named tensors that cross a stage boundary, the dtypes they may hold, and the limits
a decoder checks before allocating. Their one byte encoding is ``vlarun.stages.wire``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

SCHEMA_VERSION = 1

# dtype name on the wire -> (torch dtype, numpy dtype used to move the bytes)
DTYPES: dict[str, tuple[torch.dtype, np.dtype]] = {
    "float32": (torch.float32, np.dtype("<f4")),
    "float64": (torch.float64, np.dtype("<f8")),
    "bfloat16": (torch.bfloat16, np.dtype("<i2")),  # numpy has no bf16: move as 16-bit ints
    "float16": (torch.float16, np.dtype("<f2")),
    "int64": (torch.int64, np.dtype("<i8")),
    "int32": (torch.int32, np.dtype("<i4")),
    "int16": (torch.int16, np.dtype("<i2")),
    "int8": (torch.int8, np.dtype("i1")),
    "uint8": (torch.uint8, np.dtype("u1")),
    "bool": (torch.bool, np.dtype("?")),
}
_NAMES = {t: n for n, (t, _) in DTYPES.items()}


class PacketError(ValueError):
    """A packet could not be encoded or decoded; the message names what is wrong."""


@dataclass(frozen=True)
class Limits:
    """Upper bounds a decoder enforces before allocating (defaults fit a 7B model's KV cache)."""

    max_tensors: int = 64
    max_ndim: int = 8
    max_tensor_bytes: int = 2 << 30
    max_total_bytes: int = 4 << 30
    max_header_bytes: int = 1 << 20


@dataclass
class Packet:
    """Named tensors plus small metadata. Invariant: names are unique, tensors are dense;
    ``nbytes`` is exactly the payload a transport moves (header excluded)."""

    tensors: dict[str, Tensor]
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def subset(self, names: tuple[str, ...] | list[str]) -> Packet:
        missing = [n for n in names if n not in self.tensors]
        if missing:
            raise PacketError(f"packet lacks tensors {missing}; has {sorted(self.tensors)}")
        return Packet({n: self.tensors[n] for n in names}, dict(self.meta))
