"""`vlarun layer-importance`: EfficientVLA's per-layer importance table of a policy's LM.

I(l) = 1 - mean cos(x_l, x_{l+1}) over calibration frames (``transforms.layer_prune``), here
frames of the policy's own demonstrations: every task of the demo directory in equal share,
drawn with a seed, each with all its camera views and its proprio state (what the policy takes).
The table lists each layer's importance, its rank, and the layers EfficientVLA would remove for
each count (non-contiguous: the least important wherever they are). Reading it is cheap: one
prefill per frame, no rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, opt


@dataclass(frozen=True)
class LayerTableConfig:
    """Per-layer importance (EfficientVLA) of a policy's LM on its demonstration frames."""

    policy: str = opt("mt10p-dit", POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    demos: str = opt("data/mt10p-clean", "demo directory whose frames calibrate")
    samples: int = opt(64, "calibration frames (equal share per task)")
    seed: int = opt(0, "which frames")
    remove: int = opt(4, "list the layers removed for 1..REMOVE")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.samples < 1 or self.remove < 0:
            raise ValueError("--samples must be >= 1 and --remove >= 0")


def calibration_frames(policy, demos: Path, samples: int, seed: int) -> list[tuple]:
    """(images, ids, state) samples from the shards of ``demos``, without loading them whole:
    ``samples`` frames drawn evenly over the tasks, each read by slice."""
    from safetensors import safe_open

    shards = sorted(demos.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no demo shards (*.safetensors) in {demos}")
    by_task: dict[str, list[Path]] = {}
    for s in shards:
        by_task.setdefault(s.stem.rsplit("_", 1)[0], []).append(s)
    rng = np.random.default_rng(seed)
    out = []
    tasks = sorted(by_task)
    for i in range(samples):
        task = tasks[i % len(tasks)]
        shard = by_task[task][int(rng.integers(len(by_task[task])))]
        with safe_open(str(shard), "np") as f:
            n = f.get_slice("actions").get_shape()[0]
            k = int(rng.integers(n))
            image = f.get_slice("images")[k : k + 1][0]
            state = f.get_slice("states")[k : k + 1][0]
            instruction = f.metadata()["instruction"]
        images = policy.image_tensor(image)
        out.append((images, policy.text_ids(instruction, state), policy.state_tensor(state)))
    return out


def run_layer_table(cfg: LayerTableConfig) -> dict:
    import torch

    from vlarun.policy.base import Policy
    from vlarun.transforms.layer_prune import layer_importance, least_important

    policy = Policy.load(cfg.policy)
    n = policy.model.cfg.llm.num_layers
    if cfg.remove >= n:
        raise ValueError(f"--remove must be below the LM's {n} layers")
    frames = calibration_frames(policy, Path(cfg.demos), cfg.samples, cfg.seed)
    with torch.no_grad():
        imp = layer_importance(policy.model, frames)
    order = torch.argsort(imp, stable=True).tolist()
    return {
        "policy": cfg.policy,
        "model": policy.model.cfg.name,
        "layers": n,
        "samples": len(frames),
        "demos": cfg.demos,
        "importance": [round(float(x), 6) for x in imp],
        "rank": [order.index(i) + 1 for i in range(n)],  # 1 = least important
        "remove": {str(k): list(least_important(imp, k)) for k in range(1, cfg.remove + 1)},
    }


def format_layer_table(r: dict) -> str:
    head = (
        f"{r['policy']} ({r['model']}): LM layer importance 1 - cos(x_l, x_l+1) over "
        f"{r['samples']} demo frames of {r['demos']}"
    )
    lines = [head, "  layer  importance  rank"]
    for i, (x, k) in enumerate(zip(r["importance"], r["rank"], strict=True)):
        lines.append(f"  {i:>5}  {x:>10.4f}  {k:>4}")
    for k, layers in r["remove"].items():
        lines.append(f"  remove {k}: layers {layers}")
    return "\n".join(lines)
