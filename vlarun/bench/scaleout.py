"""`vlarun bench scaleout`: robots against 1 and 2 Ray edge workers, a worker killed mid-load,
the Ray hop's overhead, and a projection to more workers from the measured per-worker profile.

Everything runs as real processes on this machine: `vlarun serve-edge --workers N` (the front
and its Ray cluster) in a child process, the robots through the one load generator
(``runtime.loadgen``) on a thread of this one: a robot sends one
request for the whole graph (Edge-Only) every ``period_ms``, robot i at i / robots of the
period, with ``slo_ms`` as its deadline, and waits up to a second longer than the deadline, so
that late answers are told apart from lost ones. Per request: ``ok`` (answered within the
deadline), ``late`` (answered after it), ``refused`` (the edge said at once it could not make
it: the robot runs it locally, in time), ``lost`` (no answer at all). Fallbacks = refused + late
+ lost.

The hop: one robot, one stage at a time, against a single-process edge and against the front with
one worker, asked in turn: the hop = median over pairs of (round trip - the edge's own time from
arrival to reply), front minus direct, with a bootstrap 95% interval.

The projection is a queueing simulation of the front's own pool (``runtime.worker_pool``: its
forecast, lag and freshness check; the earliest predicted finish first) and admission
(``edge.core.admissible``: refused when no worker can make the deadline), each worker admitting
and serving by the edge's one queue model (``sched.queue_model``), with each request's service
time drawn from the per-request compute times the 1-worker run measured; it is checked against
the measured 1- and 2-worker runs, then run with more workers. It models workers that do not
share cores (one GPU or machine each), which this 2-core machine cannot show beyond two.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, items, opt


@dataclass(frozen=True)
class BenchScaleoutOptions:
    """Robots against 1 and 2 Ray edge workers (throughput, SLO share, p99, fallbacks), a
    worker killed mid-load, the Ray hop's overhead, and a projection to more workers."""

    policy: str = opt(
        "tiny-ar", "policy every worker serves: " + POLICY_HELP, replaces=POLICY_FLAGS_RETIRED
    )
    workers: tuple[int, ...] = opt((1, 2), "worker counts to measure")
    robots: tuple[int, ...] = opt(
        (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24), "robot counts to measure"
    )
    period_ms: float = opt(1000.0, "each robot sends one request per period")
    slo_ms: float = opt(500.0, "each request's deadline")
    seconds: float = opt(8.0, "measured seconds per (workers, robots) cell")
    repeats: int = opt(1, "rounds of every worker count, one after the other (paired by round)")
    kill: bool = opt(True, "also kill a worker mid-load (the largest worker count)")
    kill_robots: int = opt(8, "robots during the kill run")
    hop_requests: int = opt(60, "sequential requests per side for the hop overhead")
    project: tuple[int, ...] = opt((1, 2, 4, 8), "worker counts of the projection")
    parts: tuple[str, ...] = opt(("cells", "kill", "hop"), "what to run: cells, kill, hop")
    plot: str | None = opt(None, "write a PNG plot here")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.period_ms <= 0 or self.slo_ms <= 0 or self.seconds <= 0 or self.repeats < 1:
            raise ValueError("--period-ms, --slo-ms, --seconds and --repeats must be positive")
        if min(items(self.workers, int)) < 1 or min(items(self.robots, int)) < 1:
            raise ValueError("--workers and --robots must be >= 1")
        bad = set(items(self.parts)) - {"cells", "kill", "hop"}
        if bad:
            raise ValueError(f"unknown --parts {sorted(bad)}; choose from cells, kill, hop")


STAGES = ("vision", "prefill", "decode")


def _edge(extra: list[str]):
    from vlarun.runtime.testbed.procs import start_edge

    return start_edge(0, extra, timeout_s=180.0)


def _request(policy, seed: int):
    import torch

    from vlarun.stages.families import example_inputs

    cfg = policy.model.cfg
    ids = policy.text_ids("open the drawer")
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(1, 1, 3, cfg.image_size, cfg.image_size, generator=g)
    return example_inputs(cfg, images, [ids]), {"batch": 1, "text_tokens": len(ids)}


