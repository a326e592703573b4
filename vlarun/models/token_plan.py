"""TokenPlan: the one contract every visual-token accelerator speaks.

Each control step a token policy (full recompute, FastV, VLA-Cache, TRIAGE, ...) returns a plan
that says, for every visual token, whether the language model recomputes it, reuses its cached
K/V from an earlier step, or prunes it. The decoder executes the plan; no policy ever reaches
into model code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch
from torch import Tensor


@dataclass
class ProbeResult:
    """What an attention probe saw at one layer (the LM fills it, token policies read it).

    probs (B, H, Nq, Nk): head-wise attention of the probe queries over the key range,
    normalised over *all* visible keys; values (B, KVH, Nk, hd): those keys' value vectors."""

    probs: Tensor
    values: Tensor


class TokenAction(IntEnum):
    """What happens to one visual token in layers after the shared shallow ones."""

    RECOMPUTE = 0
    REUSE = 1
    PRUNE = 2


@dataclass(frozen=True)
class TokenPlan:
    """Per-visual-token decisions for one forward over a prefix.

    Invariants:
      * ``decisions`` is an integer tensor of shape (B, Nv) holding ``TokenAction`` values for the
        visual tokens at sequence indices ``vis_start .. vis_start + Nv - 1``;
      * every row recomputes the same number of tokens (rows are gathered into one dense batch);
      * layers ``0 .. last_shared_layer`` run on all tokens, whatever the decision, so shallow
        statistics (attention drift, importance) are always fresh;
      * reused tokens must already have cached K/V in every deeper layer.
    """

    vis_start: int
    decisions: Tensor  # (B, Nv) int
    last_shared_layer: int = 2

    def __post_init__(self) -> None:
        if self.decisions.ndim != 2:
            raise ValueError(
                f"TokenPlan.decisions must be (B, Nv), got {tuple(self.decisions.shape)}"
            )
        if self.vis_start < 0 or self.last_shared_layer < 0:
            raise ValueError("TokenPlan.vis_start and last_shared_layer must be >= 0")
        recomputed = (self.decisions == TokenAction.RECOMPUTE).sum(dim=1)
        if bool((recomputed != recomputed[0]).any()):
            raise ValueError(
                f"TokenPlan rows recompute different token counts {recomputed.tolist()}; "
                "every row must recompute the same number"
            )

    @property
    def num_visual(self) -> int:
        return int(self.decisions.shape[1])

    @classmethod
    def full(
        cls, batch: int, vis_start: int, num_visual: int, last_shared_layer: int = 2
    ) -> TokenPlan:
        """The plan that recomputes every token: must reproduce the plain forward."""
        decisions = torch.full((batch, num_visual), int(TokenAction.RECOMPUTE), dtype=torch.int8)
        return cls(vis_start, decisions, last_shared_layer)

    def deep_keep_mask(self, seq_len: int) -> Tensor:
        """(B, T) bool: which tokens of a T-token call run in the deep layers."""
        batch = self.decisions.shape[0]
        keep = torch.ones(batch, seq_len, dtype=torch.bool)
        vis = slice(self.vis_start, self.vis_start + self.num_visual)
        keep[:, vis] = self.decisions == TokenAction.RECOMPUTE
        return keep

    def flops_fraction(self) -> float:
        """Fraction of visual tokens recomputed in the deep layers (a FLOP proxy)."""
        return float((self.decisions == TokenAction.RECOMPUTE).float().mean())


@dataclass(frozen=True)
class DeferredPlan:
    """A TokenPlan decided inside the forward, once the shared shallow layers have run.

    Policies such as TRIAGE, FastV or VLA-Cache decide from shallow-layer attention of the very
    step they plan for; computing that attention in a separate pass would run the shallow layers
    twice. The decoder runs layers ``0 .. last_shared_layer`` on all tokens, calls ``decide``
    once with that call's ``ProbeResult`` (None without a probe), and executes the returned plan
    in the deeper layers. Invariant: the returned plan has the same ``last_shared_layer``.
    """

    last_shared_layer: int
    decide: Callable[[ProbeResult | None], TokenPlan]

    def resolve(self, probe: ProbeResult | None) -> TokenPlan:
        plan = self.decide(probe)
        if not isinstance(plan, TokenPlan) or plan.last_shared_layer != self.last_shared_layer:
            raise ValueError(
                "DeferredPlan.decide must return a TokenPlan with last_shared_layer "
                f"{self.last_shared_layer}"
            )
        return plan
