"""What a hooked Policy's inferences did: per step, the token policy's decisions and the
prefill's FLOPs relative to full recompute of the unaccelerated LM.

A Policy running accelerator hooks (``Policy.with_setting`` / ``Policy.with_hooks``) appends
one ``StepStats`` to ``policy.stats`` per inference; ``policy.stats.summary()`` averages them.
Statistics survive ``reset()`` (an evaluation summarises every step of every episode).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from vlarun.models.hooks import StepInputs
from vlarun.models.llama import LlamaConfig
from vlarun.models.token_plan import TokenAction


@dataclass(frozen=True)
class StepStats:
    """What one inference did: decision counts and prefill FLOPs / full-recompute FLOPs."""

    recomputed: int
    reused: int
    pruned: int
    flops_ratio: float


@dataclass
class AccelStats:
    """The ``StepStats`` of every inference a hooked policy ran, oldest first."""

    steps: list[StepStats] = field(default_factory=list)

    def record(
        self, llm: LlamaConfig, reference: LlamaConfig, step: StepInputs, plan: object | None
    ) -> StepStats:
        """Count one inference: ``step`` the prefill's inputs, ``plan`` the token policy's last
        TokenPlan (None: everything recomputed), FLOPs against the ``reference`` LM."""
        nv = step.num_visual
        if plan is None:
            counts = {TokenAction.RECOMPUTE: nv, TokenAction.REUSE: 0, TokenAction.PRUNE: 0}
        else:
            counts = {d: int((plan.decisions[0] == d).sum()) for d in TokenAction}
        shared = None if plan is None else plan.last_shared_layer
        recomputed = counts[TokenAction.RECOMPUTE]
        ratio = prefill_flops_ratio(llm, reference, step.prefix.length, recomputed, nv, shared)
        s = StepStats(recomputed, counts[TokenAction.REUSE], counts[TokenAction.PRUNE], ratio)
        self.steps.append(s)
        return s

    def clear(self) -> None:
        self.steps.clear()

    def summary(self) -> dict:
        """Mean decisions and FLOPs ratio over the steps run so far ({"steps": 0}: none)."""
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
