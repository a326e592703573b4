"""`vlarun fleet --power-sweep`: which rankings of the co-inference strategies survive when
each power of the energy model is halved or doubled.

Energy here is a model (catalog powers x measured or simulated times), and its powers are the
least certain numbers in it: an Orin's draw depends on its power mode, a 4090's busy power on
the kernel, the radio's on the module. So the fleet simulator's condition matrix (the same
cells, seed and queue model as `vlarun fleet --matrix`) is run once as catalogued and once for
each power term (robot idle and busy, edge idle and busy, radio send and receive) at x0.5 and
x2, the scheduler pricing with the scaled powers too. Per variant and cell: the ranking of the
strategies (actions/J among those meeting the SLO bar, then the rest by SLO share), whether the
best strategy and the whole ranking are the base's, and vlarun-joint against the best fixed
strategy. Energy is modelled throughout.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from vlarun.bench.coinfer_matrix import SLO_BAR
from vlarun.bench.fleet_matrix import CELL, run_fleet_matrix
from vlarun.world.fleet import POWER_TERMS, FleetConfig

FACTORS = (0.5, 2.0)


def ranking(by: dict[str, dict]) -> list[str]:
    """Strategies best first: those meeting the SLO bar by actions/J, then the rest by SLO
    share (an energy saving that misses deadlines is not a win)."""

    def key(s: str) -> tuple:
        r = by[s]
        meets = r["slo_met_fraction"] >= SLO_BAR
        return (not meets, -r["actions_per_joule"] if meets else -r["slo_met_fraction"])

    return sorted(by, key=key)


def _cells(result: dict) -> dict[tuple, dict[str, dict]]:
    cells: dict[tuple, dict[str, dict]] = {}
    for row in result["rows"]:
        cells.setdefault(tuple(row[k] for k in CELL), {})[row["strategy"]] = row
    return cells


def run_power_sweep(cfg: FleetConfig) -> dict:
    """The matrix as catalogued, then once per power term and factor; the JSON result."""
    variants = [""] + [f"{t}={f:g}" for t in POWER_TERMS for f in FACTORS]
    t0, base, out = time.monotonic(), None, []
    for i, powers in enumerate(variants):
        r = run_fleet_matrix(
            replace(cfg, powers=powers, plot=None, power_sweep=False, compare_with=None)
        )
        cells = {k: ranking(by) for k, by in _cells(r).items()}
        if base is None:
            base = cells
        same_best = sum(cells[k][0] == base[k][0] for k in cells)
        same_order = sum(cells[k] == base[k] for k in cells)
        s = r["summary"]
        out.append(
            {
                "powers": powers or "catalogue",
                "cells": len(cells),
                "same_best_as_catalogue": same_best,
                "same_ranking_as_catalogue": same_order,
                "best": {"/".join(map(str, k)): v[0] for k, v in cells.items()},
                "rankings": {"/".join(map(str, k)): v for k, v in cells.items()},
                "joint_over_fixed_split_mean": s["joint_over_fixed_split_mean"],
                "cells_meeting_goal": s["cells_meeting_goal"],
            }
        )
        print(
            f"power sweep: {i + 1}/{len(variants)} variants, {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    result = {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "json"},
        "variants": out,
        "energy_source": "modelled",
        "wall_s": time.monotonic() - t0,
        "plot": None,
    }
    if cfg.plot:
        result["plot"] = plot_sweep(result, cfg.plot)
    return result


def plot_sweep(r: dict, path: str) -> str | None:
    """Per variant: the share of cells keeping the catalogue's best strategy and its whole
    ranking; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    v = r["variants"]
    x = np.arange(len(v))
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(v)), 3.8))
    bars = (
        ("same_best_as_catalogue", "best strategy kept"),
        ("same_ranking_as_catalogue", "whole ranking kept"),
    )
    for i, (key, label) in enumerate(bars):
        ax.bar(x + (i - 0.5) * 0.4, [y[key] / y["cells"] for y in v], 0.4, label=label)
    ax.set_xticks(x, [y["powers"] for y in v], rotation=60, fontsize=7, ha="right")
    ax.set(
        ylabel="share of cells",
        ylim=(0, 1.05),
        title="power sweep (fleet simulator, energy modelled)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_sweep(r: dict) -> str:
    lines = [
        "power sweep (fleet simulator; energy modelled): per variant, cells whose best "
        "strategy / whole ranking is the catalogue's, vlarun-joint / Fixed Split, cells "
        "meeting the goal"
    ]
    for v in r["variants"]:
        split = v["joint_over_fixed_split_mean"]
        lines.append(
            f"  {v['powers']:<16} best {v['same_best_as_catalogue']:>2}/{v['cells']:<3} "
            f"ranking {v['same_ranking_as_catalogue']:>2}/{v['cells']:<3} "
            f"joint/split {'-' if split is None else f'{split:.2f}x'}  "
            f"goal {v['cells_meeting_goal']}/{v['cells']}"
        )
    return "\n".join(lines)
