"""SpecPrune-VLA's action-level static pruning (Wang et al., 2025; a baseline of TRIAGE's Table I,
which reimplemented the static stage only, as this does).

Consecutive frames are alike, so most of what changed since the last query is where the robot
and the objects moved, and what the instruction looks at is what the task needs:

  dynamic   tokens whose raw pixel patch changed since the previous query (patch cosine
            similarity below ``similarity``; VLA-Cache's measure, ``patch_similarity``) are
            always kept;
  local     in each camera view, the ``local_share`` of its tokens the instruction attends to
            most at ``layer`` are always kept;
  static    the other patches are pruning candidates: in each view, at most its share of
            Nv - B, the most similar first (the authors' cap of 200 static patches per 256-token
            view); a local token among them is kept after all.

So at least B tokens are recomputed after ``layer`` (each view keeps at least its share of B)
and more when the scene moves: the budget is a floor, not a cap (the FLOPs ratio of a run says
what was spent). Nothing is reused.

What differs from the authors' code (github.com/alexwhz-sjtu/SpecPrune-VLA, read 2026-12-05),
and why: their local set is chosen in two rounds (layers 0 and 1: top 3K, then top K per view,
K = 10 of 256 primary and 7 of 256 wrist tokens) and the prune happens there; here one round at
the table's shared ``layer`` (2), with K as a share of each view's tokens (4%: 10 / 256), so
every token method of the table prunes after the same layer. They compare with the frame
``prev_T`` environment steps back (3 to 6, by hand speed); here the previous query's frame
(a chunk's worth of steps back). Their "global" set from the previous action's attention is
disabled in the released code and absent here, as are the layer-level dynamic pruning and the
velocity-aware controller (TRIAGE's reimplementation also keeps the static stage only). The
first query of an episode has no previous frame and runs in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlarun.accel.base import (
    PlanLike,
    StepInputs,
    attention_scores,
    check_budget,
    equal_counts,
    plan_from_masks,
    resolve_budget,
    top_mask,
)
from vlarun.accel.baselines import patch_similarity
from vlarun.models.llama import AttnProbe
from vlarun.models.token_plan import DeferredPlan, ProbeResult, TokenPlan
from vlarun.models.vla import PrefillResult


@dataclass(frozen=True)
class SpecPruneConfig:
    """budget / budget_fraction: the least visual tokens kept (at most Nv - B pruned);
    similarity: patch cosine at or above which a patch is static (the authors' 0.986);
    local_share: each view's share of tokens kept for the instruction's attention;
    layer: where that attention is read, and after which tokens are pruned."""

    budget: int | None = None
    budget_fraction: float = 0.34
    similarity: float = 0.986
    local_share: float = 0.04
    layer: int = 2

    def __post_init__(self) -> None:
        check_budget(self.budget, self.budget_fraction, self.layer)
        if not -1.0 <= self.similarity <= 1.0:
            raise ValueError(f"similarity must be in [-1, 1], got {self.similarity}")
        if not 0.0 <= self.local_share <= 1.0:
            raise ValueError(f"local_share must be in [0, 1], got {self.local_share}")


def static_prune_mask(
    similarity: Tensor,
    relevance: Tensor,
    view_tokens: tuple[int, ...],
    local_share: float,
    threshold: float,
    budget: int,
) -> Tensor:
    """(Nv,) patch similarity and instruction attention -> (Nv,) bool: the tokens kept.

    Per view of n tokens (of Nv): the static patches (similarity >= ``threshold``), at most
    n - round(``budget`` * n / Nv) of them, the most similar first, are the pruning candidates;
    the view's top ``local_share`` by attention are kept even among them; all else is kept."""
    nv = similarity.numel()
    if sum(view_tokens) != nv:
        raise ValueError(f"views hold {sum(view_tokens)} tokens, the step has {nv}")
    keep = torch.ones(nv, dtype=torch.bool, device=similarity.device)
    start = 0
    for count in view_tokens:
        view = slice(start, start + count)
        k = max(1, int(local_share * count + 0.5)) if local_share > 0 else 0
        local = top_mask(relevance[view], k)
        floor = max(1, int(budget * count / nv + 0.5))
        static = top_mask(similarity[view], count - floor, similarity[view] >= threshold)
        keep[view] = ~(static & ~local)
        start += count
    return keep


class SpecPrune:
    """Stateful: compares each frame with the previous query's; prunes only."""

    name = "specprune"

    def __init__(self, cfg: SpecPruneConfig | None = None) -> None:
        self.cfg = cfg or SpecPruneConfig()
        self.previous: Tensor | None = None
        self.last_plan: TokenPlan | None = None
        self.last_signals: dict[str, Tensor] = {}

    def reset(self) -> None:
        self.previous, self.last_plan, self.last_signals = None, None, {}

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        if self.previous is None:
            self.last_plan = None
            return None, None  # first query: nothing to compare with, full compute
        views = step.tokens_of_views()
        sim = patch_similarity(step.images, self.previous, views)  # (B, Nv)

        def decide(probe: ProbeResult | None) -> TokenPlan:
            return self._decide(step, sim, attention_scores(probe.probs), views)

        return DeferredPlan(self.cfg.layer, decide), step.probe(
            self.cfg.layer, step.text_query_index()
        )

    def _decide(
        self, step: StepInputs, sim: Tensor, relevance: Tensor, views: tuple[int, ...]
    ) -> TokenPlan:
        c = self.cfg
        budget = resolve_budget(c.budget, c.budget_fraction, step.num_visual)
        keep = torch.stack(
            [
                static_prune_mask(s, r, views, c.local_share, c.similarity, budget)
                for s, r in zip(sim, relevance, strict=True)
            ]
        )
        keep = equal_counts(keep, 1.0 - sim)  # rows topped up with their most changed tokens
        self.last_signals = {"similarity": sim, "relevance": relevance}
        self.last_plan = plan_from_masks(step.vis_start, keep, torch.zeros_like(keep), c.layer)
        return self.last_plan

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        self.previous = step.images.clone()