def _connect(endpoint: str):
    from vlarun.runtime.robot.client import EdgeClient, LinkDown
    from vlarun.runtime.transport import Security

    sec = Security(insecure=True)
    c = EdgeClient(endpoint, sec)
    end = time.monotonic() + 10
    while True:
        try:
            c.health(0.5)
            return c
        except LinkDown:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def _load(endpoint, policy, robots: int, o, seconds: float) -> tuple[list[dict], float, list]:
    """``robots`` robots for ``seconds`` through the one load generator
    (``runtime.loadgen.run``, on a thread of this process): (its rows, when the first robot
    sends, the thread). Open loop: robot i sends at i / robots of the period, every period,
    whether or not its last answer came, and waits up to a second past the deadline, so late
    answers are told apart from lost ones."""
    from vlarun.runtime.testbed.loadgen import encode_request, run

    frames = encode_request(policy, "open the drawer", o.slo_ms * 1e-3)
    out: list[dict] = []
    start = time.monotonic() + 0.5  # connections first
    stop = threading.Event()
    th = threading.Thread(
        target=run,
        args=(endpoint, frames, robots, o.period_ms * 1e-3, stop),
        kwargs={
            "seconds": seconds,
            "start_at": start,
            "rows": out,
            "drain_s": o.slo_ms * 1e-3 + 1.0,
        },
    )
    th.start()
    return out, start, [th]


def _summary(rows: list[dict], seconds: float) -> dict:
    n = len(rows)
    count = {k: sum(r["kind"] == k for r in rows) for k in ("ok", "late", "refused", "lost")}
    answered = [r["wall_s"] * 1e3 for r in rows if r["kind"] in ("ok", "late")]
    return {
        "requests": n,
        **count,
        "served_per_s": count["ok"] / seconds,
        "slo_share": count["ok"] / n if n else 0.0,
        "fallbacks": count["refused"] + count["late"] + count["lost"],
        "p50_ms": float(np.percentile(answered, 50)) if answered else None,
        "p99_ms": float(np.percentile(answered, 99)) if answered else None,
    }


def _health(endpoint: str) -> dict:
    from vlarun.runtime.robot.client import ping
    from vlarun.runtime.transport import Security

    return ping(endpoint, Security(insecure=True), 1, 2.0)["health"]


def _cells(o, policy, workers: int, progress, round_: int = 0) -> tuple[list[dict], list[float]]:
    from vlarun.runtime.testbed.procs import stop

    proc, endpoint = _edge(["--workers", str(workers), "--threads", "1"])
    rows, samples = [], []
    try:
        for robots in items(o.robots, int):
            out, _, threads = _load(endpoint, policy, robots, o, o.seconds)
            for th in threads:
                th.join()
            rows.append(
                {"round": round_, "workers": workers, "robots": robots, **_summary(out, o.seconds)}
            )
            samples += [r["compute_s"] for r in out if r["compute_s"] > 0]
            progress(rows[-1])
    finally:
        stop(proc)
    return rows, samples


