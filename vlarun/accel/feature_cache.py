"""EfficientVLA's diffusion feature cache: recompute attention/MLP outputs every N steps.

Adjacent denoising steps produce nearly identical attention and MLP outputs (SEEDS.md
section 2), so each branch is computed at steps 0, N, 2N, ... and the stored output is reused in
between (N = 5 of 10 steps: 2 computed). It plugs into the ``DenoiseFeatureCache`` hook of
``DiTHead.sample`` and of ``FlowMatchingExpert.sample`` (pi0-style action expert); interval 1
computes every branch, exactly like no cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class EveryNStepsCache:
    """A ``DenoiseFeatureCache`` that refreshes every ``interval`` steps; one per sampling run.

    ``computed`` / ``reused`` count branch evaluations (what the speedup comes from)."""

    interval: int = 5
    store: dict[tuple[int, str], Tensor] = field(default_factory=dict)
    computed: int = 0
    reused: int = 0

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"feature cache interval must be >= 1, got {self.interval}")

    def __call__(self, step: int, layer: int, kind: str, compute: Callable[[], Tensor]) -> Tensor:
        key = (layer, kind)
        if step % self.interval == 0 or key not in self.store:
            self.store[key] = compute()
            self.computed += 1
        else:
            self.reused += 1
        return self.store[key]


def every_n_steps(interval: int = 5) -> Callable[[], EveryNStepsCache]:
    """A factory for ``Policy.with_hooks(denoise_cache=...)``: a fresh cache per inference."""
    EveryNStepsCache(interval)  # validate now, not at the first inference

    def make() -> EveryNStepsCache:
        return EveryNStepsCache(interval)

    return make
