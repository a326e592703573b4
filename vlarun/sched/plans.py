"""The plan space: every placement of the stage DAG x every accelerator setting, filtered.

A placement maps each stage to the robot or the edge (2^|V| of them); a setting fixes the
accelerator knobs (TRIAGE/EfficientVLA token budget, layers kept, denoising cache interval,
weight-only int8). Choosing both together is the point: a pruned or int8 model may fit a robot
it did not fit before, or finish on the robot within the deadline without paying for the link.

Knob effects on cost are analytic (below). Their accuracy cost is NOT: it comes from
``settings.json``, where each setting carries its *measured* relative success, or null where
none was measured. A setting without a measurement is only eligible when no accuracy floor is
given, and every plan says whether its accuracy cost was measured.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from vlarun.models.vla import VLAConfig
from vlarun.sched.catalog import Device
from vlarun.sched.cost import StageWork
from vlarun.sched.settings_table import IDENTITY, KNOB_FAMILIES, SettingRow, load_settings
from vlarun.stages.families import DTYPE_BYTES, Workload, prefix_len

ROLES = ("robot", "edge")
# Share of a device's memory the weights and caches may take: the OS, the CUDA context and
# activations need the rest (on a Jetson the memory is also the system's).
USABLE_MEMORY = 0.85
# TRIAGE runs layers 0..2 on every visual token (their attention gives the drift and
# importance signals); the budget applies from layer 3 on.
SHALLOW_LAYERS = 3
# An accuracy floor that admits a setting only if it was measured and its interval reaches
# full compute (no loss the measurement can tell from zero). Not the default: an interval from
# few episodes reaches 1.0 for point estimates of -3 to -5%.
NO_LOSS = "no-loss"
# The default floor everywhere (plan, the robot agent, the fleet): a setting is admitted when
# the lower end of its measured relative-success 95% interval is >= 0.95.
DEFAULT_FLOOR = 0.95


@dataclass(frozen=True)
class Setting:
    """A combination of knob values. ``relative_success`` is the product of the knobs'
    measured values (an independence assumption), None when any knob is unmeasured."""

    knobs: tuple[tuple[str, float | str | None], ...]
    relative_success: float | None
    lower: float | None = None  # products of the knobs' bounds (None: unmeasured)
    upper: float | None = None

    @property
    def measured(self) -> bool:
        return self.relative_success is not None

    def as_dict(self) -> dict:
        return dict(self.knobs)

    def value(self, knob: str):
        return dict(self.knobs).get(knob, IDENTITY[knob])


def setting_grid(
    family: str, rows: tuple[SettingRow, ...], model: str | None = None
) -> tuple[list[Setting], list[str]]:
    """Every combination of the knobs that apply to ``family`` (rows measured on ``model`` or
    on any model); notes on what was left out."""
    notes, by_knob = [], {}
    for r in rows:
        if family not in KNOB_FAMILIES[r.knob]:
            continue
        if r.models is not None and model not in r.models:
            continue
        if not r.modelled:
            notes.append(
                f"{r.knob}={r.value} not in the plan space: its speed-up is "
                "data-dependent and has not been measured"
            )
            continue
        by_knob.setdefault(r.knob, []).append(r)
    grid = []
    for combo in itertools.product(*by_knob.values()):
        rel = [r.relative_success for r in combo]
        success = None if any(x is None for x in rel) else math.prod(rel)
        lo = hi = None
        if success is not None:
            lo = math.prod(r.bounds[0] for r in combo)
            hi = math.prod(r.bounds[1] for r in combo)
        grid.append(Setting(tuple((r.knob, r.value) for r in combo), success, lo, hi))
    return grid, notes


# ---------------------------------------------------------------------------------------------
# Knob effects on stage cost (analytic)


def apply_setting(works: tuple[StageWork, ...], cfg: VLAConfig, w: Workload, s: Setting):
    """The stage works under setting ``s``."""
    out = []
    # Weight-only int8: each pass streams int8 weights (+ scales) instead of the dtype's; the
    # matmuls still run in the dtype, so FLOPs stay. Per weight group: bytes saved per pass.
    elt = DTYPE_BYTES[w.dtype]
    saved = {g: n * elt - b for g, (n, b) in (int8_under(cfg, s) or {}).items()}
    budget, kept = s.value("token_budget"), s.value("layers_kept")
    interval = int(s.value("cache_interval"))
    layers = cfg.llm.num_layers
    for work in works:
        if work.name in ("prefill", "prefill_head") and budget < 1.0:
            full = prefix_len(cfg, w)
            tokens = full - cfg.num_visual * (1 - budget)
            deep = layers - SHALLOW_LAYERS
            f = (SHALLOW_LAYERS + deep * tokens / full) / layers
            work = replace(work, flops=work.flops * f)
        if work.name in ("prefill", "decode", "prefill_head") and kept < 1.0:
            n = max(1, round(layers * kept))
            f = n / layers
            work = replace(
                work,
                flops=work.flops * f,
                weight_bytes=work.weight_bytes * f,
                bytes=work.bytes * f,
                layers=n,
                params=int(work.params * f),
                # the KV cache packet (prefill -> decode) shrinks with the layers
                out_bytes=int(work.out_bytes * f) if work.name == "prefill" else work.out_bytes,
                in_bytes=int(work.in_bytes * f) if work.name == "decode" else work.in_bytes,
            )
        if work.name == "denoise" and interval > 1:
            steps = work.passes
            computed = math.ceil(steps / interval)
            f = computed / steps
            work = replace(work, flops=work.flops * f, bytes=work.bytes * f, passes=computed)
        cut = saved.get(_weight_group(work.name), 0)
        if cut:
            work = replace(
                work, weight_bytes=work.weight_bytes - cut, bytes=work.bytes - cut * work.passes
            )
        out.append(work)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Feasibility: memory and dtype


def _weight_group(stage: str) -> str:
    """Stages that share weights: prefill and decode both run the LLM."""
    return "llm" if stage in ("prefill", "decode", "prefill_head") else stage


# The int8 transform's modules by weight group (module-name prefix -> group of ``_weight_group``).
_INT8_GROUPS = {"language_model.": "llm", "action_expert.": "denoise", "action_model.": "denoise"}


@cache
def int8_weights(cfg: VLAConfig) -> dict[str, tuple[int, int]]:
    """Per weight group ("llm", "denoise"): (parameters that weight-only int8 stores in int8,
    the bytes they then take). Counted on the meta device over ``transforms.int8``'s own scope
    (the LM's and the action head's decoder layers; embeddings, LM head, vision stay float), so
    the planner's int8 bytes are what ``AccelSetting(weights="int8")`` would hold."""
    import torch

    from vlarun.models.vla import VLA
    from vlarun.transforms.int8 import int8_bytes, int8_candidates

    with torch.device("meta"):
        model = VLA(cfg)
    out: dict[str, tuple[int, int]] = {}
    for name, linear in int8_candidates(model).items():
        group = next(g for prefix, g in _INT8_GROUPS.items() if name.startswith(prefix))
        n, b = out.get(group, (0, 0))
        out[group] = (n + linear.weight.numel(), b + int8_bytes(linear))
    return out


