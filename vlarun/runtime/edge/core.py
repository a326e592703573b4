"""The edge's core: admission, bookings, the seen-robots table and health, for one edge and for
a scale-out front alike. No socket and no wire bytes: the servers decode a request, hand the
core a typed ``DataRequest`` (or a ``Booking``), and turn its typed answer (``Admitted``,
a held booking, a ``Refused``) into frames. What runs the stages is the core's backend
(``Backend``): the local worker (``runtime/edge/local_worker.py``: this process's stage queues
and worker thread) or the Ray workers behind a front (``runtime/scaleout/worker_pool.py``). As
vLLM keeps its ZMQ threads apart from ``EngineCore``, ``runtime/edge/server.py`` and
``runtime/scaleout/front.py`` are the I/O around this file.
This is the file to change how the edge refuses a request.

Shares are per key: a robot is its authenticated CURVE key (``DataRequest.key``, the client's
public key as the ZAP handler reports it), not its ZeroMQ connection, so one key opening many
connections still holds one robot's share of the queue and the bookings, and a limited number
of connections (``max_identities_per_key``). Where no key was checked (``--insecure``, or a
Curve edge without authorized keys, where any client may make up keys anyway) the connection
is the key, as it always was.

Admission: a request the edge cannot finish before its deadline is refused on arrival, not
queued to expire: the backend predicts its finish (the one queue model over the batch running
now, the queued and booked work due no later than it, and its own stages, each at its measured
per-request time; per worker behind a front), and the core refuses it when even the earliest
prediction is late and made of fresh measurements. The robot hears the refusal at once and
runs the segment itself, with all of its slack left.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vlarun.runtime.emulate import Emulation
from vlarun.runtime.protocol import StageTiming, pack_schedule
from vlarun.runtime.transport import DEFAULT_MAX_MESSAGE_BYTES
from vlarun.sched.bookings import Booking, Slot
from vlarun.stages.packet import Limits, PacketError

# Robots (keys) remembered as recently active (batch window, dashboard) before the silent ones
# are forgotten; a bound, so a stream of short-lived connections cannot grow the table (nor the
# connections remembered per key, which are forgotten with their key).
MAX_SEEN = 1024
# The longest time budget a request may claim (s); more is held to it, a non-positive (or NaN)
# budget is 0: a request cannot hold a queue slot for longer than an hour by asking.
MAX_BUDGET_S = 3600.0
# A robot counts as active (batch window, ledger pushes) while it sent data this recently (s).
RECENT_S = 1.0
# A robot with a key has a share of one queued request while another key sent data this
# recently (s): under earliest deadline first, one key's requests queued ahead (four
# connections of one key, each with one in flight) held ~1 s of the edge before every other
# robot's 1 s request, which was then refused or late (issue 64). Alone, it has
# --max-queued-per-robot.
CONTENDED_S = 10.0


class Refused(PacketError):
    """A valid request the edge cannot finish before its deadline."""


@dataclass(frozen=True)
class ServerConfig:
    """Edge server settings. ``batch_window_s``: the longest a batch waits for more robots
    (also bounded by half the slack of its most urgent member); ``limits``: what a request
    may claim before it is refused (defaults fit the tiny and 7B-class packets alike)."""

    address: str = "tcp://127.0.0.1:0"
    max_batch: int = 8
    batch_window_s: float = 0.002
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_queued: int = 256  # requests waiting in all stage queues; more are refused at once
    # One robot's share: its requests queued (and its bookings held) at once; beyond it its
    # next one is refused at once ("busy"), so a flood from some identities cannot fill the
    # queue or the schedule every other robot is admitted against. A robot is its
    # authenticated key: the share counts all of the key's connections together.
    max_queued_per_robot: int = 16
    # Connections one key sends data from at once (each sent data in the last RECENT_S); a
    # request from one more is refused at once ("busy"). A robot needs one, a restart or a
    # reconnect one more for a moment; 50 are a flood (issue 64).
    max_identities_per_key: int = 4
    # A handshake refused (a key not authorized) past its address's budget is answered this
    # late (runtime.edge.zap.Tarpit: a flooder with a few handshakes in flight then costs the
    # edge a few crypto runs a second, not its core); 0: every refusal at once.
    refusal_hold_s: float = 1.0
    # Accelerated streams (one robot's episode under one setting) whose hook state (KV cache,
    # token-policy and decoder state) the edge keeps; the least recently used is forgotten
    # beyond this (its next request starts afresh: a full recompute, never a wrong reuse).
    max_streams: int = 64
    admission: bool = True  # refuse on arrival what cannot finish before its deadline
    # An estimate older than this is not enough to refuse on: the request is admitted and its
    # execution measures the stages again (a busy spell must not close the edge for good).
    admission_fresh_s: float = 2.0
    limits: Limits = Limits(max_tensor_bytes=1 << 30, max_total_bytes=2 << 30)
    # A worker behind a scale-out front (runtime/scaleout/front.py): its only peer is the front,
    # whose route frame before each request names the robot (streams and batching are per
    # robot, not per peer), the time left and the front's request id.
    relayed: bool = False
    # The edge device this server stands for, by padding each stage execution to the emulated
    # device's time for the real model's stage at the batch it ran (runtime.emulate).
    emulate: Emulation | None = None

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.batch_window_s < 0 or self.max_streams < 1:
            raise ValueError("max_batch, max_streams must be >= 1 and batch_window_s >= 0")
        if self.max_queued_per_robot < 1:
            raise ValueError(f"max_queued_per_robot must be >= 1, got {self.max_queued_per_robot}")
        if not 0.0 <= self.refusal_hold_s <= 10.0:  # a handshake times out at 30 s
            raise ValueError(f"--refusal-hold-s must lie in [0, 10], got {self.refusal_hold_s}")
        if self.max_identities_per_key < 1:
            raise ValueError(
                f"--max-identities-per-key must be >= 1, got {self.max_identities_per_key}"
            )


# ---------------------------------------------------------------------------------------------
# The contracts: what a server hands the core, what the core answers, what a backend provides


@dataclass(frozen=True)
class DataRequest:
    """A robot's data request as admission judges it: decoded and checked against the stage
    schema by its server, none of its tensors read yet. ``origin``: the connection it came on
    (or the robot a front's route names); ``budget_s``: the time it gave, as sent (the core
    holds it to ``MAX_BUDGET_S``); ``stream``: its accelerated stream's key (the worker holding
    the stream's KV cache goes first behind a front), None for the plain graph; ``key``: the
    robot's authenticated key (``transport.peer_key``), None where none was checked: then the
    connection is the robot (``holder``)."""

    origin: bytes
    stages: tuple[str, ...]
    budget_s: float
    stream: Hashable | None = None
    key: bytes | None = None

    @property
    def holder(self) -> bytes:
        """Who the request's share, bookings and seen-table row belong to: its key, else its
        connection."""
        return self.origin if self.key is None else self.key


@dataclass(frozen=True)
class Quote:
    """One backend worker's prediction for a request: when it would finish there (monotonic
    s), and whether the stage times it is made of are fresh enough to refuse on."""

    worker: int
    finish: float
    fresh: bool


@dataclass(frozen=True)
class Admitted:
    """An admitted request: its deadline (monotonic s) and the workers that may take it, in the
    order to try them (one for the local worker); never empty."""

    deadline: float
    quotes: tuple[Quote, ...]


class Backend(Protocol):
    """What runs the stages, as the core sees it. ``HOLDS`` names what ``held`` counts (in the
    overload refusal); ``COUNTERS``: the backend's own counters in the health answer."""

    HOLDS: str
    COUNTERS: tuple[str, ...]

    def held(self) -> int:
        """Requests held now (queued, or in flight to a worker)."""

    def held_by(self, key: bytes) -> int:
        """Requests of one robot (its key, ``DataRequest.holder``) held now."""

    def quotes(
        self, stages: tuple[str, ...], deadline: float, now: float, stream: Hashable | None
    ) -> list[Quote]:
        """Each live worker's prediction for a request sent now, in the order to try them."""

    def book(self, booking: Booking, now: float, per_robot: int) -> bool:
        """Hold ``booking`` in the queue model until its request comes; whether it was held."""

    def claim(self, key: bytes, stages: tuple[str, ...], now: float) -> bool:
        """The request robot ``key`` booked has come: its booking leaves; whether one did."""

    def schedule(self, limit: int = 64) -> list[Slot]:
        """The committed schedule a robot plans against (times in s from now)."""

    def health(self, now: float) -> dict:
        """The backend's part of the health answer: ``ok``, ``queue``, ``stage_ms``,
        ``backlog_ms`` and what only it knows."""


