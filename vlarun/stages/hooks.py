"""Per-request accelerator hooks the stage functions call: the one executor runs plain and
accelerated inference alike.

``Hooks`` holds a token policy (TRIAGE, FastV, VLA-Cache, ...), a token decoder (Jacobi, early
exit) and a denoiser feature-cache factory, plus the KV cache the token policy reuses across
control steps. That state belongs to one stream of requests (one robot's episode), so a
``Hooks`` is made per stream and ``reset()`` at an episode boundary. No hook is a branch in
model code: the stage functions call the engine's public hooks (TokenPlan, AttnProbe, the
decoder and feature-cache protocols).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from vlarun.models.dit_head import DenoiseFeatureCache
from vlarun.models.hooks import StepInputs, TokenDecoder, TokenPolicy
from vlarun.models.llama import KVCache
from vlarun.models.vla import VLA, PrefillResult, Prefix


@dataclass
class Hooks:
    """What an accelerator setting plugs into the stages (each None: the plain path)."""

    tokens: TokenPolicy | None = None
    decoder: TokenDecoder | None = None
    denoise_cache: Callable[[], DenoiseFeatureCache] | None = None
    cache: KVCache | None = field(default=None, repr=False)  # kept across steps for reuse
    last_step: StepInputs | None = field(default=None, repr=False)

    @property
    def needs_images(self) -> bool:
        """Token policies see the frame (VLA-Cache compares patches), so the prefill stage
        takes the images too."""
        return self.tokens is not None

    def reset(self, part: str | None = None) -> None:
        """A new episode: forget the KV cache and every hook's own state. ``part`` ("tokens"
        or "decoder") forgets only that hook's state (the tokens' includes the KV cache): what
        a stream does when that stage last ran on the other side and its state here is stale."""
        if part not in (None, "tokens", "decoder"):
            raise ValueError(f"part must be None, 'tokens' or 'decoder', got {part!r}")
        if part in (None, "tokens"):
            self.cache, self.last_step = None, None
            if self.tokens is not None:
                self.tokens.reset()
        if part in (None, "decoder") and self.decoder is not None:
            self.decoder.reset()

    def prefill(self, model: VLA, prefix: Prefix, images: Tensor, visual: Tensor) -> PrefillResult:
        """The prefill under the token policy: it plans on this step's inputs, the engine
        executes the plan on the cache kept from the previous step, the policy sees the result."""
        cfg = model.cfg
        views = tuple(cfg.tokens_of_view(v) for v in range(cfg.num_images))
        step = StepInputs(images, visual, prefix, cfg.llm.num_layers, views, cfg.vis_start)
        need = prefix.length + model.cfg.action_token_room
        if self.cache is None or self.cache.max_len != need:
            self.cache = model.language_model.new_cache(prefix.pad.shape[0], need)
            self.tokens.reset()  # no cache to reuse: the policy starts over
        plan, probe = self.tokens.begin(step)
        pre = model.prefill(prefix, self.cache, plan=plan, probe=probe)
        self.tokens.end(step, pre)
        self.last_step = step
        return pre
