"""Fleet simulation: recorded samples are the world's truth, hidden from the scheduler; the
matrix strategies compared; the condition matrix's rows."""

import json

import numpy as np
import pytest

from vlarun.cli import main
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import roofline
from vlarun.sched.energy import RadioPower
from vlarun.world.fleet import (
    Arrival,
    FleetConfig,
    SimEdge,
    execute,
    make_setup,
    make_world,
    run_fleet,
    run_policy,
)
from vlarun.world.truth import SAMPLES_FILE, load_samples

# The fields every matrix row must carry, written out here rather than imported.
MATRIX_FIELDS = {
    "strategy",
    "model",
    "bandwidth_mbps",
    "robots",
    "actions_per_joule",
    "energy_source",
    "slo_met_fraction",
    "latency_p50_ms",
    "latency_p99_ms",
    "fallbacks",
}


def _alone(run):
    """A request that never reaches the edge, run to its end."""
    with pytest.raises(StopIteration) as stop:
        next(run)
    return stop.value.value


def test_the_simulated_edge_serves_by_the_workers_rule():
    """The edge neither leaves a gap for work placed earlier nor fills one behind it: it is
    busy while anything waits, the request due first goes next, a batch is never preempted,
    and a segment that would finish after its deadline is refused on arrival."""
    edge = SimEdge()
    assert edge.admit(Arrival(0.0, 5.0, ("a",), (1.0,)), "long", "long")
    assert edge.admit(Arrival(0.5, 3.0, ("b",), (0.2,)), "late", "late")
    assert edge.admit(Arrival(0.6, 2.0, ("a", "b"), (0.1, 0.1)), "soon", "soon")
    # Due before "soon", it would run next, but only once "long" is done: 1.0-1.1, after 1.05.
    assert edge.finish(Arrival(0.7, 1.05, ("a",), (0.1,))) == pytest.approx(1.1)
    assert not edge.admit(Arrival(0.7, 1.05, ("a",), (0.1,)), "refused", "refused")
    ran = []
    while (t := edge.next_at()) is not None:
        ran += [(p.key, s.stage, round(s.start, 9), round(s.end, 9)) for p, s in edge.run(t)]
    assert ran == [
        ("long", "a", 0.0, 1.0),
        ("soon", "a", 1.0, 1.1),
        ("soon", "b", 1.1, 1.2),
        ("late", "b", 1.2, 1.4),
    ]
    assert edge.run(10.0) == []  # nothing left


def test_one_edge_only_robot_is_served_in_time():
    """One robot, requests a period apart, through the discrete-event run: every request is
    served by the edge in time, and the records come in release order."""
    cfg = FleetConfig(model="smolvla", robots=1, duration_s=4, loads="light")
    recs = run_policy(cfg, make_setup(cfg), "edge-only", "light", 0)
    assert len(recs) == 4 and all(r["fallback"] is None and r["slo_met"] for r in recs)
    assert [r["release"] for r in recs] == sorted(r["release"] for r in recs)


def test_world_stretch_matches_the_busy_period_mean():
    cfg = FleetConfig(duration_s=1)
    world = make_world(cfg, make_setup(cfg), seed=1)
    samples = [world.stretch(0.1, 0.5) for _ in range(2000)]
    assert np.mean(samples) == pytest.approx(0.1 / (1 - 0.5), rel=0.1)
    assert world.stretch(0.1, 0.0) == 0.1


