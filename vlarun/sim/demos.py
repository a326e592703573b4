"""Scripted-expert demonstrations on Meta-World, stored as safetensors shards + a JSON manifest.

``collect(["reach-v3"], 50, "data/demos")`` runs each task's scripted Meta-World expert in
:class:`~vlarun.sim.env.MetaWorldEnv` and writes, per task, shards of at most
``episodes_per_shard`` successful episodes::

    data/demos/
        reach-v3_000.safetensors   images uint8 (T, S, S, 3)   camera frame before each action
                                   (T, V, S, S, 3) with extra cameras: V views, main first
                                   states float32 (T, 4)       hand xyz + gripper opening
                                   actions float32 (T, 4)      expert action, clipped to [-1, 1]
                                   episode_index int32 (T,)    episode number within the shard
                                   step_index int32 (T,)       step within the episode
                                   targets float32 (T, 6)      object xyz + goal xyz (training
                                                               only: an auxiliary target)
        manifest.json              shards, tasks + instructions, every episode with its seed,
                                   success flag and frame count, failures, action statistics
        dataset_statistics.json    the statistics alone, in OpenVLA's layout

Only successful episodes are stored (an episode ends at the first success, so its last action is
the one that achieved it); failed seeds are listed in the manifest and replaced by further seeds
until each task has its episodes. DAgger collections (``--dagger POLICY``) are the exception:
a trained policy drives, every state it visits is labelled with the expert's action, and every
episode is kept with its own success flag. Nothing is pickled: arrays are safetensors, the rest
JSON.

Seeds: demo episodes of a task use seeds ``seed_start, seed_start + 1, ...``, which must stay
below :data:`EVAL_SEED_OFFSET`; evaluation uses seeds from ``EVAL_SEED_OFFSET`` up, so a learned
policy is never scored on an object/goal layout it was trained on.

Command line: ``vlarun demos --tasks reach-v3 --episodes 50 --out DIR`` (or
``python -m vlarun.sim.demos_cli`` with the same flags).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from tqdm import tqdm

from vlarun.sim.tasks import EVAL_SEED_OFFSET, get_task

if TYPE_CHECKING:  # the simulator is imported where episodes run, so that commands built on
    # these constants (eval, train, their --help) load without the `sim` extra installed
    from vlarun.sim.env import MetaWorldEnv


FORMAT = "vlarun.sim.demos/3"
"""Version 2 added ``targets`` (object and goal xyz) per frame, version 3 ``sim_states`` (the
simulator state each frame was rendered from, :meth:`MetaWorldEnv.sim_state`); older directories
still load."""
FORMATS = ("vlarun.sim.demos/1", "vlarun.sim.demos/2", FORMAT)
MANIFEST = "manifest.json"
STATISTICS = "dataset_statistics.json"
DATASET_NAME = "metaworld"  # key of the statistics, as OpenVLA names datasets
TENSORS = {
    "images": np.uint8,
    "states": np.float32,
    "actions": np.float32,
    "episode_index": np.int32,
    "step_index": np.int32,
    "targets": np.float32,
    "sim_states": np.float32,
}
# What each older format lacks.
MISSING_IN = {
    FORMATS[0]: frozenset({"targets", "sim_states"}),
    FORMATS[1]: frozenset({"sim_states"}),
}


@dataclass(frozen=True)
class DemoConfig:
    """What :func:`collect` produces.

    Attributes:
        tasks: Task names (``vlarun.sim.tasks``).
        episodes_per_task: Successful episodes wanted per task.
        image_size: Camera image side in pixels (stored at full size; augment at training time).
        seed_start: First demo seed of every task.
        workers: Processes running episodes in parallel (1 = in this process).
        episodes_per_shard: Most episodes in one shard file (~5 MB per 100-step episode at 128 px).
        camera: Camera name (``vlarun.sim.env.CAMERAS``); None = the env's default.
        extra_cameras: Further views stored beside ``camera`` (images become (T, V, S, S, 3)).
        max_attempts_factor: Give up on a task after ``factor * episodes_per_task + 10`` seeds.
        episodes_for: Per-task counts overriding ``episodes_per_task`` (more data where
            success is lost).
        dart_noise: DART (Laskey et al. 2017): Gaussian noise of this std is added to the xyz
            action the robot executes while the stored label stays the expert's clean action,
            so the data covers the states a slightly wrong policy visits and how to recover
            from them. 0 = off.
        dagger_policy: DAgger: this policy (a name ``Policy.load`` takes) drives the robot and
            the expert labels every state it visits; every episode is kept, failed or not.
            The cameras must be the policy's views.
        dagger_beta: DAgger's mixing: the share of steps that execute the expert's action.
    """

    tasks: tuple[str, ...]
    episodes_per_task: int
    image_size: int = 128
    seed_start: int = 0
    workers: int = 1
    episodes_per_shard: int = 25
    camera: str | None = None
    max_attempts_factor: float = 2.0
    extra_cameras: tuple[str, ...] = ()
    episodes_for: tuple[tuple[str, int], ...] = ()
    dart_noise: float = 0.0
    dagger_policy: str | None = None
    dagger_beta: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dagger_beta <= 1.0:
            raise ValueError(f"dagger_beta must be in [0, 1], got {self.dagger_beta}")
        if self.dagger_policy is not None and self.dart_noise:
            raise ValueError("DAgger and DART noise do not mix: the policy already errs")
        for task, n in self.episodes_for:
            if task not in self.tasks:
                raise ValueError(f"episodes_for names {task!r}, which is not among the tasks")
            if n < 1:
                raise ValueError(f"episodes_for {task}: must be >= 1, got {n}")
        if not 0.0 <= self.dart_noise <= 1.0:
            raise ValueError(f"dart_noise must be in [0, 1], got {self.dart_noise}")
        if not self.tasks:
            raise ValueError("no tasks given")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"duplicate tasks in {self.tasks}")
        for name in self.tasks:
            get_task(name)  # ValueError listing valid names
        if self.episodes_per_task < 1:
            raise ValueError(f"episodes_per_task must be >= 1, got {self.episodes_per_task}")
        if self.seed_start < 0:
            raise ValueError(f"seed_start must be >= 0, got {self.seed_start}")
        most = max(self.episodes(t) for t in self.tasks)
        if self.seed_start + most > EVAL_SEED_OFFSET:
            raise ValueError(
                f"demo seeds {self.seed_start}..{self.seed_start + most - 1} "
                f"would reach the evaluation seeds (>= EVAL_SEED_OFFSET = {EVAL_SEED_OFFSET})"
            )
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.episodes_per_shard < 1:
            raise ValueError(f"episodes_per_shard must be >= 1, got {self.episodes_per_shard}")
        from vlarun.sim.env import CAMERAS, DEFAULT_CAMERA

        for cam in (self.camera or DEFAULT_CAMERA, *self.extra_cameras):
            if cam not in CAMERAS:
                raise ValueError(f"unknown camera {cam!r}; valid: {', '.join(CAMERAS)}")
        if self.max_attempts_factor < 1.0:
            raise ValueError(f"max_attempts_factor must be >= 1, got {self.max_attempts_factor}")

    def episodes(self, task: str) -> int:
        """Successful episodes wanted for ``task``."""
        return dict(self.episodes_for).get(task, self.episodes_per_task)

    def max_attempts(self, task: str) -> int:
        """Seeds tried for ``task`` before giving up on reaching its episodes."""
        return math.ceil(self.max_attempts_factor * self.episodes(task)) + 10


@dataclass(frozen=True)
class _ShardJob:
    """One shard's worth of episodes: run in this process or shipped to a worker."""

    task: str
    seeds: tuple[int, ...]
    path: str
    image_size: int
    camera: str | None
    extra_cameras: tuple[str, ...] = ()
    dart_noise: float = 0.0
    dagger_policy: str | None = None
    dagger_beta: float = 0.0


