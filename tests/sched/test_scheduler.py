"""Plan space filters, the scheduler's core rule and fallback, reservations and batching."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from vlarun.cli import main
from vlarun.models.presets import get_preset
from vlarun.sched.bookings import Booking, Slot
from vlarun.sched.calibration import INPUT, OUTPUT, Calibration
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.link import Link
from vlarun.sched.plans import NO_LOSS, build_space, feasibility, setting_grid
from vlarun.sched.predictor import DeviceState, predict_placement
from vlarun.sched.queue_model import (
    EdgeQueue,
    Ledger,
    plan_bookings,
    play,
    reservations,
)
from vlarun.sched.scheduler import Scheduler
from vlarun.sched.settings_table import SettingRow
from vlarun.stages.families import Workload

W = Workload()
ORIN, RTX = get_device("orin-agx-32gb"), get_device("rtx4090")
DEVICES = {"robot": ORIN, "edge": RTX}


def space_for(name, devices=DEVICES, **kw):
    cfg = get_preset(name)
    return build_space(cfg, stage_works(cfg, W), devices, W, **kw)


def test_memory_filter_depends_on_layers_kept():
    cfg = get_preset("openvla-7b")
    works = stage_works(cfg, W)
    nx = {"robot": get_device("orin-nx-16gb"), "edge": RTX}
    roles = ("robot", "robot", "robot")
    assert "memory" in feasibility(works, roles, nx, "bfloat16")  # 15 GB of bf16 weights
    assert feasibility(works, ("robot", "edge", "edge"), nx, "bfloat16") is None
    space = space_for("openvla-7b", nx)
    all_robot = 0  # placement index 0 = every stage on the robot
    kept = np.array([s.value("layers_kept") for s in space.settings])
    int8 = np.array([s.value("weights") == "int8" for s in space.settings])
    ok = space.executable[:, all_robot]
    # bf16 weights fit only pruned; weight-only int8 ones (~7.5 GB) fit unpruned.
    assert not ok[(kept == 1.0) & ~int8].any() and ok[(kept == 0.6875) & ~int8].any()
    assert ok[(kept == 1.0) & int8].any()


def test_dtype_filter():
    no_bf16 = dataclasses.replace(ORIN, dtypes=("float32",))
    works = stage_works(get_preset("tiny-openvla"), W)
    reason = feasibility(
        works, ("robot", "edge", "edge"), {"robot": no_bf16, "edge": RTX}, "bfloat16"
    )
    assert "does not support" in reason
    assert feasibility(works, ("edge",) * 3, {"robot": no_bf16, "edge": RTX}, "bfloat16") is None


def test_accuracy_floor_excludes_unmeasured_settings():
    free = space_for("cogact")
    assert free.eligible.all()
    assert any("no measured accuracy cost" in n for n in free.notes)
    floor = space_for("cogact", accuracy_floor=0.9)
    measured = [s for s, e in zip(floor.settings, floor.eligible, strict=True) if e]
    assert measured and all(s.measured and s.relative_success >= 0.9 for s in measured)
    rows = (
        SettingRow("cache_interval", 1, 1.0, "identity"),
        SettingRow("cache_interval", 2, 0.95, "test"),
        SettingRow("cache_interval", 5, 0.80, "test"),
    )
    grid, _ = setting_grid("diffusion", rows)
    assert [g.relative_success for g in grid] == [1.0, 0.95, 0.80]
    space = space_for("cogact", accuracy_floor=0.9, settings_rows=rows)
    assert space.eligible.tolist() == [True, True, False]


@pytest.mark.parametrize("calibrated", [False, True])
def test_vectorised_scores_match_the_scalar_predictor(calibrated):
    space = space_for("pi0")
    link = Link(100.0, 10.0)
    sched = Scheduler(space, DEVICES, slo_s=1.0)
    if calibrated:  # measured times unlike the roofline on both sides: energy must follow them
        for name in space.stages:
            sched.cal.observe_stage(name, "robot", 1.0, 1.7)
            sched.cal.observe_stage(name, "edge", 1.0, 3.0)
        # Boundary terms on every cut, the sensor input and the answer (learned overheads).
        names = list(space.stages)
        cuts = [(INPUT, names[0]), *zip(names, names[1:], strict=False), (names[-1], OUTPUT)]
        for a, b in cuts:
            sched.cal.observe_boundary(a, b, 0.0, 0.004 + 0.001 * len(a))
    state = DeviceState(available_at=0.05, queued_s={"prefill": 0.01})
    sc = sched.score(link, now=0.0, edge_state=state)
    for c in range(0, len(sched.k), 7):
        k, p = sched.k[c], sched.p[c]
        roles = space.roles(p)
        ref = predict_placement(
            space.works[k],
            dict(zip(space.stages, roles, strict=True)),
            DEVICES,
            link,
            state={"edge": state},
            period_s=1.0,
            cal=sched.cal,
        )
        assert sc.latency[c] == pytest.approx(ref.latency_s, rel=1e-9)
        assert sc.energy[c] == pytest.approx(ref.energy_j, rel=1e-9)


def test_core_rule_max_actions_per_joule_among_feasible():
    space = space_for("cogact")
    sched = Scheduler(space, DEVICES, slo_s=0.3, actions=20)
    link = Link(200.0, 5.0)
    d = sched.decide(link)
    # The optimum by brute force over the scalar predictor, not from the scores the rule used:
    # nothing was measured, so a plan's chance is the cost model's prior (a normal of 15%
    # spread) at its own time and, its setting never timed, at its placement's full compute.
    from statistics import NormalDist

    def chance(latency: float) -> float:
        return NormalDist(latency, sched.cal.prior_rel * latency).cdf(0.3)

    def ref(k: int, p: int):
        placement = dict(zip(space.stages, space.roles(p), strict=True))
        return predict_placement(space.works[k], placement, DEVICES, link, period_s=0.3, actions=20)

    best = 0.0
    for c in np.flatnonzero(sched.allowed):
        k, p = int(sched.k[c]), int(sched.p[c])
        own, full = ref(k, p), ref(sched.k0, p)
        if min(chance(own.latency_s), chance(full.latency_s)) >= 1 - sched.budget.rate:
            best = max(best, own.actions_per_joule)
    assert d.feasible and d.latency_s <= 0.3
    assert d.actions_per_joule == pytest.approx(best, rel=1e-9)
    assert all(a["feasible"] for a in d.alternatives[:-1])


def test_fallback_is_the_fastest_plan_when_nothing_meets_the_slo():
    sched = Scheduler(space_for("openvla-7b"), DEVICES, slo_s=0.001)
    link = Link(200.0, 5.0)
    d = sched.decide(link)
    sc = sched.score(link)
    assert not d.feasible
    assert d.latency_s == pytest.approx(sc.latency[sched.allowed].min())


def test_low_bandwidth_moves_work_to_the_robot():
    sched = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=0.3, actions=20)
    fast = sched.decide(Link(1000.0, 1.0))
    slow = sched.decide(Link(1.0, 1.0))
    assert "edge" in fast.placement.values()
    assert set(slow.placement.values()) == {"robot"}


def _edge_heavy_scheduler():
    # A 4090 robot-side would win on speed; force offloading with a slow robot and tight SLO.
    slow_robot = dataclasses.replace(get_device("orin-nx-16gb"), mem_gb=64)
    devs = {"robot": slow_robot, "edge": RTX}
    space = space_for("cogact", devs, accelerators=False)
    return Scheduler(space, devs, slo_s=0.25, actions=16), devs


def _booked_load(plans, slo_s: float, now: float = 0.0) -> DeviceState:
    """The edge's forecast with ``plans`` booked (one robot each), each stage at the plan's
    own predicted edge time: the load the next plan sees (``queue_model``)."""
    ledger = Ledger()
    for i, d in enumerate(plans):
        for b in plan_bookings(d, slo_s, now):
            assert ledger.book(dataclasses.replace(b, origin=f"robot{i}"), now)
    times = {n: d.stage_end[n] - d.stage_start[n] for d in plans for n in d.placement}
    queue = EdgeQueue(8, now)
    for p in ledger.pending(now, lambda stages: tuple(times[n] for n in stages)):
        queue.add(p)
    return DeviceState(reservations=reservations(play(queue), now))


def test_plan_bookings_are_the_plans_edge_segments():
    """Each maximal run of edge stages is one booking: it arrives when the stage before it
    ends (the request's start for the first stage) and is due when the rest of the plan
    needs it, never after the deadline."""
    sched, _ = _edge_heavy_scheduler()
    for d in (sched.decide(Link(1000.0, 1.0)), sched.decide(Link(1000.0, 1.0), 2.0)):
        now = 0.0 if d.stage_start[next(iter(d.placement))] < 1.0 else 2.0
        books = plan_bookings(d, sched.slo_s, now)
        names = list(d.placement)
        edge = [n for n in names if d.placement[n] == "edge"]
        assert edge and [n for b in books for n in b.stages] == edge
        for b in books:
            i = names.index(b.stages[0])
            assert b.arrive == (now if i == 0 else d.stage_end[names[i - 1]])
            assert d.stage_end[b.stages[-1]] <= b.deadline + 1e-9 <= now + sched.slo_s + 1e-9
            assert all(d.placement[n] == "edge" for n in b.stages)


def test_a_booked_plan_is_the_load_the_next_plan_sees():
    sched, _ = _edge_heavy_scheduler()
    link = Link(1000.0, 1.0)
    first = sched.decide(link, 0.0, DeviceState())
    assert "edge" in first.placement.values()
    state = _booked_load([first], sched.slo_s)
    assert state.reservations
    second = sched.decide(link, 0.0, state)
    # The first plan itself, scored again: the booked work delays it by at least the edge
    # time it holds (no `if`: the same candidate is compared with and without the load).
    c = sched.candidate_index(first)
    alone = sched.score(link, 0.0, DeviceState()).latency[c]
    loaded = sched.score(link, 0.0, state).latency[c]
    held = min(r.end - r.start for r in state.reservations)
    assert loaded >= alone + held - 1e-9
    on_edge = [s for s, r in second.placement.items() if r == "edge"]
    for s in on_edge:
        for r in state.reservations:
            overlap = second.stage_start[s] < r.end and second.stage_end[s] > r.start
            assert not overlap or r.stage == s


def test_the_ledger_holds_a_booking_until_its_request_arrives_or_its_deadline():
    ledger = Ledger(limit=2)
    b = Booking(("vision", "prefill"), 0.1, 0.9, "r1")
    assert ledger.book(b, 0.0) and ledger.book(dataclasses.replace(b, origin="r2"), 0.0)
    assert not ledger.book(dataclasses.replace(b, origin="r3"), 0.0)  # full: nothing held
    assert [p.ready for p in ledger.pending(0.5, lambda st: (0.1,) * len(st))] == [0.5, 0.5]
    assert not ledger.claim("r1", ("prefill",), 0.2)  # not a booked first stage
    assert ledger.claim("r1", ("vision", "prefill"), 0.2) and len(ledger) == 1
    ledger.expire(0.95)  # r2's deadline passed
    assert len(ledger) == 0


def test_plan_cli_json(capsys):
    argv = ["plan", "--model", "openvla-7b", "--robot-device", "orin-agx-32gb"]
    argv += ["--edge-device", "rtx4090", "--link-mbps", "200", "--link-rtt-ms", "5"]
    argv += ["--slo-hz", "20", "--chunk", "20", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("placement", "settings", "latency_ms", "energy_j", "actions_per_joule"):
        assert key in r
    assert r["feasible"] and r["latency_ms"] <= 1000 and r["energy_source"] == "modelled"
    assert set(r["placement"]) == {"vision", "prefill", "decode"}
    assert r["alternatives"]
    assert main([*argv, "--accuracy-floor", "0.95"]) == 0
    floor = json.loads(capsys.readouterr().out)
    assert floor["accuracy_cost_measured"] and floor["relative_success"] == 1.0
    assert main([*argv[:-1], "--slo-hz", "1000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fallback"]


def test_bench_sched_json(capsys):
    assert main(["bench", "sched", "--decisions", "50", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["candidates"] >= 1000 and 0 < r["p50_ms"] <= r["p99_ms"]


def test_measured_costs_belong_to_their_models(tmp_path):
    from vlarun.sched.settings_table import SETTINGS_FILE, load_settings

    published = SETTINGS_FILE.with_name("settings_published.json")
    rows = load_settings(published)
    openvla = space_for("openvla-7b", accuracy_floor=0.95, settings_rows=rows)
    budgets = {
        dict(s.knobs)["token_budget"]
        for s, e in zip(openvla.settings, openvla.eligible, strict=True)
        if e
    }
    assert budgets == {1.0, 0.34375}  # TRIAGE's OpenVLA figure, not OFT's or CogACT's
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "settings": [
                    {"knob": "token_budget", "value": 0.5, "relative_success": 0.9, "source": "x"}
                ]
            }
        )
    )
    with pytest.raises(ValueError, match="must name models"):
        load_settings(bad)


def test_the_recorded_tail_tightens_feasibility_and_guides_the_fallback():
    # A stopped clock: what is learned here must not decay while a loaded machine runs it.
    cal = Calibration(clock=lambda: 0.0)
    sched = Scheduler(space_for("pi0", accelerators=False), DEVICES, 1.0, actions=20, cal=cal)
    names = sched.space.stages  # every stage timed as modelled (the warm-up's part)
    sched.prime(
        {n: sched.t_rob[sched.k0, i] for i, n in enumerate(names)},
        {n: sched.t_edge[sched.k0, i, 1] for i, n in enumerate(names)},
    )
    link = Link(200.0, 5.0)
    first = sched.decide(link)
    roles = tuple(first.placement.values())
    assert first.feasible and roles == ("robot",) * 3  # the Orin alone meets 1 s on pi0
    # The all-robot plan turns out erratic: a third of its requests take 2.5x its prediction,
    # past the deadline, a third a quarter of it (a mixture no normal spread describes).
    pred = first.latency_s - first.residual_s
    for i in range(42):
        sched.cal.observe_tail(roles, pred, pred * (2.5, 1.0, 0.25)[i % 3])
    sc = sched.score(link)
    p_robot = sched.on_time_probabilities(sc)[sched.candidate_index(first)]
    assert 0.6 < p_robot < 0.7  # the recorded tail, barely moved by the prior
    second = sched.decide(link)
    assert tuple(second.placement.values()) != roles and second.on_time_p >= 0.99
    # Nothing meets the target: the fallback is the plan most likely to be on time (the
    # erratic one, whose fast third beats a deadline the steady plans' priors barely reach) ...
    tight = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=0.12, cal=cal)
    d, sc = tight.decide(link), tight.score(link)
    p = tight.on_time_probabilities(sc)
    assert not d.feasible and tuple(d.placement.values()) == roles
    assert p[tight.candidate_index(d)] == pytest.approx(p[tight.allowed].max())
    # ... and when no plan has even a 5% chance, the fastest (EcoVLA's argmin T).
    hopeless = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=0.01, cal=cal)
    d, sc = hopeless.decide(link), hopeless.score(link)
    assert d.latency_s == pytest.approx(sc.latency[hopeless.allowed].min())


def test_accuracy_costs_imported_from_a_bench_accel_result(tmp_path):
    from vlarun.sched.settings_table import load_settings

    sample = Path(__file__).parent / "samples" / "accel_bench_sample.json"
    rows = load_settings(sample)
    triage = {r.value: r for r in rows if r.knob == "token_budget" and r.models == ("tiny-oft",)}
    assert triage[0.34].relative_success == pytest.approx(0.95)
    assert triage[0.11].relative_success == pytest.approx(0.7)
    dit = {(r.knob, r.value): r.relative_success for r in rows if r.models == ("tiny-dit",)}
    assert dit == {("token_budget", 0.22): pytest.approx(0.95), ("cache_interval", 5): 1.0}
    # The floor is cleared by the 95% lower bound, not the point estimate: B=0.34's 0.95 point
    # sits on 0.45 / 0.6 = 0.75, so a 0.9 floor keeps only full compute; 0.7 admits it.
    assert triage[0.34].bounds == (pytest.approx(0.75), pytest.approx(0.68 / 0.6))

    def admitted(floor) -> set:
        space = space_for("tiny-oft", accuracy_floor=floor, settings_rows=rows)
        pairs = zip(space.settings, space.eligible, strict=True)
        return {dict(s.knobs)["token_budget"] for s, e in pairs if e}

    assert admitted(0.9) == {1.0}
    assert admitted(0.7) == {1.0, 0.34}
    # No measurable loss: B=0.34's interval reaches 1.0 (0.68 / 0.6), B=0.11's (0.55 / 0.6) not.
    assert admitted(NO_LOSS) == {1.0, 0.34}
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps(json.loads(sample.read_text()) | {"quick": True}))
    with pytest.raises(ValueError, match="quick"):
        load_settings(quick)


def test_observe_calibrates_a_batched_execution_against_the_batched_prediction():
    """An edge stage that ran in a batch of 4 exactly as fast as the model predicts for a batch
    of 4 teaches a factor of 1: comparing batch time / 4 with the batch-1 prediction (the old
    agent's rule) would have taught the edge to look ~4x too fast."""
    from vlarun.sched.contract import Outcome, StageOutcome

    sched, devs = _edge_heavy_scheduler()
    plan = sched.decide(Link(1000.0, 1.0))
    edge_stages = [n for n, r in plan.placement.items() if r == "edge"]
    assert edge_stages
    k = sched.setting_index(plan)
    names = list(sched.space.stages)
    stages = []
    for name in names:
        role, si = plan.placement[name], names.index(name)
        secs = sched.t_edge[k, si, 4] if role == "edge" else sched.t_rob[k, si]
        stages.append(StageOutcome(name, role, float(secs), 4 if role == "edge" else 1))
    sched.observe(plan, Outcome(tuple(stages), plan.latency_s))
    for name in edge_stages:
        assert sched.cal.factor(name, "edge") == pytest.approx(1.0, rel=1e-9)
    # The plan carries what it predicted per stage; no index into the scheduler's arrays.
    assert set(plan.stage_predicted_s) == set(names)
    assert not hasattr(plan, "index")


def _best_unmeasured(sched, link):
    """The candidate with the most actions per joule overall, and its predicted latency."""
    sc = sched.score(link)
    apj = np.where(sched.allowed, sched.actions / sc.energy, -np.inf)
    c = int(np.argmax(apj))
    return c, float(sc.latency[c])


def test_bounded_exploration_tries_a_plausible_never_run_plan_then_learns_it():
    """A plan the cost model predicts 5% too slow is rejected by the rule; within the model's
    prior error it could meet the deadline and it would save energy, so every third decision
    may try it; once it ran (faster than predicted) the rule itself chooses it."""
    link = Link(200.0, 5.0)
    probe = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=1.0, actions=20)
    c, latency = _best_unmeasured(probe, link)
    slo = latency / 1.05
    sched = Scheduler(
        space_for("pi0", accelerators=False), DEVICES, slo_s=slo, actions=20, explore_every=3
    )
    roles = tuple(sched.space.roles(sched.p[c]))
    first, second = sched.decide(link), sched.decide(link)
    assert first.feasible and not first.explored and tuple(first.placement.values()) != roles
    # the same plan (the miss budget it may spend grew by what the first one saved)
    assert second == dataclasses.replace(first, miss_allowance=second.miss_allowance)
    third = sched.decide(link)
    assert third.explored and not third.feasible and tuple(third.placement.values()) == roles
    assert third.actions_per_joule > first.actions_per_joule
    # It runs 20% faster than predicted. One request is not evidence of a 1% tail, but the
    # miss budget the punctual requests saved lets the rule try it again, and once its record
    # shows it on time, the rule chooses it on its own.
    from vlarun.sched.contract import Outcome, StageOutcome

    ran = tuple(
        StageOutcome(n, r, 0.8 * third.stage_predicted_s[n]) for n, r in third.placement.items()
    )
    sched.observe(third, Outcome(stages=ran, latency_s=0.8 * latency))
    ruled = []  # decisions at which the rule itself chose it
    for i in range(20):
        d = sched.decide(link)
        if tuple(d.placement.values()) == roles:
            sched.observe(d, Outcome(stages=ran, latency_s=0.8 * latency))
            if not d.explored:
                ruled.append(i)
    last = sched.decide(link)
    assert tuple(last.placement.values()) == roles and not last.explored
    assert last.on_time_p > 0.95 and ruled and ruled[0] < 15
    # Off by default (a one-shot `vlarun plan` has no outcome to learn from).
    plain = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=slo, actions=20)
    assert not any(plain.decide(link).explored for _ in range(30))