def test_simulated_stage_times_have_the_recorded_mean_and_p90():
    """pi0's stages on the Orin, through the world's request path, are the recorded tiny-pi0
    samples times one factor per stage: resampled (every value is a recorded one, not a
    lognormal draw), with the recorded mean and p90, and with the median total the catalog's
    roofline total (the calibration).

    Tolerances, for n = 20000 draws with seed 0: the mean within 4 standard errors of the
    recorded mean (se = recorded sd / sqrt(n), about 0.1% here); the p90 between the recorded
    0.88 and 0.92 quantiles (the resampled 0.9 quantile moves by about +-0.002 in probability
    at this n, well inside +-0.02); the median total within 2% (a resampled median lands on a
    recorded value next to the middle, and neighbouring recorded values differ by < 1%)."""
    cfg = FleetConfig(model="pi0")
    setup = make_setup(cfg)
    world = make_world(cfg, setup, seed=0)
    works = setup.placement.works[0]
    recorded = {
        e["stage"]: np.array(e["samples"]) * 1e-3
        for e in json.loads(SAMPLES_FILE.read_text())["entries"]
        if e["model"] == "tiny-pi0"
    }
    n = 20000
    runs = [_alone(execute(world, works, ("robot",) * 3, 0.0, RadioPower(), 0.0)) for _ in range(n)]
    medians = 0.0
    for w in works:
        sim = np.array([r.stage_s[w.name] for r in runs])
        unscaled = sim / world.scale(w, "robot")[0]
        rec = recorded[w.name]
        assert np.isin(np.round(unscaled, 9), np.round(rec, 9)).all()  # resampled values only
        assert abs(unscaled.mean() - rec.mean()) < 4 * rec.std() / np.sqrt(n)
        lo, hi = np.quantile(rec, [0.88, 0.92])
        assert lo <= np.quantile(unscaled, 0.9) <= hi
        medians += np.median(sim)
    orin = get_device("orin-agx-32gb")
    assert medians == pytest.approx(sum(roofline(w, orin).seconds for w in works), rel=0.02)
    # The truth is not the scheduler's prior stage by stage: the measured shares differ.
    for w in works:
        truth_median = np.median(recorded[w.name]) * world.scale(w, "robot")[0]
        assert abs(truth_median / roofline(w, orin).seconds - 1) > 0.05


def test_device_only_slo_is_identical_across_edge_loads():
    """One world per seed for every load level, with separate random streams: Device-Only
    (openvla-7b on the Orin, near its 1 s deadline) lives through the same times at light and
    heavy edge load, so its SLO share and latencies are the same; Edge-Only feels the other
    tenants. (Whether the Orin meets the deadline depends on the recorded samples' spread, so
    the test asks for identical times, which a load-dependent draw would break, not for a
    particular share.)"""
    cfg = FleetConfig(model="openvla-7b", duration_s=20, robots=2, loads="light,heavy")
    r = run_fleet(cfg)["results"]
    light, heavy = r["light"]["device-only"], r["heavy"]["device-only"]
    assert light["latency_p99_ms"] > light["latency_mean_ms"] > 500  # real, jittered times
    for key in ("slo_met_fraction", "latency_mean_ms", "latency_p99_ms", "actions_per_joule"):
        assert light[key] == heavy[key], key
    assert r["heavy"]["edge-only"]["latency_mean_ms"] > r["light"]["edge-only"]["latency_mean_ms"]


def test_fleet_runs_every_strategy_and_reports_both_phases(tmp_path):
    png = tmp_path / "fleet.png"
    cfg = FleetConfig(model="pi0", duration_s=8, loads="light,heavy", plot=str(png))
    r = run_fleet(cfg)
    assert png.exists() and png.stat().st_size > 0
    assert r["energy_source"] == "modelled" and r["ground_truth"].startswith("measured")
    assert "tiny-pi0" in r["ground_truth"]
    for load in ("light", "heavy"):
        res = r["results"][load]
        assert set(res) == {
            "device-only",
            "edge-only",
            "fixed-split",
            "vlarun-placement",
            "vlarun-joint",
        }
        for s in res.values():
            assert 0 <= s["slo_met_fraction"] <= 1 and s["actions_per_joule"] > 0
            assert "before_drop" in s and "after_drop" in s
    # pi0 fits the Orin within 1 s: vlarun never does worse than the fixed split on energy.
    assert r["vlarun_vs_fixed_split"]["light"] >= 1.0


@pytest.mark.parametrize("model", ["pi05", "rdt-1b"])
def test_ecovlas_other_models_run_in_the_simulator(model):
    """EcoVLA's five models all run in the fleet simulator: pi0.5 on pi0's recorded samples,
    RDT-1b (no executable model here) on CogACT's, scaled to each one's own stage costs."""
    cfg = FleetConfig(model=model, robots=1, duration_s=4, loads="light")
    recs = run_policy(cfg, make_setup(cfg), "edge-only", "light", 0)
    before = [r for r in recs if r["release"] < cfg.drop_at * cfg.duration_s]  # 200 Mbit/s
    assert len(recs) == 4 and before and all(r["slo_met"] and not r["fallback"] for r in before)
    stand_in = {"pi05": "tiny-pi0", "rdt-1b": "tiny-cogact"}[model]
    assert load_samples(model).model == stand_in


