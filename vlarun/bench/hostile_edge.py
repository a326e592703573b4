"""`vlarun bench hostile`'s attacks on a secure edge (CurveZMQ, ``--authorized-keys``), each
beside an authorized robot with a 1 s budget (issue 64, 1 and 2).

* ``edge-handshake``: a process opens DEALER sockets with a key the edge does not authorize,
  ``--handshakes-in-flight`` at once (4), each refused, for ``--seconds``. Then an equal CPU
  burner: a process (or several) burning the CPU the flooder burned, at the same rate, on the
  same CPUs, beside the same robot. Two rows: the robot's p99 under the flood against its p99
  beside the burner says what refusing handshakes costs the edge beyond the CPU the attacker
  brings.
  The flood row also splits what the flood cost the edge's CPU, per refused handshake:
  ZeroMQ's I/O thread (the CURVE handshake's crypto), the ZAP proxy thread, the rest of the
  edge's process (its Python threads: what serves robots), its ZAP authorizer process.
  The edge runs the policy for real and the robot asks at 5 Hz.
* ``edge-identities50``: one authorized key opens 50 DEALER identities, each sending
  whole-policy requests back to back to an edge emulating OpenVLA-7B (~200 ms a request);
  the other authorized robot asks at 2 Hz beside them.

Edge and clients are pinned as in ``bench.hostile`` (the edge on the first CPU, the clients,
attackers and burners on the rest).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import zmq

from vlarun.bench.hostile import (
    STAGES,
    BenchHostileOptions,
    Legit,
    Memory,
    _cpus,
    _edge_packet,
    _latency,
    _pin,
    flood_client,
    start_server,
    stop_server,
)
from vlarun.runtime.scaleout import proctree
from vlarun.runtime.testbed import procs
from vlarun.runtime.transport import Security, generate_keys, load_keys

HANDSHAKE_ROBOT_PERIOD_S = 0.2  # the robot beside the handshake flood asks at 5 Hz
IDENTITIES = 50


# --- CPU time, read from /proc ----------------------------------------------------------------


def _ticks(stat: str) -> float:
    """utime + stime of one /proc stat line, in seconds."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def edge_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the edge process so far: ZeroMQ's own threads (``ZMQbg/*``: I/O, where
    the CURVE handshakes run), the thread forwarding ZAP requests (``zap-proxy``, C only),
    the rest of the process (its Python threads: what serves robots), and its child
    processes still running (the ZAP authorizer)."""
    zmq_s = proxy_s = rest_s = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            cpu = _ticks((task / "stat").read_text())
        except OSError:
            continue
        if comm.startswith("ZMQbg"):
            zmq_s += cpu
        elif comm == "zap-proxy":
            proxy_s += cpu
        else:
            rest_s += cpu
    kids = 0.0
    for child, _ in proctree.children().get(pid, []):
        try:
            kids += _ticks(Path(f"/proc/{child}/stat").read_text())
        except OSError:
            continue
    return {"zmq_io": zmq_s, "zap_proxy": proxy_s, "python": rest_s, "children": kids}


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# --- the secure edge and its robots ------------------------------------------------------------


def secure_edge(o: BenchHostileOptions, keys: Path, server_cpus: set[int], emulate: bool):
    """``serve-edge`` with keys made for the run, admitting the robots in ``keys/robots``
    (``procs.local_keys``, plus one more key there: ``attacker``); ``emulate``: as an
    OpenVLA-7B edge (~200 ms a request, mostly waited), else running ``o.policy`` for real.
    (process, endpoint, {name: Security})."""
    robot = procs.local_keys(keys)
    made = generate_keys(keys, "attacker")
    (keys / "robots" / "attacker.key").write_text(Path(made["public"]).read_text())
    attacker = Security(own=load_keys(made["secret"]), server_public=robot.server_public)
    argv = [
        "serve-edge",
        "--policy",
        o.policy,
        "--port",
        "0",
        "--threads",
        "1",
        "--keys",
        str(keys / "edge.key_secret"),
        "--authorized-keys",
        str(keys / "robots"),
    ]
    proc, endpoint = start_server(
        argv + (["--emulate", "openvla-7b:rtx4090"] if emulate else []), server_cpus
    )
    return proc, endpoint, {"robot": robot, "attacker": attacker}


def _legit_secure(
    endpoint: str,
    policy_name: str,
    sec: Security,
    period_s: float,
    n: int,
    seconds: float,
    cpus: set[int],
    go,
    out,
) -> None:
    """``bench.hostile._legit_robot`` with an authorized key: a request every ``period_s``,
    a 1 s budget. ``go``: a barrier it waits at once connected (None: starts at once), so the
    robot's window and the attack's are the same ``seconds``."""
    from vlarun.runtime.robot.client import EdgeClient, LinkDown

    _pin(cpus)
    packet, meta = _edge_packet(policy_name)
    client = EdgeClient(endpoint, sec)
    end = time.monotonic() + 30.0
    while True:  # connected (handshake done) before the first request is timed
        try:
            client.health(timeout_s=1.0)
            break
        except LinkDown:
            if time.monotonic() > end:
                raise
            client.sock.poll(20, zmq.POLLOUT)
    rows: list[tuple[float, bool]] = []
    if go is not None:
        go.wait(120)
    end = time.monotonic() + seconds
    try:
        while len(rows) < n and time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                client.run(STAGES, packet, ("actions",), 1.0, 1.5, meta)
                ok = True
            except Exception:  # noqa: BLE001 - refused or late (the robot would run it itself)
                ok = False
            ms = 1e3 * (time.perf_counter() - t0)
            rows.append((ms, ok))
            time.sleep(max(0.0, period_s - ms / 1e3))
    finally:
        client.close()
    out.put(rows)


# --- the attackers -----------------------------------------------------------------------------


def _handshake_flood(
    endpoint: str, server_public: bytes, seconds: float, in_flight: int, cpus: set[int], go, out
) -> None:
    """New DEALER sockets with a made-up key (not authorized), ``in_flight`` handshakes at
    once, each closed when the edge's verdict arrives (or after 1 s), for ``seconds``."""
    _pin(cpus)
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    verdicts = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    verdicts |= zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    counts = {"refused": 0, "admitted": 0, "other": 0, "unanswered": 0}
    live: dict[zmq.Socket, tuple[zmq.Socket, float]] = {}  # monitor -> (socket, opened at)
    poller = zmq.Poller()

    def open_one() -> None:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_public, public, secret
        mon = s.get_monitor_socket(verdicts)
        s.connect(endpoint)
        live[mon] = (s, time.monotonic())
        poller.register(mon, zmq.POLLIN)

    def close_one(mon: zmq.Socket) -> None:
        s, _ = live.pop(mon)
        poller.unregister(mon)
        s.disable_monitor()
        mon.close(0)
        s.close(0)

    go.wait(120)
    cpu0, end = _own_cpu_s(), time.monotonic() + seconds
    while time.monotonic() < end:
        while len(live) < in_flight:
            open_one()
        for mon, _ in poller.poll(100):
            event = recv_monitor_message(mon)["event"]
            key = {
                zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused",
                zmq.EVENT_HANDSHAKE_SUCCEEDED: "admitted",
            }.get(event, "other")
            counts[key] += 1
            close_one(mon)
        now = time.monotonic()
        for mon in [m for m, (_, t) in live.items() if now - t > 1.0]:
            counts["unanswered"] += 1
            close_one(mon)
    for mon in list(live):
        close_one(mon)
    ctx.term()
    out.put({**counts, "cpu_s": _own_cpu_s() - cpu0, "seconds": seconds})


