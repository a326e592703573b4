"""The token-method baselines TRIAGE and EfficientVLA are measured against, as token policies.

  fastv         FastV: after layer k, keep the B visual tokens that receive the most attention
                (mean over heads, summed over the instruction queries) and prune the rest.
  vla-cache     VLA-Cache: tokens whose image patch barely changed since the previous frame are
                static and reuse their cached K/V, unless the instruction attends to them
                strongly (task-relevant tokens are always recomputed); the recomputed set is
                capped at B (most-changed first) and everything else is reused: reuse-only.
  efficientvla  EfficientVLA task-aware selection (SEEDS.md section 2): relevance = instruction
                attention at layer k, min-max normalised; keep the top K_key, then
                floor(alpha * K_aug) more by relevance and the rest by diversity from the key
                tokens (1 - max cosine similarity of projector outputs); prune the others.
  (full, drop-all and keep-all live in base.py and triage.py.)

All decide inside the prefill from the shared layers' attention (``DeferredPlan``), so none of
them runs an extra pass. Drop-in replacements of each other: ``begin`` / ``end`` / ``reset``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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
from vlarun.models.llama import AttnProbe, ProbeResult
from vlarun.models.token_plan import DeferredPlan, TokenPlan
from vlarun.models.vla import PrefillResult

# ---------------------------------------------------------------------------------------------
# FastV


@dataclass(frozen=True)
class FastVConfig:
    """FastV: prune by shallow-layer attention after layer ``layer``."""

    budget: int | None = None  # visual tokens kept (overrides budget_fraction)
    budget_fraction: float = 0.34
    layer: int = 2  # FastV's K: tokens are ranked at, and pruned after, this layer

    def __post_init__(self) -> None:
        check_budget(self.budget, self.budget_fraction, self.layer)


class FastV:
    """Stateless: every step ranks the current tokens afresh; nothing is reused."""

    name = "fastv"

    def __init__(self, cfg: FastVConfig | None = None) -> None:
        self.cfg = cfg or FastVConfig()
        self.last_plan: TokenPlan | None = None

    def reset(self) -> None:
        self.last_plan = None

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        def decide(probe: ProbeResult | None) -> TokenPlan:
            scores = attention_scores(probe.probs)  # (B, Nv)
            self.last_plan = fastv_plan(step, scores, self.cfg)
            return self.last_plan

        # Queries: the instruction tokens. FastV averages over all queries; the visual ones carry
        # a causal bias (earlier tokens are seen by more queries), so they are left out.
        return DeferredPlan(self.cfg.layer, decide), step.probe(
            self.cfg.layer, step.text_query_index()
        )

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        pass


def fastv_plan(step: StepInputs, scores: Tensor, cfg: FastVConfig) -> TokenPlan:
    """Keep the top-B tokens by ``scores`` (B, Nv), prune the rest."""
    budget = resolve_budget(cfg.budget, cfg.budget_fraction, step.num_visual)
    keep = torch.stack([top_mask(row, budget) for row in scores])
    return plan_from_masks(step.vis_start, keep, torch.zeros_like(keep), cfg.layer)


# ---------------------------------------------------------------------------------------------
# VLA-Cache


@dataclass(frozen=True)
class VLACacheConfig:
    """VLA-Cache: reuse static tokens, recompute changed and task-relevant ones."""

    budget: int | None = None  # cap on recomputed tokens (None with fraction 1.0: no cap)
    budget_fraction: float = 0.34
    similarity: float = 0.99  # patch cosine similarity above which a token is static
    relevant_fraction: float = 0.1  # top share of tokens by attention never reused
    layer: int = 2

    def __post_init__(self) -> None:
        check_budget(self.budget, self.budget_fraction, self.layer)
        if not -1.0 <= self.similarity <= 1.0:
            raise ValueError(f"similarity must be in [-1, 1], got {self.similarity}")
        if not 0.0 <= self.relevant_fraction <= 1.0:
            raise ValueError(f"relevant_fraction must be in [0, 1], got {self.relevant_fraction}")


def patch_similarity(
    images: Tensor, previous: Tensor, tokens_per_image: int | tuple[int, ...]
) -> Tensor:
    """(B, n_img, 3, H, W) now and before -> (B, sum of tokens) cosine similarity of the pixel
    patches each visual token covers (VLA-Cache compares raw patches, not features).
    ``tokens_per_image``: one count for every view, or each view's (a pooled view's tokens
    cover larger patches)."""
    b, n, c, h, w = images.shape
    counts = (tokens_per_image,) * n if isinstance(tokens_per_image, int) else tokens_per_image
    if len(counts) != n:
        raise ValueError(f"{len(counts)} token counts for {n} views")
    sims = []
    for v, tokens in enumerate(counts):
        side = math.isqrt(tokens)
        if side * side != tokens or h % side:
            raise ValueError(f"view {v}: {tokens} tokens are not a square grid over {h} px")
        p = h // side

        def patches(x: Tensor, p: int = p) -> Tensor:  # (B, 3, H, W) -> (B, tokens, 3*p*p)
            return F.unfold(x.float(), kernel_size=p, stride=p).transpose(1, 2)

        now, before = patches(images[:, v]), patches(previous[:, v])
        sims.append(F.cosine_similarity(now, before, dim=-1, eps=1e-6))
    return torch.cat(sims, dim=1)


def vla_cache_masks(
    similarity: Tensor, relevance: Tensor, cfg: VLACacheConfig, budget: int
) -> tuple[Tensor, Tensor]:
    """(Nv,) patch similarity and attention -> (recompute, reuse) bool masks.

    Static = similarity above threshold; the ``relevant_fraction`` most attended tokens are
    never reused. The rest of the tokens are recomputed, at most ``budget`` of them (most
    changed first); every token not recomputed is reused."""
    nv = similarity.numel()
    relevant = top_mask(relevance, int(cfg.relevant_fraction * nv + 0.5))
    wants = ~(similarity > cfg.similarity) | relevant
    # Task-relevant tokens first, then the most changed (lowest similarity).
    priority = relevant.float() * 4.0 + (1.0 - similarity.float())
    recompute = top_mask(priority, budget, wants)
    return recompute, ~recompute


class VLACache:
    """Stateful: compares each frame with the previous one; reuses from the cache it keeps."""

    name = "vla-cache"

    def __init__(self, cfg: VLACacheConfig | None = None) -> None:
        self.cfg = cfg or VLACacheConfig()
        self.previous: Tensor | None = None
        self.last_plan: TokenPlan | None = None

    def reset(self) -> None:
        self.previous, self.last_plan = None, None

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        if self.previous is None:
            self.last_plan = None
            return None, None  # first frame: nothing to reuse, full recompute
        sim = patch_similarity(step.images, self.previous, step.tokens_of_views())  # (B, Nv)

        def decide(probe: ProbeResult | None) -> TokenPlan:
            relevance = attention_scores(probe.probs)
            self.last_plan = self._plan(step, sim, relevance)
            return self.last_plan

        return DeferredPlan(self.cfg.layer, decide), step.probe(
            self.cfg.layer, step.text_query_index()
        )

    def _plan(self, step: StepInputs, sim: Tensor, relevance: Tensor) -> TokenPlan:
        budget = resolve_budget(self.cfg.budget, self.cfg.budget_fraction, step.num_visual)
        rows = zip(sim, relevance, strict=True)
        masks = [vla_cache_masks(s, r, self.cfg, budget) for s, r in rows]
        # A dense batch needs equal recompute counts: rows topped up with their most changed.
        recompute = equal_counts(torch.stack([m[0] for m in masks]), 1.0 - sim)
        return plan_from_masks(step.vis_start, recompute, ~recompute, self.cfg.layer)

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        self.previous = step.images.clone()


# ---------------------------------------------------------------------------------------------
# EfficientVLA task-aware token selection


@dataclass(frozen=True)
class EfficientVLATokensConfig:
    """EfficientVLA's visual token selection: K_final = budget tokens kept."""

    budget: int | None = None  # K_final (paper: 56 of 256)
    budget_fraction: float = 0.22  # 56 / 256
    k_key: int = 4  # K_key, kept unconditionally (paper: 4-8)
    alpha: float = 0.5  # share of K_aug chosen by relevance; the rest by diversity
    layer: int = 2  # attention of the instruction at this layer; pruned after it

    def __post_init__(self) -> None:
        check_budget(self.budget, self.budget_fraction, self.layer)
        if self.k_key < 0 or not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"need k_key >= 0 and alpha in [0, 1], got {self.k_key}, {self.alpha}")


