"""The executor's rules (sched/execution.py): one split into segments and one give-up time,
called by the robot's executor, the fleet simulator's robot and a plan's bookings alike."""

from __future__ import annotations

import inspect

from hypothesis import given
from hypothesis import strategies as st

from vlarun.sched.execution import GIVE_UP_MARGIN_S, give_up_at, segments


@given(st.lists(st.sampled_from(["robot", "edge"]), max_size=12))
def test_segments_are_the_maximal_runs_of_one_role(roles):
    runs = segments(roles)
    assert [k for run in runs for k in run] == list(range(len(roles)))  # every stage, in order
    for run in runs:
        assert len(run) > 0 and len({roles[k] for k in run}) == 1
    for a, b in zip(runs, runs[1:], strict=False):
        assert roles[a.start] != roles[b.start]  # maximal: neighbours differ


def test_segments_of_a_split_plan():
    roles = ["robot", "edge", "edge", "robot", "edge"]
    assert segments(roles) == [range(0, 1), range(1, 3), range(3, 4), range(4, 5)]


def test_the_answer_read_time_counts_only_above_the_margin():
    # A fast reader keeps the margin in hand; a slow one (its recent peak) keeps its peak.
    assert give_up_at(1.0, 0.2, 0.003, 0.001) == give_up_at(1.0, 0.2, 0.003)
    assert give_up_at(1.0, 0.2, 0.003, 0.05) < give_up_at(1.0, 0.2, 0.003)
    # Later robot stages move the give-up earlier, one for one.
    assert give_up_at(1.0, 0.5) < give_up_at(1.0, 0.2) < 1.0


def test_the_runtime_the_simulator_and_the_bookings_call_the_one_rule():
    """Issue 63: the fleet simulator kept its own give-up rule (without the answer read time)
    and its own segment walk beside the executor's; all of them call these now."""
    from vlarun.runtime import segments as runtime_segments
    from vlarun.runtime.robot.agent import AgentConfig
    from vlarun.runtime.robot.executor import Executor
    from vlarun.sched.queue_model import plan_bookings
    from vlarun.world import fleet

    assert AgentConfig().margin_s == GIVE_UP_MARGIN_S
    assert "give_up_at(" in inspect.getsource(Executor._remote)
    assert "give_up_at(" in inspect.getsource(fleet.execute)
    assert "segments(roles)" in inspect.getsource(fleet.execute)
    assert "execution.segments(" in inspect.getsource(runtime_segments.segments)
    assert "segments(roles)" in inspect.getsource(plan_bookings)
    assert not hasattr(fleet, "GIVE_UP_MARGIN_S") and not hasattr(fleet, "_segment")
