"""Fleet simulation: the world's truth stays hidden from the scheduler; policies compared."""

import json

import numpy as np
import pytest

from vlarun.cli import main
from vlarun.sched.fleet import EdgeTimeline, FleetConfig, make_world, run_fleet, with_devices


def test_edge_timeline_first_fit():
    tl = EdgeTimeline([(1.0, 2.0), (2.5, 3.0)])
    assert tl.place(0.0, 0.5) == 0.0  # fits before the first job
    assert tl.place(0.4, 0.5) == 0.5  # [0, 0.5) is taken; [0.5, 1.0) is just long enough
    assert tl.place(2.0, 1.0) == 3.0  # the 0.5 s gap at 2.5 is too short, and 2.0 is taken


def test_world_stretch_matches_the_busy_period_mean():
    cfg = FleetConfig(duration_s=1)
    space, devices = with_devices(cfg)
    world = make_world(cfg, space, devices, seed=1)
    samples = [world.stretch(0.1, 0.5) for _ in range(2000)]
    assert np.mean(samples) == pytest.approx(0.1 / (1 - 0.5), rel=0.1)
    assert world.stretch(0.1, 0.0) == 0.1


def test_one_world_per_seed_device_only_feels_no_edge_load():
    """The world is drawn once per seed for every load level, with separate random streams, so a
    policy that never uses the edge lives through identical times at light and heavy load,
    while one that uses the edge does not (the other tenants stretch its stages)."""
    from vlarun.sched.fleet import run_policy

    cfg = FleetConfig(model="pi0", duration_s=6, bias_sigma=0.3, robots=2)
    space, devices = with_devices(cfg)
    light = run_policy(cfg, space, devices, "device-only", "light", cfg.seed)
    heavy = run_policy(cfg, space, devices, "device-only", "heavy", cfg.seed)
    assert [r["latency_s"] for r in light] == [r["latency_s"] for r in heavy]
    edge_light = run_policy(cfg, space, devices, "edge-only", "light", cfg.seed)
    edge_heavy = run_policy(cfg, space, devices, "edge-only", "heavy", cfg.seed)
    assert np.mean([r["latency_s"] for r in edge_heavy]) > np.mean(
        [r["latency_s"] for r in edge_light]
    )
    # The truth is hidden: the world's stage times carry a per-(stage, device) bias the
    # scheduler's roofline prior does not know (it learns it from what it observes).
    world = make_world(cfg, space, devices, seed=0)
    biases = list(world.bias.values())
    assert len(set(biases)) == len(biases) and all(b != 1.0 for b in biases)


def test_fleet_runs_every_policy_and_reports_both_phases(tmp_path):
    png = tmp_path / "fleet.png"
    cfg = FleetConfig(model="pi0", duration_s=8, loads="light,heavy", plot=str(png))
    r = run_fleet(cfg)
    assert png.exists() and png.stat().st_size > 0
    assert r["energy_source"] == "modelled" and "synthetic" in r["ground_truth"]
    for load in ("light", "heavy"):
        res = r["results"][load]
        assert set(res) == {"device-only", "edge-only", "fixed-split", "vlarun"}
        for s in res.values():
            assert 0 <= s["slo_satisfaction"] <= 1 and s["actions_per_joule"] > 0
            assert "before_drop" in s and "after_drop" in s
    # pi0 fits the Orin within 1 s: vlarun never does worse than the fixed split on energy.
    assert r["vlarun_vs_fixed_split"]["light"] >= 1.0


def test_fleet_cli_json(capsys):
    argv = ["fleet", "--model", "smolvla", "--duration-s", "4", "--loads", "medium", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert "medium" in r["results"]
    assert main(["fleet", "--loads", "extreme"]) == 2
