"""Packets: named tensors that cross a stage boundary, and their byte encoding.

Encoding = 4-byte big-endian header length, a msgpack header (schema version, meta, and per
tensor its name, dtype and shape), then each tensor's raw bytes in order. Decoding checks every
count and size against ``Limits`` before allocating anything, and never unpickles.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import msgpack
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


def encode(packet: Packet) -> bytes:
    """Serialise a packet to bytes (CPU copy of each tensor)."""
    entries, frames = [], []
    for name, t in packet.tensors.items():
        if t.dtype not in _NAMES:
            raise PacketError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        np_dtype = DTYPES[_NAMES[t.dtype]][1]
        data = t.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            data = data.view(torch.int16)
        frames.append(data.numpy().astype(np_dtype, copy=False).tobytes())
        entries.append({"name": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape)})
    header = msgpack.packb(
        {"v": SCHEMA_VERSION, "meta": packet.meta, "tensors": entries}, use_bin_type=True
    )
    return struct.pack(">I", len(header)) + header + b"".join(frames)


def decode(data: bytes | memoryview, limits: Limits | None = None) -> Packet:
    """Parse bytes made by ``encode``; raise PacketError naming the first problem."""
    limits = limits or Limits()
    view = memoryview(data)
    if len(view) < 4:
        raise PacketError("packet shorter than its 4-byte header length")
    (hlen,) = struct.unpack(">I", view[:4])
    if hlen > limits.max_header_bytes or 4 + hlen > len(view):
        raise PacketError(f"header length {hlen} exceeds limit or packet size {len(view)}")
    header = _header(view[4 : 4 + hlen], limits)
    offset, tensors, total = 4 + hlen, {}, 0
    for entry in header["tensors"]:
        name, dtype, shape, nbytes = _entry(entry, limits)
        total += nbytes
        if total > limits.max_total_bytes:
            raise PacketError(f"tensors exceed the total limit of {limits.max_total_bytes} bytes")
        if name in tensors:
            raise PacketError(f"duplicate tensor name {name!r}")
        if offset + nbytes > len(view):
            raise PacketError(f"tensor {name!r} needs {nbytes} bytes, packet ends first")
        torch_dtype, np_dtype = DTYPES[dtype]
        arr = np.frombuffer(view[offset : offset + nbytes], dtype=np_dtype).reshape(shape)
        t = torch.from_numpy(arr.copy())
        tensors[name] = t.view(torch.bfloat16) if torch_dtype == torch.bfloat16 else t
        offset += nbytes
    if offset != len(view):
        raise PacketError(f"{len(view) - offset} trailing bytes after the last tensor")
    return Packet(tensors, header.get("meta") or {})


def _header(raw: memoryview, limits: Limits) -> dict:
    try:
        header = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for garbage
        raise PacketError(f"header is not valid msgpack: {e}") from None
    if not isinstance(header, dict) or header.get("v") != SCHEMA_VERSION:
        raise PacketError(f"unsupported packet schema (want v={SCHEMA_VERSION})")
    if not isinstance(header.get("tensors"), list) or len(header["tensors"]) > limits.max_tensors:
        raise PacketError(f"tensor list missing or longer than {limits.max_tensors}")
    if not isinstance(header.get("meta", {}), dict):
        raise PacketError("meta must be a map")
    return header


def _entry(entry: object, limits: Limits) -> tuple[str, str, tuple[int, ...], int]:
    if not isinstance(entry, dict):
        raise PacketError("tensor entry is not a map")
    name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
    if not isinstance(name, str) or dtype not in DTYPES or not isinstance(shape, list):
        raise PacketError(f"bad tensor entry {entry!r:.120}")
    if len(shape) > limits.max_ndim or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise PacketError(f"tensor {name!r} has a bad shape {shape!r:.80}")
    nbytes = math.prod(shape) * DTYPES[dtype][1].itemsize
    if nbytes > limits.max_tensor_bytes:
        raise PacketError(f"tensor {name!r} of {nbytes} bytes exceeds {limits.max_tensor_bytes}")
    return name, dtype, tuple(shape), nbytes
