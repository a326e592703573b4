"""`vlarun eval`: closed-loop success of a policy on Meta-World, on held-out seeds.

Each episode resets the task at seed ``EVAL_SEED_OFFSET + seed + i`` (demonstrations use seeds
below the offset, so no evaluated layout was seen in training), then runs the policy until success
or the task's step limit. The policy predicts a chunk of K actions per inference and all K are
executed before the next observation (open-loop chunking, as OpenVLA-OFT does), so actions/s is
K x inferences/s. Latency is per inference, model stages only (the sum of the stage graph's
timings), in process; the rest of each inference's wall time (observation preprocessing,
tokenizing, building the input packet) is reported beside it as overhead, and the control rate
is priced on both. The first inference of each worker (warm-up) is excluded.

An episode can also run a chunk execution method (``runtime.chunks.EXECUTIONS``: synchronous,
naive asynchronous, blended, real-time chunking) under an emulated inference delay of
``delay_steps`` control ticks (``runtime.episode.run_loop``): what `vlarun bench rtc` sweeps.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.accel.rtc import RTCRequest
from vlarun.config import COMPILE_HELP, DEFAULT_POLICY, POLICY_FLAGS_RETIRED, POLICY_HELP, opt
from vlarun.extras import SIM, require
from vlarun.paths import checkpoints_dir, policy_dir
from vlarun.runtime.robot.chunks import EXECUTIONS
from vlarun.runtime.robot.episode import run_loop
from vlarun.sim.tasks import EVAL_SEED_OFFSET, get_task, parse_tasks

TRAIN_TASKS = (
    "reach-v3",
    "push-v3",
    "drawer-open-v3",
    "button-press-topdown-v3",
    "door-open-v3",
    "window-open-v3",
)
POLICY_DIR = checkpoints_dir()  # kept for callers; vlarun.paths is the source


# Episodes per task: a seed list is built up front, so the count is bounded before it is (a
# 20-digit --episodes grew to 6.1 GB in 45 s); 10,000 per task is ~2 days of MT10 on one core.
MAX_EPISODES = 10_000


@dataclass(frozen=True)
class EvalConfig:
    """Closed-loop evaluation on held-out Meta-World seeds."""

    policy: str = opt(DEFAULT_POLICY, POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    tasks: tuple[str, ...] = opt(tuple(TRAIN_TASKS), "Meta-World tasks (names, or mt10)")
    episodes: int = opt(25, "episodes per task")
    seed: int = opt(0, f"first held-out seed, offset by {EVAL_SEED_OFFSET}")
    workers: int = opt(0, "worker processes; 0 = one per core (at most 4)")
    json: bool = opt(False, "print one JSON object")
    report: str | None = opt(None, "directory for eval.json, eval.png and episode.gif")
    paired_with: str | None = opt(
        None,
        "a second configuration run on the very same seeds, reported as a paired difference: "
        "a token method on this policy (METHOD[:BUDGET], e.g. drop-all:0.07, triage:0.34), an "
        "accelerator setting (exit:0.5, cache:5, int8), an EfficientVLA part (evla:layers4) or "
        "another policy (name or directory)",
    )
    bootstrap: int = opt(2000, "bootstrap resamples of the paired difference's 95% interval")
    demos: str = opt("data/mt10p-clean", "demo frames calibrating --paired-with evla:PART")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    compile_steps: str = opt("", COMPILE_HELP)

    def __post_init__(self) -> None:
        if not 1 <= self.episodes <= MAX_EPISODES:
            raise ValueError(
                f"--episodes must lie in 1..{MAX_EPISODES} per task, got {self.episodes}"
            )
        for t in self.task_list:
            get_task(t)  # unknown names raise, listing the valid ones
        if self.paired_with is not None:
            check_candidate(self.paired_with)  # a malformed spec fails here
        if not 100 <= self.bootstrap <= 1_000_000:
            raise ValueError(f"--bootstrap must lie in 100..1000000, got {self.bootstrap}")
        from vlarun.models.static_step import COMPILE_MODES

        if self.compile_steps and self.compile_steps not in COMPILE_MODES:
            raise ValueError(
                f"--compile-steps must be one of {', '.join(COMPILE_MODES)} (or "
                f"empty: eager), got {self.compile_steps!r}"
            )

    @property
    def task_list(self) -> list[str]:
        """The tasks; ``mt10`` names Meta-World's MT10 suite (what the mt10-* policies learn)."""
        return parse_tasks(self.tasks)

    @property
    def checkpoint_dir(self) -> Path:
        return policy_dir(self.policy)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


