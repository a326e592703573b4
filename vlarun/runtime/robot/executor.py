"""The robot's executor: runs a plan's segments, robot segments here and edge segments as one
request each, and falls back to running here whenever the edge would make the robot miss its
deadline. This is the file to change how a plan is run.

  1. walk the plan's segments (``sched.execution.segments``): a robot segment runs here; an
     edge segment is one request that waits until  deadline - (local time of the robot
     stages after it) - max(margin, answer read time)  (``sched.execution.give_up_at``, the
     rule the fleet simulator's robot runs too), so that an answer in by then leaves the rest
     time to end by the deadline; a silent edge costs at most the deadline plus one local run
     of the segment;
  2. a dropped link (send refused, or no reply in time) marks the edge down: every later
     request runs here until the background monitor hears the edge again (monitor.py);
  3. while the rest of a request runs here and the link looks back, the planner may hand the
     rest to the edge (``Planner.handoff``), tried once per request.

Accelerator settings run on whichever side each stage runs: the plan's setting becomes hooks
here (``AccelSetting.hooks``) and travels with each edge request (``meta.setting``), where the
edge keeps the same hooks for this robot's stream. Hook state that carries across control
steps (the token policy's KV cache, the Jacobi decoder's generator) lives on the side that last
ran its stage; when a stage moves, its state on the new side is reset first (``meta.fresh`` on
the edge), so a move costs one full recompute, never a reuse of stale state.

A robot slower than this host can be stood in for by a slowdown (``AgentConfig.robot``, a
``runtime.emulate.StandIn``): each local stage sleeps (slowdown - 1) times its measured
duration; an emulation pads each stage to a named device's time for the real model's stage.
"""

from __future__ import annotations

import dataclasses
import secrets
import time

import torch

from vlarun.models.device import settle
from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.emulate import StageEmulator
from vlarun.runtime.robot.agent_config import AgentConfig
from vlarun.runtime.robot.client import EdgeClient, LinkDown, check_packet
from vlarun.runtime.robot.learner import Learner
from vlarun.runtime.robot.monitor import LinkMonitor
from vlarun.runtime.robot.planner import Plan, Planner
from vlarun.runtime.robot.request import RequestContext, Trace
from vlarun.runtime.segments import Segment, segments, wanted
from vlarun.sched.contract import TransferOutcome
from vlarun.sched.execution import give_up_at
from vlarun.sched.scheduler import Handoff
from vlarun.stages.families import RTC_INPUTS
from vlarun.stages.packet import Packet


