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
from vlarun.runtime.client import ping
from vlarun.runtime.server import EdgeServer
from vlarun.runtime.transport import Security

INSECURE = Security(insecure=True)


def _options(*argv: str) -> ServeEdgeOptions:
    return parse_into(
        ServeEdgeOptions, build_parser("serve-edge", ServeEdgeOptions).parse_args(argv)
    )


def test_flags_reach_the_config_with_the_documented_defaults():
    cfg = _options().server_config()
    assert cfg.max_queued == 256 and cfg.max_message_bytes == 256 << 20
    assert cfg.address == "tcp://127.0.0.1:5555"
    cfg = _options("--max-queued", "3", "--max-frame-mb", "1.5", "--port", "0").server_config()
    assert cfg.max_queued == 3 and cfg.max_message_bytes == 3 << 19


@pytest.mark.parametrize("argv", [["--max-queued", "0"], ["--max-frame-mb", "0"],
                                  ["--max-frame-mb", "1e9"]])  # fmt: skip
def test_bad_limits_fail_in_one_line(argv, capsys):
    assert main(["serve-edge", "--insecure", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("--max-queued" in err or "--max-frame-mb" in err)


@pytest.fixture(scope="module")
def small_edge():
    """An edge with a 1 MiB frame cap."""
    torch.set_num_threads(1)
    o = _options("--insecure", "--port", "0", "--max-frame-mb", "1")
    with EdgeServer(Policy.load("tiny-ar"), INSECURE, o.server_config()) as srv:
        ping(srv.address, INSECURE, count=1, timeout_s=5.0)
        yield srv


def _health(rid: int) -> bytes:
    return msgpack.packb({"v": 1, "kind": "control", "rid": rid, "stage": "", "deadline_s": 1.0,
                          "meta": {"op": "health"}, "tensors": []})  # fmt: skip


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
