"""Issue 61: the on-time target as a miss budget, each placement's recorded tail, plans never
dominated, and a catalog wrong in either direction corrected within 30 requests. The worlds
here are drawn for the tests (``world.derive``), not the ones the study reports."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.sched.test_scheduler import DEVICES, space_for
from vlarun.bench.fleet_study import best_mix, device_only_s, judge, static_plans
from vlarun.sched.contract import Outcome
from vlarun.sched.link import Link
from vlarun.sched.scheduler import MissBudget, Scheduler
from vlarun.world.derive import WorldParams, derive
from vlarun.world.fleet import FleetConfig, make_setup, run_policy


def _world(tmp_path, name: str, **params) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(derive(WorldParams(**params), name, "a test's world")))
    return str(path)


def _cfg(world: str, deadline_x: float, duration_s: float = 400.0) -> tuple[FleetConfig, object]:
    cfg = FleetConfig(
        world=world,
        model="openvla-7b",
        robots=1,
        loads=("none",),
        chunk=1,
        slo_hz=1.0,
        duration_s=duration_s,
        guard=1.0,
        bw_after=200.0,
    )
    setup = make_setup(cfg)
    t_do = device_only_s(cfg, setup)
    return dataclasses.replace(cfg, slo_hz=1.0 / (deadline_x * t_do)), setup


def test_the_miss_budget_mixes_a_cheap_risky_plan_with_a_punctual_one_at_the_target():
    """Expected misses only (a model that knows its tails): a plan late 2.2% of the time and
    one never late settle at the share that spends exactly the 1% budget."""
    budget, chosen = MissBudget(0.01), []
    for _ in range(10_000):
        risky = budget.allowance() >= 0.022
        budget.spend(0.022 if risky else 0.0)
        chosen.append(risky)
    assert np.mean(chosen) == pytest.approx(0.01 / 0.022, abs=0.01)


def test_a_stall_mixture_is_planned_at_its_target(tmp_path):
    """The robot alone is late only when it stalls (3% of executions, 2.5x); the edge is
    punctual and hungry. Joint mixes the two and holds the 99% target (within its interval)
    at no less than 0.9x the best static plan or two-plan mix that reaches it in hindsight."""
    world = _world(
        tmp_path,
        "stalls",
        robot_scale=0.85,
        edge_scale=1.3,
        edge_busy_w=150.0,
        stall_p=0.03,
        stall_factor=2.5,
        jitter=0.04,
    )
    cfg, setup = _cfg(world, 1.2)
    runs = {"vlarun-joint": run_policy(cfg, setup, "vlarun-joint", "none", 0)}
    statics = static_plans(setup)
    for label, roles, k in statics:
        runs[label] = run_policy(cfg, setup, label, "none", 0, static=(roles, k))
    labels = [s[0] for s in statics]
    shares = {lb: np.mean([r["slo_met"] for r in runs[lb]]) for lb in labels}
    robot = next(lb for lb in labels if lb.startswith("static R/R/R@full"))
    assert shares[robot] < 0.99 < max(shares.values())  # no cheap plan meets it alone
    j = judge(0.99, runs["vlarun-joint"], runs, labels, np.random.default_rng(0))
    assert j["met"], j
    assert j["ratio"]["ratio"] >= 0.9, j
    placements = {r["placement"] for r in runs["vlarun-joint"]}
    assert "R/R/R" in placements and len(placements) > 1  # a mix, not one plan
    assert best_mix(runs, labels, 0.99)["plans"]  # the comparison exists


def test_a_dominated_plan_is_never_chosen():
    """Random tails and energies: no decision picks a plan that another feasible plan beats
    on both on-time probability and actions per joule; exploration never tries one that any
    plan beats on both. Planted: the safety net's anchor beaten on both does not hold."""
    rng = np.random.default_rng(0)
    link = Link(200.0, 5.0)
    for trial in range(6):
        sched = Scheduler(space_for("pi0"), DEVICES, slo_s=0.9, actions=20, explore_every=2)
        sched.net.error = 10.0  # the safety net would hold to the fixed strategy on any gain
        for pi in range(len(sched.space.placements)):
            roles = tuple(sched.space.roles(pi))
            for r in rng.lognormal(0.0, 0.3, size=int(rng.integers(0, 30))):
                sched.cal.observe_tail(roles, 0.5, 0.5 * r)
        for _ in range(25):
            d = sched.decide(link)
            sc = sched.score(link)
            p = sched.on_time_probabilities(sc)
            apj = sched.actions / sc.energy
            c = sched.candidate_index(d)
            feasible = sched.allowed & (1 - p <= d.miss_allowance + 1e-12)
            beaten = feasible & (p > p[c] + 1e-12) & (apj > apj[c] * (1 + 1e-12))
            assert not beaten.any(), (trial, d.placement, d.settings)
            if d.explored:
                assert not Scheduler.dominated(sched.allowed, apj, p)[c]
            sched.observe(d, Outcome(stages=(), latency_s=d.latency_s))


