"""SLO-constrained energy-priority scheduler (EcoVLA), held to an on-time target.

    Core rule:  pi* = argmax_pi  actions_per_joule(pi)   subject to  P(T(pi) > T_SLO) <= a_t
                if no plan fits:  pi* = argmax_pi P(T(pi) <= T_SLO)  (ties: actions per joule)

EcoVLA's rule is "the energy-optimal plan within the SLO-feasible region", with T <= T_SLO.
A deadline met 99% of the time is a share of requests, and devices stall, so here a plan's
chance of meeting the deadline is read from the tail its placement really showed (each
placement's recorded ratios of measured to predicted time, ``Calibration.on_time_prob``,
blended with a prior that fades as the record grows), and ``a_t`` is what the on-time target's
miss budget allows this request (``MissBudget``: 1 - target plus what punctual requests saved,
less what risky ones overspent), so a cheap plan that is late 2% of the time and a punctual one
mix at the target. No decision picks a plan another feasible one beats on both counts.
A safety net keeps the rule from losing to a fixed split: every fixed strategy (device-only,
edge-only, the split after vision, at the identity setting) is a candidate, and the rule
deviates from the best feasible one only when the predicted gain in actions per joule exceeds
the measured energy prediction error (and that one is as punctual); when a window of
deviations realised less than the fixed strategy was predicted to give, it holds to the fixed
strategy for a window (``SafetyNet``). And a placement never run, or a setting never timed, is
tried now and then (bounded exploration, ``_exploration``) when the cost model's own error
could make it feasible and it would save energy, while the miss budget is not in debt:
otherwise a plan the model mis-predicts as too slow would never be run, and so never
corrected.

over every executable, accuracy-eligible candidate (placement x accelerator setting). T_SLO =
chunk / control rate: one inference must deliver its chunk of actions before the previous
chunk runs out. The edge's load comes in as reservations (``DeviceState``): the edge's own
forecast over what is queued and the plans other robots booked (``queue_model``: the one
reservation mechanism, the runtime's edge and the fleet simulator's alike); the scheduler
keeps no ledger of its own.

Scoring is the recursion of ``predictor.py`` vectorised over all candidates with numpy, so a
decision over thousands of plans takes well under a millisecond of Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from vlarun.sched.catalog import Device
from vlarun.sched.contract import ExecutionPlan, Outcome, TransferOutcome
from vlarun.sched.cost import at_batch, roofline
from vlarun.sched.energy import ENERGY_DEVICES, ENERGY_SOURCE, RadioPower, stage_power
from vlarun.sched.link import Link
from vlarun.sched.plans import IDENTITY, PlanSpace
from vlarun.sched.predictor import (
    INPUT,
    OUTPUT,
    Calibration,
    DeviceState,
    on_time_probability,
)
from vlarun.sched.strategy import FIXED, fixed_roles

MAX_EDGE_BATCH = 8
DEFAULT_ON_TIME = 0.99  # the share of requests that must meet the deadline (``--on-time``)


@dataclass
class MissBudget:
    """The on-time target as a budget of misses, tracked over requests (a virtual queue, as in
    drift-plus-penalty control): ``debt`` is the expected misses spent beyond the target rate
    ``rate`` so far (negative: saved). Each decision may risk ``allowance()`` = rate - debt, so a
    plan late 2% of the time is chosen while the savings of punctual requests pay for it, and
    a mix of a cheap risky plan and a punctual one settles at the target on average (the
    two-plan mix a linear program would pick, without drawing lots). What is spent is the
    chosen plan's predicted miss probability; when its outcome is known, ``realised`` weighs
    the surprise (a miss the model gave 0.5% to) into the debt, so a model that learns its
    tail late (no stall seen yet) does not leave the misses it allowed unpaid. (All of the
    surprise, for plans whose probability was a guess, kept a run in debt for ~100 requests
    after one explored plan missed, on a 281 W edge: 0.39x of the robot plan it was learning.)

    The debt is clipped: ``max_debt`` (a run of plans none of which could meet the target
    does not bar risk for ever after) and ``max_saving`` (savings banked through a long
    outage are not spent as a burst of late requests)."""

    rate: float
    realised: float = 0.25
    max_debt: float = 1.0
    max_saving: float = 0.5
    debt: float = 0.0

    def allowance(self) -> float:
        return self.rate - self.debt

    def spend(self, p_miss: float) -> None:
        self._add(p_miss - self.rate)

    def settle(self, p_miss: float, missed: bool) -> None:
        self._add(self.realised * (float(missed) - p_miss))

    def _add(self, x: float) -> None:
        self.debt = min(max(self.debt + x, -self.max_saving), self.max_debt)


@dataclass(frozen=True)
class Handoff:
    """The rest of a request moved to the edge mid-way (``Scheduler.handoff``): the edge takes
    every stage from ``start`` on (``placement``), predicted to finish ``finish_s`` after the
    request began, where finishing on the robot would take until ``local_finish_s``."""

    start: str
    placement: dict[str, str]
    finish_s: float
    local_finish_s: float


@dataclass
class SafetyNet:
    """The evidence the rule needs before it leaves the best fixed strategy.

    ``error`` is the measured relative error of the energy prediction (EWMA of |pred - real| /
    real over requests that ran as planned; the cost model's prior error until one did): a
    predicted gain no larger than it is not evidence. ``window`` holds, for the last requests
    that deviated, (realised actions/J, the fixed strategy's predicted actions/J); once full,
    if the realised sum falls below the fixed one, the rule holds to the fixed strategy for
    ``size`` decisions and the window starts again."""

    error: float
    size: int = 20
    alpha: float = 0.2
    window: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    hold: int = 0

    def learn_error(self, predicted_j: float, realised_j: float) -> None:
        if realised_j > 0:
            rel = abs(predicted_j - realised_j) / realised_j
            self.error = (1 - self.alpha) * self.error + self.alpha * rel

    def record(self, realised_apj: float, fixed_apj: float) -> None:
        self.window.append((realised_apj, fixed_apj))
        if len(self.window) >= self.size:
            realised, fixed = (sum(x) for x in zip(*self.window, strict=True))
            if realised < fixed:
                self.hold = self.size
            self.window.clear()

    def holding(self) -> bool:
        """True (and one decision spent) while a hold lasts."""
        if self.hold > 0:
            self.hold -= 1
            return True
        return False


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


class Scheduler:
    """Scores all candidates of a ``PlanSpace`` and applies the core rule."""

    def __init__(
        self,
        space: PlanSpace,
        devices: dict[str, Device],
        slo_s: float,
        *,
        dtype: str = "bfloat16",
        radio: RadioPower | None = None,
        cal: Calibration | None = None,
        actions: int | None = None,
        measured: dict[tuple[str, str], float] | None = None,
        explore_every: int = 0,
        deadline_s: float | None = None,
        on_time: float = DEFAULT_ON_TIME,
    ) -> None:
        if not 0.0 < on_time <= 1.0:
            raise ValueError(f"the on-time target must lie in (0, 1], got {on_time}")
        self.space, self.devices, self.slo_s, self.dtype = space, devices, slo_s, dtype
        # The share of requests that must meet the deadline, and the miss budget that tracks
        # it (``MissBudget``): what a risky but cheap plan may spend.
        self.target = on_time
        self.budget = MissBudget(1.0 - on_time)
        # Each candidate's on-time probability averaged over recent decisions (``_held``):
        # what it would deliver held for every request, through the link's ups and downs.
        self._held: np.ndarray | None = None
        self._held_n = 0
        # The deadline requests are judged by; ``slo_s`` may plan with headroom below it (the
        # fleet's guard). When no plan is feasible, the plan most likely to meet this one wins.
        self.deadline_s = deadline_s or slo_s
        self.actions = actions or space.actions  # actions executed per inference (the chunk)
        # The control cycle the robot idles through; may exceed slo_s when planning with headroom.
        self.period_s = slo_s
        self.radio, self.cal = radio or RadioPower(), cal or Calibration()
        self._link: Link | None = None  # the last scored link (observe compares transfers)
        # Bounded exploration (``_exploration``): at most one tried plan per this many decisions
        # (0: never, as for a one-shot ``vlarun plan``: exploring needs the outcome fed back).
        self.explore_every = explore_every
        self._since_explore = 0
        self.net = SafetyNet(self.cal.prior_rel)
        k_n, p_n = len(space.settings), len(space.placements)
        k, p = np.meshgrid(np.arange(k_n), np.arange(p_n), indexing="ij")
        self.k, self.p = k.ravel(), p.ravel()
        self.edge = space.placements[self.p]  # (C, S)
        self._uses_link = self.edge.any(axis=1)  # a candidate with any stage on the edge
        self.allowed = space.executable[self.k, self.p] & space.eligible[self.k]
        self._by_settings: dict[tuple, int] | None = None
        self.fixed = self._fixed_mask()  # sets k0, the identity setting's index (-1: none)
        # placement roles -> its index in the space (a plan's placement, a handoff's)
        self._by_roles = {tuple(space.roles(pi)): pi for pi in range(len(space.placements))}
        self._cache: dict[tuple, np.ndarray] = {}
        self._cache_version = -1
        self._tables()
        if measured:
            self._override(measured)

    def _fixed_mask(self) -> np.ndarray:
        """Candidates that are a fixed strategy: device-only, edge-only or the split after the
        first stage, at the identity setting (the space's only setting when it has one)."""
        pl = self.space.placements
        s_n = pl.shape[1]
        patterns = [np.array([r == "edge" for r in fixed_roles(f, s_n)]) for f in FIXED]
        fixed_p = np.array([any((row == pat).all() for pat in patterns) for row in pl])
        ids = [
            k
            for k, s in enumerate(self.space.settings)
            if all(v == IDENTITY[n] for n, v in s.knobs)
        ]
        self.k0 = ids[0] if ids else 0 if len(self.space.settings) == 1 else -1
        return fixed_p[self.p] & (self.k == self.k0)

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

    # -- scoring ---------------------------------------------------------------------------------

    def score(self, link: Link, now: float = 0.0, edge_state: DeviceState | None = None) -> Scores:
        """The predictor's recursion for every candidate at once."""
        st = edge_state or DeviceState()
        self._link = link  # what observe() compares each boundary's transfers with
        sp, cal, k = self.space, self.cal, self.k
        c_n, s_n = len(k), len(sp.stages)
        start, end = np.zeros((c_n, s_n)), np.zeros((c_n, s_n))
        energy, edge_j = np.zeros(c_n), np.zeros(c_n)
        bps, half_rtt = link.bytes_per_s, link.rtt_ms * 1e-3 / 2
        res = sorted(st.reservations, key=lambda r: r.start)
        arrive = np.full(c_n, np.inf)  # when each candidate's first edge stage is ready
        weighed = np.zeros((len(res), c_n), dtype=bool)  # slot i already placed around c
        for s, name in enumerate(sp.stages):
            on_edge = self.edge[:, s]
            wire = half_rtt + self.in_bytes[k, s] / bps
            if sp.parents[s]:
                ready = np.full(c_n, now)
                for p in sp.parents[s]:
                    cut = on_edge != self.edge[:, p]
                    tau = np.where(cut, wire + cal.boundary(sp.stages[p], name), 0.0)
                    ready = np.maximum(ready, end[:, p] + tau)
                    energy += np.where(cut, wire * self._radio_w(self.edge[:, p]), 0.0)
            else:  # sensor packet starts on the robot
                ready = now + np.where(on_edge, wire + cal.boundary(INPUT, name), 0.0)
                energy += np.where(on_edge, wire * self.radio.tx_w, 0.0)
            # The robot is this request's own device: a robot stage starts when it is ready.
            # An edge stage also waits for the edge, its queue and committed reservations.
            f_edge = self._factors(name, "edge")  # per candidate: its setting's own
            t_r = self.t_rob[k, s] * self._factors(name, "robot")
            t_e = self.t_edge[k, s, 1] * f_edge * st.slowdown
            s_edge = np.maximum(ready, st.available_at) + st.queued_s.get(name, 0.0)
            arrive = np.where(on_edge & np.isinf(arrive), ready, arrive)
            # When this request reaches the edge is itself a prediction: its 1-sigma error is
            # the cost model's relative one over the time until then (prior_rel). A slot
            # that starts within a few sigma of it may start before or after it: the start
            # expected over that error, not a coin the point forecast calls one way (at edge
            # utilisation 0.8 the hard call was wrong either way by 0.2-0.4 s).
            # A slot weighs on a plan once, at its first edge stage the slot overlaps: it then
            # runs before the request (which waits it out) or after all of it.
            arrive_sd = self.cal.prior_rel * np.maximum(arrive - now, 0.0)
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
                after = first * (r.due > now + self.slo_s)
                s_edge = np.where(overlap, after * s_edge + (1.0 - after) * r.end, s_edge)
                weighed[i] |= overlap & on_edge
            # request_energy's edge term: power x calibrated busy time (not the slowed wall).
            e_edge = np.where(on_edge, self.e_edge[k, s, 1] * f_edge, 0.0)
            start[:, s] = np.where(on_edge, s_edge, ready)
            end[:, s] = start[:, s] + np.where(on_edge, t_e, t_r)
            energy += np.where(on_edge, e_edge, self.p_rob_dyn * self.u_rob[k, s] * t_r)
            edge_j += e_edge
        last = s_n - 1
        back_s = half_rtt + self.out_bytes[k, last] / bps + cal.boundary(sp.stages[last], OUTPUT)
        back = np.where(self.edge[:, last], back_s, 0.0)
        energy += back * self.radio.rx_w
        latency = end[:, last] + back - now + self._residuals()
        energy += self.devices["robot"].idle_w * np.maximum(latency, self.period_s)
        by_device = np.stack([energy - edge_j, edge_j], axis=1)
        # Each device's metered power error, then what the model still misses for this kind
        # of plan (the placement's factor, learnt against the power-corrected prediction).
        energy = by_device @ self._power_factors() * self._energy_factors()
        return Scores(latency, energy, start, end, self._sigmas(), by_device)

    def _key_k(self, k: int) -> int | None:
        """A setting index as calibration keys it: None for the identity (the stage factor)."""
        return None if int(k) == self.k0 else int(k)

    def _cached(self, key: tuple, make):
        """``make()`` once per calibration state (``Calibration.factor_version``)."""
        if self._cache_version != self.cal.factor_version:
            self._cache.clear()
            self._cache_version = self.cal.factor_version
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _factors(self, name: str, role: str) -> np.ndarray:
        """Each candidate's calibrated factor for stage ``name`` on ``role``, under its own
        setting (``Calibration.factor``)."""

        def make() -> np.ndarray:
            ks = range(len(self.space.settings))
            return np.array([self.cal.factor(name, role, self._key_k(k)) for k in ks])[self.k]

        return self._cached(("factors", name, role), make)

    def _untimed_setting(self) -> np.ndarray:
        return self._cached(("untimed",), self._untimed_setting_now)

    def _untimed_setting_now(self) -> np.ndarray:
        """Candidates with a stage whose setting was never timed on the side it runs on: that
        stage's time is the cost model's alone, which can be off by more than a setting saves
        (a GPU at batch 1 saves less time than FLOPs)."""
        k_n = len(self.space.settings)
        out = np.zeros(len(self.k), dtype=bool)
        for si, name in enumerate(self.space.stages):
            for role, on in (("robot", ~self.edge[:, si]), ("edge", self.edge[:, si])):
                timed = np.array(
                    [self.cal.setting_timed(name, role, self._key_k(k)) for k in range(k_n)]
                )
                out |= on & ~timed[self.k]
        return out

    def prime_setting(self, settings: dict, robot_s: dict[str, float]) -> None:
        """Stage times measured on the robot under the setting ``settings`` (a plan's knobs;
        the warm-up runs every setting the scheduler may choose once), at batch 1."""
        k = self._setting_k(settings)
        for si, name in enumerate(self.space.stages):
            if name in robot_s:
                self.cal.observe_stage(
                    name, "robot", self.t_rob[k, si], robot_s[name], self._key_k(k)
                )

    def _radio_w(self, src_on_edge: np.ndarray) -> np.ndarray:
        return np.where(src_on_edge, self.radio.rx_w, self.radio.tx_w)

    def _per_placement(self, fn) -> np.ndarray:
        per_p = np.array([fn(self.space.roles(p)) for p in range(len(self.space.placements))])
        return per_p[self.p]

    def _residuals(self) -> np.ndarray | float:
        return self._per_placement(self.cal.residual) if self.cal.residuals else 0.0

    def _power_factors(self) -> np.ndarray:
        """(robot, edge) metered / modelled power (``Calibration.power_factor``)."""
        return np.array([self.cal.power_factor(d) for d in ENERGY_DEVICES])

    def _energy_factors(self) -> np.ndarray | float:
        """Each candidate's learned realised / predicted energy, by its placement (1.0 while
        nothing was measured)."""
        if not self.cal.energy_factors:
            return 1.0
        return self._per_placement(self.cal.energy_factor)

    def _sigmas(self) -> np.ndarray | float:
        return self._per_placement(self.cal.sigma) if self.cal.residuals else 0.0

    # -- the rule --------------------------------------------------------------------------------

    def decide(
        self, link: Link, now: float = 0.0, edge_state: DeviceState | None = None, top: int = 5
    ) -> ExecutionPlan:
        """Apply the core rule; raises if no candidate is executable and eligible.

        Feasible: a plan whose predicted probability of missing the deadline
        (``on_time_probabilities``: its own recorded tail, the cost model's prior spread while it
        has none) fits this request's share of the miss budget (``MissBudget``); the most
        actions per joule among them wins, ties to the more punctual. A plan another beats on
        both counts is never chosen: not by the rule, not by the safety net's hold, not by
        exploration."""
        sc = self.score(link, now, edge_state)
        if not self.allowed.any():
            raise ValueError(
                "no executable plan: every placement exceeds a device's memory or dtype support, "
                "or no setting meets the accuracy floor"
            )
        apj = self.actions / sc.energy
        p_on = self.on_time_probabilities(sc)
        # What a request is judged by (the deadline, when planning keeps headroom below it):
        # the fallback's rank and what the miss budget is charged.
        judged = (
            p_on
            if self.deadline_s == self.slo_s
            else self.on_time_probabilities(sc, self.deadline_s)
        )
        # What a plan held steady delivers, by what is known of it: a placement with a record
        # of its own times by that record; one never run by its prediction alone (the prior's
        # 15% spread put an untried 4090 plan at 0.63 in a Wi-Fi dip it rode through on time,
        # and gave up a target its held share of 99.2% reached).
        recorded = self._per_placement(lambda roles: bool(self.cal.tails.get(tuple(roles))))
        reach = self._reach(np.where(recorded, judged, sc.latency <= self.deadline_s))
        allowance = self.budget.allowance()
        feasible = self.allowed & (1.0 - p_on <= allowance + 1e-12)
        fixed = feasible & self.fixed
        anchor = self._best(fixed, apj, p_on) if fixed.any() else None
        held = False
        if feasible.any():
            best = self._best(feasible, apj, p_on)
            # The safety net may hold to the best fixed strategy only where that one is as
            # punctual: holding to a plan the rule's choice beats on both counts is no safety.
            if anchor is not None and best != anchor and p_on[anchor] >= p_on[best]:
                small_gain = apj[best] <= apj[anchor] * (1.0 + self.net.error)
                held = small_gain or self.net.holding()
                best = anchor if held else best
        else:
            best = self._fallback(sc, judged, apj, reach)
        # A try is a guess that may miss: only while the miss budget is not in debt.
        tried = None if held or allowance <= 0 else self._exploration(sc, apj, best, p_on)
        chosen = best if tried is None else tried
        self.budget.spend(1.0 - float(judged[chosen]))
        d = self._decision(chosen, sc, apj, explored=tried is not None, p_on=p_on)
        d = dataclasses.replace(
            d,
            on_time_p=float(judged[chosen]),
            fixed_actions_per_joule=None if anchor is None else float(apj[anchor]),
            held_to_fixed=held,
            miss_allowance=float(allowance),
            on_time_reach=reach,
        )
        alts = self._alternatives(best, sc, apj, feasible, top, p_on)
        return dataclasses.replace(
            d, alternatives=alts, candidates=len(self.k), eligible=int(self.allowed.sum())
        )

    @staticmethod
    def _best(mask: np.ndarray, apj: np.ndarray, p_on: np.ndarray) -> int:
        """The most actions per joule within ``mask``, ties to the most punctual."""
        top = np.where(mask, apj, -np.inf)
        ties = np.flatnonzero(mask & (top >= top.max() * (1.0 - 1e-12)))
        return int(ties[np.argmax(p_on[ties])])

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
        deadline = self.slo_s if deadline_s is None else deadline_s
        base = sc.latency - self._residuals()
        measured = self._per_placement(lambda roles: self.cal.measured(tuple(roles)))
        # Never measured end to end: the robot stages timed under the plan's setting (the
        # warm-up's) are known to a few percent, the rest is the cost model's guess.
        known = np.minimum(self._timed_robot_s(), sc.latency)
        guess = self.TIMED_REL * known + self.cal.prior_rel * (sc.latency - known)
        spread = np.where(measured, np.maximum(sc.sigma, self.TIMED_REL * sc.latency), guess)
        prior = on_time_probability(sc.latency, spread, deadline)
        untimed = self._untimed_setting()
        if untimed.any() and self.k0 >= 0:
            # the same placement at the identity setting: candidate k0 * P + p (meshgrid "ij")
            full = sc.latency[self.k0 * len(self.space.placements) + self.p]
            guess = on_time_probability(full, self.cal.prior_rel * full, deadline)
            prior = np.where(untimed, np.minimum(prior, guess), prior)
        out = np.empty(len(self.k))
        for pi in range(len(self.space.placements)):
            cs = self.p == pi
            roles = tuple(self.space.roles(pi))
            out[cs] = self.cal.on_time_prob(roles, base[cs], deadline, prior[cs])
        if untimed.any():
            out = np.where(untimed, np.minimum(out, prior), out)
        return out

    # The spread of a time measured on the device it will run on (a stage's jitter run to run):
    # the prior's width for timed stages, and the least a measured placement is given.
    TIMED_REL = 0.03

    @staticmethod
    def dominated(mask: np.ndarray, apj: np.ndarray, p_on: np.ndarray) -> np.ndarray:
        """Candidates within ``mask`` that another one within it beats on both counts (at
        least as many actions per joule and at least as punctual, one of them strictly)."""
        idx = np.flatnonzero(mask)
        out = np.zeros(len(apj), dtype=bool)
        if not len(idx):
            return out
        order = idx[np.lexsort((-p_on[idx], -apj[idx]))]  # apj descending, then p_on
        best_p, best_apj = -np.inf, np.inf
        for c in order:
            # every earlier one has apj >= this one's; the best punctuality among them
            if best_p > p_on[c] or (best_p == p_on[c] and best_apj > apj[c]):
                out[c] = True
            if p_on[c] > best_p or (p_on[c] == best_p and apj[c] > best_apj):
                best_p, best_apj = p_on[c], apj[c]
        return out

    def settle(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The miss budget learns whether the request met the deadline it was judged by."""
        if plan.on_time_p is not None:
            missed = outcome.latency_s > self.deadline_s
            self.budget.settle(1.0 - plan.on_time_p, missed)

    # How optimistic exploration may be about a guessed time: this many of the cost model's
    # prior spreads below its prediction (a catalog 1.4x too pessimistic is still tried).
    EXPLORE_Z = 2.0

    def _exploration(self, sc: Scores, apj: np.ndarray, best: int, p_on: np.ndarray) -> int | None:
        """A plan the rule rejected only for want of evidence, or None. A placement never run has
        no learned residual or spread: its latency is the cost model's alone, which is off by
        tens of percent (``Calibration.prior_rel``, one sigma). If it could meet the deadline
        within that spread and would beat the chosen plan's actions per joule, it is tried, at
        most once every ``explore_every`` decisions, so a plan is not held infeasible forever
        because it was never run. What a wrong guess costs is bounded by the runtime (a late
        edge answer is abandoned in time to run the rest locally: deadline + one local run)."""
        self._since_explore += 1
        if not self.explore_every or self._since_explore < self.explore_every:
            return None
        # A robot-only plan whose stages were all timed is known, not a guess: trying it would
        # only miss the deadline its own measured stages already say it misses.
        # A setting never timed on a side it uses is a guess too, on a placement that ran: in a
        # world whose robot saves 87% of a token budget's FLOPs share where the catalog says
        # less, the robot at TRIAGE 34% was never tried and joint ran at 0.25x of it.
        stages = self.space.stages
        untimed = self._untimed_setting()
        unmeasured = ~self._per_placement(lambda roles: self.cal.timed(tuple(roles), stages))
        unmeasured |= untimed
        # Only the guessed part may be off by the prior error: robot stages timed on the robot
        # under the plan's own setting take their measured time (a plan whose timed robot
        # stages alone outlast the deadline is not worth a try, however fast its edge part).
        known = np.minimum(self._timed_robot_s(), sc.latency)
        optimism = max(1.0 - self.EXPLORE_Z * self.cal.prior_rel, 0.0)
        plausible = known + (sc.latency - known) * optimism <= self.slo_s
        cand = self.allowed & unmeasured & plausible & (apj > apj[best])
        cand &= ~self.dominated(self.allowed, apj, p_on)
        if not cand.any():
            return None
        self._since_explore = 0
        return int(np.argmax(np.where(cand, apj, -np.inf)))

    def _timed_robot_s(self) -> np.ndarray:
        """Per candidate: the calibrated time of its robot stages that were timed on the robot
        under its own setting (warm-up or outcomes), summed; 0 for a stage never timed so.
        Read by every decision (the prior's spread): computed once per calibration state."""
        return self._cached(("timed robot",), self._timed_robot_s_now)

    def _timed_robot_s_now(self) -> np.ndarray:
        ks = range(len(self.space.settings))
        timed = np.array(
            [
                [
                    self.t_rob[k, si] * self.cal.factor(n, "robot", self._key_k(k))
                    if self.cal.setting_timed(n, "robot", self._key_k(k))
                    else 0.0
                    for si, n in enumerate(self.space.stages)
                ]
                for k in ks
            ]
        )  # (K, S)
        return ((~self.edge) * timed[self.k]).sum(axis=1)

    # Below this on-time probability a plan counts as sure to miss: the normal tail would
    # otherwise rank a hopeless erratic plan above a hopeless fast one.
    HOPELESS = 0.05

    # How long a candidate's on-time probability is remembered for ``reach`` (an EWMA weight per
    # decision: ~50 requests, about one of a Wi-Fi drive's minute-long cycles, so a dip is
    # averaged in, not taken for the plan's share; 0.005 left 4 cells of 80 short), and how
    # close to the most punctual held plan counts as punctual when the target is out of reach
    # (the issue-61 goal's half point).
    HELD_ALPHA = 0.02
    PUNCTUAL_SLACK = 0.005

    def _reach(self, judged: np.ndarray) -> float:
        """The on-time share the most punctual plan would deliver were it held for every
        request: each candidate's judged probability averaged over recent decisions (a plan
        that is punctual only while the link is good averages its dips in), the best of them.
        No mix of plans drawn at random does better than its best plan; only the per-request
        choice can, and the study that judges it compares with plans held steady."""
        if self._held is None:
            self._held, self._held_n = judged.astype(float), 1
        else:
            # the mean of every decision so far, then a moving one (~1 / HELD_ALPHA decisions)
            self._held_n += 1
            self._held += max(1.0 / self._held_n, self.HELD_ALPHA) * (judged - self._held)
        return float(np.max(np.where(self.allowed, self._steady(judged), 0.0)))

    def _steady(self, judged: np.ndarray) -> np.ndarray:
        """Each candidate's on-time share held steady: a plan that uses the link averages its
        dips (``_held``); one that stays on the robot rides no link, and its probability now
        is its steady share (an average would lag what its tail learnt)."""
        return np.where(self._uses_link, self._held, judged)

    def _fallback(self, sc: Scores, p_on: np.ndarray, apj: np.ndarray, reach: float = 1.0) -> int:
        """No plan fits the miss budget: the one most likely to meet the deadline, ties going
        to the most actions per joule; plans sure to miss it (``HOPELESS``) rank as equal, and
        among them the lowest latency wins (when every plan misses, the fastest is late by the
        least: EcoVLA's argmin T). The probability is each placement's recorded tail
        (fallbacks included: in an overload the model's spread says little of a placement
        whose requests the edge keeps refusing) blended with the model's prior.

        Where the target is out of reach of any plan held steady (``reach`` below it: the
        robot stalls 4% of the time and the edge is punctual only while the link is good),
        the budget stays in debt whatever runs, and the most punctual plan of each moment (a
        300 W edge while the link allows) bought +0.7 points at 0.28x the actions/J of the
        robot plan: then the most actions/J among plans within ``PUNCTUAL_SLACK`` of that
        reach wins instead."""
        p = np.where(self.allowed, p_on, -1.0)
        if p.max() < self.HOPELESS:
            pool = np.flatnonzero(self.allowed)
            return int(pool[np.argmin(sc.latency[pool])])
        if reach < self.target:
            # As punctual as the most punctual plan can be counted on to be, now and steadily
            # (the robot plan's probability now may sit a hair under its own average).
            counted = np.where(self.allowed, np.minimum(p_on, self._steady(p_on)), -1.0)
            near = self.allowed & (p_on >= counted.max() - self.PUNCTUAL_SLACK)
            return self._best(near, apj, p_on)
        # Within half the target's miss rate counts as equally punctual: two plans both ~100%
        # on time differ in their records' last decimals, not in what they deliver, and a
        # budget in debt is paid back by punctual requests, not by the hungriest one.
        tol = max(0.5 * self.budget.rate, 1e-9)
        best = np.flatnonzero(p >= p.max() - tol)
        return int(best[np.argmax(apj[best])])

    def _decision(
        self,
        c: int,
        sc: Scores,
        apj: np.ndarray,
        explored: bool = False,
        p_on: np.ndarray | None = None,
    ) -> ExecutionPlan:
        sp = self.space
        k = int(self.k[c])
        setting = sp.settings[k]
        roles = sp.roles(self.p[c])
        predicted = {
            name: float(self.t_edge[k, s, 1] * self.cal.factor(name, "edge", self._key_k(k)))
            if role == "edge"
            else float(self.t_rob[k, s] * self.cal.factor(name, "robot", self._key_k(k)))
            for s, (name, role) in enumerate(zip(sp.stages, roles, strict=True))
        }
        return ExecutionPlan(
            placement=dict(zip(sp.stages, roles, strict=True)),
            settings=setting.as_dict(),
            relative_success=setting.relative_success,
            latency_s=float(sc.latency[c]),
            residual_s=float(self.cal.residual(tuple(roles))),
            energy_j=float(sc.energy[c]),
            energy_factor=self.cal.energy_factor(tuple(roles)),
            energy_by_device=dict(zip(ENERGY_DEVICES, sc.by_device[c].tolist(), strict=True)),
            power_unmetered=tuple(d for d in dict.fromkeys(roles) if not self.cal.power_metered(d)),
            actions_per_joule=float(apj[c]),
            feasible=bool(p_on[c] >= self.target) if p_on is not None else False,
            on_time_p=None if p_on is None else float(p_on[c]),
            on_time_target=self.target,
            slo_s=self.slo_s,
            stage_start=dict(zip(sp.stages, sc.start[c].tolist(), strict=True)),
            stage_end=dict(zip(sp.stages, sc.end[c].tolist(), strict=True)),
            stage_predicted_s=predicted,
            sigma_s=self._at(sc.sigma, c),
            explored=explored,
        )

    def _alternatives(self, best, sc, apj, feasible, top, p_on) -> list[dict]:
        """The next best feasible plans by actions/J, then the fastest plan if not among them."""
        ranked = np.flatnonzero(feasible)[np.argsort(-apj[feasible], kind="stable")]
        fastest = int(np.argmin(np.where(self.allowed, sc.latency, np.inf)))
        seen, out = {self._key(best)}, []
        for c in [*ranked[: 3 * top].tolist(), fastest]:
            if self._key(c) in seen:
                continue
            if len(out) >= top and c != fastest:
                continue
            seen.add(self._key(c))
            out.append(plan_row(self._decision(c, sc, apj, p_on=p_on)))
        return out

    @staticmethod
    def _at(x, c: int) -> float:
        return float(x[c]) if isinstance(x, np.ndarray) else float(x)

    def _key(self, c: int) -> tuple:
        return (int(self.k[c]), int(self.p[c]))

    # -- the plan contract ------------------------------------------------------------------------

    def setting_index(self, plan: ExecutionPlan) -> int:
        """Which of this scheduler's settings ``plan`` runs (its knobs name it)."""
        return self._setting_k(plan.settings)

    def _setting_k(self, settings: dict) -> int:
        if self._by_settings is None:
            self._by_settings = {
                tuple(sorted(g.as_dict().items())): k for k, g in enumerate(self.space.settings)
            }
        try:
            return self._by_settings[tuple(sorted(settings.items()))]
        except KeyError:
            raise ValueError(f"plan settings {settings} are not in this plan space") from None

    def candidate_index(self, plan: ExecutionPlan) -> int:
        """The candidate (setting, placement) ``plan`` is, for re-scoring it."""
        k = self.setting_index(plan)
        pi = self._by_roles.get(tuple(plan.placement[n] for n in self.space.stages))
        cs = np.flatnonzero((self.k == k) & (self.p == pi))
        if pi is None or not len(cs):
            raise ValueError(f"placement {plan.placement} is not in this plan space")
        return int(cs[0])

    def prime(self, robot_s: dict[str, float], edge_s: dict[str, float]) -> None:
        """Start calibrated from stage times already measured at batch 1 on the identity
        setting (the robot's warm-up runs; the edge's per-stage estimates)."""
        k = self._k_of(None)
        for si, name in enumerate(self.space.stages):
            if name in robot_s:
                self.cal.observe_stage(name, "robot", self.t_rob[k, si], robot_s[name])
            if name in edge_s:
                self.cal.observe_stage(name, "edge", self.t_edge[k, si, 1], edge_s[name])

    def _k_of(self, settings: dict | None) -> int:
        """The index of ``settings`` (None: the identity's, or the one setting there is)."""
        return self._setting_k(settings) if settings is not None else max(self.k0, 0)

    def observe_stages(self, settings: dict | None, stages) -> None:
        """Each stage's measured time (``contract.StageOutcome``s of one request run under
        ``settings``; None: the identity) teaches the factor of the device it ran on, against
        the model's time for that setting at the batch it ran in. What every executed
        request teaches, whoever planned it (a fixed strategy's, an edge-down one's)."""
        k = self._k_of(settings)
        index = {name: si for si, name in enumerate(self.space.stages)}
        for st in stages:
            si = index.get(st.name)
            if si is None:
                continue
            if st.role == "robot":
                base = self.t_rob[k, si]
            else:
                base = self.t_edge[k, si, min(st.batch, MAX_EDGE_BATCH)]
            self.cal.observe_stage(st.name, st.role, base, st.seconds, self._key_k(k))

    def robot_times(self, settings: dict | None = None) -> dict[str, float]:
        """Each stage's calibrated time on the robot at batch 1 under ``settings`` (None: the
        identity), on the named device: the model's time x what the robot's runs of it taught
        (``Calibration.factor``). Only stages the robot has run (or the warm-up timed): a
        stage never timed here has no measured time to stand on."""
        k = self._k_of(settings)
        return {
            # plain floats: these feed JSON records (a numpy scalar made ``late`` a numpy bool)
            name: float(self.t_rob[k, si] * self.cal.factor(name, "robot", self._key_k(k)))
            for si, name in enumerate(self.space.stages)
            if (name, "robot") in self.cal.stage_factor
        }

    def observe(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """The one feedback path: each stage's measured execution time teaches the factor of the
        device it ran on, against the model's time for that setting *at the batch it ran in*
        (a batched execution is compared with the batched prediction, not divided by its size);
        the planned placement's end-to-end latency teaches its residual, but only when the request
        ran as planned: a fallback's latency is the link's (the agent caps the link's estimate
        on a timeout) or the edge admission's, and charging it to the placement barred a
        healthy edge for dozens of decisions after one lost packet."""
        self.observe_stages(plan.settings, outcome.stages)
        for tr in outcome.transfers:
            self._observe_transfer(plan, tr)
        # What ran, ran (a fallback too): each device's metered energy against this
        # scheduler's account of the same execution is that device's power error.
        for device, metered in outcome.energy_by_device.items():
            modelled = outcome.modelled_by_device.get(device, 0.0)
            self.cal.observe_power(device, modelled, metered)
        roles = tuple(plan.placement[n] for n in self.space.stages)
        self.cal.observe_on_time(roles, outcome.latency_s <= self.deadline_s)
        # A link outage ("link: ...": the monitor had the edge down, or no reply came) is the
        # link's, which its monitor and estimate track; charged to the placement's tail it
        # would keep a restored edge looking late. What planning the
        # placement costs while the link is up ("edge: ...": refused, late, or the link too
        # slow for the time left after a stalled robot stage) is its tail.
        if outcome.fallback is None or not outcome.fallback.startswith("link:"):
            self.cal.observe_tail(roles, self._repredicted(plan), outcome.latency_s)
        self.settle(plan, outcome)
        if outcome.fallback is None:
            self.cal.observe_total(roles, plan.latency_s - plan.residual_s, outcome.latency_s)
            if outcome.energy_j is not None:
                self.net.learn_error(plan.energy_j, outcome.energy_j)
                self.cal.observe_energy(roles, self._power_corrected(plan), outcome.energy_j)
        self._watch(plan, outcome)

    def _repredicted(self, plan: ExecutionPlan) -> float:
        """The plan's predicted latency (without the residual) with its stages priced by the
        factors as they are now, after its outcome taught them: the tail then records what the
        stage times the calibration already knows do not explain (a stall, a queue, a
        transfer), not a catalog error corrected since (the first request under a setting
        never timed ran 25% over a guess, and kept a placement 0.79 on time for dozens of
        requests)."""
        k = self._k_of(plan.settings)
        shift = 0.0
        for si, name in enumerate(self.space.stages):
            old = plan.stage_predicted_s.get(name)
            if old is None:
                continue
            role = plan.placement[name]
            base = self.t_rob[k, si] if role == "robot" else self.t_edge[k, si, 1]
            shift += base * self.cal.factor(name, role, self._key_k(k)) - old
        return plan.latency_s - plan.residual_s + shift

    def _power_corrected(self, plan: ExecutionPlan) -> float:
        """The plan's predicted energy with each device's power factor as learnt now, without
        its placement's factor (what that factor is learnt against)."""
        if not plan.energy_by_device:
            return plan.energy_j / plan.energy_factor
        return sum(j * self.cal.power_factor(d) for d, j in plan.energy_by_device.items())

    def _watch(self, plan: ExecutionPlan, outcome: Outcome) -> None:
        """A request that left the best fixed strategy: its realised actions/J (a fallback's
        included: what the deviation cost is what it cost) against the fixed strategy's
        predicted actions/J at the time."""
        fixed_apj = plan.fixed_actions_per_joule
        if fixed_apj is None or outcome.energy_j is None or outcome.energy_j <= 0:
            return
        try:
            if self.fixed[self.candidate_index(plan)]:
                return  # it ran a fixed strategy: nothing deviated
        except ValueError:  # a plan from another space: not this scheduler's deviation
            return
        self.net.record(self.actions / outcome.energy_j, fixed_apj)

    def _observe_transfer(self, plan: ExecutionPlan, tr: TransferOutcome) -> None:
        """One edge call's time off the edge against the link model (a round trip plus the
        bytes at the estimated bandwidth): what the model misses (encoding, dispatch, decoding)
        is taught half to the boundary into the call's first stage and half to the one out of
        its last, the terms ``score`` adds on every cut edge (and on the sensor input and the
        final answer), so every plan that crosses those boundaries is corrected, not only the
        placement that ran."""
        link = self._link
        names = list(self.space.stages)
        if link is None or tr.into not in names or tr.out_of not in names:
            return
        model_s = link.rtt_ms * 1e-3 + (tr.sent_bytes + tr.recv_bytes) / link.bytes_per_s
        i, o = names.index(tr.into), names.index(tr.out_of)
        into = [names[p] for p in self.space.parents[i] if plan.placement[names[p]] == "robot"]
        out = [
            names[c]
            for c, ps in enumerate(self.space.parents)
            if o in ps and plan.placement[names[c]] == "robot"
        ]
        for parent in into or [INPUT]:
            self.cal.observe_boundary(parent, tr.into, model_s / 2, tr.seconds / 2)
        for child in out or ([OUTPUT] if o == len(names) - 1 else []):
            self.cal.observe_boundary(tr.out_of, child, model_s / 2, tr.seconds / 2)

    # -- handing the rest of a request to the edge -----------------------------------------------

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
        sp = self.space
        s_n = len(sp.stages)
        if not 0 < done < s_n:
            return None
        k = self._k_of(settings)

        def candidates(roles: tuple[str, ...]) -> np.ndarray:
            pi = self._by_roles.get(roles)
            if pi is None:
                return np.zeros(0, dtype=int)
            return np.flatnonzero((self.k == k) & (self.p == pi) & self.allowed)

        local = candidates(("robot",) * s_n)
        if not len(local):
            return None
        sc = self.score(link, 0.0, edge_state)
        c_loc = int(local[0])
        # Predicted time of the robot stages before each m (one chain of robot stages).
        before = [0.0] + [float(sc.end[c_loc, m - 1]) for m in range(1, done + 1)]
        local_finish = elapsed_s + float(sc.latency[c_loc]) - before[done]
        if local_finish <= self.slo_s:
            return None
        measured = self._per_placement(lambda roles: self.cal.measured(tuple(roles)))
        best: Handoff | None = None
        for m in range(done + 1):
            cs = candidates(("robot",) * m + ("edge",) * (s_n - m))
            if not len(cs):
                continue
            at = self.score(link, -before[m], edge_state)  # its robot part ends now
            for c in cs:
                rest = float(at.latency[c]) - before[m]
                sigma = self._at(at.sigma, c) if measured[c] else self.cal.prior_rel * rest
                finish = elapsed_s + rest
                if finish + self.cal.tail_z * sigma >= local_finish:
                    continue
                if best is None or finish < best.finish_s:
                    roles = sp.roles(self.p[c])
                    best = Handoff(
                        sp.stages[m], dict(zip(sp.stages, roles, strict=True)), finish, local_finish
                    )
        return best


def plan_row(d: ExecutionPlan) -> dict:
    """A plan as JSON: placement, settings, predicted latency/energy, actions per joule."""
    return {
        "placement": d.placement,
        "settings": d.settings,
        "accuracy_cost_measured": d.relative_success is not None,
        "relative_success": d.relative_success,
        "latency_ms": d.latency_s * 1e3,
        "energy_j": d.energy_j,
        "energy_source": ENERGY_SOURCE,
        # Devices whose power no meter has read: their share of energy_j is the catalog's.
        "power_unmetered": list(d.power_unmetered),
        "actions_per_joule": d.actions_per_joule,
        "feasible": d.feasible,
        "on_time_p": d.on_time_p,
        "explored": d.explored,
    }
