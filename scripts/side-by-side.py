#!/usr/bin/env python3
"""Run one benchmark command at two commits, alternately, and print their ratios side by side.

  scripts/side-by-side.py 19e67a7 --runs 3 --out results/side-by-side/engine -- \
      vlarun bench engine --quick --json

The older commit runs from a temporary git worktree (its own source, checkpoints and data
links; the same virtual environment), this working tree as it is for the other. Runs
alternate (old, new, old, new, ...) so that a drift of the machine's speed hits both sides
alike. Each run's JSON is written to OUT/<side>-<i>.json; the summary prints, per numeric key
ending in ``speedup`` / ``ratio`` / ``success_rate`` found in the JSON, each side's runs.
Run it on a quiet machine: it times things.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("speedup", "ratio", "success_rate")


def numbers(obj, path: str = "") -> dict[str, float]:
    """Every numeric leaf whose key ends in one of KEYS, by its path in the JSON."""
    out = {}
    if isinstance(obj, dict):
        label = obj.get("name") or obj.get("method") or obj.get("config")
        for k, v in obj.items():
            sub = f"{path}/{label}" if label and path else path
            if isinstance(v, int | float) and not isinstance(v, bool) and k.endswith(KEYS):
                out[f"{sub}.{k}".lstrip("/.")] = float(v)
            elif isinstance(v, dict | list):
                out.update(numbers(v, f"{sub}/{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.update(numbers(v, f"{path}[{i}]"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the other commit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="results/side-by-side")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        ap.error("give the command after --, e.g. -- vlarun bench engine --quick --json")
    cut = argv.index("--")
    a, cmd = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vlarun-old-"))
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), a.rev],
                   check=True)  # fmt: skip
    for ignored in ("data", "runs"):  # ignored folders the benchmark may read
        if (ROOT / ignored).exists() and not (tree / ignored).exists():
            (tree / ignored).symlink_to(ROOT / ignored)
    py = str(ROOT / ".venv" / "bin" / "python")
    argv = [py, "-m", "vlarun.cli", *cmd[1:]] if cmd[0] == "vlarun" else cmd
    sides = {a.rev: tree, "head": ROOT}
    results: dict[str, list[dict]] = {s: [] for s in sides}
    try:
        for i in range(a.runs):
            for side, where in sides.items():
                env = {**os.environ, "PYTHONPATH": str(where)}
                print(f"run {i + 1}/{a.runs} at {side} ...", file=sys.stderr, flush=True)
                p = subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True)
                if p.returncode != 0:  # negative: killed by a signal (e.g. the OOM killer)
                    print(f"{side} run {i + 1} failed, rc {p.returncode}:\n{p.stderr[-2000:]}",
                          file=sys.stderr)  # fmt: skip
                    return 1
                (out / f"{side}-{i}.json").write_text(p.stdout)
                results[side].append(numbers(json.loads(p.stdout)))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
    keys = sorted(set().union(*(r.keys() for rs in results.values() for r in rs)))
    summary = {k: {s: [r.get(k) for r in rs] for s, rs in results.items()} for k in keys}
    (out / "summary.json").write_text(json.dumps({"command": cmd, "rev": a.rev,
                                                  "summary": summary}, indent=1))  # fmt: skip
    for k, by in summary.items():
        cells = "   ".join(
            f"{s}: " + ", ".join("-" if v is None else f"{v:.3f}" for v in vs)
            for s, vs in by.items()
        )
        print(f"{k:60s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
