"""The executor's rules, as pure functions: how a placement splits into segments, and when the
robot gives up waiting for an edge segment.

The robot's executor (``runtime/robot/executor.py``, through ``runtime.segments.segments``), the
fleet simulator's robot (``world/fleet.py`` ``execute``) and the bookings a plan announces
(``queue_model.plan_bookings``) all call these, so the simulated robot cannot drift from the
real one. (It did once: the simulator's robot ran a silent edge's request to its end, 4.8 s,
where the runtime's gave up at the deadline less the stages after it; BENCHMARKS.md.) They live
here, below ``world`` and ``runtime`` both, as the layers require (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Sequence

# What the robot keeps in hand when it gives up on the edge, at least: the time to notice the
# timeout and start the first local stage (``AgentConfig.margin_s``; the simulator's robot).
GIVE_UP_MARGIN_S = 0.003


def segments(roles: Sequence[str]) -> list[range]:
    """The maximal runs of consecutive stages on one role, as stage-index ranges in the plan's
    (topological) order: each robot run runs here, each edge run is one request. An empty
    plan has none."""
    out: list[range] = []
    start = 0
    for k in range(1, len(roles) + 1):
        if k == len(roles) or roles[k] != roles[start]:
            out.append(range(start, k))
            start = k
    return out


def give_up_at(
    deadline: float, later_s: float, margin_s: float = GIVE_UP_MARGIN_S, answer_s: float = 0.0
) -> float:
    """When the robot stops waiting for an edge segment's answer and runs the segment itself.

    ``later_s``: the local time of the robot stages after the segment; ``answer_s``: the time
    to read and check an answer once it is on the socket (the learner's recent slow peak),
    kept in hand, at least ``margin_s``. An answer in by then leaves the rest time to end by
    the deadline; a silent edge costs at most the deadline plus one local run of the segment.
    The edge is sent this less the answer's way back as its own deadline, so it refuses work
    it could only finish too late."""
    return deadline - later_s - max(margin_s, answer_s)