@dataclass
class EdgeRecords:
    """What the edge counts and remembers for health and the dashboard, written by the core
    and its backend (the I/O thread and the worker thread: one lock for the counters)."""

    extra: Sequence[str] = ()  # the backend's own counters (``Backend.COUNTERS``)
    stats: dict[str, float] = field(init=False)
    # The last replies and refusals, for the dashboard (appends are thread-safe; bounded).
    recent: deque[dict] = field(default_factory=lambda: deque(maxlen=2048))
    events: deque[dict] = field(default_factory=lambda: deque(maxlen=512))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        names = (
            "requests",
            "replies",
            "errors",
            "control",
            "expired",
            "refused",
            "booked",
            "booking_refused",
            *self.extra,
        )
        self.stats = {**dict.fromkeys(names, 0), "compute_s": 0.0}

    def count(self, key: str, n: float = 1) -> None:
        with self.lock:
            self.stats[key] += n

    def event(self, now: float, kind: str, what: str) -> None:
        self.events.append({"t": now, "kind": kind, "stages": what})

    def reply(
        self,
        now: float,
        origin: bytes,
        stages: tuple[str, ...],
        setting: str,
        arrival: float,
        deadline: float,
        timings: Sequence[StageTiming],
        **extra,
    ) -> None:
        """A request answered with a result: counted, and its row kept for the dashboard."""
        compute_s = sum(t.share_s for t in timings)  # this request's share of its batches
        with self.lock:
            self.stats["replies"] += 1
            self.stats["compute_s"] += compute_s
        self.recent.append(
            {
                "t": now,
                "robot": robot_id(origin),
                "stages": "+".join(stages),
                "setting": setting,
                "server_s": now - arrival,
                "budget_s": deadline - arrival,
                "compute_s": compute_s,
                "batch": {t.stage: t.batch for t in timings},
                **extra,
            }
        )


