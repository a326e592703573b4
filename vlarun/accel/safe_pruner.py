"""SAFE-Pruner (Ma et al., 2026; a baseline of TRIAGE's Table I): prune visual tokens by shallow
attention plus a forecast of deep-layer saliency, re-recorded on keyframes.

Shallow attention alone misses tokens only the deep layers need. SAFE-Pruner's observation is
that a VLA keeps attending to the same things across steps, so deep attention recorded once
forecasts it for the following steps:

  keyframe   a step that runs every token through every layer (full compute) and records the
             forecast: the action query's attention to the visual tokens at the deepest layer;
             the episode's first step is one, and so is the step after an attention shift;
  carry      the forecast is moved to the current frame by patch correspondence (each token
             takes the forecast of its most cosine-similar keyframe projector output; the same
             carry TRIAGE adopted from SAFE-Pruner, ``triage.carry_memory``);
  score      shallow attention of the action query at ``layer`` + ``memory_weight`` x the
             carried forecast (both raw head-mean probabilities, as the authors add them); the
             top B are kept after ``layer``, the rest pruned (nothing is reused);
  shift      "adaptive subtask division": the shallow attention of the first step after a
             keyframe is the reference; when the current step's shallow attention has a cosine
             below ``shift_threshold`` with the (carried) reference, the next step is a keyframe.

What differs from the authors' code (github.com/msssl/SAFE-Pruner, read 2026-12-05), and why:
their forecast averages the attention rows of layers 0 and 31 (OFT's first and last) and their
shift test compares layer 0 with the keyframe's layer-0 row in the same step, making that step
the keyframe. The engine gives a token policy one attention probe per step, so here the keyframe
records the deepest layer only, the shift reference is the shallow row of the step after the
keyframe, and a shift found at step t makes step t + 1 the keyframe (one step late). Their
defaults: tokens dropped before layer 3, ranked by layer 2's attention (``layer=2`` here),
lambda 1, tau 0.92; their queries are the action tokens, here the last prompt token
(``StepInputs.action_query_index``, as for TRIAGE). A keyframe costs a
full step: the FLOPs ratio of a run counts it, which is where SAFE-Pruner's tail latency comes
from (TRIAGE's paper: p99 1.6x its mean on OFT).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vlarun.accel.base import (
    PlanLike,
    StepInputs,
    attention_scores,
    check_budget,
    plan_from_masks,
    resolve_budget,
    top_mask,
)
from vlarun.accel.triage import carry_memory
from vlarun.models.llama import AttnProbe
from vlarun.models.token_plan import DeferredPlan, ProbeResult, TokenPlan
from vlarun.models.vla import PrefillResult


@dataclass(frozen=True)
class SAFEPrunerConfig:
    """budget / budget_fraction: visual tokens kept on a non-keyframe step; memory_weight: lambda,
    the forecast's weight beside shallow attention; shift_threshold: tau, the cosine below
    which attention has shifted; layer: where shallow attention is read and after which the
    rest are pruned; forecast_layer: the deep layer recorded on keyframes (None: the last)."""

    budget: int | None = None
    budget_fraction: float = 0.34
    memory_weight: float = 1.0
    shift_threshold: float = 0.92
    layer: int = 2
    forecast_layer: int | None = None

    def __post_init__(self) -> None:
        check_budget(self.budget, self.budget_fraction, self.layer)
        if self.memory_weight < 0:
            raise ValueError(f"memory_weight must be >= 0, got {self.memory_weight}")
        if not -1.0 <= self.shift_threshold <= 1.0:
            raise ValueError(f"shift_threshold must be in [-1, 1], got {self.shift_threshold}")
        if self.forecast_layer is not None and self.forecast_layer < 0:
            raise ValueError(f"forecast_layer must be >= 0, got {self.forecast_layer}")


@dataclass
class _Memory:
    """What the last keyframe left: the deep forecast and the frame it belongs to, and the
    shallow reference of the step after it (None until that step ran)."""

    forecast: Tensor  # (B, Nv) deep attention of the keyframe (head mean)
    forecast_feats: Tensor  # (B, Nv, d) unit-norm projector outputs of the keyframe
    reference: Tensor | None = None  # (B, Nv) shallow attention of the step after it
    reference_feats: Tensor | None = None


class SAFEPruner:
    """The SAFE-Pruner token policy; per-episode state is the last keyframe's memory."""

    name = "safe-pruner"

    def __init__(self, cfg: SAFEPrunerConfig | None = None) -> None:
        self.cfg = cfg or SAFEPrunerConfig()
        self.memory: _Memory | None = None
        self.keyframe_due = True
        self.keyframes = 0  # keyframes this episode (full-compute steps)
        self.last_plan: TokenPlan | None = None
        self.last_signals: dict[str, Tensor] = {}

    def reset(self) -> None:
        self.memory, self.keyframe_due, self.keyframes = None, True, 0
        self.last_plan, self.last_signals = None, {}

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        query = step.action_query_index()
        if self.keyframe_due or self.memory is None:
            # Keyframe: every token through every layer; the deep row is recorded in ``end``.
            self.last_plan = None
            deep = self.cfg.forecast_layer
            return None, step.probe(step.num_layers - 1 if deep is None else deep, query)
        mem = self.memory
        carried = carry_memory(mem.forecast, mem.forecast_feats, step.visual)

        def decide(probe: ProbeResult | None) -> TokenPlan:
            return self._decide(step, probe, carried)

        return DeferredPlan(self.cfg.layer, decide), step.probe(self.cfg.layer, query)

    def _decide(self, step: StepInputs, probe: ProbeResult, carried: Tensor) -> TokenPlan:
        cfg, mem = self.cfg, self.memory
        shallow = attention_scores(probe.probs)
        if mem.reference is None:
            mem.reference = shallow.clone()
            mem.reference_feats = F.normalize(step.visual.float(), dim=-1)
            similarity = torch.ones(step.batch, device=shallow.device)
        else:
            ref = carry_memory(mem.reference, mem.reference_feats, step.visual)
            similarity = F.cosine_similarity(shallow, ref, dim=-1, eps=1e-12)
        # Any row's shift makes the next step a keyframe: a batch runs one plan shape.
        self.keyframe_due = bool((similarity < cfg.shift_threshold).any())
        score = shallow + cfg.memory_weight * carried
        budget = resolve_budget(cfg.budget, cfg.budget_fraction, step.num_visual)
        keep = torch.stack([top_mask(row, budget) for row in score])
        self.last_signals = {"score": score, "shift_similarity": similarity}
        self.last_plan = plan_from_masks(step.vis_start, keep, torch.zeros_like(keep), cfg.layer)
        return self.last_plan

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        if self.last_plan is not None:  # a pruned step: nothing to record
            return
        deep = attention_scores(pre.lm.probe.probs)
        self.memory = _Memory(deep, F.normalize(step.visual.float(), dim=-1))
        self.keyframe_due = False
        self.keyframes += 1
