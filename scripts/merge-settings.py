#!/usr/bin/env python
"""Regenerate a settings table from `vlarun bench accel --table` runs' *_settings.json files,
oldest first (a later measurement of a knob value replaces the earlier ones):

    .venv/bin/python scripts/merge-settings.py --out vlarun/sched/settings_mt10.json \\
        --about "..." benchmarks/results/accel_table_..._settings.json ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlarun.sched.settings_table import load_settings, merge_settings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="*_settings.json files, oldest first")
    ap.add_argument("--out", required=True, help="the settings table to write")
    ap.add_argument("--about", required=True, help="what the table holds (its _about line)")
    a = ap.parse_args()
    table = merge_settings(a.files, a.about)
    tmp = Path(a.out + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    load_settings(tmp)  # the planner reads it back, or nothing is replaced
    tmp.replace(a.out)
    for r in table["settings"]:
        models = ", ".join(r.get("models", []))
        print(f"{r['knob']:18s} {r['value']!s:7s} {r['relative_success']:.3f} {models}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
