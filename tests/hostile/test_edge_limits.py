"""`serve-edge`'s bounds as flags, quick: `--max-queued` and `--max-frame-mb` reach the
server's config with the defaults docs/security.md states, bad values fail in one line, a
frame over the cap gets its sender disconnected (no answer) while the edge keeps answering
others. (A full queue refusing at once: tests/runtime/test_server.py.)"""

from __future__ import annotations

import time

import msgpack
import pytest
import torch
import zmq

from vlarun.apps.runtime import ServeEdgeOptions
from vlarun.cli import build_parser, main, parse_into
from vlarun.policy import Policy
from vlarun.runtime.edge.server import EdgeServer
from vlarun.runtime.robot.client import ping
from vlarun.runtime.transport import Security

INSECURE = Security(insecure=True)


def _options(*argv: str) -> ServeEdgeOptions:
    return parse_into(
        ServeEdgeOptions, build_parser("serve-edge", ServeEdgeOptions).parse_args(argv)
    )


def test_flags_reach_the_config_with_the_documented_defaults():
    cfg = _options().server_config()
    assert cfg.max_queued == 256 and cfg.max_message_bytes == 256 << 20
    assert cfg.max_queued_per_robot == 16
    assert _options("--max-queued-per-robot", "2").server_config().max_queued_per_robot == 2
    assert cfg.address == "tcp://127.0.0.1:5555"
    cfg = _options("--max-queued", "3", "--max-frame-mb", "1.5", "--port", "0").server_config()
    assert cfg.max_queued == 3 and cfg.max_message_bytes == 3 << 19


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-queued", "0"],
        ["--max-frame-mb", "0"],
        ["--max-frame-mb", "1e9"],
        ["--max-queued-per-robot", "0"],
    ],
)
def test_bad_limits_fail_in_one_line(argv, capsys):
    assert main(["serve-edge", "--insecure", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("--max-queued" in err or "--max-frame-mb" in err)
    assert argv[0] in err


@pytest.fixture(scope="module")
def small_edge():
    """An edge with a 1 MiB frame cap."""
    torch.set_num_threads(1)
    o = _options("--insecure", "--port", "0", "--max-frame-mb", "1")
    with EdgeServer(Policy.load("tiny-ar"), INSECURE, o.server_config()) as srv:
        ping(srv.address, INSECURE, count=1, timeout_s=5.0)
        yield srv


def _health(rid: int) -> bytes:
    return msgpack.packb(
        {
            "v": 1,
            "kind": "control",
            "rid": rid,
            "stage": "",
            "deadline_s": 1.0,
            "meta": {"op": "health"},
            "tensors": [],
        }
    )


def test_a_frame_over_the_cap_disconnects_its_sender_only(small_edge):
    ctx = zmq.Context.instance()
    big, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        for s in (big, other):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 2000)
            s.connect(small_edge.address)
        time.sleep(0.2)
        big.send_multipart([_health(1), b"x" * ((1 << 20) + 1)])
        with pytest.raises(zmq.Again):
            big.recv_multipart()  # dropped by ZeroMQ before the edge saw it
        other.send_multipart([_health(2)])
        assert len(other.recv_multipart()) == 1  # everyone else is still answered
    finally:
        big.close(0)
        other.close(0)


def test_a_flooding_robot_gets_its_share_and_another_robot_is_still_served():
    """One identity sends 12 requests at once, due when a second robot's request is: beyond
    its share of 4 queued it is told "busy" at once; the second robot's request is admitted
    and answered in time. (Without the share, the flood's admitted work fills the time
    before the shared deadline and the second robot is refused or answered too late.) The
    edge emulates OpenVLA-7B on an RTX 4090 at half speed: the flood cannot drain as it lands."""
    from vlarun.runtime.edge.server import ServerConfig
    from vlarun.runtime.emulate import Emulation
    from vlarun.runtime.robot.client import EdgeClient
    from vlarun.stages import wire
    from vlarun.stages.families import graph_inputs

    torch.set_num_threads(1)
    policy = Policy.load("tiny-ar")
    emu = Emulation("openvla-7b", "rtx4090", time_scale=0.5, jitter=0.0)
    cfg = ServerConfig(max_batch=1, max_queued_per_robot=4, emulate=emu)
    ids = policy.text_ids("open the drawer")
    images = torch.zeros(1, 1, 3, policy.model.cfg.image_size, policy.model.cfg.image_size)
    packet = graph_inputs(policy.model.cfg, images, [ids])
    meta = {"batch": 1, "text_tokens": len(ids), "want": ["actions"]}
    stages = "vision+prefill+decode"
    with EdgeServer(policy, INSECURE, cfg) as srv:
        srv.warmup()
        ping(srv.address, INSECURE, count=1, timeout_s=5.0)
        flood, robot = EdgeClient(srv.address, INSECURE), EdgeClient(srv.address, INSECURE)
        try:
            for c in (flood, robot):  # connected (IMMEDIATE refuses sends until then)
                end = time.monotonic() + 5.0
                while not c.sock.poll(0, zmq.POLLOUT) and time.monotonic() < end:
                    time.sleep(0.02)
                c.health(5.0)
            rids = list(range(100, 112))
            for rid in rids:  # all at once, not waiting for answers
                flood._send(
                    wire.encode(
                        wire.Message(
                            "data", rid=rid, stage=stages, deadline_s=8.0, meta=meta, packet=packet
                        )
                    )
                )
            time.sleep(0.3)  # the flood has landed (its refusals are answered at once)
            t0 = time.monotonic()
            reply = robot.run(tuple(stages.split("+")), packet, ("actions",), 8.0, 8.0, meta)
            took = time.monotonic() - t0
            answers: dict[int, wire.Message] = {}
            end = time.monotonic() + 30.0
            while len(answers) < len(rids) and flood.sock.poll(1000) and time.monotonic() < end:
                msg = wire.decode(flood.sock.recv_multipart())
                answers[msg.rid] = msg
        finally:
            flood.close()
            robot.close()
    assert sorted(answers) == rids  # every flood request answered (result, busy or expired)
    busy = [a for a in answers.values() if a.kind == "error" and "busy" in str(a.meta.get("error"))]
    assert len(busy) >= 12 - 4 - 1  # its share queued (and one perhaps running already)
    assert reply.packet["actions"].shape[0] == 1 and took <= 8.0
