"""Scoring: what every candidate plan is predicted to cost, all candidates at once.

A candidate is one (accelerator setting k, placement p) of a ``PlanSpace``, flattened in
meshgrid "ij" order (candidate k * P + p). ``Candidates`` holds that grid and each stage's
modelled cost under each setting (the roofline, rescaled by measured medians where a profile
gave them): what the cost model says before anything ran. ``Scorer`` turns it into
predictions for a link and an edge load: the recursion of ``predictor.py`` vectorised over all
candidates with numpy (start and end of every stage, latency, energy per device), priced by
what the calibration has learnt so far, and each candidate's probability of meeting a
deadline.

It lives apart from the rule (``decision.py``) and from what outcomes teach
(``feedback.py``) because both read it and neither writes it: scoring is a pure function of
the tables, the calibration (``Calibration``, the one learner) and the request's link and load,
so a decision over thousands of plans takes well under a millisecond of Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlarun.sched.calibration import INPUT, OUTPUT, Calibration, on_time_probability
from vlarun.sched.catalog import Device
from vlarun.sched.contract import ExecutionPlan
from vlarun.sched.cost import at_batch, roofline
from vlarun.sched.energy import ENERGY_DEVICES, RadioPower, stage_power
from vlarun.sched.link import Link
from vlarun.sched.plans import PlanSpace
from vlarun.sched.predictor import DeviceState
from vlarun.sched.settings_table import IDENTITY

MAX_EDGE_BATCH = 8


@dataclass
class Scores:
    """Predictions for every candidate (arrays of shape (C,) or (C, S))."""

    latency: np.ndarray
    energy: np.ndarray
    start: np.ndarray
    end: np.ndarray
    sigma: np.ndarray | float = 0.0  # learned latency spread per candidate (0: unmeasured)
    # The model's energy per device before any learnt factor, (C, 2): robot, edge.
    by_device: np.ndarray | None = None


def value_at(x: np.ndarray | float, c: int) -> float:
    """Candidate ``c``'s value of a per-candidate array, or the scalar every candidate shares."""
    return float(x[c]) if isinstance(x, np.ndarray) else float(x)