@pytest.mark.parametrize("scale", [0.7, 1.5])
def test_a_wrong_catalog_is_corrected_within_30_requests(tmp_path, scale):
    """The robot runs at 0.7x the catalog's times (the catalog prices it 1.4x too slow: at a
    deadline of Device-Only's real median x1.2 the model calls the robot late) or at 1.5x
    (the catalog is optimistic): within 30 requests joint runs the robot, and its actions per
    joule from then on are within 5% of its last hundred requests'."""
    world = _world(tmp_path, f"robot-{scale}", robot_scale=scale, edge_busy_w=200.0, jitter=0.03)
    cfg, setup = _cfg(world, 1.2, duration_s=300.0)
    recs = run_policy(cfg, setup, "vlarun-joint", "none", 0)

    def apj(rs) -> float:
        return len(rs) / sum(r["energy_j"] for r in rs)

    assert np.mean([r["placement"] == "R/R/R" for r in recs[30:]]) > 0.9
    assert apj(recs[30:]) >= 0.95 * apj(recs[-100:])
    assert np.mean([r["slo_met"] for r in recs]) >= 0.99


def test_a_target_out_of_reach_holds_to_the_most_punctual_steady_plan_cheaply(tmp_path):
    """The robot stalls 4% of the time (3x) and the edge (280 W) is punctual only while the
    Wi-Fi is good: no plan held steady, and so no random mix, reaches 99%. Chasing the target
    with the edge whenever the link allows bought less than a point at ~0.3x the actions/J;
    joint instead stays within half a point of the most punctual steady plan at >= 0.9x the
    cheapest plan or mix that is, from its 60th request on (before that, the first stall
    leaves it in debt while it still counts the edge as punctual, and it pays on the edge),
    and its decisions say the target is out of reach."""
    world = _world(
        tmp_path,
        "far",
        robot_scale=0.8,
        edge_scale=1.4,
        edge_busy_w=280.0,
        stall_p=0.04,
        stall_factor=3.0,
        jitter=0.04,
    )
    cfg, setup = _cfg(world, 1.2, duration_s=300.0)
    cfg = dataclasses.replace(cfg, trace="wifi-drive")
    runs = {"vlarun-joint": run_policy(cfg, setup, "vlarun-joint", "none", 0)}
    statics = static_plans(setup)
    for label, roles, k in statics:
        runs[label] = run_policy(cfg, setup, label, "none", 0, static=(roles, k))
    labels = [s[0] for s in statics]
    later = {name: rs[60:] for name, rs in runs.items()}  # the same requests: sorted by release
    j = judge(0.99, later["vlarun-joint"], later, labels, np.random.default_rng(0))
    assert not j["target_reachable"], j  # the world is what the test says it is
    assert j["met"] and j["ratio"]["ratio"] >= 0.9, j
    reach = [r["on_time_reach"] for r in later["vlarun-joint"]]
    assert max(reach) < 0.99 and min(reach) > 0.85, (min(reach), max(reach))