def int8_under(cfg: VLAConfig, s: Setting) -> dict[str, tuple[int, int]] | None:
    """``int8_weights`` of the model setting ``s`` runs (None: its weights stay in the dtype):
    with layers pruned, the LM's int8 share shrinks with its layers, as its float share does."""
    if s.value("weights") != "int8":
        return None
    out = dict(int8_weights(cfg))
    kept = s.value("layers_kept")
    if "llm" in out and kept < 1.0:
        f = max(1, round(cfg.llm.num_layers * kept)) / cfg.llm.num_layers
        out["llm"] = (int(out["llm"][0] * f), int(out["llm"][1] * f))
    return out


def memory_parts(
    works: tuple[StageWork, ...],
    roles: tuple[str, ...],
    dtype: str,
    int8: dict[str, tuple[int, int]] | None = None,
) -> dict[str, tuple[float, float]]:
    """(weight bytes, KV-cache bytes) each role must hold: the weights of every stage group
    placed there (once per group) and the KV cache where the stage that makes it or a stage that
    reads it runs. ``int8`` (from ``int8_weights``): those parameters are held in int8."""
    weights: dict[tuple[str, str], float] = {}
    for work, role in zip(works, roles, strict=True):
        group = _weight_group(work.name)
        # int8 is priced for the whole model (the identity setting, as ``fit_report`` asks).
        q_params, q_bytes = (int8 or {}).get(group, (0, 0))
        nbytes = (work.params - q_params) * DTYPE_BYTES[dtype] + q_bytes
        weights[(role, group)] = max(weights.get((role, group), 0.0), nbytes)
    parts = {role: [0.0, 0.0] for role in ROLES}
    for (role, _), nbytes in weights.items():
        parts[role][0] += nbytes
    kv = next((x.out_bytes for x in works if x.name == "prefill"), 0)
    holders = {
        role
        for work, role in zip(works, roles, strict=True)
        if work.name == "prefill" or (kv and work.in_bytes >= kv)
    }
    for role in holders:
        parts[role][1] += kv
    return {role: (w, k) for role, (w, k) in parts.items()}


def memory_needed(
    works: tuple[StageWork, ...],
    roles: tuple[str, ...],
    dtype: str,
    int8: dict[str, tuple[int, int]] | None = None,
) -> dict[str, float]:
    """Bytes each role must hold (``memory_parts``: weights + KV cache). Activations, the CUDA
    context and the OS live in the share of memory ``USABLE_MEMORY`` leaves free."""
    return {role: w + kv for role, (w, kv) in memory_parts(works, roles, dtype, int8).items()}