def _kill_run(o, policy, workers: int) -> dict:
    """``kill_robots`` robots against ``workers`` workers; a third of the way in, the first
    worker seen holding a request is SIGKILLed (so its requests must be re-dispatched or
    refused)."""
    from vlarun.runtime.testbed.procs import stop

    proc, endpoint = _edge(["--workers", str(workers), "--threads", "1"])
    seconds = max(o.seconds, 9.0)
    try:
        out, start, threads = _load(endpoint, policy, o.kill_robots, o, seconds)
        time.sleep(max(start + seconds / 3 - time.monotonic(), 0.0))
        while True:  # (the robots keep the workers busy: this takes a few ms)
            busy = [w for w in _health(endpoint)["workers"] if w["up"] and w["in_flight"]]
            if busy or time.monotonic() > start + seconds / 2:
                break
        victim = (busy or _health(endpoint)["workers"])[0]
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        back = None
        while time.monotonic() < start + seconds + 30:
            h = _health(endpoint)
            w = h["workers"][victim["worker"]]
            if h["capacity"] == workers and w["pid"] != victim["pid"]:
                back = time.monotonic() - killed
                break
            time.sleep(0.05)
        for th in threads:
            th.join()
        h = _health(endpoint)
    finally:
        stop(proc)
    t_kill = killed - start
    ok_times = sorted(r["t"] + r["wall_s"] for r in out if r["kind"] == "ok")
    after = [t for t in ok_times if t >= t_kill]
    gaps = np.diff([t_kill, *after]) if after else np.array([seconds])
    window = [r for r in out if t_kill - 0.5 <= r["t"] <= t_kill + 2.0]
    return {
        "workers": workers,
        "robots": o.kill_robots,
        "seconds": seconds,
        "kill_at_s": t_kill,
        "killed_in_flight": victim["in_flight"],
        **_summary(out, seconds),
        "around_kill": _summary(window, 2.5),
        "lost_requests": sum(r["kind"] == "lost" for r in out),
        "answered_late": sum(r["kind"] == "late" for r in out),
        "longest_gap_after_kill_s": float(gaps.max()),
        "first_ok_after_kill_s": float(after[0] - t_kill) if after else None,
        "worker_back_s": back,
        "front": {
            k: h[k]
            for k in (
                "redispatched",
                "lost_refused",
                "refused",
                "worker_down",
                "worker_up",
                "expired",
                "late",
            )
        },
    }


def _hop(o, policy) -> dict:
    """Round trip minus the edge's own time (arrival to reply), a single-process edge and the
    front + 1 worker side by side: both run at once and are asked in turn, so drifts of this
    shared machine fall on both alike; the paired differences give the hop and its 95% CI."""
    from vlarun.runtime.testbed.procs import stop
    from vlarun.stages.packet import Packet

    inputs, meta = _request(policy, 0)
    packet = Packet({"images": inputs["images"]})
    procs = [_edge(["--threads", "1"]), _edge(["--workers", "1", "--threads", "1"])]
    try:
        clients = [_connect(endpoint) for _, endpoint in procs]
        over: list[list[float]] = [[], []]
        sent = 0
        for i in range(o.hop_requests + 5):
            for side, c in enumerate(clients):
                t0 = time.perf_counter()
                r = c.run(("vision",), packet, ("visual",), 5.0, 5.0, meta)
                if i >= 5:  # the first few pay for connections and caches
                    over[side].append((time.perf_counter() - t0 - r.server_s) * 1e3)
                sent = r.sent_bytes
        for c in clients:
            c.close()
    finally:
        for proc, _ in procs:
            stop(proc)
    diff = np.array(over[1]) - np.array(over[0])
    rng = np.random.default_rng(0)
    boot = [np.median(rng.choice(diff, diff.size)) for _ in range(2000)]
    return {
        "direct_ms": float(np.median(over[0])),
        "ray_ms": float(np.median(over[1])),
        "hop_ms": float(np.median(diff)),
        "hop_ci95_ms": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "requests": int(diff.size),
        "request_bytes": sent,
    }


# ---------------------------------------------------------------------------------------------
# Projection


