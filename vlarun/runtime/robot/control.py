"""Your own robot: actions at the control rate from a policy on this computer, with an edge
server or without one. Any robot loop that can hand over a camera frame (or several), the
robot's state and an instruction, and apply one action per control tick, runs a policy so:

  from vlarun import Policy
  from vlarun.runtime.robot.control import Robot

  with Robot(Policy.load("tiny-ar"), edge="tcp://10.0.0.2:5555", insecure=True,
             control_hz=20) as robot:                  # edge=None: everything on the robot
      robot.warmup(camera(), "open the drawer")
      while running:                                   # your loop, at your control rate
          action = robot.act(camera(), "open the drawer", state=joints())
          arm.apply(action)
          rate.sleep()
      print(robot.summary())

What ``act`` does:
  * it returns the next action of the current chunk. The next chunk is inferred in the
    background, from the observation given at that moment, once the actions still queued
    just cover the expected latency (the last plan's predicted p95, network included;
    ``chunks.ChunkQueue``): inference overlaps execution.
  * with ``rtc=True`` (real-time chunking) the request carries the actions still queued, the
    policy freezes the new chunk's first d to them (d from the plan's p95 and the control
    period), and the new chunk replaces the queue on arrival, aligned to the current tick:
    the seam between chunks stays smooth (``accel/rtc.py``; diffusion, flow and
    autoregressive policies).
    If the queue runs dry the call waits; that wait is a stall, counted in ``stalls``. Under
    asynchronous execution the late chunk then resumes at the current tick (its stale head
    skipped, counted in ``skipped``), never from its start.
  * each inference is one ``RobotAgent.infer``: with an edge, the scheduler places each stage
    on the robot or the edge per request, under the deadline ``slo_s`` (default: one chunk of
    control ticks, horizon / control_hz); an edge that is down, refuses or would make the
    robot miss the deadline is given up on and the rest runs here (the local fallback), and
    later requests stay here until the link monitor hears the edge again.
  * a new instruction, or ``reset()``, starts a new episode: the queue is emptied and the
    accelerator state on both sides is forgotten.

Observations are what ``Policy.predict`` takes: an (H, W, 3) uint8 frame (or one per camera,
in the checkpoint's order), the raw robot state (None when the policy reads none) and the
instruction. Actions are in the policy's robot units (its action statistics), never clipped:
bound them for your robot. A robot wrapped as a gymnasium-style environment (``reset``,
``step``, ``instruction``) runs the same queue and agent in the shared episode loop with
``episode.run_episode(robot.agent, env, seed, control_hz)``, as ``vlarun run-robot`` does on
Meta-World. ``examples/own_robot.py`` runs this module against a local edge.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.robot.agent import AgentConfig, Inference, RobotAgent
from vlarun.runtime.robot.chunks import ChunkQueue
from vlarun.runtime.robot.episode import model_rows, p95_of
from vlarun.runtime.transport import robot_security
from vlarun.sched.records import summarise


class Robot:
    """``policy`` (a Policy or a name for ``Policy.load``) run at ``control_hz`` actions a
    second, with the edge at ``edge`` (a ZeroMQ endpoint; None: robot only).

    slo_s: deadline of one inference (default: horizon / control_hz);
    strategy: ``agent.STRATEGIES`` (vlarun: the scheduler places each request);
    setting: accelerator setting of every request (``AccelSetting`` or its text);
    insecure / server_key / keys: how the link is secured (as ``vlarun run-robot``'s flags);
    asynchronous: False infers only when the chunk is used up (no overlap);
    rtc: real-time chunking (see the module docstring);
    config: an ``AgentConfig`` for everything else (it replaces slo_s, strategy, setting)."""

    def __init__(
        self,
        policy: Policy | str,
        edge: str | None = None,
        *,
        control_hz: float = 20.0,
        slo_s: float | None = None,
        strategy: str = "vlarun",
        setting: AccelSetting | str = "full",
        insecure: bool = False,
        server_key: str | None = None,
        keys: str | None = None,
        asynchronous: bool = True,
        rtc: bool = False,
        config: AgentConfig | None = None,
    ) -> None:
        if control_hz <= 0:
            raise ValueError(f"control_hz must be positive, got {control_hz}")
        policy = Policy.load(policy) if isinstance(policy, str) else policy
        if isinstance(setting, str):
            setting = AccelSetting.parse(setting)
        self.horizon = policy.model.cfg.horizon
        self.tick_s = 1.0 / control_hz
        if config is None:
            slo = slo_s if slo_s is not None else self.horizon * self.tick_s
            config = AgentConfig(slo_s=slo, strategy=strategy, setting=setting, rtc=rtc)
        elif rtc:
            config = dataclasses.replace(config, rtc=True)
        sec = robot_security(insecure, server_key, keys) if edge is not None else None
        self.agent = RobotAgent(policy, config, edge, sec)
        self.asynchronous = asynchronous and self.horizon > 1
        self.inferences: list[Inference] = []  # every inference, all episodes, in order
        self.stalls: list[float] = []  # seconds ``act`` waited for an action, per stall
        self.skipped: list[int] = []  # stale actions dropped from each late chunk
        self._queue: ChunkQueue | None = None
        self._instruction: str | None = None

    @property
    def policy(self) -> Policy:
        return self.agent.policy

    @property
    def edge_up(self) -> bool:
        """Whether the edge answers its health probes now (False without an edge)."""
        return self.agent.edge_up

    def warmup(self, image: np.ndarray, instruction: str) -> None:
        """Run the policy here twice before the first ``act``: one-time allocations, the local
        stage times the scheduler plans with, and the scheduler itself are ready then."""
        self.agent.warmup(image, instruction)

    def act(self, image: np.ndarray | list[np.ndarray], instruction: str, state=None) -> np.ndarray:
        """The action for this control tick (action_dim,) from the current chunk; the next
        chunk is requested from this observation when it is due (see the module docstring)."""
        if instruction != self._instruction or self._queue is None:
            self._new_episode(instruction)
        queue = self._queue
        if queue.needs_refill():
            queue.request({"image": image, "state": state})
        stalls, skipped = len(queue.stalls), len(queue.skipped)
        action = queue.pop()
        self.stalls += queue.stalls[stalls:]
        self.skipped += queue.skipped[skipped:]
        return action

    def reset(self) -> None:
        """End the episode: the next ``act`` starts a new one (fresh queue and hook state)."""
        self._finish()
        self._instruction = None

    def summary(self) -> dict:
        """Latency percentiles, deadlines met, fallbacks, edge requests and modelled energy
        over every inference so far (``sched.records.summarise``), and the stalls."""
        rows = [inf.row() for inf in self.inferences]
        return summarise(rows, self.horizon) | {
            "stalls": len(self.stalls),
            "stall_ms_total": 1e3 * sum(self.stalls),
            "skipped_actions": sum(self.skipped),
        }

    def close(self) -> None:
        self._finish()
        self.agent.close()

    def __enter__(self) -> Robot:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- episodes --------------------------------------------------------------------------------

    def _new_episode(self, instruction: str) -> None:
        self._finish()
        self.agent.reset()  # a new stream of accelerator state on both sides
        self._instruction = instruction
        done: list[Inference] = []

        def infer(obs: dict, prior) -> tuple[np.ndarray, Inference]:
            inf = self.agent.infer(
                obs["image"], instruction, state=obs["state"], seed=len(done), prior=prior
            )
            done.append(inf)
            self.inferences.append(inf)
            return inf.actions, inf

        merge = "switch" if self.agent.cfg.rtc else "append"
        self._queue = ChunkQueue(
            infer,
            self.horizon,
            self.tick_s,
            lead=self.asynchronous,
            merge=merge,
            predict=p95_of,
            model_of=model_rows,
        )

    def _finish(self) -> None:
        """Wait for an inference still in flight (its result is recorded, not executed)."""
        if self._queue is not None:
            self._queue.join()
            self._queue = None
