"""A robot against a lying edge, quick: a real ZeroMQ ROUTER on loopback answers the robot's
real requests with well-formed wire messages that lie (timings missing or not numbers,
actions of the wrong shape or NaN, tensors not asked for, a message of the wrong kind,
garbage bytes) and its health replies lie too. The robot never raises: every step is a
fallback naming its cause, with finite actions of the right shape computed here."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import zmq

from vlarun.policy import Policy
from vlarun.runtime.robot.agent import AgentConfig, RobotAgent
from vlarun.runtime.robot.client import LinkDown
from vlarun.runtime.transport import Security
from vlarun.stages import wire
from vlarun.stages.packet import Packet

INSECURE = Security(insecure=True)


def _lies(stage: str, honest: dict[str, torch.Tensor]) -> list:
    """(what the lie is, the meta and tensors of a result that tells it, or a wrong kind).
    ``honest``: the tensors the request wants, as the model makes them."""
    timing = [{"stage": s, "compute_s": 0.01, "queue_s": 0.0, "batch": 1} for s in stage.split("+")]
    good = {"timings": timing, "server_s": 0.01}
    a = honest["actions"]
    return [
        ("no timings", {"server_s": 0.01}, honest),
        ("server_s not a number", {**good, "server_s": "fast"}, honest),
        ("server_s NaN", {**good, "server_s": float("nan")}, honest),
        (
            "a stage it did not ask for",
            {**good, "timings": [{**timing[0], "stage": "rm"}]},
            honest,
        ),
        ("batch 0", {**good, "timings": [{**timing[0], "batch": 0}]}, honest),
        ("wrong shape", good, {**honest, "actions": torch.zeros(1, 3, 99)}),
        ("NaN actions", good, {**honest, "actions": torch.full_like(a, float("nan"))}),
        ("inf actions", good, {**honest, "actions": torch.full_like(a, float("inf"))}),
        ("no actions", good, {k: v for k, v in honest.items() if k != "actions"}),
        ("extra tensor", good, {**honest, "x": torch.zeros(2)}),
        ("integer actions", good, {**honest, "actions": a.to(torch.int32)}),
        ("wrong kind", "control", None),
        ("garbage", "garbage", None),
    ]


class LyingEdge:
    """Answers the n-th data request with the n-th lie (cycling) and every health probe with
    a health map whose numbers are strings and whose schedule is nonsense."""

    def __init__(self, policy: Policy) -> None:
        image = np.zeros((128, 128, 3), np.uint8)
        self.honest = dict(policy.run_stages(image, "open the drawer").outputs)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.told: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            who, *frames = self.sock.recv_multipart()
            msg = wire.decode(frames)
            if msg.kind == "control":
                lie = {
                    "ok": True,
                    "stage_ms": {"vision": "slow", "decode": float("nan")},
                    "queue": {"vision": -3},
                    "schedule": [{"stage": 1, "start_s": "x"}],
                }
                self.sock.send_multipart([who, *wire.control("health", msg.rid, **lie)])
                continue
            honest = {k: self.honest[k] for k in msg.meta["want"]}
            what, meta, tensors = _lies(msg.stage, honest)[n % 13]
            n += 1
            self.told.append(what)
            if meta == "control":
                out = wire.control("health", msg.rid, ok=True)
            elif meta == "garbage":
                out = [b"\x93\x00\xff", b"junk"]
            else:
                out = wire.encode(
                    wire.Message(
                        "result", rid=msg.rid, stage=msg.stage, meta=meta, packet=Packet(tensors)
                    )
                )
            self.sock.send_multipart([who, *out])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close(0)


@pytest.mark.parametrize("strategy", ["edge-only", "fixed-split"])
def test_every_lie_is_a_fallback_with_its_cause_never_a_crash(strategy):
    torch.set_num_threads(1)
    policy = Policy.load("tiny-ar")
    edge = LyingEdge(policy)
    cfg = AgentConfig(slo_s=1.0, strategy=strategy)
    agent = RobotAgent(policy, cfg, edge.address, INSECURE)
    image = np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)
    want = policy.predict(image, "open the drawer")
    try:
        assert agent.edge_up  # the lying health map was made safe, not fatal
        steps = [agent.infer(image, "open the drawer") for _ in range(13)]
    finally:
        agent.close()
        edge.close()
    assert len(edge.told) >= 12  # (the edge may be marked down after the garbage)
    for inf in steps:
        assert inf.fallback is not None and (
            "bad reply" in inf.fallback or "link" in inf.fallback
        ), inf.fallback
        assert set(inf.ran.values()) == {"robot"}
        assert inf.actions.shape == want.shape and np.isfinite(inf.actions).all()
        np.testing.assert_allclose(inf.actions, want, atol=1e-4)
    causes = " | ".join(s.fallback for s in steps)
    for cause in ("server_s", "timing", "NaN", "wanted"):
        assert cause in causes, causes


def test_a_reply_larger_than_the_graph_allows_is_never_buffered():
    """A lying edge sends a 64 MB "answer" under another request id before each real one
    (issue 45, 11: two 256 MB replies per request took a robot to 55% on time): the robot's
    socket refuses any message part over what its graph can emit (ZeroMQ's MAXMSGSIZE: the
    connection is dropped, not the memory filled), and an answer to another request id is
    dropped on its header without building its tensors."""
    from vlarun.runtime.robot.client import EdgeClient, reply_limits

    policy = Policy.load("tiny-ar")
    limits = reply_limits(policy)
    assert limits.max_total_bytes < 8 << 20  # tiny-ar's largest packet is ~1 MB
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = EdgeClient(f"tcp://127.0.0.1:{port}", INSECURE, ctx, limits)
    assert client.sock.getsockopt(zmq.MAXMSGSIZE) == limits.max_total_bytes
    try:
        # Wait for the connection itself (the event), not a fixed time: on a busy machine the
        # DEALER's non-blocking send is refused until its TCP connection is up.
        end = time.monotonic() + 30.0
        while True:
            try:
                client._send(wire.control("health", 7))
                break
            except LinkDown:
                assert time.monotonic() < end, "the client never connected"
                time.sleep(0.01)
        assert router.poll(30_000)
        who, *_ = router.recv_multipart()
        huge = wire.encode(
            wire.Message(
                "result", rid=99, stage="vision", packet=Packet({"x": torch.zeros(16 << 20)})
            )
        )
        router.send_multipart([who, *huge])  # 64 MB: over the limit
        other = wire.encode(
            wire.Message("result", rid=98, stage="vision", packet=Packet({"x": torch.zeros(1000)}))
        )
        router.send_multipart([who, *other])
        with pytest.raises(Exception, match="no reply"):  # neither is the answer to 7
            client._await(7, 1.0)
    finally:
        client.close()
        router.close(0)
