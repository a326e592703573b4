"""`vlarun bench side-by-side`: one benchmark command at another commit and at this working
tree, alternately, with their ratios side by side.

  vlarun bench side-by-side 19e67a7 --runs 3 --out results/side-by-side/engine -- \
      vlarun bench engine --quick --json

The other commit runs from a temporary git worktree of the repository the command is run in
(its own source, checkpoints and the data links), this working tree as it is; both with this
Python. Runs alternate (old, new, old, new, ...) so that a drift of the machine's speed hits
both sides alike. Each run's JSON is written to OUT/<side>-<i>.json; the summary gives, per
numeric key ending in ``speedup`` / ``ratio`` / ``success_rate`` found in the JSON, each side's
runs. Run it on a quiet machine: it times things.

``--identical`` asks whether a change left behaviour alone (a refactor): every leaf of the two
sides' first JSON must be equal (floats to 1e-9 relative), but for keys that time the run
(``--ignore``, default wall_s, decision_ms, plot); the differences are listed by path:

  vlarun bench side-by-side HEAD~1 --runs 1 --identical -- vlarun fleet --matrix --json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt


@dataclass(frozen=True)
class BenchSideBySideOptions:
    """A benchmark command (after --) at another commit and at this tree, alternately."""

    rev: str = opt(help="the other commit", positional=True)
    command: tuple[str, ...] = opt(
        help="the command printing JSON, after --, e.g. -- vlarun bench engine --quick --json",
        positional=True,
    )
    runs: int = opt(3, "runs on each side")
    out: str = opt("results/side-by-side", "directory for every run's JSON and the summary")
    json: bool = opt(False, "print one JSON object")
    identical: bool = opt(
        False, "also list every JSON leaf where the two sides' first runs differ (a refactor: none)"
    )
    ignore: tuple[str, ...] = opt(
        ("wall_s", "decision_ms", "plot"), "keys --identical leaves out (they time the run)"
    )

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError("--runs must be >= 1")


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


def differences(old, new, ignore=(), path: str = "") -> list[str]:
    """Every leaf where ``old`` and ``new`` (parsed JSON) differ, as 'path: old -> new' (floats
    equal to 1e-9 relative), leaving out keys in ``ignore`` wherever they are."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            if k in ignore:
                continue
            if k not in old or k not in new:
                out.append(f"{path}/{k}: only {'new' if k in new else 'old'}")
            else:
                out += differences(old[k], new[k], ignore, f"{path}/{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = [f"{path}: {len(old)} -> {len(new)} items"] if len(old) != len(new) else []
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            out += differences(a, b, ignore, f"{path}[{i}]")
        return out
    floats = isinstance(old, float) and isinstance(new, float)
    if old == new or (floats and abs(old - new) <= 1e-9 * max(1.0, abs(old))):
        return []
    return [f"{path or '/'}: {old!r} -> {new!r}"]


def run(o: BenchSideBySideOptions) -> dict:
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        raise RuntimeError("run it inside the vlarun git repository (git rev-parse failed)")
    root = Path(top.stdout.strip())
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vlarun-old-"))
    tree = tmp / "tree"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "-q", "--detach", str(tree), o.rev], check=True
    )
    for ignored in ("data", "runs"):  # ignored folders the benchmark may read
        if (root / ignored).exists() and not (tree / ignored).exists():
            (tree / ignored).symlink_to(root / ignored)
    cmd = list(o.command)
    argv = [sys.executable, "-m", "vlarun.cli", *cmd[1:]] if cmd[0] == "vlarun" else cmd
    sides = {o.rev: tree, "head": root}
    results: dict[str, list[dict]] = {s: [] for s in sides}
    first: dict[str, object] = {}  # each side's first run, whole
    try:
        for i in range(o.runs):
            for side, where in sides.items():
                env = {**os.environ, "PYTHONPATH": str(where)}
                print(f"run {i + 1}/{o.runs} at {side} ...", file=sys.stderr, flush=True)
                p = subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True)
                if p.returncode != 0:  # negative: killed by a signal (e.g. the OOM killer)
                    raise RuntimeError(
                        f"{side} run {i + 1} failed, rc {p.returncode}:\n{p.stderr[-2000:]}"
                    )
                (out / f"{side}-{i}.json").write_text(p.stdout)
                parsed = json.loads(p.stdout)
                first.setdefault(side, parsed)
                results[side].append(numbers(parsed))
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False
        )
        shutil.rmtree(tmp, ignore_errors=True)
    keys = sorted(set().union(*(r.keys() for rs in results.values() for r in rs)))
    summary = {k: {s: [r.get(k) for r in rs] for s, rs in results.items()} for k in keys}
    result = {"command": cmd, "rev": o.rev, "summary": summary}
    if o.identical:
        result["differences"] = differences(first[o.rev], first["head"], o.ignore)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    return result


def show(r: dict) -> None:
    for k, by in r["summary"].items():
        cells = "   ".join(
            f"{s}: " + ", ".join("-" if v is None else f"{v:.3f}" for v in vs)
            for s, vs in by.items()
        )
        print(f"{k:60s} {cells}")
    if "differences" in r:
        diffs = r["differences"]
        print(
            f"{len(diffs)} differences between {r['rev']} and this tree"
            + (" (identical)" if not diffs else ":")
        )
        for d in diffs[:50]:
            print(f"  {d}")
        if len(diffs) > 50:
            print(f"  ... and {len(diffs) - 50} more (the summary JSON lists them all)")


OPTIONS = {"bench-side-by-side": BenchSideBySideOptions}
RUN = {"bench-side-by-side": run}
SHOW = {"bench-side-by-side": show}
