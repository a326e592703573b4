"""The runtime's wire format: one message = a msgpack header frame + one raw frame per tensor.

    frame 0   msgpack map  {v, kind, rid, stage, deadline_s, meta, tensors: [entry, ...]}
    frame i   the bytes of tensor i-1, as its entry says (raw, reduced and/or compressed)
    frame n+1 (only when the header's ``pad`` > 0) that many zero bytes, read and dropped: an
              emulated device's packet made as large as the real model's (``runtime.emulate``),
              so the link carries the real bytes

    entry = {name, dtype, shape, enc, scale?, z?, nbytes}
      dtype   the tensor's dtype (what the receiver gets back), a name of ``packet.DTYPES``
      enc     "raw" (the dtype's bytes), "bf16" (float tensor sent as bfloat16) or
              "int8" (float tensor as round(x / scale), |q| <= 127, one scale per tensor)
      z       compression of the frame: absent, "zlib" or "lz4" (when the lz4 package exists)
      nbytes  the frame's length on the wire

``deadline_s`` is the time the sender still had when it sent the message (relative, so the
two clocks need not agree); the receiver's deadline is its arrival time plus that.

The tensor frames travel as separate ZeroMQ frames, so a receiver reads the header first and
checks every count, dtype, shape, decoded size and frame length against ``Limits`` (and,
on the edge, against the stage's input schema) before it allocates a single tensor.
Decompression is bounded by the size the header claims, so a zip bomb stops at that size.
Nothing is ever unpickled: the header is msgpack with plain types, the frames are raw bytes.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import KW_ONLY, dataclass, field

import msgpack
import numpy as np
import torch

from vlarun.stages.packet import DTYPES, Limits, Packet, PacketError

try:  # optional: lz4 is faster than zlib, but the wire works without it
    import lz4.block as _lz4
except ImportError:  # pragma: no cover - depends on the environment
    _lz4 = None

WIRE_VERSION = 1
KINDS = ("data", "control", "result", "error")
REDUCTIONS = ("none", "bf16", "int8")
COMPRESSIONS = ("none", "zlib", "lz4")
_NAMES = {t: n for n, (t, _) in DTYPES.items()}
_FLOATS = ("float32", "float64", "float16", "bfloat16")
# Wire dtype of each encoding other than raw.
_ENC_DTYPE = {"bf16": "bfloat16", "int8": "int8"}
# Compressing a small frame costs more time than it saves bytes.
MIN_COMPRESS_BYTES = 4096
_MAX_STR = 256  # longest request/stage/tensor name a header may carry


@dataclass(frozen=True)
class Codec:
    """Per-link payload reduction. ``reduce`` applies to floating tensors only (integer and
    bool tensors always travel exactly); ``compress`` to every frame of at least
    ``MIN_COMPRESS_BYTES``. bf16 halves float32 payloads at ~3 significant digits; int8
    quarters them with an error of at most scale / 2 = max|x| / 254 per element."""

    reduce: str = "none"
    compress: str = "none"

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {self.reduce!r}")
        if self.compress not in COMPRESSIONS:
            raise ValueError(f"compress must be one of {COMPRESSIONS}, got {self.compress!r}")
        if self.compress == "lz4" and _lz4 is None:
            raise ValueError("compress='lz4' needs the lz4 package (pip install lz4); use zlib")


@dataclass
class Message:
    """One runtime message. Invariant: ``kind`` is in KINDS; ``packet`` is empty for control
    messages; ``rid`` pairs a reply with its request. Built as ``Message(kind, rid=...)``."""

    kind: str
    _: KW_ONLY
    rid: int = 0
    stage: str = ""
    deadline_s: float = math.inf
    meta: dict = field(default_factory=dict)
    packet: Packet = field(default_factory=lambda: Packet({}))
    pad: int = 0  # zero bytes sent after the tensors (a frame of its own), dropped on receipt


@dataclass(frozen=True)
class Entry:
    """A validated tensor entry of a header: what frame i will hold and what it becomes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    enc: str
    scale: float
    z: str
    nbytes: int

    @property
    def decoded_bytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1].itemsize

    @property
    def wire_bytes(self) -> int:
        """Uncompressed frame length this entry implies."""
        wire = _ENC_DTYPE.get(self.enc, self.dtype)
        return math.prod(self.shape) * DTYPES[wire][1].itemsize