def simulate(
    workers: int,
    robots: int,
    period_s: float,
    slo_s: float,
    samples: list[float],
    seconds: float,
    seed: int = 0,
    max_batch: int = 1,
) -> dict:
    """The front and its workers on a simulated clock, each deciding by its own rule.

    The front is the real one's pool (``runtime.worker_pool.WorkerPool``): per worker, its
    flights played forward by the edge's one queue model (``sched.queue_model``) at the stage
    times its replies reported, plus how late its answers came (``lag_s``), a stale estimate
    replaced by the best live worker's; its order (``dispatch_order``: a robot's stream kept on
    one worker while that one is in time) and the core's rule (``edge.core.admissible``:
    refused when every fresh forecast is late) pick the worker. The worker admits it by the
    same rule over its own queue at its own measured times (``LocalWorker.quotes``), or
    refuses it at once; then serves by the queue model's rule at service times drawn from
    ``samples`` (per request; ``max_batch`` as the workers take them: a batch costs its
    members' sum). Each answer teaches the front as a real reply does, unless the front forgot
    its flight first (past its deadline, ``WorkerPool.expired``). Both start from the
    worker's warm-up measurement, the mean of ``samples``. Robots send one request every
    ``period_s``, each at its own random phase, for ``seconds``."""
    from vlarun.runtime.edge.core import Quote, ServerConfig, admissible
    from vlarun.runtime.protocol import StageTiming
    from vlarun.runtime.scaleout.worker_pool import Flight, WorkerPool
    from vlarun.sched.queue_model import THIS, EdgeQueue, Pending, StageTimes, finish

    rng = random.Random(seed)
    arrivals = sorted(
        (rng.uniform(0, period_s) + k * period_s, r)
        for r in range(robots)
        for k in range(int(seconds / period_s) + 1)
    )
    stage, warm = ("policy",), statistics.fmean(samples)
    cfg = ServerConfig(max_batch=max_batch)
    pool = WorkerPool(workers, stage, cfg)
    own = [StageTimes() for _ in range(workers)]  # each worker's own measurements
    for w, times in zip(pool.workers, own, strict=True):
        w.up = True
        w.times.measured(stage[0], warm, 1, 0.0)  # the front takes the worker's warm-up
        times.measured(stage[0], warm, 1, 0.0, prior=True)
    served = [EdgeQueue(max_batch) for _ in range(workers)]  # what each worker does
    ends: list[tuple[float, int, int, list]] = []  # batch ends: (when, worker, order, members)
    order = itertools.count()  # ties in time: the batch started first ends first
    count = {"ok": 0, "late": 0, "refused": 0}

    def serve_until(t: float) -> None:
        """Every batch that starts by ``t``; then, in time order, every batch that ends by
        ``t``: the worker measures it, the front hears its answers."""
        for w, q in enumerate(served):
            while (at := q.next_at()) is not None and at <= t:
                batch = q.step()
                count["ok"] += sum(slot.end <= p.deadline for p, slot in batch)
                count["late"] += sum(slot.end > p.deadline for p, slot in batch)
                heapq.heappush(ends, (batch[0][1].end, w, next(order), batch))
        while ends and ends[0][0] <= t:
            end, w, _, batch = heapq.heappop(ends)
            start = batch[0][1].start
            own[w].measured(stage[0], end - start, len(batch), end)
            pool.expired(end)  # what the front forgot before these answers came
            for p, _ in batch:
                f = pool.workers[w].flights.pop(p.key, None)
                timing = StageTiming(stage[0], end - start, start - p.ready, len(batch))
                if f is not None:
                    pool.answered(pool.workers[w], f, (timing,), end)
        pool.expired(t)

    def worker_admits(w: int, t: float, deadline: float) -> bool:
        """The worker's own admission: its queue at its measured times, with this one in."""
        q, mine = served[w].copy(own[w].seconds), own[w].seconds(stage)
        q.add(
            Pending(ready=t, deadline=deadline, origin=THIS, stages=stage, seconds=mine, key=THIS)
        )
        end = finish(q, THIS)
        fresh = own[w].fresh_at(stage, cfg.admission_fresh_s, t)
        return bool(admissible((Quote(0, t if end is None else end, fresh),), deadline))

    for rid, (t, r) in enumerate(arrivals):
        if t >= seconds:
            break
        serve_until(t)
        deadline = t + slo_s
        usable = admissible(pool.quotes(stage, deadline, t, stream=r), deadline)
        if not usable:
            count["refused"] += 1
            continue
        w = pool.workers[usable[0].worker]
        flight = Flight(f"robot{r}".encode(), rid, [], stage, "full", t, deadline, stream=r)
        flight.predicted = usable[0].finish  # as the front's dispatch notes it
        pool.sent(w, rid, flight)
        if not worker_admits(w.index, t, deadline):  # its refusal comes back at once
            pool.answered(w, w.flights.pop(rid), (), t)
            count["refused"] += 1
            continue
        drawn = (rng.choice(samples),)  # what it will really take
        served[w.index].add(
            Pending(
                ready=t, deadline=deadline, origin=f"robot{r}", stages=stage, seconds=drawn, key=rid
            )
        )
    serve_until(math.inf)  # what was admitted is served to the end
    n = sum(count.values())
    return {
        "workers": workers,
        "robots": robots,
        "served_per_s": count["ok"] / seconds,
        "slo_share": count["ok"] / n if n else 0.0,
        **count,
    }


