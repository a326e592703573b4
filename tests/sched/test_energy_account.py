"""One energy account: the predictor, the scheduler, the fleet simulator and the runtime all
price a request with ``request_energy``; on identical inputs their figures are equal."""

import pytest

from vlarun.models.presets import get_preset
from vlarun.runtime.emulate import StandIn
from vlarun.runtime.robot.agent import AgentConfig
from vlarun.runtime.robot.costview import modelled_energy, stand_in_factors
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.energy import RadioPower, StageSpend, request_energy
from vlarun.sched.link import Link
from vlarun.sched.predictor import predict_placement
from vlarun.stages.families import Workload

ORIN, RTX = get_device("orin-agx-32gb"), get_device("rtx4090")


def test_formula_by_hand():
    stages = [StageSpend("robot", 0.02, 0.5), StageSpend("edge", 0.03, 1.0, batch=3)]
    radio = RadioPower(2.0, 1.0)
    e = request_energy(
        ORIN, RTX, stages, latency_s=0.05, period_s=0.2, tx_s=0.004, rx_s=0.001, radio=radio
    )
    robot_dyn = (ORIN.busy_w - ORIN.idle_w) * 0.5 * 0.02
    edge_share = RTX.busy_w * 0.03 / 3
    expected = ORIN.idle_w * 0.2 + robot_dyn + edge_share + 2.0 * 0.004 + 1.0 * 0.001
    assert e == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="robot or edge"):
        StageSpend("cloud", 0.1)


@pytest.mark.parametrize("split", ["robot", "vision-on-robot"])
def test_runtime_realised_energy_equals_the_plans_prediction_on_identical_inputs(split):
    """The predictor's energy for a plan and the runtime's for an executed request whose measured
    times are exactly the predicted ones (full utilisation, as measured times carry)."""
    cfg = get_preset("tiny-openvla")
    works = stage_works(cfg, Workload(text_tokens=8))
    names = [w.name for w in works]
    placement = {n: "robot" if split == "robot" or n == "vision" else "edge" for n in names}
    times = {n: 0.004 * (i + 1) for i, n in enumerate(names)}
    measured = {(n, ORIN.id if placement[n] == "robot" else RTX.id): t for n, t in times.items()}
    link, radio, slo = Link(200.0, 2.0), RadioPower(1.2, 1.2), 0.5
    pred = predict_placement(
        works,
        placement,
        {"robot": ORIN, "edge": RTX},
        link,
        period_s=slo,
        radio=radio,
        measured=measured,
    )
    agent = AgentConfig(slo_s=slo, robot=StandIn(ORIN.id), edge=StandIn(RTX.id))
    edge_s = {n: t for n, t in times.items() if placement[n] == "edge"}
    same = {"robot": {}, "edge": {}}  # the times are already the named devices'
    realised = modelled_energy(agent, placement, times, edge_s, pred.latency_s, same, radio=radio)
    assert realised == pytest.approx(pred.energy_j, rel=1e-9)


def test_a_time_measured_here_is_priced_on_the_device_it_stands_in_for():
    """An edge stage timed on this CPU, priced as an RTX 4090: its time is first converted
    (roofline ratio: the calibrated 4090 prediction), never this CPU's seconds at 4090 watts;
    a role that names this-cpu is priced as measured."""
    cfg = get_preset("openvla-7b")
    agent = AgentConfig(slo_s=0.5, robot=StandIn("this-cpu"), edge=StandIn(RTX.id))
    f = stand_in_factors(cfg, agent, 8, "bfloat16")
    assert set(f["robot"].values()) == {1.0}
    assert all(0 < x < 0.2 for x in f["edge"].values())  # a 4090 beats this CPU at 7B shapes
    placement = {"vision": "robot", "prefill": "edge", "decode": "edge"}
    times = {"vision": 0.01, "prefill": 0.05, "decode": 0.08}
    edge_s = {n: times[n] for n in ("prefill", "decode")}
    latency = 0.16  # 0.02 s on the link
    got = modelled_energy(agent, placement, times, edge_s, latency, f, radio=RadioPower(1, 1))
    here = get_device("this-cpu")
    converted = [StageSpend("robot", 0.01)] + [
        StageSpend("edge", edge_s[n] * f["edge"][n]) for n in edge_s
    ]
    lat = 0.01 + sum(converted[i].busy_s for i in (1, 2)) + 0.02
    want = request_energy(
        here,
        RTX,
        converted,
        latency_s=lat,
        period_s=0.5,
        tx_s=0.01,
        rx_s=0.01,
        radio=RadioPower(1, 1),
    )
    assert got == pytest.approx(want, rel=1e-9)
    naive = request_energy(
        here,
        RTX,
        [StageSpend("robot", 0.01)] + [StageSpend("edge", t) for t in edge_s.values()],
        latency_s=latency,
        period_s=0.5,
        tx_s=0.01,
        rx_s=0.01,
        radio=RadioPower(1, 1),
    )
    assert got < 0.9 * naive
    with pytest.raises(ValueError, match="slowdown .2x. stands in .* named device .orin-nx-16gb."):
        AgentConfig(robot=StandIn("orin-nx-16gb", 2.0))


@pytest.mark.parametrize("split", ["robot", "vision-on-robot"])
def test_an_outcome_in_its_predicted_times_costs_what_its_plan_predicted(split):
    """The runtime prices an executed stage at the roofline utilisation the plan priced it at
    (``roofline_utilisation``), not at full utilisation: an outcome that took exactly the
    roofline times costs exactly the plan's energy (it cost 5-15% more: an energy MAPE that
    was the account's, not the prediction's)."""
    from vlarun.runtime.robot.costview import roofline_utilisation
    from vlarun.sched.cost import roofline

    cfg = get_preset("openvla-7b")
    works = stage_works(cfg, Workload(text_tokens=8))
    placement = {
        w.name: "robot" if split == "robot" or w.name == "vision" else "edge" for w in works
    }
    devices = {"robot": ORIN, "edge": RTX}
    times = {w.name: roofline(w, devices[placement[w.name]], "bfloat16").seconds for w in works}
    link, radio, slo = Link(200.0, 2.0), RadioPower(1.2, 1.2), 2.0
    pred = predict_placement(works, placement, devices, link, period_s=slo, radio=radio)
    agent = AgentConfig(slo_s=slo, robot=StandIn(ORIN.id), edge=StandIn(RTX.id))
    edge_s = {n: t for n, t in times.items() if placement[n] == "edge"}
    same = {"robot": {}, "edge": {}}
    util = roofline_utilisation(cfg, agent, 8, "bfloat16")
    assert 0 < min(min(u.values()) for u in util.values()) < 1  # decode is memory-bound
    realised = modelled_energy(
        agent, placement, times, edge_s, pred.latency_s, same, radio=radio, utilisation=util
    )
    assert realised == pytest.approx(pred.energy_j, rel=1e-9)
    full = modelled_energy(agent, placement, times, edge_s, pred.latency_s, same, radio=radio)
    assert full > 1.01 * realised  # the old account: every stage at full utilisation
