"""Static-shape decode steps: the one-token decode and the Jacobi iteration (gpt-fast's pattern).

``LlamaLM.forward`` serves every mode and pays for it in host synchronisation: it validates
positions (``int(positions.max())``), trims the attended keys to the filled part of the cache
(a data-dependent length) and checks whether the mask is trivial (``bool(mask.all())``) so that
SDPA can skip it. Each of these stops the host until the device is idle, which on a GPU costs
more than the decode step's kernels, and none of them can be captured in a CUDA graph.

Here the decode-time forward is written so that every shape follows from the input's (B, T)
and the cache's size, and nothing leaves the device:

* keys are always all S cache slots; a query at position p sees slot s iff the slot is valid in
  that layer and s <= p (its own and earlier action tokens were just written there, so causal
  attention among the call's tokens follows from their positions);
* K/V and validity are written with ``index_put_`` at tensor positions, per row;
* RoPE rows are gathered by tensor positions.

The result equals ``LlamaLM.forward`` on a cache for causal calls at contiguous positions (the
decode and Jacobi cases; tests/models/test_static_step.py), including caches whose deep
layers lost pruned tokens (TRIAGE's layered validity is per layer here too). Positions are
checked once per decode call on the host (``check_room``), not in the step.

The diffusion family's step (one DiT forward, ``dit_eps``) has no cache and was static already.

``compile_steps`` swaps the eager functions for ``torch.compile``d ones (``fullgraph=True``:
any host sync or data-dependent shape is an error, not a silent graph break); with
``mode="reduce-overhead"`` on CUDA they run as CUDA graphs, as gpt-fast's ``decode_one_token``
does; on a CPU, mode ``fused`` (``FUSED_OPTIONS``) is the one measured faster (decode 2.1x eager on
mt10p-ar). The eager functions stay the default unless a command asks (``--compile-steps``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vlarun.models.attn_context import rope_at
from vlarun.models.kv_cache import KVCache
from vlarun.models.llama import BranchCache, LlamaLM, rotate_half

# torch.compile's own modes, and "fused": inductor with the weights frozen into the graph, its
# C++ GEMM templates fused into the step's kernels (max-autotune, CPP backend) and a C++ wrapper
# that launches them without a Python call each. On a CPU that is what pays: mt10p-ar's 15
# decode steps are ~85 tiny matmuls and ~100 other ops each, so dispatch, not arithmetic, is
# their cost (AMD EPYC, 2 threads, 2026-12-06: eager 28.6 ms, "default" 21.1 ms, "fused" 13.9
# ms; benchmarks/engine.md). Frozen weights are constants: a policy's weights must not change
# in place after its first compiled call (a module swapped for another recompiles).
FUSED = "fused"
FUSED_OPTIONS = {
    "freezing": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    "cpp_wrapper": True,
}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", FUSED)


def _rope(lm: LlamaLM, positions: Tensor) -> tuple[Tensor, Tensor]:
    """RoPE rows of ``positions`` (B, T): (B, 1, T, hd) each (the general forward's lookup)."""
    return rope_at((lm.model.rope_cos, lm.model.rope_sin, lm.dtype), positions)


def static_forward(lm: LlamaLM, embeds: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
    """Hidden states (B, T, d) of ``embeds`` (B, T, d) at ``positions`` (B, T), causal over
    absolute positions, attending to every valid slot of ``cache`` and writing their K/V there.

    No host synchronisation and no data-dependent shape: safe to compile with
    ``fullgraph=True`` or to capture in a CUDA graph."""
    b = embeds.shape[0]
    dev = embeds.device
    cos, sin = _rope(lm, positions)
    slots = torch.arange(cache.max_len, device=dev)
    before = slots[None, None, :] <= positions[:, :, None]  # (B, T, S)
    rows = torch.arange(b, device=dev)[:, None]  # (B, 1), broadcast against positions (B, T)
    x = embeds
    for i, layer in enumerate(lm.model.layers):
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)
        kc, vc, valid = cache.k[i], cache.v[i], cache.valid[i]  # (B, KVH, S, hd), (B, S)
        # Advanced indices around a slice put (B, T) first: values are (B, T, KVH, hd).
        kc[rows, :, positions] = k.transpose(1, 2)
        vc[rows, :, positions] = v.transpose(1, 2)
        valid[rows, positions] = True
        mask = (valid[:, None, :] & before)[:, None]  # (B, 1, T, S)
        x = x + attn.attend(q, kc, vc, mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return lm.model.norm(x)


def prefill_forward(
    lm: LlamaLM, embeds: Tensor, positions: Tensor, cache: KVCache, mask: Tensor
) -> Tensor:
    """Hidden states (B, P, d) of a whole prefix ``embeds`` (B, P, d) at ``positions`` (P,)
    0..P-1 into a fresh ``cache``, whose first P slots take its K/V; ``mask`` (B, 1, P, P) is
    what each token sees (``prefill_mask``). The caller marks the slots valid (the prefix's pad
    mask): no host synchronisation and no data-dependent shape here, as in ``static_forward``.

    Equals the general forward on a reset cache (``VLA.prefill`` without a plan or probe): the
    keys a prefix token sees are the prefix's own, as the general path's mask says."""
    p = embeds.shape[1]
    cos, sin = _rope(lm, positions)
    x = embeds
    for i, layer in enumerate(lm.model.layers):
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)
        cache.k[i][:, :, :p] = k
        cache.v[i][:, :, :p] = v
        x = x + attn.attend(q, k, v, mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return lm.model.norm(x)


def prefill_mask(causal: bool, blocks: Tensor | None, pad: Tensor) -> Tensor:
    """(B, 1, P, P) visibility among a prefix's tokens, as ``attn_context.Context.build``
    builds it: causal, or by attention blocks, never a padding key, and always itself."""
    b, p = pad.shape
    if blocks is not None:
        local = blocks[:, None, :] <= blocks[:, :, None]
    elif causal:
        local = torch.ones(p, p, dtype=torch.bool, device=pad.device).tril_().expand(b, p, p)
    else:
        local = torch.ones(b, p, p, dtype=torch.bool, device=pad.device)
    eye = torch.eye(p, dtype=torch.bool, device=pad.device)
    return ((local & pad[:, None, :]) | eye)[:, None]


def expert_forward(
    lm: LlamaLM,
    embeds: Tensor,
    positions: Tensor,
    prefix: KVCache,
    local: Tensor,
    branches: BranchCache | None = None,
    cond: Tensor | None = None,
    cross: frozenset[int] = frozenset(),
) -> Tensor:
    """Hidden states (B, T, d) of an action expert's tokens (pi0's state + noisy actions): each
    layer's queries see the valid slots of the same layer of another decoder's cache
    (``prefix``, read only) plus the call's own tokens as ``local`` (T, T) bool allows (a token
    always sees itself). Nothing is written; no host synchronisation (every prefix slot is a
    key, masked by its validity), so a denoising step is capturable like a decode step.

    ``branches`` (a ``BranchCache``) is called as ``branches(layer, kind, compute)`` for each
    attention ("attn") and MLP ("mlp") branch and returns ``compute()`` or a stored output of
    the same shape: the hook denoising caches use (EfficientVLA's, on the flow family).

    ``cond`` (B, c) conditions an expert with adaptive norms (pi05: the flow time), whose
    gates scale each residual branch (inside the branch, so a cached branch keeps its gate).
    Layers in ``cross`` (SmolVLA's) attend to the prefix only, through the expert's own
    projections of its cached keys and values, with queries at positions counted from 0."""
    b, t = embeds.shape[:2]
    dev = embeds.device
    cos, sin = _rope(lm, positions)
    if cross:
        cos0, sin0 = _rope(lm, positions - positions.min(dim=1, keepdim=True).values)
    own = (local.to(dev) | torch.eye(t, dtype=torch.bool, device=dev)).expand(b, t, t)
    x = embeds
    for i, layer in enumerate(lm.model.layers):
        attn = layer.self_attn

        def attention(i: int = i, x: Tensor = x, layer=layer, attn=attn) -> Tensor:
            h, gate = _norm(layer.input_layernorm, x, cond)
            seen = prefix.valid[i][:, None, :].expand(b, t, -1)
            if i in cross:
                out = _cross_attend(attn, h, prefix.k[i], prefix.v[i], cos0, sin0, seen)
            else:
                q, k, v = attn.qkv(h, cos, sin)
                keys = torch.cat((prefix.k[i], k), dim=2)
                values = torch.cat((prefix.v[i], v), dim=2)
                mask = torch.cat((seen, own), dim=-1)[:, None]  # (B, 1, T, S + T)
                out = attn.attend(q, keys, values, mask)
            return out if gate is None else out * gate

        x = x + (attention() if branches is None else branches(i, "attn", attention))
        h = x

        def mlp(h: Tensor = h, layer=layer) -> Tensor:
            n, gate = _norm(layer.post_attention_layernorm, h, cond)
            out = layer.mlp(n)
            return out if gate is None else out * gate

        x = h + (mlp() if branches is None else branches(i, "mlp", mlp))
    return _norm(lm.model.norm, x, cond)[0]


def _cross_attend(
    attn, h: Tensor, pk: Tensor, pv: Tensor, cos: Tensor, sin: Tensor, seen: Tensor
) -> Tensor:
    """SmolVLA's cross-attention: queries from ``h`` (rotated at ``cos``/``sin``), keys and
    values the expert's projections of the prefix's cached (rotated) K/V, (B, KVH, S, hd)."""
    b, t, _ = h.shape
    q = attn.q_proj(h).view(b, t, attn.n_heads, attn.hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    s = pk.shape[2]
    flat_k = pk.transpose(1, 2).reshape(b, s, -1).to(h.dtype)  # (B, S, KVH * hd), heads outer
    flat_v = pv.transpose(1, 2).reshape(b, s, -1).to(h.dtype)
    k = attn.k_proj(flat_k).view(b, s, attn.n_kv, attn.hd).transpose(1, 2)
    v = attn.v_proj(flat_v).view(b, s, attn.n_kv, attn.hd).transpose(1, 2)
    return attn.attend(q, k, v, seen[:, None])


def _norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """(normed x, residual gate or None) from a plain or an adaptive (conditioned) norm."""
    return norm(x, cond) if cond is not None else (norm(x), None)


def decode_one(lm: LlamaLM, cache: KVCache, tokens: Tensor, positions: Tensor) -> Tensor:
    """One greedy decode step: tokens (B,) at positions (B,) -> the next tokens (B,)."""
    hidden = static_forward(lm, lm.embed(tokens[:, None]), positions[:, None], cache)
    return lm.logits(hidden[:, -1]).argmax(-1)


def iterate_logits(lm: LlamaLM, cache: KVCache, tokens: Tensor, positions: Tensor) -> Tensor:
    """One Jacobi iteration's forward: tokens (B, T) at positions (B, T) -> logits (B, T, V)
    of the tokens that follow each of them."""
    return lm.logits(static_forward(lm, lm.embed(tokens), positions, cache))


def check_room(cache: KVCache, lm: LlamaLM, last_position: Tensor) -> None:
    """The one host check of a decode call: its last position fits the cache and the context
    (the steps themselves never look)."""
    top = int(last_position.max())
    limit = min(cache.max_len, lm.cfg.max_positions)
    if top >= limit:
        raise ValueError(
            f"position {top} exceeds the context ({limit} tokens); "
            "shorten the instruction or raise max_positions"
        )


def dit_eps(head: nn.Module, noisy: Tensor, t: Tensor, cond: Tensor) -> Tensor:
    """One DDIM step's noise prediction of a DiT action head (CogACT): static already (no
    cache, fixed shapes); a function here so that it compiles like the other steps."""
    return head(noisy, t, cond)


StepFn = Callable[[LlamaLM, KVCache, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class DecodeSteps:
    """The static step functions a VLA runs its heads with (eager by default, see
    ``compile_steps``): greedy decode, a Jacobi iteration, a DiT denoising step and a flow
    expert's forward. Denoising with a feature cache (EfficientVLA) stays eager: its hook
    decides per step and layer in Python."""

    one: StepFn = decode_one
    iterate: StepFn = iterate_logits
    eps: Callable[..., Tensor] = dit_eps
    expert: Callable[..., Tensor] = expert_forward
    mode: str = "eager"
    # The prefill at a static shape (``prefill_forward``), or None: the general forward, which
    # also serves TRIAGE's plans, probes and a reused cache (eager: the general one serves all).
    prefill: Callable[..., Tensor] | None = None


def compile_steps(mode: str = "reduce-overhead", denoise: bool = True) -> DecodeSteps:
    """``torch.compile`` both steps with ``fullgraph=True`` and static shapes (one graph per
    (B, T): a VLA's decode shapes repeat every inference); ``denoise=False`` leaves the DiT /
    flow steps eager (on a CPU compiling them measured 1.00x on tiny-cogact and 0.30x on
    tiny-pi0: BENCHMARKS.md). ``reduce-overhead`` runs them as
    CUDA graphs on CUDA; the cache's tensors must then keep their addresses between calls
    (``mark_static``), as gpt-fast's model-owned cache does; ``fused`` is the CPU's
    (``FUSED_OPTIONS``). Compiled code is cached on disk by inductor (its cache folder,
    ``TORCHINDUCTOR_CACHE_DIR``): a second process with the same shapes loads it."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    kw = {"fullgraph": True, "dynamic": False}
    compile = lambda f: _or_eager(torch.compile(f, **kw), f)  # noqa: E731
    kw |= {"options": dict(FUSED_OPTIONS)} if mode == FUSED else {"mode": mode}
    one, iterate = (compile(f) for f in (decode_one, iterate_logits))
    prefill = compile(prefill_forward)
    if not denoise:  # e.g. on a CPU, where compiled denoising measured no faster
        return DecodeSteps(one, iterate, mode=mode, prefill=prefill)
    return DecodeSteps(
        one,
        iterate,
        compile(dit_eps),
        compile(expert_forward),
        mode,
        prefill,
    )


def _compile_failures() -> tuple[type[BaseException], ...]:
    """What a compile that cannot happen here raises: dynamo's wrapper of a backend's failure
    (no C++ compiler, a codegen error) and inductor's own errors."""
    import torch._dynamo.exc as dynamo_exc
    import torch._inductor.exc as inductor_exc

    names = ("InductorError", "CppCompileError", "InvalidCxxCompiler", "CppWrapperCodegenError")
    own = tuple(getattr(inductor_exc, n) for n in names if hasattr(inductor_exc, n))
    return (dynamo_exc.BackendCompilerFailed, *own)


def _or_eager(
    compiled: Callable[..., Tensor], eager: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``compiled``, or from its first failure to compile on, ``eager``, with one line on stderr:
    a machine without a working C++ compiler (or a backend that cannot lower a step) runs the
    same step eagerly rather than failing the inference. A compile fails before the step runs,
    so nothing (the KV cache) has been written when the eager step takes over."""
    state: dict[str, Callable[..., Tensor]] = {"fn": compiled}

    def step(*args, **kwargs) -> Tensor:
        try:
            return state["fn"](*args, **kwargs)
        except _compile_failures() as e:
            if state["fn"] is eager:
                raise
            state["fn"] = eager
            inner = getattr(e, "inner_exception", None) or e
            why = (str(inner).strip().splitlines() or [""])[0][:200]
            print(
                f"vlarun: compiling {step.__name__} failed ({type(inner).__name__}: {why}); "
                "running it eagerly",
                file=sys.stderr,
                flush=True,
            )
            return eager(*args, **kwargs)

    step.__name__ = getattr(eager, "__name__", "step")
    return step


def mark_static(cache: KVCache) -> KVCache:
    """Tell the compiler the cache's tensors live at fixed addresses (CUDA graphs replay on
    them instead of copying them in)."""
    for t in (cache.k, cache.v, cache.valid):
        torch._dynamo.mark_static_address(t)
    return cache
