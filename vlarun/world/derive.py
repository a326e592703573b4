"""Worlds derived from the catalog: the ``adversarial`` one, and a seeded grid of others.

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

``python -m vlarun.world.derive --grid 50 --seed S --out DIR`` draws worlds around the catalog
instead (``GRID``: each device's time scale, busy power, stalls, jitter and what a setting
saves, uniform over ranges that cover the devices users bring), one file each, so the
scheduler is judged on worlds nobody tuned it to (issue 61). ``fleet --world-sweep N`` draws
the same worlds in memory.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

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


@dataclass(frozen=True)
class WorldParams:
    """How a world departs from the catalog, per device role.

    ``*_scale``: every stage's time over the catalog roofline's; ``*_busy_w``: power while a
    stage runs (None: the catalog's); ``*_saving``: the share of a setting's FLOPs saving that
    shows in time (None: the catalog roofline's own ratio); stalls and jitter apply to every
    execution on both devices."""

    robot_scale: float = 1.0
    edge_scale: float = 1.0
    robot_busy_w: float | None = None
    edge_busy_w: float | None = None
    robot_saving: float | None = None
    edge_saving: float | None = None
    stall_p: float = 0.0
    stall_factor: float = 1.0
    jitter: float = 0.03

    def describe(self) -> str:
        def w(x: float | None) -> str:
            return "catalog" if x is None else f"{x:.0f} W"

        def s(x: float | None) -> str:
            return "catalog ratio" if x is None else f"{x:.0%} of FLOPs share"

        return (
            f"robot x{self.robot_scale:.2f} {w(self.robot_busy_w)} {s(self.robot_saving)}; "
            f"edge x{self.edge_scale:.2f} {w(self.edge_busy_w)} {s(self.edge_saving)}; "
            f"stalls {self.stall_p:.1%} x{self.stall_factor:.2f}; jitter "
            f"{self.jitter:.0%}"
        )


# The ranges a grid world is drawn from (issue 61), uniform in each.
GRID = {
    "robot_scale": (0.7, 1.5),
    "edge_scale": (0.7, 1.5),
    "edge_busy_w": (40.0, 300.0),
    "robot_busy_w": (8.0, 20.0),
    "stall_p": (0.0, 0.03),
    "stall_factor": (1.5, 4.0),
    "jitter": (0.02, 0.10),
    "robot_saving": (0.3, 1.0),
    "edge_saving": (0.3, 1.0),
}


def draw_grid(n: int, seed: int) -> list[WorldParams]:
    """``n`` worlds drawn from ``GRID`` (the same ones for the same seed)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = {k: float(rng.uniform(lo, hi)) for k, (lo, hi) in GRID.items()}
        out.append(WorldParams(**{k: round(v, 4) for k, v in x.items()}))
    return out


def derive(
    params: WorldParams,
    name: str,
    about: str,
    model: str = "openvla-7b",
    robot: str = "orin-agx-32gb",
    edge: str = "rtx4090",
    edge_j_per_inference: float | None = None,
) -> dict:
    """A world file (``world.model`` schema) for ``params``. ``edge_j_per_inference`` sets the
    edge's busy power from a measured energy per full inference instead (the adversarial
    world)."""
    cfg = get_preset(model)
    works = stage_works(cfg)
    devices = {}
    for dev_id, role in ((robot, "robot"), (edge, "edge")):
        dev = get_device(dev_id)
        scale = params.robot_scale if role == "robot" else params.edge_scale
        saving = params.robot_saving if role == "robot" else params.edge_saving
        stages = {
            w.name: {
                "batch": list(BATCHES),
                "seconds": [
                    round(roofline(at_batch(w, b), dev).seconds * scale, 6) for b in BATCHES
                ],
                "source": f"catalog roofline x {scale:g}" if scale != 1 else "catalog roofline",
            }
            for w in works
        }
        settings = []
        for knob, values in KNOB_VALUES.items():
            ratios: dict[str, list[float]] = {w.name: [] for w in works}
            for v in values:
                under = apply_setting(works, cfg, Workload(), Setting(((knob, v),), None))
                for w, u in zip(works, under, strict=True):
                    if saving is None:  # the catalog's ratio
                        r = roofline(u, dev).seconds / roofline(w, dev).seconds
                    else:
                        r = 1.0 - saving * (1.0 - u.flops / w.flops)
                    ratios[w.name].append(round(r, 4))
            how = (
                "the catalog's roofline ratio"
                if saving is None
                else f"1 - {saving:g} x (1 - FLOPs ratio): {saving:.0%} of the FLOPs' share"
            )
            settings.append({"knob": knob, "values": list(values), "ratios": ratios, "source": how})
        busy_w = params.robot_busy_w if role == "robot" else params.edge_busy_w
        power_source = "the catalog's"
        if role == "edge" and edge_j_per_inference is not None:
            total = sum(roofline(w, dev).seconds for w in works)
            busy_w = edge_j_per_inference / total
            power_source = (
                f"busy: {edge_j_per_inference} J per full inference (EcoVLA Fig. 1)"
                f" over the catalog's {total * 1e3:.0f} ms"
            )
        elif busy_w is not None:
            power_source = f"busy {busy_w:.0f} W (drawn)"
        busy = dev.busy_w if busy_w is None else round(busy_w, 2)
        devices[dev_id] = {
            "source": f"{dev.name}: the catalog, perturbed (see the world's about)",
            "stages": stages,
            "jitter": {
                "sigma": params.jitter,
                "stall_p": params.stall_p,
                "stall_factor": params.stall_factor,
                "source": f"{params.jitter:.0%} lognormal, {params.stall_p:.1%} of "
                f"executions stall {params.stall_factor:g}x",
            },
            "power": {
                "busy_w": busy,
                "idle_w": min(dev.idle_w, busy),
                "tx_w": 1.5,
                "rx_w": 1.0,
                "listen_w": 0.5,
                "source": power_source + "; radio: assumed (U)",
            },
            "settings": settings,
        }
    return {
        "world": name,
        "model": model,
        "about": about,
        "params": asdict(params),
        "devices": devices,
    }


def adversarial(
    model: str = "openvla-7b", robot: str = "orin-agx-32gb", edge: str = "rtx4090"
) -> dict:
    params = WorldParams(
        robot_scale=ROBOT_SLOWER,
        edge_saving=GPU_SAVING_SHARE,
        stall_p=STALL_P,
        stall_factor=STALL_FACTOR,
    )
    about = __doc__.split("\n\n", 1)[1].split("\n\nNumbers")[0]
    world = derive(params, "adversarial", about, model, robot, edge, EDGE_J_PER_INFERENCE)
    for dev in (robot, edge):
        world["devices"][dev]["jitter"]["source"] = (
            "3% lognormal, 1% of executions stall 3x (assumed)"
        )
    return world


def grid_worlds(
    n: int,
    seed: int,
    model: str = "openvla-7b",
    robot: str = "orin-agx-32gb",
    edge: str = "rtx4090",
) -> list[dict]:
    """The grid's worlds as world files (``grid-SEED-I``), each with its parameters."""
    return [
        derive(
            p,
            f"grid-{seed}-{i}",
            f"drawn from vlarun.world.derive.GRID (seed {seed}, world {i}): {p.describe()}",
            model,
            robot,
            edge,
        )
        for i, p in enumerate(draw_grid(n, seed))
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, default=0, help="draw this many worlds instead")
    ap.add_argument("--seed", type=int, default=0, help="the grid's seed")
    ap.add_argument("--out", default=None, help="directory for the grid's files")
    args = ap.parse_args(argv)
    if args.grid:
        out = Path(args.out or f"results/worlds-grid-{args.seed}")
        out.mkdir(parents=True, exist_ok=True)
        for w in grid_worlds(args.grid, args.seed):
            (out / f"{w['world']}.json").write_text(json.dumps(w, indent=1) + "\n")
            print(f"{out / (w['world'] + '.json')}: {w['about'].split(': ', 1)[1]}")
        return
    path = Path(WORLDS_DIR) / "adversarial.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(adversarial(), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
