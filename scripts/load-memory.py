#!/usr/bin/env python3
"""Peak memory of loading a VLA checkpoint in bf16, against the checkpoint's size.

  scripts/load-memory.py make DIR          # a random-weight ~1.1B VLA (TinyLlama-shaped LM,
                                           # OpenVLA's tiny vision towers), saved in bf16
  scripts/load-memory.py measure DIR       # one JSON line: checkpoint bytes, peak RSS growth

``measure`` runs the load in a fresh child process and reads its peak resident set
(getrusage ru_maxrss) before and after ``load_vla(DIR, bfloat16)``, and again after reading
every weight once (safetensors maps the file: pages become resident as they are first read,
as the first inference would): the growth is what loading cost. Run ``measure`` with
PYTHONPATH pointing at another commit's tree to compare loaders.
The target (issue: streaming load) is growth <= 1.3 x the checkpoint's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, sys, time
import torch
from vlarun.models.checkpoint import load_vla
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
model, _ = load_vla(sys.argv[1], torch.bfloat16)
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
params = sum(p.numel() for p in model.parameters())
with torch.no_grad():  # read every weight once, as the first inference does
    for p in model.parameters():
        p.sum()
used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kib": base, "peak_kib": peak, "used_kib": used, "params": params,
                  "seconds": seconds, "dtype": str(model.dtype)}))
"""


def make(out: Path) -> None:
    import dataclasses

    import torch

    from vlarun.models.checkpoint import random_vla, save_vla
    from vlarun.models.llama import LlamaConfig
    from vlarun.models.presets import get_preset

    base = get_preset("tiny-openvla")
    llm = LlamaConfig(vocab_size=32064, hidden_size=2048, intermediate_size=5632, num_layers=22,
                      num_heads=32, num_kv_heads=4, max_positions=2048)  # fmt: skip
    cfg = dataclasses.replace(base, name="load-memory-1b", llm=llm, action_vocab_size=32000)
    torch.manual_seed(0)
    model = random_vla(cfg, torch.bfloat16)
    save_vla(model, out)
    print(json.dumps({"made": str(out), "params": sum(p.numel() for p in model.parameters())}))


def measure(directory: Path) -> dict:
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    p = subprocess.run([sys.executable, "-c", CHILD, str(directory)], capture_output=True,
                       text=True, check=True)  # fmt: skip
    r = json.loads(p.stdout.strip().splitlines()[-1])
    growth = (r["peak_kib"] - r["base_kib"]) * 1024
    used = (r["used_kib"] - r["base_kib"]) * 1024
    return {"checkpoint_bytes": size, "peak_growth_bytes": growth,
            "ratio": round(growth / size, 3), "growth_after_reading_every_weight_bytes": used,
            "ratio_after_reading_every_weight": round(used / size, 3), **r}  # fmt: skip


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "measure"):
        print(__doc__, file=sys.stderr)
        return 2
    d = Path(sys.argv[2])
    if sys.argv[1] == "make":
        make(d)
    else:
        print(json.dumps(measure(d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
