"""TRIAGE: budget fill order on hand-built cases, and its two limits against the engine."""

import pytest
import torch

from vlarun.accel.triage import (
    Triage,
    TriageConfig,
    carry_memory,
    drop_all,
    fill_budget,
    keep_all,
    value_drift,
)
from vlarun.models.token_plan import TokenAction


def _fill(budget, important, has_cache, valid, newly, age, drift, importance, mu=0.0):
    t = lambda xs, dt=torch.bool: torch.tensor(xs, dtype=dt)  # noqa: E731
    f = torch.float
    mask = fill_budget(
        budget,
        t(important),
        t(has_cache),
        t(valid),
        t(newly),
        t(age, torch.long),
        t(drift, f),
        t(importance, f),
        mu,
    )
    return mask.nonzero().flatten().tolist()


# Eight tokens; 0-3 important. Token 1 is invalid (mandatory), token 2 newly important
# (mandatory), tokens 0 and 3 valid (optional, drift 0.1 and 0.25). Outside the important set,
# tokens 4-7 are cached with ages 1, 7, 3, 9.
CASE = dict(
    important=[1, 1, 1, 1, 0, 0, 0, 0],
    has_cache=[1, 1, 1, 1, 1, 1, 1, 1],
    valid=[1, 0, 1, 1, 1, 1, 1, 1],
    newly=[0, 0, 1, 0, 0, 0, 0, 0],
    age=[2, 2, 1, 2, 1, 7, 3, 9],
    drift=[0.1, 0.4, 0.05, 0.25, 0.0, 0.0, 0.0, 0.0],
    importance=[0.9, 0.2, 0.5, 0.8, 0.1, 0.1, 0.1, 0.1],
)


def test_fill_mandatory_before_optional_and_optional_by_drift():
    assert _fill(2, **CASE) == [1, 2]  # the two mandatory tokens, not the more important 0/3
    assert _fill(3, **CASE) == [1, 2, 3]  # then the fastest-drifting valid one (3: 0.25)
    assert _fill(4, **CASE) == [0, 1, 2, 3]


def test_fill_maintenance_takes_the_oldest_cached_unimportant_tokens_first():
    # mu = 0.5 of 4 = 2 maintenance slots: tokens 7 (age 9) and 5 (age 7); then mandatory 1, 2.
    assert _fill(4, **CASE, mu=0.5) == [1, 2, 5, 7]
    # Uncached tokens are never maintenance candidates.
    case = CASE | {"has_cache": [1, 1, 1, 1, 1, 1, 1, 0]}
    assert _fill(4, **case, mu=0.5) == [1, 2, 5, 6]


def test_fill_mandatory_over_budget_goes_by_importance():
    case = CASE | {"valid": [0, 0, 0, 0, 1, 1, 1, 1], "newly": [0] * 8}
    assert _fill(2, **case) == [0, 3]  # importance 0.9 and 0.8


def test_fill_is_exact_even_when_the_important_set_is_short():
    assert len(_fill(6, **CASE)) == 6  # 4 important + the 2 most important of the rest


def test_drift_and_memory_correspondence():
    ref = torch.ones(1, 2, 3, 4)
    now = ref.clone()
    now[0, :, 1] *= 1.5  # token 1 changed by 50% in both heads
    now[0, 0, 2] *= 1.2  # token 2 by 20% in one head: 10% on average
    assert torch.allclose(value_drift(now, ref), torch.tensor([[0.0, 0.5, 0.1]]))
    feats = torch.eye(3)[None]  # first frame: three orthogonal tokens
    memory = torch.tensor([[0.7, 0.2, 0.1]])
    moved = torch.eye(3)[[2, 0, 1]][None]  # each token now looks like another first-frame token
    assert torch.equal(carry_memory(memory, feats, moved), memory[:, [2, 0, 1]])


def test_budget_of_all_tokens_equals_full_recompute(oft_policy, frames, actions):
    nv = oft_policy.model.cfg.num_visual
    full = actions(oft_policy, frames)
    triage = oft_policy.with_hooks(Triage(TriageConfig(budget=nv)))
    got = actions(triage, frames)
    assert max((a - b).abs().max().item() for a, b in zip(got, full, strict=True)) <= 1e-5
    assert all(s.recomputed == nv for s in triage.stats.steps)


def test_every_cache_invalid_equals_drop_all(oft_policy, frames, instruction):
    """delta = 0: no drift is below it, so no cache is valid and nothing is reused."""
    cfg = TriageConfig(budget_fraction=0.25, delta=0.0)
    triage, dropped = oft_policy.with_hooks(Triage(cfg)), oft_policy.with_hooks(drop_all(cfg))
    plans = []
    for f in frames:
        a = triage.run_stages(f, instruction).outputs["actions"]
        b = dropped.run_stages(f, instruction).outputs["actions"]
        assert torch.equal(a, b)
        plans.append((triage.hooks.tokens.last_plan, dropped.hooks.tokens.last_plan))
    for p, q in plans[1:]:
        assert torch.equal(p.decisions, q.decisions)
        assert not (p.decisions == TokenAction.REUSE).any()
        assert int((p.decisions == TokenAction.RECOMPUTE).sum()) == 16  # 25% of 64, every step


def test_budget_is_exact_and_rest_follows_validity(oft_policy, frames, instruction):
    triage = oft_policy.with_hooks(Triage(TriageConfig(budget=10)))
    for f in frames:
        triage.run_stages(f, instruction)
        plan, sig = triage.hooks.tokens.last_plan, triage.hooks.tokens.last_signals
        if plan is None:
            continue  # the episode's first query recomputes everything
        d = plan.decisions[0]
        assert int((d == TokenAction.RECOMPUTE).sum()) == 10
        rest = d != TokenAction.RECOMPUTE
        assert torch.equal((d == TokenAction.REUSE)[rest], sig["valid"][0][rest])


def test_keep_all_never_prunes_and_age_limit_invalidates(oft_policy, frames, actions):
    kept = oft_policy.with_hooks(keep_all(TriageConfig(budget=8)))
    actions(kept, frames)
    assert all(s.pruned == 0 for s in kept.stats.steps) and kept.stats.steps[-1].reused == 56
    aged = oft_policy.with_hooks(Triage(TriageConfig(budget=8, max_age=0)))
    actions(aged, frames)
    assert all(s.reused == 0 for s in aged.stats.steps)


def test_state_resets_on_new_episode(oft_policy, frames, actions, instruction):
    policy = oft_policy.with_hooks(Triage(TriageConfig(budget=8)))
    actions(policy, frames[:3])
    assert policy.hooks.tokens.state.query == 3
    policy.reset()
    assert policy.hooks.tokens.state is None
    policy.run_stages(frames[0], instruction)
    tokens = policy.hooks.tokens
    assert tokens.last_plan is None and tokens.state.query == 1  # full again
    policy.run_stages(frames[1], "open the drawer")  # a new instruction is a new episode
    assert policy.hooks.tokens.state.query == 1


def test_config_is_validated():
    with pytest.raises(ValueError, match="rest"):
        TriageConfig(rest="sometimes")
    with pytest.raises(ValueError, match="budget_fraction"):
        TriageConfig(budget_fraction=0.0)
    assert TriageConfig().kappa_for(256) == 70 and TriageConfig().kappa_for(64) == 18