def test_exploration_never_tries_a_robot_only_plan_whose_stages_were_timed():
    """Device-only within the prior error of the deadline is worth one try while its stages
    are the cost model's guess; once the robot's warm-up timed every stage (``prime``), its
    latency is known and a try would only miss the deadline (a miss per exploration)."""
    link = Link(200.0, 5.0)
    probe = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=1.0, actions=20)
    robot_only = next(
        p for p in range(len(probe.space.placements)) if set(probe.space.roles(p)) == {"robot"}
    )
    c = int(np.flatnonzero(probe.p == robot_only)[0])
    latency = float(probe.score(link).latency[c])
    slo = latency / 1.05  # 5% over: within the 15% prior error, so a guess might make it

    def explored(primed: bool) -> bool:
        sched = Scheduler(
            space_for("pi0", accelerators=False), DEVICES, slo_s=slo, actions=20, explore_every=1
        )
        if primed:  # timed exactly as the model predicts: 5% over the deadline, measured
            k = 0
            sched.prime({n: float(sched.t_rob[k, i]) for i, n in enumerate(sched.space.stages)}, {})
        return any(
            set(d.placement.values()) == {"robot"} and d.explored
            for d in (sched.decide(link) for _ in range(5))
        )

    assert explored(False)  # a guess is worth a try
    assert not explored(True)


