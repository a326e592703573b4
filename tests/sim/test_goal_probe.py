"""The goal probe: what a policy reads at the start of an episode (image vs its state)."""

import pytest

pytest.importorskip("metaworld")

from vlarun.sim.goal_probe import ProbeConfig, format_probe, main, run_probe  # noqa: E402


def test_the_probe_measures_the_expert_as_the_p_controller_it_is_and_the_policy_beside_it():
    r = run_probe(ProbeConfig("checkpoints/mt10p-oft", ("reach-v3",), seeds=3))
    t = r["tasks"][0]
    resp = t["state_response_per_m"]
    # reach's expert moves the hand with gain 5 towards the goal: 5 cm further is -0.25.
    assert resp["x"]["expert"] == pytest.approx(-5.0, abs=0.05)
    assert resp["z"]["expert"] == pytest.approx(-5.0, abs=0.05)
    assert t["image_use"]["y"]["corr"] is None  # the expert's y is saturated at every layout
    assert t["image_use"]["x"]["expert_spread"] > 0.1
    assert all(isinstance(resp[a]["policy"], float) for a in "xyz")
    assert "state response" in format_probe(r)


def test_bad_probe_requests_fail_before_any_work(capsys):
    with pytest.raises(ValueError, match="seeds must be >= 3"):
        ProbeConfig("checkpoints/mt10p-oft", seeds=2)
    with pytest.raises(ValueError, match="shift must be in"):
        ProbeConfig("checkpoints/mt10p-oft", shift=0.0)
    with pytest.raises(ValueError, match="unknown task 'reach-v9'"):
        ProbeConfig("checkpoints/mt10p-oft", ("reach-v9",))
    with pytest.raises(SystemExit):
        main(["--policy", "checkpoints/tiny-ar", "--tasks", "reach-v3", "--seeds", "3"])
    assert "tiny-ar reads no robot state" in capsys.readouterr().err
