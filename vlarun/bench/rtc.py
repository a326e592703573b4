"""`vlarun bench rtc`: real-time chunking against the other ways of executing action chunks
while the next chunk is inferred, on Meta-World in closed loop.

A shipped chunked policy (flow or DiT with chunks of 8: ``mt10p-flow`` by default) runs
held-out episodes in simulated time at a nominal control rate. Every inference's result is
withheld ``delay`` control ticks: an emulated latency, deterministic and the same on every
machine (the simulator never advances faster than the robot executes; a tick without an
action holds the robot still). Methods (``runtime.chunks.EXECUTIONS``):

  sync   wait: infer, then execute the chunk whole; the robot holds still while inferring;
  naive  asynchronous: the next chunk is requested while the current one executes (leading
         by the delay) and replaces it on arrival, aligned to the current tick;
  blend  as naive, but the overlap is ACT's temporal ensemble of the two chunks;
  rtc    as naive, with real-time chunking: the request carries the queued actions and the
         policy freezes the first d = delay of the new chunk to them and guides the overlap
         (Black et al. 2025; ``accel/rtc.py``).

Per method and delay: success rate (every method runs the same (task, seed) episodes, so
the difference to sync at that delay is paired: bootstrap 95% interval; each rate with its
Wilson interval), the jerk at chunk seams (the largest norm of the executed actions' third
difference in the three windows straddling each switch; mean and p99 over seams), stalls per
episode (the queue ran dry mid-episode), and the achieved control rate (the ticks the policy
acted in, times the nominal rate). ``--quick`` is a tiny run that checks the code path; it is
not a result. The same freeze over a real network is ``vlarun run-robot --rtc --edge ...``
(with ``--link-mbps`` for the shaping relay); it is not part of this benchmark.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, invoked_command, items, opt, to_dict

METHODS = ("sync", "naive", "blend", "rtc")
DELAYS = (0, 1, 2, 3, 4, 5)


@dataclass(frozen=True)
class BenchRtcOptions:
    """Action-chunk execution under inference delay: sync, naive async, blend, real-time
    chunking; success, seam jerk, stalls and control rate per emulated delay."""

    quick: bool = opt(False, "tiny run (1 task, 1 short episode, 2 delays): checks the code path")
    policy: str = opt(
        "mt10p-flow",
        POLICY_HELP + " (diffusion or flow, chunks >= 2)",
        replaces=POLICY_FLAGS_RETIRED,
    )
    tasks: tuple[str, ...] = opt(
        (
            "reach-v3",
            "push-v3",
            "drawer-open-v3",
            "button-press-topdown-v3",
            "window-open-v3",
            "door-open-v3",
        ),
        "Meta-World tasks (names, or mt10)",
    )
    episodes: int = opt(10, "episodes per task, the same seeds for every method and delay")
    delays: tuple[int, ...] = opt(DELAYS, "emulated inference delays, in control ticks")
    methods: tuple[str, ...] = opt(METHODS, f"execution methods: {', '.join(METHODS)}")
    seed: int = opt(0, "first held-out seed")
    control_hz: float = opt(20.0, "nominal control rate (a tick of delay is 1 / this)")
    max_steps: int | None = opt(None, "episode step limit (default: each task's)")
    workers: int = opt(0, "worker processes; 0 = one per core (at most 4)")
    out: str | None = opt("benchmarks/results", "directory for the JSON and the plot (full runs)")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        from vlarun.sim.tasks import parse_tasks

        if self.episodes < 1 or self.control_hz <= 0 or self.workers < 0:
            raise ValueError("need episodes >= 1, control_hz > 0 and workers >= 0")
        if not self.delay_list or any(d < 0 for d in self.delay_list):
            raise ValueError(f"delays must be >= 0 control ticks, got {self.delays!r}")
        bad = [m for m in self.method_list if m not in METHODS]
        if bad or not self.method_list:
            raise ValueError(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
        parse_tasks(self.tasks)  # unknown names raise, listing the valid ones

    @property
    def delay_list(self) -> list[int]:
        return sorted(set(items(self.delays, int)))

    @property
    def method_list(self) -> list[str]:
        return list(dict.fromkeys(items(self.methods)))

    def reduced(self, horizon: int) -> BenchRtcOptions:
        """The --quick run: the first task, one short episode, delays 0 and half a chunk."""
        from vlarun.sim.tasks import parse_tasks

        return dataclasses.replace(
            self,
            tasks=tuple(parse_tasks(self.tasks)[:1]),
            episodes=1,
            delays=(0, horizon // 2) if self.delays == DELAYS else self.delays,
            max_steps=min(self.max_steps or 24, 24),
        )


def run(o: BenchRtcOptions, progress: bool = True) -> dict:
    from vlarun.extras import SIM, require
    from vlarun.paths import policy_dir
    from vlarun.policy.base import Policy
    from vlarun.sim.evaluate import EpisodeJob, run_jobs
    from vlarun.sim.tasks import EVAL_SEED_OFFSET, parse_tasks
    from vlarun.stages.families import RTC_FAMILIES

    require(*SIM)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    t0 = time.time()
    checkpoint = str(policy_dir(o.policy))
    cfg = Policy.from_checkpoint(checkpoint).model.cfg
    if cfg.family not in RTC_FAMILIES or cfg.horizon < 2:
        raise ValueError(
            f"{o.policy} is a {cfg.family} policy with chunks of {cfg.horizon}; real-time "
            f"chunking needs a {'/'.join(RTC_FAMILIES)} policy with chunks of 2 or more"
        )
    if o.quick:
        o = o.reduced(cfg.horizon)
    seeds = tuple(EVAL_SEED_OFFSET + o.seed + i for i in range(o.episodes))
    jobs = [
        EpisodeJob(
            checkpoint,
            task,
            seeds,
            max_steps=o.max_steps,
            execution=method,
            delay_steps=delay,
            control_hz=o.control_hz,
        )
        for delay in o.delay_list
        for method in o.method_list
        for task in parse_tasks(o.tasks)
    ]
    workers = o.workers or max(1, min(os.cpu_count() or 1, 4))
    runs = run_jobs(jobs, min(workers, len(jobs)), log if progress else None)
    episodes: dict[tuple[str, int], list[dict]] = {}
    for job, r in zip(jobs, runs, strict=True):
        episodes.setdefault((job.execution, job.delay_steps), []).extend(r["episodes"])
    rows = [row(m, d, episodes, o.control_hz) for d in o.delay_list for m in o.method_list]
    result = {
        "quick": o.quick,
        "options": to_dict(o),
        "policy": o.policy,
        "family": cfg.family,
        "horizon": cfg.horizon,
        "control_hz": o.control_hz,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "command": invoked_command("vlarun bench rtc" + (" --quick" if o.quick else "")),
        "delay": "emulated: each result withheld delay_steps control ticks of simulated time",
        "rows": rows,
        "goals": goals(rows),
        "wall_s": round(time.time() - t0, 1),
    }
    if o.out and not o.quick:
        result["files"] = write_results(result, Path(o.out))
    return result


def row(method: str, delay: int, episodes: dict, control_hz: float) -> dict:
    """One method at one delay over its episodes; paired with sync at that delay when both
    ran (episodes matched by (task, seed))."""
    from vlarun.sim.evaluate import paired_difference, wilson

    eps = episodes[(method, delay)]
    wins = sum(e["success"] for e in eps)
    jerks = [j for e in eps for j in e["seam_jerk"]]
    steps = sum(e["steps"] for e in eps)
    acted = steps - sum(e["stall_ticks"] + e["startup_ticks"] for e in eps)
    frozen = [d for e in eps for d in e["frozen"]]
    out = {
        "method": method,
        "delay_steps": delay,
        "delay_ms": 1e3 * delay / control_hz,
        "success_rate": wins / len(eps),
        "ci95": list(wilson(wins, len(eps))),
        "episodes": len(eps),
        "jerk_mean": statistics.fmean(jerks) if jerks else None,
        "jerk_p99": float(np.percentile(jerks, 99)) if jerks else None,
        "seams": len(jerks),
        "stalls_per_episode": sum(e["stalls"] for e in eps) / len(eps),
        "stall_ticks_per_episode": sum(e["stall_ticks"] for e in eps) / len(eps),
        "skipped_per_episode": sum(e["skipped_actions"] for e in eps) / len(eps),
        "control_rate_hz": control_hz * acted / steps if steps else None,
        "frozen_mean": statistics.fmean(frozen) if frozen else None,
        "mean_steps": steps / len(eps),
        "paired_vs_sync": None,
    }
    base = episodes.get(("sync", delay))
    if base is not None and method != "sync":
        key = lambda e: (e["task"], e["seed"])  # noqa: E731
        by = {key(e): e["success"] for e in base}
        mine = {key(e): e["success"] for e in eps}
        shared = sorted(set(by) & set(mine))
        if shared:
            out["paired_vs_sync"] = paired_difference(
                [by[k] for k in shared], [mine[k] for k in shared]
            )
    return out


def goals(rows: list[dict]) -> dict:
    """The issue's goals at the largest delay measured: rtc within 5 pp of sync, naive 15 pp
    or more below it, rtc's p99 seam jerk at most half of naive's (None where a row is
    missing)."""
    if not rows:
        return {}
    top = max(r["delay_steps"] for r in rows)
    at = {r["method"]: r for r in rows if r["delay_steps"] == top}
    sync, naive, rtc = at.get("sync"), at.get("naive"), at.get("rtc")
    out = {
        "delay_steps": top,
        "rtc_within_5pp_of_sync": None,
        "naive_loses_15pp": None,
        "rtc_jerk_p99_le_half_naive": None,
    }
    if sync and rtc:
        out["rtc_within_5pp_of_sync"] = rtc["success_rate"] >= sync["success_rate"] - 0.05
    if sync and naive:
        out["naive_loses_15pp"] = naive["success_rate"] <= sync["success_rate"] - 0.15
    if naive and rtc and naive["jerk_p99"] is not None and rtc["jerk_p99"] is not None:
        out["rtc_jerk_p99_le_half_naive"] = rtc["jerk_p99"] <= naive["jerk_p99"] / 2
    return out


def write_results(result: dict, out: Path) -> dict:
    """rtc_<date>.json and rtc_<date>.png (success and p99 seam jerk against delay)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"rtc_{result['date'][:10]}"
    files = {"json": str(out / f"{stem}.json"), "plot": str(out / f"{stem}.png")}
    if plot(result, files["plot"]) is None:
        del files["plot"]
    Path(files["json"]).write_text(json.dumps(result | {"files": files}, indent=1))
    return files