def test_exploration_counts_timed_robot_stages_at_their_measured_time():
    """Vision on the edge, the rest on the robot: within the prior error while every time is a
    guess, but once the robot stages it keeps were timed and alone outlast the deadline, only
    the edge part could be off, and no edge part can make up for them."""
    link = Link(200.0, 5.0)
    probe = Scheduler(space_for("openvla-7b", accelerators=False), DEVICES, slo_s=1.0, actions=1)
    names = probe.space.stages
    p = next(
        p
        for p in range(len(probe.space.placements))
        if dict(zip(names, probe.space.roles(p), strict=True))["vision"] == "edge"
        and set(probe.space.roles(p)[1:]) == {"robot"}
    )
    c = int(np.flatnonzero(probe.p == p)[0])
    latency = float(probe.score(link).latency[c])
    robot_part = float(sum(probe.t_rob[0, i] for i, n in enumerate(names) if n != "vision"))
    assert robot_part > 0.85 * latency  # the robot stages are most of this plan's time
    slo = (robot_part + 0.85 * latency) / 2  # the guess could make it, the timed part cannot

    def explored(primed: bool) -> set[tuple[str, ...]]:
        sched = Scheduler(
            space_for("openvla-7b", accelerators=False),
            DEVICES,
            slo_s=slo,
            actions=1,
            explore_every=1,
        )
        if primed:  # prefill and decode timed on the robot; vision never ran there
            sched.prime(
                {n: float(sched.t_rob[0, i]) for i, n in enumerate(names) if n != "vision"}, {}
            )
        return {
            tuple(d.placement.values())
            for d in (sched.decide(link) for _ in range(8))
            if d.explored
        }

    # Unprimed, the robot-heavy plans are guesses worth a try; primed, none whose timed robot
    # stages (prefill and decode) alone outlast the deadline is tried.
    assert any(roles[1:] == ("robot", "robot") for roles in explored(False))
    assert not any(roles[1:] == ("robot", "robot") for roles in explored(True))


