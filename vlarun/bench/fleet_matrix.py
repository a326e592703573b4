"""`vlarun fleet --matrix`: the co-inference condition matrix in the fleet simulator,
for the real shapes (openvla-7b, openvla-oft, pi0, smolvla, cogact) on an Orin AGX 32 GB robot
and an RTX 4090 edge, 1 to 32 robots sharing the edge.

Every (model, bandwidth, robots) cell runs each matrix strategy (device-only, edge-only,
fixed-split, vlarun-placement, vlarun-joint) in the same simulated world (one seed; the robots
are the load, with the other tenants at ``matrix_load``). A row per cell and strategy: actions
per joule (modelled), SLO share, p50/p99, fallbacks (edge segments refused at admission and run
on the robot). Rows are summarised by the real-process matrix's summariser (``sched.records.
summarise`` per row, ``coinfer_matrix.summarise_matrix`` per cell) and plotted by its plotter,
so both matrices read alike. Stage times are recorded samples carried to the real shapes
(world/truth.py): the ``truth`` field of the result says so.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from vlarun.bench.coinfer_matrix import parse_bandwidth, plot_matrix, summarise_matrix
from vlarun.config import items
from vlarun.sched.records import summarise
from vlarun.world.fleet import STRATEGIES, FleetConfig, make_setup, run_policy

CELL = ("model", "bandwidth", "robots")  # the fields one matrix cell shares


def matrix_row(cfg: FleetConfig, setup, strategy: str, spec: str, robots: int) -> dict:
    """One strategy in one cell: ``spec`` is a bandwidth like "50" or a drop "200-50" (at
    ``cfg.drop_at`` of the run)."""
    before, after = parse_bandwidth(spec)
    cell = replace(
        cfg,
        robots=robots,
        bw_before=before,
        bw_after=after or before,
        duration_s=cfg.matrix_duration_s,
    )
    recs = run_policy(cell, setup, strategy, cfg.matrix_load, cfg.seed)
    s = summarise(recs, cfg.chunk)
    return {
        "strategy": strategy,
        "model": cfg.model,
        "bandwidth": spec,
        "bandwidth_mbps": before,  # before the drop
        "bandwidth_after_mbps": after,
        "robots": robots,
        "load": cfg.matrix_load,
        "actions_per_joule": s["actions_per_joule"],
        "energy_source": s["energy_source"],
        "slo_met_fraction": s["slo_met_fraction"],
        "latency_p50_ms": s["latency_p50_ms"],
        "latency_p99_ms": s["latency_p99_ms"],
        "fallbacks": s["fallbacks"],
        "requests": s["inferences"],
        "edge_requests": s["edge_requests"],
        "settings_used": len({r["setting"] for r in recs}),
    }


def run_fleet_matrix(cfg: FleetConfig) -> dict:
    """Every (model, bandwidth, robots, strategy) cell; the JSON result (and the plot)."""
    models, bandwidths = items(cfg.matrix_models), items(cfg.matrix_bandwidths)
    robot_counts = items(cfg.matrix_robots, int)
    rows, truth, notes, t0 = [], {}, {}, time.monotonic()
    for model in models:
        mcfg = replace(cfg, model=model)
        setup = make_setup(mcfg)  # one truth and plan space per model, shared by its cells
        truth[model], notes[model] = setup.truth.label, list(setup.joint.notes)
        for spec in bandwidths:
            for robots in robot_counts:
                rows += [matrix_row(mcfg, setup, s, spec, robots) for s in STRATEGIES]
        print(
            f"fleet matrix: {model} done, {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    result = {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "json"},
        "slo_ms": cfg.slo_s * 1e3,
        "rows": rows,
        "summary": summarise_matrix(rows, CELL),
        "truth": truth,
        "energy_source": "modelled",
        "notes": notes,
        "wall_s": time.monotonic() - t0,
        "plot": None,
    }
    if cfg.plot:
        result["plot"] = plot_matrix(result, cfg.plot, column="model", x=("bandwidth", "robots"))
    if cfg.compare_with:
        result["comparison"] = compare(rows, json.loads(Path(cfg.compare_with).read_text()))
    return result


def _over_split(rows: list[dict], cell: tuple[str, ...]) -> dict[tuple, dict[str, float]]:
    """cell -> strategy -> actions/J over Fixed Split's in the same cell."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(tuple(r[k] for k in cell), {})[r["strategy"]] = r
    return {
        key: {
            s: r["actions_per_joule"] / cells["fixed-split"]["actions_per_joule"]
            for s, r in cells.items()
        }
        for key, cells in by.items()
        if cells.get("fixed-split", {}).get("actions_per_joule")
    }


