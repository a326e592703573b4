"""Stage cost on a device: roofline time from the stage graph's FLOPs and bytes.

    t(v, d) = max(flops / (peak_d * compute_eff_d), bytes / (bw_d * memory_eff_d))
              + passes * layers * layer_overhead_d

The max is the roofline (a stage is either compute- or memory-bound: prefill is the first,
each decode step the second); the overhead term is kernel dispatch, which the roofline does not
see and which dominates small batch-1 stages on a slow host. A measured profile (``profile.py``)
overrides the estimate wherever it has the exact (device, model, stage, batch, tokens, dtype).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vlarun.models.vla import VLAConfig
from vlarun.sched.catalog import Device
from vlarun.stages.families import Workload, build_graph
from vlarun.stages.graph import StageGraph


@dataclass(frozen=True)
class StageWork:
    """What one stage costs, independent of where it runs. Invariant: ``flops > 0`` and
    ``bytes >= weight_bytes``; ``in_bytes`` is the packet a stage needs from its parents
    (or from the robot's sensors for the first stage), ``out_bytes`` the packet it emits."""

    name: str
    parents: tuple[str, ...]
    flops: float
    weight_bytes: float
    bytes: float
    passes: int
    layers: int  # transformer layers per pass, for the dispatch-overhead term
    params: int
    in_bytes: int
    out_bytes: int


def stage_layers(cfg: VLAConfig, stage: str) -> int:
    """Transformer layers one pass of ``stage`` runs (what kernel dispatch scales with)."""
    if stage == "vision":
        return sum(v.num_layers for v in cfg.vision) + 1  # + connector
    if stage in ("prefill", "decode", "prefill_head"):
        return cfg.llm.num_layers
    if stage == "denoise":
        head = cfg.dit or cfg.rdt
        return head.num_layers if head is not None else cfg.flow.expert.num_layers
    raise ValueError(f"unknown stage {stage!r}")


def works_from_graph(cfg: VLAConfig, graph: StageGraph) -> tuple[StageWork, ...]:
    """Stage works of a graph built from ``cfg`` (topological order kept)."""
    return tuple(
        StageWork(
            name=s.name,
            parents=s.parents,
            flops=float(s.cost.flops),
            weight_bytes=float(s.cost.weight_bytes),
            bytes=float(s.cost.bytes),
            passes=s.cost.passes,
            layers=stage_layers(cfg, s.name),
            params=s.params,
            in_bytes=s.in_bytes,
            out_bytes=s.out_bytes,
        )
        for s in graph.stages
    )


def stage_works(cfg: VLAConfig, w: Workload | None = None) -> tuple[StageWork, ...]:
    return works_from_graph(cfg, build_graph(cfg, w=w or Workload()))


def at_batch(work: StageWork, batch: int) -> StageWork:
    """The same stage over ``batch`` requests at once: FLOPs and activation traffic scale,
    weight traffic does not (the reason batching at the edge saves time and energy)."""
    weights = work.weight_bytes * work.passes
    acts = max(work.bytes - weights, 0.0)
    return replace(
        work,
        flops=work.flops * batch,
        bytes=weights + acts * batch,
        in_bytes=work.in_bytes * batch,
        out_bytes=work.out_bytes * batch,
    )


@dataclass(frozen=True)
class Roofline:
    """Time split of one stage on one device, in seconds."""

    compute_s: float  # at the achievable (efficiency-scaled) peak
    memory_s: float
    overhead_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def utilisation(self) -> float:
        """Share of the stage's time the device runs at its achievable roofline: 1 for a
        stage bound by compute or memory, less when dispatch overhead dominates."""
        return max(self.compute_s, self.memory_s) / self.seconds if self.seconds > 0 else 0.0


def roofline(work: StageWork, device: Device, dtype: str = "bfloat16") -> Roofline:
    compute = work.flops / (device.peak_flops(dtype) * device.compute_eff)
    memory = work.bytes / (device.mem_bytes_per_s * device.memory_eff)
    overhead = work.passes * work.layers * device.layer_overhead_ms * 1e-3
    return Roofline(compute, memory, overhead)


def stage_seconds(
    work: StageWork,
    device: Device,
    dtype: str = "bfloat16",
    profile=None,
    model: str = "",
    batch: int = 1,
    text_tokens: int = 24,
) -> tuple[float, str]:
    """Predicted seconds of ``work`` on ``device`` and where the figure came from
    ("measured" from a profile, else "roofline")."""
    if profile is not None:
        hit = profile.lookup(device.id, model, work.name, batch, text_tokens, dtype)
        if hit is not None:
            return hit, "measured"
    return roofline(work, device, dtype).seconds, "roofline"
