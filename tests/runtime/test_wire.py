"""Wire format: exact round trips, bounded reductions, and refusal of malformed messages
before anything is allocated."""

from __future__ import annotations

import contextlib
import math
import random
import tracemalloc
import zlib

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlarun.stages import wire
from vlarun.stages.packet import DTYPES, Limits, Packet, PacketError
from vlarun.stages.wire import Codec, Message

DTYPE_NAMES = sorted(DTYPES)
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def _tensor(dtype: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tdtype = DTYPES[dtype][0]
    if tdtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if tdtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(tdtype)
    info = torch.iinfo(tdtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(tdtype)


packets = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
    st.tuples(st.sampled_from(DTYPE_NAMES), shapes, st.integers(0, 2**16)),
    max_size=5,
).map(lambda d: Packet({k: _tensor(*v) for k, v in d.items()}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    packets,
    st.sampled_from(wire.KINDS),
    st.integers(0, 2**63 - 1),
    st.floats(0, 1e6),
    st.sampled_from(["none", "zlib"]),
)
def test_exact_round_trip(packet, kind, rid, deadline, compress):
    msg = Message(
        kind,
        rid=rid,
        stage="prefill+decode",
        deadline_s=deadline,
        meta={"batch": 1, "x": [1, "a"]},
        packet=packet,
    )
    back = wire.decode(wire.encode(msg, Codec(compress=compress)))
    assert (back.kind, back.rid, back.stage, back.meta) == (kind, rid, msg.stage, msg.meta)
    assert back.deadline_s == deadline
    assert list(back.packet.tensors) == list(packet.tensors)
    for name, t in packet.tensors.items():
        got = back.packet[name]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got, t) or (
            t.is_floating_point() and torch.equal(got.isnan(), t.isnan())
        )


@settings(max_examples=40, deadline=None)
@given(
    shapes.filter(lambda s: math.prod(s) > 0),
    st.integers(0, 2**16),
    st.sampled_from(["bf16", "int8"]),
)
def test_reduced_round_trip_is_bounded(shape, seed, how):
    t = _tensor("float32", shape, seed)
    back = wire.decode(wire.encode(Message("data", packet=Packet({"x": t})), Codec(how)))
    got = back.packet["x"]
    assert got.dtype == torch.float32 and got.shape == t.shape
    if how == "bf16":  # 8 bits of mantissa: relative error below 2^-8
        assert torch.allclose(got, t, rtol=2**-8, atol=0)
    else:  # one scale per tensor: error at most half a step
        step = float(t.abs().max()) / 127
        assert float((got - t).abs().max()) <= step / 2 + 1e-6


def test_reduction_leaves_integers_exact_and_shrinks_floats():
    p = Packet({"ids": torch.arange(1000), "kv": torch.randn(64, 256)})
    raw = sum(map(len, wire.encode(Message("data", packet=p))))
    frames = wire.encode(Message("data", packet=p), Codec("int8"))
    back = wire.decode(frames)
    assert torch.equal(back.packet["ids"], p["ids"])
    assert sum(map(len, frames)) < raw - 3 * 64 * 256 + 64  # 4 -> 1 byte per float, + scale
    nonfinite = Packet({"x": torch.tensor([1.0, float("inf")])})  # cannot scale: sent exactly
    assert torch.equal(
        wire.decode(wire.encode(Message("data", packet=nonfinite), Codec("int8"))).packet["x"],
        nonfinite["x"],
    )


def test_zlib_bomb_stops_at_claimed_size():
    """A small frame that inflates to 1 GB is refused after inflating at most its claim."""
    header = {
        "v": 1,
        "kind": "data",
        "rid": 1,
        "stage": "",
        "deadline_s": 1.0,
        "meta": {},
        "tensors": [
            {"name": "x", "dtype": "uint8", "shape": [64], "enc": "raw", "z": "zlib", "nbytes": 0}
        ],
    }
    bomb = zlib.compressobj(9)
    frame = b"".join(bomb.compress(b"\0" * (1 << 20)) for _ in range(64)) + bomb.flush()
    header["tensors"][0]["nbytes"] = len(frame)
    with pytest.raises(PacketError):
        wire.decode([msgpack.packb(header), frame])


def _good() -> list[bytes]:
    p = Packet({"images": torch.rand(1, 3, 8, 8), "ids": torch.arange(5)})
    return wire.encode(
        Message("data", rid=7, stage="vision", deadline_s=0.5, meta={"batch": 1}, packet=p)
    )


def _mutations(rng: random.Random) -> list[list[bytes]]:
    """Truncations, bit flips, absurd shapes, wrong dtypes, frame count and size lies."""
    good = _good()
    header = msgpack.unpackb(good[0])
    out = []
    f = list(good)
    f[rng.randrange(len(f))] = bytes(f[0][: rng.randrange(len(f[0]))])
    out.append(f)
    f = [bytearray(x) for x in good]
    i = rng.randrange(len(f))
    if f[i]:
        f[i][rng.randrange(len(f[i]))] ^= 1 << rng.randrange(8)
    out.append([bytes(x) for x in f])
    for key, value in [
        ("shape", [rng.choice([2**40, 2**31, -1, 10**30 % 2**63, "x"]), 3]),
        ("dtype", rng.choice(["float128", "object", 3, None, "complex64"])),
        ("nbytes", rng.choice([-1, 2**62, 0, "9", 10**9])),
        ("enc", rng.choice(["int8", "pickle", 7])),
        ("scale", rng.choice([float("nan"), -1.0, 0.0, float("inf")])),
        ("z", rng.choice(["lzma", "pickle", 1])),
        ("name", rng.choice(["", 7, "x" * 1000, None])),
    ]:
        h = msgpack.unpackb(good[0])
        h["tensors"][rng.randrange(2)][key] = value
        out.append([msgpack.packb(h), *good[1:]])
    for key, value in [
        ("v", 2),
        ("kind", "exec"),
        ("rid", -5),
        ("meta", [1]),
        ("tensors", {}),
        ("deadline_s", "soon"),
        ("tensors", [{}] * 100),
        ("stage", b"\x00" * 9),
    ]:
        h = dict(header)
        h[key] = value
        out.append([msgpack.packb(h, use_bin_type=True), *good[1:]])
    out.append(good[:-1])  # a frame missing
    out.append([*good, b"\0" * 64])  # a frame too many
    out.append([good[0], good[1] + b"\0", good[2]])  # oversize payload
    out.append([bytes(rng.getrandbits(8) for _ in range(rng.randrange(64)))])
    out.append([])
    return out


def test_fuzz_only_packet_errors_and_no_claimed_allocation():
    rng = random.Random(0)
    limits = Limits(max_tensor_bytes=1 << 24, max_total_bytes=1 << 25)
    tracemalloc.start()
    try:
        cases = 0
        for _ in range(40):
            for frames in _mutations(rng):
                cases += 1
                with contextlib.suppress(PacketError):
                    wire.decode(frames, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cases > 500
    assert peak < 8 << 20  # nowhere near the 2^40-element tensors some headers claimed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=4))
def test_random_frames_raise_packet_error_only(frames):
    with contextlib.suppress(PacketError):
        wire.decode(frames)


def test_unknown_codec_and_missing_lz4_are_refused():
    with pytest.raises(ValueError):
        Codec("fp4")
    with pytest.raises(ValueError):
        Codec(compress="brotli")
    if wire._lz4 is None:
        with pytest.raises(ValueError, match="lz4"):
            Codec(compress="lz4")


def test_bfloat16_tensors_travel_exactly():
    t = torch.randn(3, 4).to(torch.bfloat16)
    back = wire.decode(wire.encode(Message("result", packet=Packet({"t": t}))))
    assert back.packet["t"].dtype == torch.bfloat16 and torch.equal(back.packet["t"], t)
    assert np.array_equal(back.packet["t"].float().numpy(), t.float().numpy())


def test_a_pad_travels_as_zero_bytes_and_is_dropped_on_receipt():
    """An emulated device's packet padded to the real model's size: the link carries the pad
    (one frame of its own), the receiver gets back exactly the tensors."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    frames = wire.encode(
        Message(
            "data",
            rid=3,
            stage="vision",
            deadline_s=1.0,
            meta={},
            packet=Packet({"x": x}),
            pad=1000,
        )
    )
    assert len(frames) == 3 and frames[-1] == bytes(1000)
    back = wire.decode(frames)
    assert list(back.packet.tensors) == ["x"] and torch.equal(back.packet["x"], x)
    assert back.pad == 1000
    with pytest.raises(PacketError, match="pad frame is 999 bytes"):
        wire.decode([*frames[:-1], bytes(999)])
    with pytest.raises(PacketError, match="1 tensors and a pad, got 1 frames"):
        wire.decode(frames[:-1])
    with pytest.raises(PacketError, match="pad must be a byte count"):
        wire.decode(frames, Limits(max_total_bytes=24 + 999))  # the tensor's 24 bytes + pad
    with pytest.raises(PacketError, match="pad must be >= 0"):
        wire.encode(Message("data", pad=-1))
    header = msgpack.unpackb(frames[0], raw=False)
    header["pad"] = "1000"
    with pytest.raises(PacketError, match="pad must be a byte count"):
        wire.decode([msgpack.packb(header, use_bin_type=True), *frames[1:]])
    assert len(wire.encode(Message("data", packet=Packet({"x": x})))) == 2  # no pad, no frame
