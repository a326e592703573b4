"""A robot loop of your own, driven by vlarun: an edge server on this machine, stand-in
cameras and arm, one action per control tick (see vlarun/runtime/robot/control.py).

  python examples/own_robot.py                          # the shipped mt10p-ar, a local edge
  python examples/own_robot.py --strategy edge-only     # every request on the edge
  python examples/own_robot.py --policy PATH            # a checkpoint or LeRobot directory
  python examples/own_robot.py --no-edge                # everything on the robot

It builds one frame per camera the policy takes (``policy.cameras``: two 128 px views for the
mt10p policies, the checkpoint's own keys for a LeRobot one) and the state it reads
(``policy.state_size``), and says at the end how many requests used the edge and why the
others did not.
"""

import argparse
import time
from collections import Counter

import numpy as np

from vlarun import Policy
from vlarun.runtime.robot.agent import STRATEGIES
from vlarun.runtime.robot.control import Robot
from vlarun.runtime.testbed import procs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--policy", default="mt10p-ar", help="checkpoint directory or shipped name")
parser.add_argument("--ticks", type=int, default=60, help="control ticks to run")
parser.add_argument("--hz", type=float, default=10.0, help="control rate")
parser.add_argument("--strategy", default="vlarun", choices=STRATEGIES,
                    help="who places each request: the scheduler, or a fixed strategy")  # fmt: skip
parser.add_argument("--no-edge", action="store_true", help="run without an edge server")
args = parser.parse_args()

policy = Policy.load(args.policy)
instruction = "open the drawer"


def cameras(t: int) -> list[np.ndarray]:
    """Stand-ins for your cameras, one (H, W, 3) uint8 frame each in the policy's order: a
    bright square drifting across."""
    frames = []
    for h, w, _ in policy.cameras.values():
        frame = np.full((h, w, 3), 40, np.uint8)
        x = (4 * t) % max(w - 16, 1)
        frame[h // 2 - 8 : h // 2 + 8, x : x + 16] = 230
        frames.append(frame)
    return frames


joints = np.zeros(max(policy.state_size, 1), np.float32)  # a stand-in for your arm's state
# The same as `vlarun serve-edge --insecure --port 0 --policy mt10p-ar` in another terminal.
edge, endpoint = (None, None) if args.no_edge else procs.start_edge(extra=["--policy", args.policy])
try:
    with Robot(policy, endpoint, control_hz=args.hz, strategy=args.strategy,
               insecure=True) as robot:  # fmt: skip
        robot.warmup(cameras(0), instruction)
        next_tick = time.perf_counter()
        for t in range(args.ticks):
            state = joints[: policy.state_size] if policy.state_size else None
            action = robot.act(cameras(t), instruction, state=state)
            joints[: min(len(action), len(joints))] += 0.01 * action[: len(joints)]  # "apply"
            next_tick += 1.0 / args.hz
            time.sleep(max(next_tick - time.perf_counter(), 0.0))
        s, up = robot.summary(), robot.edge_up
        rows = [inf.row() for inf in robot.inferences]
    used = sum("@edge" in r["ran"] for r in rows)
    fell = Counter(r["fallback"].split(":")[0] for r in rows if r["fallback"])
    planned_here = sum("@edge" not in r["plan"] for r in rows)
    why = []
    if args.no_edge:
        why.append(f"{len(rows)} ran here: no edge was started (--no-edge)")
    elif not up:
        why.append("the edge was down or refused this robot (see its log)")
    if planned_here and not args.no_edge:
        who = "the scheduler judged the robot better (actions per joule within the deadline)"
        why.append(
            f"{planned_here} planned here: "
            + (who if args.strategy.startswith("vlarun") else f"--strategy {args.strategy}")
        )
    why += [f"{n} fell back ({reason})" for reason, n in fell.items()]
    print(f"{args.ticks} actions at {args.hz:g} Hz from {s['inferences']} inferences "
          f"(p50 {s['latency_p50_ms']:.0f} ms, deadline met {100 * s['slo_met_fraction']:.0f}%, "
          f"{s['stalls']} stalls); edge {'up' if up else 'none or down'}: {used} requests used "
          f"it; the others: {'; '.join(why) or 'none'}")  # fmt: skip
finally:
    if edge is not None:
        procs.stop(edge)