def _burn(rate: float, seconds: float, cpus: set[int], go, out) -> None:
    """Burn ``rate`` CPU-s a second for ``seconds``, kept on track by the process's own CPU
    clock (a busy CPU that delays it is made up for, as a flooder would)."""
    _pin(cpus)
    go.wait(120)
    cpu0, t0 = _own_cpu_s(), time.monotonic()
    while (now := time.monotonic()) < t0 + seconds:
        if _own_cpu_s() - cpu0 >= rate * (now - t0):
            time.sleep(0.001)
    out.put(_own_cpu_s() - cpu0)


def _beside_robot(target, args_list: list[tuple], robot: tuple) -> tuple[list, list]:
    """One spawned process per ``args`` and the robot (``_legit_secure``'s ``robot`` args),
    released together once all are ready; (their results, the robot's rows)."""
    ctx = mp.get_context("spawn")
    go, out = ctx.Barrier(len(args_list) + 1), ctx.Queue()
    legit = Legit(_legit_secure, (*robot, go))
    ps = [ctx.Process(target=target, args=(*a, go, out), daemon=True) for a in args_list]
    for p in ps:
        p.start()
    results = [out.get(timeout=180) for _ in ps]
    for p in ps:
        p.join(10)
    return results, legit.result()


# --- the rows ----------------------------------------------------------------------------------