# Configurations that are accelerator settings of the policy itself (``AccelSetting.parse``):
# Jacobi early exit, the diffusion cache, weight-only int8 (``transforms.int8``).
SETTING_HEADS = ("exit", "cache", "int8")


def shared_layer(spec: str) -> tuple[str, int | None]:
    """``METHOD:BUDGET@L`` -> (``METHOD:BUDGET``, L): TRIAGE's signals taken at layer L, and
    every token kept through it (the default, L = 2, is the paper's depth; L = 0 on a 12-layer
    LM is its share of the depth, 3 of 32 layers). (spec, None) without ``@``, or when the
    spec names no token method (a policy directory may hold an ``@``)."""
    from vlarun.policy.methods import METHODS, SHARED_LAYER_METHODS

    head, at, layer = spec.partition("@")
    method = head.partition(":")[0]
    if not at or method not in METHODS:
        return spec, None
    if method not in SHARED_LAYER_METHODS:
        raise ValueError(
            f"only {', '.join(SHARED_LAYER_METHODS)} take a shared layer (@L), got {spec!r}"
        )
    if not layer.isdigit():
        raise ValueError(f"the layer in {spec!r} must be a whole number >= 0, e.g. @0")
    return head, int(layer)


def candidate_spec(spec: str) -> tuple[str, float, int | None] | None:
    """``METHOD[:BUDGET][@L]`` -> (method, budget fraction, shared layer or None); None when
    ``spec`` is not a token method (an accelerator setting, an EfficientVLA part, or a policy)."""
    from vlarun.policy.methods import BUDGETLESS, METHODS

    spec, layer = shared_layer(spec)
    method, _, budget = spec.partition(":")
    if method not in METHODS:
        return None
    if budget and method in BUDGETLESS:
        raise ValueError(f"{method} takes no budget (got {spec!r})")
    try:
        fraction = float(budget) if budget else 0.34
    except ValueError:
        raise ValueError(f"budget in {spec!r} must be a fraction, e.g. 0.34") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"budget in {spec!r} must be in (0, 1], got {fraction}")
    return method, fraction, layer


def check_candidate(spec: str) -> None:
    """Raise ValueError naming what is wrong with a configuration spec (before any episode);
    a spec that is none of the accelerator forms must name a policy (checked when loaded)."""
    from vlarun.policy.methods import DEPTH_PARTS
    from vlarun.policy.setting import AccelSetting

    if candidate_spec(spec) is not None:
        return
    head, _, rest = spec.partition(":")
    if head == "evla":
        if rest not in DEPTH_PARTS:
            raise ValueError(f"unknown EfficientVLA part {rest!r}; valid: {', '.join(DEPTH_PARTS)}")
    elif head in SETTING_HEADS or "+" in spec:
        AccelSetting.parse(spec)
    elif rest:  # METHOD:VALUE with no such method (a policy name has no colon)
        from vlarun.policy.methods import METHODS

        valid = ", ".join((*METHODS, *SETTING_HEADS, "evla"))
        raise ValueError(f"unknown method {head!r} in {spec!r}; valid: {valid}")