def task_aware_selection(
    relevance: Tensor, features: Tensor, k_final: int, k_key: int, alpha: float
) -> Tensor:
    """(Nv,) relevance and (Nv, d) token features -> (Nv,) bool kept set.

    s = min-max normalised relevance; V_key = top k_key by s; then floor(alpha * K_aug) more by
    s; then the K_aug - K_task tokens most different from V_key (1 - max cosine similarity)."""
    nv = relevance.numel()
    k_final = min(k_final, nv)
    lo, hi = relevance.min(), relevance.max()
    s = (relevance - lo) / (hi - lo).clamp_min(1e-12)
    key = top_mask(s, min(k_key, k_final))
    k_aug = k_final - int(key.sum())
    k_task = math.floor(alpha * k_aug)
    task = top_mask(s, k_task, ~key)
    chosen = key | task
    if key.any():
        unit = F.normalize(features.float(), dim=-1)
        diversity = 1.0 - (unit @ unit[key].T).max(dim=1).values
    else:
        diversity = s.clone()  # no key tokens to differ from: fall back to relevance
    chosen |= top_mask(diversity, k_final - int(chosen.sum()), ~chosen)
    return chosen


class EfficientVLATokens:
    """Stateless task-aware selection; everything not kept is pruned."""

    name = "efficientvla"

    def __init__(self, cfg: EfficientVLATokensConfig | None = None) -> None:
        self.cfg = cfg or EfficientVLATokensConfig()
        self.last_plan: TokenPlan | None = None

    def reset(self) -> None:
        self.last_plan = None

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        c = self.cfg

        def decide(probe: ProbeResult | None) -> TokenPlan:
            relevance = attention_scores(probe.probs)  # r_i: sum over instruction tokens
            k_final = resolve_budget(c.budget, c.budget_fraction, step.num_visual)
            keep = torch.stack(
                [
                    task_aware_selection(r, f, k_final, c.k_key, c.alpha)
                    for r, f in zip(relevance, step.visual, strict=True)
                ]
            )
            self.last_plan = plan_from_masks(step.vis_start, keep, torch.zeros_like(keep), c.layer)
            return self.last_plan

        return DeferredPlan(c.layer, decide), step.probe(c.layer, step.text_query_index())

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        pass
