"""Weight-only int8: the big projections of the LM and the action head, activations unchanged.

Each chosen ``nn.Linear`` becomes an ``Int8Linear``: its weight W (N, K) is stored as int8 Q and
one float scale per output channel, s_n = max_k |W_nk| / 127, Q = round(W / s) (symmetric, so
|W - Q s| <= s / 2 elementwise). Activations stay in the model's dtype (bf16 or fp32). On the
CPU the matmul is PyTorch's own int8-weight kernel, ``aten._weight_int8pack_mm(x, Q, s)``, which
reads the int8 weight directly (half the bytes of bf16: decode is bandwidth-bound); where that
kernel is absent (another device, an older torch) the weight is dequantised per call and run as
an ordinary ``F.linear`` (same numbers, no speed-up). ``Int8Linear.path`` says which ran.

Where it pays (``vlarun bench engine``, AMD EPYC with AVX-512 BF16, 2 threads, 2026-12-07): a
1.1B LM's bf16 decode, 1.34x bf16's prepacked GEMVs (43.6 against 58.6 ms per token). The kernel
converts int8 in its inner loop at ~33 GB/s of int8 on two cores, where oneDNN streams bf16 at
~63 GB/s: the conversion, not the memory bus, bounds it, so the 2x of the bytes does not show.
With fp32 activations the kernel reads ~3 GB/s (1.1B decode: 327 against 92 ms per token in
fp32), so int8 is a bf16 setting on a CPU; fp32 prefills (more than ``GEMV_ROWS`` rows) take
the dequantised matmul instead. On the shipped mt10p policies (3M-parameter LMs, in cache)
int8 changes nothing measurable (`vlarun bench roofline --policy mt10p-ar --setting int8`).

What is quantised by default (``DEFAULT_SCOPE``): the decoder layers of the LM, of a pi0-style
action expert and the blocks of a CogACT DiT: the bulk of the weights. What stays in its dtype:
  * the token embedding (an ``nn.Embedding``, a lookup, not a matmul);
  * the LM head, unless ``lm_head=True``: the action tokens are the argmax of its logits over
    256 action bins whose rows differ little, so its rounding flips tokens first;
  * the small input / output / time projections of the heads and the vision side (few bytes;
    some of them are read for their dtype by the model code).

``quantize_int8`` is a transform: it returns a new VLA that shares every unquantised weight with
the original, which is left untouched. It refuses, with one line and before changing anything,
what it cannot quantise: a name filter that matches no eligible Linear, a model that is already
quantised, a prepacked (``PackedLinear``) model, weights of a dtype other than bf16 / fp32.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.llama import LlamaLM, PackedLinear
from vlarun.models.vla import VLA
from vlarun.transforms.layer_prune import _shallow_module_copy

# Module-name patterns (regular expressions, full match) quantised by default.
DEFAULT_SCOPE = (
    r"language_model\.model\.layers\..*",
    r"action_expert\.expert\.model\.layers\..*",
    r"action_model\.blocks\..*",
)
LM_HEAD = r"language_model\.lm_head"
# The same for a bare ``LlamaLM`` (the engine benchmark's): its decoder layers, its head.
LM_SCOPE = (r"model\.layers\..*",)
BARE_LM_HEAD = r"lm_head"
DTYPES = (torch.bfloat16, torch.float32)
# fp32 calls with more rows than this (batch x tokens: a prefill) take the dequantised matmul.
GEMV_ROWS = 8
# torch >= 2.3 has the CPU kernel; checked once, not per call.
KERNEL = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel symmetric int8 of a (N, K) weight -> (Q int8 (N, K), scale fp32 (N,)).

    An all-zero row gets scale 1 (any scale reproduces it exactly; 0 would divide by zero)."""
    if w.dim() != 2:
        raise ValueError(f"int8 quantises 2-D weights, got shape {tuple(w.shape)}")
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """y = x Wᵀ (+ b) with W stored as int8 ``weight_int8`` (N, K) and fp32 ``scale`` (N,).

    Both are buffers, so ``state_dict`` carries them (and a quantised model of the same shape
    loads them back); the bias, if any, stays a float parameter. Inputs are (..., K) in bf16 or
    fp32; the output has the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.weight.dtype not in DTYPES:
            raise ValueError(f"int8 quantises bf16 / fp32 weights, got {linear.weight.dtype}")
        q, scale = quantize_weight(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", q.to(linear.weight.device))
        self.register_buffer("scale", scale.to(linear.weight.device))
        self.bias = linear.bias  # shared with the original Linear (not quantised)

    @property
    def path(self) -> str:
        """``kernel`` (aten._weight_int8pack_mm) or ``dequantise`` (F.linear on Q s)."""
        return "kernel" if KERNEL and self.weight_int8.device.type == "cpu" else "dequantise"

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight Q s the layer computes with, (N, K) in ``dtype``."""
        return (self.weight_int8.float() * self.scale[:, None]).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in DTYPES:
            raise ValueError(f"Int8Linear takes bf16 / fp32 inputs, got {x.dtype}")
        rows = x.numel() // self.in_features
        if self.path == "kernel" and (x.dtype == torch.bfloat16 or rows <= GEMV_ROWS):
            # The kernel takes a 2-D input and scales of the input's dtype. With fp32 inputs
            # and many rows (a prefill) it runs at ~5 GFLOP/s on x86 (torch 2.13: mt10p-ar's
            # prefill 102 ms against 8 ms in fp32, AMD EPYC, 2026-12-07), so those take the
            # dequantised matmul below: the same numbers, one pass over the weights to expand.
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features)
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scale.to(x.dtype))
            y = y.view(*lead, self.out_features)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _in_scope(
    model: nn.Module, lm_head: bool, scope: tuple[str, ...] = DEFAULT_SCOPE
) -> dict[str, nn.Module]:
    head = BARE_LM_HEAD if scope == LM_SCOPE else LM_HEAD
    scope = scope + ((head,) if lm_head else ())
    return {
        name: m for name, m in model.named_modules() if any(re.fullmatch(p, name) for p in scope)
    }


