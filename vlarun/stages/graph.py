"""The stage DAG: what one inference is made of, and how to run it stage by stage.

A ``Stage`` is serialisable (its inputs and outputs are named tensors), relocatable (its weights
can live on either side) and independently executable (no hidden state shared with other
stages): the three properties EcoVLA's scheduler needs to cut the graph anywhere. Tensors flow by
name: a stage reads its inputs from the graph inputs and from its parents' outputs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vlarun.models.device import settle
from vlarun.stages import wire
from vlarun.stages.packet import DTYPES, Packet

DEVICES_ANY = ("robot", "edge")


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a packet schema: concrete shape and wire dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1].itemsize


@dataclass(frozen=True)
class StageCost:
    """Analytic cost of one stage execution.

    flops: floating-point operations (2 per multiply-add);
    weight_bytes: parameter bytes the stage reads (once per pass over the weights);
    bytes: total memory traffic estimate (weights times passes, plus activations/caches);
    passes: sequential passes over the weights (1 for prefill, n for n decode steps) - what
        makes decoding memory-bound.
    """

    flops: int
    weight_bytes: int
    bytes: int
    passes: int = 1


class NonFiniteActions(ValueError):
    """A policy computed NaN or infinite actions (from bad input or diverged weights)."""


@dataclass(frozen=True)
class Stage:
    """A node of the inference DAG. ``fn`` maps an input packet to an output packet."""

    name: str
    fn: Callable[[Packet], Packet]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    cost: StageCost
    parents: tuple[str, ...] = ()
    devices: tuple[str, ...] = DEVICES_ANY
    params: int = 0

    def __call__(self, packet: Packet) -> Packet:
        """Run the stage; a stage that produces actions never returns a non-finite one (a
        NaN action would move a robot): ``NonFiniteActions`` instead, naming the stage."""
        out = self.fn(packet)
        actions = out.tensors.get("actions")
        if actions is not None and not bool(torch.isfinite(actions).all()):
            raise NonFiniteActions(
                f"stage {self.name!r} produced non-finite actions; refusing to return them"
            )
        return out

    @property
    def in_bytes(self) -> int:
        return sum(s.nbytes for s in self.inputs)

    @property
    def out_bytes(self) -> int:
        return sum(s.nbytes for s in self.outputs)


@dataclass
class StageTiming:
    name: str
    seconds: float
    in_bytes: int
    out_bytes: int


@dataclass
class GraphRun:
    """Outputs of a graph run (all tensors produced, by name) and per-stage timings."""

    outputs: dict
    timings: list[StageTiming] = field(default_factory=list)


@dataclass(frozen=True)
class StageGraph:
    """Stages in topological order. Invariant: every parent precedes its child, and every
    input a stage needs is a graph input or an output of one of its ancestors."""

    model_name: str
    family: str
    stages: tuple[Stage, ...]
    graph_inputs: tuple[TensorSpec, ...]

    def __post_init__(self) -> None:
        available = {s.name for s in self.graph_inputs}
        seen: set[str] = set()
        for st in self.stages:
            if not set(st.parents) <= seen:
                raise ValueError(f"stage {st.name!r} comes before its parents {st.parents}")
            missing = [s.name for s in st.inputs if s.name not in available]
            if missing:
                raise ValueError(f"stage {st.name!r} needs {missing}, produced by no earlier stage")
            available |= {s.name for s in st.outputs}
            seen.add(st.name)

    def stage(self, name: str) -> Stage:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(f"no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def run(self, inputs: Packet, *, serialize: bool = True, clock=time.perf_counter) -> GraphRun:
        """Execute stage by stage. With ``serialize``, every stage's input packet is encoded to
        wire frames and decoded again by the runtime's one codec (``stages.wire``), exactly
        what crossing the network does."""
        pool = dict(inputs.tensors)
        timings = []
        for st in self.stages:
            packet = Packet({s.name: pool[s.name] for s in st.inputs})
            if serialize:
                frames = wire.encode(wire.Message("data", rid=0, stage=st.name, packet=packet))
                packet = wire.decode(frames).packet
            start = clock()
            out = st(packet)
            settle(out.tensors)  # a GPU stage is timed to its end, not its launch
            timings.append(StageTiming(st.name, clock() - start, packet.nbytes, out.nbytes))
            pool.update(out.tensors)
        return GraphRun(pool, timings)

    def total_flops(self) -> int:
        return sum(s.cost.flops for s in self.stages)
