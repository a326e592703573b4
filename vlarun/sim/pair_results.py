"""`vlarun pair A.json B.json`: the paired difference of two recorded `vlarun eval --json`
results, episode by episode, without running anything again.

`vlarun eval --paired-with` runs both configurations itself; this pairs two runs made apart
(a replaced checkpoint and its successor evaluated in different sessions, say). It is only a
pairing where both runs played the very same episodes: the same tasks, the same seed range
and the same episodes per task; anything else is refused, naming what differs. Each task's
``outcomes`` (1 solved, 0 not, in seed order: every `eval --json` since 2026-12-05 records
them) are matched by (task, seed), and the difference B - A gets the same paired bootstrap
interval `--paired-with` reports, overall and per task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt


@dataclass(frozen=True)
class PairConfig:
    """Paired difference (B - A) of two `vlarun eval --json` results on the same seeds."""

    base: str = opt(help="A: the first `eval --json` result (the baseline)", positional=True)
    other: str = opt(help="B: the second, on the same tasks and seeds", positional=True)
    bootstrap: int = opt(2000, "bootstrap resamples of the 95% interval")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.bootstrap < 100:
            raise ValueError(f"--bootstrap must be >= 100, got {self.bootstrap}")


def load_result(path: str | Path) -> dict:
    """An `eval --json` result with per-task outcomes; a clear error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file (want a `vlarun eval --json` result)")
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e.msg}, line {e.lineno})") from None
    tasks = result.get("tasks") if isinstance(result, dict) else None
    if not isinstance(tasks, dict) or "seeds" not in result:
        raise ValueError(f"{path} is not a `vlarun eval --json` result (no tasks / seeds)")
    missing = [t for t, v in tasks.items() if "outcomes" not in v]
    if missing:
        raise ValueError(
            f"{path} records no per-seed outcomes for {', '.join(missing)} (written before "
            "`eval --json` recorded them): run it again to pair it"
        )
    return result


def pair(cfg: PairConfig) -> dict:
    from vlarun.sim.evaluate import paired_difference

    a, b = load_result(cfg.base), load_result(cfg.other)
    if a["seeds"] != b["seeds"]:
        raise ValueError(f"different seeds: {a['seeds']} in A, {b['seeds']} in B")
    if set(a["tasks"]) != set(b["tasks"]):
        only = sorted(set(a["tasks"]) ^ set(b["tasks"]))
        raise ValueError(f"different tasks: {', '.join(only)} in one result only")
    base, other, tasks = [], [], {}
    for t in sorted(a["tasks"]):
        x, y = a["tasks"][t]["outcomes"], b["tasks"][t]["outcomes"]
        if len(x) != len(y):
            raise ValueError(f"{t}: {len(x)} episodes in A, {len(y)} in B")
        tasks[t] = paired_difference(x, y, cfg.bootstrap)
        base += x
        other += y
    return {
        "base": {"file": cfg.base, "policy": a.get("policy"), "success_rate": a["success_rate"]},
        "other": {"file": cfg.other, "policy": b.get("policy"), "success_rate": b["success_rate"]},
        "seeds": a["seeds"],
        "difference": paired_difference(base, other, cfg.bootstrap),
        "tasks": tasks,
        "method": "paired bootstrap over (task, seed) episodes, 95% percentile interval",
    }


def format_pair(r: dict) -> str:
    d = r["difference"]
    lines = [
        f"B {r['other']['policy']} {r['other']['success_rate']:.1%} - A {r['base']['policy']} "
        f"{r['base']['success_rate']:.1%} on seeds {r['seeds']}: {d['difference']:+.1%} "
        f"[{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}] over {d['episodes']} episodes "
        f"(only A solved {d['only_base']}, only B {d['only_other']})",
    ]
    for t, v in r["tasks"].items():
        lines.append(
            f"  {t:28s} {v['difference']:+6.1%} [{v['ci95'][0]:+.1%}, {v['ci95'][1]:+.1%}] "
            f"({v['only_base']} / {v['only_other']})"
        )
    return "\n".join(lines)