def build_candidate(policy, spec: str, demos: str | None = None):
    """The configuration ``spec`` names, built from (or beside) ``policy``:

    METHOD[:BUDGET]   a token method at a budget (``triage:0.34``, ``vla-cache-uncapped``);
                      TRIAGE, drop-all and keep-all also ``@L``: their shared layer
                      (``drop-all:0.07@0``; ``shared_layer``);
    exit:S, cache:N, int8   an accelerator setting (``AccelSetting.parse``; parts joined
                      by +; int8: weight-only int8 LM and action head);
    evla:PART         an EfficientVLA part on depth (``policy.methods.DEPTH_PARTS``), whose
                      layer and activation scores are calibrated on 32 frames of ``demos``;
    anything else     another policy (shipped name or directory)."""
    from vlarun.policy import Policy
    from vlarun.policy.methods import DEPTH_PARTS, token_policy

    check_candidate(spec)
    parsed = candidate_spec(spec)
    if parsed is not None:
        method, budget, layer = parsed
        depth = policy.model.cfg.llm.num_layers
        if layer is not None and layer >= depth - 1:
            raise ValueError(
                f"{spec}: the shared layer must be < {depth - 1} (the LM has "
                f"{depth} layers and the rest must follow it)"
            )
        return policy.with_hooks(token_policy(method, budget, policy.calibration, layer=layer))
    head, _, rest = spec.partition(":")
    if head == "evla":
        from vlarun.sim.layer_table import calibration_frames

        part = DEPTH_PARTS[rest]
        frames = None
        if part.layers_removed or (part.mlp_sparsity and part.mlp_score == "activation"):
            if demos is None:
                raise ValueError(f"{spec} needs demonstration frames to calibrate on (--demos)")
            frames = calibration_frames(policy, Path(demos), 32, 0)
        return part.apply(policy, frames)
    if head in SETTING_HEADS or "+" in spec:
        return policy.with_setting(spec)
    return Policy.load(spec)


def paired_difference(
    base: list[bool], other: list[bool], resamples: int = 2000, seed: int = 0
) -> dict:
    """Success of ``other`` minus ``base`` over the same episodes, with a paired bootstrap
    95% interval (episodes resampled together, so layout difficulty cancels) and the
    discordant counts (episodes only one of the two solved)."""
    if len(base) != len(other) or not base:
        raise ValueError(
            f"paired runs need equal, non-empty episode lists ({len(base)}, {len(other)})"
        )
    a = np.asarray(base, dtype=float)
    b = np.asarray(other, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    diffs = (b[idx] - a[idx]).mean(axis=1)
    return {
        "difference": float(b.mean() - a.mean()),
        "ci95": [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))],
        "episodes": len(a),
        "only_base": int(((a == 1) & (b == 0)).sum()),
        "only_other": int(((a == 0) & (b == 1)).sum()),
    }


def run_episode(
    policy,
    env,
    seed: int,
    on_inference=None,
    frames: list | None = None,
    *,
    execution: str | None = None,
    delay_steps: int = 0,
    control_hz: float = 20.0,
) -> dict:
    """One closed-loop episode in simulated time (``runtime.episode.run_loop``): infer a chunk,
    execute it, repeat until success or the limit.

    ``on_inference(obs, run)`` sees every observation and its graph run (fidelity recording);
    ``frames``, if given, receives every camera image (the report's GIF). ``execution``: a
    chunk execution method (``EXECUTIONS``) with every result withheld ``delay_steps`` ticks
    of a ``control_hz`` robot; the episode then also reports its stalls, the ticks the policy
    acted in, and the jerk of the executed actions at each chunk seam (``seam_jerks``).
    """
    policy.reset()  # a hooked policy's state (its KV cache, ...) starts afresh
    method = None if execution is None else EXECUTIONS[execution]
    horizon = policy.model.cfg.horizon

    def infer(obs: dict, prior):
        t0 = time.perf_counter()
        image, state = policy.observation(obs)
        rtc = None
        if method is not None and method.rtc and prior.model is not None:
            # The emulated delay is the plan's latency, known exactly: d = delay_steps.
            rtc = RTCRequest.build(prior.model, horizon, prior.latency_s or 0.0, prior.period_s)
        run = policy.run_stages(image, env.instruction, state=state, rtc=rtc)
        ms = (time.perf_counter() - t0) * 1e3  # wall: stages + overhead
        if on_inference is not None:
            on_inference(obs, run)
        chunk = run.outputs["actions"][0]
        frozen = None if rtc is None else rtc.delay
        return policy.unnormalize(chunk), (ms, run.timings, chunk.float().numpy(), frozen)

    if method is None:
        r = run_loop(infer, env, seed, horizon, frames=frames)
    else:
        executed: list = []
        r = run_loop(
            infer,
            env,
            seed,
            horizon,
            control_hz,
            method.asynchronous,
            frames=frames,
            merge=method.merge,
            delay_steps=delay_steps,
            model_of=lambda rec: rec[2],
            executed=executed,
        )
    stages: dict[str, list[float]] = {}
    latency, overhead = [], []
    for rec in r["records"]:
        for t in rec[1]:
            stages.setdefault(t.name, []).append(t.seconds * 1e3)
        latency.append(sum(t.seconds for t in rec[1]) * 1e3)
        overhead.append(rec[0] - latency[-1])
    out = {
        "seed": seed,
        "success": r["success"],
        "steps": r["steps"],
        "latency_ms": latency,
        "overhead_ms": overhead,
        "stages_ms": stages,
    }
    if method is not None:
        out |= {
            "stalls": r["stalls"],
            "stall_ticks": round(r["stall_ms_total"] * control_hz / 1e3),
            "startup_ticks": round(r["startup_ms"] * control_hz / 1e3),
            "skipped_actions": r["skipped_actions"],
            "seam_jerk": seam_jerks(np.stack(executed), r["seams"]) if executed else [],
            "frozen": [rec[3] for rec in r["records"] if rec[3] is not None],
        }
    return out