def test_exploration_never_tries_what_the_model_error_cannot_explain():
    link = Link(200.0, 5.0)
    probe = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=1.0, actions=20)
    c, latency = _best_unmeasured(probe, link)
    sched = Scheduler(
        space_for("pi0", accelerators=False),
        DEVICES,
        slo_s=latency / 1.5,
        actions=20,
        explore_every=1,
    )
    roles = tuple(sched.space.roles(sched.p[c]))
    for _ in range(5):  # 50% over the deadline is beyond two of the 15% prior errors
        d = sched.decide(link)
        assert tuple(d.placement.values()) != roles


def test_boundary_overheads_are_learned_from_edge_calls_and_priced_on_every_cut():
    """Each edge call's time off the edge, beyond the link model, is taught to the boundaries
    it crossed; a plan that crosses the same boundary, run or not, then pays it."""
    from vlarun.sched.contract import Outcome, StageOutcome, TransferOutcome

    link = Link(200.0, 5.0)
    sched = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=10.0, actions=20)
    names = list(sched.space.stages)
    edge_only = next(
        c for c in range(len(sched.k)) if set(sched.space.roles(sched.p[c])) == {"edge"}
    )
    split = next(
        c
        for c in range(len(sched.k))  # vision on the robot, the rest on the edge
        if tuple(sched.space.roles(sched.p[c])) == ("robot", "edge", "edge")
        and sched.k[c] == sched.k[edge_only]
    )
    before = sched.score(link).latency
    plan = sched.decider.plan(edge_only, sched.score(link), np.ones(len(sched.k)))
    sent, recv = 600_000, 2_000
    model_s = link.rtt_ms * 1e-3 + (sent + recv) / link.bytes_per_s
    stages = tuple(
        StageOutcome(n, "edge", float(sched.t_edge[sched.k[edge_only], i, 1]))
        for i, n in enumerate(names)
    )
    for _ in range(60):  # every call spends 30 ms more off the edge than the link model says
        tr = TransferOutcome(names[0], names[-1], model_s + 0.030, sent, recv)
        sched.observe(plan, Outcome(stages, plan.latency_s, transfers=(tr,)))
    assert sched.cal.boundary(INPUT, names[0]) == pytest.approx(0.015, abs=1e-4)
    assert sched.cal.boundary(names[-1], OUTPUT) == pytest.approx(0.015, abs=1e-4)
    after = sched.score(link).latency
    # The edge-only plan pays both halves; the split plan pays the answer's half (its input
    # boundary is vision -> prefill, never observed) - and it never ran.
    assert after[edge_only] - before[edge_only] == pytest.approx(0.030, abs=2e-4)
    assert after[split] - before[split] == pytest.approx(0.015, abs=2e-4)


