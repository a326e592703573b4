"""The closed-loop episode: one loop (``run_loop``) for evaluation in simulated time and for
the robot agent at a real control rate.

At a control rate the environment is stepped once per control tick (1 / control_hz seconds of
wall time, as a real robot would execute its actions), the action coming from the chunk queue;
inference overlaps execution (``asynchronous=True``) or blocks between chunks (False), and a
new chunk joins the queue as ``merge`` says (``chunks.MERGES``). Reported: the control rate
achieved, stalls (ticks the robot had no action for), and every inference as
``Inference.row()``. In simulated time (``control_hz=None``; ``sim.evaluate``) a chunk is
inferred, executed whole, and the next inferred from the latest observation. With
``delay_steps`` (simulated time at a nominal ``control_hz``) every inference's result is
withheld that many ticks, the robot executing (``asynchronous``) or holding still meanwhile:
an emulated latency that is the same on every machine (``vlarun bench rtc``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from vlarun.runtime.robot.chunks import ChunkQueue, Prior

if TYPE_CHECKING:  # the agent (and ZeroMQ) only where agent episodes run
    from vlarun.runtime.robot.agent import RobotAgent


def run_loop(
    infer: Callable[[dict, Prior], tuple[np.ndarray, object]],
    env,
    seed: int,
    horizon: int,
    control_hz: float | None = None,
    asynchronous: bool = False,
    max_steps: int | None = None,
    frames: list | None = None,
    *,
    merge: str = "append",
    delay_steps: int | None = None,
    predict: Callable[[object], float | None] | None = None,
    model_of: Callable[[object], np.ndarray | None] | None = None,
    executed: list | None = None,
    stop_at: float | None = None,
) -> dict:
    """The one episode loop: ``infer(obs, prior) -> (chunk of actions, record)`` feeds a chunk
    queue (``chunks.ChunkQueue``; ``merge``, ``predict`` and ``model_of`` are its options) that
    the environment is stepped from until success, the environment's limit or ``max_steps``.
    ``control_hz=None``: simulated time (evaluation): inference runs inline and nothing
    sleeps; else one step per control tick of wall time, inference overlapping execution
    when ``asynchronous``. ``delay_steps``: simulated time at the nominal ``control_hz``, each
    result withheld that many ticks; a tick without an action steps the environment with its
    ``hold_action`` (the robot holds still). ``frames`` receives every camera image,
    ``executed`` every action the environment was stepped with; ``stop_at``: a
    ``time.perf_counter()`` time after which the episode ends at the next step (a benchmark's
    wall-clock budget: a robot that stalls steps slowly). Returns the episode's outcome
    with ``records`` (what ``infer`` returned beside each chunk, in order)."""
    obs, _ = env.reset(seed=seed)
    if frames is not None:
        frames.append(obs["image"])
    emulated = delay_steps is not None
    if emulated and control_hz is None:
        raise ValueError("an emulated delay needs the nominal control_hz its ticks stand for")
    real_time = control_hz is not None and not emulated
    period = 1.0 / control_hz if control_hz is not None else 0.0
    lead = asynchronous and (real_time or emulated)
    queue = ChunkQueue(
        infer,
        horizon,
        period,
        lead=lead,
        inline=not real_time,
        merge=merge,
        delay_steps=delay_steps or 0,
        predict=predict,
        model_of=model_of,
    )
    steps, success, t_start = 0, False, time.perf_counter()
    next_tick, last = t_start, None
    queue.request(obs)
    while max_steps is None or steps < max_steps:
        if stop_at is not None and time.perf_counter() >= stop_at:
            break
        action = queue.pop()
        if action is None:  # simulated time, nothing to execute this tick: hold still
            action = env.hold_action(last)
        else:
            last = action
        if executed is not None:
            executed.append(np.asarray(action))
        # As the policy gave it: an environment bounds its own actions (MetaWorldEnv clips to
        # its Box); a robot's units are not [-1, 1].
        obs, _, terminated, truncated, info = env.step(action)
        steps += 1
        if frames is not None:
            frames.append(obs["image"])
        if terminated or truncated:
            success = bool(info.get("success", False))
            break
        if queue.needs_refill():
            queue.request(obs)
        if real_time:  # a stall delays the schedule instead of being made up by a burst
            next_tick = max(next_tick + period, time.perf_counter())
            time.sleep(max(next_tick - time.perf_counter(), 0.0))
    wall = time.perf_counter() - t_start
    queue.join()
    return _outcome(queue, seed, success, steps, wall)


def _outcome(queue: ChunkQueue, seed: int, success: bool, steps: int, wall: float) -> dict:
    """An episode's outcome (``run_loop``'s return) from its finished chunk queue."""
    return {
        "seed": seed,
        "success": success,
        "steps": steps,
        "wall_s": wall,
        "control_hz": steps / wall if wall > 0 else 0.0,
        "stalls": len(queue.stalls),
        "stall_ms_total": sum(queue.stalls) * 1e3,
        "startup_ms": queue.startup_s * 1e3,  # the first chunk's wait, the robot at rest
        "skipped_actions": sum(queue.skipped),  # stale heads of late chunks (asynchronous only)
        "seams": queue.seams,  # the tick each chunk after the first took over at
        "records": queue.records,
    }


def run_episode(
    agent: RobotAgent,
    env,
    seed: int,
    control_hz: float = 20.0,
    asynchronous: bool = True,
    max_steps: int | None = None,
    on_inference=None,
    stop_at: float | None = None,
) -> dict:
    """One episode of the robot agent at a real control rate (``run_loop``, ``stop_at`` its
    wall-clock end);
    ``on_inference(i, inference)`` sees each inference as it completes. The next inference
    starts by the p95 its last plan predicted; under the agent's real-time chunking a chunk
    replaces the queue on arrival (``merge="switch"``), its first d actions frozen to the
    ones executed meanwhile."""
    agent.reset()  # a new episode: a new stream of accelerator state on both sides
    instruction = env.instruction
    done: list = []

    def infer(o: dict, prior):
        image, state = agent.policy.observation(o)
        inf = agent.infer(image, instruction, state=state, seed=len(done), prior=prior)
        done.append(inf)
        if on_inference is not None:
            on_inference(len(done) - 1, inf)
        return inf.actions, inf

    horizon = agent.policy.model.cfg.horizon
    merge = "switch" if agent.cfg.rtc else "append"
    r = run_loop(
        infer,
        env,
        seed,
        horizon,
        control_hz,
        asynchronous,
        max_steps,
        merge=merge,
        predict=p95_of,
        model_of=model_rows,
        stop_at=stop_at,
    )
    r["inferences"] = [inf.row() for inf in r.pop("records")]
    return r


def p95_of(inf) -> float | None:
    """The p95 latency the plan of an ``agent.Inference`` predicted (the queue's lead)."""
    return inf.predicted_p95_s


def model_rows(inf) -> np.ndarray | None:
    """An ``agent.Inference``'s chunk in the policy's model space (what RTC freezes)."""
    return inf.model_actions


def link_timeline(
    infs: list[dict], clock0: float, mbps: float, schedule: list[tuple[float, float]]
) -> dict:
    """When the plans left the edge after the link's first drop and came back after it recovered.

    ``clock0`` is the ``time.monotonic()`` at which the link, starting at ``mbps``, began its
    ``schedule`` ((seconds after clock0, Mbit/s), as the shaping relay reads it); a request is
    placed by its ``started_s``. A drop is the first change to a lower bandwidth than the one
    before it, the restore the first later change back up. The times are ``back_to_edge``'s."""
    changes = sorted(schedule)
    drop = restore = None
    for (_, before), (at, after) in zip([(0.0, mbps), *changes], changes, strict=False):
        if drop is None and after < before:
            drop = at
        elif drop is not None and after > before:
            restore = at
            break
    shown = back_to_edge(
        infs, None if drop is None else clock0 + drop, None if restore is None else clock0 + restore
    )
    return {
        "drop_s": drop,
        "restore_s": restore,
        **shown,
        "handoffs": sum(r.get("handoff") is not None for r in infs),
    }


def outage_timelines(infs: list[dict], clock0: float, outages: list) -> list[dict]:
    """The edge's outages as the robot's link monitor saw them (``LinkMonitor.outages``:
    [down, up] in ``time.monotonic()``, up None: not back before the run ended), each with
    ``back_to_edge``'s times: ``down_s`` / ``up_s`` are seconds after ``clock0``."""
    return [
        {
            "down_s": down - clock0,
            "up_s": None if up is None else up - clock0,
            **back_to_edge(infs, down, up),
        }
        for down, up in outages
    ]


def back_to_edge(infs: list[dict], drop: float | None, restore: float | None) -> dict:
    """When the plans left the edge after ``drop`` and were on it again after ``restore``
    (``time.monotonic()``; None: no such moment), the one reading of a request record for
    `run-robot` (an outage its monitor saw, a shaped link's schedule) and `bench coinfer
    --restore`. ``left_edge_after_drop_ms``: from the drop to the first request begun after it
    that ran nothing on the edge; ``edge_again_after_restore_ms``: from the restore to the
    first edge answer in time sent for after it (``edge_at_s``: a request planned onto the
    edge, or one running here whose rest was handed to the edge when the link came back);
    None where that never happened, and then ``why_not_back`` says why (None otherwise)."""
    times = [(r["started_s"], r) for r in infs]

    def first_after(at: float | None, edge: bool) -> float | None:
        if at is None:
            return None
        for t, r in times:
            on_edge = "@edge" in r["ran"] and r["fallback"] is None
            if t >= at and on_edge == edge:
                return (t - at) * 1e3
        return None

    sent = sorted(r["edge_at_s"] for r in infs if r.get("edge_at_s") is not None)
    again = next((t for t in sent if restore is not None and t >= restore), None)
    return {
        "left_edge_after_drop_ms": first_after(drop, False),
        "edge_again_after_restore_ms": None if again is None else (again - restore) * 1e3,
        "why_not_back": None
        if again is not None or drop is None
        else why_not_back([r for t, r in times if restore is not None and t >= restore], restore),
    }


def why_not_back(after: list[dict], restore: float | None) -> str:
    """Why no request after ``restore`` had an edge answer in time (``after``: their records)."""
    if restore is None:
        return "it was not back before the run ended"
    if not after:
        return "no request began after it"
    n = len(after)
    if all(r.get("planner") == "edge down" for r in after):
        return f"the link still looked down when each of the {n} plans after it was made"
    to_edge = [r for r in after if "@edge" in r.get("plan", "")]
    if not to_edge:
        predicted = [r["predicted_ms"] for r in after if r.get("predicted_ms") is not None]
        said = f" ({np.median(predicted):.0f} ms predicted)" if predicted else ""
        return (
            f"the planner kept the {n} plans after it on the robot{said}: no plan using "
            "the edge was predicted better"
        )
    first = next((r["fallback"] for r in to_edge if r.get("fallback")), "late")
    return f"{len(to_edge)} plans after it used the edge, none answered in time ({first})"