def test_samples_name_their_stand_in_and_refuse_unknown_models():
    assert load_samples("smolvla").model == "tiny-smolvla"
    assert load_samples("tiny-cogact").model == "tiny-cogact"
    with pytest.raises(ValueError, match="recorded"):
        load_samples("tiny-ar")


def test_fleet_matrix_rows(tmp_path, capsys):
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    argv = [
        "fleet",
        "--matrix",
        "--matrix-models",
        "smolvla",
        "--matrix-bandwidths",
        "10",
        "200-50",
        "--matrix-robots",
        "1",
        "8",
        "--matrix-duration-s",
        "6",
        "--out",
        str(out),
        "--plot",
        str(png),
        "--json",
    ]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text())["rows"] == r["rows"] and png.stat().st_size > 0
    rows = r["rows"]
    assert len(rows) == 2 * 2 * 5 and all(set(x) >= MATRIX_FIELDS for x in rows)
    for x in rows:
        assert x["energy_source"] == "modelled" and x["actions_per_joule"] > 0
        assert 0 <= x["slo_met_fraction"] <= 1 and x["latency_p50_ms"] <= x["latency_p99_ms"]
        assert 0 <= x["fallbacks"] <= x["requests"]
    drop = [x for x in rows if x["bandwidth"] == "200-50"]
    assert all(x["bandwidth_mbps"] == 200 and x["bandwidth_after_mbps"] == 50 for x in drop)
    # At 10 Mbit/s the camera upload alone outlasts the 1 s deadline: the edge refuses every
    # Edge-Only request on arrival and the robot runs it (a fallback each).
    slow = [x for x in rows if x["bandwidth"] == "10" and x["strategy"] == "edge-only"]
    assert all(x["fallbacks"] == x["requests"] > 0 for x in slow)
    assert len(r["summary"]["cells"]) == 4 and "tiny-smolvla" in r["truth"]["smolvla"]


