"""Structured MLP sparsity for the LM (EfficientVLA's optional 25% on the remaining layers).

EfficientVLA uses PruneNet, a calibration-free method that scores each intermediate channel
from the weights alone. Two scores of a channel i of a gated MLP (gate row i, up row i, down
column i) are offered; the lowest ``fraction`` of channels by score are removed in every layer:

  magnitude   ||gate_i|| * ||up_i|| * ||down_i||, from the weights alone (PruneNet's kind of
              input, not its learned policy): an upper bound of what the channel can add to
              the output per unit input, blind to whether inputs ever excite it;
  activation  mean |h_i| * ||down_i|| over the real prefix tokens of calibration samples, where
              h = silu(gate x) * up x is the channel's activation (a Wanda-style score on the
              intermediate dimension): what the channel actually adds on the policy's own data.

The result is a new model with narrower MLPs (real FLOP and byte savings, no masks); the
original is untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

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


SCORES = ("magnitude", "activation")


@torch.no_grad()
def activation_scores(model: VLA, samples: Iterable[tuple]) -> list[torch.Tensor]:
    """Per LM layer, (intermediate,) mean |activation| x ||down column|| of each channel over
    the real (unpadded) prefix tokens of calibration ``samples`` (as ``layer_importance``
    takes them: (images, text ids) or (images, text ids, state))."""
    layers = model.language_model.model.layers
    sums = [torch.zeros(layer.mlp.down_proj.in_features, dtype=torch.float64) for layer in layers]
    keep: list[torch.Tensor] = []  # the current sample's (B, T) real-token mask
    count = 0

    def tap(i: int):
        def hook(_module, args) -> None:
            h = args[0].float().abs()  # (B, T, I): the input of down_proj is the activation
            sums[i] += h[keep[0]].sum(dim=0).double().cpu()

        return hook

    hooks = [m.mlp.down_proj.register_forward_pre_hook(tap(i)) for i, m in enumerate(layers)]
    try:
        for images, ids, *state in samples:
            if model.cfg.proprio_dim and not state:
                raise ValueError(f"{model.cfg.name} takes the robot state: (images, ids, state)")
            st = state[0] if state and model.cfg.proprio_dim else None
            prefix = model.build_prefix(model.encode_images(images), [ids], st)
            keep[:] = [prefix.pad]
            model.prefill(prefix)
            count += int(prefix.pad.sum())
    finally:
        for h in hooks:
            h.remove()
    if count == 0:
        raise ValueError("activation scores need at least one calibration sample")
    return [
        (s / count).float() * layer.mlp.down_proj.weight.float().norm(dim=0).cpu()
        for s, layer in zip(sums, layers, strict=True)
    ]


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


def sparsify_mlp(
    model: VLA,
    fraction: float = 0.25,
    score: str = "magnitude",
    calibration: Iterable[tuple] | None = None,
) -> VLA:
    """A new VLA whose LM MLPs keep the top ``1 - fraction`` channels in every layer, by
    ``score`` (``activation`` needs ``calibration`` samples)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"MLP sparsity must be in [0, 1), got {fraction}")
    if score not in SCORES:
        raise ValueError(f"MLP channel score must be one of {SCORES}, got {score!r}")
    if score == "activation" and calibration is None:
        raise ValueError("activation scores need calibration samples")
    per_layer = (
        activation_scores(model, calibration)
        if score == "activation"
        else [channel_scores(layer.mlp) for layer in model.language_model.model.layers]
    )
    lm_cfg = model.cfg.llm
    width = lm_cfg.intermediate_size - int(fraction * lm_cfg.intermediate_size)
    new = _shallow_module_copy(model)
    lm = _shallow_module_copy(model.language_model)
    decoder = _shallow_module_copy(model.language_model.model)
    layers = []
    for layer, scores in zip(model.language_model.model.layers, per_layer, strict=True):
        keep = torch.sort(torch.topk(scores, width).indices).values.to(scores.device)
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
