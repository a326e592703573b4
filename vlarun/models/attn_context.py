"""The per-call attention context of the Llama decoder (``llama.LlamaLM.forward``): which
cached and own keys each query sees (the mask, built once per call or per layer when cache
validity differs by layer), the RoPE rows of the call's positions, and where its keys and
values are written into the cache. Kept apart from the layers so that the model file holds the
network and this one the bookkeeping the general modes (prefill, OFT's head, TRIAGE's partial
recompute) share. The decode, Jacobi and action-expert steps keep theirs in ``static_step``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlarun.models.kv_cache import KVCache


@dataclass
class Context:
    """Per-call tensors shared by all layers: RoPE tables, the mask, where to write the cache."""

    rope: tuple[Tensor, Tensor, torch.dtype]  # the model's (cos, sin) tables and compute dtype
    cos: Tensor  # (1 or B, 1, T, hd)
    sin: Tensor
    positions_bt: Tensor  # (B, T)
    local: Tensor  # (B, T, T) bool: visibility among the call's own tokens
    pad: Tensor  # (B, T) bool: False for padding
    hide_future: bool  # causal: cached slots after a query's position are invisible
    cache: KVCache | None
    kv_len: int
    aligned: bool = True  # every row writes the same positions (one index_copy_ per layer)
    mask: Tensor | None = None  # (B, 1, T, S), built lazily by the first layer that runs
    layered: bool = False  # cache validity differs by layer: build the mask per layer
    # What SDPA gets: None when every key is visible (plain decode), or None + is_causal when the
    # mask is exactly lower-triangular with S == T (plain prefill): no (B,1,T,S) float mask is
    # materialised per layer, and the causal kernel skips the upper triangle.
    sdpa_mask: Tensor | None = None
    sdpa_causal: bool = False

    @classmethod
    def build(
        cls,
        rope: tuple[Tensor, Tensor, torch.dtype],
        embeds: Tensor,
        positions: Tensor,
        cache: KVCache | None,
        causal: bool,
        attn_mask: Tensor | None,
        pad_mask: Tensor | None,
    ) -> Context:
        b, t, _ = embeds.shape
        dev = embeds.device
        pos_bt = positions.expand(b, t) if positions.ndim == 1 else positions
        if attn_mask is not None:
            local = attn_mask.to(dev).expand(b, t, t)
        elif causal:
            local = pos_bt[:, None, :] <= pos_bt[:, :, None]
        else:
            local = torch.ones(b, t, t, dtype=torch.bool, device=dev)
        pad = (
            torch.ones(b, t, dtype=torch.bool, device=dev) if pad_mask is None else pad_mask.to(dev)
        )
        eye = torch.eye(t, dtype=torch.bool, device=dev)
        local = (local & pad[:, None, :]) | eye  # a query always sees itself: no all-masked rows
        hide_future = causal and attn_mask is None
        kv_len = int(pos_bt.max()) + 1 if cache is not None else t
        cos, sin = rope_at(rope, positions)
        # One host sync per call instead of one per layer (in _write).
        aligned = cache is None or b == 1 or bool((pos_bt == pos_bt[:1]).all())
        layered = cache is not None and cache.layered
        return cls(
            rope,
            cos,
            sin,
            pos_bt,
            local,
            pad,
            hide_future,
            cache,
            kv_len,
            aligned,
            layered=layered,
        )

    def _build_mask(self, layer: int) -> Tensor:
        """(B, 1, T, S) visibility of the cached or own keys for each query."""
        b, t = self.pad.shape
        dev = self.pad.device
        if self.cache is not None:
            s = self.kv_len
            vis = self.cache.valid[layer, :, None, :s].expand(b, t, s).clone()
            if self.hide_future:
                vis &= torch.arange(s, device=dev)[None, None, :] <= self.positions_bt[:, :, None]
            # The call's own slots follow the local mask exactly.
            rows = torch.arange(b, device=dev)[:, None, None]
            qi = torch.arange(t, device=dev)[None, :, None]
            vis[rows, qi, self.positions_bt[:, None, :]] = self.local
        else:
            vis = self.local
        return vis[:, None]

    def keys_values(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this call's k/v into the cache; return all keys/values the call attends to.

        The mask is built once per call (per segment under a TokenPlan): validity is the same
        in every layer of a segment, so rebuilding it per layer would only cost time."""
        if self.cache is not None:
            kc, vc = self.cache.k[layer], self.cache.v[layer]  # (B, KVH, S, hd)
            write_kv(kc, vc, self.positions_bt, k, v, self.aligned)
            if self.aligned:
                self.cache.valid[layer].index_copy_(1, self.positions_bt[0], self.pad)
            else:
                rows = torch.arange(self.pad.shape[0], device=self.pad.device)[:, None]
                self.cache.valid[layer][rows, self.positions_bt] = self.pad
            k, v = kc[:, :, : self.kv_len], vc[:, :, : self.kv_len]
        if self.mask is None or self.layered:
            self.mask = self._build_mask(layer)
            self.sdpa_mask, self.sdpa_causal = sdpa_mask(self.mask)
        return k, v

    def subset(self, index: Tensor) -> Context:
        """The context for the deep layers, restricted to the tokens at ``index`` (B, T')."""
        rows = torch.arange(index.shape[0], device=index.device)[:, None, None]
        pos = self.positions_bt.gather(1, index)
        cos, sin = rope_at(self.rope, pos)
        local = self.local[rows, index[:, :, None], index[:, None, :]]
        return Context(
            self.rope,
            cos,
            sin,
            pos,
            local,
            self.pad.gather(1, index),
            self.hide_future,
            self.cache,
            self.kv_len,
            pos.shape[0] == 1 or bool((pos == pos[:1]).all()),
            layered=self.cache is not None and self.cache.layered,
        )


def rope_at(rope: tuple[Tensor, Tensor, torch.dtype], positions: Tensor) -> tuple[Tensor, Tensor]:
    """The RoPE cos / sin rows of ``positions``, shaped to broadcast over heads."""
    cos_table, sin_table, dtype = rope
    cos = cos_table[positions].to(dtype)
    sin = sin_table[positions].to(dtype)
    if positions.ndim == 1:
        return cos[None, None], sin[None, None]  # (1, 1, T, hd)
    return cos[:, None], sin[:, None]  # (B, 1, T, hd)


def sdpa_mask(mask: Tensor) -> tuple[Tensor | None, bool]:
    """(mask or None, is_causal) for SDPA, equivalent to the explicit (B, 1, T, S) bool mask.

    Checked once per call (two small reductions), not assumed from the arguments, so stale or
    padded cache slots can never be silently unmasked."""
    t, s = mask.shape[-2:]
    if bool(mask.all()):
        return None, False
    if t == s and t > 1:
        tril = torch.ones(t, s, dtype=torch.bool, device=mask.device).tril_()
        if bool((mask == tril).all()):
            return None, True
    return mask, False


def write_kv(kc: Tensor, vc: Tensor, pos: Tensor, k: Tensor, v: Tensor, aligned: bool) -> None:
    """Scatter k/v (B, KVH, T, hd) into the cache at positions pos (B, T)."""
    if aligned:  # common case: all rows aligned
        kc.index_copy_(2, pos[0], k)
        vc.index_copy_(2, pos[0], v)
        return
    for r in range(pos.shape[0]):
        kc[r].index_copy_(1, pos[r], k[r])
        vc[r].index_copy_(1, pos[r], v[r])