@dataclass
class Episode:
    """One expert rollout: per-step observation and action, and whether it succeeded."""

    seed: int
    images: list[np.ndarray] = field(default_factory=list)
    states: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    sim_states: list[np.ndarray] = field(default_factory=list)
    success: bool = False

    @property
    def length(self) -> int:
        return len(self.actions)


def run_expert_episode(env: MetaWorldEnv, seed: int, dart_noise: float = 0.0) -> Episode:
    """Roll the scripted expert out in ``env`` from ``reset(seed=seed)``.

    Records (observation, expert action) before every step and stops at the first success or
    at the env's ``max_steps``. With ``dart_noise`` the executed xyz action is perturbed (noise
    drawn from a generator seeded by ``seed``, so an episode is reproducible); the label is not.
    """
    episode = Episode(seed=seed)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    while True:
        action = env.expert_action()
        episode.images.append(obs.get("views", obs["image"]))
        episode.states.append(obs["state"])
        episode.actions.append(action)
        episode.targets.append(env.targets)
        episode.sim_states.append(env.sim_state())
        executed = action
        if dart_noise:
            executed = action.copy()
            executed[:3] = np.clip(action[:3] + rng.normal(0.0, dart_noise, 3), -1.0, 1.0)
        obs, _, terminated, truncated, _ = env.step(executed)
        if terminated or truncated:
            episode.success = bool(terminated)
            return episode


