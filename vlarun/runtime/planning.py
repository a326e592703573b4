"""The agent's side of the scheduler contract: build it, ask it, teach it, price a request.

The runtime executes placements only: every accelerator knob stays at its identity value
(``accelerators=False``), because the runtime does not yet apply TRIAGE budgets, layer
pruning or cache intervals to the stages it runs, and a plan must never promise a setting
that is not executed.

The edge's view comes from its health reply: per-stage queue depth times its measured stage
time becomes the predictor's queued work. Each robot keeps its own scheduler, so the edge's
reservations of other robots are seen only through that queue (the fleet-wide reservation
table is the simulator's, ``vlarun fleet``).
"""

from __future__ import annotations

from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.energy import RadioPower, stage_power
from vlarun.sched.link import Link
from vlarun.sched.plans import build_space
from vlarun.sched.predictor import DeviceState
from vlarun.sched.scheduler import Decision, Scheduler
from vlarun.stages.families import Workload


def make_scheduler(model_cfg, cfg, text_tokens: int, dtype: str) -> Scheduler:
    """A placement-only scheduler between the agent's robot and edge devices."""
    devices = {"robot": get_device(cfg.robot_device), "edge": get_device(cfg.edge_device)}
    w = Workload(1, text_tokens, dtype)
    space = build_space(model_cfg, stage_works(model_cfg, w), devices, w, accelerators=False)
    sched = Scheduler(space, devices, cfg.slo_s, dtype=dtype, actions=model_cfg.horizon)
    sched.join[:] = False  # batching is the edge's own business (its queues), not reserved here
    return sched


def prime(sched: Scheduler, robot_s: dict[str, float], edge_ms: dict[str, float]) -> None:
    """Start calibrated: stage times already measured (the robot's warm-up runs, the edge's
    per-stage estimates from its health reply) set the stage factors before the first
    request, so the first plan is not a guess from catalog peaks."""
    for si, name in enumerate(sched.space.stages):
        if name in robot_s:
            sched.cal.observe_stage(
                name, sched.devices["robot"].id, sched.t_rob[0, si], robot_s[name]
            )
        if name in edge_ms:
            edge_s = edge_ms[name] * 1e-3
            sched.cal.observe_stage(name, sched.devices["edge"].id, sched.t_edge[0, si, 1], edge_s)


def decide(sched: Scheduler, link: Link, health: dict) -> Decision:
    """The scheduler's decision for a request made now, given the edge's last health reply."""
    stage_ms = health.get("stage_ms", {}) or {}
    queue = health.get("queue", {}) or {}
    queued = {s: n * stage_ms.get(s, 0.0) * 1e-3 for s, n in queue.items()}
    return sched.decide(link, 0.0, DeviceState(queued_s=queued), top=0)


def learn(sched: Scheduler, d: Decision, inf, stage_s: dict, edge_s: dict) -> None:
    """Feed one executed request back: stage factors for what ran where it ran, and the
    planned placement's end-to-end latency (its residual)."""
    k = int(sched.k[d.index])
    for si, name in enumerate(sched.space.stages):
        role = inf.ran.get(name)
        if role == "robot" and name in stage_s:
            sched.cal.observe_stage(
                name, sched.devices["robot"].id, sched.t_rob[k, si], stage_s[name]
            )
        elif role == "edge" and name in edge_s:
            sched.cal.observe_stage(
                name, sched.devices["edge"].id, sched.t_edge[k, si, 1], edge_s[name]
            )
    # The planned placement is charged what choosing it cost, fallback included: a plan that
    # keeps timing out on a congested link must lose to the robot-only plan, and the
    # residual's slow forgetting lets it be tried again later.
    roles = tuple(d.placement[n] for n in sched.space.stages)
    residual = sched.cal.residual(roles)
    sched.cal.observe_total(roles, d.latency_s - residual, inf.latency_s)


def modelled_energy(cfg, ran: dict, stage_s: dict, edge_s: dict, latency_s: float) -> float:
    """Energy of one executed request from its measured times and the catalog's powers
    (modelled, at full utilisation: an upper bound of the dynamic part). Robot: dynamic
    power while computing + idle power over the control cycle; edge: its busy power for
    this request's share of each batch; radio: the robot's interface while the request's
    remote time was not edge compute."""
    rob, edge, radio = get_device(cfg.robot_device), get_device(cfg.edge_device), RadioPower()
    joules = rob.idle_w * max(latency_s, cfg.slo_s)
    for name, role in ran.items():
        if role == "robot":
            joules += (stage_power(rob, 1.0) - rob.idle_w) * stage_s[name]
        else:
            joules += stage_power(edge, 1.0) * edge_s.get(name, 0.0)
    remote = [n for n, r in ran.items() if r == "edge"]
    if remote:
        on_air = max(
            latency_s
            - sum(stage_s[n] for n in ran if ran[n] == "robot")
            - sum(stage_s[n] for n in remote),
            0.0,
        )
        joules += on_air * (radio.tx_w + radio.rx_w) / 2
    return joules