def test_calibration_keeps_robot_and_edge_apart_when_the_catalog_names_one_device():
    """`bench coinfer` prices both roles as this-cpu and slows the robot 4x: the robot's
    measured stages (4x the model) and the edge's (1x) must teach two factors, not one shared
    by device id (which averaged them, so the edge looked slow and the robot fast)."""
    from vlarun.sched.contract import Outcome, StageOutcome

    devs = {"robot": ORIN, "edge": ORIN}
    space = space_for("cogact", devs, accelerators=False)
    sched = Scheduler(space, devs, slo_s=10.0, actions=16)
    names = list(space.stages)
    plan = sched.decide(Link(1000.0, 1.0))
    k = sched.setting_index(plan)
    runs = {"robot": 4.0, "edge": 1.0}  # measured / model on each side
    for role, ratio in [*runs.items()] * 3:
        ran = dataclasses.replace(plan, placement=dict.fromkeys(names, role))
        base = sched.t_rob[k] if role == "robot" else sched.t_edge[k, :, 1]
        stages = tuple(StageOutcome(n, role, float(ratio * base[i])) for i, n in enumerate(names))
        sched.observe(ran, Outcome(stages, 1.0))
    sc = sched.score(Link(1000.0, 1.0))
    for role, ratio in runs.items():
        c = sched.candidate_index(dataclasses.replace(plan, placement=dict.fromkeys(names, role)))
        base = sched.t_rob[k] if role == "robot" else sched.t_edge[k, :, 1]
        np.testing.assert_allclose(sc.end[c] - sc.start[c], ratio * base, rtol=1e-9)


