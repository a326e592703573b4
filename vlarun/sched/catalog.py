"""Hardware catalog: peaks, memory, idle/busy power and efficiency priors of every device.

The figures live in ``devices.json`` next to this file, each with its source and a tag
(V datasheet, P paper/measurement quoted elsewhere, U derived or assumed). ``this-cpu`` is the
machine vlarun runs on: ``measure_this_cpu`` times a bf16 and an fp32 matmul and a large copy,
and caches the result so later commands use measured peaks instead of the reference figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

CATALOG_FILE = Path(__file__).with_name("devices.json")
THIS_CPU = "this-cpu"


@dataclass(frozen=True)
class Device:
    """One device of the catalog. Invariant: peaks, bandwidth and memory are positive for the
    dtypes the device lists, and ``idle_w <= busy_w``.

    compute_eff / memory_eff: fraction of the peak a real kernel reaches (a prior until
    calibrated); layer_overhead_ms: dispatch cost per transformer layer per pass, which dominates
    small batch-1 stages on devices driven by a slow host CPU.
    """

    id: str
    name: str
    kind: str  # "robot", "edge" or "host": the role it usually plays, not a restriction
    bf16_tflops: float
    int8_tops: float
    fp32_tflops: float
    mem_bw_gbs: float
    mem_gb: float
    idle_w: float
    busy_w: float
    compute_eff: float = 0.5
    memory_eff: float = 0.7
    layer_overhead_ms: float = 0.0
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.mem_bw_gbs <= 0 or self.mem_gb <= 0 or self.bf16_tflops <= 0:
            raise ValueError(f"device {self.id!r}: peaks, bandwidth and memory must be positive")
        if not 0 <= self.idle_w <= self.busy_w:
            raise ValueError(f"device {self.id!r}: need 0 <= idle_w <= busy_w")
        if not (0 < self.compute_eff <= 1 and 0 < self.memory_eff <= 1):
            raise ValueError(f"device {self.id!r}: efficiency factors must lie in (0, 1]")

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for the compute dtype (int8 counts ops)."""
        tera = {"bfloat16": self.bf16_tflops, "float32": self.fp32_tflops, "int8": self.int8_tops}
        if dtype not in tera or dtype not in self.dtypes:
            raise ValueError(f"device {self.id!r} does not support dtype {dtype!r}")
        return tera[dtype] * 1e12

    @property
    def mem_bytes_per_s(self) -> float:
        return self.mem_bw_gbs * 1e9


def cache_dir() -> Path:
    """Where measured device peaks and profiles are cached (VLARUN_CACHE_DIR overrides)."""
    return Path(os.environ.get("VLARUN_CACHE_DIR", Path.home() / ".cache" / "vlarun"))


def _from_row(row: dict) -> Device:
    kw = {f.name: row[f.name] for f in dataclasses.fields(Device) if f.name in row}
    kw["dtypes"] = tuple(kw.get("dtypes", ("bfloat16", "float32")))
    return Device(**kw)


@cache
def _catalog_rows() -> tuple[dict, ...]:
    return tuple(json.loads(CATALOG_FILE.read_text())["devices"])


def load_catalog() -> dict[str, Device]:
    """All devices by id; ``this-cpu`` uses the cached measurement when one exists."""
    devices = {row["id"]: _from_row(row) for row in _catalog_rows()}
    measured = _cached_this_cpu()
    if measured is not None:
        devices[THIS_CPU] = measured
    return devices


def get_device(name: str) -> Device:
    devices = load_catalog()
    if name not in devices:
        raise ValueError(f"unknown device {name!r}; valid devices: {', '.join(devices)}")
    return devices[name]


# ---------------------------------------------------------------------------------------------
# This machine, measured


def _this_cpu_file() -> Path:
    return cache_dir() / "this-cpu.json"


def _cached_this_cpu() -> Device | None:
    path = _this_cpu_file()
    if not path.exists():
        return None
    return this_cpu_device(json.loads(path.read_text()))


def this_cpu_device(m: dict) -> Device:
    """The ``this-cpu`` catalog entry with measured peaks ``m`` (``measure_this_cpu``'s output,
    also stored in a profile file, so a recorded host can be priced on any machine)."""
    base = next(r for r in _catalog_rows() if r["id"] == THIS_CPU)
    row = base | {
        "bf16_tflops": m["bf16_gflops"] / 1e3,
        "fp32_tflops": m["fp32_gflops"] / 1e3,
        "mem_bw_gbs": m["mem_bw_gbs"],
    }
    note = f"measured {m['when']} with {m['threads']} threads by `vlarun profile --device-only`"
    measured = ("bf16_tflops", "fp32_tflops", "mem_bw_gbs")
    row["sources"] = base["sources"] | dict.fromkeys(measured, note)
    return _from_row(row)


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first call allocates and picks kernels
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_this_cpu(n: int = 1024, copy_mib: int = 256, repeats: int = 5) -> dict:
    """Time an n^3 matmul in bf16 and fp32 and a large tensor copy; cache and return the peaks.

    The best of ``repeats`` is kept: the peak is what the hardware can do, and contention from
    other processes only ever adds time.
    """
    import torch

    out: dict = {"threads": torch.get_num_threads(), "matmul_n": n, "copy_mib": copy_mib}
    for dtype, key in ((torch.bfloat16, "bf16_gflops"), (torch.float32, "fp32_gflops")):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        out[key] = 2 * n**3 / _best_seconds(lambda a=a, b=b: a @ b, repeats) / 1e9
    src = torch.empty(copy_mib * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), repeats)
    out["mem_bw_gbs"] = 2 * src.numel() * 4 / seconds / 1e9  # a copy reads and writes
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = _this_cpu_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    out["cache_file"] = str(path)
    return out
