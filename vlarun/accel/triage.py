"""TRIAGE: per visual token, recompute, reuse its cached K/V, or prune it (SEEDS.md section 3).

Exactly B visual tokens are recomputed each step. The idea: validity (has the token's cache
drifted?) decides whether a token that is not recomputed is reused or pruned; importance decides
where the limited recomputation goes, namely to important tokens whose caches are no longer
valid. All signals come from the shallow layers (0 .. ``layer``), which run on every token
anyway, so the decision costs no extra pass: the plan is a ``DeferredPlan`` decided inside the
prefill once layer ``layer`` has run.

  drift      relative change of the token's value vectors at ``layer`` since its last
             recompute, averaged over heads (the reference is anchored at the recompute, so
             slow changes accumulate);
  validity   has a cache, drift < delta, age (queries since the recompute) <= T;
  importance attention from the action-decoding query at ``layer`` plus a saliency memory:
             deep-layer attention recorded at the episode's first query and carried to later
             frames by patch correspondence (most cosine-similar projector output);
             never refreshed, so no later step runs a full-token query;
  budget     (1) maintenance: round(mu*B) oldest cached tokens outside the important set
             (top B + kappa); (2) mandatory: important tokens with invalid caches or that just
             entered the important set; (3) optional: important valid tokens, fastest drift
             first. Everything else is reused if valid, else pruned.

The episode's first query recomputes every token (there is no cache yet, and the saliency
memory is recorded then). ``rest="prune"`` / ``"reuse"`` give the drop-all / keep-all
baselines: same ranking, same B recomputed tokens, all others pruned / reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlarun.accel.base import (
    PlanLike,
    StepInputs,
    attention_scores,
    plan_from_masks,
    resolve_budget,
    top_mask,
)
from vlarun.models.llama import AttnProbe, ProbeResult
from vlarun.models.token_plan import DeferredPlan, TokenPlan
from vlarun.models.vla import PrefillResult

RESTS = ("validity", "prune", "reuse")


@dataclass(frozen=True)
class TriageConfig:
    """TRIAGE's knobs; the defaults are the paper's."""

    budget: int | None = None  # B, tokens recomputed per step (overrides budget_fraction)
    budget_fraction: float = 0.34  # B as a fraction of the visual tokens (paper: 88 / 256)
    delta: float = 0.3  # drift threshold of validity
    max_age: int = 10  # T: a cache older than this many queries is invalid
    kappa: int = 70  # important set = top B + kappa, kappa given for 256 visual tokens
    kappa_reference_tokens: int = 256  # kappa scales linearly with the visual token count
    mu: float = 0.06  # maintenance share of the budget
    memory_weight: float = 1.0  # lambda: weight of the carried saliency memory in importance
    layer: int = 2  # shallow layer of drift and importance = the plan's last shared layer
    rest: str = "validity"  # tokens not recomputed: by validity (TRIAGE), "prune", "reuse"

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"TRIAGE budget must be >= 1 token, got {self.budget}")
        if not 0.0 < self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")
        if self.delta < 0 or self.max_age < 0 or self.kappa < 0 or self.layer < 0:
            raise ValueError("delta, max_age, kappa and layer must be >= 0")
        if not 0.0 <= self.mu <= 1.0:
            raise ValueError(f"mu must be in [0, 1], got {self.mu}")
        if self.rest not in RESTS:
            raise ValueError(f"rest must be one of {RESTS}, got {self.rest!r}")

    def kappa_for(self, num_visual: int) -> int:
        return int(self.kappa * num_visual / self.kappa_reference_tokens + 0.5)


def value_drift(values: Tensor, reference: Tensor, eps: float = 1e-6) -> Tensor:
    """(B, KVH, Nv, hd) now and at the last recompute -> (B, Nv) relative change, head mean."""
    change = (values.float() - reference.float()).norm(dim=-1)
    return (change / reference.float().norm(dim=-1).clamp_min(eps)).mean(dim=1)


def carry_memory(memory: Tensor, memory_feats: Tensor, visual: Tensor) -> Tensor:
    """Saliency of each current token = that of its most similar first-frame token.

    memory (B, Nv); memory_feats (B, Nv, d) unit-norm projector outputs of the first frame;
    visual (B, Nv, d) current projector outputs -> (B, Nv)."""
    now = torch.nn.functional.normalize(visual.float(), dim=-1)
    match = (now @ memory_feats.transpose(1, 2)).argmax(dim=-1)  # (B, Nv)
    return memory.gather(1, match)


def fill_budget(
    budget: int,
    important: Tensor,
    has_cache: Tensor,
    valid: Tensor,
    newly: Tensor,
    age: Tensor,
    drift: Tensor,
    importance: Tensor,
    mu: float,
) -> Tensor:
    """(Nv,) bool: the ``budget`` tokens to recompute, in TRIAGE's priority order.

    (1) maintenance: round(mu * budget) oldest cached tokens outside the important set;
    (2) mandatory: important tokens with an invalid cache or new to the important set, most
        important first; (3) optional refresh: important valid tokens, fastest drift first.
    If those run out (an important set smaller than the budget), the most important of the
    remaining tokens fill it, so exactly ``budget`` tokens are always recomputed."""
    budget = min(budget, important.numel())
    chosen = torch.zeros_like(important)
    n_maint = min(int(mu * budget + 0.5), budget)
    # Older first; among equally old, lower index first (stable sort).
    chosen |= top_mask(age.float(), n_maint, has_cache & ~important)
    for allowed, score in (
        (important & (~valid | newly), importance),
        (important & valid, drift),
        (torch.ones_like(important), importance),
    ):
        left = budget - int(chosen.sum())
        if left <= 0:
            break
        chosen |= top_mask(score, left, allowed & ~chosen)
    return chosen


@dataclass
class _Episode:
    """Per-episode state, one row per batch element; Nv tokens each."""

    query: int  # index of the next query within the episode
    reference: Tensor  # (B, KVH, Nv, hd) layer values at each token's last recompute
    last_recompute: Tensor  # (B, Nv) query index of the last recompute
    has_cache: Tensor  # (B, Nv) bool: deep-layer K/V present (pruning removes it)
    important: Tensor  # (B, Nv) bool: the previous query's important set
    memory: Tensor  # (B, Nv) deep saliency of the first query (sums to 1)
    memory_feats: Tensor  # (B, Nv, d) unit-norm projector outputs of the first frame


class Triage:
    """The TRIAGE token policy (and, with ``rest``, its drop-all / keep-all variants)."""

    def __init__(self, cfg: TriageConfig | None = None, name: str | None = None) -> None:
        self.cfg = cfg or TriageConfig()
        self.name = (
            name or {"validity": "triage", "prune": "drop-all", "reuse": "keep-all"}[self.cfg.rest]
        )
        self.state: _Episode | None = None
        self.last_plan: TokenPlan | None = None
        self.last_signals: dict[str, Tensor] = {}  # drift, valid, importance of the last query

    def reset(self) -> None:
        self.state, self.last_plan, self.last_signals = None, None, {}

    # -- per step -----------------------------------------------------------------------------

    def begin(self, step: StepInputs) -> tuple[PlanLike, AttnProbe | None]:
        query = step.action_query_index()
        if self.state is None:
            # First query: every token recomputed; record deep saliency at the last layer.
            self.last_plan = None
            return None, step.probe(step.num_layers - 1, query)
        carried = carry_memory(self.state.memory, self.state.memory_feats, step.visual)

        def decide(probe: ProbeResult | None) -> TokenPlan:
            return self._decide(step, probe, carried)

        return DeferredPlan(self.cfg.layer, decide), step.probe(self.cfg.layer, query)

    def end(self, step: StepInputs, pre: PrefillResult) -> None:
        if self.state is not None:
            return
        deep = attention_scores(pre.lm.probe.probs)  # (B, Nv)
        vis = slice(step.vis_start, step.vis_start + step.num_visual)
        b, nv = step.batch, step.num_visual
        self.state = _Episode(
            query=1,
            reference=pre.cache.v[self.cfg.layer][:, :, vis].clone(),
            last_recompute=torch.zeros(b, nv, dtype=torch.long, device=deep.device),
            has_cache=torch.ones(b, nv, dtype=torch.bool, device=deep.device),
            # Everything was just computed with full context: nothing is "new" next query.
            important=torch.ones(b, nv, dtype=torch.bool, device=deep.device),
            memory=deep / deep.sum(dim=1, keepdim=True).clamp_min(1e-12),
            memory_feats=torch.nn.functional.normalize(step.visual.float(), dim=-1),
        )

    def _decide(self, step: StepInputs, probe: ProbeResult, carried: Tensor) -> TokenPlan:
        cfg, st = self.cfg, self.state
        nv = step.num_visual
        budget = resolve_budget(cfg.budget, cfg.budget_fraction, nv)
        shallow = attention_scores(probe.probs)
        importance = _unit_sum(shallow) + cfg.memory_weight * _unit_sum(carried)
        drift = value_drift(probe.values, st.reference)
        age = st.query - st.last_recompute
        valid = st.has_cache & (drift < cfg.delta) & (age <= cfg.max_age)
        n_important = min(nv, budget + cfg.kappa_for(nv))
        important = torch.stack([top_mask(row, n_important) for row in importance])
        newly = important & ~st.important
        recompute = torch.stack(
            [
                fill_budget(
                    budget,
                    important[r],
                    st.has_cache[r],
                    valid[r],
                    newly[r],
                    age[r],
                    drift[r],
                    importance[r],
                    cfg.mu,
                )
                for r in range(step.batch)
            ]
        )
        if cfg.rest == "validity":
            reuse = ~recompute & valid
        elif cfg.rest == "reuse":
            reuse = ~recompute & st.has_cache
        else:
            reuse = torch.zeros_like(recompute)
        self._update(probe.values, recompute, reuse, important)
        self.last_signals = {
            "drift": drift,
            "valid": valid,
            "importance": importance,
            "important": important,
            "age": age,
        }
        self.last_plan = plan_from_masks(step.vis_start, recompute, reuse, cfg.layer)
        return self.last_plan

    def _update(self, values: Tensor, recompute: Tensor, reuse: Tensor, important: Tensor) -> None:
        st = self.state
        rows, cols = recompute.nonzero(as_tuple=True)
        st.reference[rows, :, cols] = values[rows, :, cols].to(st.reference.dtype)
        st.last_recompute[recompute] = st.query
        st.has_cache = recompute | reuse  # pruned tokens lose their deep K/V in the engine
        st.important = important
        st.query += 1


def _unit_sum(x: Tensor) -> Tensor:
    """Rows scaled to sum 1, so shallow attention and carried saliency weigh alike."""
    return x / x.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def drop_all(cfg: TriageConfig | None = None) -> Triage:
    """Baseline ``drop-all``: TRIAGE's ranking and recomputed set, every other token pruned."""
    return Triage(_with_rest(cfg, "prune"))


def keep_all(cfg: TriageConfig | None = None) -> Triage:
    """Baseline ``keep-all``: TRIAGE's ranking and recomputed set, every other token reused."""
    return Triage(_with_rest(cfg, "reuse"))


def _with_rest(cfg: TriageConfig | None, rest: str) -> TriageConfig:
    import dataclasses

    return dataclasses.replace(cfg or TriageConfig(), rest=rest)
