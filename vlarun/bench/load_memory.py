"""`vlarun bench load`: peak memory of loading a VLA checkpoint in bf16, against the
checkpoint's size.

  vlarun bench load DIR --make      # first: a random-weight ~1.1B VLA (TinyLlama-shaped LM,
                                    # OpenVLA's tiny vision towers), saved in bf16
  vlarun bench load DIR             # checkpoint bytes, peak RSS growth

The load runs in a fresh child process, which reads its peak resident set (getrusage
ru_maxrss) before and after ``load_vla(DIR, bfloat16)``, and again after reading every weight
once (safetensors maps the file: pages become resident as they are first read, as the first
inference would): the growth is what loading cost. Run it with PYTHONPATH pointing at another
commit's tree to compare loaders. The target is growth <= 1.3 x the checkpoint's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt


@dataclass(frozen=True)
class BenchLoadOptions:
    """Peak memory of loading a checkpoint in bf16 against its size (a fresh process)."""

    directory: str = opt(help="checkpoint directory", positional=True)
    make: bool = opt(False, "first write a random-weight ~1.1B VLA there (bf16)")
    json: bool = opt(False, "print one JSON object")


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


def make(out: Path) -> dict:
    """A random-weight ~1.1B VLA (TinyLlama-shaped LM, OpenVLA's tiny vision towers) saved in
    bf16 at ``out``."""
    import dataclasses

    import torch

    from vlarun.models.checkpoint import random_vla, save_vla
    from vlarun.models.llama import LlamaConfig
    from vlarun.models.presets import get_preset

    base = get_preset("tiny-openvla")
    llm = LlamaConfig(
        vocab_size=32064,
        hidden_size=2048,
        intermediate_size=5632,
        num_layers=22,
        num_heads=32,
        num_kv_heads=4,
        max_positions=2048,
    )
    cfg = dataclasses.replace(base, name="load-memory-1b", llm=llm, action_vocab_size=32000)
    torch.manual_seed(0)
    model = random_vla(cfg, torch.bfloat16)
    save_vla(model, out)
    return {"made": str(out), "params": sum(p.numel() for p in model.parameters())}


def measure(directory: Path) -> dict:
    """Checkpoint bytes against the peak resident growth of loading it in a fresh process."""
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory)], capture_output=True, text=True, check=True
    )
    r = json.loads(p.stdout.strip().splitlines()[-1])
    growth = (r["peak_kib"] - r["base_kib"]) * 1024
    used = (r["used_kib"] - r["base_kib"]) * 1024
    return {
        "checkpoint_bytes": size,
        "peak_growth_bytes": growth,
        "ratio": round(growth / size, 3),
        "growth_after_reading_every_weight_bytes": used,
        "ratio_after_reading_every_weight": round(used / size, 3),
        **r,
    }


def run(o: BenchLoadOptions) -> dict:
    d = Path(o.directory)
    made = make(d) if o.make else None
    if not any(d.glob("*.safetensors")):
        raise FileNotFoundError(f"{d}: no *.safetensors (make one with --make)")
    return {"made": made} | measure(d)


def show(r: dict) -> None:
    gib = 1024**3
    print(
        f"checkpoint {r['checkpoint_bytes'] / gib:.2f} GiB ({r['params'] / 1e9:.2f} B params, "
        f"{r['dtype']}), loaded in {r['seconds']:.1f} s: peak growth "
        f"{r['peak_growth_bytes'] / gib:.2f} GiB ({r['ratio']:.2f}x), after reading every "
        f"weight {r['growth_after_reading_every_weight_bytes'] / gib:.2f} GiB "
        f"({r['ratio_after_reading_every_weight']:.2f}x)"
    )


OPTIONS = {"bench-load": BenchLoadOptions}
RUN = {"bench-load": run}
SHOW = {"bench-load": show}
