"""Structured MLP sparsity for the LM (EfficientVLA's optional 25% on the remaining layers).

EfficientVLA uses PruneNet, a calibration-free method that scores each intermediate channel
from the weights alone. This module does the same kind of thing, more simply: a channel i of a
gated MLP (gate row i, up row i, down column i) is scored by ||gate_i|| * ||up_i|| * ||down_i||,
an upper bound of how much it can add to the output per unit input, and the lowest ``fraction``
of channels are removed in every layer. The result is a new model with narrower MLPs (real
FLOP and byte savings, no masks); the original is untouched. Not PruneNet's learned policy.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from vlarun.models.llama import MLP
from vlarun.models.vla import VLA
from vlarun.transforms.layer_prune import _shallow_module_copy


def channel_scores(mlp: MLP) -> torch.Tensor:
    """(intermediate,) magnitude score of each channel of a gated MLP."""
    gate = mlp.gate_proj.weight.float().norm(dim=1)
    up = mlp.up_proj.weight.float().norm(dim=1)
    down = mlp.down_proj.weight.float().norm(dim=0)
    return gate * up * down


@torch.no_grad()
def narrow_mlp(mlp: MLP, keep: torch.Tensor) -> MLP:
    """A copy of ``mlp`` with only the intermediate channels ``keep`` (sorted indices)."""
    new = _shallow_module_copy(mlp)
    for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
        old = getattr(mlp, name)
        w = old.weight.index_select(dim, keep).clone()
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype, device=w.device)
        lin.weight.copy_(w)
        setattr(new, name, lin)
    return new


def sparsify_mlp(model: VLA, fraction: float = 0.25) -> VLA:
    """A new VLA whose LM MLPs keep the top ``1 - fraction`` channels in every layer."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"MLP sparsity must be in [0, 1), got {fraction}")
    lm_cfg = model.cfg.llm
    width = lm_cfg.intermediate_size - int(fraction * lm_cfg.intermediate_size)
    new = _shallow_module_copy(model)
    lm = _shallow_module_copy(model.language_model)
    decoder = _shallow_module_copy(model.language_model.model)
    layers = []
    for layer in model.language_model.model.layers:
        keep = torch.sort(torch.topk(channel_scores(layer.mlp), width).indices).values
        narrowed = _shallow_module_copy(layer)
        narrowed.mlp = narrow_mlp(layer.mlp, keep)
        layers.append(narrowed)
    decoder.layers = nn.ModuleList(layers)
    cfg = dataclasses.replace(lm_cfg, intermediate_size=width)
    decoder.cfg = lm.cfg = cfg
    lm.model = decoder
    new.language_model = lm
    new.cfg = dataclasses.replace(model.cfg, llm=cfg)
    return new
