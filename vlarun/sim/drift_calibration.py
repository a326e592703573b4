"""`vlarun calibrate-drift`: TRIAGE's diagnostic that sets the drift threshold delta.

For a new backbone, no training needed (SEEDS.md section 3): replay full-recompute observation
streams; at step t, for cache ages a, take the KV cache full recompute left at step t - a and
probe groups of 16 visual tokens drawn from the nine cells of (drift tertile x importance
tertile). Each probe runs the prefill twice with every other token recomputed: once reusing the
probed tokens' age-a K/V, once pruning them, and compares both actions with full recompute at
step t: Delta = error(reuse) - error(prune) (negative: reuse is closer). Probes are binned by
their mean drift and by age, with 95% intervals; the recommended delta is the upper edge of
the drift bins (from the lowest up) in which reuse is never worse than pruning: pooled interval
entirely below zero and no cache age with a positive mean.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from vlarun.accel.base import StepInputs, attention_scores
from vlarun.accel.triage import value_drift
from vlarun.config import POLICY_FLAGS_RETIRED, items, opt
from vlarun.extras import SIM, require
from vlarun.models.llama import KVCache
from vlarun.models.token_plan import TokenAction, TokenPlan
from vlarun.stages.families import run_head

DRIFT_EDGES = (0.0, 0.1, 0.2, 0.3, 0.5, math.inf)


@dataclass(frozen=True)
class DriftCalibrationConfig:
    """Probe reuse against pruning per drift level to recommend TRIAGE's delta for a backbone."""

    policy: str = opt(
        "tiny-oft",
        "shipped policy name or checkpoint directory (full recompute gives the reference)",
        replaces=POLICY_FLAGS_RETIRED,
    )
    tasks: tuple[str, ...] = opt(
        ("reach-v3", "push-v3"), "Meta-World tasks whose rollouts are replayed"
    )
    episodes: int = opt(1, "episodes per task")
    seed: int = opt(0, "first held-out seed")
    rollouts: str | None = opt(None, "replay this rollouts file (vlarun fidelity) instead")
    ages: tuple[int, ...] = opt((1, 2, 5, 10, 20), "cache ages in queries")
    probe_tokens: int = opt(16, "tokens per probe")
    layer: int = opt(2, "shallow layer of drift and importance")
    max_steps: int = opt(40, "at most this many steps per episode")
    out: str | None = opt(None, "directory for drift_<policy>_<date>.json and its plot")
    write_delta: bool = opt(
        False,
        "write the recommended delta into the checkpoint's "
        "calibration.json (TRIAGE built for it then uses it)",
    )
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.probe_tokens < 1 or self.max_steps < 2:
            raise ValueError("need episodes >= 1, probe_tokens >= 1 and max_steps >= 2")
        if not self.age_list or min(self.age_list) < 1:
            raise ValueError(f"--ages must be positive integers, got {self.ages!r}")

    @property
    def age_list(self) -> list[int]:
        return items(self.ages, int)


@dataclass
class _Full:
    """What full recompute left at one step."""

    cache: KVCache
    values: Tensor  # (1, KVH, Nv, hd) at the probe layer
    importance: Tensor  # (Nv,)
    actions: Tensor


@torch.no_grad()
def probe_stream(policy, instruction: str, frames: list, ages: list[int], cfg) -> list[dict]:
    """Probes over one observation stream (frames, or (views, state) pairs as
    ``Policy.observation`` gives them): dicts of drift, age, importance level, Delta."""
    model = policy.model
    gen = torch.Generator().manual_seed(0)
    history: deque[_Full] = deque(maxlen=max(ages))
    out = []
    for frame in frames:
        image, state = frame if isinstance(frame, tuple) else (frame, None)
        step = _step_inputs(policy, image, state, instruction)
        noise = torch.randn(
            1, model.cfg.horizon, model.cfg.action_dim, generator=torch.Generator().manual_seed(0)
        )
        full = _full_recompute(model, step, noise, cfg.layer)
        for a in ages:
            if a <= len(history):
                out += _probe_age(model, step, noise, full, history[-a], a, cfg, gen)
        history.append(full)
    return out


def _step_inputs(policy, frame: np.ndarray, state, instruction: str) -> StepInputs:
    model, cfg = policy.model, policy.model.cfg
    images = policy.image_tensor(frame)
    visual = model.encode_images(images)
    st = policy.state_tensor(state) if cfg.proprio_dim else None
    prefix = model.build_prefix(visual, [policy.text_ids(instruction, state)], st)
    views = tuple(cfg.tokens_of_view(v) for v in range(cfg.num_images))
    return StepInputs(images, visual, prefix, cfg.llm.num_layers, views, cfg.vis_start)