def _row(name: str, what: str, proc, mem: Memory, during: list, rest: list, **extra) -> dict:
    row = {
        "attack": name,
        "server": "serve-edge",
        "result": what,
        **mem.settle(),
        "alive": proc.poll() is None,
        **extra,
    }
    row.update(_latency(during))
    r = _latency(rest)
    row.update(
        {
            "rest_p50_ms": r["legit_p50_ms"],
            "rest_p99_ms": r["legit_p99_ms"],
            "rest_answered": r["legit_answered"],
            "rest_requests": len(rest),
        }
    )
    return row


def handshake_attack(o: BenchHostileOptions) -> list[dict]:
    """The handshake flood beside the robot, then an equal CPU burner beside it: two rows.
    The edge runs ``o.policy`` for real (no ``--emulate``: an emulated request is mostly a
    wait, which would hide what the edge's CPU loses) and the robot asks every
    ``HANDSHAKE_ROBOT_PERIOD_S`` (more samples for a p99 in the flood's seconds)."""
    server_cpus, client_cpus = _cpus()
    _pin(client_cpus)
    keys = Path(tempfile.mkdtemp(prefix="vlarun-hostile-"))
    proc, endpoint, secs = secure_edge(o, keys / "k", server_cpus, emulate=False)
    robot, period = secs["robot"], HANDSHAKE_ROBOT_PERIOD_S
    try:
        cpu0, t0 = edge_cpu(proc.pid), time.monotonic()
        rest = Legit(
            _legit_secure,
            (endpoint, o.policy, robot, period, o.rest_requests, 120.0, client_cpus, None),
        ).result()
        at_rest = _cpu_rates(cpu0, edge_cpu(proc.pid), time.monotonic() - t0)
        beside = (endpoint, o.policy, robot, period, 10_000, o.seconds, client_cpus)
        # The flood. The edge's CPU is read around all of it, and what the edge spends at
        # rest with the robot (per second) taken off: what is left, the flood cost it.
        mem, cpu0, t0 = Memory(proc.pid), edge_cpu(proc.pid), time.monotonic()
        args = (endpoint, robot.server_public, o.seconds, o.handshakes_in_flight, client_cpus)
        (flood,), during = _beside_robot(_handshake_flood, [args], beside)
        spent = _cpu_rates(cpu0, edge_cpu(proc.pid), 1.0)
        wall = time.monotonic() - t0
        n = max(1, flood["refused"])
        per_hs = {
            f"edge_{k}_ms_per_handshake": 1e3 * max(0.0, v - at_rest[k] * wall) / n
            for k, v in spent.items()
        }
        what = (
            f"{flood['refused']} handshakes refused in {o.seconds:g} s "
            f"({flood['admitted']} admitted, {flood['other'] + flood['unanswered']} other); "
            f"the flooder burned {flood['cpu_s']:.2f} CPU-s"
        )
        flood_row = _row(
            "edge-handshake",
            what,
            proc,
            mem,
            during,
            rest,
            handshakes_refused=flood["refused"],
            handshakes_admitted=flood["admitted"],
            flooder_cpu_s=flood["cpu_s"],
            edge_cpu_s={k: round(v, 3) for k, v in spent.items()},
            edge_cpu_per_s_at_rest={k: round(v, 4) for k, v in at_rest.items()},
            edge_window_s=round(wall, 2),
            **per_hs,
        )
        # The burner: the flooder's CPU, at its rate, on its CPUs.
        rate = flood["cpu_s"] / o.seconds
        k = max(1, math.ceil(rate))
        mem = Memory(proc.pid)
        burned, during = _beside_robot(_burn, [(rate / k, o.seconds, client_cpus)] * k, beside)
        burner_row = _row(
            "edge-handshake-burner",
            f"{k} process(es) burned {sum(burned):.2f} CPU-s in {o.seconds:g} s",
            proc,
            mem,
            during,
            rest,
            burner_cpu_s=sum(burned),
        )
    finally:
        err = stop_server(proc)
        shutil.rmtree(keys, ignore_errors=True)
    for row in (flood_row, burner_row):
        row["server_tracebacks"] = err.count("Traceback")
    b = burner_row["legit_p99_ms"]
    flood_row["p99_vs_burner"] = flood_row["legit_p99_ms"] / b if b else None
    return [flood_row, burner_row]


