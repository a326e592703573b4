"""EfficientVLA layer pruning: drop the n LM layers that change their input least.

Importance I(l) = 1 - mean over calibration samples and positions of cos(x_l, x_{l+1}), the
hidden state entering and leaving layer l (SEEDS.md section 2). The n least important layers are
removed wherever they are (non-contiguous). ``prune_layers`` is a transform: it returns a new
VLA that shares every remaining weight with the original and has a shallower LM (and, for a
pi0-style model, an action expert without the same layers, since the expert reads the LM's
cache layer by layer); the original is untouched.

Hidden states are read with forward pre-hooks on each layer's input norm and on the final norm
(whose inputs are exactly x_0 .. x_L), so the engine needs no special mode.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.llama import LlamaLM
from vlarun.models.vla import VLA


@torch.no_grad()
def layer_importance(model: VLA, samples: Iterable[tuple]) -> Tensor:
    """(L,) importance of each LM layer over calibration ``samples`` of (images, text ids) or
    (images, text ids, state).

    images: (1, n_img, 3, H, W) in [0, 1]; text ids: one tokenised prompt; state: the (1, S)
    model input a policy with a proprio token takes (``Policy.state_tensor``), required by it.
    Every real prefix position counts (padding excluded)."""
    lm = model.language_model
    n = len(lm.model.layers)
    taps = [layer.input_layernorm for layer in lm.model.layers] + [lm.model.norm]
    seen: list[Tensor] = []
    hooks = [t.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) for t in taps]
    sums, count = torch.zeros(n, dtype=torch.float64), 0
    try:
        for images, ids, *state in samples:
            if model.cfg.proprio_dim and not state:
                raise ValueError(f"{model.cfg.name} takes the robot state: (images, ids, state)")
            seen.clear()
            st = state[0] if state and model.cfg.proprio_dim else None
            prefix = model.build_prefix(model.encode_images(images), [ids], st)
            model.prefill(prefix)
            states = seen[: n + 1]  # x_0 .. x_L (later calls, e.g. none here, are ignored)
            keep = prefix.pad  # (B, P)
            for i in range(n):
                cos = F.cosine_similarity(states[i].float(), states[i + 1].float(), dim=-1)
                sums[i] += float(cos[keep].sum())
            count += int(keep.sum())
    finally:
        for h in hooks:
            h.remove()
    if count == 0:
        raise ValueError("layer_importance needs at least one calibration sample")
    return (1.0 - sums / count).float()


def least_important(importance: Tensor, n: int) -> tuple[int, ...]:
    """The ``n`` layers with the lowest importance, in increasing layer order."""
    if not 0 <= n < importance.numel():
        raise ValueError(f"can remove 0 .. {importance.numel() - 1} layers, asked for {n}")
    order = torch.sort(importance, stable=True).indices[:n]
    return tuple(sorted(int(i) for i in order))


def prune_layers(model: VLA, remove: Iterable[int]) -> VLA:
    """A new VLA without LM layers ``remove`` (weights shared, original untouched)."""
    remove = sorted(set(remove))
    n = model.cfg.llm.num_layers
    if any(not 0 <= i < n for i in remove) or len(remove) >= n:
        raise ValueError(f"cannot remove layers {remove} from a {n}-layer LM")
    keep = [i for i in range(n) if i not in remove]
    llm_cfg = dataclasses.replace(model.cfg.llm, num_layers=len(keep))
    flow = model.cfg.flow
    if flow is not None:
        flow = dataclasses.replace(
            flow, expert=dataclasses.replace(flow.expert, num_layers=len(keep))
        )
    new = _shallow_module_copy(model)
    new.cfg = dataclasses.replace(model.cfg, llm=llm_cfg, flow=flow)
    new.language_model = _keep_layers(model.language_model, keep, llm_cfg)
    if flow is not None:
        expert = _shallow_module_copy(model.action_expert)
        expert.cfg = flow
        expert.expert = _keep_layers(
            model.action_expert.expert,
            keep,
            dataclasses.replace(model.action_expert.expert.cfg, num_layers=len(keep)),
        )
        new.action_expert = expert
    return new


def _keep_layers(lm: LlamaLM, keep: list[int], cfg) -> LlamaLM:
    new = _shallow_module_copy(lm)
    new.cfg = cfg
    decoder = _shallow_module_copy(lm.model)
    decoder.cfg = cfg
    decoder.layers = nn.ModuleList(lm.model.layers[i] for i in keep)
    new.model = decoder
    return new


def _shallow_module_copy(module: nn.Module) -> nn.Module:
    """A copy sharing parameters and submodules but with its own submodule table, so
    replacing a child in the copy leaves the original intact."""
    new = copy.copy(module)
    new._modules = dict(module._modules)
    return new
