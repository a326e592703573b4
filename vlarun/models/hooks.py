"""The hooks contract between the engine's executor and every accelerator.

A token policy is asked once per control step what the language model should do with each
visual token. It answers before the prefill with a ``TokenPlan`` (decided up front), a
``DeferredPlan`` (decided after the shared shallow layers, from that step's attention probe), or
None (full recompute, which also resets the KV cache), plus an optional ``AttnProbe``. After the
prefill it sees the result, so it can record what it needs for the next step (drift references,
saliency, which tokens still have a cache). Policies hold per-episode state; ``reset`` clears it.
A token decoder turns a prefill into action tokens (greedy, Jacobi, ...).

These are protocols: the stage graph (``vlarun.stages``) calls them, ``vlarun.accel``
implements them, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from vlarun.models.llama import AttnProbe
from vlarun.models.token_plan import DeferredPlan, TokenPlan
from vlarun.models.vla import PrefillResult, Prefix

PlanLike = TokenPlan | DeferredPlan | None


@dataclass
class StepInputs:
    """What a token policy sees at one control step, before the LM runs.

    images: (B, n_img, 3, H, W) floats in [0, 1]; visual: (B, Nv, d) projector outputs;
    prefix: the LM input ([BOS, visual, text, pad]); num_layers: LM depth; view_tokens: the
    visual tokens of each view in order (they differ when a view is pooled; None: the views
    split Nv evenly).
    """

    images: Tensor
    visual: Tensor
    prefix: Prefix
    num_layers: int
    view_tokens: tuple[int, ...] | None = None
    vis_start: int = 1  # index of the first visual token (VLAConfig.vis_start)

    def tokens_of_views(self) -> tuple[int, ...]:
        if self.view_tokens is not None:
            return self.view_tokens
        n = self.images.shape[1]
        return (self.num_visual // n,) * n

    @property
    def num_visual(self) -> int:
        return int(self.visual.shape[1])

    @property
    def batch(self) -> int:
        return int(self.visual.shape[0])

    def action_query_index(self) -> Tensor:
        """Index of the token that decodes the action: each row's last prompt token.

        Autoregressive and diffusion heads read exactly this token; for OFT and flow heads the
        action queries only exist after the prefill, so their last prompt token is the proxy
        (it sees the whole prompt, as those queries do). Batched rows must share it."""
        last = self.prefix.last
        if bool((last != last[0]).any()):
            raise ValueError("rows with different prompt lengths need separate token policies")
        return last[:1].clone()

    def text_query_index(self) -> Tensor:
        """Indices of the instruction tokens (after the visual block, up to the last one)."""
        start = self.vis_start + self.num_visual
        return torch.arange(start, int(self.prefix.last[0]) + 1)

    def probe(self, layer: int, queries: Tensor) -> AttnProbe:
        """A probe of ``queries`` attending to the visual tokens at ``layer``."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(
                f"layer {layer} does not exist in a {self.num_layers}-layer LM; "
                "choose a shallower layer for the token policy"
            )
        return AttnProbe(layer, queries, self.vis_start, self.vis_start + self.num_visual)


class TokenPolicy(Protocol):
    """A per-step visual-token policy (full, TRIAGE, FastV, VLA-Cache, ...)."""

    name: str

    def reset(self) -> None:
        """Forget per-episode state (a new episode starts)."""

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        """The plan (or None: full recompute) and the probe for this step's prefill."""

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        """See the prefill's result (cache, probe) after it ran."""


class TokenDecoder(Protocol):
    """How an autoregressive head turns a prefill into action tokens (greedy, Jacobi, ...).

    Decoders read and extend the prefix KV cache in ``pre`` and may keep per-episode state."""

    name: str

    def reset(self) -> None:
        """Forget per-episode state (a new episode starts)."""

    def decode(self, model, pre: PrefillResult, forced: Tensor | None = None) -> Tensor:
        """Action token ids (B, n) after the prefill ``pre`` of ``model`` (a VLA); ``forced``
        (B, m): the first m ids are these, never decoded (real-time chunking's frozen actions;
        see ``VLA.decode_tokens``), and the decoder works on the n - m after them."""


class ChunkInpainter(Protocol):
    """Real-time chunking's per-request freeze, made from a batch's request tensors
    (``accel.rtc.Inpainter``): each row carries the previous chunk's queued actions
    ``previous`` (B, H, A) in the model's action space, its delay d ``delay`` (B,) and its
    execution horizon s ``execution_horizon`` (B,). Rows may differ in d and s."""

    def step_hook(self, previous: Tensor, delay: Tensor, execution_horizon: Tensor):
        """A denoising step hook (``dit_head.DenoiseStepHook``) freezing each row's first d
        actions and guiding its overlap (diffusion and flow heads)."""
        ...

    def forced_tokens(self, tokenizer, previous: Tensor, delay: Tensor) -> Tensor:
        """The forced prefix of action token ids (B, d * A) that freezes the first d actions
        (action-token heads; every row must share d)."""
        ...
