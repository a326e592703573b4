"""Method ids -> token policies, the one place benchmarks and the CLI build them from, and
EfficientVLA's recipe.

full, triage, drop-all, keep-all, fastv, vla-cache,  token policies at a budget
vla-pruner, safe-pruner, specprune                  (specprune's is the least recomputed);
vla-cache-uncapped                                  VLA-Cache without the cap (TRIAGE's Table I
                                                    form): takes no budget;
efficientvla                                        task-aware token selection; with
                                                    ``EfficientVLAConfig.apply`` also layer
                                                    pruning, MLP sparsity and the DiT cache.

A method at a budget is a setting (``policy.with_setting("triage:0.18")``); the budgetless
VLA-Cache, and a method at a budget of 1.0, are token policies a setting does not name:

  fast = policy.with_hooks(token_policy("vla-cache-uncapped", calibration=policy.calibration))
  run_episode(fast, env, seed)          # reset() between episodes of the same task
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from vlarun.accel.base import FullRecompute, TokenPolicy
from vlarun.accel.baselines import (
    EfficientVLATokens,
    EfficientVLATokensConfig,
    FastV,
    FastVConfig,
    VLACache,
    VLACacheConfig,
)
from vlarun.accel.feature_cache import every_n_steps
from vlarun.accel.safe_pruner import SAFEPruner, SAFEPrunerConfig
from vlarun.accel.specprune import SpecPrune, SpecPruneConfig
from vlarun.accel.triage import Triage, TriageConfig
from vlarun.accel.vla_pruner import VLAPruner, VLAPrunerConfig
from vlarun.transforms.layer_prune import layer_importance, least_important, prune_layers
from vlarun.transforms.mlp_sparsity import SCORES, sparsify_mlp

# A calibration sample: images (1, n_img, 3, H, W), prompt ids[, state (1, state_dim)].
Sample = tuple

METHODS = (
    "full",
    "triage",
    "drop-all",
    "keep-all",
    "fastv",
    "vla-cache",
    "vla-pruner",
    "safe-pruner",
    "specprune",
    "efficientvla",
    "vla-cache-uncapped",
)
# TRIAGE and the two baselines sharing its ranking take a last shared layer (``@L`` in a spec).
SHARED_LAYER_METHODS = ("triage", "drop-all", "keep-all")
# Methods whose recomputed share follows from the scene, not from a budget.
BUDGETLESS = ("full", "vla-cache-uncapped")


def token_policy(
    method: str,
    budget_fraction: float = 0.34,
    calibration: dict | None = None,
    layer: int | None = None,
) -> TokenPolicy:
    """A fresh token policy for ``method`` recomputing ``budget_fraction`` of the tokens, with
    a checkpoint's calibrated knobs (``Policy.calibration``, e.g. TRIAGE's delta) where it has
    them. Drop-all and keep-all share TRIAGE's ranking and so its calibration. ``layer``:
    TRIAGE's family only, its last shared layer (None: ``TriageConfig``'s, the paper's 2)."""
    f = budget_fraction
    tri = dict((calibration or {}).get("triage", {}))
    if layer is not None:
        if method not in SHARED_LAYER_METHODS:
            raise ValueError(
                f"only {', '.join(SHARED_LAYER_METHODS)} take a shared layer, not {method}"
            )
        tri["layer"] = layer
    makers = {
        "full": FullRecompute,
        "triage": lambda: Triage(TriageConfig(budget_fraction=f, **tri)),
        "drop-all": lambda: Triage(TriageConfig(budget_fraction=f, rest="prune", **tri)),
        "keep-all": lambda: Triage(TriageConfig(budget_fraction=f, rest="reuse", **tri)),
        "fastv": lambda: FastV(FastVConfig(budget_fraction=f)),
        "vla-cache": lambda: VLACache(VLACacheConfig(budget_fraction=f)),
        "vla-pruner": lambda: VLAPruner(VLAPrunerConfig(budget_fraction=f)),
        "safe-pruner": lambda: SAFEPruner(SAFEPrunerConfig(budget_fraction=f)),
        # The budget is SpecPrune-VLA's floor: changed patches are kept beyond it.
        "specprune": lambda: SpecPrune(SpecPruneConfig(budget_fraction=f)),
        "efficientvla": lambda: EfficientVLATokens(EfficientVLATokensConfig(budget_fraction=f)),
        # Every changed or task-relevant token is recomputed and every static one reused from
        # layer 1 on: the only shared layer is the one whose attention gives the relevance.
        "vla-cache-uncapped": lambda: VLACache(VLACacheConfig(budget_fraction=1.0, layer=0)),
    }
    if method not in makers:
        raise ValueError(f"unknown accelerator {method!r}; choose from {METHODS}")
    return makers[method]()


