"""Power meters as pluggable readers: NVML, Jetson INA3221 rails (sysfs or tegrastats lines),
Intel RAPL powercap. Each reader returns watts (or joules, for cumulative counters) from one
source; ``integrate`` turns timed power samples into energy. Nothing here needs the vendor
library at import time: NVML is imported lazily, the rest is text parsing, so every parser is
tested on recorded sample files (tests/sched/samples/) on a machine with no meter at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class PowerMeter(Protocol):
    name: str

    def read_watts(self) -> float: ...


def integrate(samples: Iterable[tuple[float, float]]) -> float:
    """Energy in joules from (seconds, watts) samples by the trapezoid rule."""
    pts = sorted(samples)
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(pts, pts[1:], strict=False))


# ---------------------------------------------------------------------------------------------
# Jetson: tegrastats


# JetPack 5+ (Orin): "VDD_GPU_SOC 3185mW/3185mW"; JetPack 4 (Xavier): "POM_5V_GPU 1234/1500".
_RAIL_MW = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)mW/(\d+)mW")
_RAIL_POM = re.compile(r"\b(POM_[A-Z0-9_]+|VDD_[A-Z0-9_]+) (\d+)/(\d+)\b")
# Rails whose sum is the module's input power on an AGX Orin (what jtop reports as total).
ORIN_TOTAL_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")


def parse_tegrastats_line(line: str) -> dict[str, float]:
    """Instantaneous watts per rail in one tegrastats line (the first of each cur/avg pair)."""
    rails = {name: int(cur) / 1e3 for name, cur, _ in _RAIL_MW.findall(line)}
    if not rails:
        rails = {name: int(cur) / 1e3 for name, cur, _ in _RAIL_POM.findall(line)}
    return rails


@dataclass
class TegrastatsMeter:
    """Reads the latest line of a tegrastats log (``tegrastats --logfile F``) and sums rails.

    ``rails``: which rails make the total; None sums ``ORIN_TOTAL_RAILS`` when present, else
    every POM_*_IN input rail (JetPack 4), else all rails.
    """

    path: str | Path
    rails: tuple[str, ...] | None = None
    name: str = "tegrastats"

    def read_rails(self) -> dict[str, float]:
        lines = [ln for ln in Path(self.path).read_text().splitlines() if ln.strip()]
        if not lines:
            raise ValueError(f"{self.path}: no tegrastats lines")
        return parse_tegrastats_line(lines[-1])

    def read_watts(self) -> float:
        return total_rails(self.read_rails(), self.rails)


def total_rails(rails: dict[str, float], wanted: tuple[str, ...] | None = None) -> float:
    if wanted is None:
        if all(r in rails for r in ORIN_TOTAL_RAILS):
            wanted = ORIN_TOTAL_RAILS
        else:
            inputs = tuple(r for r in rails if r.startswith("POM_") and r.endswith("_IN"))
            wanted = inputs or tuple(rails)
    missing = [r for r in wanted if r not in rails]
    if missing:
        raise ValueError(f"rails {missing} not in the sample; rails seen: {sorted(rails)}")
    return sum(rails[r] for r in wanted)


# ---------------------------------------------------------------------------------------------
# Jetson: INA3221 in sysfs


INA3221_ROOT = "/sys/bus/i2c/drivers/ina3221"


def read_ina3221(root: str | Path = INA3221_ROOT) -> dict[str, float]:
    """Watts per labelled rail under an INA3221 driver directory.

    hwmon layout (JetPack 5+): hwmon*/inN_label, inN_input (mV), currN_input (mA).
    iio layout (JetPack 4): iio:device*/rail_name_N, in_power N_input (mW).
    """
    root = Path(root)
    rails: dict[str, float] = {}
    for label in sorted(root.rglob("in*_label")):
        n = re.fullmatch(r"in(\d+)_label", label.name)
        if n is None:
            continue
        volts, amps = label.with_name(f"in{n[1]}_input"), label.with_name(f"curr{n[1]}_input")
        if volts.exists() and amps.exists():
            mv, ma = float(volts.read_text()), float(amps.read_text())
            rails[label.read_text().strip()] = mv * ma / 1e6
    for name_file in sorted(root.rglob("rail_name_*")):
        idx = name_file.name.rsplit("_", 1)[1]
        power = name_file.with_name(f"in_power{idx}_input")
        if power.exists():
            rails[name_file.read_text().strip()] = float(power.read_text()) / 1e3
    if not rails:
        raise FileNotFoundError(f"no INA3221 rails under {root}")
    return rails


@dataclass
class Ina3221Meter:
    root: str | Path = INA3221_ROOT
    rails: tuple[str, ...] | None = None
    name: str = "ina3221"

    def read_watts(self) -> float:
        return total_rails(read_ina3221(self.root), self.rails)


# ---------------------------------------------------------------------------------------------
# Intel RAPL powercap (cumulative energy counters)


RAPL_ROOT = "/sys/class/powercap"


def read_rapl(root: str | Path = RAPL_ROOT) -> dict[str, tuple[int, int]]:
    """(energy_uj, max_energy_range_uj) per top-level package domain, keyed 'name@dir'."""
    out = {}
    for d in sorted(Path(root).glob("intel-rapl:*")):
        if d.name.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package
            continue
        name = (d / "name").read_text().strip()
        out[f"{name}@{d.name}"] = (
            int((d / "energy_uj").read_text()),
            int((d / "max_energy_range_uj").read_text()),
        )
    if not out:
        raise FileNotFoundError(f"no RAPL domains under {root}")
    return out


def rapl_joules(before: dict, after: dict) -> float:
    """Energy between two ``read_rapl`` snapshots, handling counter wrap-around."""
    total = 0
    for key, (e0, wrap) in before.items():
        e1 = after[key][0]
        total += e1 - e0 if e1 >= e0 else e1 + wrap - e0
    return total / 1e6


@dataclass
class RaplMeter:
    """Average package power between successive reads (RAPL has no instantaneous power)."""

    root: str | Path = RAPL_ROOT
    clock: object = None
    name: str = "rapl"

    def __post_init__(self) -> None:
        import time

        self.clock = self.clock or time.monotonic
        self._last = (self.clock(), read_rapl(self.root))

    def read_watts(self) -> float:
        t1, snap = self.clock(), read_rapl(self.root)
        t0, prev = self._last
        self._last = (t1, snap)
        return rapl_joules(prev, snap) / (t1 - t0) if t1 > t0 else 0.0


# ---------------------------------------------------------------------------------------------
# NVIDIA: NVML (nvidia-ml-py, imported lazily) and nvidia-smi CSV logs


@dataclass
class NvmlMeter:
    index: int = 0
    name: str = "nvml"

    def _handle(self):
        try:
            import pynvml
        except ImportError as e:
            raise RuntimeError("NVML needs nvidia-ml-py: pip install nvidia-ml-py") from e
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.index)

    def read_watts(self) -> float:
        nv, h = self._handle()
        return nv.nvmlDeviceGetPowerUsage(h) / 1e3  # milliwatts

    def energy_joules(self) -> float:
        """Cumulative board energy since the driver loaded (Volta and newer)."""
        nv, h = self._handle()
        return nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3  # millijoules


def parse_nvidia_smi_csv(text: str) -> list[tuple[int, float]]:
    """(gpu index, watts) rows of ``nvidia-smi --query-gpu=index,power.draw --format=csv``
    (extra columns allowed; the header names them)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = [h.strip() for h in lines[0].split(",")]
    i_idx = head.index("index")
    i_pow = next(i for i, h in enumerate(head) if h.startswith("power.draw"))
    rows = []
    for ln in lines[1:]:
        cols = [c.strip() for c in ln.split(",")]
        value = cols[i_pow].split()[0]
        if value in ("[N/A]", "N/A"):
            continue
        rows.append((int(cols[i_idx]), float(value)))
    return rows


