"""Write the ``adversarial`` world: the catalog made wrong in the ways an audit found plausible.

``python -m vlarun.world.derive`` writes ``worlds/adversarial.json`` with explicit numbers,
each with its derivation, from the catalog's roofline of ``openvla-7b`` on the Orin AGX 32 GB
and the RTX 4090 (the testbed of the headline):

* the robot runs every stage 1.2x slower than the catalog says (the catalog's own error against
  TRIAGE Table I's Orin end-to-end time, 1261 ms against 1060 modelled: 1.19x);
* on the GPU a setting saves only half its FLOPs' share of the time (batch-1 GPU kernels are
  launch- and memory-bound: fewer FLOPs is not proportionally less time), on the robot what
  the catalog says;
* 1% of executions stall 3x on both devices;
* the RTX 4090 draws what makes a full-compute inference cost 6.9 J (EcoVLA Fig. 1's measured
  4090 energy per inference) instead of the catalog's 281 W x its modelled time.

Numbers are derived from the scheduler's model on purpose (that is what "wrong by a known
amount" means); the scheduler still never reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlarun.models.presets import get_preset
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import at_batch, roofline, stage_works
from vlarun.sched.plans import Setting, apply_setting
from vlarun.stages.families import Workload
from vlarun.world.model import WORLDS_DIR

BATCHES = (1, 2, 4, 8, 16)
# The knob values the plan space offers (sched/settings.json), each tabled on its own.
KNOB_VALUES = {
    "token_budget": (1.0, 0.75, 0.5, 0.34, 0.25, 0.18, 0.11, 0.07),
    "layers_kept": (1.0, 0.875, 0.75, 0.6875),
    "cache_interval": (1, 2, 3, 5),
}
ROBOT_SLOWER = 1.2
GPU_SAVING_SHARE = 0.5
STALL_P, STALL_FACTOR = 0.01, 3.0
EDGE_J_PER_INFERENCE = 6.9


def adversarial(model: str = "openvla-7b", robot: str = "orin-agx-32gb",
                edge: str = "rtx4090") -> dict:  # fmt: skip
    cfg = get_preset(model)
    works = stage_works(cfg)
    devices = {}
    for dev_id, role in ((robot, "robot"), (edge, "edge")):
        dev = get_device(dev_id)
        slower = ROBOT_SLOWER if role == "robot" else 1.0
        stages = {
            w.name: {
                "batch": list(BATCHES),
                "seconds": [
                    round(roofline(at_batch(w, b), dev).seconds * slower, 6) for b in BATCHES
                ],  # fmt: skip
                "source": f"catalog roofline x {slower}" if slower != 1 else "catalog roofline",
            }
            for w in works
        }
        settings = []
        for knob, values in KNOB_VALUES.items():
            ratios: dict[str, list[float]] = {w.name: [] for w in works}
            for v in values:
                under = apply_setting(works, cfg, Workload(), Setting(((knob, v),), None))
                for w, u in zip(works, under, strict=True):
                    if role == "robot":  # the catalog's ratio
                        r = roofline(u, dev).seconds / roofline(w, dev).seconds
                    else:  # half the FLOPs' share saved
                        r = 1.0 - GPU_SAVING_SHARE * (1.0 - u.flops / w.flops)
                    ratios[w.name].append(round(r, 4))
            how = (
                "the catalog's roofline ratio"
                if role == "robot"
                else f"1 - {GPU_SAVING_SHARE} x (1 - FLOPs ratio): half the FLOPs' share"
            )
            settings.append({"knob": knob, "values": list(values), "ratios": ratios,
                             "source": how})  # fmt: skip
        total = sum(roofline(w, dev).seconds for w in works)
        busy = EDGE_J_PER_INFERENCE / total if role == "edge" else dev.busy_w
        devices[dev_id] = {
            "source": f"{dev.name}: the catalog, perturbed (see the world's about)",
            "stages": stages,
            "jitter": {"sigma": 0.03, "stall_p": STALL_P, "stall_factor": STALL_FACTOR,
                       "source": "3% lognormal, 1% of executions stall 3x (assumed)"},
            "power": {"busy_w": round(busy, 2), "idle_w": min(dev.idle_w, round(busy, 2)),
                      "tx_w": 1.5, "rx_w": 1.0, "listen_w": 0.5,
                      "source": (f"busy: {EDGE_J_PER_INFERENCE} J per full inference (EcoVLA "
                                 f"Fig. 1) over the catalog's {total * 1e3:.0f} ms"
                                 if role == "edge" else "the catalog's")
                                + "; radio: assumed (U)"},
            "settings": settings,
        }  # fmt: skip
    return {
        "world": "adversarial",
        "model": model,
        "about": __doc__.split("\n\n", 1)[1].split("\n\nNumbers")[0],
        "devices": devices,
    }


def main() -> None:
    path = Path(WORLDS_DIR) / "adversarial.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(adversarial(), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