class _ExpertLabels:
    """Wraps an environment for DAgger (Ross et al. 2011): before every step it records what
    the robot saw and the scripted expert's action at that state (the label), and with
    probability ``beta`` executes the expert's action instead of the policy's."""

    def __init__(self, env: MetaWorldEnv, episode: Episode, beta: float, rng) -> None:
        self.env, self.episode, self.beta, self.rng = env, episode, beta, rng
        self._obs: dict[str, np.ndarray] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self._obs = obs
        return obs, info

    def step(self, action):
        assert self._obs is not None
        expert = self.env.expert_action()
        ep = self.episode
        ep.images.append(self._obs.get("views", self._obs["image"]))
        ep.states.append(self._obs["state"])
        ep.actions.append(expert)
        ep.targets.append(self.env.targets)
        ep.sim_states.append(self.env.sim_state())
        executed = expert if self.rng.random() < self.beta else action
        obs, reward, terminated, truncated, info = self.env.step(executed)
        self._obs = obs
        return obs, reward, terminated, truncated, info


def run_dagger_episode(env: MetaWorldEnv, policy: Any, seed: int, beta: float = 0.0) -> Episode:
    """One episode driven by ``policy`` (the evaluation loop, ``sim.evaluate.run_episode``),
    every visited state labelled with the expert's action; ``success`` is the policy's."""
    from vlarun.sim.evaluate import run_episode

    episode = Episode(seed=seed)
    labelled = _ExpertLabels(env, episode, beta, np.random.default_rng(seed))
    episode.success = bool(run_episode(policy, labelled, seed)["success"])
    return episode


