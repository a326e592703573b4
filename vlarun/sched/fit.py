"""Does it fit? The whole model per device, and the one-line reason when no placement fits.

For the robot and the edge: the weights of every stage (in the compute dtype, and with
weight-only int8 as ``transforms.int8`` would hold them) plus the KV cache, against the share of
the device's memory the planner may use (``plans.USABLE_MEMORY``; the rest is for the OS, the
CUDA context and activations). The bytes are ``plans.memory_parts``'s, the same the plan space
filters placements with. When no candidate of a plan space may run, ``no_plan_reason`` says
why in one line, naming the numbers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from vlarun.models.vla import VLAConfig
from vlarun.sched.catalog import Device
from vlarun.sched.cost import StageWork
from vlarun.sched.plans import (
    ROLES,
    USABLE_MEMORY,
    PlanSpace,
    int8_weights,
    memory_needed,
    memory_parts,
    usable_bytes,
)
from vlarun.sched.settings_table import IDENTITY

GB = 1e9


@dataclass(frozen=True)
class DeviceFit:
    """The whole model on one device: its weights (in the compute dtype, and with weight-only
    int8) and its KV cache against the device's usable memory. Invariant:
    ``int8_weight_bytes <= weight_bytes`` and ``usable_bytes <= mem_gb * 1e9``."""

    role: str
    device: str
    mem_gb: float
    usable_bytes: float
    dtype: str
    dtype_ok: bool
    weight_bytes: float
    int8_weight_bytes: float
    kv_bytes: float

    def __post_init__(self) -> None:
        if self.int8_weight_bytes > self.weight_bytes or self.usable_bytes > self.mem_gb * GB:
            raise ValueError(f"DeviceFit {self.device}: int8 above native or usable above total")

    @property
    def fits(self) -> bool:
        return self.dtype_ok and self.weight_bytes + self.kv_bytes <= self.usable_bytes

    @property
    def fits_int8(self) -> bool:
        return self.dtype_ok and self.int8_weight_bytes + self.kv_bytes <= self.usable_bytes

    @property
    def verdict(self) -> str:
        """One of "fits", "int8 only" (the dtype's weights do not fit, weight-only int8 ones
        do) or "no"."""
        return "fits" if self.fits else "int8 only" if self.fits_int8 else "no"

    def line(self) -> str:
        if not self.dtype_ok:
            return f"{self.role} {self.device}: does not support {self.dtype}"
        need, need8 = self.weight_bytes + self.kv_bytes, self.int8_weight_bytes + self.kv_bytes
        head = (
            f"{self.role} {self.device}: {self.usable_bytes / GB:.1f} of {self.mem_gb:g} GB usable;"
            f" whole model {need / GB:.1f} GB in {self.dtype} (weights "
            f"{self.weight_bytes / GB:.1f} + KV cache {self.kv_bytes / GB:.2f}),"
            f" {need8 / GB:.1f} GB with int8 weights"
        )
        tail = {"fits": "fits", "no": "does not fit, even with int8 weights"}.get(
            self.verdict, "fits only with weight-only int8 (setting int8)"
        )
        return f"{head}: {tail}"

    def as_dict(self) -> dict:
        return {
            "role": self.role,
            "device": self.device,
            "mem_gb": self.mem_gb,
            "usable_gb": self.usable_bytes / GB,
            "dtype": self.dtype,
            "weights_gb": self.weight_bytes / GB,
            "int8_weights_gb": self.int8_weight_bytes / GB,
            "kv_cache_gb": self.kv_bytes / GB,
            "verdict": self.verdict,
            "line": self.line(),
        }


def fit_report(
    cfg: VLAConfig, works: tuple[StageWork, ...], devices: dict[str, Device], dtype: str
) -> tuple[DeviceFit, ...]:
    """Whether the whole model (every stage of ``works``, unaccelerated) fits the robot and
    the edge, in ``dtype`` and with weight-only int8 (``int8_weights``)."""
    int8 = int8_weights(cfg)
    out = []
    for role in ROLES:
        roles = (role,) * len(works)
        w, kv = memory_parts(works, roles, dtype)[role]
        w8, _ = memory_parts(works, roles, dtype, int8)[role]
        d = devices[role]
        out.append(
            DeviceFit(role, d.id, d.mem_gb, usable_bytes(d), dtype, dtype in d.dtypes, w, w8, kv)
        )
    return tuple(out)


def _closest(works, devices, dtype, int8=None) -> tuple[float, tuple[str, ...], dict]:
    """The placement whose worst role overflows least: (that overflow in bytes, its roles, the
    bytes each role it uses needs); overflow <= 0 means it fits. Placements on a device
    without ``dtype`` are skipped (overflow inf when none is left)."""
    best: tuple[float, tuple[str, ...], dict] = (float("inf"), (), {})
    for edge in itertools.product((False, True), repeat=len(works)):
        roles = tuple(ROLES[int(e)] for e in edge)
        if any(dtype not in devices[r].dtypes for r in set(roles)):
            continue
        need = {r: b for r, b in memory_needed(works, roles, dtype, int8).items() if r in roles}
        over = max(b - usable_bytes(devices[r]) for r, b in need.items())
        if over < best[0]:
            best = (over, roles, need)
    return best


def _placed(works, roles, need, devices) -> str:
    """'vision@robot prefill@edge ..., needing robot orin-nano-8gb 1.57 of 6.80 GB, ...'."""
    where = " ".join(f"{w.name}@{r}" for w, r in zip(works, roles, strict=True))
    held = ", ".join(
        f"{r} {devices[r].id} {b / GB:.2f} of {usable_bytes(devices[r]) / GB:.2f} GB"
        for r, b in need.items()
    )
    return f"{where}, needing {held}"


def no_plan_reason(
    cfg: VLAConfig,
    space: PlanSpace,
    works: tuple[StageWork, ...],
    devices: dict[str, Device],
    dtype: str,
) -> str:
    """One line saying why no candidate of ``space`` may run, naming the numbers: the dtype, or
    the memory the closest placement of the unaccelerated model (``works``) needs; then which
    settings would fit but the accuracy floor leaves out, and whether weight-only int8 fits."""
    ident = [k for k, g in enumerate(space.settings) if all(v == IDENTITY[n] for n, v in g.knobs)]
    if ident and space.executable[ident[0]].any():  # it runs: the floor left every setting out
        return "no setting's measured accuracy cost clears the accuracy floor"
    if all(dtype not in d.dtypes for d in devices.values()):
        return f"neither {devices['robot'].id} nor {devices['edge'].id} supports {dtype}"
    over, roles, need = _closest(works, devices, dtype)
    line = (
        f"{cfg.name} fits no placement in {dtype} ({USABLE_MEMORY:.0%} of each device's memory "
        f"usable): the closest is {_placed(works, roles, need, devices)} "
        f"({over / GB:.2f} GB over)"
    )
    pruned = [g for k, g in enumerate(space.settings) if space.executable[k].any()]
    if pruned:
        least = max(pruned, key=lambda g: (g.value("layers_kept"), g.value("token_budget")))
        knobs = ", ".join(
            f"{n}={v:g}" if isinstance(v, float | int) else f"{n}={v}"
            for n, v in least.knobs
            if v != IDENTITY[n]
        )
        line += (
            f"; {len(pruned)} pruned settings fit (the least pruned: {knobs}), but the accuracy "
            "floor admits none (--unmeasured-settings or a lower --accuracy-floor does)"
        )
    over8, roles8, need8 = _closest(works, devices, dtype, int8_weights(cfg))
    if over8 <= 0:
        return (
            f"{line}; with weight-only int8 it fits as {_placed(works, roles8, need8, devices)}"
            " (setting int8: the plan space prices it, but its accuracy cost is unmeasured)"
        )
    return (
        f"{line}; weight-only int8 does not fit either: its closest is "
        f"{_placed(works, roles8, need8, devices)}"
    )
