"""Attacks for `vlarun bench hostile` (bench.attacks runs them): servers under attack.

Each attack runs against a fresh ``vlarun serve-policy`` (or ``vlarun serve-edge``) process on
loopback while a *legitimate* client, in a process of its own (so the attackers' threads do not
share its interpreter lock), keeps sending ordinary requests. Per attack it reports:

  * what the attackers saw (served, refused as busy, cut off),
  * the server's RSS: idle before, peak during (``VmHWM`` after resetting it through
    ``/proc/PID/clear_refs``, and a 20 ms sampler), after (the first sample back within idle +
    10%, or the last of 10 s), and whether the process is still alive;
  * the legitimate client's latency p50 / p99 during the attack, beside its p50 / p99 at rest
    measured first on the same server, and how many of its requests were answered.

The server is pinned to CPU 0 and the clients to the other CPUs, so that on a small machine
the attackers' own CPU time does not land on the server's core. Loopback only; every attack is
bounded in count and time.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.bench.hostile_local import LOCAL_ATTACKS
from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, opt
from vlarun.runtime.testbed import procs

POLICY_ATTACKS = (
    "pipeline",
    "churn",
    "flood16",
    "flood50",
    "largest",
    "half-open",
    "fuzz",
    "npscalar",
    "key-hold",
)
EDGE_ATTACKS = ("edge-flood16",)
# On an edge with --authorized-keys (bench/hostile_edge.py): a handshake flood from a key it
# does not authorize (with its equal-CPU burner row), one key on 50 identities (issue 64).
SECURE_EDGE_ATTACKS = ("edge-handshake", "edge-identities50")
# Bad files handed to vlarun's own commands (bench/hostile_local.py): no server involved.
ATTACKS = POLICY_ATTACKS + EDGE_ATTACKS + SECURE_EDGE_ATTACKS + LOCAL_ATTACKS


@dataclass(frozen=True)
class BenchHostileOptions:
    """serve-policy and serve-edge under attack: RSS and a legitimate client's latency."""

    policy: str = opt(
        "tiny-ar", "policy the servers run: " + POLICY_HELP, replaces=POLICY_FLAGS_RETIRED
    )
    attacks: tuple[str, ...] = opt(ATTACKS, "attacks to run: " + ", ".join(ATTACKS))
    frame_mb: float = opt(
        16.0, "serve-policy's --max-frame-mb (its default; the pipelining frames fill it)"
    )
    budget_s: float = opt(5.0, "serve-policy's --budget-s (the 50-client goal is within it)")
    rest_requests: int = opt(40, "the legitimate client's requests at rest")
    seconds: float = opt(8.0, "length of each flood")
    handshakes_in_flight: int = opt(4, "edge-handshake: the flooder's handshakes at once")
    quick: bool = opt(False, "pipeline and largest only, 4 s floods")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        bad = [a for a in self.attacks if a not in ATTACKS]
        if bad:
            raise ValueError(f"unknown attack {bad[0]!r}; valid: {', '.join(ATTACKS)}")
        if self.frame_mb <= 0.1 or self.budget_s <= 0 or self.seconds <= 0:
            raise ValueError("--frame-mb must be > 0.1, --budget-s and --seconds > 0")
        if not 1 <= self.handshakes_in_flight <= 512:
            raise ValueError(
                f"--handshakes-in-flight must lie in 1..512, got {self.handshakes_in_flight}"
            )
        if self.rest_requests < 10:
            raise ValueError("--rest-requests must be >= 10 (a p99 needs them)")


# --- the server process and its memory ------------------------------------------------------


def rss(pid: int | str, field: str = "VmRSS") -> int:
    """One field of /proc/PID/status, in bytes (``procs.status_kb``); raises if unreadable."""
    kb = procs.status_kb(pid, field)
    if kb is None:
        raise ProcessLookupError(f"no {field} for process {pid}")
    return kb * 1024


def _pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity") and cpus:
        os.sched_setaffinity(0, cpus)


