"""`vlarun bench coinfer`: robot and edge as separate processes, a shipped policy in
closed loop on Meta-World, compared across placement strategies.

  edge      `vlarun serve-edge` in its own process (loopback)
  link      a shaping relay process (relay.py) between them: bandwidth, delay, and a drop
            from --link-mbps to --link-mbps-after halfway through every run
  robot     this process: RobotAgent + asynchronous chunk queue, at --robot-slowdown
            (local stages take that many times longer: a stand-in for a slow robot computer)
  fleet     --robots agents share the edge, each a process of its own (fleet_robots.py),
            camera frames replayed; with --emulate they run on the robot's core

Strategies: device-only, edge-only, fixed-split (vision here, the rest on the edge), vlarun
(the scheduler per request, with fallback). Energy is modelled from the measured stage times
and the catalog powers of --robot-device / --edge-device (the edge here is this CPU standing
in for that device), and the report says so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, invoked_command, opt, to_dict
from vlarun.sched.strategy import FIXED


@dataclass(frozen=True)
class BenchCoinferOptions:
    """Co-inference benchmark: strategies x a bandwidth drop, and robots sharing one edge."""

    quick: bool = opt(False, "reduced run (fewer steps and robots)")
    policy: str = opt("tiny-ar", POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    task: str = opt("drawer-open-v3", "Meta-World task")
    steps: int = opt(160, "control steps per strategy")
    control_hz: float = opt(20.0, "actions executed per second")
    robot_slowdown: float = opt(4.0, "local stages take this x longer (slow-robot stand-in)")
    robot_device: str = opt(
        "this-cpu", "catalog device for the scheduler and energy (another: times converted)"
    )
    edge_device: str = opt(
        "this-cpu", "catalog device for the scheduler and energy (another: times converted)"
    )
    emulate: str | None = opt(
        None,
        "emulate MODEL (e.g. openvla-7b) on --robot-device and --edge-device: each side runs "
        "--policy for real and pads every stage to MODEL's roofline time on its device",
    )
    time_scale: float = opt(
        1.0,
        "with --emulate: every emulated time, delay and deadline divided by this and every "
        "bandwidth multiplied by it (the options name the unscaled values)",
    )
    world: str = opt(
        "catalog",
        "with --emulate: the devices' truth (vlarun.world), which the scheduler never "
        "reads: catalog (its own model: tests queueing and the link only), published, "
        "adversarial, or a world file",
    )
    on_time: float = opt(0.99, "the share of requests vlarun's planner holds to the deadline")
    pin: bool = opt(
        True,
        "with --emulate on >= 2 CPUs: the edge on CPU 0, this process (robot, load) and the "
        "relays on CPU 1; each row records the run-queue wait of each",
    )
    utilisations: tuple[float, ...] = opt(
        (),
        "with --emulate: one vlarun robot beside --robots - 1 open-loop ones instead of the "
        "strategies, once per edge utilisation: their period set so the fleet's edge-only demand "
        "at batch 1 is that share of the edge; rows: prediction error of the robot's executed "
        "plans and the utilisation measured",
    )
    trace: str | None = opt(
        None,
        "a changing link instead (a shipped trace: wifi-drive, steps; or a JSON file): "
        "every strategy, then the fixed placements at joint's setting, run through it; "
        "reports joint against the best static strategy in hindsight",
    )
    restore: bool = opt(
        False,
        "the restore run instead: --link-mbps, down to 2 Mbit/s for the middle third, "
        "back up; prints when the plans left the edge and came back (vlarun-placement: the "
        "edge's user whatever the settings table)",
    )
    restore_shifts: tuple[float, ...] = opt(
        (0.0,),
        "with --restore: one run per shift, its restore that many seconds (of the run's "
        "clock) later: where in a local request the link comes back decides whether a request's "
        "rest is handed to the edge or the next one is planned there",
    )
    # The link as every command names it (--link-mbps, --link-rtt-ms: round trip, as plan,
    # fleet and ping count it; the relay adds half of it each way). The bandwidth fields keep
    # their names, which the runs below read.
    bandwidth: float = opt(
        200.0,
        "link bandwidth (before the drop), Mbit/s",
        flag="--link-mbps",
        deprecated=("--bandwidth",),
    )
    drop_to: float = opt(
        50.0,
        "link bandwidth after the drop, Mbit/s",
        flag="--link-mbps-after",
        deprecated=("--drop-to",),
    )
    link_rtt_ms: float = opt(
        2.0,
        "link round-trip time the relay adds (half each way), ms",
        deprecated=(("--delay-ms", 2.0),),  # was one way
    )
    robots: int = opt(8, "robots sharing the edge in the fleet run (0: skip)")
    batching: bool = opt(
        False,
        "also run the fleet against an edge that never batches (--max-batch 1): "
        "edge compute per request and SLO share, batched vs not",
    )
    fleet_requests: int = opt(20, "requests per robot in the fleet run")
    matrix: bool = opt(
        False,
        "the condition matrix instead (coinfer_matrix.py): bandwidth x edge load x "
        "strategy, vlarun-joint and vlarun-placement among them",
    )
    matrix_bandwidths: tuple[str, ...] = opt(
        ("200", "50", "10", "200-50"), "matrix bandwidths, Mbit/s (A-B: a drop from A to B)"
    )
    matrix_loads: tuple[str, ...] = opt(("light", "medium", "heavy"), "matrix edge-load names")
    load_robots: tuple[int, ...] = opt((0, 2, 5), "other robots on the edge at each load")
    out: str | None = opt(None, "write the result JSON here")
    json: bool = opt(False, "print one JSON object")


STRATEGIES = (*FIXED, "vlarun")  # the strategies run without --matrix (the agent's names)


def run(o: BenchCoinferOptions) -> dict:
    import torch

    from vlarun.policy import Policy
    from vlarun.runtime.testbed import procs

    if o.emulate is None:  # before anything starts: options that only an emulation reads
        given = [
            name
            for name, off in (
                ("--world", o.world != "catalog"),
                ("--time-scale", o.time_scale != 1.0),
                ("--utilisations", bool(o.utilisations)),
            )
            if off
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} only "
                "to emulated devices: give --emulate MODEL (e.g. openvla-7b)"
            )
    if o.utilisations and (o.robots < 1 or not all(0 < u < 1.5 for u in o.utilisations)):
        raise ValueError(
            f"--utilisations needs --robots >= 1 and shares in (0, 1.5), got "
            f"{o.robots} robots and {list(o.utilisations)}"
        )
    torch.set_num_threads(1)
    t_start = time.monotonic()
    steps = 24 if o.quick else o.steps
    robots = min(o.robots, 2) if o.quick else o.robots
    requests = 4 if o.quick else o.fleet_requests
    policy = Policy.load(o.policy)
    pins = _pins(o)
    if pins:
        os.sched_setaffinity(0, pins["robot"])  # the robot, its load and this bench
    edge, endpoint = procs.start_edge(
        extra=["--policy", o.policy, "--threads", "1", *_edge_emulation(o)], cpus=pins.get("edge")
    )
    rows, fleet, matrix, restore, trace = [], None, None, None, None
    try:
        from vlarun.runtime.testbed.overhead import measure

        overhead = measure(endpoint, policy, 10 if o.quick else 50)
        if o.matrix:
            from vlarun.bench.coinfer_matrix import run_matrix

            def cell(strategy, n, before, after, load, setting=None):
                return _strategy_run(
                    o,
                    policy,
                    endpoint,
                    strategy,
                    n,
                    before,
                    after,
                    load,
                    edge_pid=edge.pid,
                    setting=setting,
                )

            matrix = run_matrix(
                o, policy, endpoint, steps, cell, lambda s, slo: _agent_cfg(o, s, slo, o.bandwidth)
            )
            rows, matrix = matrix["rows"], matrix["summary"]
        elif o.trace:
            from vlarun.bench.coinfer_trace import run_trace

            def traced(strategy, n, start, changes, setting=None):
                return _strategy_run(
                    o,
                    policy,
                    endpoint,
                    strategy,
                    n,
                    start,
                    None,
                    edge_pid=edge.pid,
                    changes=changes,
                    setting=setting,
                )

            trace = run_trace(o, traced, _scale(o))
            rows = trace.pop("rows")
        elif o.utilisations:
            fleet = {
                "utilisation": [
                    _utilisation_run(o, policy, endpoint, robots, requests, u)
                    for u in o.utilisations
                ]
            }
        elif o.restore:
            third = steps / o.control_hz / 3
            for shift in o.restore_shifts:
                changes = [(third, RESTORE_LOW_MBPS), (2 * third + shift, o.bandwidth)]
                rows.append(
                    _strategy_run(
                        o,
                        policy,
                        endpoint,
                        "vlarun",
                        steps,
                        o.bandwidth,
                        None,
                        edge_pid=edge.pid,
                        changes=changes,
                    )
                )
            restore = restore_summary(rows, o.restore_shifts, _scale(o))
        else:
            for strategy in STRATEGIES:
                rows.append(
                    _strategy_run(
                        o,
                        policy,
                        endpoint,
                        strategy,
                        steps,
                        o.bandwidth,
                        o.drop_to,
                        edge_pid=edge.pid,
                    )
                )
        if robots > 0 and not (o.matrix or o.restore or o.utilisations):
            fleet = _fleet_run(o, policy, endpoint, robots, requests)
            fleet["edge_peak_rss_mb"] = procs.peak_rss_mb(edge)  # over the whole run
    finally:
        procs.stop(edge)
    batching = None
    if o.batching and robots > 0 and not (o.matrix or o.restore or o.utilisations):
        single, at = procs.start_edge(
            extra=["--policy", o.policy, "--threads", "1", "--max-batch", "1", *_edge_emulation(o)],
            cpus=pins.get("edge"),
        )
        try:
            unbatched = _fleet_run(o, policy, at, robots, requests)
            unbatched["edge_peak_rss_mb"] = procs.peak_rss_mb(single)
        finally:
            procs.stop(single)
        batching = {"max_batch_8": fleet, "max_batch_1": unbatched}
    result = {
        "quick": o.quick,
        "command": invoked_command("vlarun bench coinfer" + (" --quick" if o.quick else "")),
        "options": to_dict(o),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "policy": o.policy,
        "task": o.task,
        "slo_ms": policy.model.cfg.horizon / o.control_hz * 1e3,
        "robot_slowdown": o.robot_slowdown if o.emulate is None else 1.0,
        "devices": {"robot": o.robot_device, "edge": o.edge_device},
        "emulated": None
        if o.emulate is None
        else {
            "model": o.emulate,
            "time_scale": o.time_scale,
            "settings": SETTINGS_PROXY,
            "world": _world_label(o),
        },
        "affinity": {k: sorted(v) for k, v in pins.items()} or None,
        "link": {
            "before_mbps": o.bandwidth,
            "after_mbps": o.drop_to,
            "rtt_ms": o.link_rtt_ms,
            "delay_ms": o.link_rtt_ms / 2,  # one way, as results before --link-rtt-ms record it
            "shaping": "user-space relay process",
        },
        "energy_source": "modelled (measured times at the catalog powers of the devices the "
        "roles name; this-cpu unless --robot-device / --edge-device convert them)"
        if o.emulate is None or o.world == "catalog"
        else f"modelled: the {o.world} world's powers x the emulated times (no meter)",
        "rows": rows,
        "fleet": fleet,
        "batching": batching,
        "matrix": matrix,
        "restore": restore,
        "trace": trace,
        "runtime_overhead": overhead,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    if o.out:
        Path(o.out).parent.mkdir(parents=True, exist_ok=True)
        png = str(Path(o.out).with_suffix(".png"))
        if matrix is not None:
            from vlarun.bench.coinfer_matrix import plot_matrix

            result["plot"] = plot_matrix({"rows": rows}, png)
        elif o.utilisations:
            result["plot"] = plot_utilisation(result, png)
        else:
            result["plot"] = plot(result, png)
        Path(o.out).write_text(json.dumps(result, indent=1))
    return result


def plot(r: dict, path: str) -> str | None:
    """Latency of every inference over the run per strategy, deadline and drop marked;
    None when matplotlib is missing (the JSON has the same traces)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    link, restore = r["link"], r.get("restore")
    runs = (restore or {}).get("runs") or [restore or {}]
    for i, row in enumerate(r["rows"]):
        label = row["strategy"]
        if len(runs) > 1:  # the restore runs, one per shift: each its colour and its restore
            label = f"{label}, restore +{runs[i]['shift_s']:g} s"
        if row["trace"]:
            t, lat = zip(*((x[0], x[1]) for x in row["trace"]), strict=True)
            line = ax.plot(t, lat, marker=".", lw=1, label=label)[0]
            if len(runs) > 1 and runs[i].get("restore_s") is not None:
                ax.axvline(runs[i]["restore_s"], color=line.get_color(), ls=":", lw=0.8)
    ax.axhline(r["slo_ms"], color="k", ls="--", lw=0.8, label="deadline")
    ax.axvline(r["rows"][0]["drop_at_s"], color="grey", ls=":", lw=0.8)
    if len(runs) == 1 and restore and restore.get("restore_s") is not None:
        ax.axvline(restore["restore_s"], color="grey", ls=":", lw=0.8)
    low = RESTORE_LOW_MBPS if restore else link["after_mbps"]
    back = f" -> {link['before_mbps']:g}" if restore else ""
    emulated = r.get("emulated")
    who = (
        f"{emulated['model']} emulated ({emulated.get('world', 'catalog')} world), "
        f"times x1/{emulated['time_scale']:g}"
        if emulated
        else f"robot slowdown {r['robot_slowdown']:g}x"
    )
    ax.set(
        xlabel="time in the run (s; episodes back to back)",
        ylabel="request -> actions latency (ms)",
        yscale="log",
        title=f"{link['before_mbps']:g} -> {low:g}{back} Mbit/s at the dotted lines; {who}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


WALL_BUDGET = 1.25  # a strategy run's wall time at most, in units of its steps' on-time span


def restore_summary(rows: list[dict], shifts, time_scale: float) -> dict:
    """The restore runs' link timelines, one per shift, and the worst return. ``*_emulated_ms``:
    on the emulated devices' clock (the run's times x ``time_scale``; the same where nothing
    is emulated)."""
    runs = []
    for shift, row in zip(shifts, rows, strict=True):
        t = dict(row["link_timeline"], shift_s=shift)
        for key in ("left_edge_after_drop_ms", "edge_again_after_restore_ms"):
            v = t[key]
            t[key.replace("_ms", "_emulated_ms")] = None if v is None else v * time_scale
        runs.append(t)
    again = [t["edge_again_after_restore_emulated_ms"] for t in runs]
    return {
        **runs[0],
        "runs": runs,
        # None where a run never came back (the worst there is: never)
        "worst_edge_again_emulated_ms": None if None in again else max(again),
        "handoffs": sum(t["handoffs"] for t in runs),
    }


RESTORE_LOW_MBPS = 2.0  # the restore run's low: too slow for any edge plan of a real model
# A utilisation run's first requests start this long after it is set up: the measured robot's
# warm-up (one padded local run, ~4 s at x0.3) and the load generator's start fit before it.
PHASE_LEAD_S = 10.0
SETTINGS_PROXY = (
    "vlarun-joint's accuracy costs: vlarun/sched/settings_mt10.json, measured on the shipped "
    "MT10 policies (paired episodes), carried to the emulated model as a proxy: no real-size "
    "model's success was measured"
)


def _scale(o: BenchCoinferOptions) -> float:
    """The emulation's time scale (1 without --emulate): times and delays are divided by it,
    bandwidths multiplied, so every transfer keeps its share of the scaled deadline."""
    return o.time_scale if o.emulate is not None else 1.0


def _pins(o: BenchCoinferOptions) -> dict[str, set[int]]:
    """role -> CPUs: with --emulate and --pin on a machine of >= 2 CPUs, the edge alone on the
    first, everything else (robot, load generator, relays) on the second; {} otherwise."""
    cpus = sorted(os.sched_getaffinity(0))
    if o.emulate is None or not o.pin or len(cpus) < 2:
        return {}
    return {"edge": {cpus[0]}, "robot": {cpus[1]}, "relay": {cpus[1]}}


def plot_utilisation(r: dict, path: str) -> str | None:
    """Latency and energy MAPE of the executed plans against the edge utilisation measured,
    one point per --utilisations run; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = r["fleet"]["utilisation"]
    u = [x["measured_utilisation"] for x in runs]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, label in (("latency_mape_pct", "latency"), ("energy_mape_pct", "energy (modelled)")):
        ax.plot(u, [x.get(key) or 0 for x in runs], marker="o", label=label)
    for x in runs:
        ax.annotate(
            f"set {x['target_utilisation']:g}",
            (x["measured_utilisation"], 0),
            fontsize=7,
            rotation=90,
            va="bottom",
        )
    ax.axhline(10, color="k", ls="--", lw=0.8, label="latency goal 10%")
    ax.axhline(5, color="grey", ls=":", lw=0.8, label="energy goal 5%")
    ax.set(
        xlabel="edge utilisation measured",
        ylabel="MAPE of the executed plan (%)",
        title=f"{runs[0]['robots']} robots sharing the emulated edge",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _world_label(o: BenchCoinferOptions) -> str:
    """Which truth the emulated devices ran under, as every row and figure must say."""
    from vlarun.world import load_world

    return load_world(o.world, o.emulate, (o.robot_device, o.edge_device)).label()


def _emulations(o: BenchCoinferOptions):
    """(robot, edge) emulations of ``--emulate``, or (None, None)."""
    from vlarun.runtime.emulate import Emulation

    if o.emulate is None:
        return None, None
    return (
        Emulation(o.emulate, o.robot_device, time_scale=o.time_scale, world=o.world),
        Emulation(o.emulate, o.edge_device, time_scale=o.time_scale, world=o.world),
    )


def _edge_emulation_report(endpoint: str) -> dict:
    """The edge's emulation counters (cumulative since it started), from its health answer."""
    from vlarun.runtime.robot.client import ping
    from vlarun.runtime.transport import Security

    report = (ping(endpoint, Security(insecure=True), count=1).get("health") or {}).get("emulation")
    if not isinstance(report, dict):
        raise RuntimeError(f"the edge at {endpoint} reports no emulation (started without it?)")
    return report


def _edge_emulation_since(endpoint: str, before: dict) -> dict:
    """The edge's emulation counters over a run: now less ``before`` (its report then), and
    its worst overrun since it started."""
    now = _edge_emulation_report(endpoint)
    out = {n: now[n] - before[n] for n in ("executions", "emulation_violations")}
    return out | {"worst_overrun_ms": now["worst_overrun_ms"]}


def _edge_emulation(o: BenchCoinferOptions) -> list[str]:
    """serve-edge's flags for the edge's side of ``--emulate``."""
    if o.emulate is None:
        return []
    return [
        "--emulate",
        f"{o.emulate}:{o.edge_device}",
        "--time-scale",
        str(o.time_scale),
        "--world",
        o.world,
    ]


def _agent_cfg(
    o: BenchCoinferOptions,
    strategy: str,
    slo_s: float,
    bandwidth: float,
    setting: str | None = None,
):
    from vlarun.policy.setting import AccelSetting
    from vlarun.runtime.emulate import StandIn
    from vlarun.runtime.robot.agent import AgentConfig
    from vlarun.sched.settings_table import MEASURED_SETTINGS_FILE

    robot, edge = _emulations(o)
    # Emulated, vlarun-joint plans with the costs measured on the shipped deep policies,
    # carried to the emulated model as a labelled proxy (SETTINGS_PROXY); else the shipped table.
    proxy = {"settings_file": str(MEASURED_SETTINGS_FILE), "settings_proxy": True}
    # The emulation stands in for the robot where there is one, else the slowdown.
    stand_in = StandIn(slowdown=o.robot_slowdown) if robot is None else StandIn.emulating(robot)
    return AgentConfig(
        slo_s,
        strategy,
        robot=stand_in,
        edge=StandIn.emulating(edge, o.edge_device),
        bandwidth_mbps=bandwidth * _scale(o),
        on_time=o.on_time,
        **(proxy if robot is not None else {}),
        **({} if setting is None else {"setting": AccelSetting.parse(setting)}),
    )


def _strategy_run(
    o,
    policy,
    endpoint: str,
    strategy: str,
    steps: int,
    bandwidth: float,
    drop_to: float | None,
    load: str = "light",
    edge_pid: int | None = None,
    changes: list[tuple[float, float]] | None = None,
    setting: str | None = None,
) -> dict:
    """``steps`` control steps of closed loop through a fresh relay at ``bandwidth`` Mbit/s
    that drops to ``drop_to`` halfway (None: no drop), or follows ``changes`` ((seconds into
    the run, Mbit/s), the restore run's). Bandwidths and the delay are the unscaled ones (the
    relay gets them scaled). Episodes end at success or the task's step limit; the next one
    follows at once. ``load`` names the edge's load during the run (other robots are the
    caller's); ``edge_pid``: the edge process, whose run-queue wait the row records;
    ``setting``: the accelerator setting a fixed strategy runs (default: full compute)."""
    from vlarun.runtime.robot.agent import RobotAgent
    from vlarun.runtime.robot.episode import link_timeline
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security
    from vlarun.sched.records import summarise
    from vlarun.sim.env import MetaWorldEnv, env_views

    horizon = policy.model.cfg.horizon
    slo_s = horizon / o.control_hz
    env = MetaWorldEnv(o.task, policy.model.cfg.image_size, **env_views(policy.model.cfg))
    obs, _ = env.reset(seed=10000)
    agent = RobotAgent(policy, _agent_cfg(o, "device-only", slo_s, bandwidth))
    local = agent.warmup(policy.observation(obs)[0], env.instruction)  # every view it reads
    agent.close()
    drop_after = steps / o.control_hz / 2  # seconds into the episode
    if changes is None:
        changes = [] if drop_to is None else [(drop_after, drop_to)]
    else:
        drop_after = changes[0][0]
    relay, via = _relay(o, endpoint, bandwidth, changes)
    waits = _waits(edge_pid, relay.pid)
    clock0 = 0.0
    edge_before = _edge_emulation_report(endpoint) if o.emulate else None
    times: list[float] = []
    try:
        agent = RobotAgent(
            policy, _agent_cfg(o, strategy, slo_s, bandwidth, setting), via, Security(insecure=True)
        )
        # Its one-time setup is not the first request's latency; it starts primed with the
        # device-only agent's warm-up times.
        agent.prepare(env.instruction, local)
        if strategy == "vlarun-joint":  # every setting timed here once, as warmup() does
            agent.warm_settings(policy.observation(obs)[0], env.instruction)
            if agent.emulator is not None:  # the warm-up's executions are not the run's
                agent.emulator.clear_counts()
        relay.send_signal(signal.SIGUSR1)  # the relay's schedule starts with the episode
        t0 = clock0 = time.monotonic()
        ep = _episodes(
            agent,
            env,
            o.control_hz,
            steps,
            lambda: times.append(time.monotonic() - t0),
            WALL_BUDGET * steps / o.control_hz,
        )
        emulation = agent.emulator.report() if agent.emulator is not None else None
        agent.close()
        if emulation is not None:
            emulation["edge"] = _edge_emulation_since(endpoint, edge_before)
        after_run = _waits(edge_pid, relay.pid)
        waits = {
            role: None
            if w is None or after_run[role] is None
            else round((after_run[role] - w) * 1e3, 1)
            for role, w in waits.items()
        }
    finally:
        procs.stop(relay)
        env.close()
    infs = ep["inferences"]
    # An inference counts as "after" if it completed after the drop.
    before = [r for r, t in zip(infs, times, strict=True) if t < drop_after]
    after = [r for r, t in zip(infs, times, strict=True) if t >= drop_after]
    s = summarise(infs, horizon)
    plans = {}
    for r in infs:
        plans[r["ran"]] = plans.get(r["ran"], 0) + 1
    return {
        "model": o.emulate or policy.model.cfg.name,  # what the times stand for
        "strategy": strategy,
        "fixed_setting": setting,
        "bandwidth_mbps": bandwidth,  # before the drop
        "bandwidth_after_mbps": drop_to,
        "load": load,
        "energy_source": s["energy_source"],
        "mean_batch": s["mean_batch"],
        "control_hz": ep["control_hz"],
        "latency_p50_ms": s["latency_p50_ms"],
        "latency_p99_ms": s["latency_p99_ms"],
        "slo_met_fraction": s["slo_met_fraction"],
        "slo_met_ci95": s["slo_met_ci95"],
        "actions_per_joule": s["actions_per_joule"],
        "slo_met_before_drop": summarise(before, horizon).get("slo_met_fraction"),
        "slo_met_after_drop": summarise(after, horizon).get("slo_met_fraction"),
        "inferences": len(infs),
        "fallbacks": s["fallbacks"],
        "latency_mape_pct": s["latency_mape_pct"],  # of the executed plan (scheduled runs)
        "energy_mape_pct": s["energy_mape_pct"],
        "stalls": ep["stalls"],
        "episodes": ep["episodes"],
        "success": ep["success"],  # fraction of the episodes that succeeded
        "plans_ran": plans,
        # the robot side's stages that overran their emulated time (None: not emulated)
        "emulation_violations": None
        if emulation is None
        else emulation["emulation_violations"] + emulation["edge"]["emulation_violations"],
        "emulation": emulation,
        "drop_at_s": drop_after,
        "link_timeline": link_timeline(infs, clock0, bandwidth, changes) if changes else None,
        # ms each process waited runnable on a run queue over the run (pinned: its core's
        # other processes got in its way this long)
        "run_queue_wait_ms": waits,
        # (completion time in the episode s, latency ms, where each stage ran, why it fell back
        # (None: it did not), whether the plan was an exploration, modelled energy J, whether
        # it met its deadline, the setting it ran, its predicted ms and J (None: not
        # scheduled)): what the matrix's bootstrap intervals resample
        "trace": [
            [
                t,
                r["latency_ms"],
                r["ran"],
                r["fallback"],
                r["explored"],
                r["energy_j"],
                r["slo_met"],
                r["setting"],
                r["predicted_ms"],
                r["predicted_j"],
            ]
            for r, t in zip(infs, times, strict=True)
        ],
    }


def _utilisation_run(o, policy, endpoint: str, robots: int, requests: int, u: float) -> dict:
    """One vlarun robot, measured, among ``robots - 1`` others sending edge-only requests open
    loop (``loadgen.OpenLoopLoad``, a process of their own), all at the period that makes the
    fleet's edge-only demand (every stage on the edge, batch 1, emulated time) ``u`` of the
    edge; each request due in the chunk's time at --control-hz as everywhere else. The others
    are not agents in this process: as threads they shared its interpreter lock with the
    robot measured, and their own plans (vision here) kept the edge at half the target. The
    utilisation measured is the edge's compute over the wall time of the run, from its health
    counters; the prediction errors are the measured robot's, over ``requests`` requests."""
    from vlarun.bench.coinfer_matrix import background_load
    from vlarun.runtime.emulate import StageEmulator
    from vlarun.runtime.robot.client import ping
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security

    edge = StageEmulator.build(_emulations(o)[1])
    demand_s = sum(edge.target_s(s) for s in edge.targets)
    period = robots * demand_s / u

    def counters() -> tuple[float, float]:
        h = ping(endpoint, Security(insecure=True), count=1).get("health") or {}
        return float(h.get("compute_s", 0.0)), float(h.get("uptime_s", 0.0))

    make_cfg = lambda strategy, slo_s: _agent_cfg(o, strategy, slo_s, o.bandwidth)  # noqa: E731
    slo = policy.model.cfg.horizon / o.control_hz
    # The measured robot reaches the edge through its own shaped link (--link-mbps, --link-rtt-ms,
    # scaled), as in every strategy run: over bare loopback its padded megabytes moved at
    # memory speed, its link estimate swung between 20 and 11,000 Mbit/s and its plans with it.
    relay, via = _relay(o, endpoint, o.bandwidth)
    # A fixed phase, so that repeated runs (other code, other seeds) meet the same pattern
    # of arrivals: the background's robots send first at ``start`` and a share of the period
    # apart, the measured robot half a share after the first of them. Left to chance, one
    # run's robot joined a background batch in every request and another's in none.
    gap = period / max(robots - 1, 1)
    try:
        with _fleet(o, policy, via, 1, requests, period) as fleet:  # warm before the clock
            start = time.monotonic() + PHASE_LEAD_S
            with background_load(
                policy, endpoint, robots - 1, period, make_cfg, slo, start_at=start
            ) as load:
                busy0, up0 = counters()
                rows = fleet.run(start_at=start + gap / 2)
                busy1, up1 = counters()
        run = _fleet_summary(policy, 1, requests, rows, fleet.peak_rss_mb)
    finally:
        procs.stop(relay)
    return {
        "target_utilisation": u,
        "period_ms": period * 1e3,
        "robots": robots,
        "measured_robots": 1,
        "background": load.counts,
        "phase_ms": {"background_gap": gap * 1e3, "measured_after_first": gap / 2 * 1e3},
        "measured_utilisation": (busy1 - busy0) / max(up1 - up0, 1e-9),
        **{k: v for k, v in run.items() if k != "robots"},
    }


def _relay(o: BenchCoinferOptions, endpoint: str, bandwidth: float, changes=()):
    """A shaping relay in front of ``endpoint`` at ``bandwidth`` Mbit/s and --link-rtt-ms, with
    the ``changes`` ((seconds into the run, Mbit/s)) as its schedule, every rate and delay
    scaled as the emulation's times are, pinned with the robot; (process, endpoint)."""
    from vlarun.runtime.testbed import procs

    k = _scale(o)
    schedule = ",".join(f"{at}:{mbps * k}" for at, mbps in changes)
    return procs.start_relay(
        endpoint, bandwidth * k, o.link_rtt_ms / 2 / k, schedule, cpus=_pins(o).get("relay")
    )


def _waits(edge_pid: int | None, relay_pid: int) -> dict[str, float | None]:
    """Run-queue wait so far (s) of the edge, this process (the robot and its load) and the
    relay."""
    from vlarun.runtime.testbed.procs import run_queue_wait_s

    return {
        "edge": None if edge_pid is None else run_queue_wait_s(edge_pid),
        "robot": run_queue_wait_s(os.getpid()),
        "relay": run_queue_wait_s(relay_pid),
    }


def _episodes(
    agent, env, control_hz: float, steps: int, on_inference, wall_s: float | None = None
) -> dict:
    """Held-out episodes back to back (seeds 10000, 10001, ...) until ``steps`` control steps
    have run: a successful episode ends early, and a run of one episode would then hold too few
    requests for its SLO share or p99 to mean anything. ``wall_s``: the wall time at most (the
    bench gives every strategy the same, WALL_BUDGET x the steps' time on schedule: a strategy
    whose chunks arrive after the queue ran dry executes about one action per inference, and
    would otherwise run for ``steps`` inferences)."""
    from vlarun.runtime.robot.episode import run_episode

    done: list[dict] = []
    ran = 0
    stop_at = None if wall_s is None else time.perf_counter() + wall_s
    while ran < steps and (stop_at is None or time.perf_counter() < stop_at):
        seed = 10000 + len(done)
        ep = run_episode(
            agent, env, seed, control_hz, True, steps - ran, lambda i, inf: on_inference(), stop_at
        )
        done.append(ep)
        ran += ep["steps"]
    wall = sum(e["wall_s"] for e in done)
    return {
        "episodes": len(done),
        "success": sum(e["success"] for e in done) / len(done),
        "control_hz": ran / wall if wall > 0 else 0.0,
        "stalls": sum(e["stalls"] for e in done),
        "inferences": [r for e in done for r in e["inferences"]],
    }


def _fleet_run(
    o,
    policy,
    endpoint: str,
    robots: int,
    requests: int,
    period_s: float | None = None,
    start_at: float | None = None,
) -> dict:
    """``robots`` vlarun agents sharing the edge (frames replayed), each a process of its own
    (``fleet_robots.RobotFleet``), due in the chunk's time at --control-hz, one request every
    ``period_s`` (default: that deadline), robot 0's first at ``start_at`` (default: once all
    are warm), the others a share of the period after it."""
    from vlarun.runtime.emulate import merge_reports

    edge_before = _edge_emulation_report(endpoint) if o.emulate else None
    with _fleet(o, policy, endpoint, robots, requests, period_s) as fleet:
        rows = fleet.run(start_at)
    out = _fleet_summary(policy, robots, requests, rows, fleet.peak_rss_mb)
    if edge_before is not None:  # a fleet cell is valid as a strategy's is (emulate.py)
        edge = _edge_emulation_since(endpoint, edge_before)
        both = merge_reports([fleet.emulation, edge])
        out["emulation"] = {
            "robots": fleet.emulation,
            "edge": edge,
            "violation_share": both["violation_share"],
            "valid": both["valid"],
        }
    return out


def _fleet(o, policy, endpoint: str, robots: int, requests: int, period_s: float | None = None):
    """The fleet of ``_fleet_run``, not yet started (enter it: the robots warm up)."""
    from vlarun.bench.fleet_robots import RobotFleet

    period = policy.model.cfg.horizon / o.control_hz
    cfg = _agent_cfg(o, "vlarun", period, o.bandwidth)
    return RobotFleet(o.policy, cfg, endpoint, robots, requests, period_s)


def _fleet_summary(
    policy, robots: int, requests: int, rows: list[dict], peak_rss_mb: float | None
) -> dict:
    from vlarun.sched.records import summarise

    horizon = policy.model.cfg.horizon
    s = summarise(rows, horizon)
    edge = [
        ms
        for r in rows
        for n, ms in r["stage_ms"].items()
        if "@edge" in r["ran"] and f"{n}@edge" in r["ran"].split("/")
    ]
    per_request = [
        sum(
            ms / r["edge_batch"].get(n, 1)
            for n, ms in r["stage_ms"].items()
            if f"{n}@edge" in r["ran"].split("/")
        )
        for r in rows
        if "@edge" in r["ran"]
    ]
    keep_keys = (
        "plan",
        "ran",
        "latency_ms",
        "predicted_ms",
        "energy_j",
        "predicted_j",
        "stage_ms",
        "edge_batch",
        "remote_overhead_ms",
        "link_mbps",
        "late_edge",
        "fallback",
        "started_s",
    )
    return {
        "robots": robots,
        "requests_per_robot": requests,
        **s,
        "robot_peak_rss_mb": peak_rss_mb,
        "robots_as": "processes",
        "requests": [{k: r.get(k) for k in keep_keys} for r in rows],
        "edge_stage_ms_mean": sum(edge) / len(edge) if edge else None,
        "edge_compute_ms_per_request": sum(per_request) / len(per_request) if per_request else None,
    }


def show(r: dict) -> None:
    if r.get("matrix") is not None:
        _show_matrix(r)
        return
    if r.get("trace") is not None:
        _show_trace(r)
        return
    print(
        f"co-inference, {r['task']}, deadline {r['slo_ms']:.0f} ms, robot slowdown "
        f"{r['robot_slowdown']:g}x, link {r['link']['before_mbps']:g} -> "
        f"{r['link']['after_mbps']:g} Mbit/s; energy {r['energy_source']}"
    )
    head = ("strategy", "Hz", "p50 ms", "p99 ms", "SLO", "before", "after", "act/J", "fallbacks")
    print("  {:<13}{:>6}{:>9}{:>9}{:>7}{:>8}{:>7}{:>8}{:>10}".format(*head))
    for x in r["rows"]:
        print(
            f"  {x['strategy']:<13}{x['control_hz']:>6.1f}{x['latency_p50_ms']:>9.1f}"
            f"{x['latency_p99_ms']:>9.1f}{_pct(x['slo_met_fraction']):>7}"
            f"{_pct(x['slo_met_before_drop']):>8}{_pct(x['slo_met_after_drop']):>7}"
            f"{x['actions_per_joule']:>8.3f}{x['fallbacks']:>10}"
        )
    _show_overhead(r["runtime_overhead"])
    t = r.get("restore")
    if t:
        ms = lambda v: "never" if v is None else f"{v:.0f} ms"  # noqa: E731
        print(
            f"  restore: {r['link']['before_mbps']:g} -> {RESTORE_LOW_MBPS:g} Mbit/s at "
            f"{t['drop_s']:.1f} s, plans left the edge after {ms(t['left_edge_after_drop_ms'])}; "
            f"back at {t['restore_s']:.1f} s, edge again after "
            f"{ms(t['edge_again_after_restore_ms'])}"
        )
        for run in t.get("runs", [])[1:]:
            print(
                f"    restore {run['shift_s']:+.1f} s later: edge again after "
                f"{ms(run['edge_again_after_restore_ms'])}"
            )
        if "runs" in t:
            print(
                f"  on the emulated clock: edge again after at worst "
                f"{ms(t['worst_edge_again_emulated_ms'])}, {t['handoffs']} handoffs"
            )
    _show_batching(r.get("batching"))
    for f in (r.get("fleet") or {}).get("utilisation", []):
        lat, en = f.get("latency_mape_pct"), f.get("energy_mape_pct")
        print(
            f"  utilisation {f['target_utilisation']:.2f} (measured "
            f"{f['measured_utilisation']:.2f}), {f['robots']} robots every "
            f"{f['period_ms']:.0f} ms: latency MAPE {'-' if lat is None else f'{lat:.1f}%'}, "
            f"energy MAPE {'-' if en is None else f'{en:.1f}%'} over "
            f"{f.get('predicted_requests', 0)} requests that ran their plan; SLO met "
            f"{_pct(f.get('slo_met_fraction'))}, mean batch "
            f"{f.get('mean_batch') or 0:.2f}"
        )
    f = r.get("fleet")
    if f and f.get("inferences"):
        print(
            f"  fleet: {f['robots']} robots x {f['requests_per_robot']} requests: p50 "
            f"{f['latency_p50_ms']:.1f} ms, p99 {f['latency_p99_ms']:.1f} ms, SLO met "
            f"{_pct(f['slo_met_fraction'])}, {f['actions_per_joule']:.3f} act/J, "
            f"{f['fallbacks']} fallbacks, {f['late_edge_answers']} of {f['edge_requests']} "
            f"edge requests late ({f['edge_answered_late']} answers themselves late, the rest "
            f"by the robot's own stages); peak RSS edge "
            f"{f.get('edge_peak_rss_mb') or 0:.0f} MB, robot "
            f"{f.get('robot_peak_rss_mb') or 0:.0f} MB (each a process)"
        )
        e = f.get("emulation")
        if e:
            print(
                f"  fleet emulation: {e['robots']['emulation_violations']} + "
                f"{e['edge']['emulation_violations']} violations in "
                f"{e['robots']['executions']} robot + {e['edge']['executions']} edge stage "
                f"runs ({100 * e['violation_share']:.2f}%; "
                f"{'valid' if e['valid'] else 'INVALID: over 1%'})"
            )
        if f.get("latency_mape_pct") is not None:
            print(
                f"  fleet predictions ({f['predicted_requests']} requests that ran their plan):"
                f" latency MAPE {f['latency_mape_pct']:.1f}%, energy MAPE "
                f"{f['energy_mape_pct']:.1f}% (modelled energy)"
            )


def _show_trace(r: dict) -> None:
    t, s = r["trace"]["trace"], r["trace"]["summary"]
    world = (r.get("emulated") or {}).get("world", "not emulated")
    print(
        f"co-inference through trace {t['name']} ({t['seconds']} s: "
        f"{' -> '.join(f'{m:g}' for _, m in t['bandwidth_mbps'])} Mbit/s), deadline "
        f"{r['slo_ms']:.0f} ms; world: {world}; energy {r['energy_source']}"
    )
    for x in r["rows"]:
        lo, hi = x.get("slo_met_ci95") or (0.0, 1.0)
        print(
            f"  {x['strategy']:<28} on time {_pct(x['slo_met_fraction']):>6} "
            f"[{100 * lo:.1f}, {100 * hi:.1f}]  {x['actions_per_joule']:.4f} act/J  "
            f"{x['inferences']} requests"
        )
    if "joint_over_best_static" in s:
        ci = s["joint_over_best_static_ci95"]
        ci_txt = "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        print(
            f"  joint / best static in hindsight ({s['best_static']}): "
            f"{s['joint_over_best_static']:.2f}x{ci_txt}; goal {s['goal']}x at >= 99% on "
            f"time: {'met' if s['goal_met'] else 'not met'}; oracle: {s['oracle']}"
        )


