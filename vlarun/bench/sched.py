"""`vlarun bench sched`: the scheduler's decision time over >= 1000 candidate plans, under
changing link and load (vlarun.cli's registry points here)."""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.config import opt
from vlarun.sched.plan_options import PlanOptions, make_scheduler


@dataclass(frozen=True)
class BenchSchedOptions:
    """Scheduler decision time over >= 1000 candidate plans, under changing link and load."""

    model: str = opt("cogact", "model preset (cogact: 2048 candidates)")
    robot_device: str = opt("orin-agx-32gb", "robot's catalog device id", deprecated=("--robot",))
    edge_device: str = opt("rtx4090", "edge's catalog device id", deprecated=("--edge",))
    chunk: int = opt(2, "actions per inference (2 at 20 Hz: 100 ms, so plans use the edge)")
    decisions: int = opt(1000, "decisions to time")
    json: bool = opt(False, "print one JSON object")


def cmd_bench_sched(o: BenchSchedOptions) -> dict:
    import random
    import statistics
    import time

    from vlarun.sched.link import Link
    from vlarun.sched.predictor import DeviceState
    from vlarun.sched.queue_model import plan_bookings, reservations
    from vlarun.world.fleet import SimEdge

    plan = PlanOptions(model=o.model, robot=o.robot_device, edge=o.edge_device, chunk=o.chunk)
    sched, _, _ = make_scheduler(plan)
    rng = random.Random(0)
    # Eight robots' plans booked on one edge, as in a fleet: each decision is scored against
    # the edge's forecast of every plan booked before it (the one reservation mechanism).
    edge, times, held = SimEdge(), [], 0
    for i in range(o.decisions + 20):
        link = Link(rng.uniform(20, 300), rng.uniform(1, 30))
        now = i * 0.05
        t0 = time.perf_counter()
        state = DeviceState(reservations=reservations(edge.forecast(now), now))
        d = sched.decide(link, now, state)
        edge.book(plan_bookings(d, sched.slo_s, now), f"robot{i % 8}", now)
        if i >= 20:  # the first decisions warm caches up
            times.append((time.perf_counter() - t0) * 1e3)
        held = max(held, len(state.reservations))
        for name, role in d.placement.items():  # the edge's estimate: the plan's own times
            if role == "edge" and name not in edge.times.est_s:
                edge.times.measured(name, d.stage_end[name] - d.stage_start[name], 1, now)
    times.sort()
    return {
        "model": o.model,
        "candidates": sched.space.size,
        "decisions": len(times),
        "p50_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
        "max_ms": times[-1],
        "max_reservations": held,
        "scope": "the edge's forecast of the plans booked so far + decide(): scoring every "
        "candidate against it",
    }


def show_bench_sched(r: dict) -> None:
    print(
        f"{r['model']}: {r['candidates']} candidates, {r['decisions']} decisions: "
        f"p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, max {r['max_ms']:.3f} ms "
        f"(up to {r['max_reservations']} edge reservations held)"
    )


OPTIONS = {"bench-sched": BenchSchedOptions}
RUN = {"bench-sched": cmd_bench_sched}
SHOW = {"bench-sched": show_bench_sched}