def seam_jerks(executed: np.ndarray, seams: list[int], dims: slice = slice(None)) -> list[float]:
    """The jerk at each chunk seam: the largest norm of the executed actions' third difference
    a[k] - 3 a[k-1] + 3 a[k-2] - a[k-3] over the windows k = t .. t + 2 that straddle the switch
    between ticks t - 1 and t (a seam at tick t), in action units per tick^3. ``executed``
    (T, A) holds every action the robot was commanded (before the environment bounds it),
    the hold actions of stall ticks included. ``dims``: the action parts measured (all; the
    hand's xyz is ``slice(0, 3)``)."""
    out = []
    for t in seams:
        ks = [k for k in range(t, t + 3) if 3 <= k < len(executed)]
        if not ks:
            continue
        a = executed[:, dims]
        j = [a[k] - 3 * a[k - 1] + 3 * a[k - 2] - a[k - 3] for k in ks]
        out.append(float(max(np.linalg.norm(x) for x in j)))
    return out


@dataclass(frozen=True)
class EpisodeJob:
    """Episodes one worker runs: ``seeds`` of ``task`` with the configuration ``spec`` of the
    policy at ``checkpoint`` (None: the policy itself).

    keep_frames: the first episode's camera images come back (the report's GIF);
    record: what the policy saw (views, state) and answered (its normalised chunk) in the
        first ``record`` episodes comes back, for action fidelity;
    replay: recorded episodes ((instruction, [(views, state, chunk), ...]), ...) on which the
        configuration's mean |chunk - recorded chunk| is measured after the episodes;
    demos: calibration frames for configurations that need them (``build_candidate``);
    max_steps: episode step limit (None: the task's);
    execution, delay_steps, control_hz: a chunk execution method under an emulated delay
        (``run_episode``; None: whole chunks, no delay)."""

    checkpoint: str
    task: str
    seeds: tuple[int, ...]
    spec: str | None = None
    device: str = "cpu"
    compile_steps: str = ""  # a static_step compile mode; "" eager
    keep_frames: bool = False
    record: int = 0
    replay: tuple = ()
    demos: str | None = None
    max_steps: int | None = None
    execution: str | None = None
    delay_steps: int = 0
    control_hz: float = 20.0