def compare(rows: list[dict], real: dict) -> dict:
    """The simulator's cells against the real-process matrix's cells of the same bandwidth
    (its first load level; the simulator's first robot count): each strategy's actions/J over
    Fixed Split, its actions/J (the real run's on the emulated devices' clock; comparable
    where both ran the same chunk) and its share of
    requests on time in both, and the simulator's minus the real ratio (a real cell's few
    requests make its on-time share coarse: its row keeps the count)."""
    real_rows = real.get("rows") or []
    if not real_rows or "load" not in real_rows[0]:
        raise ValueError("--compare-with takes a `vlarun bench coinfer --matrix --json` result")
    # An emulated run's joules are the world's powers over its own clock, 1 / time_scale
    # slower than the emulated devices' (emulate.emulated_device): on the devices' clock, as
    # the simulator counts them, its actions/J are 1 / time_scale higher.
    per_joule = 1.0 / ((real.get("emulated") or {}).get("time_scale") or 1.0)
    load = real_rows[0]["load"]
    there = _over_split([r for r in real_rows if r["load"] == load], ("bandwidth",))
    robots = min(r["robots"] for r in rows)
    mine = [r for r in rows if r["robots"] == robots]
    here = _over_split(mine, ("bandwidth",))
    on_time = {(r["bandwidth"], r["strategy"]): r for r in mine}
    real_on_time = {(r["bandwidth"], r["strategy"]): r for r in real_rows if r["load"] == load}
    out = []
    for (bw,), strategies in there.items():
        sim = here.get((bw,))
        if sim is None:
            continue
        for s, ratio in strategies.items():
            if s in sim:
                real_r, sim_r = real_on_time[(bw, s)], on_time[(bw, s)]
                out.append(
                    {
                        "bandwidth": bw,
                        "strategy": s,
                        "real_over_split": ratio,
                        "sim_over_split": sim[s],
                        "difference": sim[s] - ratio,
                        "real_actions_per_joule": _times(
                            real_r.get("actions_per_joule"), per_joule
                        ),
                        "sim_actions_per_joule": sim_r.get("actions_per_joule"),
                        "real_on_time": real_r.get("slo_met_fraction"),
                        "real_requests": real_r.get("inferences"),
                        "sim_on_time": sim_r.get("slo_met_fraction"),
                        "sim_requests": sim_r.get("requests"),
                    }
                )
    diffs = [abs(x["difference"]) for x in out]
    return {
        "real_load": load,
        "sim_robots": robots,
        "cells": out,
        "mean_abs_difference": sum(diffs) / len(diffs) if diffs else None,
    }


def _absolute(x: dict) -> str:
    """The absolute actions/J of both, where both are known (else "")."""
    real, sim = x.get("real_actions_per_joule"), x.get("sim_actions_per_joule")
    if not real or sim is None:
        return ""
    return f"; actions/J real {real:.4f} simulated {sim:.4f} ({sim / real:.2f}x)"


def _times(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.1f}%"


def format_matrix(r: dict) -> str:
    """Per model, bandwidth and robots: each strategy's actions/J as a ratio to Fixed Split,
    and its SLO share."""
    c = r["config"]
    lines = [
        f"fleet matrix: robot {c['robot']} + edge {c['edge']}, chunk {c['chunk']} at "
        f"{c['slo_hz']:g} Hz (SLO {r['slo_ms']:.0f} ms), {c['matrix_load']} background edge "
        f"load, {c['matrix_duration_s']:g} s per cell; energy {r['energy_source']}",
        f"  {'model':<12}{'Mbit/s':<8}{'robots':>6}  "
        + "  ".join(f"{s:>17}" for s in STRATEGIES)
        + "   (actions/J / fixed-split, SLO %)",
    ]
    cells: dict[tuple, dict] = {}
    for row in r["rows"]:
        cells.setdefault(tuple(row[k] for k in CELL), {})[row["strategy"]] = row
    for (model, bw, robots), by in cells.items():
        split = by["fixed-split"]["actions_per_joule"]
        parts = [
            f"{by[s]['actions_per_joule'] / split:5.2f}x {100 * by[s]['slo_met_fraction']:5.1f}%"
            for s in STRATEGIES
        ]
        lines.append(f"  {model:<12}{bw:<8}{robots:>6}  " + "  ".join(f"{p:>17}" for p in parts))
    s = r["summary"]
    lines.append(
        f"  vlarun-joint / fixed-split actions/J, mean over cells: "
        f"{s['joint_over_fixed_split_mean']:.2f}x; cells where joint meets the goal: "
        f"{s['cells_meeting_goal']} of {len(s['cells'])}"
    )
    c = r.get("comparison")
    if c:
        lines.append(
            f"  against the real-process matrix ({c['real_load']} load; here "
            f"{c['sim_robots']} robot): actions/J over Fixed Split, simulated - real, "
            f"mean |difference| {c['mean_abs_difference'] or 0:.2f}"
        )
        for x in c["cells"]:
            lines.append(
                f"    {x['bandwidth']:<8}{x['strategy']:<18}real "
                f"{x['real_over_split']:.2f}  simulated {x['sim_over_split']:.2f}  "
                f"({x['difference']:+.2f}); on time real {_pct(x['real_on_time'])} "
                f"of {x['real_requests']}, simulated {_pct(x['sim_on_time'])} of "
                f"{x['sim_requests']}{_absolute(x)}"
            )
    for model, label in r["truth"].items():
        lines.append(f"  truth ({model}): {label}")
    if r["plot"]:
        lines.append(f"  plot: {r['plot']}")
    return "\n".join(lines)