def _only(sched, role: str) -> int:
    """The candidate running every stage on ``role`` (no batch join)."""
    for c in range(len(sched.k)):
        if set(sched.space.roles(sched.p[c])) == {role}:
            return c
    raise AssertionError(f"no {role}-only candidate")


def _edge_plan_and_slo():
    """A pi0 scheduler whose deadline the robot alone misses (90% of its time), so the chosen
    plan uses the edge, as in the co-inference runs (a 4x slowed robot)."""
    link = Link(200.0, 5.0)
    probe = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=10.0, actions=20)
    slo = 0.9 * float(probe.score(link).latency[_only(probe, "robot")])
    sched = Scheduler(space_for("pi0", accelerators=False), DEVICES, slo_s=slo, actions=20)
    d = sched.decide(link)
    assert "edge" in d.placement.values() and d.feasible
    return sched, link, d


@pytest.mark.parametrize("normal_runs", [5, 20])
def test_one_outlier_does_not_lock_out_the_edge(normal_runs):
    """One request 80 ms late on a 200 ms deadline (an edge hiccup: 40% of the deadline) used
    to bar the plan for ~36 decisions; now the next decision still takes it. (An outlier that
    is a plan's whole record is not a hiccup but all it knows: the miss budget retries it when
    its savings allow, test_bounded_exploration_tries_a_plausible_never_run_plan_then_learns_it.)"""
    sched, link, d = _edge_plan_and_slo()
    roles = tuple(d.placement.values())
    t = d.latency_s
    for i in range(normal_runs):
        sched.cal.observe_total(roles, t, t * (1 + 0.02 * (-1) ** i))
    sched.cal.observe_total(roles, t, t + 0.4 * sched.slo_s)
    again = sched.decide(link)
    assert tuple(again.placement.values()) == roles and again.feasible


def test_fallback_picks_the_highest_on_time_probability():
    """Nothing meets the target: a steady robot plan 10% over the deadline (never on time) and
    erratic plans using the edge around 80% of it with a spread of 40% (on time ~69%), as
    their recorded tails say. An edge plan is chosen; EcoVLA's argmin T took the robot."""
    from statistics import NormalDist

    sched, link, d = _edge_plan_and_slo()
    slo = sched.slo_s
    sc = sched.score(link)
    robot = _only(sched, "robot")
    for pi in range(len(sched.space.placements)):
        roles = tuple(sched.space.roles(pi))
        c = int(np.flatnonzero(sched.p == pi)[0])
        pred = float(sc.latency[c]) - sched.cal.residual(roles)
        for i in range(200):
            q = NormalDist().inv_cdf((i + 0.5) / 200)
            took = 1.1 * slo if c == robot else (0.8 + 0.4 * q) * slo
            sched.cal.observe_tail(roles, pred, max(took, 1e-3))
    pick = sched.decide(link)
    c = sched.candidate_index(pick)
    assert not pick.feasible and c != robot and "edge" in pick.placement.values()
    p = sched.on_time_probabilities(sched.score(link))
    assert p[c] == pytest.approx(0.69, abs=0.02) and p[robot] < 0.02


def test_only_requests_that_ran_as_planned_teach_the_residual():
    from vlarun.sched.contract import Outcome

    sched, link, d = _edge_plan_and_slo()
    roles = tuple(d.placement.values())
    sched.observe(d, Outcome(stages=(), latency_s=5 * sched.slo_s, fallback="link: timed out"))
    assert not sched.cal.measured(roles)  # the link's fault: the link estimate learns it
    # nor its tail: a placement charged with a link's timeouts stayed off a restored edge ~2 s
    assert not sched.cal.tails.get(roles)
    sched.observe(d, Outcome(stages=(), latency_s=d.latency_s * 1.1))
    assert sched.cal.measured(roles) and sched.cal.residual(roles) > 0
    assert len(sched.cal.tails[roles]) == 1
    # the edge's own lateness is the placement's tail, fallback or not
    sched.observe(d, Outcome(stages=(), latency_s=3 * sched.slo_s, fallback="edge: no answer"))
    assert len(sched.cal.tails[roles]) == 2 and max(sched.cal.tails[roles]) > 2


def test_residual_and_spread_relax_toward_the_prior_with_time():
    now = [0.0]
    cal = Calibration(clock=lambda: now[0], half_life_s=10.0)
    roles = ("robot", "edge")
    for i in range(20):
        cal.observe_total(roles, 0.1, 0.2 + 0.05 * (-1) ** i)
    mean, sigma = cal.residual(roles), cal.sigma(roles)
    assert mean == pytest.approx(0.1, abs=0.01) and sigma > 0.03
    prior = cal.prior_rel * 0.1  # the cost model's own error for this placement
    now[0] = 10.0  # one half-life later, whatever happened to other placements meanwhile
    assert cal.residual(roles) == pytest.approx(mean / 2)
    assert cal.sigma(roles) == pytest.approx(sigma)  # in use until a half-life: as measured
    now[0] = 20.0  # idle for one half-life past that: halfway to the prior's spread
    assert cal.sigma(roles) == pytest.approx(((sigma**2 + prior**2) / 2) ** 0.5)
    now[0] = 1000.0  # long unmeasured: no bias left, and as uncertain as the prior, not certain
    assert abs(cal.residual(roles)) < 1e-6
    assert cal.sigma(roles) == pytest.approx(prior, rel=1e-6)