def int8_candidates(model: nn.Module, lm_head: bool = False) -> dict[str, nn.Linear]:
    """Name -> each plain ``nn.Linear`` that ``quantize_int8`` quantises by default: what the
    memory planner counts (on the meta device) so that its int8 bytes are the transform's."""
    return {n: m for n, m in _in_scope(model, lm_head).items() if type(m) is nn.Linear}


def int8_bytes(linear: nn.Linear) -> int:
    """Bytes a Linear's weight takes as an ``Int8Linear``: one per weight, a 4-byte fp32 scale
    per output channel (the bias stays a float parameter, counted with the float weights)."""
    return linear.weight.numel() + 4 * linear.out_features


def int8_layers(model: nn.Module) -> dict[str, Int8Linear]:
    """Name -> each ``Int8Linear`` in ``model`` (empty: not quantised)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, Int8Linear)}


def quantize_int8(
    model: VLA | LlamaLM,
    include: str | None = None,
    *,
    lm_head: bool = False,
    scope: tuple[str, ...] = DEFAULT_SCOPE,
) -> VLA | LlamaLM:
    """A new model whose Linear layers in scope are ``Int8Linear`` (see the module docstring).

    include: a regular expression a module name must fully match (default: ``DEFAULT_SCOPE``);
        it selects among the Linear layers of that scope (plus the LM head if ``lm_head``).
    lm_head: quantise the LM head's output projection too (kept in its dtype by default).
    scope: the module-name patterns eligible at all: ``DEFAULT_SCOPE`` for a VLA, ``LM_SCOPE``
        for a bare ``LlamaLM`` (``vlarun bench engine`` times its decode that way).
    Raises ValueError with one line, changing nothing, when there is nothing it can quantise."""
    if int8_layers(model):
        raise ValueError("int8: the model is already quantised (quantise the float model once)")
    in_scope = _in_scope(model, lm_head, scope)
    packed = [n for n, m in in_scope.items() if isinstance(m, PackedLinear)]
    if packed:
        raise ValueError(
            f"int8: {packed[0]} is prepacked for oneDNN (PackedLinear); quantise before prepack()"
        )
    pattern = re.compile(include) if include is not None else None
    chosen = {
        name: m
        for name, m in in_scope.items()
        if type(m) is nn.Linear and (pattern is None or pattern.fullmatch(name))
    }
    if not chosen:
        matched = [
            f"{n} ({type(m).__name__})"
            for n, m in model.named_modules()
            if n and pattern is not None and pattern.fullmatch(n)
        ]
        what = f"the filter {include!r}" if include is not None else "the default scope"
        got = f"; it matches {', '.join(matched[:3])}" if matched else ""
        raise ValueError(
            f"int8: {what} matches no Linear layer of the LM / action head to quantise{got}"
        )
    bad = sorted({str(m.weight.dtype) for m in chosen.values() if m.weight.dtype not in DTYPES})
    if bad:
        raise ValueError(f"int8 quantises bf16 / fp32 weights, the model has {', '.join(bad)}")
    with torch.no_grad():
        return _replace(model, {name: Int8Linear(m) for name, m in chosen.items()})


def _replace(model: nn.Module, new: dict[str, nn.Module]) -> nn.Module:
    """A copy of ``model`` with the modules named in ``new`` swapped in: every module on the
    way from the root to a swapped one is shallow-copied, the rest is shared."""
    root = _shallow_module_copy(model)
    copies: dict[str, nn.Module] = {"": root}
    for name, module in new.items():
        parts = name.split(".")
        parent, path = root, ""
        for part in parts[:-1]:
            path = f"{path}.{part}" if path else part
            if path not in copies:
                copies[path] = _shallow_module_copy(parent._modules[part])
                parent._modules[part] = copies[path]
            parent = copies[path]
        parent._modules[parts[-1]] = module
    return root