class Candidates:
    """Every candidate of ``space`` and its stages' modelled cost, before any calibration.

    ``k``, ``p``: each candidate's setting and placement index; ``edge`` (C, S): which of its
    stages run on the edge; ``allowed``: executable and accuracy-eligible. Per (setting, stage):
    ``t_rob`` / ``u_rob`` the robot's seconds and utilisation at batch 1, ``t_edge`` /
    ``u_edge`` / ``e_edge`` the edge's seconds, utilisation and joules per batch size (index b,
    1..``MAX_EDGE_BATCH``), ``in_bytes`` / ``out_bytes`` the packets each stage takes and
    gives."""

    def __init__(
        self,
        space: PlanSpace,
        devices: dict[str, Device],
        dtype: str,
        measured: dict[tuple[str, str], float] | None = None,
    ) -> None:
        self.space, self.devices, self.dtype = space, devices, dtype
        k_n, p_n = len(space.settings), len(space.placements)
        k, p = np.meshgrid(np.arange(k_n), np.arange(p_n), indexing="ij")
        self.k, self.p = k.ravel(), p.ravel()
        self.edge = space.placements[self.p]  # (C, S)
        self.uses_link = self.edge.any(axis=1)  # a candidate with any stage on the edge
        self.allowed = space.executable[self.k, self.p] & space.eligible[self.k]
        # The identity setting's index (-1: none), whose factor is the stage's own.
        ids = [k for k, s in enumerate(space.settings) if all(v == IDENTITY[n] for n, v in s.knobs)]
        self.k0 = ids[0] if ids else 0 if len(space.settings) == 1 else -1
        self._by_settings: dict[tuple, int] | None = None
        # placement roles -> its index in the space (a plan's placement, a handoff's)
        self.by_roles = {tuple(space.roles(pi)): pi for pi in range(len(space.placements))}
        self._tables()
        if measured:
            self._override(measured)

    # -- precomputed per-setting costs -----------------------------------------------------------

    def _tables(self) -> None:
        """Stage seconds, utilisation and packet sizes per (setting, stage), edge per batch."""
        sp, b_n = self.space, MAX_EDGE_BATCH
        k_n, s_n = len(sp.settings), len(sp.stages)
        rob, edge = self.devices["robot"], self.devices["edge"]
        self.t_rob, self.u_rob = np.zeros((k_n, s_n)), np.zeros((k_n, s_n))
        self.t_edge, self.u_edge = np.zeros((k_n, s_n, b_n + 1)), np.zeros((k_n, s_n, b_n + 1))
        self.in_bytes, self.out_bytes = np.zeros((k_n, s_n)), np.zeros((k_n, s_n))
        for ki, works in enumerate(sp.works):
            for si, w in enumerate(works):
                r = roofline(w, rob, self.dtype)
                self.t_rob[ki, si], self.u_rob[ki, si] = r.seconds, r.utilisation
                for b in range(1, b_n + 1):
                    e = roofline(at_batch(w, b), edge, self.dtype)
                    self.t_edge[ki, si, b], self.u_edge[ki, si, b] = e.seconds, e.utilisation
                self.in_bytes[ki, si], self.out_bytes[ki, si] = w.in_bytes, w.out_bytes
        self.p_rob_dyn = stage_power(rob, 1.0) - rob.idle_w
        # Edge energy of one batched execution, per batch size.
        self.e_edge = (edge.idle_w + (edge.busy_w - edge.idle_w) * self.u_edge) * self.t_edge

    def _override(self, measured: dict[tuple[str, str], float]) -> None:
        """Profiled medians (taken on the full model, batch 1) replace the roofline: each
        measured stage rescales that stage on that device for every setting and batch size by
        measured / roofline, so a knob keeps its analytic relative effect on top of the
        measured base time."""
        sp = self.space
        k = next(i for i, g in enumerate(sp.settings) if all(v == IDENTITY[n] for n, v in g.knobs))
        for si, name in enumerate(sp.stages):
            rob = measured.get((name, self.devices["robot"].id))
            if rob is not None:
                self.t_rob[:, si] *= rob / self.t_rob[k, si]
            edge = measured.get((name, self.devices["edge"].id))
            if edge is not None:
                self.t_edge[:, si, 1:] *= edge / self.t_edge[k, si, 1]
        dev = self.devices["edge"]
        self.e_edge = (dev.idle_w + (dev.busy_w - dev.idle_w) * self.u_edge) * self.t_edge

    # -- naming candidates -----------------------------------------------------------------------

    def key_k(self, k: int) -> int | None:
        """A setting index as calibration keys it: None for the identity (the stage factor)."""
        return None if int(k) == self.k0 else int(k)

    def setting_k(self, settings: dict) -> int:
        """The index of the setting whose knobs are ``settings`` (a plan's)."""
        if self._by_settings is None:
            self._by_settings = {
                tuple(sorted(g.as_dict().items())): k for k, g in enumerate(self.space.settings)
            }
        try:
            return self._by_settings[tuple(sorted(settings.items()))]
        except KeyError:
            raise ValueError(f"plan settings {settings} are not in this plan space") from None

    def k_of(self, settings: dict | None) -> int:
        """The index of ``settings`` (None: the identity's, or the one setting there is)."""
        return self.setting_k(settings) if settings is not None else max(self.k0, 0)

    def candidate_index(self, plan: ExecutionPlan) -> int:
        """The candidate (setting, placement) ``plan`` is, for re-scoring it."""
        k = self.setting_k(plan.settings)
        pi = self.by_roles.get(tuple(plan.placement[n] for n in self.space.stages))
        cs = np.flatnonzero((self.k == k) & (self.p == pi))
        if pi is None or not len(cs):
            raise ValueError(f"placement {plan.placement} is not in this plan space")
        return int(cs[0])

    def per_placement(self, fn: Callable[[tuple[str, ...]], Any]) -> np.ndarray:
        """``fn(roles)`` once per placement, spread over that placement's candidates."""
        per_p = np.array([fn(self.space.roles(p)) for p in range(len(self.space.placements))])
        return per_p[self.p]


