"""Building blocks every visual-token accelerator shares (scores, masks, budgets, the
full-recompute policy); the hooks contract itself (StepInputs, TokenPolicy, TokenDecoder) is
``vlarun.models.hooks``, re-exported here.

Everything here is written against the engine's public hooks (TokenPlan, DeferredPlan,
AttnProbe, KVCache); no model code is branched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlarun.models.hooks import (  # noqa: F401 (the contract, re-exported for accelerators)
    PlanLike,
    StepInputs,
    TokenDecoder,
    TokenPolicy,
)
from vlarun.models.llama import AttnProbe
from vlarun.models.token_plan import TokenAction, TokenPlan
from vlarun.models.vla import PrefillResult


def attention_scores(probs: Tensor) -> Tensor:
    """(B, H, Nq, Nk) probe probabilities -> (B, Nk): mean over heads, sum over queries."""
    return probs.float().mean(dim=1).sum(dim=1)


def plan_from_masks(
    vis_start: int, recompute: Tensor, reuse: Tensor, last_shared_layer: int
) -> TokenPlan:
    """Build a plan from boolean (B, Nv) masks; tokens in neither are pruned."""
    decisions = torch.full(recompute.shape, int(TokenAction.PRUNE), dtype=torch.int8)
    decisions[reuse.cpu()] = int(TokenAction.REUSE)
    decisions[recompute.cpu()] = int(TokenAction.RECOMPUTE)
    return TokenPlan(vis_start, decisions, last_shared_layer)


def top_mask(scores: Tensor, k: int, allowed: Tensor | None = None) -> Tensor:
    """(Nv,) bool: the ``k`` highest ``scores`` among ``allowed`` (ties by lower index)."""
    s = scores.float().clone()
    if allowed is not None:
        s[~allowed] = float("-inf")
        k = min(k, int(allowed.sum()))
    mask = torch.zeros(s.shape, dtype=torch.bool, device=s.device)
    if k > 0:
        order = torch.sort(s, descending=True, stable=True).indices  # stable: ties by index
        mask[order[:k]] = True
    return mask


def check_budget(budget: int | None, fraction: float, layer: int) -> None:
    """Validate a token method's budget knobs (a config's ``__post_init__`` calls this)."""
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"budget_fraction must be in (0, 1], got {fraction}")
    if layer < 0:
        raise ValueError(f"layer must be >= 0, got {layer}")


def equal_counts(keep: Tensor, priority: Tensor) -> Tensor:
    """(B, Nv) kept masks topped up, row by row, with each row's highest ``priority`` tokens
    until every row keeps as many as the fullest: a dense batch runs one plan shape."""
    most = int(keep.sum(dim=1).max())
    keep = keep.clone()
    for r in range(keep.shape[0]):
        left = most - int(keep[r].sum())
        if left:
            keep[r] |= top_mask(priority[r], left, ~keep[r])
    return keep


def resolve_budget(budget: int | None, fraction: float, num_visual: int) -> int:
    """Tokens recomputed per step: ``budget`` if given, else ``round(fraction * Nv)``, >= 1."""
    b = budget if budget is not None else int(fraction * num_visual + 0.5)
    return max(1, min(num_visual, b))


class FullRecompute:
    """Baseline ``full``: every visual token recomputed in every layer at every step."""

    name = "full"

    def reset(self) -> None:
        pass

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        return None, None

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        pass
