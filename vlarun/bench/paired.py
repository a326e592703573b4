"""`vlarun bench paired`: a row of one `vlarun bench accel --table` run against every row of
another, paired on the episodes both ran. Runs are deterministic, so full compute must agree
on every shared (task, seed), read from each table's own episode keys: checked. E.g. TRIAGE at
18% (102 episodes) against the baselines at 18% (48 episodes: the first 8 seeds of each task):

  vlarun bench paired A.json triage:0.18 B.json --out lead.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt


@dataclass(frozen=True)
class BenchPairedOptions:
    """One row of a `bench accel --table` result minus every row of another, paired on the
    episodes both ran (bootstrap 95% intervals)."""

    table_a: str = opt(help="`bench accel --table` JSON holding the row", positional=True)
    row: str = opt(help="the row of table_a, e.g. triage:0.18", positional=True)
    table_b: str = opt(help="`bench accel --table` JSON with the rows to compare", positional=True)
    out: str | None = opt(None, "also write the result here (JSON)")
    json: bool = opt(False, "print one JSON object")


def run(o: BenchPairedOptions) -> dict:
    from vlarun.bench.accel_table import episode_outcomes
    from vlarun.sim.evaluate import paired_difference

    ta = episode_outcomes(json.loads(Path(o.table_a).read_text())["table"])
    tb = episode_outcomes(json.loads(Path(o.table_b).read_text())["table"])
    if o.row not in ta:
        raise ValueError(f"no row {o.row!r} in {o.table_a}; rows: {', '.join(ta)}")
    full_a, full_b, mine = ta["full"], tb["full"], ta[o.row]
    shared = sorted(set(full_a) & set(full_b))
    if not shared or any(full_a[k] != full_b[k] for k in shared):
        raise ValueError("full compute differs on the shared episodes: not the same runs")
    share = sum(mine[k] for k in shared) / len(shared)
    out = {
        "row": o.row,
        "shared_episodes": len(shared),
        "row_success_on_shared": share,
        "minus": {},
    }
    for name, other in tb.items():
        if name != "full":
            out["minus"][name] = paired_difference(
                [other[k] for k in shared], [mine[k] for k in shared]
            )
    if o.out:
        Path(o.out).write_text(json.dumps(out, indent=1))
    return out


def show(r: dict) -> None:
    n = r["shared_episodes"]
    for name, d in r["minus"].items():
        print(
            f"{r['row']} minus {name:20s} {100 * d['difference']:+.1f} pp "
            f"({100 * d['ci95'][0]:+.1f} .. {100 * d['ci95'][1]:+.1f}), discordant "
            f"{d['only_base']}/{d['only_other']} of {n}"
        )


OPTIONS = {"bench-paired": BenchPairedOptions}
RUN = {"bench-paired": run}
SHOW = {"bench-paired": show}
