"""The decision rule: which scored candidate a request runs, held to an on-time target.

    pi* = argmax_pi  actions_per_joule(pi)   subject to  P(T(pi) > T_SLO) <= a_t
    if no plan fits:  pi* = argmax_pi P(T(pi) <= T_SLO)  (ties: actions per joule)

``a_t`` is what the miss budget (``MissBudget``) allows this request. The rule never picks a
plan another feasible one beats on both counts (``dominated``); it leaves the best fixed
strategy only on evidence (``SafetyNet``); it tries a plan the cost model may mis-predict as
too slow now and then (``Decider._exploration``); and where no plan fits it takes the most
punctual one, or the most efficient among the punctual when the target is out of reach of any
plan held steady (``Decider._fallback``).

It lives apart from scoring (``scoring.py``), which it only reads, so that the rule reads
top to bottom as the choice it is; what an outcome teaches the budget and the safety net
is ``feedback.py``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from vlarun.sched.contract import ExecutionPlan
from vlarun.sched.energy import ENERGY_DEVICES, ENERGY_SOURCE
from vlarun.sched.link import Link
from vlarun.sched.predictor import DeviceState
from vlarun.sched.scoring import Candidates, Scorer, Scores, value_at
from vlarun.sched.strategy import FIXED, fixed_roles


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


def fixed_mask(cands: Candidates) -> np.ndarray:
    """Candidates that are a fixed strategy: device-only, edge-only or the split after the
    first stage, at the identity setting (the space's only setting when it has one)."""
    pl = cands.space.placements
    s_n = pl.shape[1]
    patterns = [np.array([r == "edge" for r in fixed_roles(f, s_n)]) for f in FIXED]
    fixed_p = np.array([any((row == pat).all() for pat in patterns) for row in pl])
    return fixed_p[cands.p] & (cands.k == cands.k0)


def best(mask: np.ndarray, apj: np.ndarray, p_on: np.ndarray) -> int:
    """The most actions per joule within ``mask``, ties to the most punctual."""
    top = np.where(mask, apj, -np.inf)
    ties = np.flatnonzero(mask & (top >= top.max() * (1.0 - 1e-12)))
    return int(ties[np.argmax(p_on[ties])])


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


class Decider:
    """The core rule over a ``Scorer``'s candidates, and the state it keeps between requests:
    the miss budget, the safety net, exploration's pace and each plan's held on-time share."""

    # How optimistic exploration may be about a guessed time: this many of the cost model's
    # prior spreads below its prediction (a catalog 1.4x too pessimistic is still tried).
    EXPLORE_Z = 2.0

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

    def __init__(
        self,
        scorer: Scorer,
        *,
        actions: int,
        deadline_s: float,
        on_time: float,
        explore_every: int = 0,
    ) -> None:
        self.scorer, self.cands = scorer, scorer.cands
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
        self.deadline_s = deadline_s
        self.actions = actions  # actions executed per inference (the chunk)
        # Bounded exploration (``_exploration``): at most one tried plan per this many decisions
        # (0: never, as for a one-shot ``vlarun plan``: exploring needs the outcome fed back).
        self.explore_every = explore_every
        self._since_explore = 0
        self.net = SafetyNet(scorer.cal.prior_rel)
        self.fixed = fixed_mask(self.cands)

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
        scorer, c = self.scorer, self.cands
        sc = scorer.score(link, now, edge_state)
        if not c.allowed.any():
            raise ValueError(
                "no executable plan: every placement exceeds a device's memory or dtype support, "
                "or no setting meets the accuracy floor"
            )
        apj = self.actions / sc.energy
        p_on = scorer.on_time_probabilities(sc)
        # What a request is judged by (the deadline, when planning keeps headroom below it):
        # the fallback's rank and what the miss budget is charged.
        judged = (
            p_on
            if self.deadline_s == scorer.slo_s
            else scorer.on_time_probabilities(sc, self.deadline_s)
        )
        # What a plan held steady delivers, by what is known of it: a placement with a record
        # of its own times by that record; one never run by its prediction alone (the prior's
        # 15% spread put an untried 4090 plan at 0.63 in a Wi-Fi dip it rode through on time,
        # and gave up a target its held share of 99.2% reached).
        recorded = c.per_placement(lambda roles: bool(scorer.cal.tails.get(tuple(roles))))
        reach = self._reach(np.where(recorded, judged, sc.latency <= self.deadline_s))
        allowance = self.budget.allowance()
        feasible = c.allowed & (1.0 - p_on <= allowance + 1e-12)
        fixed = feasible & self.fixed
        anchor = best(fixed, apj, p_on) if fixed.any() else None
        held = False
        if feasible.any():
            chosen = best(feasible, apj, p_on)
            # The safety net may hold to the best fixed strategy only where that one is as
            # punctual: holding to a plan the rule's choice beats on both counts is no safety.
            if anchor is not None and chosen != anchor and p_on[anchor] >= p_on[chosen]:
                small_gain = apj[chosen] <= apj[anchor] * (1.0 + self.net.error)
                held = small_gain or self.net.holding()
                chosen = anchor if held else chosen
        else:
            chosen = self._fallback(sc, judged, apj, reach)
        # A try is a guess that may miss: only while the miss budget is not in debt.
        tried = None if held or allowance <= 0 else self._exploration(sc, apj, chosen, p_on)
        run = chosen if tried is None else tried
        self.budget.spend(1.0 - float(judged[run]))
        d = self.plan(run, sc, apj, explored=tried is not None, p_on=p_on)
        d = dataclasses.replace(
            d,
            on_time_p=float(judged[run]),
            fixed_actions_per_joule=None if anchor is None else float(apj[anchor]),
            held_to_fixed=held,
            miss_allowance=float(allowance),
            on_time_reach=reach,
        )
        alts = self._alternatives(chosen, sc, apj, feasible, top, p_on)
        return dataclasses.replace(
            d, alternatives=alts, candidates=len(c.k), eligible=int(c.allowed.sum())
        )

    def _exploration(
        self, sc: Scores, apj: np.ndarray, chosen: int, p_on: np.ndarray
    ) -> int | None:
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
        scorer, c, cal = self.scorer, self.cands, self.scorer.cal
        # A robot-only plan whose stages were all timed is known, not a guess: trying it would
        # only miss the deadline its own measured stages already say it misses.
        # A setting never timed on a side it uses is a guess too, on a placement that ran: in a
        # world whose robot saves 87% of a token budget's FLOPs share where the catalog says
        # less, the robot at TRIAGE 34% was never tried and joint ran at 0.25x of it.
        stages = c.space.stages
        untimed = scorer.untimed_setting()
        unmeasured = ~c.per_placement(lambda roles: cal.timed(tuple(roles), stages))
        unmeasured |= untimed
        # Only the guessed part may be off by the prior error: robot stages timed on the robot
        # under the plan's own setting take their measured time (a plan whose timed robot
        # stages alone outlast the deadline is not worth a try, however fast its edge part).
        known = np.minimum(scorer.timed_robot_s(), sc.latency)
        optimism = max(1.0 - self.EXPLORE_Z * cal.prior_rel, 0.0)
        plausible = known + (sc.latency - known) * optimism <= scorer.slo_s
        cand = c.allowed & unmeasured & plausible & (apj > apj[chosen])
        cand &= ~dominated(c.allowed, apj, p_on)
        if not cand.any():
            return None
        self._since_explore = 0
        return int(np.argmax(np.where(cand, apj, -np.inf)))

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
        return float(np.max(np.where(self.cands.allowed, self._steady(judged), 0.0)))

    def _steady(self, judged: np.ndarray) -> np.ndarray:
        """Each candidate's on-time share held steady: a plan that uses the link averages its
        dips (``_held``); one that stays on the robot rides no link, and its probability now
        is its steady share (an average would lag what its tail learnt)."""
        return np.where(self.cands.uses_link, self._held, judged)

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
        allowed = self.cands.allowed
        p = np.where(allowed, p_on, -1.0)
        if p.max() < self.HOPELESS:
            pool = np.flatnonzero(allowed)
            return int(pool[np.argmin(sc.latency[pool])])
        if reach < self.target:
            # As punctual as the most punctual plan can be counted on to be, now and steadily
            # (the robot plan's probability now may sit a hair under its own average).
            counted = np.where(allowed, np.minimum(p_on, self._steady(p_on)), -1.0)
            near = allowed & (p_on >= counted.max() - self.PUNCTUAL_SLACK)
            return best(near, apj, p_on)
        # Within half the target's miss rate counts as equally punctual: two plans both ~100%
        # on time differ in their records' last decimals, not in what they deliver, and a
        # budget in debt is paid back by punctual requests, not by the hungriest one.
        tol = max(0.5 * self.budget.rate, 1e-9)
        top = np.flatnonzero(p >= p.max() - tol)
        return int(top[np.argmax(apj[top])])

    def plan(
        self,
        c: int,
        sc: Scores,
        apj: np.ndarray,
        explored: bool = False,
        p_on: np.ndarray | None = None,
    ) -> ExecutionPlan:
        """Candidate ``c`` as the plan contract: what runs where, and what it is predicted to
        cost (each stage's calibrated time at batch 1, the executor's budget per stage)."""
        scorer, sp, cal = self.scorer, self.cands.space, self.scorer.cal
        k = int(self.cands.k[c])
        setting = sp.settings[k]
        roles = sp.roles(self.cands.p[c])
        predicted = {
            name: scorer.stage_s(k, s, role)
            for s, (name, role) in enumerate(zip(sp.stages, roles, strict=True))
        }
        return ExecutionPlan(
            placement=dict(zip(sp.stages, roles, strict=True)),
            settings=setting.as_dict(),
            relative_success=setting.relative_success,
            latency_s=float(sc.latency[c]),
            residual_s=float(cal.residual(tuple(roles))),
            energy_j=float(sc.energy[c]),
            energy_factor=cal.energy.factor(tuple(roles)),
            energy_by_device=dict(zip(ENERGY_DEVICES, sc.by_device[c].tolist(), strict=True)),
            power_unmetered=tuple(d for d in dict.fromkeys(roles) if not cal.energy.metered(d)),
            actions_per_joule=float(apj[c]),
            feasible=bool(p_on[c] >= self.target) if p_on is not None else False,
            on_time_p=None if p_on is None else float(p_on[c]),
            on_time_target=self.target,
            slo_s=scorer.slo_s,
            stage_start=dict(zip(sp.stages, sc.start[c].tolist(), strict=True)),
            stage_end=dict(zip(sp.stages, sc.end[c].tolist(), strict=True)),
            stage_predicted_s=predicted,
            sigma_s=value_at(sc.sigma, c),
            explored=explored,
        )

    def _alternatives(
        self,
        chosen: int,
        sc: Scores,
        apj: np.ndarray,
        feasible: np.ndarray,
        top: int,
        p_on: np.ndarray,
    ) -> list[dict]:
        """The next best feasible plans by actions/J, then the fastest plan if not among them."""
        ranked = np.flatnonzero(feasible)[np.argsort(-apj[feasible], kind="stable")]
        fastest = int(np.argmin(np.where(self.cands.allowed, sc.latency, np.inf)))
        seen, out = {self._key(chosen)}, []
        for c in [*ranked[: 3 * top].tolist(), fastest]:
            if self._key(c) in seen:
                continue
            if len(out) >= top and c != fastest:
                continue
            seen.add(self._key(c))
            out.append(plan_row(self.plan(c, sc, apj, p_on=p_on)))
        return out

    def _key(self, c: int) -> tuple[int, int]:
        return (int(self.cands.k[c]), int(self.cands.p[c]))


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