@dataclass(frozen=True)
class Header:
    """A validated header; the tensors are not materialised yet."""

    kind: str
    rid: int
    stage: str
    deadline_s: float
    meta: dict
    entries: tuple[Entry, ...]
    pad: int = 0


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(msg: Message, codec: Codec | None = None) -> list[bytes]:
    """Frames of ``msg``: header first, then one frame per tensor."""
    codec = codec or Codec()
    if msg.kind not in KINDS:
        raise PacketError(f"message kind must be one of {KINDS}, got {msg.kind!r}")
    entries, frames = [], []
    for name, t in msg.packet.tensors.items():
        entry, frame = _encode_tensor(name, t, codec)
        entries.append(entry)
        frames.append(frame)
    header = {
        "v": WIRE_VERSION,
        "kind": msg.kind,
        "rid": int(msg.rid),
        "stage": msg.stage,
        "deadline_s": float(msg.deadline_s),
        "meta": msg.meta,
        "tensors": entries,
    }
    if msg.pad < 0:
        raise PacketError(f"pad must be >= 0 bytes, got {msg.pad}")
    if msg.pad:
        header["pad"] = int(msg.pad)
        frames.append(bytes(msg.pad))
    return [msgpack.packb(header, use_bin_type=True), *frames]


def _encode_tensor(name: str, t: torch.Tensor, codec: Codec) -> tuple[dict, bytes]:
    if t.dtype not in _NAMES:
        raise PacketError(f"tensor {name!r} has unsupported dtype {t.dtype}")
    dtype = _NAMES[t.dtype]
    data = t.detach().contiguous().cpu()
    entry = {"name": name, "dtype": dtype, "shape": list(data.shape), "enc": "raw"}
    if dtype in _FLOATS and codec.reduce != "none":
        data, entry = _reduce(data, entry, codec.reduce)
    frame = _raw_bytes(data)
    if codec.compress != "none" and len(frame) >= MIN_COMPRESS_BYTES:
        packed = zlib.compress(frame, 1) if codec.compress == "zlib" else _lz4.compress(frame)
        if len(packed) < len(frame):  # incompressible data (noise, images) stays raw
            frame, entry["z"] = packed, codec.compress
    entry["nbytes"] = len(frame)
    return entry, frame


def _reduce(data: torch.Tensor, entry: dict, how: str) -> tuple[torch.Tensor, dict]:
    if how == "bf16" and data.dtype != torch.bfloat16 and data.dtype != torch.float16:
        return data.to(torch.bfloat16), entry | {"enc": "bf16"}
    if how == "int8":
        x = data.float()
        peak = float(x.abs().max()) if x.numel() else 0.0
        if not math.isfinite(peak):  # inf / nan cannot be scaled; send the tensor exactly
            return data, entry
        scale = peak / 127 if peak > 0 else 1.0
        q = torch.round(x / scale).clamp_(-127, 127).to(torch.int8)
        return q, entry | {"enc": "int8", "scale": scale}
    return data, entry


def _raw_bytes(t: torch.Tensor) -> bytes:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # numpy has no bf16: move the 16-bit patterns
    return t.numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# Decoding


def decode(frames: list[bytes] | list[memoryview], limits: Limits | None = None) -> Message:
    """Parse frames made by ``encode``; raise PacketError naming the first problem."""
    limits = limits or Limits()
    if not frames:
        raise PacketError("empty message")
    header = decode_header(frames[0], limits)
    return materialize(header, frames[1:], limits)


