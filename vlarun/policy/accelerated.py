"""An accelerated policy = a Policy whose stage graph runs with hooks: a token policy, a token
decoder, a denoising feature cache (``vlarun.stages.hooks``). There is one executor: the stage
graph runs plain and accelerated inference alike.

``AcceleratedPolicy`` is used wherever a ``Policy`` is: it has the same ``run_stages``,
``predict`` and ``unnormalize``, so closed-loop evaluation (``sim.evaluate.run_episode``) and
action fidelity (``sim.fidelity.policy_candidate``) take it unchanged. Unlike the plain
policy its hooks keep the LM's KV cache from one step to the next, which is what lets token
policies reuse it, and so it has per-episode state: call ``reset()`` before each new episode (a
changed instruction resets it automatically).

Model transforms (layer pruning, MLP sparsity) return a new model; wrap a Policy holding the
transformed model. Per-step statistics (decisions, FLOPs of the prefill relative to full
recompute of the reference model) accumulate in ``steps``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from vlarun.accel.base import FullRecompute, StepInputs, TokenDecoder, TokenPolicy
from vlarun.models.dit_head import DenoiseFeatureCache
from vlarun.models.llama import LlamaConfig
from vlarun.models.token_plan import TokenAction, TokenPlan
from vlarun.stages.families import Workload, build_graph
from vlarun.stages.graph import GraphRun, StageGraph
from vlarun.stages.hooks import Hooks


@dataclass
class StepStats:
    """What one inference did: decision counts and prefill FLOPs / full-recompute FLOPs."""

    recomputed: int
    reused: int
    pruned: int
    flops_ratio: float


@dataclass
class AcceleratedPolicy:
    """A ``Policy`` whose stage graph runs with accelerator hooks: the prefill follows
    ``tokens``, an autoregressive head decodes with ``decoder``, a DiT / flow denoiser uses
    ``denoise_cache``. Inference is the stage graph's, exactly as ``Policy.run_stages``
    (per-stage timings and packet bytes, optional serialisation between stages).

    base: the wrapped Policy (its model may already be transformed, e.g. layer-pruned);
    tokens: the visual-token policy (default: full recompute);
    denoise_cache: makes a fresh ``DenoiseFeatureCache`` per inference (DiT or flow expert);
    reference: the unaccelerated LM shape FLOPs ratios are measured against (default: base's);
    decoder: how an autoregressive head decodes its action tokens after the prefill (default:
        greedy ``VLA.decode_tokens``), e.g. ``jacobi.JacobiDecoder``; it sees the same prefix cache.
    """

    base: object  # vlarun.policy.base.Policy (duck-typed: model, tokenizer, norm)
    tokens: TokenPolicy = field(default_factory=FullRecompute)
    denoise_cache: Callable[[], DenoiseFeatureCache] | None = None
    reference: LlamaConfig | None = None
    decoder: TokenDecoder | None = None
    steps: list[StepStats] = field(default_factory=list)
    _instruction: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.denoise_cache is not None and self.model.cfg.family not in ("diffusion", "flow"):
            raise ValueError("denoise_cache needs a diffusion (DiT) or flow (action expert) policy")
        if self.decoder is not None and self.model.cfg.family != "autoregressive":
            raise ValueError("a token decoder needs an autoregressive (action-token) policy")
        self.hooks = Hooks(self.tokens, self.decoder, self.denoise_cache)
        self._graphs: dict[tuple[int, str], StageGraph] = {}

    # -- Policy's surface ---------------------------------------------------------------------

    @property
    def model(self):
        return self.base.model

    @property
    def tokenizer(self):
        return self.base.tokenizer

    @property
    def norm(self):
        return self.base.norm

    @property
    def name(self) -> str:
        return self.tokens.name

    def unnormalize(self, actions: Tensor) -> np.ndarray:
        return self.base.unnormalize(actions)

    def observation(self, obs: dict) -> tuple[np.ndarray, np.ndarray | None]:
        return self.base.observation(obs)

    def predict(self, image: np.ndarray, instruction: str, **kw) -> np.ndarray:
        return self.unnormalize(self.run_stages(image, instruction, **kw).outputs["actions"][0])

    def reset(self) -> None:
        """A new episode: forget the KV cache and the token policy's and decoder's state."""
        self.hooks.reset()

    # -- one inference --------------------------------------------------------------------------

    def graph(self, text_tokens: int) -> StageGraph:
        """The stage graph this policy runs for a prompt of ``text_tokens`` (built once)."""
        dtype = "bfloat16" if self.model.dtype == torch.bfloat16 else "float32"
        key = (text_tokens, dtype)
        if key not in self._graphs:
            w = Workload(1, text_tokens, dtype)
            self._graphs[key] = build_graph(self.model.cfg, self.model, w, self.hooks)
        return self._graphs[key]

    @torch.no_grad()
    def run_stages(
        self,
        image: np.ndarray,
        instruction: str,
        *,
        state: np.ndarray | None = None,
        seed: int = 0,
        serialize: bool = False,
    ) -> GraphRun:
        """One inference through the stage graph with this policy's hooks; ``serialize``
        encodes and decodes every stage's input packet, as crossing a network would."""
        if instruction != self._instruction:
            self.reset()
            self._instruction = instruction
        packet, ids = self.base.inputs(image, instruction, state, seed)
        run = self.graph(len(ids)).run(packet, serialize=serialize)
        self.steps.append(self._stats(self.hooks.last_step))
        return run

    # -- bookkeeping ------------------------------------------------------------------------------

    def _stats(self, step: StepInputs) -> StepStats:
        plan = getattr(self.tokens, "last_plan", None)
        nv = step.num_visual
        if plan is None:
            counts = {TokenAction.RECOMPUTE: nv, TokenAction.REUSE: 0, TokenAction.PRUNE: 0}
        else:
            counts = {d: int((plan.decisions[0] == d).sum()) for d in TokenAction}
        ratio = prefill_flops_ratio(
            self.model.cfg.llm,
            self.reference or self.model.cfg.llm,
            step.prefix.length,
            counts[TokenAction.RECOMPUTE],
            nv,
            None if plan is None else plan.last_shared_layer,
        )
        return StepStats(counts[TokenAction.RECOMPUTE], counts[TokenAction.REUSE],
                         counts[TokenAction.PRUNE], ratio)  # fmt: skip

    def summary(self) -> dict:
        """Mean decisions and FLOPs ratio over the steps run so far."""
        if not self.steps:
            return {"steps": 0}
        mean = lambda k: float(np.mean([getattr(s, k) for s in self.steps]))  # noqa: E731
        return {"steps": len(self.steps)} | {
            k.name: mean(k.name) for k in dataclasses.fields(StepStats)
        }


def prefill_flops_ratio(
    llm: LlamaConfig,
    reference: LlamaConfig,
    prefix_len: int,
    recomputed: int,
    num_visual: int,
    last_shared_layer: int | None,
) -> float:
    """Prefill FLOPs under a plan over full recompute of ``reference`` (the unpruned LM), as the
    engine executes it (tested against a FLOP-counted forward).

    Shared layers process all tokens; deeper ones only the recomputed visual and all text
    tokens. Their attention runs over every key slot of the cache: reused keys are attended,
    and pruned ones are masked out, not removed, so they cost attention FLOPs too: reuse and
    prune cost the same here."""
    full = reference.flops(prefix_len)
    if last_shared_layer is None:
        return llm.flops(prefix_len) / full
    split = min(last_shared_layer + 1, llm.num_layers)
    kept = prefix_len - num_visual + recomputed
    visible = prefix_len
    shallow = llm.flops(prefix_len, layers=split)
    deep = llm.flops(kept, context=(visible + 1) / 2, layers=llm.num_layers - split)
    return (shallow + deep) / full


def accelerate(policy, tokens: TokenPolicy | None = None, **kw) -> AcceleratedPolicy:
    """``policy`` with a token policy (and optional ``denoise_cache=``, ``reference=``)."""
    return AcceleratedPolicy(policy, tokens or FullRecompute(), **kw)


def full_plan_like(step: StepInputs, last_shared_layer: int) -> TokenPlan:
    """A plan that recomputes everything (keeps the cache, unlike no plan)."""
    return TokenPlan.full(step.batch, step.vis_start, step.num_visual, last_shared_layer)