def test_a_slot_that_starts_about_when_the_request_arrives_costs_its_expected_wait():
    """Where the request reaches the edge is predicted to within prior_rel of the time until
    then: a slot that starts well before it holds the edge, one that starts well after it (and
    is due later) runs after it, and one that starts at about the same moment delays it by the
    wait expected over that error (half of it at the same instant), not all or nothing."""
    sched, link, _ = _edge_plan_and_slo()
    c = _only(sched, "edge")
    arrive = float(sched.score(link, 0.0, DeviceState()).start[c, 0])
    alone = float(sched.score(link, 0.0, DeviceState()).latency[c])
    sd = sched.cal.prior_rel * arrive
    hold = 0.2  # the slot's length

    def latency(offset_sd: float) -> float:
        start = arrive + offset_sd * sd
        slot = Slot(
            origin="other",
            stage="vision",
            start=start,
            end=start + hold,
            deadline=10 * sched.slo_s,
        )
        return float(sched.score(link, 0.0, DeviceState(reservations=[slot])).latency[c])

    lat = {k: latency(k) for k in (-4.0, -1.0, 0.0, 1.0, 4.0)}
    assert lat[-4.0] == pytest.approx(alone + hold - 4 * sd, rel=1e-3)  # waits it out
    assert lat[4.0] == pytest.approx(alone, abs=1e-4)  # goes first
    assert lat[0.0] == pytest.approx(alone + hold / 2, rel=1e-3)  # a coin: half the wait
    # 1 sigma early: it holds the edge with P = Phi(1) = 0.841, for the 0.2 s less 1 sigma
    assert lat[-1.0] == pytest.approx(alone + 0.8413 * (hold - sd), rel=1e-3)
    assert lat[0.0] > lat[1.0] > lat[4.0]


def test_a_plan_that_keeps_costing_less_than_predicted_is_predicted_so():
    """An edge plan that realises 2/3 of its predicted energy (its stage kept joining other
    robots' batches the schedule did not show) is predicted at 2/3 from the next request on;
    a fallback teaches nothing; a plan not run lately drifts back toward the model."""
    from vlarun.sched.contract import Outcome

    now = [0.0]
    sched, link, d = _edge_plan_and_slo()
    sched.cal.clock = lambda: now[0]
    roles = tuple(d.placement.values())
    c = sched.candidate_index(d)
    before = float(sched.score(link).energy[c])
    sched.observe(
        d,
        Outcome(
            stages=(), latency_s=d.latency_s, fallback="link: timed out", energy_j=0.1 * d.energy_j
        ),
    )
    assert float(sched.score(link).energy[c]) == pytest.approx(before)
    sched.observe(d, Outcome(stages=(), latency_s=d.latency_s, energy_j=2 / 3 * d.energy_j))
    assert float(sched.score(link).energy[c]) == pytest.approx(2 / 3 * before, rel=1e-6)
    sc = sched.score(link)
    again = sched.decider.plan(c, sc, sched.actions / sc.energy)  # the same plan, decided now
    assert again.energy_factor == pytest.approx(2 / 3)
    assert again.energy_j == pytest.approx(2 / 3 * d.energy_j, rel=1e-6)
    # the same reading again: learnt against the model's own figure, the factor stays 2/3
    sched.observe(again, Outcome(stages=(), latency_s=d.latency_s, energy_j=2 / 3 * d.energy_j))
    assert sched.cal.energy.factor(roles) == pytest.approx(2 / 3)
    now[0] += 0.9 * sched.cal.half_life_s  # in use: kept
    assert float(sched.score(link).energy[c]) == pytest.approx(2 / 3 * before, rel=1e-6)
    now[0] += 10 * sched.cal.half_life_s  # not run for ten half-lives: back to the model
    assert float(sched.score(link).energy[c]) == pytest.approx(before, rel=1e-2)


def _local_times(sched, link) -> list[float]:
    """When each stage of the robot-only plan ends, from the request's start."""
    c = _only(sched, "robot")
    return [float(x) for x in sched.score(link).end[c]]


def test_a_request_running_here_hands_its_rest_to_the_edge_when_the_link_is_back():
    """OpenVLA-7B on the Orin misses a 1 s deadline alone (EcoVLA's regime): a request that
    ran here while the link was down hands the rest to the restored edge at its next stage
    boundary, from whichever held output finishes first (the 0.6 MB image before 2.1 MB of
    visual features at 200 Mbit/s). After prefill the edge redoes prefill (the KV cache is
    too big to send), the robot's work on it lost."""
    sched = Scheduler(space_for("openvla-7b", accelerators=False), DEVICES, slo_s=1.0, actions=7)
    good = Link(200.0, 5.0)
    ends = _local_times(sched, good)
    assert ends[-1] > 1.0  # the robot alone is late
    after_vision = sched.handoff(None, 1, ends[0], good)
    assert after_vision is not None and after_vision.start in ("vision", "prefill")
    assert after_vision.placement["prefill"] == after_vision.placement["decode"] == "edge"
    assert after_vision.finish_s < 1.0 < after_vision.local_finish_s
    after_prefill = sched.handoff(None, 2, ends[1], good)
    assert after_prefill is not None and after_prefill.start != "decode"  # not the KV cache
    assert after_prefill.finish_s < after_prefill.local_finish_s
    assert abs(after_prefill.local_finish_s - ends[-1]) < 1e-6  # on the predicted path
    # The link still down, or a robot on time: the rest stays here.
    assert sched.handoff(None, 1, ends[0], Link(2.0, 5.0)) is None
    relaxed = Scheduler(space_for("openvla-7b", accelerators=False), DEVICES, slo_s=5.0, actions=7)
    assert relaxed.handoff(None, 1, ends[0], good) is None
    assert sched.handoff(None, 0, 0.0, good) is None  # nothing has run here yet: plan it