def detect_meters() -> list[PowerMeter]:
    """Meters that can be read on this machine (empty where there are none, as here)."""
    found: list[PowerMeter] = []
    if Path(INA3221_ROOT).exists():
        found.append(Ina3221Meter())
    try:
        read_rapl()
        found.append(RaplMeter())
    except (FileNotFoundError, PermissionError, OSError):
        pass
    try:
        NvmlMeter().read_watts()
        found.append(NvmlMeter())
    except Exception:  # no library, no driver or no GPU: NVML is simply absent
        pass
    return found


# ---------------------------------------------------------------------------------------------
# Energy over a window (what the runtime reads around each request)


@dataclass
class WindowMeter:
    """Joules a meter saw between ``start()`` and ``stop()``: counter differences where the
    meter has a cumulative counter (RAPL, NVML: exact), else the mean of the power read at
    both ends times the window (rails sampled twice: coarse, and said in ``how``)."""

    meter: PowerMeter

    @property
    def how(self) -> str:
        return "counter" if isinstance(self.meter, RaplMeter | NvmlMeter) else "two-point"

    def start(self) -> tuple:
        import time

        if isinstance(self.meter, RaplMeter):
            return time.monotonic(), read_rapl(self.meter.root)
        if isinstance(self.meter, NvmlMeter):
            return time.monotonic(), self.meter.energy_joules()
        return time.monotonic(), self.meter.read_watts()

    def stop(self, token: tuple) -> float:
        import time

        t0, first = token
        if isinstance(self.meter, RaplMeter):
            return rapl_joules(first, read_rapl(self.meter.root))
        if isinstance(self.meter, NvmlMeter):
            return self.meter.energy_joules() - first
        return (first + self.meter.read_watts()) / 2 * (time.monotonic() - t0)


def window_meter(name: str = "auto") -> WindowMeter | None:
    """The robot's meter for ``name`` ("auto": the first one readable here, "none": none;
    "rapl" / "nvml" / "ina3221": that one, or ValueError saying it cannot be read)."""
    if name == "none":
        return None
    found = {m.name: m for m in detect_meters()}
    if name == "auto":
        return WindowMeter(next(iter(found.values()))) if found else None
    if name not in found:
        have = ", ".join(found) or "none"
        raise ValueError(f"meter {name!r} cannot be read on this machine (readable: {have})")
    return WindowMeter(found[name])