def run_job(job: EpisodeJob) -> dict:
    """Worker: load the policy once, run the job's episodes; {"episodes", "summary",
    "action_errors"}. The first inference of the worker is a warm-up and is dropped from the
    latencies."""
    import torch

    from vlarun.sim.env import MetaWorldEnv, env_views

    torch.set_num_threads(int(os.environ.get("VLARUN_EVAL_THREADS", "1")))
    policy = _loaded(job.checkpoint, job.device, job.compile_steps)
    if job.spec is not None:
        policy = build_candidate(policy, job.spec, job.demos)
    _check_action_space(policy)
    env = MetaWorldEnv(job.task, max_steps=job.max_steps, **env_views(policy.model.cfg))
    results = []
    for i, seed in enumerate(job.seeds):
        frames = [] if job.keep_frames and i == 0 else None
        seen: list = []

        def keep(obs, run, out=seen):
            out.append((*policy.observation(obs), run.outputs["actions"][0].float().numpy()))

        r = run_episode(
            policy,
            env,
            seed,
            frames=frames,
            on_inference=keep if i < job.record else None,
            execution=job.execution,
            delay_steps=job.delay_steps,
            control_hz=job.control_hz,
        )
        if i == 0:
            r["latency_ms"], r["overhead_ms"] = r["latency_ms"][1:], r["overhead_ms"][1:]
            r["stages_ms"] = {k: v[1:] for k, v in r["stages_ms"].items()}
        if frames is not None:
            r["frames"] = np.stack(frames)
        if i < job.record:
            r["recorded"] = (env.instruction, seen)
        results.append({"task": job.task} | r)
    env.close()
    # The policy's per-step statistics run over all the job's episodes (reset() keeps them),
    # so one summary at the end covers each step once; taken before the replay adds steps.
    summary = policy.stats.summary() if policy.hooks is not None else {}
    return {
        "episodes": results,
        "summary": summary,
        "action_errors": replay_errors(policy, job.replay),
    }


@functools.lru_cache(maxsize=1)
def _loaded(checkpoint: str, device: str, compile_steps: str = ""):
    """The plain policy at ``checkpoint``, loaded once per worker process: a worker that runs
    several jobs of one checkpoint (a sweep over methods and delays) does not reload it.
    Safe to share: every configuration built from it (``build_candidate``) is a new Policy,
    and the plain one carries no hook state."""
    from vlarun.models import static_step
    from vlarun.policy.base import Policy

    policy = Policy.from_checkpoint(checkpoint).to(device)
    if compile_steps:  # every configuration built from it shares the model and so its steps
        policy.model.steps = static_step.compile_steps(compile_steps, denoise=True)
    return policy


def merge_summaries(summaries: list[dict]) -> dict:
    """Decision counts and FLOPs ratio per inference over several summaries (episodes, or jobs),
    each weighted by its steps; {} when none ran a step."""
    summaries = [s for s in summaries if s.get("steps")]
    total = sum(s["steps"] for s in summaries)
    if not total:
        return {}
    keys = [k for k in summaries[0] if k != "steps"]
    return {"steps": total} | {k: sum(s[k] * s["steps"] for s in summaries) / total for k in keys}


def replay_errors(policy, replay: tuple) -> list[float]:
    """|chunk - recorded chunk| means over recorded episodes, one per observation, with the
    policy reset before each episode (what it would have answered on the reference's path)."""
    errors = []
    for instruction, obs in replay:
        policy.reset()
        for views, state, ref in obs:
            got = policy.run_stages(views, instruction, state=state).outputs["actions"][0]
            errors.append(float(np.abs(got.float().numpy() - ref).mean()))
    return errors


def _check_action_space(policy) -> None:
    cfg = policy.model.cfg
    if cfg.action_dim != 4:
        raise ValueError(
            f"policy {cfg.name} outputs actions of shape ({cfg.horizon}, {cfg.action_dim}); "
            "Meta-World tasks take (4,)"
        )


def evaluate(cfg: EvalConfig) -> dict:
    require(*SIM)  # in this process: worker processes would each fail on their own
    checkpoint = str(cfg.checkpoint_dir)
    from vlarun.models.device import resolve_device
    from vlarun.policy.base import Policy

    device = str(resolve_device(cfg.device))  # before any policy loads
    policy = Policy.from_checkpoint(checkpoint)
    _check_action_space(policy)  # fail before spawning workers
    workers = cfg.workers or max(1, min(os.cpu_count() or 1, 4))
    if cfg.paired_with is not None:
        _check_action_space(build_candidate(policy, cfg.paired_with))  # fail before any episode
    specs = [None] if cfg.paired_with is None else [None, cfg.paired_with]
    jobs = []
    for spec in specs:
        for task in cfg.task_list:
            seeds = [EVAL_SEED_OFFSET + cfg.seed + i for i in range(cfg.episodes)]
            keep = cfg.report is not None and spec is None
            jobs += [
                EpisodeJob(
                    checkpoint, task, chunk, spec, device, cfg.compile_steps, keep, demos=cfg.demos
                )
                for chunk in split_seeds(seeds, workers, len(cfg.task_list))
            ]
    t0 = time.time()
    runs = [r["episodes"] for r in run_jobs(jobs, workers)]
    episodes = [r for job, rs in zip(jobs, runs, strict=True) if job.spec is None for r in rs]
    others = [r for job, rs in zip(jobs, runs, strict=True) if job.spec is not None for r in rs]
    recorded = [e for e in episodes if "frames" in e]
    # The GIF shows the first recorded success (or the first episode if none succeeded).
    shown = next((e for e in recorded if e["success"]), recorded[0] if recorded else None)
    frames = shown["frames"] if shown else None
    for e in recorded:
        del e["frames"]
    result = summarise(cfg, episodes, time.time() - t0, workers, policy.model.cfg.horizon)
    if others:
        result["paired"] = paired_summary(cfg, episodes, others)
    if cfg.report is not None:
        from vlarun.sim.report import write_report

        result["report"] = write_report(result, frames, cfg.report)
    return result