class Executor:
    """Runs plans for ``policy`` here and on the edge behind ``client`` (None: robot only)."""

    def __init__(
        self,
        policy: Policy,
        cfg: AgentConfig,
        learner: Learner,
        planner: Planner,
        client: EdgeClient | None,
        monitor: LinkMonitor | None,
        emulator: StageEmulator | None,
    ) -> None:
        self.policy, self.cfg, self.learner, self.planner = policy, cfg, learner, planner
        self.client, self.monitor, self.emulator = client, monitor, emulator
        # setting key -> the policy under this side's hooks for it (its graphs, its state)
        self._policies: dict[tuple, Policy] = {}
        self._where: dict[tuple, dict[str, str]] = {}  # setting key -> stateful stage -> side
        self._last_setting: tuple | None = None
        self.stream = secrets.randbits(62)  # this episode's id on the edge

    @property
    def edge_up(self) -> bool:
        return self.monitor is not None and self.monitor.up.is_set()

    def reset(self) -> None:
        """A new episode: a new stream on the edge and fresh hook state here."""
        self.stream = secrets.randbits(62)
        for policy in self._policies.values():
            policy.reset()
        self._where.clear()

    def under(self, setting: AccelSetting) -> Policy:
        """The policy under ``setting`` on this side: exactly the hooks the edge makes from it
        (none for the identity), so a stage computes the same wherever it runs."""
        if setting.key not in self._policies:
            hooks = setting.hooks(self.policy.model.cfg.family, self.policy.calibration)
            self._policies[setting.key] = dataclasses.replace(self.policy, hooks=hooks)
        return self._policies[setting.key]

    def graph(self, text_tokens: int, setting: AccelSetting, rtc: bool = False):
        return self.under(setting).graph(text_tokens, rtc)

    def book(self, plan: Plan) -> None:
        """Announce the plan's edge segments to the edge the moment it is chosen."""
        if not self.edge_up:
            return
        for b in plan.bookings:
            try:
                self.client.book(b)
            except LinkDown:
                return  # the request will find the link down too, and run here

    # -- one plan -------------------------------------------------------------------------------

    def run(self, ctx: RequestContext) -> Trace:
        """Run the plan's segments; after the first edge failure, everything left runs here
        (the freeze refitted first, when the request carries one)."""
        tr, setting = ctx.trace, ctx.plan.setting
        segs = segments(ctx.graph, ctx.plan.placement)
        stateful = setting.stateful_stages(self.policy.model.cfg.family)
        if self._last_setting not in (None, setting.key):  # switched: its old state is stale
            self._where.pop(setting.key, None)
        self._last_setting = setting.key
        where = self._where.setdefault(setting.key, {})
        hooks = self.under(setting).hooks
        for i, seg in enumerate(segs):
            if seg.role == "edge" and tr.fallback is None:
                extra = {}  # the plain path needs no setting, stream or resets
                if not setting.identity:
                    fresh = [
                        stateful[n] for n in seg.stages if n in stateful and where.get(n) != "edge"
                    ]
                    extra = {"setting": setting.to_meta(), "stream": self.stream, "fresh": fresh}
                if self._try_remote(ctx, ctx.plan.placement, segs, i, extra):
                    continue
            if ctx.freeze is not None and tr.fallback is not None:
                left = self._local_left_s(ctx, (n for later in segs[i:] for n in later.stages))
                ctx.freeze.refit(ctx.pool, ctx.t0, left)
            for name in seg.stages:
                if ctx.may_hand_off and tr.ran and self._rest_here(segs, i, tr):
                    h = self._ask_handoff(ctx)  # at every boundary, until one is tried
                    if h is not None:
                        ctx.may_hand_off = False
                        if self._hand_off(ctx, h):
                            break
                if name in stateful and where.get(name) != "robot":
                    hooks.reset(stateful[name])  # its state here is stale (or none yet)
                tr.stage_s[name] = self.local(ctx.graph.stage(name), ctx.pool, tr.ran, setting)
            if tr.handoff is not None:
                break
        for name in stateful:
            if name in tr.ran:
                where[name] = tr.ran[name]
        return tr

    def _local_left_s(self, ctx: RequestContext, stages) -> float:
        """How long ``stages`` take here under the request's setting, as the planner's
        calibration has learnt (0 for a stage never timed here)."""
        robot = self.planner.plan_robot_s(ctx.plan)
        return sum(robot.get(n, 0.0) for n in stages)

    @staticmethod
    def _rest_here(segs: list[Segment], i: int, tr: Trace) -> bool:
        """Whether everything from segment ``i`` on runs here: the plan's own robot segments
        to the end, or a fallback."""
        if any(role != "robot" for role in tr.ran.values()):
            return False  # the edge already took part: not a request running here
        return tr.fallback is not None or all(s.role == "robot" for s in segs[i:])

    def _ask_handoff(self, ctx: RequestContext) -> Handoff | None:
        if not self.edge_up:
            return None
        self.learner.refresh_link(self.monitor)
        elapsed = time.perf_counter() - ctx.t0
        edge = self.learner.edge_view(self.monitor)
        return self.planner.handoff(ctx.plan, len(ctx.trace.ran), elapsed, self.learner.link, edge)

    def _hand_off(self, ctx: RequestContext, h: Handoff) -> bool:
        """Send the rest of a request running here to the edge (``h``: from ``h.start`` on,
        as an edge request like any other, waited for until the deadline); False, with every
        stage run here kept, if the edge does not answer in time."""
        tr = ctx.trace
        segs = segments(ctx.graph, h.placement)
        i = next(k for k, s in enumerate(segs) if s.role == "edge")
        order = list(tr.ran)
        redo = {n: tr.stage_s.pop(n) for n in segs[i].stages if tr.ran.get(n) == "robot"}
        for n in redo:
            del tr.ran[n]
        fallback, tr.fallback = tr.fallback, None
        if self._try_remote(ctx, h.placement, segs, i, {}):
            tr.fallback = fallback
            tr.wasted_s.update(redo)
            tr.handoff = (
                f"{'+'.join(segs[i].stages)} to the edge at "
                f"{1e3 * (h.local_finish_s - h.finish_s):.0f} ms predicted gain"
            )
            return True
        tr.stage_s.update(redo)
        tr.ran = {n: "robot" for n in order}
        return False

    # -- one stage here, one segment there ---------------------------------------------------------

    def local(self, stage, pool: dict, ran: dict, setting: AccelSetting | None = None) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = stage(Packet({s.name: pool[s.name] for s in stage.inputs}))
        settle(out.tensors)
        own = time.perf_counter() - start
        if self.cfg.robot.slowdown > 1:  # stand in for a slower robot computer
            time.sleep(own * (self.cfg.robot.slowdown - 1))
        if self.emulator is not None:  # stand in for a named device running the real model
            knobs = None if setting is None or setting.identity else setting.knobs()
            self.emulator.pad(stage.name, start, knobs=knobs)
        seconds = time.perf_counter() - start
        pool.update(out.tensors)
        ran[stage.name] = "robot"
        return seconds

    def _try_remote(
        self, ctx: RequestContext, placement: dict, segs: list[Segment], i: int, extra: dict
    ) -> bool:
        """One edge segment into the pool; False (with the reason in the trace) to run it
        here. ``extra``: the setting's part of the request meta (setting, stream, fresh)."""
        tr = ctx.trace
        if not self.edge_up:
            tr.fallback = "link: edge down"
            return False
        try:
            rep = self._remote(ctx, placement, segs[i], segs[i:], extra)
        except LinkDown as e:
            tr.fallback = f"link: {e}"
            self.monitor.mark_down()
            self.learner.bound_bandwidth(e)
            # Abandon the transfer: a fresh socket drops the request's bytes still queued for
            # the link, which would otherwise delay every later request (and a restored link's
            # first) behind megabytes nobody waits for. Its late reply could not be used anyway.
            self.client.reset()
            return False
        except RuntimeError as e:  # the edge refused, ran out of time, or answered nonsense
            tr.fallback = f"edge: {e}"
            return False
        ctx.pool.update(rep.packet.tensors)  # checked in _remote: names, shapes, finite values
        tr.late_edge = tr.late_edge or rep.late
        if not rep.late and tr.edge_at is None:
            tr.edge_at = time.monotonic() - rep.wall_s
        for t in rep.timings:
            tr.ran[t.stage] = "edge"
            # Energy: this request's share of the batch; calibration: the execution itself.
            tr.edge_s[t.stage] = t.share_s
            tr.stage_s[t.stage] = t.compute_s
            tr.batch[t.stage] = t.batch
        tr.overheads_ms.append((rep.wall_s - rep.server_s) * 1e3)
        seg = segs[i].stages
        tr.transfers.append(
            TransferOutcome(
                seg[0], seg[-1], max(rep.wall_s - rep.server_s, 0.0), rep.sent_bytes, rep.recv_bytes
            )
        )
        tr.sent += rep.sent_bytes
        self.learner.observe_transfer(rep)
        return True

    def _remote(
        self, ctx: RequestContext, placement: dict, seg: Segment, rest: list[Segment], extra: dict
    ):
        """One edge segment, waited for no longer than the robot stages after it allow.

        The robot waits until the deadline less the local time of the robot segments that
        follow and the time it takes to read and check an answer (its recent slow peak, at
        least ``margin_s``); the edge gets that wait less the packet's way there and the
        answer's way back as its own deadline, so an answer it sends arrives in time to finish
        the request by the deadline, and work it could only finish later is refused there
        (``RuntimeError``) instead of being done for nothing. A silent edge costs at most the
        deadline plus one local run of this segment. An answer that reached the socket too
        late for the robot stages after it to end by the deadline is recorded as late
        (``Inference.late_edge``), never as an edge answer in time; one in time that the
        robot's own reading or later stages make late is the robot's lateness."""
        learner, graph, pool = self.learner, ctx.graph, ctx.pool
        now = time.perf_counter()
        later = self._local_left_s(
            ctx, (n for s in rest[1:] if s.role == "robot" for n in s.stages)
        )
        wait = give_up_at(ctx.deadline, later, self.cfg.margin_s, learner.answer_s) - now
        if wait <= 0:
            raise RuntimeError("no time left for the edge")
        want = wanted(graph, placement, seg)
        packet = Packet({n: pool[n] for n in seg.needs})
        emu = self.emulator  # an emulated robot sends the real model's packet size
        pad = 0 if emu is None else emu.pad_bytes(seg.stages, "in", packet.nbytes)
        up = learner.link.transfer_s(packet.nbytes + pad)
        down = learner.link.transfer_s(learner.reply_bytes.get(seg.stages, 0))
        budget = wait - up - down
        if budget <= 0:
            raise RuntimeError("the link leaves the edge no time")
        meta = {"batch": 1, "text_tokens": ctx.text_tokens, **extra}
        if any(n in RTC_INPUTS for n in seg.needs):  # the head runs there: it freezes there
            meta["rtc"] = True
        self.monitor.last_remote = time.monotonic()
        rep = self.client.run(seg.stages, packet, want, budget, wait, meta, self.cfg.codec, pad)
        # Nothing from the edge reaches the pool (and the robot) unchecked: a wrong name,
        # shape or a NaN is a fallback here, never an action. Accelerated streams may change
        # intermediate sizes, so their shapes are checked by rank and batch only.
        specs = {s.name: s for st in graph.stages for s in st.outputs if s.name in want}
        exact = not extra or want == tuple(s.name for s in graph.stages[-1].outputs)
        check_packet(rep.packet, specs, exact)
        learner.observe_reply(rep, seg.stages, time.perf_counter() - rep.arrived_s)
        rep.late = rep.arrived_s + later > ctx.deadline
        return rep
