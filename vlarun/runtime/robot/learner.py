"""What the robot learns from its requests, one learner per quantity. This is the file to
change what is learnt from a run.

  link            bandwidth and round trip (``sched.link.Link``): transfers, timeouts' bounds,
                  the monitor's probes;
  answer_s        reading, decoding and checking an answer once on the socket (a slow peak);
  reply_bytes     the last answer's size per edge segment (its way back, priced before sending);
  edge schedule   the edge's committed schedule, the freshest of reply, health and ledger;
  energy          the one account (``costview.CostView.energy``);
  the plan        the planner's (the scheduler's calibration, through ``Planner.learn``),
                  stage times here included: the one learner of how long a stage takes on
                  the robot, which the executor reads back (``Planner.robot_s``) for what it
                  reserves for the stages after an edge segment.
"""

from __future__ import annotations

import dataclasses
import time

from vlarun.runtime.robot import costview
from vlarun.runtime.robot.agent_config import AgentConfig
from vlarun.runtime.robot.client import LinkDown
from vlarun.runtime.robot.monitor import LinkMonitor
from vlarun.runtime.robot.planner import EdgeView, Planner
from vlarun.runtime.robot.request import Inference, RequestContext
from vlarun.sched.link import Link


class Learner:
    """The robot's measurements. ``stretch``: an emulated run's clock is 1 / time_scale slower
    than the emulated devices', so the link's memory stretches with it."""

    def __init__(self, cfg: AgentConfig, costs: costview.CostView, stretch: float = 1.0) -> None:
        self.costs = costs
        self.link = Link(
            cfg.bandwidth_mbps,
            cfg.rtt_ms,
            window_s=Link.window_s * stretch,
            cap_s=Link.cap_s * stretch,
            rtt_window_s=Link.rtt_window_s * stretch,
        )
        self.reply_bytes: dict[tuple[str, ...], int] = {}  # last answer's size per segment
        # Reading, decoding and checking an answer once it is on the socket: a slow peak,
        # decaying 10% per answer (16 agents sharing a core's GIL took up to 37 ms for it).
        self.answer_s = 0.0
        # (when, the edge's schedule then: ``bookings.Slot``s) from the last reply
        self._schedule: tuple[float, tuple] = (0.0, ())

    # -- the link ---------------------------------------------------------------------------

    def refresh_link(self, monitor: LinkMonitor | None) -> None:
        self.link.refresh()  # a timeout's bound expires with time, with or without new samples
        if monitor is not None:
            monitor.feed(self.link)
        # No socket reset when the edge returns: the DEALER reconnects by itself, IMMEDIATE
        # kept nothing queued for the dead link, and late replies are dropped by request id.

    def bound_bandwidth(self, e: LinkDown) -> None:
        """A request that timed out moved its bytes slower than bytes / wait: cap the estimate
        there at once (for ``Link.cap_s`` seconds, or until a faster sample). Without this a
        congested link teaches nothing (no reply, no sample), and every request keeps trying
        it, queueing yet more bytes behind the last."""
        self.link.bound(e.sent_bytes, e.waited_s)

    def observe_reply(self, rep, stages: tuple[str, ...], read_s: float) -> None:
        """An edge answer in: the link (both directions lumped: bytes moved over the time not
        spent computing on the edge), the answer's size and read time, the edge's schedule."""
        self._schedule = (time.monotonic(), rep.schedule)
        self.reply_bytes[stages] = rep.recv_bytes
        self.answer_s = max(read_s, 0.9 * self.answer_s)

    def observe_transfer(self, rep) -> None:
        self.link.observe_transfer(
            rep.sent_bytes + rep.recv_bytes, max(rep.wall_s - rep.server_s, 1e-6)
        )

    def edge_view(self, monitor: LinkMonitor | None) -> EdgeView:
        """The edge now: up or not, its health, and its committed schedule (other robots'
        reservations included) with its age: the freshest of the last reply, the monitor's
        last health reply and the ledger the edge last pushed (``LinkMonitor.ledger``)."""
        if monitor is None:
            return EdgeView(False, {})
        health = monitor.health
        at, schedule = self._schedule
        if monitor.health_at > at and "schedule" in health:
            at, schedule = monitor.health_at, health["schedule"]
        if monitor.ledger_at > at:
            with monitor.lock:
                at, schedule = monitor.ledger_at, monitor.ledger
        up = monitor.up.is_set()
        return EdgeView(up, health, schedule, time.monotonic() - at) if at else EdgeView(up, health)

    # -- one request's outcome ----------------------------------------------------------------

    def energy(self, ctx: RequestContext, latency_s: float) -> float:
        """The request's energy as metered (the world's meter when emulated, else the model);
        both accounts per device stay on the trace for ``learn``."""
        tr = ctx.trace
        tr.energy_metered, tr.energy_modelled = self.costs.energy(
            ctx.text_tokens, tr.ran, tr.stage_s, tr.edge_s, latency_s, tr.wasted_s
        )
        return sum((tr.energy_metered or tr.energy_modelled).values())

    def learn(self, planner: Planner, ctx: RequestContext, inf: Inference) -> None:
        """Teach the planner the request's outcome. A handed-off request did not run its
        plan: its stages and transfers teach, its latency and energy are not the plan's (as
        after a fallback)."""
        tr = ctx.trace
        factors = self.costs.factors(ctx.text_tokens)
        out = costview.outcome(inf, tr.stage_s, tr.batch, factors, tr.transfers)
        if tr.handoff is not None and out.fallback is None:
            out = dataclasses.replace(out, fallback=f"handoff: {tr.handoff}")
        out = dataclasses.replace(
            out, energy_by_device=tr.energy_metered, modelled_by_device=tr.energy_modelled
        )
        planner.learn(ctx.plan, out)