def decode_header(raw: bytes | memoryview, limits: Limits | None = None) -> Header:
    """Validate the header frame alone: kind, ids, names, dtypes, shapes, claimed sizes."""
    limits = limits or Limits()
    if len(raw) > limits.max_header_bytes:
        raise PacketError(f"header of {len(raw)} bytes exceeds {limits.max_header_bytes}")
    try:
        h = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=True, max_bin_len=0)
    except Exception as e:  # msgpack raises several types for garbage
        raise PacketError(f"header is not valid msgpack: {type(e).__name__}") from None
    if not isinstance(h, dict) or h.get("v") != WIRE_VERSION:
        raise PacketError(f"unsupported wire schema (want v={WIRE_VERSION})")
    kind, rid, stage = h.get("kind"), h.get("rid", 0), h.get("stage", "")
    deadline, meta, tensors = h.get("deadline_s", math.inf), h.get("meta", {}), h.get("tensors")
    if kind not in KINDS:
        raise PacketError(f"message kind must be one of {KINDS}")
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 2**63:
        raise PacketError("rid must be a non-negative 63-bit integer")
    if not isinstance(stage, str) or len(stage) > _MAX_STR:
        raise PacketError("stage must be a short string")
    if not isinstance(deadline, float | int) or isinstance(deadline, bool) or deadline != deadline:
        raise PacketError("deadline_s must be a number")
    if not isinstance(meta, dict):
        raise PacketError("meta must be a map")
    if not isinstance(tensors, list) or len(tensors) > limits.max_tensors:
        raise PacketError(f"tensor list missing or longer than {limits.max_tensors}")
    entries, total, names = [], 0, set()
    for raw_entry in tensors:
        e = _entry(raw_entry, limits)
        if e.name in names:
            raise PacketError(f"duplicate tensor name {e.name!r}")
        names.add(e.name)
        total += e.decoded_bytes
        if total > limits.max_total_bytes:
            raise PacketError(f"tensors exceed the total limit of {limits.max_total_bytes} bytes")
        entries.append(e)
    pad = h.get("pad", 0)
    if not _is_dim(pad) or total + pad > limits.max_total_bytes:
        raise PacketError(
            f"pad must be a byte count within the total limit of "
            f"{limits.max_total_bytes} bytes with the tensors"
        )
    return Header(kind, rid, stage, float(deadline), meta, tuple(entries), pad)


def _entry(raw: object, limits: Limits) -> Entry:
    if not isinstance(raw, dict):
        raise PacketError("tensor entry is not a map")
    name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
    enc, scale, z, nbytes = (
        raw.get("enc"),
        raw.get("scale", 1.0),
        raw.get("z", ""),
        raw.get("nbytes"),
    )
    if not isinstance(name, str) or not name or len(name) > _MAX_STR:
        raise PacketError("tensor name must be a short non-empty string")
    if dtype not in DTYPES or not isinstance(shape, list):
        raise PacketError(f"tensor {name!r}: bad dtype or shape")
    if len(shape) > limits.max_ndim or not all(_is_dim(d) for d in shape):
        raise PacketError(f"tensor {name!r} has a bad shape {shape!r:.80}")
    if enc not in ("raw", *_ENC_DTYPE) or (enc != "raw" and dtype not in _FLOATS):
        raise PacketError(f"tensor {name!r}: encoding {enc!r:.20} does not apply to {dtype}")
    if not isinstance(scale, float | int) or not (math.isfinite(scale) and scale > 0):
        raise PacketError(f"tensor {name!r}: scale must be a positive finite number")
    if z not in ("", "zlib", "lz4"):
        raise PacketError(f"tensor {name!r}: unknown compression {z!r:.20}")
    if not _is_dim(nbytes):
        raise PacketError(f"tensor {name!r}: nbytes must be a non-negative integer")
    e = Entry(name, dtype, tuple(shape), enc, float(scale), z, nbytes)
    if e.decoded_bytes > limits.max_tensor_bytes:
        raise PacketError(f"tensor {name!r} of {e.decoded_bytes} bytes exceeds the limit")
    if (not z and nbytes != e.wire_bytes) or nbytes > e.wire_bytes + 1024:
        raise PacketError(f"tensor {name!r}: frame of {nbytes} bytes does not fit its shape")
    return e


