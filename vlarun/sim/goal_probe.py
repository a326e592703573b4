"""Does a policy find the goal in the image, or copy the hand's displacement?

Two probes at the start of held-out episodes (reset, one still step so the frame is settled),
where the hand always sits at the same place and only the image says where to go:

* **image use**: the correlation, over seeds, of the policy's first action with the scripted
  expert's, per axis (xyz), and the ratio of their spreads. A policy that reads the goal from
  the pixels tracks the expert (correlation near 1, ratio near 1); one that does not answers
  every layout alike (ratio near 0).
* **state response**: the change of the policy's action when only its state says the hand is
  ``shift`` metres further along an axis (the same image), beside the change of the expert's
  action for the same shifted observation. A goal-seeking expert answers against the shift
  (it is a p-controller: the goal is now behind); a policy that continues whatever displacement
  its state shows (causal confusion: along demonstrations, the hand's offset from its fixed start
  tells which way the expert went) answers with it.

Neither probe uses the policy's own success: it is a check on what the policy reads, seconds
per task instead of a paired evaluation's minutes, run on the evaluation seeds.

``python -m vlarun.sim.goal_probe --policy checkpoints/mt10p-oft --tasks reach-v3 push-v3``
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np

from vlarun.sim.tasks import EVAL_SEED_OFFSET, get_task

AXES = "xyz"


@dataclass(frozen=True)
class ProbeConfig:
    """policy: a checkpoint directory or shipped name; tasks: Meta-World names; seeds: held-out
    layouts per task (from ``EVAL_SEED_OFFSET``); shift: metres the state moves the hand by."""

    policy: str
    tasks: tuple[str, ...] = ("reach-v3", "push-v3")
    seeds: int = 20
    shift: float = 0.05

    def __post_init__(self) -> None:
        for t in self.tasks:
            get_task(t)  # an unknown task fails here, naming the valid ones
        if self.seeds < 3:
            raise ValueError(f"seeds must be >= 3 (a correlation needs them), got {self.seeds}")
        if not 0.0 < self.shift <= 0.2:
            raise ValueError(f"shift must be in (0, 0.2] m, got {self.shift}")


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson correlation; None where either side does not vary."""
    if a.std() < 1e-6 or b.std() < 1e-6:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def probe_task(policy, task: str, seeds: int, shift: float) -> dict:
    """Both probes on one task (see the module docstring)."""
    from vlarun.sim.env import MetaWorldEnv, env_views

    env = MetaWorldEnv(task, **env_views(policy.model.cfg))

    def first_action(obs: dict, state: np.ndarray) -> np.ndarray:
        image, _ = policy.observation(obs)
        run = policy.run_stages(image, env.instruction, state=state)
        return np.asarray(policy.unnormalize(run.outputs["actions"][0])[0], dtype=np.float64)

    pol, exp = [], []
    pol_resp, exp_resp = [], []
    try:
        for k in range(seeds):
            obs, _ = env.reset(seed=EVAL_SEED_OFFSET + k)
            obs, *_ = env.step(env.hold_action())  # the hand stays at its start
            policy.reset()
            state = np.asarray(obs["state"], dtype=np.float32)
            a = first_action(obs, state)
            e = env.expert_action().astype(np.float64)
            pol.append(a[:3])
            exp.append(e[:3])
            rp, re = [], []
            for axis in range(3):
                moved = state.copy()
                moved[axis] += shift
                raw = np.array(env.raw_obs, dtype=np.float64)
                raw[axis] += shift
                rp.append((first_action(obs, moved)[axis] - a[axis]) / shift)
                re.append((float(env.expert_action(raw)[axis]) - e[axis]) / shift)
            pol_resp.append(rp)
            exp_resp.append(re)
    finally:
        env.close()
    p, e = np.array(pol), np.array(exp)
    spread = e.std(0)
    pr, er = np.array(pol_resp).mean(0), np.array(exp_resp).mean(0)
    return {
        "task": task,
        "seeds": seeds,
        "image_use": {
            ax: {
                "corr": _corr(p[:, i], e[:, i]),
                "spread_ratio": float(p[:, i].std() / spread[i]) if spread[i] > 1e-6 else None,
                "expert_spread": float(spread[i]),
            }
            for i, ax in enumerate(AXES)
        },
        "state_response_per_m": {
            ax: {"policy": float(pr[i]), "expert": float(er[i])} for i, ax in enumerate(AXES)
        },
    }


def run_probe(cfg: ProbeConfig) -> dict:
    from vlarun.policy.base import Policy

    policy = Policy.from_checkpoint(cfg.policy)
    if not policy.state_size:
        raise ValueError(f"{cfg.policy} reads no robot state: the state-response probe needs one")
    return {
        "policy": cfg.policy,
        "shift_m": cfg.shift,
        "tasks": [probe_task(policy, t, cfg.seeds, cfg.shift) for t in cfg.tasks],
    }


def format_probe(r: dict) -> str:
    lines = [f"goal probe of {r['policy']} (state shift {r['shift_m'] * 100:g} cm)"]
    for t in r["tasks"]:
        lines.append(f"  {t['task']} ({t['seeds']} held-out seeds)")
        for ax in AXES:
            u, s = t["image_use"][ax], t["state_response_per_m"][ax]
            corr = "  n/a" if u["corr"] is None else f"{u['corr']:+.2f}"
            ratio = "  n/a" if u["spread_ratio"] is None else f"{u['spread_ratio']:.2f}"
            lines.append(
                f"    {ax}: image use corr {corr}, spread {ratio} of the expert's "
                f"({u['expert_spread']:.2f}); state response {s['policy'] / 100:+.3f} per cm "
                f"(expert {s['expert'] / 100:+.3f})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m vlarun.sim.goal_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policy", required=True, help="checkpoint directory or shipped name")
    parser.add_argument("--tasks", nargs="+", default=list(ProbeConfig.tasks))
    parser.add_argument("--seeds", type=int, default=ProbeConfig.seeds)
    parser.add_argument("--shift", type=float, default=ProbeConfig.shift, help="metres")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        cfg = ProbeConfig(args.policy, tuple(args.tasks), args.seeds, args.shift)
        result = run_probe(cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"goal probe: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    print(json.dumps(result, indent=1) if args.json else format_probe(result))


if __name__ == "__main__":
    main()