def _cpus() -> tuple[set[int], set[int]]:
    """(server's CPUs, clients' CPUs): the first CPU for the server, the rest for clients."""
    have = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return {have[0]}, set(have[1:]) or {have[0]}


def start_server(argv: list[str], server_cpus: set[int]) -> tuple[subprocess.Popen, str]:
    """A ``vlarun`` server process (pinned to ``server_cpus``); (process, endpoint)."""
    return procs.spawn_module("vlarun.cli", [*argv, "--json"], timeout_s=120.0, cpus=server_cpus)


def stop_server(proc: subprocess.Popen) -> str:
    """SIGTERM, wait; the server's stderr (for tracebacks)."""
    procs.stop(proc, timeout_s=60.0, close=False)
    err = procs.stderr_of(proc)
    proc.err_file.close()
    return err


class Memory:
    """RSS of one process over one attack: idle, peak (VmHWM reset at the start, and a 20 ms
    sampler in case the kernel refuses the reset), after."""

    def __init__(self, pid: int) -> None:
        self.pid, self.idle, self.peak = pid, rss(pid), 0
        self._stop = threading.Event()
        with contextlib.suppress(OSError):  # "5" resets the peak RSS (Linux >= 4.0)
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss(self.pid))
            except OSError:
                return
            self._stop.wait(0.02)

    def settle(self, within_s: float = 10.0) -> dict:
        """Stop sampling; wait up to ``within_s`` for RSS back within idle + 10%."""
        self._stop.set()
        self._t.join(5)
        with contextlib.suppress(OSError):
            self.peak = max(self.peak, rss(self.pid, "VmHWM"))
        t0, after = time.monotonic(), self.idle
        while True:
            try:
                after = rss(self.pid)
            except OSError:
                break
            if after <= 1.1 * self.idle or time.monotonic() - t0 >= within_s:
                break
            time.sleep(0.25)
        back = after <= 1.1 * self.idle
        return {
            "rss_idle_mb": self.idle / 2**20,
            "rss_peak_mb": self.peak / 2**20,
            "rss_after_mb": after / 2**20,
            "rss_back_s": round(time.monotonic() - t0, 2) if back else None,
        }


# --- the legitimate clients (each in a process of its own) ----------------------------------


def _obs(image_size: int, second: bool) -> dict:
    rng = np.random.default_rng(0)
    obs = {
        "image": rng.integers(0, 255, (image_size, image_size, 3), dtype=np.uint8),
        "state": np.zeros(4, np.float32),
        "prompt": "open the drawer",
    }
    if second:
        obs["second_image"] = obs["image"].copy()
    return obs


def _legit_openpi(
    port: int, key: str, obs: dict, n: int, seconds: float, cpus: set[int], out
) -> None:
    """Requests one after another, ``n`` of them or for ``seconds``, with its own API key;
    (ms, answered) each."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    _pin(cpus)
    rows: list[tuple[float, bool]] = []
    end = time.monotonic() + seconds
    client = None
    while len(rows) < n and time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            if client is None:
                client = WebsocketClientPolicy("127.0.0.1", port, api_key=key)
            client.infer(obs)
            rows.append((1e3 * (time.perf_counter() - t0), True))
        except Exception:  # noqa: BLE001 - busy or cut: counted as not answered, reconnect
            rows.append((1e3 * (time.perf_counter() - t0), False))
            client = None
            time.sleep(0.05)
    out.put(rows)


def _latency(rows: list[tuple[float, bool]]) -> dict:
    ms = [m for m, ok in rows]
    return {
        "legit_requests": len(rows),
        "legit_answered": sum(ok for _, ok in rows),
        "legit_p50_ms": float(np.percentile(ms, 50)) if ms else None,
        "legit_p99_ms": float(np.percentile(ms, 99)) if ms else None,
    }


class Legit:
    """The legitimate client running beside an attack, in its own process."""

    def __init__(self, target, args: tuple) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.proc = ctx.Process(target=target, args=(*args, self.out), daemon=True)
        self.proc.start()

    def result(self, timeout_s: float = 120.0) -> list[tuple[float, bool]]:
        rows = self.out.get(timeout=timeout_s)
        self.proc.join(10)
        return rows


# --- attacks on serve-policy ----------------------------------------------------------------


def _pipeline(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """6 connections each pipeline 17 frames just under the frame cap and never read."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from vlarun.runtime import openpi

    pad = int(o.frame_mb * 2**20 * 0.95)
    frame = openpi.packb(
        {"image": np.zeros((128, 128, 3), np.uint8), "prompt": "x", "pad": np.zeros(pad, np.uint8)}
    )
    sent: list[int] = []

    def one() -> None:
        n = 0
        try:
            with connect(
                f"ws://127.0.0.1:{port}",
                max_size=None,
                open_timeout=10,
                additional_headers=_auth(key),
            ) as ws:
                ws.recv(timeout=10)
                ws.socket.settimeout(5)
                for _ in range(17):  # blocks once the server stops reading: the point
                    ws.send(frame)
                    n += 1
                stop.wait(3)
        except (TimeoutError, OSError, ConnectionClosed):
            pass
        sent.append(n)

    _threads(one, 6)
    return f"6 connections x 17 frames of {len(frame) / 2**20:.1f} MiB: {sum(sent)} sent"


