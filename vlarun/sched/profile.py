"""Measured stage profiles: time every stage of a preset on this machine over batch sizes and
prompt lengths, store the medians, and let the cost model use them instead of the roofline.

A profile file is JSON: {"device", "threads", "when", "entries": [{model, stage, batch,
text_tokens, dtype, median_ms, p90_ms, samples}]} and, from `vlarun profile`, the host's
measured peaks ("device_peaks"). ``samples`` are every timed run in ms (0.1 us resolution): the
fleet simulator resamples them as its ground truth. Times are in-process stage compute only
(packets not serialised), warm-up runs excluded.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlarun.sched.catalog import THIS_CPU, cache_dir


@dataclass
class Profile:
    """Measured medians keyed by (device, model, stage, batch, text_tokens, dtype)."""

    entries: dict[tuple, dict] = field(default_factory=dict)

    def add(self, device: str, row: dict) -> None:
        key = (device, row["model"], row["stage"], row["batch"], row["text_tokens"], row["dtype"])
        self.entries[key] = row

    def lookup(self, device, model, stage, batch, text_tokens, dtype) -> float | None:
        """Measured median seconds, or None where this exact shape was not profiled."""
        row = self.entries.get((device, model, stage, batch, text_tokens, dtype))
        return None if row is None else row["median_ms"] * 1e-3

    def stage_table(self, model, batch, text_tokens, dtype) -> dict[tuple[str, str], float]:
        """Measured median seconds by (stage, device) for one shape: the override the
        predictor and scheduler take."""
        return {
            (k[2], k[0]): row["median_ms"] * 1e-3
            for k, row in self.entries.items()
            if k[1] == model and k[3:] == (batch, text_tokens, dtype)
        }

    @classmethod
    def load(cls, *paths: str | Path) -> Profile:
        prof = cls()
        for path in paths:
            data = json.loads(Path(path).read_text())
            for row in data["entries"]:
                prof.add(data["device"], row)
        return prof


def default_profile_path(model: str) -> Path:
    return cache_dir() / f"profile-{THIS_CPU}-{model}.json"


def cpu_dtype() -> str:
    """The compute dtype this CPU runs fastest: bf16 where it has native bf16 instructions
    (AVX-512 BF16, AMX), fp32 elsewhere (bf16 emulated on AVX2 ran 1.5x slower than fp32 for
    mt10p-ar, and ~50x on a GEMM). One default for `profile`, `predict` and `plan`, so a
    profile taken with the defaults is the one the predictions read."""
    from vlarun.machine import cpu_features

    f = cpu_features()
    return "bfloat16" if f["avx512_bf16"] or f["amx_bf16"] else "float32"


def default_dtype(device) -> str:
    """``device``'s default compute dtype: this CPU's (``cpu_dtype``); bf16 on a catalog
    device that supports it (every GPU and Jetson in the catalog), else its first."""
    if device.id == THIS_CPU:
        return cpu_dtype()
    return "bfloat16" if "bfloat16" in device.dtypes else device.dtypes[0]


def cached_profile(model: str, device_ids: list[str], dtype: str) -> Path | None:
    """The profile `vlarun profile --model MODEL` left in the cache, when one of
    ``device_ids`` is this CPU and it holds stages of ``model`` at ``dtype``; else None."""
    path = default_profile_path(model)
    if THIS_CPU not in device_ids or not path.exists():
        return None
    try:
        rows = json.loads(path.read_text())["entries"]
    except (OSError, ValueError, KeyError):
        return None  # unreadable: predictions stay roofline estimates, as without one
    return path if any(r.get("model") == model and r.get("dtype") == dtype for r in rows) else None


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def profile_preset(
    preset: str,
    batches: tuple[int, ...] = (1,),
    text_tokens: tuple[int, ...] = (24,),
    dtype: str = "float32",
    repeats: int = 5,
    seed: int = 0,
) -> dict:
    """Time every stage of ``preset`` (random weights) at each batch and prompt length."""
    import torch

    from vlarun.models.presets import get_preset
    from vlarun.models.vla import VLA
    from vlarun.stages.families import Workload, build_graph, example_inputs

    cfg = get_preset(preset)
    torch.manual_seed(seed)
    model = VLA(cfg).to(getattr(torch, dtype)).eval()
    entries = []
    for b in batches:
        for n in text_tokens:
            if n > cfg.max_text_tokens:
                raise ValueError(f"{preset} takes at most {cfg.max_text_tokens} text tokens")
            images = torch.rand(b, cfg.num_images, 3, cfg.image_size, cfg.image_size)
            ids = [[(7 * i + r) % 200 + 3 for i in range(n)] for r in range(b)]
            packet = example_inputs(cfg, images, ids)
            graph = build_graph(cfg, model, Workload(b, n, dtype))
            graph.run(packet, serialize=False)  # warm-up: allocations, kernel selection
            runs = [graph.run(packet, serialize=False).timings for _ in range(repeats)]
            for i, st in enumerate(graph.stages):
                # 0.1 us resolution: far below the timer's noise, and keeps the file small.
                ms = [round(r[i].seconds * 1e3, 4) for r in runs]
                entries.append(
                    {
                        "model": preset,
                        "stage": st.name,
                        "batch": b,
                        "text_tokens": n,
                        "dtype": dtype,
                        "median_ms": statistics.median(ms),
                        "p90_ms": _percentile(ms, 0.9),
                        "samples": ms,
                    }
                )
    return {
        "device": THIS_CPU,
        "threads": torch.get_num_threads(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scope": "in-process stage compute, warm-up excluded, packets not serialised",
        "entries": entries,
    }


def save_profile(result: dict, path: str | Path) -> Path:
    """Write ``result`` as indented JSON with each list of numbers on one line (the samples
    stay readable and the file small enough to commit)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    numbers = re.compile(r"\[\s*([-+\d.eE,\s]+?)\s*\]")
    text = numbers.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    path.write_text(text)
    return path