def test_a_handoff_waits_out_the_edge_queue():
    """Work queued at the edge until after the robot would finish keeps the rest here."""
    sched = Scheduler(space_for("openvla-7b", accelerators=False), DEVICES, slo_s=1.0, actions=7)
    good = Link(200.0, 5.0)
    ends = _local_times(sched, good)
    busy = DeviceState(
        reservations=[
            Slot(origin="other", stage=s, start=0.0, end=5.0, deadline=0.5)
            for s in ("vision", "prefill", "decode")
        ]
    )
    assert sched.handoff(None, 1, ends[0], good, busy) is None


def test_with_nothing_feasible_a_placement_that_keeps_missing_loses_to_the_next_likeliest():
    """In an overload no plan is feasible and the rule takes the one most likely to meet the
    deadline. A placement whose requests keep missing it (refused by the edge: fallbacks,
    which teach no residual) must lose that rank to the measured evidence, and the evidence is
    judged at the deadline requests are held to, not the planning headroom below it."""
    from vlarun.sched.contract import Outcome

    slow_robot = dataclasses.replace(get_device("orin-nx-16gb"), mem_gb=64)
    devs = {"robot": slow_robot, "edge": RTX}
    space = space_for("cogact", devs, accelerators=False)
    # Planned at 60 ms, judged at 130: nothing fits 60 ms (edge-only, the fastest, takes ~73),
    # and edge-only is the likeliest to meet 130 until its requests keep missing it.
    sched = Scheduler(space, devs, slo_s=0.06, actions=16, deadline_s=0.13)
    link = Link(1000.0, 1.0)
    first = sched.decide(link)
    assert not first.feasible and set(first.placement.values()) == {"edge"}
    for _ in range(20):  # every request of that placement refused, run here, late
        sched.observe(first, Outcome(stages=(), latency_s=1.0, fallback="edge: refused"))
    assert not sched.cal.residuals  # fallbacks teach no residual
    roles = tuple(first.placement[n] for n in space.stages)
    share, evidence = sched.cal.on_time_share(roles)
    assert share == 0.0 and evidence == pytest.approx(sched.cal.max_count)
    second = sched.decide(link)
    assert second.placement != first.placement
    # A request on time at the deadline but over the planning SLO counts as on time.
    sched.observe(second, Outcome(stages=(), latency_s=0.1))
    roles2 = tuple(second.placement[n] for n in space.stages)
    assert sched.cal.on_time_share(roles2)[0] == 1.0


def test_a_wrong_edge_power_is_learnt_from_a_plan_that_ran_and_reprices_plans_that_did_not():
    """The edge's meter reads 1/7 of what the scheduler's account gives the same execution
    (a 4090 at EcoVLA's 6.9 J per inference where the catalog's 281 W says ~43 J). After one
    such request, every plan that uses the edge, Edge-Only never run included, is priced with
    it and the robot's part is not; until then a plan says which devices' powers no meter has
    read. The placement's own factor is learnt against the power-corrected prediction, so a
    power error is not counted twice."""
    from vlarun.sched.contract import Outcome

    sched, link, d = _edge_plan_and_slo()
    edge_only, robot_only = _only(sched, "edge"), _only(sched, "robot")
    before = sched.score(link)
    assert before.by_device[edge_only].sum() == pytest.approx(before.energy[edge_only])
    assert set(d.power_unmetered) == {"robot", "edge"}
    assert d.energy_by_device["edge"] > 0 and sum(d.energy_by_device.values()) == pytest.approx(
        d.energy_j
    )
    robot_j, edge_j = d.energy_by_device["robot"], d.energy_by_device["edge"]
    # The same execution priced twice: the robot's meter agrees with the model, the edge's not.
    sched.observe(
        d,
        Outcome(
            stages=(),
            latency_s=d.latency_s,
            energy_j=robot_j + edge_j / 7,
            energy_by_device={"robot": 3.0, "edge": 1.0},
            modelled_by_device={"robot": 3.0, "edge": 7.0},
        ),
    )
    assert sched.cal.energy.power_factor("edge") == pytest.approx(1 / 7)
    assert sched.cal.energy.power_factor("robot") == pytest.approx(1.0)
    after = sched.score(link)
    r, e = before.by_device[edge_only]
    assert after.energy[edge_only] == pytest.approx(r + e / 7, rel=1e-9)  # never run, repriced
    assert after.energy[robot_only] == pytest.approx(before.energy[robot_only], rel=1e-9)
    assert sched.cal.energy.factor(tuple(d.placement.values())) == pytest.approx(1.0)
    assert sched.decide(link).power_unmetered == ()
    # A meter that reads nothing (no per-device figures) teaches no power.
    sched.observe(d, Outcome(stages=(), latency_s=d.latency_s, energy_j=d.energy_j))
    assert sched.cal.energy.power_factor("edge") == pytest.approx(1 / 7)


def test_a_plan_more_likely_late_than_on_time_books_nothing():
    """An infeasible plan books its edge segments only while it is at least as likely on time
    as late: a request likely refused or fallen back would hold edge time that feasible
    arrivals are refused for."""
    sched, _ = _edge_heavy_scheduler()
    d = sched.decide(Link(1000.0, 1.0))
    assert d.feasible and plan_bookings(d, sched.slo_s)
    late = dataclasses.replace(d, feasible=False, on_time_p=0.2)
    assert plan_bookings(late, sched.slo_s) == ()
    coin = dataclasses.replace(late, on_time_p=0.6)
    assert plan_bookings(coin, sched.slo_s) != ()  # below the target, on time more often
    # A plan no scheduler priced (no on-time probability): its normal tail decides.
    late = dataclasses.replace(late, on_time_p=None, latency_s=1.2 * d.slo_s, sigma_s=0.0)
    assert plan_bookings(late, sched.slo_s) == ()
    coin = dataclasses.replace(late, latency_s=d.slo_s * 0.999, sigma_s=0.1 * d.slo_s)
    assert plan_bookings(coin, sched.slo_s) != ()
