"""One key is one share at the edge (issue 64, 1): the per-robot queue share, bookings and the
seen-robots table count the robot's authenticated CURVE key, not its ZeroMQ connections. One
authorized key opening 12 DEALER connections, each sending two requests at once, gets its one
share (4 queued, 4 connections); the rest is refused at once with the share named, and a
second authorized robot is admitted and served beside it, on one edge and behind a scale-out
front (the same core). Under ``--insecure`` there is no key: each connection is its own robot,
as before. (Before: each connection had a share of its own, and all 24 were admitted.)"""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest
import torch
import zmq

from vlarun.policy import Policy
from vlarun.runtime.edge.core import (
    CONTENDED_S,
    MAX_SEEN,
    RECENT_S,
    DataRequest,
    EdgeCore,
    EdgeRecords,
    Quote,
)
from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.emulate import Emulation
from vlarun.runtime.robot.client import EdgeClient
from vlarun.runtime.transport import KeyPair, Security, dealer_socket, generate_keys, load_keys
from vlarun.stages import wire
from vlarun.stages.families import graph_inputs

STAGES = ("vision", "prefill", "decode")
SHARE = 4  # --max-queued-per-robot and --max-identities-per-key of these edges
CONNECTIONS, EACH = 12, 2  # the flooding key's connections, and the requests each sends
# The edge stands in for OpenVLA-7B on an RTX 4090 at half speed (~0.36 s a request, one at a
# time): the flood cannot drain while it lands, and 24 admitted requests would hold it ~9 s.
EMULATE = Emulation("openvla-7b", "rtx4090", time_scale=0.5, jitter=0.0)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The edge's key pair and two authorized robots' keys: the flooder's and an honest one's."""
    d = tmp_path_factory.mktemp("keys")
    edge = generate_keys(d / "edge", "edge")
    robots = {name: generate_keys(d / "authorized", name) for name in ("flood", "robot")}
    server = Security(own=load_keys(edge["secret"]), authorized_dir=str(d / "authorized"))
    public = load_keys(edge["public"]).public
    clients = {
        n: Security(own=load_keys(r["secret"]), server_public=public) for n, r in robots.items()
    }
    return server, clients


@pytest.fixture(scope="module")
def request_():
    """One whole-graph tiny-ar request: (packet, meta)."""
    torch.set_num_threads(1)
    policy = Policy.load("tiny-ar")
    ids = policy.text_ids("open the drawer")
    size = policy.model.cfg.image_size
    packet = graph_inputs(policy.model.cfg, torch.zeros(1, 1, 3, size, size), [ids])
    return policy, packet, {"batch": 1, "text_tokens": len(ids), "want": ["actions"]}


def _config(**kw) -> ServerConfig:
    return ServerConfig(
        max_batch=1, max_queued_per_robot=SHARE, max_identities_per_key=SHARE, emulate=EMULATE, **kw
    )


def _connected(address: str, sec: Security, n: int) -> list[zmq.Socket]:
    """``n`` DEALER connections with ``sec``'s key, each through its handshake (a health
    round trip answered), so the requests sent next all land at once."""
    ctx = zmq.Context.instance()
    socks = [dealer_socket(ctx, address, sec) for _ in range(n)]
    for i, s in enumerate(socks):
        end = time.monotonic() + 30.0
        while True:  # IMMEDIATE: a send fails until the connection is up
            try:
                s.send_multipart(wire.control("health", 1 + i), zmq.NOBLOCK)
                break
            except zmq.Again:
                assert time.monotonic() < end, "no connection to the edge"
                s.poll(20, zmq.POLLOUT)
        assert s.poll(30_000), "the edge did not answer a health request"
        s.recv_multipart()
    return socks


def _flood(socks: list[zmq.Socket], packet, meta, each: int = EACH) -> dict[int, zmq.Socket]:
    """Every connection sends ``each`` requests at once, due in 60 s; rid -> its socket."""
    sent = {}
    for i, s in enumerate(socks):
        for j in range(each):
            rid = 100 + each * i + j
            msg = wire.Message(
                "data", rid=rid, stage="+".join(STAGES), deadline_s=60.0, meta=meta, packet=packet
            )
            s.send_multipart(wire.encode(msg))
            sent[rid] = s
    return sent


def _until(done, timeout_s: float, what: str) -> None:
    """Wait (bounded) for ``done()``: an event, not a time."""
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _answers(socks: list[zmq.Socket], n: int, timeout_s: float) -> dict[int, wire.Message]:
    """The first ``n`` answers on ``socks`` (results and refusals), by rid."""
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    out: dict[int, wire.Message] = {}
    end = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < end:
        for s, _ in poller.poll(200):
            msg = wire.decode(s.recv_multipart())
            out[msg.rid] = msg
    return out


def _busy(answers: dict[int, wire.Message]) -> list[str]:
    return [
        str(a.meta.get("error"))
        for a in answers.values()
        if a.kind == "error" and "busy" in str(a.meta.get("error"))
    ]


def _flood_beside_a_robot(address: str, stats: dict, keys, request_) -> tuple:
    """The flooding key's 24 requests land; once each is admitted or refused, the honest
    robot sends one (10 s budget). Returns (the flood's answers, the robot's reply, its time)."""
    _, clients = keys
    _, packet, meta = request_
    flood = _connected(address, clients["flood"], CONNECTIONS)
    robot = EdgeClient(address, clients["robot"])
    try:
        _until(lambda: robot.sock.poll(0, zmq.POLLOUT), 30.0, "the robot's connection")
        robot.health(30.0)
        sent = _flood(flood, packet, meta)
        _until(
            lambda: stats["requests"] + stats["refused"] >= len(sent),
            60.0,
            "the flood to be admitted or refused",
        )
        t0 = time.monotonic()
        reply = robot.run(STAGES, packet, ("actions",), 10.0, 30.0, meta)
        took = time.monotonic() - t0
        answers = _answers(flood, len(sent), 60.0)
    finally:
        robot.close()
        for s in flood:
            s.close(0)
    assert sorted(answers) == sorted(sent)  # every flood request answered
    return answers, reply, took


def _check_one_share(answers, reply, took) -> None:
    busy = _busy(answers)
    served = [a for a in answers.values() if a.kind == "result"]
    # Its share queued (one more perhaps running, two more done while the flood landed on a
    # busy machine): the rest, refused at once, each naming the share. Before, all 24 were
    # admitted.
    assert len(busy) >= CONNECTIONS * EACH - SHARE - 3, busy
    assert len(served) <= SHARE + 3
    assert all(f"its share is {SHARE}" in b for b in busy), busy
    assert any("--max-identities-per-key" in b for b in busy)  # connections past its share
    assert reply.packet["actions"].shape[0] == 1 and took <= 10.0


def test_one_key_on_many_connections_gets_one_share_on_one_edge(keys, request_):
    server, _ = keys
    policy = request_[0]
    with EdgeServer(policy, server, _config()) as srv:
        srv.warmup()
        answers, reply, took = _flood_beside_a_robot(srv.address, srv.stats, keys, request_)
        assert len(srv.core.seen()) == 2  # two robots: the table counts keys, not connections
    _check_one_share(answers, reply, took)


def test_while_another_robot_is_served_a_key_has_one_request_queued(keys, request_):
    """Contention (issue 64's identity flood, measured): under earliest deadline first, one
    key's connections each with a request in flight kept ~1 s of the edge queued before the
    other robot's 1 s requests (2-8 of 15 answered). Once another key has sent data, a key's
    share is one queued request: of the flooding key's 8 (4 connections x 2, at once) one or
    two are admitted (one may already run), the rest refused at once naming why; the robot's
    next request is served. (Alone, the same flood gets its whole share: the test above.)"""
    _, clients = keys
    policy, packet, meta = request_
    with EdgeServer(policy, keys[0], _config()) as srv:
        srv.warmup()
        robot = EdgeClient(srv.address, clients["robot"])
        flood = _connected(srv.address, clients["flood"], SHARE)
        try:
            _until(lambda: robot.sock.poll(0, zmq.POLLOUT), 30.0, "the robot's connection")
            robot.run(STAGES, packet, ("actions",), 30.0, 60.0, meta)  # the robot is seen
            sent = _flood(flood, packet, meta, each=2)
            answers = _answers(flood, len(sent), 60.0)
            reply = robot.run(STAGES, packet, ("actions",), 30.0, 60.0, meta)
        finally:
            robot.close()
            for sock in flood:
                sock.close(0)
    busy = _busy(answers)
    assert sorted(answers) == sorted(sent)
    assert len(busy) >= len(sent) - 2, busy  # one queued, perhaps one already running
    assert all("its share is 1 while other robots are served" in b for b in busy), busy
    assert reply.packet["actions"].shape[0] == 1


def test_a_keys_bookings_count_against_its_one_share(keys, request_):
    """Plans booked (``op: book``) from three connections of one key: two are held (its share),
    the third is not; a second key's booking is still held."""
    from vlarun.sched.bookings import Booking

    server, clients = keys
    plan = Booking(STAGES, 0.5, 5.0).to_wire()
    with EdgeServer(request_[0], server, ServerConfig(max_queued_per_robot=2)) as srv:
        socks = _connected(srv.address, clients["flood"], 3)
        socks += _connected(srv.address, clients["robot"], 1)
        try:
            held = []
            for i, s in enumerate(socks):
                s.send_multipart(wire.control("book", 200 + i, **plan))
                assert s.poll(30_000), "the edge did not answer a booking"
                held.append(wire.decode(s.recv_multipart()).meta.get("ok"))
        finally:
            for s in socks:
                s.close(0)
    assert held == [True, True, False, True]


class _Workers:
    """Stands in for ``RayWorkers`` (no Ray): relayed ``EdgeServer`` workers in this process,
    reached over plain TCP on loopback, as a front reaches workers on its own machine."""

    auth_mode = "token"

    def __init__(self, policy, count: int) -> None:
        cfg = ServerConfig(max_batch=1, relayed=True, emulate=EMULATE)
        self.servers = [EdgeServer(policy, Security(insecure=True), cfg) for _ in range(count)]
        for srv in self.servers:
            srv.warmup()
            srv.start()
        self.actors = self.servers
        self.front = KeyPair(*zmq.curve_keypair())
        self._alive = concurrent.futures.Future()  # never done: no worker dies here

    def hello(self, i: int, timeout_s: float) -> dict:
        srv = self.servers[i]
        return {
            "endpoint": srv.address,
            "public": None,
            "pid": os.getpid(),
            "cfg": srv.policy.model.cfg,
            "dtype": srv.dtype,
            "stage_ms": {k: v * 1e3 for k, v in srv.queues.est_s.items()},
        }

    def lifetime(self, i: int):
        alive = self._alive

        class _Ref:
            def future(self):
                return alive

        return _Ref()

    def check(self, own_ports=()) -> None:
        pass

    def shutdown(self) -> None:
        for srv in self.servers:
            srv.stop()


def test_one_key_on_many_connections_gets_one_share_behind_a_front(keys, request_):
    from vlarun.runtime.scaleout.front import EdgeFront

    server, _ = keys
    front = EdgeFront(_Workers(request_[0], 1), server, _config()).start()
    try:
        answers, reply, took = _flood_beside_a_robot(front.address, front.stats, keys, request_)
        assert len(front.core.seen()) == 2
    finally:
        front.stop()
    _check_one_share(answers, reply, took)


def test_without_keys_each_connection_is_its_own_robot(request_):
    """``--insecure``: no key, so the connection is the key (the old behaviour): three
    connections each get a share of their own, however low the identities-per-key limit."""
    policy, packet, meta = request_
    insecure = Security(insecure=True)
    cfg = ServerConfig(
        max_batch=1, max_queued_per_robot=2, max_identities_per_key=1, emulate=EMULATE
    )
    with EdgeServer(policy, insecure, cfg) as srv:
        srv.warmup()
        socks = _connected(srv.address, insecure, 3)
        try:
            sent = _flood(socks, packet, meta, each=2)  # within each connection's own share
            answers = _answers(socks, len(sent), 60.0)
        finally:
            for s in socks:
                s.close(0)
        assert len(srv.core.seen()) == 3
    assert sorted(answers) == sorted(sent)
    assert all(a.kind == "result" for a in answers.values()), _busy(answers)


class _Backend:
    """A backend that holds nothing and always has room (the core's state alone is tested)."""

    HOLDS, COUNTERS = "queued", ()

    def held(self) -> int:
        return 0

    def held_by(self, key: bytes) -> int:
        return 0

    def quotes(self, stages, deadline, now, stream):
        return [Quote(0, now, True)]

    def claim(self, key, stages, now) -> bool:
        return False


def _core(cfg: ServerConfig) -> EdgeCore:
    """A secure edge's core over a backend that always has room: the core's state alone."""
    return EdgeCore(
        cfg, _Backend(), EdgeRecords(), model=None, dtype="float32", stages=STAGES, secure=True
    )


def test_the_per_key_state_is_bounded():
    """A key's connections past its limit are refused and not remembered; a stream of keys
    (or, without keys, of connections) is forgotten once silent, as the seen table always was."""
    from vlarun.runtime.edge.core import Refused

    core = _core(ServerConfig(max_identities_per_key=3))
    now = 1000.0
    for i in range(3):
        core.admit(DataRequest(b"conn-%d" % i, STAGES, 1.0, key=b"K"), now)
    for i in range(3, 50):
        with pytest.raises(Refused, match="its share is 3"):
            core.admit(DataRequest(b"conn-%d" % i, STAGES, 1.0, key=b"K"), now)
    assert len(core.connections(b"K")) == 3
    # Silent for RECENT_S: a connection of the key is forgotten, a new one takes its place.
    later = now + RECENT_S
    core.admit(DataRequest(b"conn-new", STAGES, 1.0, key=b"K"), later)
    assert b"conn-new" in core.connections(b"K") and len(core.connections(b"K")) <= 3
    # Many keys, each with its connections: the tables stay near MAX_SEEN keys.
    for i in range(3 * MAX_SEEN):
        for c in range(3):
            key = b"key-%d" % i
            core.admit(DataRequest(b"%s/%d" % (key, c), STAGES, 1.0, key=key), later + 2 * i)
    assert len(core.seen()) <= MAX_SEEN + 1
    assert core.tracked_connections() <= 3 * (MAX_SEEN + 1)


def test_a_keys_share_is_one_request_while_another_key_is_served():
    core = _core(ServerConfig(max_queued_per_robot=16))
    now = 1000.0
    assert core.share(b"K", b"conn", now) == 16  # alone
    core.admit(DataRequest(b"other-conn", STAGES, 1.0, key=b"O"), now)
    assert core.share(b"K", b"conn", now + 1.0) == 1
    assert core.share(b"O", b"other-conn", now + 1.0) == 16  # its own data is no contention
    assert core.share(b"K", b"K", now + 1.0) == 16  # no key checked: its connection
    assert core.share(b"K", b"conn", now + CONTENDED_S) == 16  # the other silent since


def test_the_flag_reaches_the_config_and_a_bad_value_fails_in_one_line(capsys):
    from vlarun.apps.runtime import ServeEdgeOptions
    from vlarun.cli import build_parser, main, parse_into

    def config(*argv: str) -> ServerConfig:
        parser = build_parser("serve-edge", ServeEdgeOptions)
        return parse_into(ServeEdgeOptions, parser.parse_args(argv)).server_config()

    assert config().max_identities_per_key == 4
    assert config("--max-identities-per-key", "2").max_identities_per_key == 2
    assert main(["serve-edge", "--insecure", "--max-identities-per-key", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--max-identities-per-key" in err[1]  # the insecure warning first