def plot(r: dict, path: str) -> str | None:
    """Success (Wilson 95%) and p99 seam jerk against delay, one line per method; None when
    matplotlib is missing (the JSON holds the same numbers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax_s, ax_j) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = list(dict.fromkeys(x["method"] for x in r["rows"]))
    for m in methods:
        rows = [x for x in r["rows"] if x["method"] == m]
        d = [x["delay_steps"] for x in rows]
        s = np.array([x["success_rate"] for x in rows])
        lo = s - np.array([x["ci95"][0] for x in rows])
        hi = np.array([x["ci95"][1] for x in rows]) - s
        ax_s.errorbar(d, 100 * s, yerr=100 * np.stack([lo, hi]), marker="o", capsize=3, label=m)
        jerk = [np.nan if x["jerk_p99"] is None else x["jerk_p99"] for x in rows]
        ax_j.plot(d, jerk, marker="o", label=m)
    ax_s.set(xlabel="inference delay (control ticks)", ylabel="success (%)", ylim=(-3, 103))
    ax_j.set(xlabel="inference delay (control ticks)", ylabel="p99 seam jerk (action/tick^3)")
    for ax in (ax_s, ax_j):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"vlarun bench rtc: {r['policy']} (H={r['horizon']}), emulated delays, {r['date'][:10]}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_result(r: dict) -> str:
    lines = [
        f"vlarun bench rtc{' --quick' if r['quick'] else ''}: {r['policy']} ({r['family']}, "
        f"H={r['horizon']}) at {r['control_hz']:g} Hz, {r['delay']}",
        "| method | delay (ticks) | success | vs sync (paired) | jerk mean | jerk p99 | "
        "stalls/ep | control Hz |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    for x in r["rows"]:
        p = x["paired_vs_sync"]
        vs = "-"
        if p is not None:
            lo, hi = (100 * v for v in p["ci95"])
            vs = f"{100 * p['difference']:+.1f} pp ({lo:+.1f}..{hi:+.1f})"
        lines.append(
            f"| {x['method']} | {x['delay_steps']} | {100 * x['success_rate']:.1f}% | {vs} | "
            f"{fmt(x['jerk_mean'], '.3f')} | {fmt(x['jerk_p99'], '.3f')} | "
            f"{x['stalls_per_episode']:.2f} | {fmt(x['control_rate_hz'], '.1f')} |"
        )
    lines.append(f"goals at the largest delay: {r['goals']}")
    for kind, path in r.get("files", {}).items():
        lines.append(f"{kind}: {path}")
    return "\n".join(lines)


OPTIONS = {"bench-rtc": BenchRtcOptions}
RUN = {"bench-rtc": run}
SHOW = {"bench-rtc": lambda r: print(format_result(r))}
