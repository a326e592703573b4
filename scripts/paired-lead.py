"""A row of one `vlarun bench accel --table` run against every row of another, paired on the
episodes both ran (runs are deterministic, so full compute must agree on every shared
(task, seed), read from each table's own episode keys: checked). E.g. TRIAGE at 18% (102
episodes) against the baselines at 18% (48 episodes: the first 8 seeds of each task):

    .venv/bin/python scripts/paired-lead.py A.json triage:0.18 B.json [--out lead.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vlarun.bench.accel_table import episode_outcomes
from vlarun.sim.evaluate import paired_difference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table_a")
    ap.add_argument("row")
    ap.add_argument("table_b")
    ap.add_argument("--out")
    a = ap.parse_args()
    ta = episode_outcomes(json.loads(Path(a.table_a).read_text())["table"])
    tb = episode_outcomes(json.loads(Path(a.table_b).read_text())["table"])
    full_a, full_b, mine = ta["full"], tb["full"], ta[a.row]
    shared = sorted(set(full_a) & set(full_b))
    if not shared or any(full_a[k] != full_b[k] for k in shared):
        raise SystemExit("full compute differs on the shared episodes: not the same runs")
    share = sum(mine[k] for k in shared) / len(shared)
    out = {"row": a.row, "shared_episodes": len(shared), "row_success_on_shared": share,
           "minus": {}}  # fmt: skip
    for name, other in tb.items():
        if name == "full":
            continue
        d = paired_difference([other[k] for k in shared], [mine[k] for k in shared])
        out["minus"][name] = d
        print(f"{a.row} minus {name:20s} {100 * d['difference']:+.1f} pp "
              f"({100 * d['ci95'][0]:+.1f} .. {100 * d['ci95'][1]:+.1f}), discordant "
              f"{d['only_base']}/{d['only_other']} of {len(shared)}")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
