"""`vlarun demos | train | distill`: scripted-expert demonstrations, behaviour cloning, and
CEED-VLA consistency distillation."""

from __future__ import annotations

from vlarun.sim.demos_cli import DemosOptions, run_demos, show_demos
from vlarun.sim.distill import DistillConfig, distill
from vlarun.sim.train import TrainConfig, train


def _show_train(r: dict) -> None:
    print(f"trained to step {r['step']} ({r['minutes']:.1f} min); exported:")
    for name, path in r["exported"].items():
        print(f"  {name}: {path}")


def _show_distill(r: dict) -> None:
    print(f"distilled to step {r['step']} ({r['minutes']:.1f} min); exported {r['exported']}")
    for k, v in (r.get("evaluation") or {}).items():
        print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")


OPTIONS = {"demos": DemosOptions, "train": TrainConfig, "distill": DistillConfig}
RUN = {"demos": run_demos, "train": train, "distill": distill}
SHOW = {"demos": show_demos, "train": _show_train, "distill": _show_distill}