def usable_bytes(device: Device) -> float:
    return device.mem_gb * 1e9 * USABLE_MEMORY


def feasibility(
    works: tuple[StageWork, ...],
    roles: tuple[str, ...],
    devices: dict[str, Device],
    dtype: str,
    int8: dict[str, tuple[int, int]] | None = None,
) -> str | None:
    """None if the placement is executable, else the reason it is not (``int8``: as in
    ``memory_parts``, the parameters held in int8)."""
    for role in set(roles):
        if dtype not in devices[role].dtypes:
            return f"{devices[role].id} does not support {dtype}"
    for role, nbytes in memory_needed(works, roles, dtype, int8).items():
        cap = usable_bytes(devices[role])
        if nbytes > cap:
            return f"{devices[role].id} memory: needs {nbytes / 1e9:.1f} GB of {cap / 1e9:.1f} GB"
    return None


# ---------------------------------------------------------------------------------------------
# The space


@dataclass(frozen=True)
class PlanSpace:
    """Candidate plans = settings x placements.

    Invariant: ``works[k]`` are the stage works under ``settings[k]``; ``placements[p, s]`` is
    True where stage s runs on the edge; ``executable[k, p]`` is the memory/dtype filter;
    ``eligible[k]`` the accuracy filter.
    """

    model: str
    family: str
    actions: int
    stages: tuple[str, ...]
    parents: tuple[tuple[int, ...], ...]
    settings: tuple[Setting, ...]
    works: tuple[tuple[StageWork, ...], ...]
    placements: np.ndarray
    executable: np.ndarray
    eligible: np.ndarray
    notes: tuple[str, ...]

    @property
    def size(self) -> int:
        """All candidates the scheduler scores."""
        return len(self.settings) * len(self.placements)

    def roles(self, p: int) -> tuple[str, ...]:
        return tuple(ROLES[int(e)] for e in self.placements[p])


def build_space(
    cfg: VLAConfig,
    base_works: tuple[StageWork, ...],
    devices: dict[str, Device],
    w: Workload,
    accuracy_floor: float | str | None = None,
    settings_rows: tuple[SettingRow, ...] | None = None,
    accelerators: bool = True,
) -> PlanSpace:
    """Enumerate and filter the plan space of ``cfg`` between ``devices['robot']`` and
    ``devices['edge']``. ``accelerators=False`` keeps only the identity setting.

    ``accuracy_floor``: None admits every setting (unmeasured ones with a note); a number F
    admits a measured setting whose relative success has a 95% lower bound >= F; ``NO_LOSS``
    admits a measured setting whose interval reaches 1.0 (no loss the measurement can tell)."""
    rows = settings_rows if settings_rows is not None else load_settings()
    grid, notes = setting_grid(cfg.family, rows, cfg.name)
    if not accelerators:
        grid = [g for g in grid if all(v == IDENTITY[k] for k, v in g.knobs)]
    names = tuple(x.name for x in base_works)
    parents = tuple(tuple(names.index(p) for p in x.parents) for x in base_works)
    placements = np.array(list(itertools.product((False, True), repeat=len(names))), dtype=bool)
    works = tuple(apply_setting(base_works, cfg, w, g) for g in grid)
    executable = np.zeros((len(grid), len(placements)), dtype=bool)
    for k, ws in enumerate(works):
        int8 = int8_under(cfg, grid[k])
        for p, edge in enumerate(placements):
            roles = tuple(ROLES[int(e)] for e in edge)
            executable[k, p] = feasibility(ws, roles, devices, w.dtype, int8) is None
    if accuracy_floor is None:
        eligible = np.ones(len(grid), dtype=bool)
        unmeasured = sum(not g.measured for g in grid)
        if unmeasured:
            notes.append(
                f"{unmeasured} of {len(grid)} settings have no measured accuracy cost; "
                "they are eligible only because no accuracy floor was given"
            )
    elif accuracy_floor == NO_LOSS:
        eligible = np.array([g.measured and g.upper >= 1.0 for g in grid])
        notes.append(
            f"no measurable loss: {int(eligible.sum())} of {len(grid)} settings have a measured "
            "success whose 95% interval reaches the full policy's (unmeasured ones are left out)"
        )
    else:
        eligible = np.array([g.measured and g.lower >= accuracy_floor for g in grid])
        notes.append(
            f"accuracy floor {accuracy_floor}: {int(eligible.sum())} of {len(grid)} "
            "settings have a measured relative success whose 95% lower bound clears it"
        )
    return PlanSpace(
        cfg.name,
        cfg.family,
        cfg.horizon,
        names,
        parents,
        tuple(grid),
        works,
        placements,
        executable,
        eligible,
        tuple(notes),
    )
