"""A handshake flood from a key the edge does not authorize costs the edge's Python threads
nothing (issue 64, 2). ZeroMQ asks the edge's ZAP endpoint about every CURVE handshake; pyzmq's
``ThreadAuthenticator`` answered on a Python thread of the edge (an asyncio loop per request,
under the edge's interpreter lock: 0.38 ms of the edge's core per refused handshake). Now a
C-level proxy forwards each request to an authorizer process (``runtime.zap``), which answers
and writes the refusal line; the edge's process runs no Python per handshake.

Counted, not timed: every Python call on the threads the edge starts is counted by a profile
hook (``threading.setprofile``) while 20 handshakes are refused. The threads that serve robots
(``edge-io``, ``edge-worker``) poll on a timer whatever happens, so they are left out: a ZAP
request never reaches them, and what matters is the Python that runs *because* of a handshake.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

import pytest
import torch
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from vlarun.policy import Policy
from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.edge.zap import REFUSALS_BURST, ZAP_VERSION, Authorizer, Tarpit
from vlarun.runtime.robot.client import ping
from vlarun.runtime.transport import KeyPair, Security, generate_keys, load_keys

FLOOD = REFUSALS_BURST  # within one source's burst: each refused at once (no tarpit wait)
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
        # Before: the authenticator's thread made ~390 Python calls per refused handshake.
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


def test_an_address_flooding_past_its_budget_waits_and_an_authorized_robot_does_not(policy, keys):
    """The tarpit end to end: 40 handshakes with a stranger's key at once, from loopback.
    Past the address's burst the refusals are held (here 5 s); the authorized robot, on the
    same address, is let in while they wait, and every stranger is refused in the end."""
    server, robot, public = keys
    hold_s, n = 5.0, 2 * REFUSALS_BURST
    stranger = KeyPair(*zmq.curve_keypair())
    ctx = zmq.Context.instance()
    with EdgeServer(policy, server, ServerConfig(refusal_hold_s=hold_s)) as srv:
        socks, mons = [], []
        for _ in range(n):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.curve_serverkey, s.curve_publickey = public, stranger.public
            s.curve_secretkey = stranger.secret
            mons.append(s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH))
            socks.append(s)
        t0 = time.monotonic()
        for s in socks:
            s.connect(srv.address)
        try:
            assert _verdict(srv.address, public, robot.own) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            waiting = sum(1 for m in mons if not m.poll(0))
            assert waiting > 0, "every stranger was answered before the robot was let in"
            for m in mons:
                assert m.poll(60_000), "a held refusal was never sent"
                assert recv_monitor_message(m)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
            assert time.monotonic() - t0 >= 0.9 * hold_s  # the last ones were held
        finally:
            for s, m in zip(socks, mons, strict=True):
                s.disable_monitor()
                m.close(0)
                s.close(0)


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
    assert auth.counts == {"admitted": 1, "refused": 4, "held": 0}


def test_a_sources_refusals_past_its_budget_are_held_and_an_admission_never_is():
    """The tarpit by itself: a source's first ``burst`` refusals go at once, then one a
    ``1 / per_s`` seconds; past that each is held ``hold_s``; another address has its own
    budget; at most ``max_held`` wait; the table forgets the least recent source."""
    pit = Tarpit(burst=3, per_s=2.0, hold_s=1.5, max_held=2, max_sources=2)
    assert [pit.hold_s(b"10.0.0.9", 100.0) for _ in range(4)] == [0.0, 0.0, 0.0, 1.5]
    assert pit.hold_s(b"10.0.0.7", 100.0) == 0.0  # its own bucket
    assert pit.hold_s(b"10.0.0.9", 100.5) == 0.0  # half a second: one token back
    assert pit.hold_s(b"10.0.0.9", 100.5) == 1.5
    pit.held = 2
    assert pit.hold_s(b"10.0.0.9", 100.5) == 0.0  # max_held wait already: answered at once
    pit.hold_s(b"10.0.0.5", 100.5)  # a third source: the least recent (10.0.0.7) forgotten
    assert b"10.0.0.7" not in pit._sources and len(pit._sources) == 2


def test_the_authorizer_sends_a_held_refusal_late_and_an_admission_at_once():
    """``serve`` on a ROUTER: a refusal held by the tarpit does not hold up the answer to an
    authorized key from the same address, and is sent once its time has come (a clock the
    test moves: no sleeps)."""
    good, bad = KeyPair(*zmq.curve_keypair()), KeyPair(*zmq.curve_keypair())
    now = [100.0]

    class Log:
        def refused(self, kind: str, who: str, why: str) -> None:
            pass

    auth = Authorizer({good.public}, Log(), Tarpit(burst=1, per_s=0.0, hold_s=5.0), lambda: now[0])
    ctx = zmq.Context()
    proxy = ctx.socket(zmq.DEALER)  # stands where the edge's proxy is
    proxy.setsockopt(zmq.LINGER, 0)
    port = proxy.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        with contextlib.suppress(zmq.ZMQError):  # ends when the test's context is destroyed
            auth.serve(f"tcp://127.0.0.1:{port}", ctx)

    threading.Thread(target=serve, daemon=True).start()

    def ask(rid: bytes, key: KeyPair) -> None:
        req = [ZAP_VERSION, rid, b"", b"10.0.0.9", b"", b"CURVE", z85.decode(key.public)]
        proxy.send_multipart([b"socket", b"", *req])

    def reply() -> list[bytes]:
        assert proxy.poll(30_000), "the authorizer did not answer"
        return proxy.recv_multipart()

    try:
        ask(b"1", bad)
        assert reply()[:5] == [b"socket", b"", ZAP_VERSION, b"1", b"400"]  # the burst: at once
        ask(b"2", bad)  # past the burst: held
        ask(b"3", good)  # the same address, an authorized key: answered first
        assert reply()[3:5] == [b"3", b"200"]
        assert not proxy.poll(200)  # the refusal still waits (its time has not come)
        now[0] += 5.0
        ask(b"4", good)  # wakes the loop, which sends what is due
        got = {r[3]: r[4] for r in (reply(), reply())}
        assert got == {b"2": b"400", b"4": b"200"}
        assert auth.counts == {"admitted": 2, "refused": 2, "held": 1}
    finally:
        ctx.destroy(0)


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


def test_the_hold_reaches_the_config_and_a_bad_value_fails_in_one_line(capsys):
    from vlarun.apps.runtime import ServeEdgeOptions
    from vlarun.cli import build_parser, main, parse_into

    parser = build_parser("serve-edge", ServeEdgeOptions)
    cfg = parse_into(ServeEdgeOptions, parser.parse_args(["--refusal-hold-s", "2.5"]))
    assert cfg.server_config().refusal_hold_s == 2.5
    assert main(["serve-edge", "--insecure", "--refusal-hold-s", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--refusal-hold-s" in err[1]  # the insecure warning first
