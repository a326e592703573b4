"""The evaluation report: a figure of success and latency, and a GIF of one episode.

matplotlib (Agg, no display) draws the figure; Pillow writes the GIF. Both are optional outputs
of ``vlarun eval --report DIR``, next to the same JSON that ``--json`` prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_report(result: dict, frames: np.ndarray | None, directory: str | Path) -> dict:
    """Write eval.json, eval.png and (if frames are given) episode.gif; returns their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "eval.json", "plot": out / "eval.png"}
    paths["json"].write_text(json.dumps(result, indent=1))
    plot_eval(result, paths["plot"])
    if frames is not None and len(frames):
        paths["gif"] = out / "episode.gif"
        write_gif(frames, paths["gif"])
    return {k: str(v) for k, v in paths.items()}


def plot_eval(result: dict, path: Path) -> None:
    """Left: success per task with Wilson 95% intervals. Right: per-stage latency p50/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    tasks = list(result["tasks"])
    rates = np.array([result["tasks"][t]["success_rate"] for t in tasks]) * 100
    ci = np.array([result["tasks"][t]["ci95"] for t in tasks]).T * 100
    left.bar(range(len(tasks)), rates, color="#4c72b0")
    left.errorbar(
        range(len(tasks)),
        rates,
        yerr=[rates - ci[0], ci[1] - rates],
        fmt="none",
        ecolor="black",
        capsize=4,
    )
    left.set_xticks(
        range(len(tasks)), [t.removesuffix("-v3") for t in tasks], rotation=30, ha="right"
    )
    left.set_ylim(0, 105)
    left.set_ylabel("success (%)")
    n = result["tasks"][tasks[0]]["episodes"] if tasks else 0
    left.set_title(f"{result['policy']}: {result['success_rate']:.0%} overall, {n} episodes/task")
    stages = result.get("stages_ms", {})
    names = list(stages)
    p50 = [stages[s]["p50"] or 0.0 for s in names]
    p99 = [stages[s]["p99"] or 0.0 for s in names]
    x = np.arange(len(names))
    right.bar(x - 0.2, p50, 0.4, label="p50")
    right.bar(x + 0.2, p99, 0.4, label="p99")
    right.set_xticks(x, names)
    right.set_ylabel("ms per inference")
    rate = result.get("control_rate_hz")
    right.set_title(f"stage latency (control rate {rate:.0f} actions/s)" if rate else "latency")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_gif(frames: np.ndarray, path: Path, fps: int = 12, stride: int = 2) -> None:
    """(T, H, W, 3) uint8 camera frames -> a looping GIF of every ``stride``-th frame."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames[::stride]]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)
