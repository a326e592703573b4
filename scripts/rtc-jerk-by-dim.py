#!/usr/bin/env python
"""Where `vlarun bench rtc`'s seam jerk comes from: the same episodes as the bench (held-out
seeds 10000..), naive switching and real-time chunking at one delay, the seam jerk split into
the hand's xyz and the gripper (a diagnostic of issue 48's RTC goal; nothing is written):

    MUJOCO_GL=egl .venv/bin/python scripts/rtc-jerk-by-dim.py --policy checkpoints/mt10p-flow \\
        --task push-v3 --episodes 5 --delay 4
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

import vlarun.sim.evaluate as ev
from vlarun.paths import policy_dir
from vlarun.policy.base import Policy
from vlarun.sim.env import MetaWorldEnv, env_views
from vlarun.sim.tasks import EVAL_SEED_OFFSET


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="mt10p-flow", help="diffusion or flow policy")
    ap.add_argument("--task", default="push-v3")
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--delay", type=int, default=4, help="emulated delay, control ticks")
    a = ap.parse_args()
    torch.set_num_threads(1)
    seen: dict = {}
    jerks = ev.seam_jerks

    def keep(executed: np.ndarray, seams: list[int]) -> list[float]:  # the bench's own numbers
        seen["executed"], seen["seams"] = executed.copy(), list(seams)
        return jerks(executed, seams)

    ev.seam_jerks = keep  # run_episode computes the jerk; this also keeps what it was given
    policy = Policy.from_checkpoint(policy_dir(a.policy))
    env = MetaWorldEnv(a.task, **env_views(policy.model.cfg))
    out = {}
    for method in ("naive", "rtc"):
        xyz, grip, solved = [], [], 0
        for s in range(a.episodes):
            r = ev.run_episode(policy, env, EVAL_SEED_OFFSET + s, execution=method,
                               delay_steps=a.delay)  # fmt: skip
            solved += int(r["success"])
            xyz += jerks(seen["executed"], seen["seams"], dims=slice(0, 3))
            grip += jerks(seen["executed"], seen["seams"], dims=slice(3, 4))
        out[method] = {"solved": solved, "seams": len(xyz),
                       "xyz_p99": float(np.quantile(xyz, 0.99)), "xyz_mean": float(np.mean(xyz)),
                       "gripper_p99": float(np.quantile(grip, 0.99))}  # fmt: skip
    print(json.dumps({"policy": a.policy, "task": a.task, "delay": a.delay, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