def _run_shard(job: _ShardJob, progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run ``job``'s episodes, write the successful ones as one shard; return JSON metadata.

    Top-level (not a closure) so a spawned worker process can run it.
    """
    from vlarun.sim.env import DEFAULT_CAMERA, MetaWorldEnv

    env = MetaWorldEnv(
        job.task,
        image_size=job.image_size,
        camera=job.camera or DEFAULT_CAMERA,
        extra_cameras=job.extra_cameras,
    )
    policy = None
    if job.dagger_policy is not None:
        import torch

        from vlarun.policy.base import Policy

        torch.set_num_threads(1)  # one worker per core
        policy = Policy.load(job.dagger_policy)
    kept: list[Episode] = []
    failures = []
    try:
        for seed in job.seeds:
            if policy is None:
                episode = run_expert_episode(env, seed, job.dart_noise)
            else:
                episode = run_dagger_episode(env, policy, seed, job.dagger_beta)
            # DAgger keeps every episode: its labels are right wherever the policy went.
            if episode.success or policy is not None:
                kept.append(episode)
            else:
                failures.append({"task": job.task, "seed": seed, "steps": episode.length})
            if progress is not None:
                progress()
    finally:
        env.close()
    shard = None
    if kept:
        tensors = {
            "images": np.stack([im for ep in kept for im in ep.images]),
            "states": np.stack([s for ep in kept for s in ep.states]).astype(np.float32),
            "actions": np.stack([a for ep in kept for a in ep.actions]).astype(np.float32),
            "episode_index": np.concatenate(
                [np.full(ep.length, i, np.int32) for i, ep in enumerate(kept)]
            ),
            "step_index": np.concatenate([np.arange(ep.length, dtype=np.int32) for ep in kept]),
            "targets": np.stack([t for ep in kept for t in ep.targets]).astype(np.float32),
            "sim_states": np.stack([x for ep in kept for x in ep.sim_states]),
        }
        metadata = {
            "format": FORMAT,
            "task": job.task,
            "instruction": get_task(job.task).instruction,
            "seeds": json.dumps([ep.seed for ep in kept]),
        }
        # Write-then-rename: an interrupted run never leaves a truncated shard under its name.
        tmp = job.path + ".tmp"
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # safetensors creates files owner-only
        os.replace(tmp, job.path)
        shard = {
            "file": Path(job.path).name,
            "task": job.task,
            "episodes": len(kept),
            "frames": int(sum(ep.length for ep in kept)),
            "bytes": os.path.getsize(job.path),
        }
    episodes = [
        {
            "task": job.task,
            "seed": ep.seed,
            "success": ep.success,
            "frames": ep.length,
            "shard": Path(job.path).name,
            "index_in_shard": i,
        }
        for i, ep in enumerate(kept)
    ]
    return {"shard": shard, "episodes": episodes, "failures": failures, "attempts": len(job.seeds)}


def action_statistics(actions: np.ndarray) -> dict[str, list[float] | list[bool]]:
    """Per-dimension action statistics over all frames, as in OpenVLA's dataset_statistics.

    ``mask`` marks the dimensions an OpenVLA-style tokenizer should normalise with q01/q99: the
    xyz deltas. The gripper effort is left out because it is already in [-1, 1] and the experts
    keep it at a constant (q01 == q99 for reach, which would divide by zero).
    """
    a = np.asarray(actions, dtype=np.float64)
    return {
        "mean": a.mean(0).tolist(),
        "std": a.std(0).tolist(),
        "min": a.min(0).tolist(),
        "max": a.max(0).tolist(),
        "q01": np.quantile(a, 0.01, axis=0).tolist(),
        "q99": np.quantile(a, 0.99, axis=0).tolist(),
        "mask": [True] * (a.shape[1] - 1) + [False],
    }


def _statistics(out_dir: Path, shards: list[dict[str, Any]]) -> dict[str, Any]:
    actions, states = [], []
    for shard in shards:
        with safe_open(str(out_dir / shard["file"]), framework="np") as f:
            actions.append(f.get_tensor("actions"))
            states.append(f.get_tensor("states"))
    act, st = np.concatenate(actions), np.concatenate(states)
    proprio = action_statistics(st)
    proprio["mask"] = [True] * st.shape[1]
    return {
        DATASET_NAME: {
            "action": action_statistics(act),
            "proprio": proprio,
            "num_transitions": int(act.shape[0]),
            "num_trajectories": int(sum(s["episodes"] for s in shards)),
        }
    }


def collect(
    tasks: Sequence[str],
    episodes_per_task: int,
    out_dir: str | os.PathLike[str],
    image_size: int = 128,
    seed_start: int = 0,
    workers: int = 1,
    *,
    episodes_per_shard: int = 25,
    camera: str | None = None,
    extra_cameras: Sequence[str] = (),
    episodes_for: dict[str, int] | None = None,
    dart_noise: float = 0.0,
    dagger_policy: str | None = None,
    dagger_beta: float = 0.0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Collect scripted-expert demos into ``out_dir``; returns the manifest (also written there).

    Seeds ``seed_start, seed_start + 1, ...`` are run per task until ``episodes_per_task``
    succeed (or ``DemoConfig.max_attempts`` seeds were tried: then a warning, and the manifest
    says how many episodes the task got). See the module docstring for the layout.

    Raises:
        FileExistsError: ``out_dir`` already holds a manifest and ``overwrite`` is False.
        ValueError: bad arguments (unknown task, seeds reaching ``EVAL_SEED_OFFSET``, ...).
    """
    cfg = DemoConfig(
        tuple(tasks),
        episodes_per_task,
        image_size,
        seed_start,
        workers,
        episodes_per_shard,
        camera,
        extra_cameras=tuple(extra_cameras),
        episodes_for=tuple((episodes_for or {}).items()),
        dart_noise=dart_noise,
        dagger_policy=dagger_policy,
        dagger_beta=dagger_beta,
    )
    out = Path(out_dir)
    if (out / MANIFEST).exists():
        if not overwrite:
            raise FileExistsError(f"{out / MANIFEST} exists; pass overwrite=True to replace it")
        _remove_collection(out)
    out.mkdir(parents=True, exist_ok=True)

    next_seed = dict.fromkeys(cfg.tasks, cfg.seed_start)
    shard_count = dict.fromkeys(cfg.tasks, 0)
    successes = dict.fromkeys(cfg.tasks, 0)
    attempts = dict.fromkeys(cfg.tasks, 0)
    shards: list[dict[str, Any]] = []
    episodes: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []

    def plan() -> list[_ShardJob]:
        """Shards for every task still short of episodes (failed seeds get replaced)."""
        jobs = []
        for task in cfg.tasks:
            missing = min(
                cfg.episodes(task) - successes[task], cfg.max_attempts(task) - attempts[task]
            )
            if missing <= 0:
                continue
            seeds = list(range(next_seed[task], next_seed[task] + missing))
            if seeds[-1] >= EVAL_SEED_OFFSET:
                raise ValueError(
                    f"{task}: replacing failed episodes needs seed {seeds[-1]} >= "
                    f"EVAL_SEED_OFFSET ({EVAL_SEED_OFFSET}); lower seed_start"
                )
            next_seed[task] += missing
            attempts[task] += missing
            for i in range(0, missing, cfg.episodes_per_shard):
                path = out / f"{task}_{shard_count[task]:03d}.safetensors"
                shard_count[task] += 1
                chunk = tuple(seeds[i : i + cfg.episodes_per_shard])
                job = _ShardJob(
                    task,
                    chunk,
                    str(path),
                    cfg.image_size,
                    cfg.camera,
                    cfg.extra_cameras,
                    cfg.dart_noise,
                    cfg.dagger_policy,
                    cfg.dagger_beta,
                )
                jobs.append(job)
        return jobs

    def record(result: dict[str, Any]) -> None:
        if result["shard"] is not None:
            shards.append(result["shard"])
        episodes.extend(result["episodes"])
        failures.extend(result["failures"])
        for ep in result["episodes"]:
            successes[ep["task"]] += 1

    total = sum(cfg.episodes(t) for t in cfg.tasks)
    bar = tqdm(total=total, desc="expert episodes", unit="ep", disable=not progress)
    pool = None
    if cfg.workers > 1:
        # spawn, not fork: a forked child would inherit the parent's GL state.
        pool = ProcessPoolExecutor(cfg.workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        while jobs := plan():
            if pool is None:
                for job in jobs:
                    record(_run_shard(job, progress=lambda: bar.update(1)))
            else:
                futures = {pool.submit(_run_shard, job): job for job in jobs}
                for future in as_completed(futures):
                    record(future.result())
                    bar.update(len(futures[future].seeds))
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown()

    for task in cfg.tasks:
        if successes[task] < cfg.episodes(task):
            warnings.warn(
                f"{task}: expert succeeded in only {successes[task]} of {attempts[task]} "
                f"episodes (wanted {cfg.episodes(task)})",
                stacklevel=2,
            )
    if not shards:
        raise RuntimeError("no successful episode in any task; nothing to store")

    from vlarun.sim.env import DEFAULT_CAMERA

    order = {t: i for i, t in enumerate(cfg.tasks)}
    shards.sort(key=lambda s: (order[s["task"]], s["file"]))
    episodes.sort(key=lambda e: (order[e["task"]], e["shard"], e["index_in_shard"]))
    failures.sort(key=lambda f: (order[f["task"]], f["seed"]))
    statistics = _statistics(out, shards)
    manifest = {
        "format": FORMAT,
        "image_size": cfg.image_size,
        "camera": cfg.camera or DEFAULT_CAMERA,
        "cameras": [cfg.camera or DEFAULT_CAMERA, *cfg.extra_cameras],
        "state": "Meta-World obs[:4]: hand xyz (m) + gripper opening (0..1)",
        "action": "xyz end-effector delta + gripper effort, each in [-1, 1]",
        "targets": "object xyz + goal xyz (m), training-only auxiliary targets",
        "dart_noise": cfg.dart_noise,
        "dagger": None
        if cfg.dagger_policy is None
        else {"policy": cfg.dagger_policy, "beta": cfg.dagger_beta},
        "eval_seed_offset": EVAL_SEED_OFFSET,
        "task_names": list(cfg.tasks),
        "tasks": {
            t: {
                "instruction": get_task(t).instruction,
                "max_steps": get_task(t).max_steps,
                "episodes": successes[t],
                "failed": sum(f["task"] == t for f in failures),
                "frames": sum(s["frames"] for s in shards if s["task"] == t),
                "seeds": [e["seed"] for e in episodes if e["task"] == t],
            }
            for t in cfg.tasks
        },
        "shards": shards,
        "episodes": episodes,
        "failures": failures,
        "num_frames": sum(s["frames"] for s in shards),
        "statistics": statistics,
    }
    _write_json(out / STATISTICS, statistics)
    _write_json(out / MANIFEST, manifest)  # last: its presence marks a complete collection
    return manifest


def _remove_collection(out: Path) -> None:
    """Delete the files an earlier collection's manifest lists (only those: never a glob)."""
    old = json.loads((out / MANIFEST).read_text())
    for shard in old.get("shards", []):
        name = Path(shard["file"]).name  # a manifest never points outside its directory
        if name.endswith(".safetensors"):
            (out / name).unlink(missing_ok=True)
    (out / STATISTICS).unlink(missing_ok=True)
    (out / MANIFEST).unlink()


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class Demos:
    """All frames of a demo directory, concatenated in manifest (task, shard) order.

    ``episode_index`` is global (0..num_episodes-1, the position in ``manifest["episodes"]``),
    ``task_index`` indexes ``manifest["task_names"]``.
    """

    images: FrameStore  # uint8 (N, S, S, 3), or (N, V, S, S, 3) with several cameras
    states: np.ndarray  # float32 (N, 4)
    actions: np.ndarray  # float32 (N, 4)
    episode_index: np.ndarray  # int32 (N,)
    step_index: np.ndarray  # int32 (N,)
    task_index: np.ndarray  # int32 (N,)
    manifest: dict[str, Any]
    targets: np.ndarray | None = None  # float32 (N, 6): object + goal xyz (format 2 only)

    @property
    def instructions(self) -> list[str]:
        """Instruction of each task index."""
        return [self.manifest["tasks"][t]["instruction"] for t in self.manifest["task_names"]]

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def load_demos(out_dir: str | os.PathLike[str]) -> Demos:
    """Read a :func:`collect` directory back, checking every shard against the manifest.

    Raises:
        FileNotFoundError: no manifest or a listed shard is missing.
        ValueError: a shard's tensors disagree with the manifest (names, dtypes, shapes, counts).
    """
    out = Path(out_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    if manifest.get("format") not in FORMATS:
        raise ValueError(f"{out / MANIFEST}: format {manifest.get('format')!r} not in {FORMATS}")
    wanted = set(TENSORS) - MISSING_IN.get(manifest["format"], frozenset())
    size = manifest["image_size"]
    task_ids = {t: i for i, t in enumerate(manifest["task_names"])}
    per_shard: dict[str, list[dict[str, Any]]] = {}
    for ep in manifest["episodes"]:
        per_shard.setdefault(ep["shard"], []).append(ep)

    parts: dict[str, list[np.ndarray]] = {k: [] for k in (*(wanted - {"sim_states"}), "task_index")}
    episode_base = 0
    for shard in manifest["shards"]:
        path = out / shard["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: listed in the manifest but missing")
        with safe_open(str(path), framework="np") as f:
            names = set(f.keys())
            if names != wanted:
                raise ValueError(f"{path}: tensors {sorted(names)} != {sorted(wanted)}")
            # sim_states are for re-rendering (--from-manifest), not for training: not loaded.
            arrays = {k: f.get_tensor(k) for k in wanted if k not in ("images", "sim_states")}
            meta = f.metadata() or {}
        # Frames stay on disk (memory-mapped): a deep-policy collection is ~10 GB of pixels.
        arrays["images"] = _memmap_tensor(path, "images")
        frames = shard["frames"]
        views = len(manifest.get("cameras", [None]))
        expected = {
            "images": (frames, size, size, 3) if views == 1 else (frames, views, size, size, 3),
            "states": (frames, 4),
            "actions": (frames, 4),
            "episode_index": (frames,),
            "step_index": (frames,),
            "targets": (frames, 6),
        }
        for k in wanted - {"sim_states"}:
            dtype = TENSORS[k]
            if arrays[k].dtype != dtype or arrays[k].shape != expected[k]:
                raise ValueError(
                    f"{path}: {k} is {arrays[k].dtype}{arrays[k].shape}, manifest implies "
                    f"{np.dtype(dtype)}{expected[k]}"
                )
        if meta.get("task") != shard["task"]:
            raise ValueError(f"{path}: task {meta.get('task')!r} != manifest {shard['task']!r}")
        eps = per_shard.get(shard["file"], [])
        counts = np.bincount(arrays["episode_index"], minlength=len(eps))
        if len(eps) != shard["episodes"] or counts.tolist() != [e["frames"] for e in eps]:
            raise ValueError(f"{path}: episode frame counts {counts.tolist()} disagree")
        if json.loads(meta.get("seeds", "[]")) != [e["seed"] for e in eps]:
            raise ValueError(f"{path}: seeds in the shard disagree with the manifest")
        for k in wanted - {"sim_states"}:
            parts[k].append(arrays[k])
        parts["episode_index"][-1] = arrays["episode_index"] + episode_base
        parts["task_index"].append(np.full(frames, task_ids[shard["task"]], np.int32))
        episode_base += shard["episodes"]

    if episode_base != len(manifest["episodes"]):
        raise ValueError(
            f"{out}: shards hold {episode_base} episodes, manifest lists "
            f"{len(manifest['episodes'])}"
        )
    if not parts["actions"]:
        raise ValueError(f"{out}: manifest lists no shards")
    cat = {k: np.concatenate(v) for k, v in parts.items() if k != "images"}
    if cat["actions"].shape[0] != manifest["num_frames"]:
        raise ValueError(f"{out}: {cat['actions'].shape[0]} frames != {manifest['num_frames']}")
    cat.setdefault("targets", None)
    return Demos(manifest=manifest, images=FrameStore(parts["images"]), **cat)


def _memmap_tensor(path: Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file as a read-only memory map (no copy into RAM).

    The format: an 8-byte little-endian header length, a JSON header giving each tensor's
    dtype, shape and byte range after the header, then the data."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    entry = header[name]
    if entry["dtype"] != "U8":
        raise ValueError(f"{path}: {name} is {entry['dtype']}, expected U8")
    start, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if end - start != math.prod(shape):
        raise ValueError(f"{path}: {name} holds {end - start} bytes for shape {shape}")
    return np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n + start, shape=shape)


class FrameStore:
    """Frames of several shards as one indexable array, each shard memory-mapped.

    ``store[i]`` / ``store[index_array]`` gathers rows (a copy); ``np.asarray(store)`` reads all.
    """

    def __init__(self, parts: list[np.ndarray]) -> None:
        if not parts:
            raise ValueError("no frames")
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.offsets[-1]), *self.parts[0].shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        idx = np.asarray(index)
        scalar = idx.ndim == 0
        idx = np.atleast_1d(idx).astype(np.int64)
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"frame index out of range 0..{len(self) - 1}")
        out = np.empty((idx.size, *self.shape[1:]), dtype=self.dtype)
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        for s in np.unique(shard):
            rows = shard == s
            out[rows] = self.parts[s][idx[rows] - self.offsets[s]]
        return out[0] if scalar else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        full = np.concatenate(self.parts)
        return full if dtype is None else full.astype(dtype)

    @staticmethod
    def join(stores: list[FrameStore]) -> FrameStore:
        return FrameStore([p for s in stores for p in s.parts])
