"""`vlarun eval`: closed-loop success of a policy on Meta-World, on held-out seeds.

Each episode resets the task at seed ``EVAL_SEED_OFFSET + seed + i`` (demonstrations use seeds
below the offset, so no evaluated layout was seen in training), then runs the policy until success
or the task's step limit. The policy predicts a chunk of K actions per inference and all K are
executed before the next observation (open-loop chunking, as OpenVLA-OFT does), so actions/s is
K x inferences/s. Latency is per inference, model stages only, in process, and the first
inference of each worker (warm-up) is excluded.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.config import opt
from vlarun.sim.demos import EVAL_SEED_OFFSET
from vlarun.sim.tasks import get_task

TRAIN_TASKS = (
    "reach-v3",
    "push-v3",
    "drawer-open-v3",
    "button-press-topdown-v3",
    "door-open-v3",
    "window-open-v3",
)
POLICY_DIR = Path(__file__).resolve().parents[2] / "checkpoints"


@dataclass(frozen=True)
class EvalConfig:
    """Closed-loop evaluation on held-out Meta-World seeds."""

    policy: str = opt("tiny-ar", "shipped policy under checkpoints/ (tiny-ar, tiny-oft, tiny-dit)")
    checkpoint: str | None = opt(None, "policy checkpoint directory (overrides --policy)")
    tasks: str = opt(",".join(TRAIN_TASKS), "comma-separated Meta-World tasks")
    episodes: int = opt(25, "episodes per task")
    seed: int = opt(0, f"first held-out seed, offset by {EVAL_SEED_OFFSET}")
    workers: int = opt(0, "worker processes; 0 = one per core (at most 4)")
    json: bool = opt(False, "print one JSON object")
    report: str | None = opt(None, "directory for eval.json, eval.png and episode.gif")

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        for t in self.task_list:
            get_task(t)  # unknown names raise, listing the valid ones

    @property
    def task_list(self) -> list[str]:
        return [t for t in self.tasks.split(",") if t]

    @property
    def checkpoint_dir(self) -> Path:
        if self.checkpoint:
            return Path(self.checkpoint)
        path = POLICY_DIR / self.policy
        if not path.exists():
            shipped = sorted(p.name for p in POLICY_DIR.glob("*")) if POLICY_DIR.exists() else []
            raise ValueError(f"no shipped policy {self.policy!r}; shipped: {shipped}")
        return path


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def run_episode(policy, env, seed: int, on_inference=None, frames: list | None = None) -> dict:
    """One closed-loop episode: infer a chunk, execute it, repeat until success or the limit.

    ``on_inference(obs, run)`` sees every observation and its graph run (fidelity recording);
    ``frames``, if given, receives every camera image (the report's GIF).
    """
    if hasattr(policy, "reset"):  # stateful (accelerated) policies start each episode afresh
        policy.reset()
    obs, _ = env.reset(seed=seed)
    steps, latencies, stages, success = 0, [], {}, False
    if frames is not None:
        frames.append(obs["image"])
    while True:
        t0 = time.perf_counter()
        image, state = policy.observation(obs)
        run = policy.run_stages(image, env.instruction, state=state)
        latencies.append((time.perf_counter() - t0) * 1e3)
        for t in run.timings:
            stages.setdefault(t.name, []).append(t.seconds * 1e3)
        if on_inference is not None:
            on_inference(obs, run)
        done = False
        for action in policy.unnormalize(run.outputs["actions"][0]):
            obs, _, terminated, truncated, info = env.step(np.clip(action, -1, 1))
            steps += 1
            if frames is not None:
                frames.append(obs["image"])
            if terminated or truncated:
                success, done = bool(info["success"]), True
                break
        if done:
            break
    return {"seed": seed, "success": success, "steps": steps, "latency_ms": latencies,
            "stages_ms": stages}  # fmt: skip


def _run_episodes(job: tuple[str, str, list[int], bool]) -> list[dict]:
    """Worker: load the policy once, run the given (task, seed) episodes.

    The first inference of the worker is a warm-up and is dropped from the latencies. With
    ``keep_frames`` the first episode's camera images come back too (for the report's GIF).
    """
    import torch

    from vlarun.models.policy import Policy
    from vlarun.sim.env import MetaWorldEnv, env_views

    torch.set_num_threads(int(os.environ.get("VLARUN_EVAL_THREADS", "1")))
    checkpoint, task, seeds, keep_frames = job
    policy = Policy.from_checkpoint(checkpoint)
    _check_action_space(policy)
    env = MetaWorldEnv(task, **env_views(policy.model.cfg))
    results = []
    for i, seed in enumerate(seeds):
        frames = [] if keep_frames and i == 0 else None
        r = run_episode(policy, env, seed, frames=frames)
        if i == 0:
            r["latency_ms"] = r["latency_ms"][1:]
            r["stages_ms"] = {k: v[1:] for k, v in r["stages_ms"].items()}
        if frames is not None:
            r["frames"] = np.stack(frames)
        results.append({"task": task} | r)
    env.close()
    return results


def _check_action_space(policy) -> None:
    cfg = policy.model.cfg
    if cfg.action_dim != 4:
        raise ValueError(
            f"policy {cfg.name} outputs actions of shape ({cfg.horizon}, {cfg.action_dim}); "
            "Meta-World tasks take (4,)"
        )


def evaluate(cfg: EvalConfig) -> dict:
    checkpoint = str(cfg.checkpoint_dir)
    from vlarun.models.policy import Policy

    policy = Policy.from_checkpoint(checkpoint)
    _check_action_space(policy)  # fail before spawning workers
    workers = cfg.workers or max(1, min(os.cpu_count() or 1, 4))
    jobs = []
    for task in cfg.task_list:
        seeds = [EVAL_SEED_OFFSET + cfg.seed + i for i in range(cfg.episodes)]
        per = math.ceil(len(seeds) / max(1, workers // len(cfg.task_list) or 1))
        jobs += [
            (checkpoint, task, seeds[i : i + per], cfg.report is not None)
            for i in range(0, len(seeds), per)
        ]
    t0 = time.time()
    if workers == 1:
        episodes = [r for job in jobs for r in _run_episodes(job)]
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            episodes = [r for rs in pool.map(_run_episodes, jobs) for r in rs]
    recorded = [e for e in episodes if "frames" in e]
    # The GIF shows the first recorded success (or the first episode if none succeeded).
    shown = next((e for e in recorded if e["success"]), recorded[0] if recorded else None)
    frames = shown["frames"] if shown else None
    for e in recorded:
        del e["frames"]
    result = summarise(cfg, episodes, time.time() - t0, workers, policy.model.cfg.horizon)
    if cfg.report is not None:
        from vlarun.sim.report import write_report

        result["report"] = write_report(result, frames, cfg.report)
    return result


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
        }
    wins = sum(e["success"] for e in episodes)
    lat = [x for e in episodes for x in e["latency_ms"]]
    stage_names = list(dict.fromkeys(s for e in episodes for s in e["stages_ms"]))  # graph order
    stages = {
        s: _pcts([x for e in episodes for x in e["stages_ms"].get(s, [])]) for s in stage_names
    }
    return {
        "policy": cfg.checkpoint or cfg.policy,
        "success_rate": wins / len(episodes),
        "ci95": list(wilson(wins, len(episodes))),
        "episodes": len(episodes),
        "tasks": tasks,
        "latency_ms": _pcts(lat),
        "actions_per_inference": chunk,
        # Open-loop chunks: K actions per inference, so the sustainable rate is K / latency.
        "control_rate_hz": chunk * 1e3 / _pcts(lat)["p50"] if lat else None,
        "stages_ms": stages,
        "latency_scope": "per inference, model stages only, in process, warm-up excluded",
        "seeds": f"{EVAL_SEED_OFFSET + cfg.seed}..{EVAL_SEED_OFFSET + cfg.seed + cfg.episodes - 1}",
        "wall_s": round(seconds, 1),
        "workers": workers,
    }


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
        for s, v in r["stages_ms"].items():
            lines.append(f"    {s:<14} p50 {v['p50']:.1f} ms  p99 {v['p99']:.1f} ms")
    for kind, path in r.get("report", {}).items():
        lines.append(f"  report {kind}: {path}")
    return "\n".join(lines)
