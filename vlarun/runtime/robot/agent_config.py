"""How the robot runs its policy (``AgentConfig``): the deadline, the strategy, what each
side's computer stands for, the accelerator setting and what the planner may choose among.
Its own file so that every part of the robot's room (agent, executor, learner, cost view)
types its ``cfg`` without importing the agent."""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.policy.setting import AccelSetting
from vlarun.runtime.emulate import StandIn
from vlarun.sched.execution import GIVE_UP_MARGIN_S
from vlarun.sched.plans import DEFAULT_FLOOR
from vlarun.sched.scheduler import DEFAULT_ON_TIME
from vlarun.sched.strategy import ALIASES, canonical
from vlarun.sched.strategy import STRATEGIES as ALL_STRATEGIES
from vlarun.stages.wire import Codec

# Every name sched.strategy knows, its aliases included ("vlarun" is vlarun-placement).
STRATEGIES = (*ALIASES, *ALL_STRATEGIES)


@dataclass(frozen=True)
class AgentConfig:
    """How the robot runs its policy. ``slo_s``: deadline of one inference (chunk / control
    rate); ``margin_s``: kept in hand when deciding to give up on the edge; ``setting``: the
    accelerator setting every request runs (the scheduler plans its placement under it)."""

    slo_s: float = 0.5
    strategy: str = "vlarun"
    codec: Codec = Codec()
    margin_s: float = GIVE_UP_MARGIN_S
    # What this host stands for on each side (runtime.emulate.StandIn): itself, a catalog
    # device its times are converted to, a slower robot (sleeps), or an emulated device (each
    # stage padded to the real model's time there; the edge server pads its side by its own
    # ServerConfig.emulate). With emulations the plan is costed for the real model on both.
    robot: StandIn = StandIn()
    edge: StandIn = StandIn()
    bandwidth_mbps: float = 1000.0  # initial link estimate; measured transfers refine it
    rtt_ms: float = 1.0
    setting: AccelSetting = AccelSetting()
    # vlarun-joint: the settings table the plan space reads (None: the shipped one) and the
    # accuracy floor the 95% lower bound of its settings' measured success must clear (a
    # number, plans.NO_LOSS, or "none").
    settings_file: str | None = None
    accuracy_floor: float | str = DEFAULT_FLOOR
    # With ``emulate``: the table's accuracy costs, measured on the shipped deep policies, are
    # carried to the emulated model as a proxy (its plan space's notes say so; no real-size
    # model was run for them). False: only rows that name the emulated model count.
    settings_proxy: bool = False
    # A power meter on the robot (RAPL, NVML, Jetson INA rails) read around every request:
    # "auto" (the first readable one; none on a machine without), "none", or its name.
    meter: str = "auto"
    # Real-time chunking: each request freezes its chunk's first d actions to the ones still
    # queued, d from the executed plan's p95 latency and the control period (module docstring).
    rtc: bool = False
    # The share of requests the planner holds to the deadline (``scheduler.MissBudget``).
    on_time: float = DEFAULT_ON_TIME

    def __post_init__(self) -> None:
        if not 0 < self.on_time <= 1:
            raise ValueError(f"on_time must lie in (0, 1], got {self.on_time}")
        if self.edge.slowdown > 1:
            raise ValueError("a slowdown stands in for the robot; the edge takes a device")
        a, b = self.robot.emulation, self.edge.emulation
        if (a is None) != (b is None):
            raise ValueError("emulate the robot and the edge together, or neither")
        if a is not None and b is not None:
            if a.model != b.model or a.time_scale != b.time_scale:
                raise ValueError(
                    f"robot and edge emulate one model at one time scale, got {a.model} x"
                    f"{a.time_scale:g} and {b.model} x{b.time_scale:g}"
                )
            if a.world != b.world:
                raise ValueError(f"robot and edge live in one world, got {a.world} and {b.world}")
        canonical(self.strategy)  # an unknown name is refused with every known one
        if self.setting.weights != "native":
            # Both sides would have to hold the quantised model and the plan space to name it;
            # refused rather than run (and timed) as the float model.
            raise ValueError(
                f"weights={self.setting.weights} is not run by the robot / edge runtime yet "
                "(Policy.with_setting applies it in process)"
            )
        if self.slo_s <= 0:
            raise ValueError(f"slo_s must be positive, got {self.slo_s}")