class Scorer:
    """Predictions for every candidate: ``score`` (latency, energy, stage times) and
    ``on_time_probabilities``, priced by the calibration as it is now."""

    # The spread of a time measured on the device it will run on (a stage's jitter run to run):
    # the prior's width for timed stages, and the least a measured placement is given.
    TIMED_REL = 0.03

    def __init__(
        self, cands: Candidates, slo_s: float, cal: Calibration, radio: RadioPower
    ) -> None:
        self.cands, self.slo_s, self.cal, self.radio = cands, slo_s, cal, radio
        # The control cycle the robot idles through; may exceed slo_s when planning with headroom.
        self.period_s = slo_s
        self.last_link: Link | None = None  # the last scored link (feedback compares transfers)
        self._cache: dict[tuple, np.ndarray] = {}
        self._cache_version = -1

    def score(self, link: Link, now: float = 0.0, edge_state: DeviceState | None = None) -> Scores:
        """The predictor's recursion for every candidate at once."""
        st = edge_state or DeviceState()
        self.last_link = link  # what feedback compares each boundary's transfers with
        c, cal = self.cands, self.cal
        sp, k = c.space, c.k
        c_n, s_n = len(k), len(sp.stages)
        start, end = np.zeros((c_n, s_n)), np.zeros((c_n, s_n))
        energy, edge_j = np.zeros(c_n), np.zeros(c_n)
        bps, half_rtt = link.bytes_per_s, link.rtt_ms * 1e-3 / 2
        res = sorted(st.reservations, key=lambda r: r.start)
        arrive = np.full(c_n, np.inf)  # when each candidate's first edge stage is ready
        weighed = np.zeros((len(res), c_n), dtype=bool)  # slot i already placed around c
        for s, name in enumerate(sp.stages):
            on_edge = c.edge[:, s]
            wire = half_rtt + c.in_bytes[k, s] / bps
            if sp.parents[s]:
                ready = np.full(c_n, now)
                for p in sp.parents[s]:
                    cut = on_edge != c.edge[:, p]
                    tau = np.where(cut, wire + cal.boundary(sp.stages[p], name), 0.0)
                    ready = np.maximum(ready, end[:, p] + tau)
                    energy += np.where(cut, wire * self._radio_w(c.edge[:, p]), 0.0)
            else:  # sensor packet starts on the robot
                ready = now + np.where(on_edge, wire + cal.boundary(INPUT, name), 0.0)
                energy += np.where(on_edge, wire * self.radio.tx_w, 0.0)
            # The robot is this request's own device: a robot stage starts when it is ready.
            # An edge stage also waits for the edge, its queue and committed reservations.
            f_edge = self.factors(name, "edge")  # per candidate: its setting's own
            t_r = c.t_rob[k, s] * self.factors(name, "robot")
            t_e = c.t_edge[k, s, 1] * f_edge * st.slowdown
            s_edge = np.maximum(ready, st.available_at) + st.queued_s.get(name, 0.0)
            arrive = np.where(on_edge & np.isinf(arrive), ready, arrive)
            # When this request reaches the edge is itself a prediction: its 1-sigma error is
            # the cost model's relative one over the time until then (prior_rel). A slot
            # that starts within a few sigma of it may start before or after it: the start
            # expected over that error, not a coin the point forecast calls one way (at edge
            # utilisation 0.8 the hard call was wrong either way by 0.2-0.4 s).
            # A slot weighs on a plan once, at its first edge stage the slot overlaps: it then
            # runs before the request (which waits it out) or after all of it.
            arrive_sd = cal.prior_rel * np.maximum(arrive - now, 0.0)
            for i, r in enumerate(res):
                overlap = (s_edge < r.end) & (s_edge + t_e > r.start) & ~weighed[i]
                # EDF: work not started when this request reaches the edge and due after it
                # runs after it (its slot was placed without this request); work that starts
                # first, or is due first, holds the edge.
                if not overlap.any():
                    continue
                # P(there before the slot starts), for the plans it overlaps that reach the
                # edge by now (the others' edge times are not used)
                first, m = np.zeros(c_n), overlap & np.isfinite(arrive)
                first[m] = on_time_probability(arrive[m], arrive_sd[m], r.start)
                after = first * (r.deadline > now + self.slo_s)
                s_edge = np.where(overlap, after * s_edge + (1.0 - after) * r.end, s_edge)
                weighed[i] |= overlap & on_edge
            # request_energy's edge term: power x calibrated busy time (not the slowed wall).
            e_edge = np.where(on_edge, c.e_edge[k, s, 1] * f_edge, 0.0)
            start[:, s] = np.where(on_edge, s_edge, ready)
            end[:, s] = start[:, s] + np.where(on_edge, t_e, t_r)
            energy += np.where(on_edge, e_edge, c.p_rob_dyn * c.u_rob[k, s] * t_r)
            edge_j += e_edge
        last = s_n - 1
        back_s = half_rtt + c.out_bytes[k, last] / bps + cal.boundary(sp.stages[last], OUTPUT)
        back = np.where(c.edge[:, last], back_s, 0.0)
        energy += back * self.radio.rx_w
        latency = end[:, last] + back - now + self.residuals()
        energy += c.devices["robot"].idle_w * np.maximum(latency, self.period_s)
        by_device = np.stack([energy - edge_j, edge_j], axis=1)
        # Each device's metered power error, then what the model still misses for this kind
        # of plan (the placement's factor, learnt against the power-corrected prediction).
        energy = by_device @ self._power_factors() * self._energy_factors()
        return Scores(latency, energy, start, end, self.sigmas(), by_device)

    def on_time_probabilities(self, sc: Scores, deadline_s: float | None = None) -> np.ndarray:
        """Each candidate's probability of ending by ``deadline_s`` (default ``slo_s``, the
        deadline it plans to): its placement's recorded ratios of measured to predicted time
        applied to its prediction now (without the residual: the ratios were taken against
        predictions without it; ``Calibration.on_time_prob``), blended with a prior that fades
        as the record grows: a normal around the prediction with the residual, of the
        placement's measured spread where it has one (the cost model's ``prior_rel`` where
        not). A setting never timed on a side it uses is a guess of what it saves: its prior
        is the same placement's at full compute (it may save nothing), and its probability
        is at most that."""
        c = self.cands
        deadline = self.slo_s if deadline_s is None else deadline_s
        base = sc.latency - self.residuals()
        measured = c.per_placement(lambda roles: self.cal.measured(tuple(roles)))
        # Never measured end to end: the robot stages timed under the plan's setting (the
        # warm-up's) are known to a few percent, the rest is the cost model's guess.
        known = np.minimum(self.timed_robot_s(), sc.latency)
        guess = self.TIMED_REL * known + self.cal.prior_rel * (sc.latency - known)
        spread = np.where(measured, np.maximum(sc.sigma, self.TIMED_REL * sc.latency), guess)
        prior = on_time_probability(sc.latency, spread, deadline)
        untimed = self.untimed_setting()
        if untimed.any() and c.k0 >= 0:
            # the same placement at the identity setting: candidate k0 * P + p (meshgrid "ij")
            full = sc.latency[c.k0 * len(c.space.placements) + c.p]
            guess = on_time_probability(full, self.cal.prior_rel * full, deadline)
            prior = np.where(untimed, np.minimum(prior, guess), prior)
        out = np.empty(len(c.k))
        for pi in range(len(c.space.placements)):
            cs = c.p == pi
            roles = tuple(c.space.roles(pi))
            out[cs] = self.cal.on_time_prob(roles, base[cs], deadline, prior[cs])
        if untimed.any():
            out = np.where(untimed, np.minimum(out, prior), out)
        return out

    # -- calibrated factors, once per calibration state ------------------------------------------

    def cached(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """``make()`` once per calibration state (``Calibration.factor_version``)."""
        if self._cache_version != self.cal.factor_version:
            self._cache.clear()
            self._cache_version = self.cal.factor_version
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def factors(self, name: str, role: str) -> np.ndarray:
        """Each candidate's calibrated factor for stage ``name`` on ``role``, under its own
        setting (``Calibration.factor``). A decision reads 2 x stages of these."""
        c = self.cands

        def make() -> np.ndarray:
            ks = range(len(c.space.settings))
            return np.array([self.cal.factor(name, role, c.key_k(k)) for k in ks])[c.k]

        return self.cached(("factors", name, role), make)

    def untimed_setting(self) -> np.ndarray:
        """Candidates with a stage whose setting was never timed on the side it runs on: that
        stage's time is the cost model's alone, which can be off by more than a setting saves
        (a GPU at batch 1 saves less time than FLOPs)."""
        return self.cached(("untimed",), self._untimed_setting_now)

    def _untimed_setting_now(self) -> np.ndarray:
        c = self.cands
        k_n = len(c.space.settings)
        out = np.zeros(len(c.k), dtype=bool)
        for si, name in enumerate(c.space.stages):
            for role, on in (("robot", ~c.edge[:, si]), ("edge", c.edge[:, si])):
                timed = np.array(
                    [self.cal.setting_timed(name, role, c.key_k(k)) for k in range(k_n)]
                )
                out |= on & ~timed[c.k]
        return out

    def timed_robot_s(self) -> np.ndarray:
        """Per candidate: the calibrated time of its robot stages that were timed on the robot
        under its own setting (warm-up or outcomes), summed; 0 for a stage never timed so.
        Read by every decision (the prior's spread): computed once per calibration state."""
        return self.cached(("timed robot",), self._timed_robot_s_now)

    def _timed_robot_s_now(self) -> np.ndarray:
        c = self.cands
        ks = range(len(c.space.settings))
        timed = np.array(
            [
                [
                    c.t_rob[k, si] * self.cal.factor(n, "robot", c.key_k(k))
                    if self.cal.setting_timed(n, "robot", c.key_k(k))
                    else 0.0
                    for si, n in enumerate(c.space.stages)
                ]
                for k in ks
            ]
        )  # (K, S)
        return ((~c.edge) * timed[c.k]).sum(axis=1)

    def stage_s(self, k: int, si: int, role: str) -> float:
        """Stage ``si``'s calibrated time at batch 1 under setting ``k`` on ``role``."""
        c = self.cands
        name = c.space.stages[si]
        if role == "edge":
            return float(c.t_edge[k, si, 1] * self.cal.factor(name, "edge", c.key_k(k)))
        return float(c.t_rob[k, si] * self.cal.factor(name, "robot", c.key_k(k)))

    # -- per-placement learnt terms --------------------------------------------------------------

    def _radio_w(self, src_on_edge: np.ndarray) -> np.ndarray:
        return np.where(src_on_edge, self.radio.rx_w, self.radio.tx_w)

    def residuals(self) -> np.ndarray | float:
        """Each candidate's learnt end-to-end residual, by its placement (0 while none)."""
        return self.cands.per_placement(self.cal.residual) if self.cal.residuals else 0.0

    def _power_factors(self) -> np.ndarray:
        """(robot, edge) metered / modelled power (``EnergyCalibration.power_factor``)."""
        return np.array([self.cal.energy.power_factor(d) for d in ENERGY_DEVICES])

    def _energy_factors(self) -> np.ndarray | float:
        """Each candidate's learned realised / predicted energy, by its placement (1.0 while
        nothing was measured)."""
        if not self.cal.energy.factors:
            return 1.0
        return self.cands.per_placement(self.cal.energy.factor)

    def sigmas(self) -> np.ndarray | float:
        """Each candidate's learnt latency spread, by its placement (0 while unmeasured)."""
        return self.cands.per_placement(self.cal.sigma) if self.cal.residuals else 0.0
