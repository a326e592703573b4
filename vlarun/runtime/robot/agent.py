"""The robot agent: per request plan, execute, learn.

  plan     ``runtime/robot/planner.py``: a ``Plan`` for every request (the scheduler's, or a fixed
           strategy's; the robot-only one while the edge is down);
  execute  ``runtime/robot/executor.py``: robot segments here, edge segments as requests that wait
           no longer than the deadline allows, falling back to here (and handing the rest to
           the edge when the link comes back);
  learn    ``runtime/robot/learner.py``: the link, local stage times, answers, the edge's schedule,
           the energy account, and the plan's outcome for the planner.

``RobotAgent.infer`` is those three steps and the record (``request.Inference.from_run``).

Real-time chunking (``AgentConfig.rtc``): a request made while actions are still queued
(``chunks.Prior``) carries them with d = ceil(p95 / period) from the plan chosen for it
(predicted latency + 1.645 sigma, network included; ``accel.rtc.RTCRequest``), so the head
freezes the new chunk's first d actions to them on whichever side it runs. When the edge fails
and the rest of a request runs here, d is recomputed before the head runs: the time already
spent plus the local stages left (``request.Freeze``).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import zmq

from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.emulate import StageEmulator
from vlarun.runtime.robot import costview
from vlarun.runtime.robot.agent_config import STRATEGIES, AgentConfig
from vlarun.runtime.robot.chunks import Prior
from vlarun.runtime.robot.client import EdgeClient, reply_limits
from vlarun.runtime.robot.executor import Executor
from vlarun.runtime.robot.learner import Learner
from vlarun.runtime.robot.monitor import LinkMonitor
from vlarun.runtime.robot.planner import make_planner
from vlarun.runtime.robot.request import Inference, RequestContext, freeze_for
from vlarun.runtime.transport import Security
from vlarun.stages.families import RTC_FAMILIES, refuse_fast_freeze, rtc_inputs

__all__ = ["STRATEGIES", "AgentConfig", "Inference", "RobotAgent"]


class RobotAgent:
    """Runs ``policy`` on this robot, with the edge at ``edge`` (None: robot only)."""

    def __init__(
        self,
        policy: Policy,
        cfg: AgentConfig | None = None,
        edge: str | None = None,
        sec: Security | None = None,
        ctx: zmq.Context | None = None,
        meter=None,
    ) -> None:
        """``meter``: a ``sched.meters.WindowMeter`` to read instead of ``cfg.meter``'s."""
        self.policy, self.cfg = policy, cfg or AgentConfig()
        family = policy.model.cfg.family
        if self.cfg.rtc and family not in RTC_FAMILIES:
            raise ValueError(
                f"real-time chunking needs a {', '.join(RTC_FAMILIES)} policy, not {family}"
            )
        if self.cfg.rtc:  # before any request, not at the first one that finds a queue
            refuse_fast_freeze(policy.model.cfg)
        from vlarun.sched.meters import window_meter

        self.meter = meter if meter is not None else window_meter(self.cfg.meter)
        self.dtype = "bfloat16" if policy.model.dtype == torch.bfloat16 else "float32"
        # An emulated run's clock is 1 / time_scale slower than the emulated devices': the
        # link's memory and the monitor's intervals stretch with it, as every emulated time.
        emulation = self.cfg.robot.emulation
        stretch = 1.0 if emulation is None else 1.0 / emulation.time_scale
        self.emulator = StageEmulator.build(emulation) if emulation is not None else None
        self.costs = costview.CostView(policy.model.cfg, self.cfg, self.dtype)
        self.learner = Learner(self.cfg, self.costs, stretch)
        self.planner = make_planner(self.cfg.strategy, self.cfg.setting, self.costs, self.cfg.slo_s)
        self._instruction: str | None = None
        client = self.monitor = None
        if edge is not None:
            sec = sec or Security(insecure=True)
            ctx = ctx or zmq.Context.instance()
            client = EdgeClient(edge, sec, ctx, reply_limits(policy, self.emulator))
            self.monitor = LinkMonitor(edge, sec, ctx, clock_scale=stretch)
            self.monitor.start(wait_s=2.0)
        self.executor = Executor(
            policy, self.cfg, self.learner, self.planner, client, self.monitor, self.emulator
        )

    # What the parts hold, under the names callers have always read.
    @property
    def edge_up(self) -> bool:
        return self.executor.edge_up

    @property
    def link(self):
        return self.learner.link

    @property
    def local_s(self) -> dict[str, float]:
        """Each stage's time here (this host's seconds) under the configured setting, for the
        last prompt length planned: what the planner's calibration has learnt (``{}`` before
        any prompt was prepared)."""
        n = self.planner.text_tokens
        return {} if n is None else self.planner.robot_s(n)

    @property
    def stream(self) -> int:
        return self.executor.stream

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.executor.client is not None:
            self.executor.client.close()

    def reset(self) -> None:
        """A new episode: a new stream on the edge and fresh hook state here."""
        self.executor.reset()

    def graph(self, text_tokens: int, setting: AccelSetting | None = None, rtc: bool = False):
        """The stage graph for a prompt of ``text_tokens`` under ``setting`` (default: the
        configured one), bound to this side's hooks for it (``rtc``: its head reads a
        real-time chunk's freeze)."""
        return self.executor.graph(text_tokens, setting or self.cfg.setting, rtc)

    def scheduler(self, text_tokens: int):
        """The scheduler planning prompts of ``text_tokens`` (the scheduled strategies)."""
        health = self.monitor.health if self.monitor is not None else {}
        return self.planner.scheduler(text_tokens, health=health)

    def plan(self, text_tokens: int):
        """This request's ``planner.Plan`` (its edge segments booked on the edge)."""
        edge = self.learner.edge_view(self.monitor)
        if edge.up:  # the planner's own, built once per prompt length (``prepare``)
            self.planner.prepare(text_tokens, health=edge.health)
        plan = self.planner.plan(text_tokens, self.graph(text_tokens), edge, self.link)
        self.executor.book(plan)
        return plan

    # -- before the first request ---------------------------------------------------------------

    def warmup(self, image: np.ndarray, instruction: str, runs: int = 2) -> dict[str, float]:
        """Local runs that time every stage here (the first also makes one-time allocations),
        then ``prepare``: the planner starts primed with the last run's times, which are
        returned (this host's seconds). From there the planner's calibration folds them in
        with every request."""
        state = self._zero_state()
        ids = self.policy.text_ids(instruction, state)
        graph = self.graph(len(ids))
        times: dict[str, float] = {}
        for _ in range(runs):
            pool = dict(self.policy.inputs(image, instruction, state, 0)[0].tensors)
            times = {st.name: self.executor.local(st, pool, {}) for st in graph.stages}
        self.reset()  # the warm-up's hook state is not the episode's
        self.prepare(instruction, times)
        if self.cfg.strategy == "vlarun-joint":
            self.warm_settings(image, instruction)
        return times

    def warm_settings(self, image: np.ndarray, instruction: str) -> None:
        """Time every setting the scheduler may choose on the robot, once (its second step: a
        token policy's first step has nothing to reuse), so the scheduler plans each with what
        it really costs here rather than with what the model says it saves. Settings on the
        edge are planned with slack until their first run there (``Scheduler.decide``)."""
        text_tokens = len(self.policy.text_ids(instruction, self._zero_state()))
        sched = self.scheduler(text_tokens)
        state = self._zero_state()
        for plan_setting in sched.space.settings:
            setting = AccelSetting.from_knobs(plan_setting.as_dict(), self.cfg.setting.token_method)
            if setting.identity:
                continue
            graph = self.graph(text_tokens, setting)
            for _ in range(2):
                pool, times = dict(self.policy.inputs(image, instruction, state, 0)[0].tensors), {}
                for st in graph.stages:
                    times[st.name] = self.executor.local(st, pool, {}, setting)
            self.reset()
            robot = costview.convert(times, self.costs.factors(text_tokens)["robot"])
            sched.prime_setting(plan_setting.as_dict(), robot)

    def prepare(self, instruction: str, robot_s: dict[str, float] | None = None) -> None:
        """Build, before any request, what the first request for ``instruction`` would
        otherwise build inside its deadline: the stage graph, the stand-in factors and the
        planner's own (the scheduler, primed with ``robot_s``: stage times measured here, e.g.
        by ``warmup``, and the edge's health as it is now). Built lazily, this one-time cost
        (tens of ms) would land in the first request's latency, which the scheduler would
        then learn as its placement's residual and spread."""
        n = len(self.policy.text_ids(instruction, self._zero_state()))
        self.graph(n)
        self.costs.factors(n)
        health = self.monitor.health if self.monitor is not None else {}
        self.planner.prepare(n, robot_s, health)

    def _zero_state(self) -> np.ndarray | None:
        """A zero robot state for a policy that reads one (in its prompt, prefix or expert)."""
        size = self.policy.state_size
        return np.zeros(size, dtype=np.float32) if size else None

    # -- one inference: plan, execute, learn ----------------------------------------------------

    def infer(
        self,
        image: np.ndarray,
        instruction: str,
        state=None,
        seed: int = 0,
        prior: Prior | None = None,
    ) -> Inference:
        """One request. ``prior``: what the chunk queue still holds; under ``cfg.rtc`` its
        actions are frozen into the new chunk (module docstring)."""
        t0, t0_wall = time.perf_counter(), time.monotonic()
        reading = self.meter.start() if self.meter is not None else None
        if instruction != self._instruction:  # a new task: hook state of the old one is stale
            self.reset()
            self._instruction = instruction
        self.learner.refresh_link(self.monitor)
        # The policy's own input packet (its resize and state normalisation) and prompt ids.
        packet, ids = self.policy.inputs(image, instruction, state, seed)
        plan = self.plan(len(ids))
        robot_s = self.planner.plan_robot_s(plan) if self.cfg.rtc else {}  # RTC's only
        freeze = freeze_for(
            self.cfg.rtc, prior, plan, robot_s, self.cfg.slo_s, self.policy.model.cfg.horizon
        )
        ctx = RequestContext(
            plan=plan,
            graph=self.graph(len(ids), plan.setting, freeze is not None),
            pool=dict(packet.tensors),
            t0=t0,
            deadline=t0 + self.cfg.slo_s,
            freeze=freeze,
            may_hand_off=self.planner.hands_off and freeze is None and plan.setting.identity,
        )
        if freeze is not None:
            ctx.pool.update(rtc_inputs(self.policy.model.cfg, freeze.rtc))
        self.executor.run(ctx)
        latency = time.perf_counter() - t0
        measured = self.meter.stop(reading) if reading is not None else None
        world = self.costs.world
        inf = Inference.from_run(
            ctx,
            actions=self.policy.unnormalize(ctx.pool["actions"][0]),
            latency_s=latency,
            slo_s=self.cfg.slo_s,
            energy_j=self.learner.energy(ctx, latency),
            started_s=t0_wall,
            measured_robot_j=measured,
            meter=None if self.meter is None else f"{self.meter.meter.name} ({self.meter.how})",
            world=None if world is None else world[0],
        )
        self.learner.learn(self.planner, ctx, inf)
        return inf
