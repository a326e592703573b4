"""One energy account: the predictor, the scheduler, the fleet simulator and the runtime all
price a request with ``request_energy``; on identical inputs their figures are equal."""

import pytest

from vlarun.models.presets import get_preset
from vlarun.runtime.agent import AgentConfig
from vlarun.runtime.planning import modelled_energy
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
    e = request_energy(ORIN, RTX, stages, latency_s=0.05, period_s=0.2, tx_s=0.004, rx_s=0.001,
                       radio=radio)  # fmt: skip
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
    pred = predict_placement(works, placement, {"robot": ORIN, "edge": RTX}, link,
                             period_s=slo, radio=radio, measured=measured)  # fmt: skip
    agent = AgentConfig(slo_s=slo, robot_device=ORIN.id, edge_device=RTX.id)
    edge_s = {n: t for n, t in times.items() if placement[n] == "edge"}
    realised = modelled_energy(agent, placement, times, edge_s, pred.latency_s, radio=radio)
    assert realised == pytest.approx(pred.energy_j, rel=1e-9)
