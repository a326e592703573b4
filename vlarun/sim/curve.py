"""The training curve: success against samples seen, one point per stretch of training.

After each stretch (``scripts/train-mt10p.sh``), ``python -m vlarun.sim.curve --run
training/mt10p`` exports the run's saved state (``vlarun train --export-only``), evaluates every
family on MT10 for a few episodes per task on held-out seeds kept for the curve (offset
``CURVE_SEED``: never the headline table's seeds 0..24), appends one JSON line per family to
``RUN/curve.jsonl`` (date, CPU, step, samples seen, success and its Wilson interval, per task)
and redraws ``RUN/curve.png``. The file is committed with the state, so the curve survives the
machine as the run does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import textwrap
from pathlib import Path

from vlarun.machine import cpu_name
from vlarun.sim.evaluate import EvalConfig, evaluate, wilson
from vlarun.sim.train import TrainConfig, lineage_before, parent_run, train

CURVE_SEED = 500  # first curve seed (+ EVAL_SEED_OFFSET); the headline table uses 0..24
CURVE_FILE = "curve.jsonl"


def record_stretch(
    run: Path, episodes: int = 5, workers: int = 0, tasks: tuple[str, ...] = ("mt10",)
) -> list[dict]:
    """Export ``run``'s state, evaluate each family on ``tasks``, append the points; returns
    them."""
    state = json.loads((run / "state.json").read_text())
    cfg = TrainConfig(**{**state["config"], "out": str(run), "export_only": True})
    exported = train(cfg)["exported"]
    before = lineage_before(run)
    points = []
    for name, directory in exported.items():
        r = evaluate(
            EvalConfig(
                policy=directory, tasks=tasks, episodes=episodes, seed=CURVE_SEED, workers=workers
            )
        )
        n, wins = r["episodes"], round(r["success_rate"] * r["episodes"])
        points.append(
            {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
                "cpu": cpu_name(),
                "policy": name,
                "step": state["step"],
                "samples": state.get("samples", state["step"] * cfg.batch),
                # with every run it grew from: the curve's x, continued across fine-tunes
                "lineage_samples": before + state.get("samples", state["step"] * cfg.batch),
                "episodes_per_task": episodes,
                "success": wins / n,
                "success_ci95": wilson(wins, n),
                "tasks": {t: v["success_rate"] for t, v in r["tasks"].items()},
            }
        )
    with (run / CURVE_FILE).open("a") as f:
        for p in points:
            f.write(json.dumps(p) + "\n")
    plot(run)
    return points


def lineage_rows(run: Path) -> list[dict]:
    """The curve points of ``run`` and of every run it grew from (its init_from chain), each
    with ``lineage_samples``: samples seen by it and by the runs before it (points written
    before the field existed get it from their run's place in the chain)."""
    rows, seen = [], set()
    at: Path | None = run
    while at is not None and at.resolve() not in seen:
        seen.add(at.resolve())
        before = lineage_before(at)
        if (at / CURVE_FILE).exists():
            for line in (at / CURVE_FILE).read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    r.setdefault("lineage_samples", before + r["samples"])
                    r.setdefault("run", at.name)
                    rows.append(r)
        at = parent_run(at)
    return rows


def plot(run: Path) -> Path | None:
    """``RUN/curve.png``: success (95% Wilson interval) against samples seen (the run and
    every run it grew from), per family."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = lineage_rows(run)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({r["policy"] for r in rows}):
        pts = sorted((r for r in rows if r["policy"] == name), key=lambda r: r["lineage_samples"])
        x = [p["lineage_samples"] / 1e3 for p in pts]
        y = [100 * p["success"] for p in pts]
        lo = [100 * (p["success"] - p["success_ci95"][0]) for p in pts]
        hi = [100 * (p["success_ci95"][1] - p["success"]) for p in pts]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=name)
    runs = " -> ".join(dict.fromkeys(r["run"] for r in reversed(rows)))  # oldest first
    ax.set(
        xlabel="samples seen, with the runs it grew from (thousands)",
        ylabel="MT10 success (%)",
        ylim=(0, 100),
    )
    # The lineage grows a run per stretch: wrapped, so a long one is not cut at the figure edge.
    ax.set_title(textwrap.fill(f"{runs}: held-out curve seeds, 95% Wilson", 60), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = run / "curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlarun.sim.curve", description=__doc__)
    parser.add_argument("--run", default="training/mt10p", help="training run directory")
    parser.add_argument("--episodes", type=int, default=5, help="episodes per task")
    parser.add_argument("--workers", type=int, default=0, help="evaluation processes")
    a = parser.parse_args(argv)
    run = Path(a.run)
    if not (run / "state.json").exists():
        parser.error(f"{run} holds no training state (state.json)")
    for p in record_stretch(run, a.episodes, a.workers):
        lo, hi = p["success_ci95"]
        print(
            f"{p['policy']:12s} step {p['step']:6d}  {p['samples']:7d} samples "
            f"({p['lineage_samples']:,} with the runs before)  "
            f"success {100 * p['success']:5.1f}% [{100 * lo:.0f}, {100 * hi:.0f}]",
            file=sys.stdout,
        )


if __name__ == "__main__":
    main()