@dataclass(frozen=True)
class EfficientVLAConfig:
    """EfficientVLA's three parts; each can be switched off for ablations.

    tokens: keep this fraction of visual tokens (None: all, no token selection);
    layers_removed: LM layers removed by cosine importance on calibration samples;
    mlp_sparsity: fraction of MLP channels removed in the remaining layers;
    mlp_score: how channels are ranked: "magnitude" (weights) or "activation" (calibration);
    cache_interval: DiT / action-expert features recomputed every N denoising steps (1: none);
    token_layer: tokens are ranked at, and pruned after, this layer (of the pruned LM)."""

    tokens: float | None = 0.22
    layers_removed: int = 0
    mlp_sparsity: float = 0.0
    mlp_score: str = "magnitude"
    cache_interval: int = 1
    token_layer: int = 2

    def __post_init__(self) -> None:
        if self.tokens is not None and not 0.0 < self.tokens <= 1.0:
            raise ValueError(f"tokens must be in (0, 1], got {self.tokens}")
        if self.layers_removed < 0 or self.cache_interval < 1:
            raise ValueError("layers_removed must be >= 0 and cache_interval >= 1")
        if self.mlp_score not in SCORES:
            raise ValueError(f"mlp_score must be one of {SCORES}, got {self.mlp_score!r}")

    def apply(self, policy, samples: Iterable[Sample] | None = None):
        """``policy`` (a Policy) with EfficientVLA's parts: the model transforms (layers removed by
        cosine importance, MLP sparsity; both scored on ``samples``: (images (1, n_img, 3, H,
        W), prompt ids[, state]) tuples, e.g. demo frames) into a new Policy, then its hooks
        (task-aware tokens at ``token_layer``, the denoiser feature cache). FLOPs ratios are
        measured against the original LM."""
        model = policy.model
        samples = list(samples) if samples is not None else None  # read twice
        if self.layers_removed:
            if samples is None:
                raise ValueError("layer pruning needs calibration samples")
            importance = layer_importance(model, samples)
            model = prune_layers(model, least_important(importance, self.layers_removed))
        if self.mlp_sparsity:
            if self.mlp_score == "activation" and samples is None:
                raise ValueError("activation-scored MLP sparsity needs calibration samples")
            # Scored on the model as it now is: a removed layer changes what the rest receive.
            model = sparsify_mlp(model, self.mlp_sparsity, self.mlp_score, samples)
        tokens: TokenPolicy = FullRecompute()
        if self.tokens is not None:
            cfg = EfficientVLATokensConfig(budget_fraction=self.tokens, layer=self.token_layer)
            tokens = EfficientVLATokens(cfg)
        cache = every_n_steps(self.cache_interval) if self.cache_interval > 1 else None
        base = dataclasses.replace(policy, model=model) if model is not policy.model else policy
        return base.with_hooks(tokens, denoise_cache=cache, reference=policy.model.cfg.llm)


# EfficientVLA's parts on a deep (12-layer) trunk, each alone and all together.
# The paper removes 10 of LLaMA-2's 32 layers (31%): "layers4" is that share of 12, "layers2"
# half of it. Tokens are selected after layer 2 (of the pruned LM), keeping 22% (56 of 256 on
# the paper's shape); the DiT recomputes its features every 5th of 10 denoising steps; MLP
# sparsity is the paper's optional 25%, ranked by weights or by activations on demo frames.
DEPTH_PARTS = {
    "tokens": EfficientVLAConfig(tokens=0.22),
    "cache": EfficientVLAConfig(tokens=None, cache_interval=5),
    "layers2": EfficientVLAConfig(tokens=None, layers_removed=2),
    "layers4": EfficientVLAConfig(tokens=None, layers_removed=4),
    "mlp-magnitude": EfficientVLAConfig(tokens=None, mlp_sparsity=0.25),
    "mlp-activation": EfficientVLAConfig(tokens=None, mlp_sparsity=0.25, mlp_score="activation"),
    "all": EfficientVLAConfig(
        tokens=0.22, layers_removed=4, mlp_sparsity=0.25, mlp_score="activation", cache_interval=5
    ),
    "all-layers2": EfficientVLAConfig(
        tokens=0.22, layers_removed=2, mlp_sparsity=0.25, mlp_score="activation", cache_interval=5
    ),
    # The parts whose rows cost least on mt10p-dit (2026-12-06: tokens -4, cache +1, layers2
    # -2 points; MLP sparsity -24): what all-on can keep when the MLP part is what fails.
    "all-but-mlp": EfficientVLAConfig(tokens=0.22, layers_removed=2, cache_interval=5),
}
