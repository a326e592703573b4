"""Worlds: what emulated devices really do, kept where the scheduler cannot look.

An emulated run (``bench coinfer --emulate``) runs the small model for real and pads each stage
to the time the real model's stage takes on the emulated device. Where that time comes from is
the *world*: per device and stage, measured times against batch size, a jitter shape with rare
stalls, power by state, and what each accelerator setting really does to each stage's time. The
scheduler plans from its catalog and cost model and learns from what it measures; it never
reads a world (the layer test forbids ``vlarun.sched`` importing ``vlarun.world``, and a test
imports the scheduler with this package blocked). A world equal to the catalog (``catalog``)
tests queueing and the link only, and says so.

Shipped worlds: ``catalog`` (built from the scheduler's own roofline), ``published`` (measured
figures only, each with its source) and ``adversarial`` (the catalog made wrong on purpose).
``load_world(NAME or FILE, model)`` reads one; docs/scheduler.md documents the schema.

Beside the worlds, everything that judges the scheduler's cost model from outside it:

  fleet.py            N robots + one edge simulated (`vlarun fleet`; `--matrix`:
                      bench/fleet_matrix.py), its truth drawn from truth.py
  truth.py            recorded per-stage samples (fleet_samples.json) carried to a model
                      shape and device
  validate.py         predictions vs the papers' published times (`vlarun bench validate`)
  published.py        the cost model vs published pi0 / pi0.5 / SmolVLA latencies
                      (published.json; `vlarun bench published`)
  predictor_check.py  every plan of a tiny preset run here with emulated links
                      (`vlarun bench predictor`)
"""

from vlarun.world.load import load_world, shipped_worlds
from vlarun.world.model import World, WorldError

__all__ = ["World", "WorldError", "load_world", "shipped_worlds"]
