"""A closed-loop episode driven by the robot agent, at a real control rate.

The environment is stepped once per control tick (1 / control_hz seconds of wall time, as a
real robot would execute its actions), the action coming from the chunk queue; inference
overlaps execution (``asynchronous=True``) or blocks between chunks (False, the simple loop).
Reported: the control rate achieved, stalls (ticks the robot had no action for), and every
inference as ``Inference.row()``.
"""

from __future__ import annotations

import time

import numpy as np

from vlarun.runtime.agent import RobotAgent
from vlarun.runtime.chunks import ChunkQueue


def run_episode(
    agent: RobotAgent,
    env,
    seed: int,
    control_hz: float = 20.0,
    asynchronous: bool = True,
    max_steps: int | None = None,
    on_inference=None,
) -> dict:
    """One episode; ``on_inference(i, inference)`` sees each inference as it completes."""
    obs, _ = env.reset(seed=seed)
    agent.reset()  # a new episode: a new stream of accelerator state on both sides
    horizon = agent.policy.model.cfg.horizon
    instruction = env.instruction
    done_records: list = []

    def infer(o: dict):
        image, state = agent.policy.observation(o)
        inf = agent.infer(image, instruction, state=state, seed=len(done_records))
        done_records.append(inf)
        if on_inference is not None:
            on_inference(len(done_records) - 1, inf)
        return inf.actions, inf

    queue = ChunkQueue(infer, horizon, 1.0 / control_hz, lead=asynchronous)
    period = 1.0 / control_hz
    steps, success, t_start = 0, False, time.perf_counter()
    next_tick = t_start
    queue.request(obs)
    while max_steps is None or steps < max_steps:
        action = queue.pop()
        obs, _, terminated, truncated, info = env.step(np.clip(action, -1, 1))
        steps += 1
        if terminated or truncated:
            success = bool(info.get("success", False))
            break
        if queue.needs_refill():
            queue.request(obs)
        # A stall delays the schedule instead of being made up by a burst of actions.
        next_tick = max(next_tick + period, time.perf_counter())
        time.sleep(max(next_tick - time.perf_counter(), 0.0))
    wall = time.perf_counter() - t_start
    queue.join()
    return {
        "seed": seed,
        "success": success,
        "steps": steps,
        "wall_s": wall,
        "control_hz": steps / wall if wall > 0 else 0.0,
        "stalls": len(queue.stalls),
        "stall_ms_total": sum(queue.stalls) * 1e3,
        "inferences": [r.row() for r in done_records],
    }


def summarise(infs: list[dict], actions: int) -> dict:
    """Latency percentiles, SLO share, fallbacks and modelled actions per joule."""
    if not infs:
        return {"inferences": 0}
    lat = sorted(r["latency_ms"] for r in infs)
    energy = sum(r["energy_j"] for r in infs)
    pick = lambda q: lat[min(int(q * len(lat)), len(lat) - 1)]  # noqa: E731
    return {
        "inferences": len(infs),
        "latency_p50_ms": pick(0.5),
        "latency_p99_ms": pick(0.99),
        "slo_met_fraction": sum(r["slo_met"] for r in infs) / len(infs),
        "fallbacks": sum(r["fallback"] is not None for r in infs),
        "edge_requests": sum("@edge" in r["ran"] for r in infs),
        "actions_per_joule": actions * len(infs) / energy if energy > 0 else 0.0,
    }