def _full_recompute(model, step: StepInputs, noise: Tensor, layer: int) -> _Full:
    probe = step.probe(layer, step.action_query_index())
    pre = model.prefill(step.prefix, probe=probe)
    actions = run_head(model, pre, noise)["actions"]
    cache = pre.cache
    clone = KVCache.from_export(model.cfg.llm, cache.k, cache.v, cache.valid, cache.max_len)
    vis = slice(step.vis_start, step.vis_start + step.num_visual)
    return _Full(
        clone, cache.v[layer][:, :, vis].clone(), attention_scores(pre.lm.probe.probs)[0], actions
    )


def _tertile(x: Tensor) -> Tensor:
    """(N,) -> (N,) level 0, 1, 2 by rank (equal thirds, robust to ties)."""
    ranks = torch.empty_like(x, dtype=torch.long)
    ranks[torch.sort(x, stable=True).indices] = torch.arange(x.numel())
    return (ranks * 3) // x.numel()


def _probe_age(model, step, noise, full: _Full, old: _Full, age: int, cfg, gen) -> list[dict]:
    drift = value_drift(full.values, old.values)[0]  # (Nv,) since the old recompute
    cells = _tertile(drift) * 3 + _tertile(full.importance)
    out = []
    for cell in range(9):
        members = (cells == cell).nonzero().flatten()
        if not len(members):
            continue
        pick = members[torch.randperm(len(members), generator=gen)[: cfg.probe_tokens]]
        err = {}
        for how in (TokenAction.REUSE, TokenAction.PRUNE):
            decisions = torch.zeros(1, step.num_visual, dtype=torch.int8)  # RECOMPUTE
            decisions[0, pick] = int(how)
            cache = KVCache.from_export(
                model.cfg.llm, old.cache.k, old.cache.v, old.cache.valid, old.cache.max_len
            )
            plan = TokenPlan(step.vis_start, decisions, cfg.layer)
            pre = model.prefill(step.prefix, cache, plan=plan)
            acts = run_head(model, pre, noise)["actions"]
            err[how] = float((acts - full.actions).abs().mean())
        out.append(
            {
                "drift": float(drift[pick].mean()),
                "age": age,
                "importance_level": cell % 3,
                "delta": err[TokenAction.REUSE] - err[TokenAction.PRUNE],
            }
        )
    return out


def summarise_probes(probes: list[dict], edges: tuple[float, ...] = DRIFT_EDGES) -> dict:
    """Bins of drift (and cache age) with mean Delta and 95% intervals; recommended delta."""
    bins, recommended = [], 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        ds = [p for p in probes if lo <= p["drift"] < hi]
        row = {"drift": [lo, hi if math.isfinite(hi) else None]} | _mean_ci(
            [p["delta"] for p in ds]
        )
        row["by_age"] = {
            str(a): _mean_ci([p["delta"] for p in ds if p["age"] == a])
            for a in sorted({p["age"] for p in ds})
        }
        row["reuse_no_worse"] = bool(
            ds and row["ci95"][1] < 0 and all(v["mean_delta"] <= 0 for v in row["by_age"].values())
        )
        bins.append(row)
    for row in bins:  # lowest bins up; an empty bin neither confirms nor breaks the run
        if row["n"] == 0:
            continue
        if not row["reuse_no_worse"] or row["drift"][1] is None:
            break
        recommended = row["drift"][1]
    return {"probes": len(probes), "bins": bins, "recommended_delta": recommended}


def _mean_ci(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "mean_delta": None, "ci95": [None, None]}
    arr = np.asarray(xs, dtype=np.float64)
    half = 1.96 * arr.std(ddof=1) / math.sqrt(len(arr)) if len(arr) > 1 else math.inf
    m = float(arr.mean())
    return {"n": len(arr), "mean_delta": m, "ci95": [m - half, m + half]}


def _streams(cfg: DriftCalibrationConfig, policy) -> list[tuple[str, list[np.ndarray]]]:
    """(instruction, frames) per episode: recorded closed loop, or read from a rollouts file."""
    from vlarun.sim.tasks import get_task

    if cfg.rollouts:
        from vlarun.sim.fidelity import Rollouts

        r = Rollouts.load(cfg.rollouts)
        # The file keeps no episode boundaries: each task's observations are one stream.
        return [
            (get_task(t).instruction, list(r.images[r.task_index == k][: cfg.max_steps]))
            for k, t in enumerate(r.tasks)
        ]
    from vlarun.sim.env import MetaWorldEnv, env_views
    from vlarun.sim.evaluate import run_episode
    from vlarun.sim.tasks import EVAL_SEED_OFFSET

    streams = []
    from vlarun.sim.tasks import parse_tasks

    for task in parse_tasks(cfg.tasks):
        env = MetaWorldEnv(task, **env_views(policy.model.cfg))
        for i in range(cfg.episodes):
            frames: list = []
            keep = lambda obs, _run, out=frames: out.append(policy.observation(obs))  # noqa: E731
            run_episode(policy, env, EVAL_SEED_OFFSET + cfg.seed + i, on_inference=keep)
            streams.append((env.instruction, frames[: cfg.max_steps]))
        env.close()
    return streams


