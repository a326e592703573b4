"""Issue 19 diagnosis: run `bench coinfer`'s closed loop for one strategy (vlarun by default)
and dump, per request, the scheduler's prediction for EVERY placement next to what the chosen
one realised (latency, modelled energy, per-stage times, bytes).

    PYTHONPATH=. python scripts/diag_sched.py [--strategy vlarun] [--steps 80] [--out x.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vlarun.bench import coinfer
from vlarun.runtime import agent as agent_mod
from vlarun.sched import scheduler as sched_mod

LOG: list[dict] = []
STRATEGY = ["vlarun"]  # the agent under test (background load runs edge-only)
_orig_decide = sched_mod.Scheduler.decide
_orig_observe = sched_mod.Scheduler.observe
_orig_infer = agent_mod.RobotAgent.infer


def _decide(self, link, now=0.0, edge_state=None, top=5):
    d = _orig_decide(self, link, now, edge_state, top)
    sc = self.score(link, now, edge_state)  # same inputs: the table the rule chose from
    per = {}
    for c in np.flatnonzero(self.allowed & ~self.join):
        roles = "/".join(
            f"{n}@{r}" for n, r in zip(self.space.stages, self.space.roles(self.p[c]), strict=True)
        )
        per[roles] = {
            "lat_ms": round(float(sc.latency[c]) * 1e3, 1),
            "sigma_ms": round(self._at(sc.sigma, c) * 1e3, 1),
            "E_j": round(float(sc.energy[c]), 4),
            "apj": round(float(self.actions / sc.energy[c]), 3),
        }
    LOG.append(
        {
            "plan": "/".join(f"{n}@{r}" for n, r in d.placement.items()),
            "explored": d.explored,
            "feasible": d.feasible,
            "pred_lat_ms": d.latency_s * 1e3,
            "pred_E_j": d.energy_j,
            "stage_pred_ms": {k: v * 1e3 for k, v in d.stage_predicted_s.items()},
            "link_mbps": link.bandwidth_mbps,
            "rtt_ms": link.rtt_ms,
            "factors": {f"{k[0]}@{k[1]}": round(v, 3) for k, v in self.cal.stage_factor.items()},
            "boundary_ms": {
                f"{k[0]}>{k[1]}": round(v * 1e3, 2) for k, v in self.cal.boundary_s.items()
            },
            "residual_ms": {"/".join(k): round(v * 1e3, 1) for k, v in self.cal.residual_s.items()},
            "all": per,
        }
    )
    return d


def _infer(self, image, instruction, state=None, seed=0):
    if self.cfg.strategy != STRATEGY[0]:  # a background-load robot
        return _orig_infer(self, image, instruction, state, seed)
    n = len(LOG)
    inf = _orig_infer(self, image, instruction, state, seed)
    row = inf.row()
    rec = {
        "ran": row["ran"],
        "real_lat_ms": row["latency_ms"],
        "real_E_j": row["energy_j"],
        "stage_ms": row["stage_ms"],
        "bytes_sent": row["bytes_sent"],
        "fallback": row["fallback"],
        "edge_batch": row["edge_batch"],
    }
    if len(LOG) > n:
        LOG[-1].update(rec)
    else:
        LOG.append({"plan": row["plan"], **rec})
    return inf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="vlarun")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--out", default="/tmp/diag.json")
    ap.add_argument("--load", type=int, default=0, help="other robots on the edge (edge-only)")
    ap.add_argument("--bandwidth", type=float, default=200.0)
    ap.add_argument("--drop-to", type=float, default=None, help="Mbit/s after half the run")
    a = ap.parse_args()
    if a.load and a.strategy == "edge-only":
        raise SystemExit("background load runs edge-only: diagnose another strategy under load")
    STRATEGY[0] = a.strategy
    sched_mod.Scheduler.decide = _decide
    agent_mod.RobotAgent.infer = _infer
    import torch

    from vlarun.paths import checkpoints_dir
    from vlarun.policy import Policy
    from vlarun.runtime import procs

    torch.set_num_threads(1)
    o = coinfer.BenchCoinferOptions(steps=a.steps, robots=0)
    ckpt = str(checkpoints_dir() / "tiny-ar")
    policy = Policy.load(ckpt)
    edge, endpoint = procs.start_edge(extra=["--policy", ckpt, "--threads", "1"])
    from vlarun.bench.coinfer_matrix import BackgroundLoad

    period = policy.model.cfg.horizon / o.control_hz
    make_cfg = lambda s, slo: coinfer._agent_cfg(o, s, slo, a.bandwidth)  # noqa: E731
    try:
        with BackgroundLoad(policy, endpoint, a.load, period, make_cfg):
            row = coinfer._strategy_run(
                o, policy, endpoint, a.strategy, a.steps, a.bandwidth, a.drop_to
            )
    finally:
        procs.stop(edge)
    row.pop("trace")
    Path(a.out).write_text(json.dumps({"row": row, "log": LOG}, indent=1))
    print(
        json.dumps(
            {
                k: row[k]
                for k in ("actions_per_joule", "slo_met_fraction", "latency_p50_ms", "plans_ran")
            }
        )
    )


if __name__ == "__main__":
    main()