def _is_dim(d: object) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62


def materialize(header: Header, frames, limits: Limits | None = None) -> Message:
    """The message of a validated header and its tensor frames (each checked first)."""
    want = len(header.entries) + (header.pad > 0)
    if len(frames) != want:
        pad = " and a pad" if header.pad else ""
        got = len(frames)
        raise PacketError(f"header lists {len(header.entries)} tensors{pad}, got {got} frames")
    if header.pad:
        if len(memoryview(frames[-1])) != header.pad:
            raise PacketError(
                f"pad frame is {len(memoryview(frames[-1]))} bytes, header says {header.pad}"
            )
        frames = frames[:-1]
    tensors = {}
    for e, frame in zip(header.entries, frames, strict=True):
        view = memoryview(frame)
        if len(view) != e.nbytes:
            raise PacketError(
                f"tensor {e.name!r}: frame is {len(view)} bytes, header says {e.nbytes}"
            )
        tensors[e.name] = _decode_tensor(e, view)
    return Message(
        header.kind,
        rid=header.rid,
        stage=header.stage,
        deadline_s=header.deadline_s,
        meta=header.meta,
        packet=Packet(tensors),
        pad=header.pad,
    )


def _decode_tensor(e: Entry, view: memoryview) -> torch.Tensor:
    if e.z:
        view = memoryview(_decompress(e, view))
    if len(view) != e.wire_bytes:
        raise PacketError(
            f"tensor {e.name!r}: {len(view)} bytes decoded, shape needs {e.wire_bytes}"
        )
    wire = _ENC_DTYPE.get(e.enc, e.dtype)
    torch_wire, np_wire = DTYPES[wire]
    arr = np.frombuffer(view, dtype=np_wire).reshape(e.shape)
    t = torch.from_numpy(arr.copy())
    if torch_wire == torch.bfloat16:
        t = t.view(torch.bfloat16)
    target = DTYPES[e.dtype][0]
    if e.enc == "int8":
        return (t.float() * e.scale).to(target)
    return t.to(target) if t.dtype != target else t


def _decompress(e: Entry, view: memoryview) -> bytes:
    """Inflate at most the claimed size (+1 byte to notice overflow): a bomb stops there."""
    limit = e.wire_bytes
    try:
        if e.z == "zlib":
            d = zlib.decompressobj()
            out = d.decompress(view, limit + 1)
            if not d.eof:
                raise PacketError(f"tensor {e.name!r}: compressed frame inflates past its shape")
            return out
        if _lz4 is None:
            raise PacketError("lz4 frame received but the lz4 package is not installed")
        return _lz4.decompress(bytes(view), uncompressed_size=limit)
    except PacketError:
        raise
    except Exception as err:
        raise PacketError(
            f"tensor {e.name!r}: bad compressed frame ({type(err).__name__})"
        ) from None


def renumber(frames: list[bytes], rid: int) -> list[bytes]:
    """``frames`` (made by ``encode``) as the message with request id ``rid``: only the header
    is packed again, so a request encoded once can be sent many times (a load generator)."""
    header = msgpack.unpackb(frames[0], raw=False)
    header["rid"] = int(rid)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def control(op: str, rid: int = 0, **meta) -> list[bytes]:
    """Frames of a control message (no tensors): ``meta`` carries ``op`` and its fields."""
    return encode(Message("control", rid=rid, meta={"op": op, **meta}))


def error(rid: int, text: str) -> list[bytes]:
    """Frames of an error reply; the text is bounded so an echo cannot amplify an attack."""
    return encode(Message("error", rid=rid, meta={"error": text[:300]}))
