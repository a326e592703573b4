"""Method ids -> accelerated policies, the one place benchmarks and the CLI build them from.

full, triage, drop-all, keep-all, fastv, vla-cache, vla-pruner   token policies at a budget;
efficientvla                                        task-aware token selection, optionally
                                                    with layer pruning, MLP sparsity and the
                                                    DiT feature cache (``efficientvla()``).

  from vlarun.policy.methods import accelerated
  fast = accelerated(policy, "triage", budget_fraction=0.18)
  run_episode(fast, env, seed)          # reset() between episodes of the same task
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor

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
from vlarun.accel.triage import Triage, TriageConfig
from vlarun.accel.vla_pruner import VLAPruner, VLAPrunerConfig
from vlarun.policy.accelerated import AcceleratedPolicy
from vlarun.transforms.layer_prune import layer_importance, least_important, prune_layers
from vlarun.transforms.mlp_sparsity import sparsify_mlp

METHODS = (
    "full",
    "triage",
    "drop-all",
    "keep-all",
    "fastv",
    "vla-cache",
    "vla-pruner",
    "efficientvla",
)


def token_policy(method: str, budget_fraction: float = 0.34) -> TokenPolicy:
    """A fresh token policy for ``method`` recomputing ``budget_fraction`` of the tokens."""
    f = budget_fraction
    makers = {
        "full": FullRecompute,
        "triage": lambda: Triage(TriageConfig(budget_fraction=f)),
        "drop-all": lambda: Triage(TriageConfig(budget_fraction=f, rest="prune")),
        "keep-all": lambda: Triage(TriageConfig(budget_fraction=f, rest="reuse")),
        "fastv": lambda: FastV(FastVConfig(budget_fraction=f)),
        "vla-cache": lambda: VLACache(VLACacheConfig(budget_fraction=f)),
        "vla-pruner": lambda: VLAPruner(VLAPrunerConfig(budget_fraction=f)),
        "efficientvla": lambda: EfficientVLATokens(EfficientVLATokensConfig(budget_fraction=f)),
    }
    if method not in makers:
        raise ValueError(f"unknown accelerator {method!r}; choose from {METHODS}")
    return makers[method]()


def accelerated(policy, method: str, budget_fraction: float = 0.34) -> AcceleratedPolicy:
    """``policy`` (a Policy) running ``method``'s token policy."""
    return AcceleratedPolicy(policy, token_policy(method, budget_fraction))


@dataclass(frozen=True)
class EfficientVLAConfig:
    """EfficientVLA's three parts; each can be switched off for ablations.

    tokens: keep this fraction of visual tokens (None: all, no token selection);
    layers_removed: LM layers removed by cosine importance on calibration samples;
    mlp_sparsity: fraction of MLP channels removed in the remaining layers;
    cache_interval: DiT / action-expert features recomputed every N denoising steps (1: none);
    token_layer: tokens are ranked at, and pruned after, this layer (of the pruned LM)."""

    tokens: float | None = 0.22
    layers_removed: int = 0
    mlp_sparsity: float = 0.0
    cache_interval: int = 1
    token_layer: int = 2

    def __post_init__(self) -> None:
        if self.tokens is not None and not 0.0 < self.tokens <= 1.0:
            raise ValueError(f"tokens must be in (0, 1], got {self.tokens}")
        if self.layers_removed < 0 or self.cache_interval < 1:
            raise ValueError("layers_removed must be >= 0 and cache_interval >= 1")


def efficientvla(
    policy,
    cfg: EfficientVLAConfig = EfficientVLAConfig(),
    calibration: Iterable[tuple[Tensor, list[int]]] | None = None,
) -> AcceleratedPolicy:
    """``policy`` with EfficientVLA's transforms applied (layers need ``calibration``:
    (images (1, n_img, 3, H, W), prompt ids) samples, e.g. frames of recorded rollouts)."""
    model = policy.model
    if cfg.layers_removed:
        if calibration is None:
            raise ValueError("layer pruning needs calibration samples")
        importance = layer_importance(model, calibration)
        model = prune_layers(model, least_important(importance, cfg.layers_removed))
    if cfg.mlp_sparsity:
        model = sparsify_mlp(model, cfg.mlp_sparsity)
    tokens: TokenPolicy = FullRecompute()
    if cfg.tokens is not None:
        token_cfg = EfficientVLATokensConfig(budget_fraction=cfg.tokens, layer=cfg.token_layer)
        tokens = EfficientVLATokens(token_cfg)
    cache = every_n_steps(cfg.cache_interval) if cfg.cache_interval > 1 else None
    base = dataclasses.replace(policy, model=model) if model is not policy.model else policy
    return AcceleratedPolicy(base, tokens, denoise_cache=cache, reference=policy.model.cfg.llm)
