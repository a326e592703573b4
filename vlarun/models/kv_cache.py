"""The decoder's KV cache: preallocated, indexed by absolute position, with a per-layer, per-row
validity mask (gpt-fast's static cache, plus what partial recompute needs).

Writing by position (``k[:, :, pos] = ...``) rather than appending is what lets a decode step
be one static-shape function, a Jacobi iteration rewrite the tokens it guessed, and a token plan
keep reused tokens' entries while the deep layers skip them.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class CacheShape(Protocol):
    """What the cache needs of a decoder's config (``LlamaConfig`` has it)."""

    num_layers: int
    num_kv_heads: int
    max_positions: int

    @property
    def hd(self) -> int: ...


class KVCache:
    """Preallocated keys/values indexed by absolute position, with a per-slot validity mask.

    k, v: (L, B, KVH, S, hd); valid: (L, B, S). A slot is valid once a token at that position was
    written in that layer. Validity is per layer because partial recompute prunes tokens from
    deep layers only, and per row because left-padded batches have holes.
    """

    def __init__(
        self,
        cfg: CacheShape,
        batch: int,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        max_len = cfg.max_positions if max_len is None else max_len
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.hd)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(cfg.num_layers, batch, max_len, dtype=torch.bool, device=device)
        # True once validity may differ between layers (a TokenPlan pruned tokens from the deep
        # layers only); attention masks are then built per layer instead of once per call.
        self.layered = False

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def reset(self) -> None:
        self.valid.zero_()
        self.layered = False

    def invalidate_from(self, position: int) -> None:
        """Forget every slot at or after ``position`` (e.g. last step's action tokens)."""
        self.valid[:, :, position:] = False

    def export(self, length: int) -> tuple[Tensor, Tensor, Tensor]:
        """The first ``length`` slots as dense tensors (k, v, valid), e.g. for a packet."""
        return (
            self.k[:, :, :, :length].contiguous(),
            self.v[:, :, :, :length].contiguous(),
            self.valid[:, :, :length].contiguous(),
        )

    @classmethod
    def from_export(
        cls, cfg: CacheShape, k: Tensor, v: Tensor, valid: Tensor, max_len: int
    ) -> KVCache:
        """Rebuild a cache with room for ``max_len`` positions from ``export`` output."""
        length = k.shape[3]
        if max_len < length:
            raise ValueError(f"max_len {max_len} is shorter than the exported {length} slots")
        cache = cls(cfg, k.shape[1], max_len, k.dtype, k.device)
        cache.k[:, :, :, :length] = k
        cache.v[:, :, :, :length] = v
        cache.valid[:, :, :length] = valid
        cache.layered = bool((valid != valid[:1]).any())
        return cache

    def filled_length(self) -> int:
        """One past the highest valid position (0 if empty)."""
        any_valid = self.valid.any(dim=0).any(dim=0)
        idx = torch.nonzero(any_valid)
        return int(idx[-1]) + 1 if len(idx) else 0
