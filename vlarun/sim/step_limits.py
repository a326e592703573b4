"""Re-measure the tasks' step limits: run each scripted expert (no rendering) over seeds and
print the numbers ``TaskSpec.max_steps`` is set from (the rule is in vlarun/sim/tasks.py).

``python -m vlarun.sim.step_limits --tasks drawer-close-v3 --seeds 20``
"""

from __future__ import annotations

import argparse
import math

from vlarun.sim.env import MetaWorldEnv
from vlarun.sim.tasks import METAWORLD_HORIZON, TASKS, get_task, max_steps_from, task_names


def _measure(names: list[str], seeds: int) -> None:
    """Run the expert (without rendering) and print the numbers that set ``max_steps``."""
    header = ("task", "success", "mean", "p95", "max", "-> max_steps")
    print("{:26s} {:>8s} {:>6s} {:>5s} {:>5s} {:>12s}".format(*header))
    for name in names:
        env = MetaWorldEnv(name, render=False, max_steps=METAWORLD_HORIZON)
        steps = []
        for seed in range(seeds):
            env.reset(seed=seed)
            for t in range(1, METAWORLD_HORIZON + 1):
                _, _, terminated, truncated, _ = env.step(env.expert_action())
                if terminated:
                    steps.append(t)
                if terminated or truncated:
                    break
        env.close()
        ok = len(steps)
        mean = sum(steps) / ok if ok else float("nan")
        p95 = sorted(steps)[min(ok - 1, math.ceil(0.95 * ok) - 1)] if ok else -1
        print(
            f"{name:26s} {ok:>4d}/{seeds:<3d} {mean:6.1f} {p95:5d} "
            f"{max(steps, default=-1):5d} {max_steps_from(steps) if ok else -1:12d}"
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m vlarun.sim.step_limits [--list]``: re-measure step limits, or list tasks."""
    parser = argparse.ArgumentParser(prog="python -m vlarun.sim.step_limits", description=__doc__)
    parser.add_argument("--list", action="store_true", help="only list the registered tasks")
    parser.add_argument("--tasks", nargs="+", default=task_names(), help="subset to measure")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    if not args.list:
        _measure([get_task(n).name for n in args.tasks], args.seeds)
        return
    for t in TASKS.values():
        print(f"{t.name:26s} {t.difficulty:8s} max_steps={t.max_steps:<4d} {t.instruction!r}")


if __name__ == "__main__":
    main()
