#!/usr/bin/env python3
"""Inject each known mistake into TRIAGE's state handling or CEED's loss, once, and check that
the tests catch it (they must fail), then restore the file. Exit status 1 if one survives.

    make mutation        (or: .venv/bin/python tests/mutation_check.py)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRIAGE, DISTILL = "vlarun/accel/triage.py", "vlarun/sim/distill.py"
TESTS = [
    "tests/accel/test_triage_state.py",
    "tests/accel/test_triage.py",
    "tests/accel/test_distill.py",
]

MUTANTS = {
    "drift reference updated every query, not at recompute": (
        TRIAGE,
        "st.reference[rows, :, cols] = values[rows, :, cols].to(st.reference.dtype)",
        "st.reference = values.clone().to(st.reference.dtype)",
    ),
    "deep saliency re-probed after the first query": (
        TRIAGE,
        "return DeferredPlan(self.cfg.layer, decide), step.probe(self.cfg.layer, query)",
        "return DeferredPlan(self.cfg.layer, decide), step.probe(step.num_layers - 1, query)",
    ),
    "carried memory dropped from importance": (
        TRIAGE,
        "importance = _unit_sum(shallow) + cfg.memory_weight * _unit_sum(carried)",
        "importance = _unit_sum(shallow)",
    ),
    "newly important tokens not mandatory": (
        TRIAGE,
        "(important & (~valid | newly), importance),",
        "(important & ~valid, importance),",
    ),
    "maintenance after mandatory when they compete": (
        TRIAGE,
        "    chosen |= top_mask(age.float(), n_maint, has_cache & ~important)\n",
        "    n_maint = min(n_maint, budget - int((important & (~valid | newly)).sum()))\n"
        "    chosen |= top_mask(age.float(), max(n_maint, 0), has_cache & ~important)\n",
    ),
    "CEED loss: reversed KL": (
        DISTILL,
        "(target.exp() * (target - x.log_softmax(-1))).sum(-1), keep)",
        "(x.softmax(-1) * (x.log_softmax(-1) - target)).sum(-1), keep)",
    ),
    "CEED loss: missing stop-gradient": (
        DISTILL,
        "target = teacher.detach().log_softmax(-1)",
        "target = teacher.log_softmax(-1)",
    ),
    "CEED loss: a FAST code's padding after END counted": (
        DISTILL,
        "keep = None if end_id is None else code_mask(fixed, end_id).float()",
        "keep = None",
    ),
}


def main() -> int:
    survived = []
    for name, (rel, old, new) in MUTANTS.items():
        path = ROOT / rel
        source = path.read_text()
        if source.count(old) != 1:
            print(f"SKIP {name}: the original line is not in {rel} exactly once")
            survived.append(name)
            continue
        path.write_text(source.replace(old, new))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
            )
        finally:
            path.write_text(source)
        caught = done.returncode != 0
        failed = [ln.split()[1] for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
        print(f"{'caught  ' if caught else 'SURVIVED'} {name}: {', '.join(failed) or '-'}")
        if not caught:
            survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
