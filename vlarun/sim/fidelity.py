"""Action fidelity: how far a configuration's actions are from the full-compute policy's.

TRIAGE's diagnostic, and the cheap proxy for success in accelerator sweeps: the full-compute
(reference) policy is rolled out closed-loop once and every observation it acted on is
recorded with its action chunk; any configuration (other weights, another dtype, later a token or
layer policy from ``vlarun.accel``) is then run open-loop on exactly those observations, with the
same initial noise, and its mean absolute action error is reported in normalised units
(actions scaled to [-1, 1] by the dataset statistics, so every dimension counts alike).

Rollouts are stored as safetensors (uint8 images, action chunks, task indices; task names and
seeds in its metadata), so a sweep records once and compares many configurations.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from vlarun.config import POLICY_FLAGS_RETIRED, opt
from vlarun.extras import SIM, require
from vlarun.paths import policy_dir
from vlarun.sim.evaluate import TRAIN_TASKS, run_episode
from vlarun.sim.tasks import EVAL_SEED_OFFSET, get_task, parse_tasks

# (image uint8 (S, S, 3), instruction) -> normalised action chunk (K, D)
Candidate = Callable[[np.ndarray, str], np.ndarray]


@dataclass(frozen=True)
class FidelityConfig:
    """Action error of a configuration against the full-compute policy on recorded rollouts."""

    policy: str = opt(
        "tiny-ar",
        "reference policy, run at full compute: shipped name or checkpoint directory",
        replaces=POLICY_FLAGS_RETIRED,
    )
    candidate: str | None = opt(
        None, "candidate policy: shipped name or checkpoint directory (default: the reference)"
    )
    dtype: str = opt("float32", "the candidate's compute dtype", choices=["float32", "bfloat16"])
    tasks: tuple[str, ...] = opt(tuple(TRAIN_TASKS), "Meta-World tasks (names, or mt10)")
    episodes: int = opt(2, "recorded reference episodes per task")
    seed: int = opt(0, f"first held-out seed, offset by {EVAL_SEED_OFFSET}")
    rollouts: str | None = opt(None, ".safetensors file of recorded rollouts: reused if present")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype must be float32 or bfloat16, got {self.dtype!r}")
        parse_tasks(self.tasks)  # unknown names raise, listing the valid ones


@dataclass(frozen=True)
class Rollouts:
    """Observations the reference acted on, and what it did, in normalised units."""

    images: np.ndarray  # (N, S, S, 3) uint8
    actions: np.ndarray  # (N, K, D) float32
    task_index: np.ndarray  # (N,) int64, into ``tasks``
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    # (N,) int64: which episode each observation belongs to, so that stateful candidates
    # (TRIAGE's caches) start every episode afresh as they would in closed loop.
    episode_index: np.ndarray | None = None

    def save(self, path: str | Path) -> None:
        meta = {"tasks": json.dumps(self.tasks), "seeds": json.dumps(self.seeds)}
        tensors = {"images": self.images, "actions": self.actions, "task_index": self.task_index}
        if self.episode_index is not None:
            tensors["episode_index"] = self.episode_index
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> Rollouts:
        from safetensors import safe_open

        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
        if "tasks" not in meta:
            raise ValueError(f"{path}: not a rollouts file (no task list in its metadata)")
        t = load_file(str(path))
        tasks, seeds = tuple(json.loads(meta["tasks"])), tuple(json.loads(meta["seeds"]))
        episodes = t.get("episode_index")
        return cls(t["images"], t["actions"], t["task_index"], tasks, seeds, episodes)


def record_rollouts(policy, tasks: list[str], episodes: int, seed: int = 0) -> Rollouts:
    """Run ``policy`` closed-loop on held-out seeds, keeping each observation and its chunk."""
    from vlarun.sim.env import MetaWorldEnv, env_views

    images, actions, task_index, episode_index = [], [], [], []
    seeds = [EVAL_SEED_OFFSET + seed + i for i in range(episodes)]
    current = {"task": 0, "episode": 0}

    def keep(obs, run) -> None:
        images.append(obs["image"])
        actions.append(run.outputs["actions"][0].float().numpy())
        task_index.append(current["task"])
        episode_index.append(current["episode"])

    for ti, task in enumerate(tasks):
        env = MetaWorldEnv(task, **env_views(policy.model.cfg))
        for k, s in enumerate(seeds):
            current.update(task=ti, episode=ti * len(seeds) + k)
            run_episode(policy, env, s, on_inference=keep)
        env.close()
    return Rollouts(
        np.stack(images),
        np.stack(actions).astype(np.float32),
        np.asarray(task_index, dtype=np.int64),
        tuple(tasks),
        tuple(seeds),
        np.asarray(episode_index, dtype=np.int64),
    )


def policy_candidate(policy) -> Candidate:
    """A Policy as a candidate: its normalised chunk, with the same noise seed as recording."""

    def act(image: np.ndarray, instruction: str) -> np.ndarray:
        return policy.run_stages(image, instruction).outputs["actions"][0].float().numpy()

    act.reset = policy.reset  # a hooked policy's state starts each episode afresh
    return act


def action_fidelity(rollouts: Rollouts, candidate: Candidate) -> dict:
    """Mean |candidate - reference| over recorded observations, overall and per task."""
    instructions = [get_task(t).instruction for t in rollouts.tasks]
    errors = np.empty(len(rollouts.images))
    first = np.empty(len(rollouts.images))
    reset = getattr(candidate, "reset", None)
    episodes = rollouts.episode_index
    for i, (image, ti) in enumerate(zip(rollouts.images, rollouts.task_index, strict=True)):
        if reset is not None and (i == 0 or episodes is None or episodes[i] != episodes[i - 1]):
            reset()  # without episode marks, every observation is its own episode
        got = np.asarray(candidate(image, instructions[ti]), dtype=np.float32)
        diff = np.abs(got - rollouts.actions[i])
        errors[i], first[i] = diff.mean(), diff[0].mean()
    per_task = {
        t: {
            "mean_abs_error": float(errors[rollouts.task_index == k].mean()),
            "observations": int((rollouts.task_index == k).sum()),
        }
        for k, t in enumerate(rollouts.tasks)
    }
    return {
        "mean_abs_error": float(errors.mean()),
        "first_action_error": float(first.mean()),
        "max_abs_error": float(errors.max()),
        "observations": len(errors),
        "units": "normalised actions in [-1, 1] (dataset q01/q99)",
        "tasks": per_task,
    }


def run_fidelity(cfg: FidelityConfig) -> dict:
    from vlarun.models.device import cpu_only

    require(*SIM)  # before anything loads

    cpu_only(cfg.device, "vlarun fidelity")
    from vlarun.policy.base import Policy

    reference_dir = policy_dir(cfg.policy)
    tasks = parse_tasks(cfg.tasks)
    path = Path(cfg.rollouts) if cfg.rollouts else None
    if path is not None and path.exists():
        rollouts = Rollouts.load(path)
    else:
        torch.manual_seed(0)
        rollouts = record_rollouts(
            Policy.from_checkpoint(reference_dir), tasks, cfg.episodes, cfg.seed
        )
        if path is not None:
            rollouts.save(path)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    candidate_dir = policy_dir(cfg.candidate) if cfg.candidate else reference_dir
    candidate = Policy.from_checkpoint(candidate_dir, dtype=dtype)
    result = action_fidelity(rollouts, policy_candidate(candidate))
    return result | {
        "reference": str(reference_dir),
        "candidate": str(cfg.candidate or reference_dir),
        "dtype": cfg.dtype,
        "seeds": list(rollouts.seeds),
    }


def format_fidelity(r: dict) -> str:
    lines = [
        f"{r['candidate']} ({r['dtype']}) vs {r['reference']} (float32): mean |action error| "
        f"{r['mean_abs_error']:.4f}, first action {r['first_action_error']:.4f}, max "
        f"{r['max_abs_error']:.4f} over {r['observations']} observations ({r['units']})"
    ]
    for t, v in r["tasks"].items():
        lines.append(f"  {t:<26}{v['mean_abs_error']:.4f}  (n={v['observations']})")
    return "\n".join(lines)