def split_seeds(seeds: list[int], workers: int, tasks: int) -> list[tuple[int, ...]]:
    """A task's seeds in chunks, so that ``workers`` processes stay busy over ``tasks`` tasks
    (one chunk per task when there are at least as many tasks as workers)."""
    per = math.ceil(len(seeds) / max(1, workers // tasks or 1))
    return [tuple(seeds[i : i + per]) for i in range(0, len(seeds), per)]


def run_jobs(jobs: list[EpisodeJob], workers: int, log=None) -> list[dict]:
    """``run_job`` over ``jobs`` in ``workers`` spawned processes (in this one for 1), results
    in job order; ``log`` (optional) gets a progress line per finished job."""
    t0, results = time.time(), [None] * len(jobs)

    def done(n: int, i: int) -> None:
        if log is not None:
            spent = (time.time() - t0) / 60
            job = jobs[i]
            what = job.spec or (
                f"{job.execution} delay {job.delay_steps}" if job.execution else "full"
            )
            log(
                f"{n}/{len(jobs)} jobs, {spent:.1f} min, ~{spent / n * (len(jobs) - n):.0f} min "
                f"left ({what} {job.task})"
            )

    if workers == 1:
        for i, job in enumerate(jobs):
            results[i] = run_job(job)
            done(i + 1, i)
        return results
    import multiprocessing
    from concurrent.futures import as_completed

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        for n, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            done(n, futures[fut])
    return results


def paired_summary(cfg: EvalConfig, base: list[dict], other: list[dict]) -> dict:
    """The second configuration's own summary and its paired difference to the first, overall
    and per task; episodes are matched by (task, seed)."""
    key = lambda e: (e["task"], e["seed"])  # noqa: E731
    base_by, other_by = {key(e): e for e in base}, {key(e): e for e in other}
    if set(base_by) != set(other_by):
        raise RuntimeError("paired runs did not cover the same (task, seed) episodes")
    order = sorted(base_by)
    own = summarise(cfg, other, 0.0, 0, 0)
    tasks = {}
    for t in cfg.task_list:
        keys = [k for k in order if k[0] == t]
        tasks[t] = _paired(base_by, other_by, keys, cfg.bootstrap)
    overall = _paired(base_by, other_by, order, cfg.bootstrap)
    return {
        "config": cfg.paired_with,
        "success_rate": own["success_rate"],
        "tasks_success": {t: v["success_rate"] for t, v in own["tasks"].items()},
        "latency_ms": own["latency_ms"],
        "difference": overall,
        "tasks": tasks,
        "method": "paired bootstrap over (task, seed) episodes, 95% percentile interval",
    }


def _paired(base_by: dict, other_by: dict, keys: list, resamples: int) -> dict:
    wins = lambda by: [by[k]["success"] for k in keys]  # noqa: E731
    return paired_difference(wins(base_by), wins(other_by), resamples)


def summarise(
    cfg: EvalConfig, episodes: list[dict], seconds: float, workers: int, chunk: int = 1
) -> dict:
    tasks = {}
    for task in cfg.task_list:
        eps = [e for e in episodes if e["task"] == task]
        wins = sum(e["success"] for e in eps)
        tasks[task] = {
            "success_rate": wins / len(eps),
            "episodes": len(eps),
            "ci95": list(wilson(wins, len(eps))),
            "mean_steps": statistics.mean(e["steps"] for e in eps),
            # Per seed, in order (1 solved): another run on these seeds pairs with this one.
            "outcomes": [int(e["success"]) for e in sorted(eps, key=_seed)],
        }
    wins = sum(e["success"] for e in episodes)
    lat = [x for e in episodes for x in e["latency_ms"]]
    over = [x for e in episodes for x in e.get("overhead_ms", [0.0] * len(e["latency_ms"]))]
    wall = [a + b for a, b in zip(lat, over, strict=True)]
    stage_names = list(dict.fromkeys(s for e in episodes for s in e["stages_ms"]))  # graph order
    stages = {
        s: _pcts([x for e in episodes for x in e["stages_ms"].get(s, [])]) for s in stage_names
    }
    return {
        "policy": cfg.policy,
        "success_rate": wins / len(episodes),
        "ci95": list(wilson(wins, len(episodes))),
        "episodes": len(episodes),
        "tasks": tasks,
        "latency_ms": _pcts(lat),
        "overhead_ms": _pcts(over),
        "actions_per_inference": chunk,
        # Open-loop chunks: K actions per inference, so the sustainable rate is K over the
        # inference's whole wall time (stages + overhead).
        "control_rate_hz": chunk * 1e3 / _pcts(wall)["p50"] if wall else None,
        "stages_ms": stages,
        "latency_scope": (
            "per inference, model stages only (sum of the stage times), in process, warm-up "
            "excluded; overhead_ms: the rest of its wall time (observation preprocessing, "
            "tokenizing, input packet)"
        ),
        "seeds": f"{EVAL_SEED_OFFSET + cfg.seed}..{EVAL_SEED_OFFSET + cfg.seed + cfg.episodes - 1}",
        "wall_s": round(seconds, 1),
        "workers": workers,
    }


def _seed(episode: dict) -> int:
    return episode["seed"]


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None, "mean": None, "n": 0}
    arr = np.asarray(xs)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
        "n": len(xs),
    }