def run_calibration(cfg: DriftCalibrationConfig) -> dict:
    from vlarun.paths import policy_dir
    from vlarun.policy.base import Policy

    require(*SIM)  # before anything loads
    directory = policy_dir(cfg.policy)
    import datetime
    import json
    import time

    from tqdm import tqdm

    policy = Policy.from_checkpoint(directory)
    t0 = time.time()
    streams = _streams(cfg, policy)
    probes = []
    for instruction, frames in tqdm(streams, desc="probed episodes", unit="ep"):
        probes += probe_stream(policy, instruction, frames, cfg.age_list, cfg)
    result = summarise_probes(probes) | {
        "policy": str(directory),
        "ages": cfg.age_list,
        "tasks": list(cfg.tasks),
        "frames": sum(len(f) for _, f in streams),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "wall_s": round(time.time() - t0, 1),
    }
    if cfg.write_delta:
        result["calibration"] = str(write_delta(directory, result))
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"drift_{directory.name}_{result['date'][:10]}"
        result["files"] = {"json": f"{stem}.json", "plot": f"{stem}.png"}
        plot_calibration(result, result["files"]["plot"])
        Path(result["files"]["json"]).write_text(json.dumps(result, indent=1))
    return result


def write_delta(directory: Path, result: dict) -> Path:
    """Record ``result``'s recommended delta in ``directory``/calibration.json (other entries
    kept), with where it came from; a recommendation of 0 (reuse never safe) is refused."""
    import json

    from vlarun.policy.base import CALIBRATION_FILE, load_calibration

    delta = result["recommended_delta"]
    if not delta:
        raise ValueError("the diagnostic found no drift level where reuse is safe; not written")
    path = Path(directory) / CALIBRATION_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("triage", {})["delta"] = delta
    data["_source"] = (
        f"vlarun calibrate-drift ({result.get('date', '?')}): {result['probes']} "
        f"probes, tasks {', '.join(result.get('tasks', []))}, ages "
        f"{result.get('ages')}"
    )
    path.write_text(json.dumps(data, indent=1) + "\n")
    load_calibration(directory)  # what was written loads
    return path


def plot_calibration(r: dict, path: str) -> None:
    """Mean Delta (reuse - prune action error) per drift bin with 95% intervals, pooled and
    per cache age; below zero, reusing the cache is closer to full recompute than pruning."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bins = [b for b in r["bins"] if b["n"]]
    labels = [
        f"{b['drift'][0]:g}-{b['drift'][1]:g}"
        if b["drift"][1] is not None
        else f">{b['drift'][0]:g}"
        for b in bins
    ]
    x = np.arange(len(bins))
    ages = sorted({int(a) for b in bins for a in b["by_age"]})
    width = 0.8 / (len(ages) + 1)
    for k, a in enumerate(ages):
        vals = [b["by_age"].get(str(a)) for b in bins]
        ys = [v["mean_delta"] if v and v["n"] else np.nan for v in vals]
        ax.bar(x + (k - len(ages) / 2) * width, ys, width, label=f"age {a}", alpha=0.6)
    m = [b["mean_delta"] for b in bins]
    lo = [b["mean_delta"] - b["ci95"][0] for b in bins]
    hi = [b["ci95"][1] - b["mean_delta"] for b in bins]
    ax.errorbar(
        x + (len(ages) / 2) * width, m, yerr=[lo, hi], fmt="ko", capsize=4, label="pooled (95% CI)"
    )
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, [f"{lab}\nn={b['n']}" for lab, b in zip(labels, bins, strict=True)])
    ax.set(
        xlabel="mean drift of the probed tokens",
        ylabel="Delta = err(reuse) - err(prune)",
        title=f"{Path(r['policy']).name}: {r['probes']} probes, recommended delta "
        f"{r['recommended_delta']}",
    )
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_calibration(r: dict) -> str:
    lines = [f"{r.get('policy', '')}: {r['probes']} probes; Delta = error(reuse) - error(prune)"]
    for b in r["bins"]:
        hi = "inf" if b["drift"][1] is None else f"{b['drift'][1]:.1f}"
        if b["n"] == 0:
            lines.append(f"  drift [{b['drift'][0]:.1f}, {hi}): no probes")
            continue
        ages = ", ".join(f"age {a}: {v['mean_delta']:+.4f}" for a, v in b["by_age"].items())
        lines.append(
            f"  drift [{b['drift'][0]:.1f}, {hi}): n={b['n']:<5} Delta {b['mean_delta']:+.4f} "
            f"(95% CI {b['ci95'][0]:+.4f} .. {b['ci95'][1]:+.4f})  {ages}"
        )
    lines.append(f"recommended delta: {r['recommended_delta']}")
    return "\n".join(lines)