def sim_capacity(workers: int, o, samples: list[float]) -> dict:
    """The simulated front's capacity at the SLO floor: robots added until the share falls
    below it (the measured runs' metric, on the simulated cells)."""
    period, slo = o.period_ms * 1e-3, o.slo_ms * 1e-3
    mean = statistics.fmean(samples)
    top = int(np.ceil(2 * workers * period / mean))
    rows = [
        simulate(workers, n, period, slo, samples, 120.0, seed=n)
        for n in range(max(1, top // 40), top + 1, max(1, top // 40))
    ]
    return {
        "workers": workers,
        "capacity_per_s": capacity_at(rows),
        "profile_capacity_per_s": workers / mean,
    }


def projection(o, samples: list[float], measured: list[dict]) -> dict:
    """The simulation against the measured cells, then capacity at the SLO floor for more
    workers, next to what the per-worker profile predicts: ``workers`` times the simulated
    capacity of one (linear scaling), and ``workers`` / mean service time (no queueing loss)."""
    period, slo = o.period_ms * 1e-3, o.slo_ms * 1e-3
    mean = statistics.fmean(samples)
    check = []
    for m in measured:
        s = simulate(m["workers"], m["robots"], period, slo, samples, 60.0)
        check.append(
            {
                "round": m["round"],
                "workers": m["workers"],
                "robots": m["robots"],
                "measured_per_s": m["served_per_s"],
                "simulated_per_s": s["served_per_s"],
                "measured_slo": m["slo_share"],
                "simulated_slo": s["slo_share"],
            }
        )
    one = sim_capacity(1, o, samples)["capacity_per_s"]
    scale = []
    for w in items(o.project, int):
        c = sim_capacity(w, o, samples)
        c["linear_per_s"] = w * one if one else None
        c["ratio_to_linear"] = c["capacity_per_s"] / c["linear_per_s"] if one else None
        c["ratio_to_profile"] = c["capacity_per_s"] / c["profile_capacity_per_s"]
        scale.append(c)
    p90 = float(np.percentile(samples, 90))
    return {
        "service_ms_mean": mean * 1e3,
        "service_ms_p90": p90 * 1e3,
        "samples": len(samples),
        "check": check,
        "scale": scale,
    }


# ---------------------------------------------------------------------------------------------


def run(o: BenchScaleoutOptions) -> dict:
    import torch
    from tqdm import tqdm

    from vlarun.policy.base import Policy

    torch.set_num_threads(1)
    policy = Policy.load(o.policy, "float32")
    cells = len(items(o.workers, int)) * len(items(o.robots, int)) * o.repeats
    bar = tqdm(total=cells, desc="scaleout", leave=False)

    def progress(row):
        bar.set_postfix_str(f"{row['workers']}w {row['robots']}r {row['served_per_s']:.1f}/s")
        bar.update()

    parts = set(items(o.parts))
    rows, samples = [], []
    for k in range(o.repeats if "cells" in parts else 0):
        for w in items(o.workers, int):
            got, s = _cells(o, policy, w, progress, k)
            rows += got
            if w == min(items(o.workers, int)):
                samples += s
    bar.close()
    result = {
        "benchmark": "scaleout",
        "policy": o.policy,
        "machine": _machine(),
        "period_ms": o.period_ms,
        "slo_ms": o.slo_ms,
        "seconds": o.seconds,
        "cells": rows,
        "ratio": _ratios(rows),
    }
    if o.kill and "kill" in parts:
        result["kill"] = _kill_run(o, policy, max(items(o.workers, int)))
    if "hop" in parts:
        result["hop"] = _hop(o, policy)
    if samples:
        result["projection"] = projection(o, samples, rows)
    if o.plot:
        plot(result, o.plot)
    return result


SLO_FLOOR = 0.9  # "at the same SLO share": capacity = served/s where the share falls to 90%
# Student's t, 97.5% quantile by degrees of freedom (a few rounds: the normal's 1.96 is too tight)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def capacity_at(rows: list[dict], floor: float = SLO_FLOOR) -> float | None:
    """Requests served in time per second where the SLO share crosses ``floor`` as robots are
    added, interpolated linearly between the two cells around the crossing (robot counts in
    order); None if the share never falls below the floor (the load never saturated)."""
    rows = sorted(rows, key=lambda r: r["robots"])
    for a, b in zip(rows, rows[1:], strict=False):
        if a["slo_share"] >= floor > b["slo_share"]:
            f = (a["slo_share"] - floor) / (a["slo_share"] - b["slo_share"])
            return a["served_per_s"] + f * (b["served_per_s"] - a["served_per_s"])
    if rows and rows[0]["slo_share"] < floor:
        return rows[0]["served_per_s"]
    return None


def _ratios(rows: list[dict]) -> dict:
    """Capacity at the SLO floor of the largest worker count over the smallest's, per round
    (rounds run back to back, so each ratio is paired), with a t interval over rounds."""
    ws = sorted({r["workers"] for r in rows})
    if len(ws) < 2:
        return {}
    lo, hi = ws[0], ws[-1]
    rounds = sorted({r["round"] for r in rows})
    per = []
    for k in rounds:
        caps = {
            w: capacity_at([r for r in rows if r["round"] == k and r["workers"] == w])
            for w in (lo, hi)
        }
        per.append(
            {
                "round": k,
                "capacity": {str(w): c for w, c in caps.items()},
                "ratio": caps[hi] / caps[lo] if caps[lo] and caps[hi] else None,
            }
        )
    ratios = [p["ratio"] for p in per if p["ratio"] is not None]
    out = {
        "workers": [lo, hi],
        "slo_floor": SLO_FLOOR,
        "rounds": per,
        "ratio_mean": statistics.fmean(ratios) if ratios else None,
    }
    if len(ratios) > 1:
        t = T975.get(len(ratios) - 1, 1.96)
        half = t * statistics.stdev(ratios) / len(ratios) ** 0.5
        out["ratio_ci95"] = [out["ratio_mean"] - half, out["ratio_mean"] + half]
    return out


def _machine() -> str:
    from vlarun.machine import cpu_name

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{cpu_name()}, {os.cpu_count()} cores, {when}"


def plot(r: dict, path: str) -> None:
    """Served/s and SLO share against robots per worker count: the mean over rounds, with the
    rounds' range shaded; the capacity at the SLO floor marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for w in sorted({c["workers"] for c in r["cells"]}):
        xs = sorted({c["robots"] for c in r["cells"] if c["workers"] == w})
        for ax, key in ((a, "served_per_s"), (b, "slo_share")):
            vals = [
                [c[key] for c in r["cells"] if c["workers"] == w and c["robots"] == n] for n in xs
            ]
            line = ax.plot(xs, [np.mean(v) for v in vals], "o-", label=f"{w} worker(s)")[0]
            ax.fill_between(
                xs,
                [min(v) for v in vals],
                [max(v) for v in vals],
                color=line.get_color(),
                alpha=0.2,
            )
    floor = r.get("ratio", {}).get("slo_floor")
    if floor:
        b.axhline(floor, color="grey", ls="--", lw=1)
    a.set_xlabel(f"robots (one request per {r['period_ms']:.0f} ms each)")
    a.set_ylabel("requests answered within the deadline / s")
    b.set_xlabel("robots")
    b.set_ylabel(f"SLO share (answered within {r['slo_ms']:.0f} ms)")
    a.legend()
    ratio = r.get("ratio", {}).get("ratio_mean")
    title = f"{r['policy']}: 2 vs 1 workers at the SLO floor {ratio:.2f}x" if ratio else r["policy"]
    a.set_title(title, fontsize=10)
    b.set_title(r["machine"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def show(r: dict) -> None:
    print(
        f"bench scaleout: {r['policy']}, one request per {r['period_ms']:.0f} ms per robot, "
        f"deadline {r['slo_ms']:.0f} ms, {r['seconds']:.0f} s per cell "
        f"({r['machine']})"
    )
    print(
        f"  {'workers':>7} {'robots':>6} {'served/s':>8} {'SLO':>6} {'p99 ms':>7} "
        f"{'fallbacks':>9} {'refused':>7} {'lost':>4}"
    )
    for c in r["cells"]:
        p99 = f"{c['p99_ms']:.0f}" if c["p99_ms"] is not None else "-"
        print(
            f"  {c['workers']:>7} {c['robots']:>6} {c['served_per_s']:>8.2f} "
            f"{c['slo_share']:>6.1%} {p99:>7} {c['fallbacks']:>9} {c['refused']:>7} "
            f"{c['lost']:>4}"
        )
    if r["ratio"]:
        lo, hi = r["ratio"]["workers"]
        floor = r["ratio"]["slo_floor"]
        for p in r["ratio"]["rounds"]:
            caps = ", ".join(
                f"{w} worker(s) {c:.2f}/s" if c else f"{w} worker(s) unsaturated"
                for w, c in p["capacity"].items()
            )
            ratio = f"{p['ratio']:.2f}x" if p["ratio"] else "-"
            print(
                f"  round {p['round']}: capacity at SLO share {floor:.0%}: {caps}; "
                f"{hi} vs {lo}: {ratio}"
            )
        if r["ratio"].get("ratio_mean"):
            ci = r["ratio"].get("ratio_ci95")
            ci = f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
            print(
                f"  {hi} vs {lo} workers at SLO share {floor:.0%}: "
                f"{r['ratio']['ratio_mean']:.2f}x{ci}"
            )
    if "kill" in r:
        k = r["kill"]
        print(
            f"  kill: a worker holding {k['killed_in_flight']} request(s) SIGKILLed at "
            f"{k['kill_at_s']:.1f} s of {k['seconds']:.0f} s, "
            f"{k['robots']} robots: lost {k['lost_requests']}, answered late "
            f"{k['answered_late']}, first success after the kill "
            f"{k['first_ok_after_kill_s'] or float('nan'):.3f} s, longest gap "
            f"{k['longest_gap_after_kill_s']:.3f} s, worker back after "
            f"{k['worker_back_s'] or float('nan'):.1f} s; front: {k['front']}"
        )
    h = r.get("hop")
    if h:
        print(
            f"  hop: round trip minus edge time, median {h['direct_ms']:.3f} ms direct vs "
            f"{h['ray_ms']:.3f} ms via front + worker: hop {h['hop_ms']:+.3f} ms (paired, "
            f"95% CI {h['hop_ci95_ms'][0]:+.3f} to {h['hop_ci95_ms'][1]:+.3f}; "
            f"{h['requests']} requests of {h['request_bytes']} B each way)"
        )
    if "projection" in r:
        p = r["projection"]
        print(f"  projection (service {p['service_ms_mean']:.1f} ms mean, n={p['samples']}):")
        for c in p["check"]:
            print(
                f"    check round {c['round']} {c['workers']}w {c['robots']}r: measured "
                f"{c['measured_per_s']:.2f}/s vs simulated "
                f"{c['simulated_per_s']:.2f}/s"
            )
        for c in p["scale"]:
            lin = f"{c['linear_per_s']:.2f}/s" if c["linear_per_s"] else "-"
            rl = f"{c['ratio_to_linear']:.2f}x" if c["ratio_to_linear"] else "-"
            print(
                f"    {c['workers']} workers: capacity at the SLO floor "
                f"{c['capacity_per_s'] or float('nan'):.2f}/s; linear from one worker {lin} "
                f"({rl}); workers / mean service {c['profile_capacity_per_s']:.2f}/s "
                f"({c['ratio_to_profile']:.2f}x)"
            )


OPTIONS = {"bench-scaleout": BenchScaleoutOptions}
RUN = {"bench-scaleout": run}
SHOW = {"bench-scaleout": show}
