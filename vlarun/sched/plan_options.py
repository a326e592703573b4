"""`vlarun plan`'s options and the scheduler they describe (also what `vlarun bench sched`
times): one preset between two catalog devices under a control-rate deadline."""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.config import opt


@dataclass(frozen=True)
class PlanOptions:
    """Choose where each stage runs and which accelerator settings to use: the most actions
    per joule (modelled) whose predicted latency meets the control-rate deadline."""

    model: str = opt(help="model preset (see `vlarun info`)")
    # One name per concept across commands: a catalog device is --robot-device / --edge-device
    # (--edge is an edge's endpoint in ping and run-robot), the link --link-mbps /
    # --link-rtt-ms. The fields keep their names: bench sched and the scheduler read them.
    robot: str = opt(
        help="robot's catalog device id (see `vlarun predict --list-devices`)",
        flag="--robot-device",
        deprecated=("--robot",),
    )
    edge: str = opt(help="edge's catalog device id", flag="--edge-device", deprecated=("--edge",))
    bandwidth: float = opt(
        200.0, "link bandwidth estimate, Mbit/s", flag="--link-mbps", deprecated=("--bandwidth",)
    )
    rtt: float = opt(5.0, "link round-trip time, ms", flag="--link-rtt-ms", deprecated=("--rtt",))
    slo_hz: float = opt(20.0, "action output rate to sustain, actions/s")
    on_time: float = opt(
        0.99,
        "the share of requests that must meet the deadline: a plan is feasible when its "
        "predicted on-time probability reaches it (never measured: the cost model's prior spread)",
    )
    chunk: int | None = opt(None, "actions executed per inference (default: the model's chunk)")
    accuracy_floor: float | None = opt(
        None,
        "minimum relative success the 95% lower bound of a setting's measured success must "
        "clear (default 0.95)",
    )
    unmeasured_settings: bool = opt(
        False, "also admit settings whose accuracy cost nobody measured (the output says so)"
    )
    edge_busy_ms: float = opt(0.0, "edge already busy for this long (committed load)")
    text_tokens: int = opt(24, "instruction tokens in the prompt")
    dtype: str | None = opt(
        None,
        "compute dtype (default: the robot's best: on this CPU bf16 where it has native "
        "bf16, else fp32; bf16 on a catalog GPU or Jetson)",
        choices=["bfloat16", "float32"],
    )
    no_accelerators: bool = opt(False, "placement only: keep every accelerator knob off")
    settings: str | None = opt(
        None, "accuracy-cost table (settings.json format) or a `vlarun bench accel` result JSON"
    )
    profile: str | None = opt(
        None,
        "measured profile file(s), comma-separated, to use (default: the cached one of "
        "`vlarun profile --model M` where the robot or the edge is this-cpu)",
    )
    top: int = opt(5, "alternatives to list")
    json: bool = opt(False, "print one JSON object")


def make_scheduler(o: PlanOptions):
    """The scheduler for a plan request (space built once; decisions are then cheap), its
    actions per inference, and the profile files its measured stage times come from (none:
    the roofline's)."""
    from vlarun.models.presets import get_preset
    from vlarun.sched.catalog import get_device
    from vlarun.sched.cost import stage_works
    from vlarun.sched.plans import DEFAULT_FLOOR, build_space
    from vlarun.sched.profile import Profile, cached_profile, default_dtype
    from vlarun.sched.scheduler import Scheduler
    from vlarun.sched.settings_table import load_settings
    from vlarun.stages.families import Workload

    if o.slo_hz <= 0:
        raise ValueError("--slo-hz must be positive")
    cfg = get_preset(o.model)
    devices = {"robot": get_device(o.robot), "edge": get_device(o.edge)}
    dtype = o.dtype or default_dtype(devices["robot"])
    w = Workload(1, o.text_tokens, dtype)
    rows = load_settings(o.settings) if o.settings else None
    floor = o.accuracy_floor if o.accuracy_floor is not None else DEFAULT_FLOOR
    if o.unmeasured_settings:
        floor = None
    space = build_space(cfg, stage_works(cfg, w), devices, w, floor, rows, not o.no_accelerators)
    chunk = o.chunk or cfg.horizon
    if chunk < 1:
        raise ValueError("--chunk must be at least 1")
    measured = None
    cached = cached_profile(cfg.name, [o.robot, o.edge], dtype)
    paths = o.profile.split(",") if o.profile else [str(cached)] if cached else []
    if paths:
        measured = Profile.load(*paths).stage_table(cfg.name, 1, o.text_tokens, dtype)
    slo = chunk / o.slo_hz
    sched = Scheduler(
        space, devices, slo, dtype=dtype, actions=chunk, measured=measured, on_time=o.on_time
    )
    return sched, chunk, paths
