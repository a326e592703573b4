"""`vlarun keys | serve-edge | ping | run-robot`: options, commands and printers.

cli.py registers these by name and imports this module only when the parser is built; torch
and the model code are imported inside the commands.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from vlarun.config import COMPILE_HELP, DEFAULT_POLICY, POLICY_FLAGS_RETIRED, POLICY_HELP, opt
from vlarun.extras import require
from vlarun.paths import checkpoints_dir

CHECKPOINTS = checkpoints_dir()

# ---------------------------------------------------------------------------------------------
# keys


@dataclass(frozen=True)
class KeysOptions:
    """Generate a CurveZMQ key pair (NAME.key public, NAME.key_secret secret; both mode 0600)."""

    name: str = opt("edge", "key name: 'edge' for the server, e.g. 'robot1' for a robot")
    out: str | None = opt(None, "folder (default: ~/.config/vlarun/keys or $VLARUN_KEY_DIR)")
    overwrite: bool = opt(False, "replace existing keys of that name")
    json: bool = opt(False, "print one JSON object")


def cmd_keys(o: KeysOptions) -> dict:
    from vlarun.runtime.transport import default_key_dir, generate_keys

    return generate_keys(o.out or default_key_dir(), o.name, o.overwrite)


def show_keys(r: dict) -> None:
    print(f"wrote {r['public']} (public: give it to the other side) and {r['secret']} (secret)")


# ---------------------------------------------------------------------------------------------
# serve-edge


@dataclass(frozen=True)
class ServeEdgeOptions:
    """Serve a policy's stages to robots over ZeroMQ (CurveZMQ unless --insecure)."""

    port: int = opt(5555, "TCP port (0: any free port; the endpoint is printed)")
    host: str = opt("127.0.0.1", "interface to bind (0.0.0.0: every interface)")
    insecure: bool = opt(False, "no authentication or encryption (local tests only)")
    keys: str | None = opt(
        None, "edge secret key file (default ~/.config/vlarun/keys/edge.key_secret)"
    )
    authorized_keys: str | None = opt(
        None,
        "folder of robot public keys allowed to connect (without it: any client that "
        "knows the edge's public key; a non-loopback --host then needs --allow-any-client)",
    )
    allow_any_client: bool = opt(
        False,
        "on a non-loopback --host, serve without --authorized-keys (or with "
        "--insecure): any client that knows the edge's public key (any at all, insecure)",
    )
    policy: str = opt(DEFAULT_POLICY, POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    emulate: str | None = opt(
        None,
        "stand in for MODEL:DEVICE (e.g. openvla-7b:rtx4090): run --policy and pad each "
        "stage to MODEL's roofline time on DEVICE at its batch",
    )
    time_scale: float = opt(1.0, "with --emulate: every emulated time divided by this")
    world: str = opt(
        "catalog",
        "with --emulate: the devices' truth (vlarun.world): catalog (the scheduler's "
        "own model: tests the link only), published, adversarial, or a world file",
    )
    dtype: str = opt("float32", "compute dtype", choices=["bfloat16", "float32"])
    max_batch: int = opt(8, "largest batch of one stage")
    batch_window_ms: float = opt(2.0, "longest wait for batch mates (bounded by deadline slack)")
    max_streams: int = opt(64, "robots' accelerated streams whose hook state (KV cache) is kept")
    max_queued: int = opt(
        256,
        "requests queued (with --workers: in flight), all robots; more are refused at "
        "once, before their tensors are read",
    )
    max_queued_per_robot: int = opt(
        16,
        "one robot's share: its requests queued and plans booked at once; beyond it its "
        "next request is refused at once (busy). With --authorized-keys, a key's queued "
        "requests are one while another key sent data in the last 10 s",
    )
    max_identities_per_key: int = opt(
        4,
        "connections one robot key may send requests from at once (its share above counts "
        "them together); a request from one more is refused at once (busy)",
    )
    refusal_hold_s: float = opt(
        1.0,
        "a handshake refused (key not authorized) beyond its address's budget (20 at once, "
        "then 5 a second) is answered this many seconds late; 0: at once",
    )
    max_frame_mb: float = opt(
        256.0,
        "largest ZeroMQ frame (the header, or one tensor) accepted, MiB; a peer sending "
        "a bigger one is disconnected",
    )
    dashboard: int | None = opt(
        None, "serve the live dashboard and /metrics on this HTTP port (0: any free port)"
    )
    dashboard_key_file: str | None = opt(
        None, "file holding the dashboard key (default: a random key, printed with the address)"
    )
    dashboard_timeout_s: float = opt(
        5.0, "a dashboard request must arrive and be answered within this (half-open peers)"
    )
    dashboard_max_connections: int = opt(64, "dashboard connections served at once")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    compile_steps: str = opt("", COMPILE_HELP)
    threads: int = opt(0, "torch threads (0: torch's default; with --workers: cores / workers)")
    workers: int = opt(
        0, "edge workers on a local Ray cluster started here (0: serve in this process)"
    )
    ray_address: str | None = opt(
        None,
        "join this Ray cluster: one worker per 'edge' resource (ray start ... "
        "--resources '{\"edge\": 1}' on each edge machine)",
    )
    ray_host: str = opt(
        "127.0.0.1",
        "with --workers: the local Ray cluster's node address; 127.0.0.1 keeps "
        "every Ray service on loopback (checked at start); another lets machines join it "
        "(Ray then listens on every interface)",
    )
    json: bool = opt(False, "print JSON lines (the endpoint on start, statistics on exit)")

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError("--workers must be >= 0")
        if self.dashboard_timeout_s <= 0 or self.dashboard_max_connections < 1:
            raise ValueError("--dashboard-timeout-s must be > 0, --dashboard-max-connections >= 1")
        if self.max_queued < 1 or not 0 < self.max_frame_mb <= 2048:
            raise ValueError("--max-queued must be >= 1 and --max-frame-mb in (0, 2048]")
        if self.max_queued_per_robot < 1:
            raise ValueError("--max-queued-per-robot must be >= 1")
        self.check_exposure()

    def check_exposure(self) -> None:
        """Beyond loopback, serving any client must be asked for: without --authorized-keys
        a Curve edge serves whoever knows its public key (which is not a secret), and an
        --insecure one whoever reaches the port."""
        from vlarun.runtime.scaleout.proctree import is_loopback

        if is_loopback(self.host) or self.allow_any_client:
            return
        if self.insecure:
            raise ValueError(
                f"--insecure on --host {self.host} serves anyone who can reach the port, "
                "unauthenticated: bind 127.0.0.1, or pass --allow-any-client to accept that"
            )
        if self.authorized_keys is None:
            raise ValueError(
                f"--host {self.host} without --authorized-keys DIR serves any client that knows "
                "the edge's public key: pass --authorized-keys (a folder of the robots' .key "
                "files), or --allow-any-client to accept that"
            )

    def server_config(self):
        """The edge's (or the front's) ``ServerConfig`` from these flags."""
        from vlarun.runtime.edge.server import ServerConfig
        from vlarun.runtime.emulate import Emulation

        emulate = None
        if self.emulate is not None:
            emulate = Emulation.parse(self.emulate, self.time_scale, world=self.world)
        return ServerConfig(
            f"tcp://{self.host}:{self.port}",
            self.max_batch,
            self.batch_window_ms * 1e-3,
            max_message_bytes=int(self.max_frame_mb * 2**20),
            max_queued=self.max_queued,
            max_queued_per_robot=self.max_queued_per_robot,
            max_streams=self.max_streams,
            max_identities_per_key=self.max_identities_per_key,
            refusal_hold_s=self.refusal_hold_s,
            emulate=emulate,
        )


def log_refusals() -> None:
    """The servers' refusal lines (``runtime.refusal_log``) to stderr, timestamped."""
    import logging

    log = logging.getLogger("vlarun.refusals")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def cmd_serve_edge(o: ServeEdgeOptions) -> dict:
    log_refusals()
    import torch

    from vlarun.models.device import resolve_device
    from vlarun.runtime.edge.server import EdgeServer
    from vlarun.runtime.transport import edge_security

    resolve_device(o.device)  # a missing GPU fails before keys are read or a port opens
    if o.dashboard is not None:
        require("prometheus_client")  # before anything loads
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    sec = edge_security(o.insecure, o.keys, o.authorized_keys)
    cfg = o.server_config()
    # SIGINT or SIGTERM while starting abandons the start at once (what was started is
    # stopped on the way out: Ray workers, their cluster and folder); once serving, it stops
    # the server in order.
    stop, serving = threading.Event(), threading.Event()

    def on_signal(signum, _frame) -> None:
        first = not stop.is_set()
        stop.set()
        if first and not serving.is_set():
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        if o.workers or o.ray_address:
            server = _scale_out(o, cfg, sec)
            model = server.model_cfg.name
        else:
            from vlarun.policy import Policy

            policy = Policy.load(o.policy, o.dtype, o.device, o.compile_steps)
            server = EdgeServer(policy, sec, cfg)
            server.warmup()
            model = policy.model.cfg.name
    except KeyboardInterrupt:
        raise RuntimeError("stopped by a signal while starting") from None
    serving.set()
    dash = None
    if o.dashboard is not None:
        from vlarun.runtime.edge.dashboard import Dashboard
        from vlarun.runtime.transport import read_secret

        key = read_secret(o.dashboard_key_file) if o.dashboard_key_file else None
        dash = Dashboard(
            server,
            o.host,
            o.dashboard,
            key,
            timeout_s=o.dashboard_timeout_s,
            max_connections=o.dashboard_max_connections,
        ).start()
    start = {"endpoint": server.address, "model": model, "secure": server.secure}
    if o.workers or o.ray_address:
        start["workers"] = len(server.worker_pids())
    if dash is not None:
        start["dashboard"] = dash.url
    if o.json:
        print(json.dumps(start), flush=True)
    else:
        how = "CurveZMQ" if server.secure else "INSECURE (plain TCP)"
        behind = f", {start['workers']} Ray workers" if "workers" in start else ""
        print(f"serving {model} on {server.address} ({how}{behind}); Ctrl-C stops", flush=True)
        if dash is not None:
            print(f"dashboard: {dash.url}", flush=True)
    try:
        with server:
            while not stop.wait(0.2):
                pass
            return {"stopped": True, **server.health()}
    finally:
        if dash is not None:
            dash.stop()


def _scale_out(o: ServeEdgeOptions, cfg, sec):
    """The robot-facing front before Ray edge workers (runtime/scaleout/front.py)."""
    import os
    from pathlib import Path

    from vlarun.runtime.scaleout.front import EdgeFront
    from vlarun.runtime.scaleout.ray_workers import RayWorkers, WorkerSpec

    name = o.policy
    if Path(name).exists():  # workers may start in another directory
        name = str(Path(name).resolve())
    threads = o.threads or max(1, (os.cpu_count() or 1) // max(o.workers, 1))
    spec = WorkerSpec(
        name,
        o.dtype,
        o.device,
        threads,
        o.max_batch,
        cfg.batch_window_s,
        o.max_streams,
        cfg.max_message_bytes,
        cfg.max_queued,
    )
    workers = RayWorkers(spec, o.workers, o.ray_address, o.ray_host)
    try:
        return EdgeFront(workers, sec, cfg)
    except BaseException:
        workers.shutdown()
        raise


def show_serve_edge(r: dict) -> None:
    print(f"stopped after {r['requests']} requests, {r['replies']} replies, {r['errors']} errors")


# ---------------------------------------------------------------------------------------------
# ping


@dataclass(frozen=True)
class PingOptions:
    """Round-trip time to an edge server and its queue state."""

    edge: str = opt(help="edge endpoint, e.g. tcp://192.168.1.10:5555")
    insecure: bool = opt(False, "plain TCP (the edge must run --insecure too)")
    server_key: str | None = opt(
        None, "the edge's public key file (default ~/.config/vlarun/keys/edge.key)"
    )
    keys: str | None = opt(None, "this robot's secret key file (default: an ephemeral key)")
    count: int = opt(5, "health requests to time")
    timeout_s: float = opt(2.0, "seconds to wait for an answer", deprecated=("--timeout",))
    json: bool = opt(False, "print one JSON object")


def cmd_ping(o: PingOptions) -> dict:
    from vlarun.runtime.robot.client import LinkDown, ping
    from vlarun.runtime.transport import robot_security

    sec = robot_security(o.insecure, o.server_key, o.keys)
    try:
        return ping(o.edge, sec, max(o.count, 1), o.timeout_s)
    except LinkDown as e:
        raise RuntimeError(str(e)) from None


def show_ping(r: dict) -> None:
    q = ", ".join(f"{k} {v}" for k, v in r["queue"].items())
    h = r["health"]
    print(
        f"{r['edge']}: rtt {r['rtt_ms']:.2f} ms (min {r['rtt_min_ms']:.2f}, max "
        f"{r['rtt_max_ms']:.2f}, n={r['count']}); {h.get('model')} queue: {q}; "
        f"{'CurveZMQ' if r['secure'] else 'INSECURE'}"
    )
    for w in h.get("workers", []):  # a scale-out front: each worker's health
        ms = ", ".join(f"{k} {v:.1f}" for k, v in w["stage_ms"].items())
        print(
            f"  worker {w['worker']}: {'up' if w['up'] else 'DOWN'} (pid {w['pid']}, "
            f"incarnation {w['incarnation']}), in flight {w['in_flight']}, "
            f"{w['replies']} replies, stage ms: {ms}"
        )


# ---------------------------------------------------------------------------------------------
# run-robot


@dataclass(frozen=True)
class RunRobotOptions:
    """Run a policy in closed loop on Meta-World as a robot: plan per request, edge stages over
    the network, local fallback, asynchronous action chunks."""

    edge: str | None = opt(
        None,
        "edge endpoint (none: everything on the robot); 'local': start an edge server "
        "for this run on loopback (CurveZMQ, keys made for the run, unless --insecure; the "
        "same policy, one thread), stopped after it",
    )
    insecure: bool = opt(False, "plain TCP (the edge must run --insecure too)")
    server_key: str | None = opt(None, "the edge's public key file")
    keys: str | None = opt(None, "this robot's secret key file (default: an ephemeral key)")
    policy: str = opt(
        DEFAULT_POLICY,
        POLICY_HELP + "; the edge must serve the same",
        replaces=POLICY_FLAGS_RETIRED,
    )
    dtype: str = opt(
        "float32", "compute dtype (must match the edge)", choices=["bfloat16", "float32"]
    )
    task: str = opt("drawer-open-v3", "Meta-World task")
    episodes: int = opt(1, "episodes")
    seed: int = opt(10000, "first episode seed")
    max_steps: int | None = opt(None, "stop an episode after this many steps")
    strategy: str = opt(
        "vlarun",
        "vlarun-placement (alias vlarun) | vlarun-joint (placement x measured settings) | "
        "device-only | edge-only | fixed-split",
    )
    settings: str | None = opt(
        None, "vlarun-joint: settings table or `bench accel` result (default: the shipped one)"
    )
    accuracy_floor: float | None = opt(
        None,
        "vlarun-joint: the floor the 95% lower bound of a setting's measured success must "
        "clear (default 0.95)",
    )
    setting: str = opt(
        "full",
        "accelerator setting of every request, run on whichever side each stage runs: "
        "full | triage:0.34 | fastv:0.18 | exit:0.5 | cache:2, joined by +",
    )
    control_hz: float = opt(20.0, "actions executed per second")
    slo_ms: float | None = opt(None, "deadline per inference (default: chunk / control rate)")
    on_time: float = opt(0.99, "the share of requests the planner holds to the deadline")
    robot_slowdown: float = opt(1.0, "stand in for a slower robot: local stages take this x longer")
    robot_device: str = opt(
        "this-cpu",
        "catalog device the robot's stages are planned and priced as (this-cpu: as measured; "
        "another: this CPU stands in, its times converted to that device's)",
    )
    edge_device: str = opt(
        "this-cpu", "catalog device the edge's stages are planned and priced as (as above)"
    )
    link_mbps: float | None = opt(None, "shape the link: a relay process at this bandwidth")
    # Round trip, as plan, fleet and ping count a link (--link-rtt-ms everywhere); the relay
    # adds half of it each way.
    link_rtt_ms: float = opt(
        0.0,
        "round-trip time the relay adds (half each way), ms",
        deprecated=(("--link-delay-ms", 2.0),),
    )
    link_schedule: str = opt("", "bandwidth changes over time, e.g. '5:4,12:200' (s:Mbit/s)")
    reduce: str = opt("none", "payload reduction on the link", choices=["none", "bf16", "int8"])
    compress: str = opt("none", "payload compression", choices=["none", "zlib", "lz4"])
    sync: bool = opt(False, "no overlap: infer, then execute the chunk")
    rtc: bool = opt(
        False,
        "real-time chunking: each request freezes the first d actions of its chunk to the ones "
        "still queued (d from the plan's p95 latency and the control rate; the freeze runs on "
        "whichever side runs the head), and a chunk replaces the queue on arrival",
    )
    meter: str = opt(
        "auto", "robot power meter read around each request: auto | none | rapl | nvml | ina3221"
    )
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    compile_steps: str = opt("", COMPILE_HELP)
    log: bool = opt(False, "print one line per inference (plan, latency vs deadline, energy)")
    json: bool = opt(False, "print one JSON object")


def cmd_run_robot(o: RunRobotOptions) -> dict:
    from vlarun.policy import Policy
    from vlarun.policy.setting import AccelSetting
    from vlarun.runtime.robot.agent import RobotAgent
    from vlarun.runtime.robot.episode import link_timeline, outage_timelines, run_episode
    from vlarun.runtime.testbed.relay import parse_schedule
    from vlarun.runtime.transport import robot_security
    from vlarun.sched.records import summarise
    from vlarun.sim.env import MetaWorldEnv, env_views

    setting = AccelSetting.parse(o.setting)  # a bad setting fails before anything loads
    if o.rtc and o.sync:
        raise ValueError(
            "--rtc freezes the actions queued while the next chunk is computed; "
            "--sync queues none (drop one)"
        )
    policy = Policy.load(o.policy, o.dtype, o.device, o.compile_steps)
    setting.check_family(policy.model.cfg.family)
    horizon = policy.model.cfg.horizon
    slo_s = (o.slo_ms * 1e-3) if o.slo_ms else horizon / o.control_hz
    cfg = agent_config(o, setting, slo_s)
    from vlarun.runtime.testbed import procs

    server, relay, edge, sec = None, None, o.edge, None
    keydir = None
    if o.edge == "local":  # keys of its own: another local user can reach a loopback port
        extra = ["--policy", o.policy, "--dtype", o.dtype, "--threads", "1"]
        if o.insecure:
            server, edge = procs.start_edge(extra=extra)
            sec = robot_security(True, None, None)
        else:
            keydir = tempfile.TemporaryDirectory(prefix="vlarun-keys-")
            sec = procs.local_keys(keydir.name)
            server, edge = procs.start_edge(extra=extra, keys=keydir.name)
    elif edge:
        sec = robot_security(o.insecure, o.server_key, o.keys)
    agent = env = None
    outages: list = []
    restore_bound_s = None
    try:  # whatever fails, the processes started here stop with it
        if edge and o.link_mbps:
            relay, edge = procs.start_relay(edge, o.link_mbps, o.link_rtt_ms / 2, o.link_schedule)
        agent = RobotAgent(policy, cfg, edge, sec)
        env = MetaWorldEnv(o.task, policy.model.cfg.image_size, **env_views(policy.model.cfg))
        log = _step_logger() if o.log else None
        obs, _ = env.reset(seed=o.seed)
        agent.warmup(policy.observation(obs)[0], env.instruction)  # every view it reads
        if relay is not None:  # the link's schedule starts with the first episode, not the set-up
            relay.send_signal(signal.SIGUSR1)
        clock0 = time.monotonic()
        episodes = [
            run_episode(agent, env, o.seed + i, o.control_hz, not o.sync, o.max_steps, log)
            for i in range(o.episodes)
        ]
        if agent.monitor is not None:  # what the link monitor saw of the edge's outages
            outages = [list(down_up) for down_up in agent.monitor.outages]
            restore_bound_s = agent.monitor.restore_bound_s
    finally:
        for part in (agent, env):
            if part is not None:
                part.close()
        for p in (relay, server):
            if p is not None:
                procs.stop(p)
        if keydir is not None:
            keydir.cleanup()
    infs = [r for e in episodes for r in e["inferences"]]
    return {
        "edge": o.edge,
        "rtc": o.rtc,
        "link": {"mbps": o.link_mbps, "rtt_ms": o.link_rtt_ms, "schedule": o.link_schedule}
        if relay is not None
        else None,
        "strategy": o.strategy,
        "setting": str(setting),
        "task": o.task,
        "slo_ms": slo_s * 1e3,
        "robot_slowdown": o.robot_slowdown,
        "on_time_target": o.on_time,
        "energy_source": summarise(infs, horizon).get("energy_source", "modelled"),
        "summary": summarise(infs, horizon),
        "link_timeline": link_timeline(infs, clock0, o.link_mbps, parse_schedule(o.link_schedule))
        if relay is not None and o.link_schedule
        else None,
        # Each time the edge stopped answering (as the link monitor saw it: [down, up] s into
        # the run), when the plans left it and when they were on it again, or why not.
        "edge_outages": outage_timelines(infs, clock0, outages) if edge else None,
        "monitor_restore_bound_s": restore_bound_s,
        "episodes": episodes,
    }


def agent_config(o: RunRobotOptions, setting, slo_s: float):
    """The robot agent's config from the command's options (``setting`` parsed, ``slo_s`` the
    deadline in seconds)."""
    from vlarun.runtime.emulate import StandIn
    from vlarun.runtime.robot.agent import AgentConfig
    from vlarun.sched.plans import DEFAULT_FLOOR
    from vlarun.stages.wire import Codec

    return AgentConfig(
        slo_s,
        o.strategy,
        Codec(o.reduce, o.compress),
        robot=StandIn(o.robot_device, o.robot_slowdown),
        edge=StandIn(o.edge_device),
        setting=setting,
        settings_file=o.settings,
        meter=o.meter,
        accuracy_floor=DEFAULT_FLOOR if o.accuracy_floor is None else o.accuracy_floor,
        rtc=o.rtc,
        on_time=o.on_time,
        # The first plan's link estimate: the shaped bandwidth where the run sets one (measured
        # transfers refine it), not a default 1 Gbit/s that sends the first plans to a slow edge.
        **({"bandwidth_mbps": o.link_mbps} if o.link_mbps else {}),
    )


def _step_logger():
    def log(i: int, inf) -> None:
        r = inf.row()
        flag = "ok  " if r["slo_met"] else "LATE"
        why = f"  fallback: {r['fallback']}" if r["fallback"] else ""
        link = f"{r['link_mbps']:7.1f} Mbit/s" if r["link_mbps"] is not None else ""
        print(
            f"{i:4d} {flag} {r['latency_ms']:7.1f} / {r['deadline_ms']:.0f} ms  "
            f"{r['energy_j']:6.3f} J  {link}  {r['ran']}{why}",
            file=sys.stderr,
            flush=True,
        )

    return log


def show_run_robot(r: dict) -> None:
    s = r["summary"]
    print(
        f"{r['strategy']} on {r['task']} (edge {r['edge'] or 'none'}, "
        f"deadline {r['slo_ms']:.0f} ms, robot slowdown {r['robot_slowdown']:g}x"
        f"{', real-time chunking' if r.get('rtc') else ''})"
    )
    for e in r["episodes"]:
        print(
            f"  seed {e['seed']}: {'success' if e['success'] else 'failure'} in "
            f"{e['steps']} steps, {e['control_hz']:.1f} Hz, {e['stalls']} stalls"
        )
    if s.get("inferences"):
        print(
            f"  {s['inferences']} inferences: p50 {s['latency_p50_ms']:.1f} ms, p99 "
            f"{s['latency_p99_ms']:.1f} ms, SLO met {100 * s['slo_met_fraction']:.1f}% "
            f"[{100 * s['slo_met_ci95'][0]:.1f}, {100 * s['slo_met_ci95'][1]:.1f}] "
            f"(target {100 * r.get('on_time_target', 0.99):g}%), "
            f"{s['fallbacks']} fallbacks, {s['actions_per_joule']:.3f} actions/J (modelled)"
        )
    t = r.get("link_timeline")
    for line in outage_lines(r.get("edge_outages") or [], t):
        print(line)
    if t and t["drop_s"] is not None:
        ms = lambda v: "never" if v is None else f"{v:.0f} ms"  # noqa: E731
        back = (
            f"; restored at {t['restore_s']:g} s, edge again after "
            f"{ms(t['edge_again_after_restore_ms'])}"
            if t["restore_s"] is not None
            else ""
        )
        print(
            f"  link dropped at {t['drop_s']:g} s: plans left the edge after "
            f"{ms(t['left_edge_after_drop_ms'])}{back}"
        )


SHOWN_OUTAGES = 3  # the longest outages printed one line each; the rest counted (all in --json)


def outage_lines(outages: list[dict], link: dict | None = None) -> list[str]:
    """One line per edge outage: when the edge stopped answering and was back, when the plans
    left it and when they were on it again, or why they were not. Outages that began while a
    shaped link (``link``: ``link_timeline``'s drop and restore) was down are counted in one
    line: the link's own line says what mattered there, and probes on a slow link flap. Past
    ``SHOWN_OUTAGES``, the longest are shown, in time order (an outage not over counts as the
    longest): on a busy edge, late health answers add short outages around the one that
    mattered."""
    ms = lambda v: "never" if v is None else f"{v:.0f} ms"  # noqa: E731
    lines = []
    drop = None if not link else link.get("drop_s")
    if drop is not None:
        restore = link.get("restore_s")
        during = [
            o for o in outages if o["down_s"] >= drop and (restore is None or o["down_s"] < restore)
        ]
        outages = [o for o in outages if o not in during]
        if during:
            until = "the end" if restore is None else f"{restore:g} s"
            lines.append(
                f"  {len(during)} edge outage(s) seen while the shaped link was down "
                f"({drop:g} s to {until}): --json has them"
            )

    def length(t: dict) -> float:
        return float("inf") if t["up_s"] is None else t["up_s"] - t["down_s"]

    longest = sorted(outages, key=length, reverse=True)[:SHOWN_OUTAGES]
    for t in sorted(longest, key=lambda t: t["down_s"]):
        down, up = t["down_s"], t["up_s"]
        head = f"  edge unanswered at {down:.1f} s"
        if up is None:
            head += ", not back before the run ended"
        else:
            head += f", back at {up:.1f} s"
        head += f": plans left the edge after {ms(t['left_edge_after_drop_ms'])}"
        if t["edge_again_after_restore_ms"] is not None:
            lines.append(
                f"{head}; on the edge again {ms(t['edge_again_after_restore_ms'])} "
                "after it was back"
            )
        else:
            lines.append(f"{head}; not on the edge again: {t['why_not_back']}")
    if len(outages) > SHOWN_OUTAGES:
        lines.append(f"  (+{len(outages) - SHOWN_OUTAGES} shorter edge outages: --json has them)")
    return lines


@dataclass(frozen=True)
class ServePolicyOptions:
    """Whole-policy inference (observation in, action chunk out) for existing robot clients:
    openpi's WebSocket protocol, so an unmodified openpi-client drives a vlarun policy."""

    policy: str = opt(DEFAULT_POLICY, POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    protocol: str = opt("openpi", "wire protocol", choices=["openpi"])
    layout: str = opt(
        "auto",
        "observation keys the client sends: checkpoint (the cameras and state its "
        "config declares, LeRobot's input_features, in the model's order), metaworld, libero; "
        "auto: checkpoint where it declares them, else metaworld",
        choices=["auto", "checkpoint", "metaworld", "libero"],
    )
    image_keys: tuple[str, ...] | None = opt(
        None, "the cameras' observation keys, in the policy's camera order (overrides the layout's)"
    )
    state_key: str | None = opt(None, "the state's observation key (overrides the layout's)")
    prompt_key: str | None = opt(None, "the instruction's observation key (default: prompt)")
    host: str = opt("127.0.0.1", "interface to listen on (0.0.0.0: every interface)")
    port: int = opt(8000, "TCP port (0: any free one, printed at start)")
    api_key_file: str | None = opt(
        None, "file holding the API key clients must send (or one key per line, one per client)"
    )
    insecure: bool = opt(False, "accept clients without an API key (warns at start)")
    max_frame_mb: float = opt(16.0, "largest request frame accepted, MiB")
    max_prompt_bytes: int = opt(4096, "longest prompt accepted, UTF-8 bytes (before tokenizing)")
    max_connections: int = opt(32, "open WebSocket connections; more are answered 503 busy")
    max_connections_per_key: int | None = opt(
        None,
        "connections one API key may hold (default: an equal share of --max-connections "
        "among the keys in --api-key-file)",
    )
    max_inflight_mb: float = opt(
        256.0, "request bytes being decoded, queued or run, all clients; beyond: busy"
    )
    budget_s: float = opt(10.0, "server-side time budget of one request; beyond: busy")
    handshake_timeout_s: float = opt(5.0, "TCP connect to WebSocket upgrade, at most")
    idle_timeout_s: float = opt(
        120.0, "close a connection that completes no request frame for this long"
    )
    first_frame_timeout_s: float = opt(
        10.0, "close a connection whose first request frame takes longer than this"
    )
    max_batch: int = opt(8, "largest batch of one stage across clients")
    batch_window_ms: float = opt(2.0, "longest wait for other clients' requests to batch with")
    dtype: str = opt("float32", "compute dtype", choices=["bfloat16", "float32"])
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    compile_steps: str = opt("", COMPILE_HELP)
    threads: int = opt(0, "torch threads (0: torch's default)")
    json: bool = opt(False, "print JSON lines (the endpoint on start, statistics on exit)")

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.batch_window_ms < 0:
            raise ValueError("--max-batch must be >= 1 and --batch-window-ms >= 0")
        if self.api_key_file is None and not self.insecure:
            raise ValueError("pass --api-key-file FILE (or --insecure to accept any client)")
        self.limits()  # the limits check themselves: a bad flag fails before the model loads

    def limits(self):
        """The server's bounds (``ServeLimits``) from these flags."""
        from vlarun.runtime.openpi import ServeLimits

        return ServeLimits(
            max_frame=int(self.max_frame_mb * 2**20),
            max_prompt_bytes=self.max_prompt_bytes,
            max_connections=self.max_connections,
            max_connections_per_key=self.max_connections_per_key,
            max_inflight_bytes=int(self.max_inflight_mb * 2**20),
            budget_s=self.budget_s,
            handshake_timeout_s=self.handshake_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            first_frame_timeout_s=self.first_frame_timeout_s,
        )


def cmd_serve_policy(o: ServePolicyOptions) -> dict:
    log_refusals()
    import asyncio

    import torch

    require("websockets")  # before the weights load
    from vlarun.policy import Policy
    from vlarun.runtime.openpi import OpenpiPolicyServer, expected_inputs

    key = None
    if o.api_key_file is not None:
        from vlarun.runtime.transport import read_keys

        key = read_keys(o.api_key_file)
    if o.threads:
        torch.set_num_threads(o.threads)
    policy = Policy.load(o.policy, o.dtype, o.device, o.compile_steps)
    layout = observation_layout(o, policy)
    _warm_up(policy)
    server = OpenpiPolicyServer(
        policy,
        layout,
        host=o.host,
        port=o.port,
        api_key=key,
        limits=o.limits(),
        max_batch=o.max_batch,
        batch_window_s=o.batch_window_ms * 1e-3,
    )

    async def main() -> None:
        ready, done = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # at any point of the server's life
            loop.add_signal_handler(sig, done.set)
        task = asyncio.create_task(server.serve(ready, done))
        started = asyncio.create_task(ready.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # it ended before listening: a busy port, a bad host, a signal
            started.cancel()
            error = task.exception()
            if isinstance(error, OSError):
                raise ValueError(
                    f"cannot listen on {o.host}:{o.port}: {error.strerror or error}"
                    " (another server on that port? pick another --port)"
                ) from None
            if error is not None:
                raise error
            return
        start = {
            "endpoint": f"ws://{o.host}:{server.port}",
            "policy": policy.model.cfg.name,
            "protocol": o.protocol,
            "layout": layout.name,
            "image_keys": list(layout.image_keys),
            "state_key": layout.state_key,
            "prompt_key": layout.prompt_key,
            "action_horizon": policy.model.cfg.horizon,
            "action_dim": policy.action_size,
            **expected_inputs(policy, layout),
            "authenticated": key is not None,
        }
        if key is None:
            print(
                "vlarun serve-policy: WARNING: --insecure, any client is accepted", file=sys.stderr
            )
        print(json.dumps(start) if o.json else f"serving {start}", flush=True)
        await task  # until SIGTERM / SIGINT set done

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return {"requests": server.requests, "policy": policy.model.cfg.name}


def observation_layout(o: ServePolicyOptions, policy):
    """The keys clients send: the named layout (``auto``: the checkpoint's declared features
    where it has them), each key overridable; refused when it names fewer cameras than the
    policy takes."""
    import dataclasses

    from vlarun.runtime.openpi import ObservationLayout, get_layout

    name = o.layout
    if name == "auto":
        name = "checkpoint" if policy.camera_keys else "metaworld"
    if name == "checkpoint":
        if not policy.camera_keys and o.image_keys is None:
            raise ValueError(
                f"{policy.model.cfg.name} declares no input features: pass --image-keys "
                "(and --state-key) or --layout metaworld|libero"
            )
        state = policy.state_key or "observation.state"
        layout = ObservationLayout("checkpoint", policy.camera_keys or tuple(o.image_keys), state)
    else:
        layout = get_layout(name)
    changes = {"image_keys": o.image_keys, "state_key": o.state_key, "prompt_key": o.prompt_key}
    layout = dataclasses.replace(layout, **{k: v for k, v in changes.items() if v is not None})
    cameras = policy.model.cfg.num_images
    if len(layout.image_keys) < cameras:
        raise ValueError(
            f"{policy.model.cfg.name} takes {cameras} cameras; the layout names "
            f"{len(layout.image_keys)} ({', '.join(layout.image_keys)}): pass "
            f"--image-keys with {cameras} keys"
        )
    return layout


def _warm_up(policy) -> None:
    """One inference before the port opens: one-time allocations and kernel choices would
    otherwise land on the first robot's first request (seconds on a CPU)."""
    import numpy as np

    cfg = policy.model.cfg
    shape = (cfg.image_size, cfg.image_size, 3)
    image = np.zeros(shape if cfg.num_images == 1 else (cfg.num_images, *shape), np.uint8)
    # The robot's width (``state_size``), not the model's padded one: LeRobot's normaliser
    # checks it, and pi05 writes the state into its prompt.
    state = np.zeros(policy.state_size, np.float32) if policy.state_size else None
    policy.predict(image, "warm up", state=state)


def show_serve_policy(r: dict) -> None:
    print(f"served {r['requests']} requests ({r['policy']})")


OPTIONS = {
    "serve-policy": ServePolicyOptions,
    "keys": KeysOptions,
    "serve-edge": ServeEdgeOptions,
    "ping": PingOptions,
    "run-robot": RunRobotOptions,
}
RUN = {
    "serve-policy": cmd_serve_policy,
    "keys": cmd_keys,
    "serve-edge": cmd_serve_edge,
    "ping": cmd_ping,
    "run-robot": cmd_run_robot,
}
SHOW = {
    "serve-policy": show_serve_policy,
    "keys": show_keys,
    "serve-edge": show_serve_edge,
    "ping": show_ping,
    "run-robot": show_run_robot,
}
