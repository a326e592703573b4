"""One list of strategies and one fixed-split rule for the agent, the scheduler's safety net and
the fleet simulator (issue 46: the rule was written three times, the names listed three ways)."""

import pytest

from vlarun.sched.strategy import FIXED, canonical, fixed_roles


def test_the_fixed_rules():
    assert fixed_roles("device-only", 3) == ("robot", "robot", "robot")
    assert fixed_roles("edge-only", 2) == ("edge", "edge")
    assert fixed_roles("fixed-split", 3) == ("robot", "edge", "edge")
    assert canonical("vlarun") == "vlarun-placement"
    with pytest.raises(ValueError, match="scheduled per request"):
        fixed_roles("vlarun-joint", 3)
    with pytest.raises(ValueError, match="strategies: device-only"):
        canonical("edge-first")


def test_agent_scheduler_and_fleet_place_fixed_strategies_alike():
    """The scheduler's fixed candidates are exactly the fixed rules' placements."""
    from vlarun.models.presets import get_preset
    from vlarun.runtime.robot.agent import AgentConfig
    from vlarun.runtime.robot.costview import make_scheduler

    sched = make_scheduler(get_preset("tiny-ar"), AgentConfig(strategy="vlarun"), 12, "float32")
    s_n = len(sched.space.stages)
    fixed = {sched.space.roles(p) for p in sched.p[sched.fixed]}
    assert fixed == {fixed_roles(f, s_n) for f in FIXED}
