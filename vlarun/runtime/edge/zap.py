"""The edge's ZAP authorizer, off the edge's Python threads (issue 64, 2).

An edge with authorized keys must answer every CURVE handshake's ZAP request (RFC 27: ZeroMQ
asks ``inproc://zeromq.zap.01`` in the socket's own context whether the client's key may in).
pyzmq's ``ThreadAuthenticator`` answered them on a Python thread of the edge: an asyncio loop
per message, under the edge's interpreter lock. A flood of handshakes from a key that is not
authorized cost the edge's Python threads 0.38 ms each (2026-12-06, AMD EPYC, 980 a second:
37% of the core the edge serves robots on), beside the handshake's own crypto on ZeroMQ's
I/O thread (0.48 ms; it runs before ZAP is asked, so nothing behind ZAP can spare it).

Here the edge only *forwards*: ``EdgeAuth`` binds the ZAP endpoint to a ROUTER and a
``zmq.proxy_steerable`` thread (C, without the interpreter lock) passes each request over an
``ipc://`` socket in a private folder (0700: no other local user can answer in its place) to
an authorizer process, ``python -m vlarun.runtime.edge.zap``, which holds the keys, answers, and
writes the refusal log (``runtime.refusal_log``: one line a second at most, on the edge's
stderr). A refused handshake runs no Python in the edge's process.

* Fail closed: the ZAP endpoint is bound before the edge's socket, and while no authorizer is
  connected a request waits in the proxy: no robot is admitted unchecked. An authorizer that
  ends is started again (one line on stderr).
* The authorizer runs at a lower priority (``AUTHORIZER_NICE``): on a busy core the edge's
  serving threads come first; a ZAP answer takes ~0.1 ms, so a handshake's wait is the crypto.
* Refusals are slowed per source address (``Tarpit``), never admissions. ZAP is asked after
  the handshake's crypto (0.42 ms of the edge's I/O thread, the expensive part), so nothing
  here spares a handshake that has begun; what it can do is make the next one wait: a
  flooder holds a few handshakes in flight, and each waits for its verdict before the next
  begins. A source's first ``REFUSALS_BURST`` refusals are answered at once, then
  ``REFUSALS_PER_S`` a second; a refusal beyond that is held ``HOLD_S`` before it is sent.
  Four handshakes in flight then cost the edge ~``REFUSALS_PER_S`` + 4 / ``HOLD_S`` crypto
  runs a second instead of ~400-1,250 (`vlarun bench hostile --attacks edge-handshake`,
  2026-12-07, quiet: 55-57 refused in 8 s against 3,391-3,478; the robot's p99 0.98-1.05x
  its p99 beside an equal burner, 1.73-2.00x before). An authorized key is answered at once whatever
  its address's count (a robot behind the flooder's NAT, or on loopback beside it, is not
  slowed). Bounded: at most ``MAX_HELD`` refusals held (beyond, answered at once) and
  ``MAX_SOURCES`` addresses remembered. Not stopped by it: a flooder that does not wait for
  its verdicts (it closes each connection and opens another: every one still costs the edge
  its crypto, as much as it costs the flooder; 64 in flight, each given up after 1 s: 504
  handshakes in 8 s, 0.4 CPU-s of the edge), nor one from many addresses: a firewall's
  per-source limit on new connections is the tool for those.
* It reads its keys once, on stdin, at start (as pyzmq's ``configure_curve`` did), and ends
  when that pipe closes: when the edge ends, however it ends.

    python -m vlarun.runtime.edge.zap --endpoint ipc:///tmp/vlarun-zap-XXXX/zap   # keys on stdin
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.auth
from zmq.utils import z85

from vlarun.runtime.edge.refusal_log import RefusalLog

if TYPE_CHECKING:
    from vlarun.runtime.transport import Security

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where ZeroMQ asks (RFC 27), in the socket's context
ZAP_VERSION = b"1.0"
AUTHORIZER_NICE = 10  # the edge's serving threads first on a busy core
START_TIMEOUT_S = 30.0
RESTART_EVERY_S = 1.0  # an authorizer that keeps ending is started again at most this often
# Refused handshakes per source address (``Tarpit``): answered at once up to the burst, then
# at the rate; beyond it each refusal is held before it is sent.
REFUSALS_BURST = 20
REFUSALS_PER_S = 5.0
HOLD_S = 1.0  # well inside a handshake's own timeout (ZeroMQ's default: 30 s)
MAX_HELD = 256  # refusals held at once (each holds a connection's descriptor while it waits)
MAX_SOURCES = 4096  # addresses remembered; the least recently refused is forgotten


def authorized_keys(authorized_dir: str | None, keys: tuple[bytes, ...] = ()) -> set[bytes]:
    """The public keys (Z85) an edge admits: every ``*.key`` certificate in ``authorized_dir``
    (what pyzmq's ``configure_curve`` loaded) and ``keys``."""
    allowed = set(keys)
    if authorized_dir is not None:
        allowed |= set(zmq.auth.load_certificates(authorized_dir))
    return allowed


class EdgeAuth:
    """ZAP for an edge socket in ``ctx`` whose robots must hold one of the authorized keys
    (``sec.authorized_dir`` and ``sec.authorized_keys``); nothing when ``sec`` admits any
    client. Create it before the edge's socket binds; ``stop`` after it closes. ``hold_s``:
    the tarpit's hold of a refusal past its address's budget (0: none)."""

    def __init__(self, ctx: zmq.Context, sec: Security, hold_s: float = HOLD_S) -> None:
        self.proc: subprocess.Popen | None = None
        self.hold_s = hold_s
        if sec.insecure or (sec.authorized_dir is None and not sec.authorized_keys):
            return
        self._keys = sorted(authorized_keys(sec.authorized_dir, sec.authorized_keys))
        self._dir = tempfile.mkdtemp(prefix="vlarun-zap-")  # 0700
        self.endpoint = f"ipc://{self._dir}/zap"
        self._stopping = threading.Event()
        front, back = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        for s in (front, back):
            s.setsockopt(zmq.LINGER, 0)
        front.bind(ZAP_ENDPOINT)  # first: from here on a handshake waits for an answer
        back.bind(self.endpoint)
        self._control = f"inproc://vlarun-zap-control-{id(self)}"
        ctl = ctx.socket(zmq.PAIR)
        ctl.bind(self._control)
        self._ctl = ctx.socket(zmq.PAIR)
        self._ctl.connect(self._control)
        self._proxy = threading.Thread(
            target=_forward, args=(front, back, ctl), name="zap-proxy", daemon=True
        )
        self._proxy.start()
        self.proc = self._spawn()
        self._watch = threading.Thread(target=self._restart, name="zap-watch", daemon=True)
        self._watch.start()

    def _spawn(self) -> subprocess.Popen:
        """The authorizer process, its keys handed over, once it says it is connected."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "vlarun.runtime.edge.zap", "--endpoint", self.endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
        )
        told = {"keys": [k.decode() for k in self._keys], "hold_s": self.hold_s}
        proc.stdin.write(json.dumps(told).encode() + b"\n")
        proc.stdin.flush()  # the pipe stays open: its end is the authorizer's signal to end
        ready = _line_within(proc, START_TIMEOUT_S)
        if ready != b"ready\n":
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the ZAP authorizer did not start (said {ready!r})")
        proc.stdout.close()
        return proc

    def _restart(self) -> None:
        while True:
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            print(
                f"vlarun: the edge's ZAP authorizer ended (exit {code}); no robot is admitted "
                "until it is back; starting it again",
                file=sys.stderr,
                flush=True,
            )
            if self._stopping.wait(RESTART_EVERY_S):
                return
            with contextlib.suppress(RuntimeError, OSError):
                self.proc = self._spawn()

    def stop(self) -> None:
        if self.proc is None:
            return
        self._stopping.set()
        with contextlib.suppress(zmq.ZMQError):  # a proxy already gone has no peer to block on
            self._ctl.send(b"TERMINATE", zmq.NOBLOCK)
        self._proxy.join(timeout=5)
        self._ctl.close(0)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the authorizer reads end-of-file and ends
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._watch.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)


def _forward(front: zmq.Socket, back: zmq.Socket, ctl: zmq.Socket) -> None:
    """The proxy thread: ZeroMQ's own loop (no interpreter lock held) until TERMINATE. Named
    ``zap-proxy`` for the OS too (``top -H``, ``/proc/PID/task/*/comm``), so what it costs is
    told apart from the edge's serving threads."""
    with contextlib.suppress(OSError):  # Linux; elsewhere the thread keeps its name
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("zap-proxy")
    try:
        zmq.proxy_steerable(front, back, None, ctl)
    except zmq.ZMQError:  # the context was terminated under it
        pass
    finally:
        for s in (front, back, ctl):
            s.close(0)


def _line_within(proc: subprocess.Popen, timeout_s: float) -> bytes:
    """The child's first stdout line, or b"" after ``timeout_s`` or its end."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout=timeout_s):
            return proc.stdout.readline()
    return b""


# --- the authorizer process --------------------------------------------------------------------


class Tarpit:
    """A token bucket of refusals per source address: ``hold_s(source, now)`` is 0 while the
    source has a token (it spends one), else how long its refusal waits before it is sent
    (0 again once ``max_held`` wait: the holding is bounded, the answer never dropped)."""

    def __init__(
        self,
        burst: int = REFUSALS_BURST,
        per_s: float = REFUSALS_PER_S,
        hold_s: float = HOLD_S,
        max_held: int = MAX_HELD,
        max_sources: int = MAX_SOURCES,
    ) -> None:
        self.burst, self.per_s, self.hold, self.max_held = burst, per_s, hold_s, max_held
        self.max_sources = max_sources
        self._sources: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # tokens, at
        self.held = 0  # refusals waiting now (the serving loop counts them back)

    def hold_s(self, source: bytes, now: float) -> float:
        tokens, at = self._sources.pop(source, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        self._sources[source] = (tokens - 1.0, now) if tokens >= 1.0 else (tokens, now)
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        if tokens >= 1.0 or self.held >= self.max_held or self.hold <= 0:
            return 0.0
        return self.hold


class Authorizer:
    """Answers ZAP requests (RFC 27) for CURVE: 200 with the client's key in Z85 as the
    User-Id (``transport.peer_key`` reads it back off every message) when the key is
    ``allowed``, else 400 and a refusal line; a source's refusals beyond its ``tarpit``
    budget are sent late (``serve``)."""

    def __init__(
        self,
        allowed: set[bytes],
        refusals: RefusalLog | None = None,
        tarpit: Tarpit | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allowed = frozenset(z85.decode(k) for k in allowed)  # raw 32-byte keys
        self.refusals = refusals or RefusalLog()
        self.tarpit = tarpit or Tarpit()
        self.clock = clock
        self.counts = {"admitted": 0, "refused": 0, "held": 0}

    def answer(self, msg: list[bytes]) -> list[bytes]:
        """The reply frames to one ZAP request's frames."""
        if len(msg) < 6:
            self.counts["refused"] += 1
            return [ZAP_VERSION, msg[1] if len(msg) > 1 else b"", b"400", b"Bad request", b"", b""]
        version, rid, _domain, address, _identity, mechanism = msg[:6]
        key = msg[6] if len(msg) > 6 else b""
        if version == ZAP_VERSION and mechanism == b"CURVE" and key in self.allowed:
            self.counts["admitted"] += 1
            return [ZAP_VERSION, rid, b"200", b"OK", z85.encode(key), b""]
        self.counts["refused"] += 1
        who = address.decode("ascii", "replace")[:64] or "?"
        why = (
            f"its key {z85.encode(key).decode()} is not authorized"
            if mechanism == b"CURVE" and len(key) == 32
            else f"{mechanism.decode('ascii', 'replace')[:16]} is not CURVE"
        )
        self.refusals.refused("handshake", who, why)
        return [ZAP_VERSION, rid, b"400", b"Unknown key", b"", b""]

    def hold_s(self, request: list[bytes], reply: list[bytes]) -> float:
        """How long ``reply`` waits before it is sent: 0 for an admission, else the tarpit's
        verdict on the request's source address."""
        if reply[2] == b"200" or len(request) < 4:
            return 0.0
        return self.tarpit.hold_s(request[3][:64], self.clock())

    def serve(self, endpoint: str, ctx: zmq.Context | None = None) -> None:
        """Answer the edge's proxy at ``endpoint`` until killed: each request at once, a held
        refusal when its time comes (a ROUTER, so a held one does not hold up the rest)."""
        sock = (ctx or zmq.Context.instance()).socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        print("ready", flush=True)
        held: list[tuple[float, int, list[bytes]]] = []  # (when it is sent, order, frames)
        order = itertools.count()
        while True:
            wait = None if not held else max(0, int(1e3 * (held[0][0] - self.clock())) + 1)
            if sock.poll(wait):
                frames = sock.recv_multipart()
                if b"" not in frames:
                    continue  # no envelope: nothing to answer (ZeroMQ always sends one)
                cut = frames.index(b"") + 1  # the route back: the proxy's and the socket's
                request = frames[cut:]
                reply = self.answer(request)
                hold = self.hold_s(request, reply)
                if hold > 0:
                    self.counts["held"] += 1
                    self.tarpit.held += 1
                    heapq.heappush(held, (self.clock() + hold, next(order), frames[:cut] + reply))
                else:
                    sock.send_multipart(frames[:cut] + reply)
            while held and held[0][0] <= self.clock():
                sock.send_multipart(heapq.heappop(held)[2])
                self.tarpit.held -= 1


def _end_with_parent() -> None:
    """Block until stdin (the edge's pipe) closes, then end the process."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlarun.runtime.edge.zap")
    ap.add_argument("--endpoint", required=True, help="the edge's ZAP proxy (ipc://...)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the edge's to handle; EOF ends us
    with contextlib.suppress(OSError):
        os.nice(AUTHORIZER_NICE)
    told = json.loads(sys.stdin.buffer.readline())
    keys = {k.encode() for k in told["keys"]}
    log = logging.getLogger("vlarun.refusals")  # as `serve-edge` writes its own (log_refusals)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    threading.Thread(target=_end_with_parent, daemon=True).start()
    Authorizer(keys, tarpit=Tarpit(hold_s=float(told.get("hold_s", HOLD_S)))).serve(args.endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
