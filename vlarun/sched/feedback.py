"""Feedback: what requests tell the scheduler, before, during and after they run.

Before: the warm-up's measured stage times start the calibration (``prime``,
``prime_setting``). After: ``observe(plan, outcome)`` is the one feedback path; each stage's
measured time teaches its device's factor, the transfers teach the link model's boundaries,
the meters teach each device's power, the end-to-end latency teaches the placement's tail and
residual, the miss budget learns whether the deadline was met (``settle``), and the safety net
learns the energy error and what a deviation from the fixed strategy realised. During: a
request running here that would miss while the link has come back may hand its rest to the
edge (``handoff``).

All of it writes to ``Calibration`` (the one learner, which scoring reads) and to the rule's
state (``MissBudget``, ``SafetyNet``), so it lives apart from both: scoring (``scoring.py``)
and the rule (``decision.py``) read what it taught, and never teach.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vlarun.sched.calibration import INPUT, OUTPUT
from vlarun.sched.contract import ExecutionPlan, Outcome, StageOutcome, TransferOutcome
from vlarun.sched.decision import Decider
from vlarun.sched.link import Link
from vlarun.sched.predictor import DeviceState
from vlarun.sched.scoring import MAX_EDGE_BATCH, Scorer, value_at


@dataclass(frozen=True)
class Handoff:
    """The rest of a request moved to the edge mid-way (``Scheduler.handoff``): the edge takes
    every stage from ``start`` on (``placement``), predicted to finish ``finish_s`` after the
    request began, where finishing on the robot would take until ``local_finish_s``."""

    start: str
    placement: dict[str, str]
    finish_s: float
    local_finish_s: float


class Feedback:
    """Teaches the calibration and the rule's state from measured runs; decides handoffs."""

    def __init__(self, scorer: Scorer, decider: Decider) -> None:
        self.scorer, self.cands, self.decider = scorer, scorer.cands, decider

    # -- before: the warm-up ---------------------------------------------------------------------

    def prime(self, robot_s: dict[str, float], edge_s: dict[str, float]) -> None:
        """Start calibrated from stage times already measured at batch 1 on the identity
        setting (the robot's warm-up runs; the edge's per-stage estimates)."""
        c, cal = self.cands, self.scorer.cal
        k = c.k_of(None)
        for si, name in enumerate(c.space.stages):
            if name in robot_s:
                cal.observe_stage(name, "robot", c.t_rob[k, si], robot_s[name])
            if name in edge_s:
                cal.observe_stage(name, "edge", c.t_edge[k, si, 1], edge_s[name])

    def prime_setting(self, settings: dict, robot_s: dict[str, float]) -> None:
        """Stage times measured on the robot under the setting ``settings`` (a plan's knobs;
        the warm-up runs every setting the scheduler may choose once), at batch 1."""
        c, cal = self.cands, self.scorer.cal
        k = c.setting_k(settings)
        for si, name in enumerate(c.space.stages):
            if name in robot_s:
                cal.observe_stage(name, "robot", c.t_rob[k, si], robot_s[name], c.key_k(k))

    def robot_times(self, settings: dict | None = None) -> dict[str, float]:
        """Each stage's calibrated time on the robot at batch 1 under ``settings`` (None: the
        identity), on the named device: the model's time x what the robot's runs of it taught
        (``Calibration.factor``). Only stages the robot has run (or the warm-up timed): a
        stage never timed here has no measured time to stand on."""
        k = self.cands.k_of(settings)
        return {
            # plain floats: these feed JSON records (a numpy scalar made ``late`` a numpy bool)
            name: self.scorer.stage_s(k, si, "robot")
            for si, name in enumerate(self.cands.space.stages)
            if (name, "robot") in self.scorer.cal.stage_factor
        }

    # -- after: an outcome -----------------------------------------------------------------------

    def observe(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The one feedback path: each stage's measured execution time teaches the factor of the
        device it ran on, against the model's time for that setting *at the batch it ran in*
        (a batched execution is compared with the batched prediction, not divided by its size);
        the planned placement's end-to-end latency teaches its residual, but only when the request
        ran as planned: a fallback's latency is the link's (the agent caps the link's estimate
        on a timeout) or the edge admission's, and charging it to the placement barred a
        healthy edge for dozens of decisions after one lost packet."""
        cal, rule = self.scorer.cal, self.decider
        self.observe_stages(plan.settings, outcome.stages)
        for tr in outcome.transfers:
            self._observe_transfer(plan, tr)
        # What ran, ran (a fallback too): each device's metered energy against this
        # scheduler's account of the same execution is that device's power error.
        for device, metered in outcome.energy_by_device.items():
            modelled = outcome.modelled_by_device.get(device, 0.0)
            cal.energy.observe_power(device, modelled, metered)
        roles = tuple(plan.placement[n] for n in self.cands.space.stages)
        cal.observe_on_time(roles, outcome.latency_s <= rule.deadline_s)
        # A link outage ("link: ...": the monitor had the edge down, or no reply came) is the
        # link's, which its monitor and estimate track; charged to the placement's tail it
        # would keep a restored edge looking late. What planning the
        # placement costs while the link is up ("edge: ...": refused, late, or the link too
        # slow for the time left after a stalled robot stage) is its tail.
        if outcome.fallback is None or not outcome.fallback.startswith("link:"):
            cal.observe_tail(roles, self._repredicted(plan), outcome.latency_s)
        self.settle(plan, outcome)
        if outcome.fallback is None:
            cal.observe_total(roles, plan.latency_s - plan.residual_s, outcome.latency_s)
            if outcome.energy_j is not None:
                rule.net.learn_error(plan.energy_j, outcome.energy_j)
                cal.energy.observe(roles, self._power_corrected(plan), outcome.energy_j)
        self._watch(plan, outcome)

    def observe_stages(self, settings: dict | None, stages: Iterable[StageOutcome]) -> None:
        """Each stage's measured time (``contract.StageOutcome``s of one request run under
        ``settings``; None: the identity) teaches the factor of the device it ran on, against
        the model's time for that setting at the batch it ran in. What every executed
        request teaches, whoever planned it (a fixed strategy's, an edge-down one's)."""
        c = self.cands
        k = c.k_of(settings)
        index = {name: si for si, name in enumerate(c.space.stages)}
        for st in stages:
            si = index.get(st.name)
            if si is None:
                continue
            if st.role == "robot":
                base = c.t_rob[k, si]
            else:
                base = c.t_edge[k, si, min(st.batch, MAX_EDGE_BATCH)]
            self.scorer.cal.observe_stage(st.name, st.role, base, st.seconds, c.key_k(k))

    def settle(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The miss budget learns whether the request met the deadline it was judged by."""
        if plan.on_time_p is not None:
            missed = outcome.latency_s > self.decider.deadline_s
            self.decider.budget.settle(1.0 - plan.on_time_p, missed)

    def _repredicted(self, plan: ExecutionPlan) -> float:
        """The plan's predicted latency (without the residual) with its stages priced by the
        factors as they are now, after its outcome taught them: the tail then records what the
        stage times the calibration already knows do not explain (a stall, a queue, a
        transfer), not a catalog error corrected since (the first request under a setting
        never timed ran 25% over a guess, and kept a placement 0.79 on time for dozens of
        requests)."""
        c, cal = self.cands, self.scorer.cal
        k = c.k_of(plan.settings)
        shift = 0.0
        for si, name in enumerate(c.space.stages):
            old = plan.stage_predicted_s.get(name)
            if old is None:
                continue
            role = plan.placement[name]
            base = c.t_rob[k, si] if role == "robot" else c.t_edge[k, si, 1]
            shift += base * cal.factor(name, role, c.key_k(k)) - old
        return plan.latency_s - plan.residual_s + shift

    def _power_corrected(self, plan: ExecutionPlan) -> float:
        """The plan's predicted energy with each device's power factor as learnt now, without
        its placement's factor (what that factor is learnt against)."""
        if not plan.energy_by_device:
            return plan.energy_j / plan.energy_factor
        power = self.scorer.cal.energy.power_factor
        return sum(j * power(d) for d, j in plan.energy_by_device.items())

    def _watch(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """A request that left the best fixed strategy: its realised actions/J (a fallback's
        included: what the deviation cost is what it cost) against the fixed strategy's
        predicted actions/J at the time."""
        fixed_apj = plan.fixed_actions_per_joule
        if fixed_apj is None or outcome.energy_j is None or outcome.energy_j <= 0:
            return
        try:
            if self.decider.fixed[self.cands.candidate_index(plan)]:
                return  # it ran a fixed strategy: nothing deviated
        except ValueError:  # a plan from another space: not this scheduler's deviation
            return
        self.decider.net.record(self.decider.actions / outcome.energy_j, fixed_apj)

    def _observe_transfer(self, plan: ExecutionPlan, tr: TransferOutcome) -> None:
        """One edge call's time off the edge against the link model (a round trip plus the
        bytes at the estimated bandwidth): what the model misses (encoding, dispatch, decoding)
        is taught half to the boundary into the call's first stage and half to the one out of
        its last, the terms ``Scorer.score`` adds on every cut edge (and on the sensor input
        and the final answer), so every plan that crosses those boundaries is corrected, not
        only the placement that ran."""
        link, sp, cal = self.scorer.last_link, self.cands.space, self.scorer.cal
        names = list(sp.stages)
        if link is None or tr.into not in names or tr.out_of not in names:
            return
        model_s = link.rtt_ms * 1e-3 + (tr.sent_bytes + tr.recv_bytes) / link.bytes_per_s
        i, o = names.index(tr.into), names.index(tr.out_of)
        into = [names[p] for p in sp.parents[i] if plan.placement[names[p]] == "robot"]
        out = [
            names[c]
            for c, ps in enumerate(sp.parents)
            if o in ps and plan.placement[names[c]] == "robot"
        ]
        for parent in into or [INPUT]:
            cal.observe_boundary(parent, tr.into, model_s / 2, tr.seconds / 2)
        for child in out or ([OUTPUT] if o == len(names) - 1 else []):
            cal.observe_boundary(tr.out_of, child, model_s / 2, tr.seconds / 2)

    # -- during: handing the rest of a request to the edge ---------------------------------------

    def handoff(
        self,
        settings: dict | None,
        done: int,
        elapsed_s: float,
        link: Link,
        edge_state: DeviceState | None = None,
    ) -> Handoff | None:
        """Whether the rest of a request now running here should go to the edge after all:
        its plan (at ``settings``, a plan's knobs; None: the identity setting, as when the
        edge was down and nothing was planned) ran or fell back to the robot, its first
        ``done`` stages have run here in ``elapsed_s``, and the link has come back since. The
        robot holds every output made so far, so the edge may take over from any earlier
        stage m <= ``done`` (its stages from m on; the robot's work on m..done-1 is lost):
        each such candidate is scored with its robot part already behind it (the queue and
        the link as they are now), against finishing here.

        A handoff exists to win back the deadline: None while the robot's own rest meets it
        (the plan made for the request stands), and otherwise the edge candidate with the
        earliest finish (plus ``tail_z`` sigma, the prior's where never measured), if that is
        sooner than the robot's finish."""
        scorer, cands, cal = self.scorer, self.cands, self.scorer.cal
        sp = cands.space
        s_n = len(sp.stages)
        if not 0 < done < s_n:
            return None
        k = cands.k_of(settings)

        def candidates(roles: tuple[str, ...]) -> np.ndarray:
            pi = cands.by_roles.get(roles)
            if pi is None:
                return np.zeros(0, dtype=int)
            return np.flatnonzero((cands.k == k) & (cands.p == pi) & cands.allowed)

        local = candidates(("robot",) * s_n)
        if not len(local):
            return None
        sc = scorer.score(link, 0.0, edge_state)
        c_loc = int(local[0])
        # Predicted time of the robot stages before each m (one chain of robot stages).
        before = [0.0] + [float(sc.end[c_loc, m - 1]) for m in range(1, done + 1)]
        local_finish = elapsed_s + float(sc.latency[c_loc]) - before[done]
        if local_finish <= scorer.slo_s:
            return None
        measured = cands.per_placement(lambda roles: cal.measured(tuple(roles)))
        best: Handoff | None = None
        for m in range(done + 1):
            cs = candidates(("robot",) * m + ("edge",) * (s_n - m))
            if not len(cs):
                continue
            at = scorer.score(link, -before[m], edge_state)  # its robot part ends now
            for c in cs:
                rest = float(at.latency[c]) - before[m]
                sigma = value_at(at.sigma, c) if measured[c] else cal.prior_rel * rest
                finish = elapsed_s + rest
                if finish + cal.tail_z * sigma >= local_finish:
                    continue
                if best is None or finish < best.finish_s:
                    roles = sp.roles(cands.p[c])
                    best = Handoff(
                        sp.stages[m], dict(zip(sp.stages, roles, strict=True)), finish, local_finish
                    )
        return best