def _churn(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """3 rounds of 60 clients that send one request and leave at once."""
    from websockets.sync.client import connect

    from vlarun.runtime import openpi

    frame = openpi.packb({"image": np.zeros((128, 128, 3), np.uint8), "prompt": "x"})
    done = 0
    for _ in range(3):
        for _ in range(60):
            try:
                with connect(
                    f"ws://127.0.0.1:{port}", open_timeout=10, additional_headers=_auth(key)
                ) as ws:
                    ws.recv(timeout=10)
                    ws.send(frame)
                    done += 1
            except Exception:  # noqa: BLE001 - refused (busy): still churn
                pass
        stop.wait(1.0)
    return f"3 rounds x 60 connect-send-disconnect: {done} sent"


def _flood(n: int):
    def attack(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
        """``n`` clients send requests as fast as they are answered."""
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        served, refused = [0], [0]
        obs = {"image": np.zeros((128, 128, 3), np.uint8), "prompt": "x"}

        def one() -> None:
            while not stop.is_set():
                try:
                    c = WebsocketClientPolicy("127.0.0.1", port, api_key=key)
                    while not stop.is_set():
                        c.infer(obs)
                        served[0] += 1
                except Exception:  # noqa: BLE001 - busy, 503, closed: retry after a breath
                    refused[0] += 1
                    stop.wait(0.2)

        _threads(one, n, stop, o.seconds)
        return (
            f"{n} clients back to back for {o.seconds:g} s: {served[0]} served, "
            f"{refused[0]} refused or cut"
        )

    return attack


def _largest(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """One client sends the largest allowed frame (padded with a key the layout ignores),
    then a 4 MB prompt (refused while parsing), alternately, for the flood time."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    pad = int(o.frame_mb * 2**20 * 0.95)
    big = {
        "image": np.zeros((128, 128, 3), np.uint8),
        "prompt": "open the drawer",
        "pad": np.zeros(pad, np.uint8),
    }
    prompt = {"image": big["image"], "prompt": "p" * (4 << 20)}
    counts = {"served": 0, "refused": 0}
    end = time.monotonic() + o.seconds
    c = None
    while time.monotonic() < end and not stop.is_set():
        for obs in (big, prompt):
            try:
                c = c or WebsocketClientPolicy("127.0.0.1", port, api_key=key)
                c.infer(obs)
                counts["served"] += 1
            except Exception:  # noqa: BLE001 - refused in one line, or closed
                counts["refused"] += 1
                c = None
    return (
        f"largest allowed request and 4 MB prompts: {counts['served']} served, "
        f"{counts['refused']} refused"
    )


def _half_open(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """200 TCP connections that send half a request line and nothing more."""
    socks, cut = [], 0
    for _ in range(200):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            cut += 1
    stop.wait(o.seconds)
    for s in socks:
        s.settimeout(0.01)
        try:
            if s.recv(1) == b"":
                cut += 1
        except TimeoutError:
            pass
        except OSError:
            cut += 1
        s.close()
    return f"200 half-open connections held {o.seconds:g} s: {cut} cut by the server"


def _fuzz(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """300 frames of random bytes (half behind a msgpack map header) over reconnecting
    connections; each answered in one line, cut, or (counted) not answered within 2 s."""
    from websockets.sync.client import connect

    rng = np.random.default_rng(1)
    answered = leaked = silent = 0
    ws = None
    for i in range(300):
        if stop.is_set():
            break
        n = int(rng.integers(1, 4096))
        frame = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        if i % 2:
            frame = b"\x82\xa5image" + frame  # a map header: reaches the parser's depths
        try:
            if ws is None:
                ws = connect(
                    f"ws://127.0.0.1:{port}", open_timeout=10, additional_headers=_auth(key)
                )
                ws.recv(timeout=10)
            ws.send(frame)
            reply = ws.recv(timeout=2)
            answered += 1
            text = reply if isinstance(reply, str) else reply[:2000].decode("latin-1")
            leaked += "Traceback" in text or "/vlarun/" in text
            if isinstance(reply, str):  # openpi's error reply: the server closes next
                ws.close()
                ws = None
        except TimeoutError:
            silent += 1
            ws.close()
            ws = None
        except Exception:  # noqa: BLE001 - closed by the server: reconnect
            ws = None
    if ws is not None:
        ws.close()
    return (
        f"300 random frames: {answered} answered in one line, {silent} unanswered in 2 s, "
        f"{leaked} leaked internals"
    )


def _auth(key: str) -> dict:
    return {"Authorization": f"Api-Key {key}"}


def _npscalar(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """6 clients x 12 frames whose prompt is a numpy scalar of kind U holding most of a frame,
    tagged as openpi's msgpack_numpy tags it (issue 45, 10: it used to be built into a string
    4x its size before the prompt check)."""
    import msgpack
    from websockets.sync.client import connect

    data = b"x" * int(min(15 * 2**20, o.frame_mb * 2**20 * 0.9))
    image = {
        b"__ndarray__": True,
        b"data": bytes(128 * 128 * 3),
        b"dtype": "|u1",
        b"shape": [128, 128, 3],
    }
    prompt = {b"__npgeneric__": True, b"data": data, b"dtype": "<U1"}
    frame = msgpack.packb({"image": image, "prompt": prompt}, use_bin_type=True)
    counts = {"refused": 0, "answered": 0, "busy": 0}
    lock = threading.Lock()

    def one() -> None:
        for _ in range(12):
            if stop.is_set():
                return
            try:
                with connect(
                    f"ws://127.0.0.1:{port}",
                    max_size=None,
                    open_timeout=10,
                    additional_headers=_auth(key),
                ) as ws:
                    ws.recv(timeout=10)
                    ws.send(frame)
                    what = "refused" if isinstance(ws.recv(timeout=10), str) else "answered"
            except Exception:  # noqa: BLE001 - 503 busy (its key's share, bytes in flight) or cut
                what = "busy"
            with lock:
                counts[what] += 1

    _threads(one, 6)
    return (
        f"6 clients x 12 numpy-scalar prompts of {len(data) / 2**20:.1f} MiB: "
        f"{counts['refused']} refused in one line, {counts['busy']} busy or cut, "
        f"{counts['answered']} answered"
    )


def _key_hold(port: int, o: BenchHostileOptions, stop: threading.Event, key: str) -> str:
    """One API key opens 40 authenticated connections and sends nothing (issue 45, 12: one
    key could hold every slot); the legitimate client, with the other key, runs beside it."""
    from websockets.sync.client import connect

    held, busy = [], 0
    for _ in range(40):
        try:
            ws = connect(f"ws://127.0.0.1:{port}", open_timeout=10, additional_headers=_auth(key))
            ws.recv(timeout=10)
            held.append(ws)
        except Exception:  # noqa: BLE001 - 503 busy: the per-key cap
            busy += 1
    stop.wait(o.seconds)
    for ws in held:
        ws.close()
    return (
        f"one key opens 40 idle connections for {o.seconds:g} s: {len(held)} held, "
        f"{busy} refused busy"
    )


def _threads(fn, n: int, stop: threading.Event | None = None, seconds: float = 0.0) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    if stop is not None:
        stop.wait(seconds)
        stop.set()
    for t in threads:
        t.join(60)


POLICY_RUN = {
    "pipeline": _pipeline,
    "churn": _churn,
    "flood16": _flood(16),
    "flood50": _flood(50),
    "largest": _largest,
    "half-open": _half_open,
    "fuzz": _fuzz,
    "npscalar": _npscalar,
    "key-hold": _key_hold,
}


def _health_ms(port: int) -> float:
    import urllib.request

    t0 = time.perf_counter()
    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).read()
    return 1e3 * (time.perf_counter() - t0)


def policy_attack(name: str, o: BenchHostileOptions) -> dict:
    """One attack on a fresh serve-policy process; its row."""
    from vlarun.policy import Policy

    server_cpus, client_cpus = _cpus()
    _pin(client_cpus)
    cfg = Policy.load(o.policy).model.cfg
    obs = _obs(cfg.image_size, cfg.num_images > 1)
    # Two clients' keys, as a deployment has them: the attacker's and the legitimate client's
    # (the server gives each key an equal share of its connections).
    attacker, legit_key = secrets.token_hex(16), secrets.token_hex(16)
    keys = Path(tempfile.mkdtemp(prefix="vlarun-hostile-")) / "keys"
    keys.write_text(f"{attacker}\n{legit_key}\n")
    keys.chmod(0o600)
    proc, endpoint = start_server(
        [
            "serve-policy",
            "--policy",
            o.policy,
            "--port",
            "0",
            "--api-key-file",
            str(keys),
            "--threads",
            "1",
            "--max-frame-mb",
            str(o.frame_mb),
            "--budget-s",
            str(o.budget_s),
        ],
        server_cpus,
    )
    port = int(endpoint.rsplit(":", 1)[1])
    try:
        rest = Legit(
            _legit_openpi, (port, legit_key, obs, o.rest_requests, 120.0, client_cpus)
        ).result()
        mem = Memory(proc.pid)
        stop = threading.Event()
        legit = Legit(_legit_openpi, (port, legit_key, obs, 10_000, o.seconds + 2.0, client_cpus))
        health: list[float] = []

        def watch() -> None:
            while not stop.is_set():
                try:
                    health.append(_health_ms(port))
                except OSError:
                    health.append(10_000.0)
                stop.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        what = POLICY_RUN[name](port, o, stop, attacker)
        during = legit.result()
        stop.set()
        watcher.join(15)
        row = {
            "attack": name,
            "server": "serve-policy",
            "result": what,
            **mem.settle(),
            "alive": proc.poll() is None,
            "healthz_max_ms": max(health) if health else None,
        }
    finally:
        err = stop_server(proc)
        shutil.rmtree(keys.parent, ignore_errors=True)
    rest_l = _latency(rest)
    row.update(_latency(during))
    row.update(
        {
            "rest_p50_ms": rest_l["legit_p50_ms"],
            "rest_p99_ms": rest_l["legit_p99_ms"],
            "server_tracebacks": err.count("Traceback"),
        }
    )
    return row


# --- the edge: a flood from 16 identities beside one robot ----------------------------------


def _edge_packet(policy_name: str):
    import torch

    from vlarun.policy import Policy
    from vlarun.stages.families import graph_inputs

    policy = Policy.load(policy_name)
    ids = policy.text_ids("open the drawer")
    n = policy.model.cfg.num_images
    images = torch.zeros(1, n, 3, policy.model.cfg.image_size, policy.model.cfg.image_size)
    packet = graph_inputs(policy.model.cfg, images, [ids])
    return packet, {"batch": 1, "text_tokens": len(ids)}


STAGES = ("vision", "prefill", "decode")


def _legit_robot(
    endpoint: str, policy_name: str, n: int, seconds: float, cpus: set[int], out
) -> None:
    """A robot at 2 Hz: one whole-policy request each period, a 1 s budget (the emulated
    edge serves ~5 a second: the robot asks for less than the edge can do, the flood for more)."""
    from vlarun.runtime.robot.client import EdgeClient, ping
    from vlarun.runtime.transport import Security

    _pin(cpus)
    packet, meta = _edge_packet(policy_name)
    sec = Security(insecure=True)
    ping(endpoint, sec, count=1, timeout_s=5.0)
    client = EdgeClient(endpoint, sec)
    rows: list[tuple[float, bool]] = []
    end = time.monotonic() + seconds
    try:
        while len(rows) < n and time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                client.run(STAGES, packet, ("actions",), 1.0, 1.5, meta)
                ok = True
            except Exception:  # noqa: BLE001 - refused (the robot would run it itself)
                ok = False
            ms = 1e3 * (time.perf_counter() - t0)
            rows.append((ms, ok))
            time.sleep(max(0.0, 0.5 - ms / 1e3))
    finally:
        client.close()
    out.put(rows)


def flood_client(
    endpoint: str, sec, packet, meta, stop: threading.Event, counts: dict, pause_s: float = 0.0
) -> None:
    """One flooding identity: whole-policy requests back to back until ``stop``, counting
    ``served`` and ``refused`` (busy or late; again after ``pause_s``)."""
    from vlarun.runtime.robot.client import EdgeClient

    c = EdgeClient(endpoint, sec)
    try:
        while not stop.is_set():
            try:
                c.run(STAGES, packet, ("actions",), 1.0, 1.5, meta)
                counts["served"] += 1
            except Exception:  # noqa: BLE001 - busy (its key's share) or late
                counts["refused"] += 1
                if pause_s:
                    stop.wait(pause_s)
    finally:
        c.close()


def edge_attack(o: BenchHostileOptions) -> dict:
    """16 identities send whole-policy requests back to back to an emulated OpenVLA-7B edge;
    a robot at 2 Hz beside them."""
    from vlarun.runtime.robot.client import ping
    from vlarun.runtime.transport import Security

    server_cpus, client_cpus = _cpus()
    _pin(client_cpus)
    proc, endpoint = start_server(
        [
            "serve-edge",
            "--policy",
            o.policy,
            "--port",
            "0",
            "--insecure",
            "--threads",
            "1",
            "--emulate",
            "openvla-7b:rtx4090",
        ],
        server_cpus,
    )
    sec = Security(insecure=True)
    try:
        ping(endpoint, sec, count=1, timeout_s=10.0)
        n_rest = o.rest_requests
        rest = Legit(_legit_robot, (endpoint, o.policy, n_rest, 120.0, client_cpus)).result()
        mem = Memory(proc.pid)
        stop = threading.Event()
        packet, meta = _edge_packet(o.policy)
        counts = {"served": 0, "refused": 0}

        def one() -> None:
            flood_client(endpoint, sec, packet, meta, stop, counts)

        legit = Legit(_legit_robot, (endpoint, o.policy, 10_000, o.seconds, client_cpus))
        _threads(one, 16, stop, o.seconds)
        during = legit.result()
        row = {
            "attack": "edge-flood16",
            "server": "serve-edge",
            "result": f"16 identities back to back for {o.seconds:g} s: "
            f"{counts['served']} served, {counts['refused']} refused",
            **mem.settle(),
            "alive": proc.poll() is None,
            "flood_served": counts["served"],
        }
    finally:
        err = stop_server(proc)
    rest_l = _latency(rest)
    row.update(_latency(during))
    row.update(
        {
            "rest_p50_ms": rest_l["legit_p50_ms"],
            "rest_p99_ms": rest_l["legit_p99_ms"],
            "rest_answered": rest_l["legit_answered"],
            "rest_requests": len(rest),
            "server_tracebacks": err.count("Traceback"),
        }
    )
    # The robot's fair share: 1/17 of the requests served, or all it asks when that is less.
    served = row["legit_answered"] + row["flood_served"]
    row["legit_fair_share"] = min(row["legit_requests"], served / 17)
    return row