def _cpu_rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    return {k: (after[k] - before[k]) / seconds for k in before}


def identities_attack(o: BenchHostileOptions) -> dict:
    """One authorized key opens ``IDENTITIES`` DEALER identities, each sending whole-policy
    requests back to back; the other authorized robot at 2 Hz beside them."""

    server_cpus, client_cpus = _cpus()
    _pin(client_cpus)
    keys = Path(tempfile.mkdtemp(prefix="vlarun-hostile-"))
    proc, endpoint, secs = secure_edge(o, keys / "k", server_cpus, emulate=True)
    robot, attacker = secs["robot"], secs["attacker"]
    try:
        rest = Legit(
            _legit_secure,
            (endpoint, o.policy, robot, 0.5, o.rest_requests, 120.0, client_cpus, None),
        ).result()
        mem, stop = Memory(proc.pid), threading.Event()
        packet, meta = _edge_packet(o.policy)
        counts = {"served": 0, "refused": 0}

        def one() -> None:
            flood_client(endpoint, attacker, packet, meta, stop, counts, pause_s=0.01)

        go = mp.get_context("spawn").Barrier(2)
        legit = Legit(
            _legit_secure, (endpoint, o.policy, robot, 0.5, 10_000, o.seconds, client_cpus, go)
        )
        threads = [threading.Thread(target=one, daemon=True) for _ in range(IDENTITIES)]
        go.wait(120)  # the robot is connected: its window and the flood's are the same
        for t in threads:
            t.start()
        stop.wait(o.seconds)
        stop.set()
        for t in threads:
            t.join(60)
        during = legit.result()
        row = _row(
            "edge-identities50",
            f"one key on {IDENTITIES} identities for {o.seconds:g} s: "
            f"{counts['served']} served, {counts['refused']} refused",
            proc,
            mem,
            during,
            rest,
            flood_served=counts["served"],
        )
    finally:
        err = stop_server(proc)
        shutil.rmtree(keys, ignore_errors=True)
    row["server_tracebacks"] = err.count("Traceback")
    return row


def secure_edge_attack(name: str, o: BenchHostileOptions) -> list[dict]:
    """The rows of one of ``SECURE_EDGE_ATTACKS``."""
    return handshake_attack(o) if name == "edge-handshake" else [identities_attack(o)]