def test_fleet_cli_json(capsys):
    argv = ["fleet", "--model", "smolvla", "--duration-s", "4", "--loads", "medium", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert "medium" in r["results"]
    assert main(["fleet", "--loads", "extreme"]) == 2


def test_run_policy_rejects_an_unknown_strategy():
    cfg = FleetConfig(model="smolvla", duration_s=2)
    with pytest.raises(ValueError, match="unknown strategy .edge-first.; strategies: device-only"):
        run_policy(cfg, make_setup(cfg), "edge-first", "light", 0)


def test_scaled_powers_reach_the_devices_the_radio_and_the_energy():
    """The power sweep's variants: a named power is scaled on the device or radio the
    simulator and its schedulers price with; bad terms and an idle above busy are refused."""
    from vlarun.world.fleet import scale_powers

    cfg = FleetConfig(model="smolvla", duration_s=4, loads="light")
    base = make_setup(cfg)
    hot = make_setup(
        FleetConfig(model="smolvla", duration_s=4, loads="light", powers="edge.busy=2,radio.tx=0.5")
    )
    assert hot.devices["edge"].busy_w == 2 * base.devices["edge"].busy_w
    assert hot.devices["robot"] == base.devices["robot"]
    assert hot.radio.tx_w == base.radio.tx_w / 2 and hot.radio.rx_w == base.radio.rx_w
    cheap = run_policy(cfg, base, "edge-only", "light", 0)
    dear = run_policy(cfg, hot, "edge-only", "light", 0)
    assert sum(r["energy_j"] for r in dear) > sum(r["energy_j"] for r in cheap)
    devices, radio = base.devices, base.radio
    refusals = (
        ("edge.turbo=2", "TERM one of"),
        ("robot.busy=-1", "FACTOR > 0"),
        ("radio.tx=x", "FACTOR > 0"),
        ("robot.idle=100", "above its busy"),
    )
    for bad, why in refusals:
        with pytest.raises(ValueError, match=why):
            scale_powers(bad, devices, radio)


def test_power_sweep_ranks_strategies_and_compares_with_the_catalogue(capsys, tmp_path):
    from vlarun.bench.power_sweep import POWER_TERMS, ranking

    by = {
        "a": {"slo_met_fraction": 1.0, "actions_per_joule": 1.0},
        "b": {"slo_met_fraction": 1.0, "actions_per_joule": 2.0},
        "c": {"slo_met_fraction": 0.5, "actions_per_joule": 9.0},
        "d": {"slo_met_fraction": 0.9, "actions_per_joule": 0.1},
    }
    assert ranking(by) == ["b", "a", "d", "c"]  # a deadline missed is never an energy win
    png = tmp_path / "sweep.png"
    argv = [
        "fleet",
        "--power-sweep",
        "--matrix-models",
        "smolvla",
        "--matrix-bandwidths",
        "200",
        "--matrix-robots",
        "1",
        "--matrix-duration-s",
        "3",
        "--plot",
        str(png),
        "--json",
    ]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["plot"] == str(png) and png.stat().st_size > 0
    v = r["variants"]
    assert len(v) == 1 + 2 * len(POWER_TERMS) and v[0]["powers"] == "catalogue"
    assert v[0]["same_ranking_as_catalogue"] == v[0]["cells"] == 1
    assert {x["powers"] for x in v[1:]} >= {"edge.busy=2", "robot.idle=0.5", "radio.rx=2"}
    assert r["energy_source"] == "modelled"


def test_the_simulated_matrix_is_set_against_the_real_one_cell_by_cell():
    from vlarun.bench.fleet_matrix import compare

    def row(strategy, apj, **cell):
        return {
            "strategy": strategy,
            "actions_per_joule": apj,
            "slo_met_fraction": 0.5,
            "inferences": 9,
            "requests": 300,
            **cell,
        }

    real = {
        "rows": [
            row("fixed-split", 1.0, bandwidth="200", load="none"),
            row("vlarun-joint", 1.5, bandwidth="200", load="none"),
            row("fixed-split", 1.0, bandwidth="200", load="heavy"),
            row("vlarun-joint", 9.0, bandwidth="200", load="heavy"),
        ]
    }
    sim = [
        row("fixed-split", 2.0, bandwidth="200", robots=1),
        row("vlarun-joint", 2.4, bandwidth="200", robots=1),
        row("fixed-split", 1.0, bandwidth="200", robots=8),
        row("vlarun-joint", 5.0, bandwidth="200", robots=8),
    ]
    c = compare(sim, real)
    joint = next(x for x in c["cells"] if x["strategy"] == "vlarun-joint")
    # the real matrix's first load (none) against the simulator's fewest robots (1)
    assert c["real_load"] == "none" and c["sim_robots"] == 1
    assert joint["real_over_split"] == 1.5 and joint["sim_over_split"] == 1.2
    assert joint["difference"] == pytest.approx(-0.3)
    assert (joint["real_requests"], joint["sim_requests"]) == (9, 300)
    assert joint["real_on_time"] == joint["sim_on_time"] == 0.5
    assert (joint["real_actions_per_joule"], joint["sim_actions_per_joule"]) == (1.5, 2.4)
    # An emulated run's joules are on its clock, 1 / time_scale slower than the devices'.
    emulated = compare(sim, real | {"emulated": {"time_scale": 0.5}})
    assert (
        next(x for x in emulated["cells"] if x["strategy"] == "vlarun-joint")[
            "real_actions_per_joule"
        ]
        == 3.0
    )
    with pytest.raises(ValueError, match="--compare-with"):
        compare(sim, {"rows": []})


def test_a_fleet_run_is_reproducible_its_scheduler_ages_by_simulated_time():
    """Two runs of one config give the same records: the scheduler's calibration and the
    links forget by the simulated clock (they forgot by the wall clock before, and two runs of
    one 32-robot cell differed by ~0.4% in actions/J)."""
    cfg = FleetConfig(model="openvla-7b", robots=8, duration_s=20, loads="medium", bw_after=10.0)
    setup = make_setup(cfg)
    for policy in ("vlarun-placement", "vlarun-joint"):
        a = run_policy(cfg, setup, policy, "medium", 0)
        b = run_policy(cfg, setup, policy, "medium", 0)
        assert a == b, policy


def test_a_world_file_is_the_fleets_truth_and_its_meter():
    """--world: stage times are the world's curves (its jitter around them), energy is
    priced with the world's powers, and the scheduler still plans with the catalog's. In the
    adversarial world the 4090 draws 38.7 W busy (the catalog: 281 W), so an Edge-Only request
    costs far less than the catalog-priced samples truth says; the Orin's vision stage takes the
    world's time, not the roofline's."""
    from vlarun.world import load_world

    cfg = FleetConfig(
        model="openvla-7b",
        robots=1,
        duration_s=20,
        loads="none",
        world="adversarial",
        bw_after=200.0,
    )
    setup = make_setup(cfg)
    assert setup.devices["edge"].busy_w > 200  # the scheduler's catalog
    assert setup.truth.meter["edge"].busy_w == pytest.approx(38.67)
    assert "adversarial" in setup.truth.label
    world = load_world("adversarial", "openvla-7b")
    w = make_world(cfg, setup, 0)
    works = setup.placement.works[0]
    vision = next(x for x in works if x.name == "vision")
    times = [w.seconds(vision, "robot", d[0], {}) for d in (w.draw(works) for _ in range(400))]
    want = world.device("orin-agx-32gb").stage_s("vision")
    assert np.median(times) == pytest.approx(want, rel=0.02)
    edge = run_policy(cfg, setup, "edge-only", "none", 0)
    plain = FleetConfig(model="openvla-7b", robots=1, duration_s=20, loads="none", bw_after=200.0)
    catalog_priced = run_policy(plain, make_setup(plain), "edge-only", "none", 0)
    mean = lambda rs: sum(r["energy_j"] for r in rs) / len(rs)  # noqa: E731
    assert mean(edge) < 0.5 * mean(catalog_priced)


def test_the_hindsight_study_bounds_joint_by_static_plans_and_the_oracle():
    """One deadline, one seed, under the published world: every static plan runs the same
    requests; the oracle is on time at least as often as any static plan and as efficient as
    the best on-time one; the ratios carry paired intervals around them."""
    from vlarun.bench.fleet_study import run_fleet_study

    cfg = FleetConfig(
        model="openvla-7b",
        world="published",
        robots=1,
        loads="none",
        chunk=1,
        slo_hz=1.0,
        bw_before=200.0,
        bw_after=20.0,
        duration_s=60,
        guard=1.0,
        deadlines=(0.8,),
        seeds=1,
    )
    r = run_fleet_study(cfg)
    assert "published" in r["world"] and r["device_only_ms"] > 1000  # TRIAGE's Orin time
    cell = r["cells"][0]["seeds"][0]
    rows = {x["strategy"]: x for x in cell["rows"]}
    statics = [rows[label] for label in r["static_plans"]]
    assert len(statics) >= 4 and all(x["requests"] == rows["oracle"]["requests"] for x in statics)
    assert rows["oracle"]["slo_met_fraction"] >= max(x["slo_met_fraction"] for x in statics)
    for key in ("joint_over_best_static", "joint_share_of_oracle", "joint_over_best_fixed"):
        lo, hi = cell[key]["ci95"]
        assert lo <= cell[key]["ratio"] <= hi, key
    assert cell["best_static"] in r["static_plans"]


def test_the_robot_gives_up_on_a_late_edge_answer_as_the_runtime_does():
    """An edge segment is waited for until the deadline less the local time of the robot
    stages after it: the edge is given that (less the answer's way back) as its deadline, and
    an answer that would come later is given up on; the robot runs the segment itself from
    then, so the request ends by the deadline plus one local run of the segment."""
    cfg = FleetConfig(model="pi0", slo_hz=5.0, link_jitter_sigma=0.0)  # a 4 s deadline
    setup = make_setup(cfg)
    works = setup.placement.works[0]
    roles = ("robot", "edge", "robot")  # one edge segment with a robot stage after it

    def first_arrival(seed):
        run = execute(make_world(cfg, setup, seed), works, roles, 0.0, RadioPower(), 0.0)
        return run, next(run)

    run, a = first_arrival(0)
    assert a.at < a.deadline < cfg.slo_s  # the edge's deadline is tighter than the request's
    name = works[1].name
    with pytest.raises(StopIteration) as stop:
        run.send({name: a.deadline - 1e-6})  # in time: the answer is used
    on_time = stop.value.value
    assert on_time.fallback is None and on_time.latency_s <= cfg.slo_s

    run, a = first_arrival(0)  # the same world: the same draws
    with pytest.raises(StopIteration) as stop:
        run.send({name: a.deadline + 5.0})  # far too late: the robot gave up on it
    late = stop.value.value
    assert late.fallback == "edge: no answer in time"
    world = make_world(cfg, setup, 0)
    local = world.seconds(works[1], "robot", world.draw(works)[1], None)  # the same first draw
    assert cfg.slo_s < late.latency_s <= cfg.slo_s + local + 1e-9
    assert late.energy_j > on_time.energy_j  # the robot ran the segment and still listened


def test_a_link_too_slow_for_the_deadline_is_not_used():
    """The runtime's executor does not send a segment whose way there and back leaves the
    edge no time before the robot would give up: it runs it here at once (nothing is sent,
    nothing refused)."""
    cfg = FleetConfig(model="pi0", bw_before=0.05, bw_after=0.05, link_jitter_sigma=0.0)
    setup = make_setup(cfg)
    works = setup.placement.works[0]
    out = _alone(execute(make_world(cfg, setup, 0), works, ("edge",) * 3, 0.0, RadioPower(), 0.0))
    assert out.fallback == "edge: the link leaves the edge no time"
    assert out.transfers == [] and out.placement == ("robot",) * 3
    world = make_world(cfg, setup, 0)
    draws = world.draw(works)
    local = sum(world.seconds(w, "robot", d, None) for w, d in zip(works, draws, strict=True))
    assert out.latency_s == pytest.approx(local)


def test_each_simulated_robot_plans_with_its_own_scheduler(monkeypatch):
    """As on real robots (each RobotAgent owns its planner), every simulated robot decides
    with a scheduler of its own over its own link, and learns only from its own requests: a
    shared one learned N times as fast and herded the robots (8 robots, 1.0x deadline)."""
    import vlarun.world.fleet as fleet

    seen: dict[int, set[int]] = {}
    learnt: dict[int, int] = {}

    class Recording(fleet.Scheduler):
        def decide(self, link, *a, **kw):
            seen.setdefault(id(self), set()).add(id(link))
            return super().decide(link, *a, **kw)

        def observe(self, *a, **kw):
            learnt[id(self)] = learnt.get(id(self), 0) + 1
            return super().observe(*a, **kw)

    monkeypatch.setattr(fleet, "Scheduler", Recording)
    cfg = FleetConfig(model="openvla-7b", robots=3, duration_s=6, loads="medium")
    run_policy(cfg, make_setup(cfg), "vlarun-placement", "medium", 0)
    assert len(seen) == 3 and all(len(links) == 1 for links in seen.values())
    assert len({link for links in seen.values() for link in links}) == 3
    assert set(learnt) == set(seen) and all(n >= 1 for n in learnt.values())


def test_the_fleets_scheduler_learns_the_worlds_powers_from_its_meter():
    """In the adversarial world the 4090 draws 38.7 W busy where the scheduler's catalog says
    281 W: each executed request is metered with the world's powers and priced with the
    catalog's on the same times, so the robot's scheduler learns the edge's power error from
    the requests that used the edge and its predictions come to match the meter."""
    cfg = FleetConfig(
        model="openvla-7b",
        robots=1,
        duration_s=30,
        loads="none",
        world="adversarial",
        bw_after=200.0,
    )
    setup = make_setup(cfg)
    recs = [
        r for r in run_policy(cfg, setup, "vlarun-placement", "none", 0) if r["predicted_energy_j"]
    ]
    assert any("E" in r["placement"] for r in recs)
    err = [abs(r["predicted_energy_j"] / r["energy_j"] - 1) for r in recs]
    assert err[0] > 0.3  # the first plan is priced with the catalog's 4090
    assert float(np.median(err[len(err) // 2 :])) < 0.1
