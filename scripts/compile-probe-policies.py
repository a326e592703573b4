"""Whole-policy predict(), eager vs compiled steps (inductor, ``compile_steps("default")`` with
the denoising steps included), on the tiny DiT and flow presets: is compiling the denoising
steps worth it on this CPU? (It was not: 2026-12-02, BENCHMARKS.md; so ``Policy.load`` compiles
them only on CUDA.) Medians of 5 after one warm-up round, alternating.

    .venv/bin/python scripts/compile-probe-policies.py
"""

import json
import statistics
import time

import numpy as np
import torch
import torch._inductor.config as ic

from vlarun.models.static_step import compile_steps
from vlarun.policy.base import Policy

ic.freezing = True
out = {}
for name in ("tiny-cogact", "tiny-pi0"):
    eager = Policy.load(name)
    comp = Policy.load(name)
    comp.model.steps = compile_steps("default", denoise=True)
    size = eager.model.cfg.image_size
    n = eager.model.cfg.num_images
    fr = np.random.default_rng(0).integers(0, 255, (n, size, size, 3), dtype=np.uint8)
    img = fr if n > 1 else fr[0]
    t0 = time.perf_counter()
    comp.predict(img, "open the drawer")
    cs = time.perf_counter() - t0
    ts = {"eager": [], "compiled": []}
    for r in range(6):
        for k, p in (("eager", eager), ("compiled", comp)):
            t = time.perf_counter()
            p.predict(img, "open the drawer")
            d = time.perf_counter() - t
            if r:
                ts[k].append(d * 1e3)
    m = {k: statistics.median(v) for k, v in ts.items()}
    same = bool(np.allclose(eager.predict(img, "x"), comp.predict(img, "x"), atol=1e-4))
    out[name] = {
        "ms": m,
        "speedup": m["eager"] / m["compiled"],
        "compile_s": cs,
        "same_actions": same,
    }
    print(name, out[name], flush=True)
print(
    json.dumps(
        {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "threads": torch.get_num_threads(),
            "rows": out,
        }
    )
)