def _show_matrix(r: dict) -> None:
    print(
        f"co-inference matrix, {r['task']}, deadline {r['slo_ms']:.0f} ms, robot slowdown "
        f"{r['robot_slowdown']:g}x; energy {r['energy_source']}"
    )
    head = ("load", "Mbit/s", "strategy", "act/J", "SLO", "p50 ms", "p99 ms", "fallbacks", "batch")
    print("  {:<8}{:>8}  {:<18}{:>7}{:>7}{:>9}{:>9}{:>10}{:>7}".format(*head))
    for x in r["rows"]:
        batch = "-" if x["mean_batch"] is None else f"{x['mean_batch']:.2f}"
        print(
            f"  {x['load']:<8}{x['bandwidth']:>8}  {x['strategy']:<18}"
            f"{x['actions_per_joule']:>7.3f}{_pct(x['slo_met_fraction']):>7}"
            f"{x['latency_p50_ms']:>9.1f}{x['latency_p99_ms']:>9.1f}{x['fallbacks']:>10}{batch:>7}"
        )
    m = r["matrix"]
    for c in m["cells"]:
        ci = c.get("joint_over_best_fixed_ci95")
        band = (
            ""
            if ci is None
            else f" (95% {ci[0]:.2f}-{ci[1]:.2f}{'' if c['judged'] else ', not judged'})"
        )
        print(
            f"  {c['load']:<8}{c['bandwidth']:>8}  joint / best fixed ({c['best_fixed']}) "
            f"{c['joint_over_best_fixed']:.2f}{band}; oracle {c.get('oracle') or 'none'}"
            f"{'' if c.get('feasible', True) else ' (none meets the SLO bar)'}"
        )
        same = c.get("joint_over_best_fixed_same_setting")
        if same is not None:  # what per-request placement adds over joint's own setting
            ci = c.get("joint_over_best_fixed_same_setting_ci95")
            band = "" if ci is None else f" (95% {ci[0]:.2f}-{ci[1]:.2f})"
            print(
                f"  {'':<16}  joint / best fixed placement at joint's setting "
                f"({c['best_fixed_same_setting']}) {same:.2f}{band}"
            )
        if c.get("joint_over_placement") is not None:
            print(
                f"  {'':<16}  joint / vlarun-placement {c['joint_over_placement']:.2f} "
                "(what the settings add)"
            )
    split, place = m["joint_over_fixed_split_mean"], m["joint_over_placement_mean"]
    print(
        f"  vlarun-joint meets the goal (>= 0.97 x best fixed, SLO >= 99.9%) in "
        f"{m['cells_meeting_goal']} of {len(m['cells'])} cells; mean joint / Fixed Split "
        f"{'-' if split is None else f'{split:.2f}'} (over the "
        f"{m.get('joint_over_fixed_split_cells', '?')} cells where Fixed Split met its "
        f"deadline), joint / placement {'-' if place is None else f'{place:.2f}'}"
    )
    world = (r.get("emulated") or {}).get("world")
    if world:
        print(f"  world: {world}")


def _show_batching(b: dict | None) -> None:
    if not b:
        return
    for name, f in b.items():
        if f and f.get("inferences"):
            per = f.get("edge_compute_ms_per_request")
            print(
                f"  {name}: mean edge batch {f['mean_batch'] or 0:.2f}, edge compute "
                f"{'-' if per is None else f'{per:.1f}'} ms per request, SLO met "
                f"{_pct(f['slo_met_fraction'])}, p99 {f['latency_p99_ms']:.0f} ms, "
                f"{f['fallbacks']} fallbacks"
            )


def _show_overhead(x: dict) -> None:
    print(
        f"  runtime overhead per remote stage ({x['stage']}, {x['request_bytes'] / 1e3:.0f} kB "
        f"out): {x['remote_minus_compute_ms']:.2f} ms beyond compute vs raw ZeroMQ round trip "
        f"{x['raw_round_trip_ms']:.2f} ms -> {x['overhead_ms']:+.2f} ms (n={x['n']})"
    )


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


OPTIONS = {"bench-coinfer": BenchCoinferOptions}
RUN = {"bench-coinfer": run}
SHOW = {"bench-coinfer": show}
