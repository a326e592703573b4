"""A robot loop of your own, driven by vlarun: an edge server on this machine, a stand-in
camera and arm, one action per control tick (see vlarun/runtime/robot.py).

  python examples/own_robot.py                # with a local edge (`vlarun serve-edge`)
  python examples/own_robot.py --no-edge      # everything on the robot
"""

import argparse
import time

import numpy as np

from vlarun import Policy
from vlarun.runtime import procs
from vlarun.runtime.robot import Robot

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--policy", default="tiny-ar", help="checkpoint directory or shipped name")
parser.add_argument("--ticks", type=int, default=60, help="control ticks to run")
parser.add_argument("--hz", type=float, default=10.0, help="control rate")
parser.add_argument("--no-edge", action="store_true", help="run without an edge server")
args = parser.parse_args()

policy = Policy.load(args.policy)
size, instruction = policy.model.cfg.image_size, "open the drawer"


def camera(t: int) -> np.ndarray:
    """A stand-in for your camera: (H, W, 3) uint8, a bright square drifting across."""
    frame = np.full((size, size, 3), 40, np.uint8)
    x = (4 * t) % (size - 16)
    frame[size // 2 - 8 : size // 2 + 8, x : x + 16] = 230
    return frame


joints = np.zeros(max(policy.state_size, 1), np.float32)  # a stand-in for your arm's state
# The same as `vlarun serve-edge --insecure --port 0 --policy tiny-ar` in another terminal.
edge, endpoint = (None, None) if args.no_edge else procs.start_edge(extra=["--policy", args.policy])
try:
    with Robot(policy, endpoint, control_hz=args.hz, insecure=True) as robot:
        robot.warmup(camera(0), instruction)
        next_tick = time.perf_counter()
        for t in range(args.ticks):
            state = joints[: policy.state_size] if policy.state_size else None
            action = robot.act(camera(t), instruction, state=state)
            joints[: min(len(action), len(joints))] += 0.01 * action[: len(joints)]  # "apply"
            next_tick += 1.0 / args.hz
            time.sleep(max(next_tick - time.perf_counter(), 0.0))
        s, up = robot.summary(), robot.edge_up
        last = robot.inferences[-1].ran
    print(f"{args.ticks} actions at {args.hz:g} Hz from {s['inferences']} inferences "
          f"(p50 {s['latency_p50_ms']:.0f} ms, deadline met {100 * s['slo_met_fraction']:.0f}%, "
          f"{s['stalls']} stalls); edge {'up' if up else 'none or down'}: "
          f"{s['edge_requests']} requests used it, {s['fallbacks']} fell back; "
          f"last plan {last}")  # fmt: skip
finally:
    if edge is not None:
        procs.stop(edge)
