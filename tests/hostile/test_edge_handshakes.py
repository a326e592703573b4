"""A handshake flood from a key the edge does not authorize costs the edge's Python threads
nothing (issue 64, 2). ZeroMQ asks the edge's ZAP endpoint about every CURVE handshake; pyzmq's
``ThreadAuthenticator`` answered on a Python thread of the edge (an asyncio loop per request,
under the edge's interpreter lock: 0.38 ms of the edge's core per refused handshake). Now a
C-level proxy forwards each request to an authorizer process (``runtime.zap``), which answers
and writes the refusal line; the edge's process runs no Python per handshake.

Counted, not timed: every Python call on the threads the edge starts is counted by a profile
hook (``threading.setprofile``) while 60 handshakes are refused. The threads that serve robots
(``edge-io``, ``edge-worker``) poll on a timer whatever happens, so they are left out: a ZAP
request never reaches them, and what matters is the Python that runs *because* of a handshake.
"""

from __future__ import annotations

import collections
import threading

import pytest
import torch
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from vlarun.policy import Policy
from vlarun.runtime.edge.server import EdgeServer
from vlarun.runtime.edge.zap import ZAP_VERSION, Authorizer
from vlarun.runtime.robot.client import ping
from vlarun.runtime.transport import KeyPair, Security, generate_keys, load_keys

FLOOD = 60
SERVING = ("edge-io", "edge-worker")  # the edge's own threads, polling on a timer


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    return Policy.load("tiny-ar")


@pytest.fixture
def keys(tmp_path):
    """(the edge's Security, an authorized robot's, the edge's public key)."""
    edge = generate_keys(tmp_path / "edge", "edge")
    robot = generate_keys(tmp_path / "authorized", "robot")
    public = load_keys(edge["public"]).public
    server = Security(own=load_keys(edge["secret"]), authorized_dir=str(tmp_path / "authorized"))
    return server, Security(own=load_keys(robot["secret"]), server_public=public), public


def _verdict(address: str, server_public: bytes, own: KeyPair, timeout_s: float = 20.0) -> int:
    """One fresh DEALER's handshake with ``own``'s key: the monitor event that ended it."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_public, own.public, own.secret
    mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        s.connect(address)
        assert mon.poll(int(1e3 * timeout_s)), "the edge gave no verdict on a handshake"
        return recv_monitor_message(mon)["event"]
    finally:
        s.disable_monitor()
        mon.close(0)
        s.close(0)


def test_refused_handshakes_run_no_python_in_the_edges_process(policy, keys, capfd):
    server, robot, public = keys
    calls: collections.Counter[str] = collections.Counter()

    def count(frame, event, arg) -> None:
        if event == "call":
            calls[threading.current_thread().name] += 1

    threading.setprofile(count)  # every thread the edge starts from here on is counted
    try:
        srv = EdgeServer(policy, server).start()
    finally:
        threading.setprofile(None)
    try:
        assert ping(srv.address, robot, count=1, timeout_s=10.0)["secure"]
        before = {k: v for k, v in calls.items() if k not in SERVING}
        stranger = KeyPair(*zmq.curve_keypair())
        verdicts = [_verdict(srv.address, public, stranger) for _ in range(FLOOD)]
        assert verdicts == [zmq.EVENT_HANDSHAKE_FAILED_AUTH] * FLOOD
        after = {k: v for k, v in calls.items() if k not in SERVING}
        per_thread = {k: after[k] - before.get(k, 0) for k in after}
        # Before: the authenticator's thread made ~60 Python calls per refused handshake.
        assert sum(per_thread.values()) < FLOOD, per_thread
        # The authorized robot is still let in, and served.
        assert _verdict(srv.address, public, robot.own) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert ping(srv.address, robot, count=1, timeout_s=10.0)["secure"]
        authorizer = srv.auth.proc
    finally:
        srv.stop()
    assert authorizer.poll() is not None  # ended with the edge
    err = capfd.readouterr().err
    # The refusal log, from the authorizer, on the edge's stderr, at most a line a second.
    lines = [ln for ln in err.splitlines() if "refused handshake from" in ln]
    assert lines and stranger.public.decode() in lines[0] and "is not authorized" in lines[0]
    assert len(lines) <= 2 + FLOOD // 10, lines


def test_an_authorizer_that_ends_is_started_again_and_admits_nobody_meanwhile(policy, keys):
    """Fail closed: while no authorizer answers, a handshake waits (no robot is admitted
    unchecked); the edge starts a new one and the robot is then let in."""
    server, robot, public = keys
    with EdgeServer(policy, server) as srv:
        first = srv.auth.proc
        first.kill()
        first.wait(10)
        assert _verdict(srv.address, public, robot.own, 60.0) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert srv.auth.proc is not first and srv.auth.proc.poll() is None
        stranger = KeyPair(*zmq.curve_keypair())
        assert _verdict(srv.address, public, stranger) == zmq.EVENT_HANDSHAKE_FAILED_AUTH


def test_the_authorizer_answers_as_zap_says():
    """RFC 27's reply: 200 with the key in Z85 as the User-Id (``transport.peer_key`` reads
    it back off every message), 400 for any other key, mechanism or malformed request."""
    good, bad = KeyPair(*zmq.curve_keypair()), KeyPair(*zmq.curve_keypair())
    lines: list[tuple[str, str, str]] = []

    class Log:
        def refused(self, kind: str, who: str, why: str) -> None:
            lines.append((kind, who, why))

    auth = Authorizer({good.public}, Log())
    req = [ZAP_VERSION, b"7", b"", b"10.0.0.9", b"", b"CURVE"]
    assert auth.answer([*req, z85.decode(good.public)]) == [
        ZAP_VERSION,
        b"7",
        b"200",
        b"OK",
        good.public,
        b"",
    ]
    assert auth.answer([*req, z85.decode(bad.public)])[2:5] == [b"400", b"Unknown key", b""]
    assert auth.answer([*req[:5], b"NULL"])[2] == b"400"
    assert auth.answer([ZAP_VERSION, b"8"])[:3] == [ZAP_VERSION, b"8", b"400"]
    assert auth.answer([b"0.9", *req[1:], z85.decode(good.public)])[2] == b"400"
    assert lines[0] == ("handshake", "10.0.0.9", f"its key {bad.public.decode()} is not authorized")
    assert auth.counts == {"admitted": 1, "refused": 4}


def test_the_edge_waits_for_its_authorizer_before_it_listens(policy, keys, monkeypatch):
    """The ZAP endpoint is bound, and the authorizer connected, before the edge's socket
    binds: the first robot's handshake is checked like every later one."""
    import vlarun.runtime.edge.server as server_mod

    server, robot, public = keys
    order: list[str] = []
    real_router, real_auth = server_mod.router_socket, server_mod.EdgeAuth

    def router(*a, **kw):
        order.append("router")
        return real_router(*a, **kw)

    def auth(*a, **kw):
        a_ = real_auth(*a, **kw)
        order.append("auth" if a_.proc is not None and a_.proc.poll() is None else "no auth")
        return a_

    monkeypatch.setattr(server_mod, "router_socket", router)
    monkeypatch.setattr(server_mod, "EdgeAuth", auth)
    with EdgeServer(policy, server) as srv:
        assert order == ["auth", "router"]
        stranger = KeyPair(*zmq.curve_keypair())
        assert _verdict(srv.address, public, stranger) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert _verdict(srv.address, public, robot.own) == zmq.EVENT_HANDSHAKE_SUCCEEDED