# ---------------------------------------------------------------------------------------------
# The core


class EdgeCore:
    """Admission, bookings, the seen-robots table and health of one edge, over ``backend``.
    ``model`` (a ``VLAConfig``), ``dtype`` and ``stages`` are what the health answer names."""

    def __init__(
        self,
        cfg: ServerConfig,
        backend: Backend,
        records: EdgeRecords,
        *,
        model,
        dtype: str,
        stages: tuple[str, ...],
        secure: bool,
    ) -> None:
        self.cfg, self.backend, self.records = cfg, backend, records
        self.model, self.dtype, self.stages, self.secure = model, dtype, stages, secure
        self.started = time.monotonic()
        self._seen: dict[bytes, float] = {}  # robot (key) -> its last data request (monotonic)
        # key -> its connections -> their last data request, for keys that are not their
        # connection; at most max_identities_per_key each, forgotten with their key.
        self._conns: dict[bytes, dict[bytes, float]] = {}
        self._lock = threading.Lock()  # _seen, _conns: the I/O thread and in-process submissions
        self.active_at = -float("inf")  # the last data request or booking (ledger pushes)

    # -- admission ------------------------------------------------------------------------------

    def admit(self, req: DataRequest, now: float) -> Admitted:
        """Admit a data request or raise: ``PacketError`` when the edge is full (before the
        request is seen: memory stays bounded), ``Refused`` when the robot (its key, over all
        its connections) holds its share, sends from more connections than its share, or no
        worker can finish it by its deadline. Its booking, if it made one, is claimed first:
        it is here now, and must not be counted twice."""
        held = self.backend.held()
        if held >= self.cfg.max_queued:
            raise PacketError(f"edge overloaded: {held} requests {self.backend.HOLDS}")
        key = req.holder
        self.touch(key, now)  # a robot whose request is refused is still connected
        self.active_at = now
        if not self.enter(key, req.origin, now):
            self.records.count("refused")
            n = self.cfg.max_identities_per_key
            raise Refused(
                f"busy: this robot's key is sending from {n} connections already, its "
                f"share is {n} (--max-identities-per-key)"
            )
        mine, share = self.backend.held_by(key), self.share(key, req.origin, now)
        if mine >= share:
            self.records.count("refused")
            why = (
                "(--max-queued-per-robot)"
                if share == self.cfg.max_queued_per_robot
                else "while other robots are served (--max-queued-per-robot when alone)"
            )
            raise Refused(
                f"busy: this robot has {mine} requests {self.backend.HOLDS} (all its "
                f"key's connections), its share is {share} {why}"
            )
        budget = min(req.budget_s, MAX_BUDGET_S) if req.budget_s > 0 else 0.0
        deadline = now + budget
        self.backend.claim(key, req.stages, now)  # booked at decision time: now it is here
        return Admitted(deadline, self.place(req.stages, deadline, now, req.stream))

    def place(
        self,
        stages: tuple[str, ...],
        deadline: float,
        now: float,
        stream: Hashable | None = None,
        *,
        enforce: bool | None = None,
        counter: str = "refused",
    ) -> tuple[Quote, ...]:
        """The workers that may take a request for ``stages`` due at ``deadline``, in the
        order to try them: each up to the first whose fresh prediction is late (the rest are
        later still). Raises ``Refused`` (counted under ``counter``) when none is left.
        ``enforce``: apply the deadline test (default ``cfg.admission``)."""
        quotes = self.backend.quotes(stages, deadline, now, stream)
        if not quotes:
            raise self.refuse("no edge worker is up", stages, now, counter)
        if not (self.cfg.admission if enforce is None else enforce):
            return tuple(quotes)
        usable = admissible(quotes, deadline)
        if not usable:
            raise self.refuse(
                late(min(q.finish for q in quotes), deadline, now), stages, now, counter
            )
        return tuple(usable)

    def refuse(self, why: str, stages: tuple[str, ...], now: float, counter: str = "refused"):
        """A refusal, counted and shown on the dashboard; the caller raises or answers it."""
        self.records.count(counter)
        self.records.event(now, "refused", "+".join(stages))
        return Refused(why)

    # -- bookings ---------------------------------------------------------------------------------

    def book(self, key: bytes, sent: Booking, now: float) -> bool:
        """Robot ``key`` (its authenticated key, else its connection: ``DataRequest.holder``)
        announces the edge stages it just planned (``sent``: times in s from now, as it came):
        they enter the queue model at once, so every robot quoted before the request itself
        lands sees them. False (nothing held) when the edge holds all it can or the robot
        holds its share."""
        self.active_at = now
        booking = Booking(sent.stages, now + sent.arrive, now + sent.deadline, key)
        held = self.backend.book(booking, now, self.cfg.max_queued_per_robot)
        self.records.count("booked" if held else "booking_refused")
        return held

    # -- the seen-robots table --------------------------------------------------------------------

    def touch(self, key: bytes, now: float) -> None:
        """Note that robot ``key`` sent data now; the table forgets robots silent for a second
        once it holds more than ``MAX_SEEN`` (every serve-policy connection, and without keys
        every robot connection, is a new one, so it would otherwise grow for as long as the
        server runs), and their connections with them."""
        with self._lock:
            if len(self._seen) >= MAX_SEEN:
                self._seen = {k: t for k, t in self._seen.items() if now - t < RECENT_S}
                self._conns = {k: c for k, c in self._conns.items() if k in self._seen}
            self._seen[key] = now

    def enter(self, key: bytes, origin: bytes, now: float) -> bool:
        """Note that robot ``key`` sends from connection ``origin`` now; False (nothing noted)
        when that would make more than ``max_identities_per_key`` connections that sent data
        in the last ``RECENT_S``. A key that is its connection (no key checked) has nothing
        to count."""
        if key == origin:
            return True
        with self._lock:
            conns = self._conns.setdefault(key, {})
            if origin not in conns and len(conns) >= self.cfg.max_identities_per_key:
                for gone in [c for c, t in conns.items() if now - t >= RECENT_S]:
                    del conns[gone]
                if len(conns) >= self.cfg.max_identities_per_key:
                    return False
            conns[origin] = now
            return True

    def share(self, key: bytes, origin: bytes, now: float) -> int:
        """Requests robot ``key`` may have queued: ``max_queued_per_robot``, but one while
        another robot (key) sent data in the last ``CONTENDED_S`` (``CONTENDED_S``: why). A
        robot without a key (``--insecure``, or a front's relayed worker: its connection or
        the front's route) keeps the whole share: a client there can be as many robots as it
        likes anyway, and the front holds the shares of the robots it relays."""
        if key == origin:
            return self.cfg.max_queued_per_robot
        with self._lock:
            others = any(k != key and now - t < CONTENDED_S for k, t in self._seen.items())
        return 1 if others else self.cfg.max_queued_per_robot

    def connections(self, key: bytes) -> list[bytes]:
        """The connections robot ``key`` is remembered sending from."""
        with self._lock:
            return list(self._conns.get(key, ()))

    def tracked_connections(self) -> int:
        """Connections remembered over all keys (a bound's check)."""
        with self._lock:
            return sum(map(len, self._conns.values()))

    def active(self) -> int:
        """Robots that sent data in the last ``RECENT_S`` (the batch window waits only for
        more than one)."""
        now = time.monotonic()
        return sum(now - t < RECENT_S for t in list(self._seen.values()))

    def seen(self) -> dict[bytes, float]:
        """A copy of the table: robot -> when it last sent data (monotonic)."""
        with self._lock:
            return dict(self._seen)

    # -- health -----------------------------------------------------------------------------------

    def schedule(self, limit: int = 64) -> list[Slot]:
        """The committed schedule robots plan against (``costview.edge_state``): the backend's
        forecast over running, queued and booked work, in the order it would run."""
        return self.backend.schedule(limit)

    def health(self) -> dict:
        """What `vlarun ping` shows, the same keys from one edge and from a front (plus each
        backend's own): model, queue depth per stage, stage estimates, the schedule, counters."""
        with self.records.lock:
            stats = dict(self.records.stats)
        return {
            "model": self.model.name,
            "family": self.model.family,
            "dtype": self.dtype,
            "stages": list(self.stages),
            "max_batch": self.cfg.max_batch,
            "schedule": pack_schedule(self.schedule()),
            "secure": self.secure,
            "uptime_s": time.monotonic() - self.started,
            **self.backend.health(time.monotonic()),
            **stats,
        }


def admissible(quotes: Sequence[Quote], deadline: float) -> tuple[Quote, ...]:
    """The edge's admission rule over the workers' quotes (in the order to try them): each up
    to the first whose prediction is late and fresh (the rest are later still). A late
    prediction made of stale stage times is no reason to refuse: the request is admitted and
    measures them again. Empty: refuse. The scale-out projection (``bench.scaleout``) runs it
    too."""
    usable = []
    for q in quotes:
        if q.finish > deadline and q.fresh:
            break
        usable.append(q)
    return tuple(usable)


def late(finish: float, deadline: float, now: float) -> str:
    """The refusal of a request predicted to finish at ``finish``, after its ``deadline``."""
    return (
        f"refused: predicted to finish {1e3 * (finish - now):.1f} ms from now, "
        f"the deadline is in {1e3 * (deadline - now):.1f} ms"
    )


def robot_id(identity: bytes) -> str:
    """A short stable name for a robot's connection (its ZeroMQ identity, hashed)."""
    return hashlib.blake2s(identity, digest_size=3).hexdigest()
