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
    robot: str = opt("orin-agx-32gb", "robot device id")
    edge: str = opt("rtx4090", "edge device id")
    chunk: int = opt(2, "actions per inference (2 at 20 Hz: 100 ms, so plans use the edge)")
    decisions: int = opt(1000, "decisions to time")
    json: bool = opt(False, "print one JSON object")


def cmd_bench_sched(o: BenchSchedOptions) -> dict:
    import random
    import statistics
    import time

    from vlarun.sched.link import Link
    from vlarun.sched.predictor import DeviceState

    sched, _ = make_scheduler(PlanOptions(model=o.model, robot=o.robot, edge=o.edge, chunk=o.chunk))
    rng = random.Random(0)
    state, times, held = DeviceState(), [], 0
    for i in range(o.decisions + 20):
        link = Link(rng.uniform(20, 300), rng.uniform(1, 30))
        now = i * 0.05
        state.expire(now)
        t0 = time.perf_counter()
        d = sched.decide(link, now, state)
        sched.commit(d, state)  # reservations accumulate as in a fleet
        held = max(held, len(state.reservations))
        if i >= 20:  # the first decisions warm caches up
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "model": o.model,
        "candidates": sched.space.size,
        "decisions": len(times),
        "p50_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
        "max_ms": times[-1],
        "max_reservations": held,
        "scope": "decide() + commit(): scoring every candidate and registering reservations",
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
