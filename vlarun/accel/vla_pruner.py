"""VLA-Pruner (Liu et al., 2025; the strongest baseline in TRIAGE's Table I): temporal-aware,
dual-level visual token pruning.

A VLA's visual tokens serve two consumers: the language side, which reads the scene for
semantics (the prefill's instruction tokens attending to the image), and the action side, which
reads it for control (the action-decoding query attending to the image). Pruning by either
alone loses what the other needs, so VLA-Pruner keeps two sets:

  semantic   top ``split * B`` tokens by the instruction tokens' attention at ``layer``;
  action     the rest of the B by the action query's attention, smoothed over control steps
             (an EMA with ``decay``): the action attention of *this* step is only known after
             decoding, so the previous steps' stand in for it, and consecutive frames attend
             to similar places.

Everything else is pruned from the layers after ``layer``; nothing is reused (VLA-Pruner keeps no
KV cache across steps). Both signals come from one probe of the shallow layer, which runs on all
tokens anyway; the action query is the last prompt token (``StepInputs.action_query_index``),
which is also the last of the instruction queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlarun.accel.base import (
    PlanLike,
    StepInputs,
    plan_from_masks,
    resolve_budget,
    top_mask,
)
from vlarun.models.llama import AttnProbe
from vlarun.models.token_plan import DeferredPlan, ProbeResult, TokenPlan
from vlarun.models.vla import PrefillResult


@dataclass(frozen=True)
class VLAPrunerConfig:
    """budget / budget_fraction: visual tokens kept per step; split: share of the budget that
    goes to the semantic set; decay: weight of the past in the action-attention EMA; layer:
    where both are measured, and after which the rest are pruned."""

    budget: int | None = None
    budget_fraction: float = 0.34
    split: float = 0.5
    decay: float = 0.8
    layer: int = 2

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"VLA-Pruner budget must be >= 1 token, got {self.budget}")
        if not 0.0 < self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")
        if not 0.0 <= self.split <= 1.0 or not 0.0 <= self.decay < 1.0:
            raise ValueError(f"split must be in [0, 1] and decay in [0, 1), got {self}")
        if self.layer < 0:
            raise ValueError(f"layer must be >= 0, got {self.layer}")


def _unit(x: Tensor) -> Tensor:
    return x / x.sum(dim=-1, keepdim=True).clamp_min(1e-12)


class VLAPruner:
    """The VLA-Pruner token policy; per-episode state is the smoothed action attention."""

    name = "vla-pruner"

    def __init__(self, cfg: VLAPrunerConfig | None = None) -> None:
        self.cfg = cfg or VLAPrunerConfig()
        self.action_memory: Tensor | None = None  # (B, Nv) smoothed action-query attention
        self.last_plan: TokenPlan | None = None
        self.last_signals: dict[str, Tensor] = {}

    def reset(self) -> None:
        self.action_memory, self.last_plan, self.last_signals = None, None, {}

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        queries = step.text_query_index()  # the instruction tokens; the last is the action query

        def decide(probe: ProbeResult | None) -> TokenPlan:
            return self._decide(step, probe)

        return DeferredPlan(self.cfg.layer, decide), step.probe(self.cfg.layer, queries)

    def _decide(self, step: StepInputs, probe: ProbeResult) -> TokenPlan:
        cfg = self.cfg
        attn = probe.probs.float().mean(dim=1)  # (B, Nq, Nv), head mean
        semantic = _unit(attn.sum(dim=1))  # all instruction queries
        action_now = _unit(attn[:, -1])  # the action query alone
        if self.action_memory is None or self.action_memory.shape != action_now.shape:
            action = action_now
        else:
            action = _unit(cfg.decay * self.action_memory + (1 - cfg.decay) * action_now)
        self.action_memory = action
        budget = resolve_budget(cfg.budget, cfg.budget_fraction, step.num_visual)
        n_semantic = int(cfg.split * budget + 0.5)
        keep = []
        for r in range(step.batch):
            chosen = top_mask(semantic[r], n_semantic)
            chosen |= top_mask(action[r], budget - int(chosen.sum()), ~chosen)
            keep.append(chosen)
        recompute = torch.stack(keep)
        self.last_signals = {"semantic": semantic, "action": action}
        self.last_plan = plan_from_masks(
            step.vis_start, recompute, torch.zeros_like(recompute), cfg.layer
        )
        return self.last_plan

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        pass