def format_report(r: dict) -> str:
    lines = [
        f"{r['policy']}: success {r['success_rate']:.1%} "
        f"(95% CI {r['ci95'][0]:.1%}-{r['ci95'][1]:.1%}), {r['episodes']} episodes, "
        f"seeds {r['seeds']}"
    ]
    for t, v in r["tasks"].items():
        lines.append(
            f"  {t:<26}{v['success_rate']:>7.1%}  ({v['ci95'][0]:.0%}-{v['ci95'][1]:.0%}"
            f", n={v['episodes']}, mean {v['mean_steps']:.0f} steps)"
        )
    lat = r["latency_ms"]
    if lat["n"]:
        lines.append(
            f"  latency per inference ({r['latency_scope']}): p50 {lat['p50']:.1f} ms, "
            f"p99 {lat['p99']:.1f} ms; control rate {r['control_rate_hz']:.0f} actions/s "
            f"({r['actions_per_inference']} per inference)"
        )
        over = r.get("overhead_ms")
        if over and over["n"]:
            lines.append(
                f"    + overhead     p50 {over['p50']:.1f} ms  p99 {over['p99']:.1f} ms "
                "(preprocessing, tokenizing, packet: not a stage)"
            )
        for s, v in r["stages_ms"].items():
            lines.append(f"    {s:<14} p50 {v['p50']:.1f} ms  p99 {v['p99']:.1f} ms")
    p = r.get("paired")
    if p:
        d = p["difference"]
        lines.append(
            f"  paired with {p['config']}: success {p['success_rate']:.1%}, difference "
            f"{d['difference']:+.1%} (95% CI {d['ci95'][0]:+.1%} to {d['ci95'][1]:+.1%}; "
            f"{d['only_base']} episodes solved only without it, {d['only_other']} only with it)"
        )
        for t, v in p["tasks"].items():
            lines.append(
                f"    {t:<26}{v['difference']:>+7.1%}  ({v['ci95'][0]:+.0%} to {v['ci95'][1]:+.0%})"
            )
    for kind, path in r.get("report", {}).items():
        lines.append(f"  report {kind}: {path}")
    return "\n".join(lines)
