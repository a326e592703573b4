"""Fixtures of the runtime tests: the shipped tiny policy, an in-process edge server on an
ephemeral port, request frames, and a generator of malformed messages."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
import torch
import zmq

from vlarun.policy.base import Policy
from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.transport import Security
from vlarun.stages import wire
from vlarun.stages.packet import Packet

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTION = "open the drawer"


@pytest.fixture(scope="session")
def policy() -> Policy:
    torch.set_num_threads(1)
    return Policy.from_checkpoint(ROOT / "checkpoints" / "tiny-ar")


@pytest.fixture
def server(policy):
    with EdgeServer(policy, Security(insecure=True), ServerConfig()) as srv:
        yield srv


@pytest.fixture
def dealer():
    """Raw DEALER sockets to an address (closed after the test); every receive has a timeout."""
    ctx = zmq.Context.instance()
    socks = []

    def make(address: str) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
        s.connect(address)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close(0)


@pytest.fixture
def vision_request(policy):
    """Frames of a valid request for the vision stage."""
    size = policy.model.cfg.image_size
    ids = policy.text_ids(INSTRUCTION)
    packet = Packet({"images": torch.rand(1, 1, 3, size, size)})
    meta = {"batch": 1, "text_tokens": len(ids), "want": ["visual"]}
    return wire.encode(
        wire.Message("data", rid=1, stage="vision", deadline_s=5.0, meta=meta, packet=packet)
    )


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """One malformed variant of a valid request: truncated, bit-flipped, wrong dtype, absurd
    shape, oversize or undersize payload, lying frame count, unknown stage or tensor."""
    header = msgpack.unpackb(frames[0])
    entry = header["tensors"][0]
    choice = rng.randrange(12)
    if choice == 0:
        return [frames[0][: rng.randrange(len(frames[0]))], *frames[1:]]
    if choice == 1:
        return [frames[0], frames[1][: rng.randrange(len(frames[1]))]]
    if choice == 2:
        return [frames[0], frames[1] + b"\0" * rng.randrange(1, 4096)]
    if choice == 3:
        entry["shape"] = [rng.choice([2**40, 2**20, 10**12]), 1, 3, 2**20, 2**20]
    elif choice == 4:
        entry["dtype"] = rng.choice(["float64", "int8", "bool", "float128", None])
    elif choice == 5:
        entry["nbytes"] = rng.choice([0, 1, 2**62, -3])
    elif choice == 6:
        header["stage"] = rng.choice(["decode", "vision+decode", "rm -rf", "", "x" * 400])
    elif choice == 7:
        entry["name"] = rng.choice(["visual", "image", "__reduce__"])
    elif choice == 8:
        header["meta"] = rng.choice([{"batch": 10**9}, {"batch": 1, "text_tokens": -1}, []])
    elif choice == 9:
        return [frames[0]]
    elif choice == 10:
        return [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))]
    else:
        entry["enc"], entry["scale"] = "int8", rng.choice([float("nan"), -1.0, 1e308])
    return [msgpack.packb(header), *frames[1:]]


@pytest.fixture
def malformed():
    return mutate
