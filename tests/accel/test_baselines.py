"""Each baseline's plan on a hand-built case, and each running as a policy."""

import dataclasses

import numpy as np
import pytest
import torch

from vlarun.accel.base import FullRecompute, StepInputs
from vlarun.accel.baselines import (
    EfficientVLATokens,
    FastV,
    FastVConfig,
    VLACache,
    VLACacheConfig,
    fastv_plan,
    patch_similarity,
    task_aware_selection,
    vla_cache_masks,
)
from vlarun.models.token_plan import TokenAction
from vlarun.models.vla import Prefix

R, U, P = int(TokenAction.RECOMPUTE), int(TokenAction.REUSE), int(TokenAction.PRUNE)


def _step(nv: int = 6) -> StepInputs:
    prefix = Prefix(
        torch.zeros(1, nv + 4, 8), torch.ones(1, nv + 4, dtype=torch.bool), torch.tensor([nv + 3])
    )
    return StepInputs(torch.zeros(1, 1, 3, 8, 8), torch.zeros(1, nv, 8), prefix, num_layers=4)


def test_fastv_keeps_the_most_attended_tokens():
    scores = torch.tensor([[0.1, 0.5, 0.05, 0.3, 0.02, 0.03]])
    plan = fastv_plan(_step(), scores, FastVConfig(budget=2, layer=1))
    assert plan.decisions.tolist() == [[P, R, P, R, P, P]]
    assert plan.vis_start == 1 and plan.last_shared_layer == 1


def test_vla_cache_reuses_static_tokens_except_task_relevant_ones():
    sim = torch.tensor([0.999, 0.5, 0.999, 0.995, 0.9, 0.999])
    relevance = torch.tensor([0.9, 0.0, 0.1, 0.0, 0.0, 0.0])
    cfg = VLACacheConfig(similarity=0.99, relevant_fraction=1 / 6)
    recompute, reuse = vla_cache_masks(sim, relevance, cfg, budget=6)
    # Changed: 1 and 4; task-relevant (top 1 by attention): 0. Static 2, 3, 5 are reused.
    assert recompute.nonzero().flatten().tolist() == [0, 1, 4]
    assert torch.equal(reuse, ~recompute)
    # Capped at 2: the relevant token first, then the most changed (1: similarity 0.5).
    recompute, _ = vla_cache_masks(sim, relevance, cfg, budget=2)
    assert recompute.nonzero().flatten().tolist() == [0, 1]


def test_patch_similarity_sees_which_patch_changed():
    a = torch.rand(1, 1, 3, 16, 16) + 0.1
    b = a.clone()
    b[..., 8:, :8] = torch.rand(3, 8, 8)  # bottom-left patch of a 2 x 2 grid
    sim = patch_similarity(b, a, tokens_per_image=4)
    assert sim.shape == (1, 4)
    assert torch.allclose(sim[0, [0, 1, 3]], torch.ones(3)) and sim[0, 2] < 0.99


def test_efficientvla_selection_key_task_and_diversity():
    relevance = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    feats = torch.tensor([[1, 0, 0], [1, 0.1, 0], [0.9, 0.2, 0], [1, 0, 0.1], [0, 1, 0], [0, 0, 1]])
    # K_final 4, K_key 1 (token 0); K_aug 3: floor(0.34 * 3) = 1 by relevance (token 1), then
    # two by diversity from token 0: tokens 4 and 5 are orthogonal to it.
    kept = task_aware_selection(relevance, feats, k_final=4, k_key=1, alpha=0.34)
    assert kept.nonzero().flatten().tolist() == [0, 1, 4, 5]
    # alpha = 1: all by relevance.
    kept = task_aware_selection(relevance, feats, k_final=4, k_key=1, alpha=1.0)
    assert kept.nonzero().flatten().tolist() == [0, 1, 2, 3]


def test_full_recompute_plans_nothing():
    assert FullRecompute().begin(_step()) == (None, None)


def test_baselines_run_as_policies(oft_policy, frames, actions):
    nv = oft_policy.model.cfg.num_visual
    fastv = oft_policy.with_hooks(FastV(FastVConfig(budget=16)))
    actions(fastv, frames[:3])
    assert [(s.recomputed, s.pruned) for s in fastv.stats.steps] == [(16, 48)] * 3
    cache = oft_policy.with_hooks(VLACache(VLACacheConfig(budget=16)))
    actions(cache, [frames[0]] * 3)  # a static scene: only task-relevant tokens recomputed
    first, *rest = cache.stats.steps
    assert first.recomputed == nv
    assert all(s.pruned == 0 and s.recomputed == round(0.1 * nv) for s in rest)
    eff = oft_policy.with_hooks(EfficientVLATokens())
    actions(eff, frames[:2])
    assert all(s.recomputed == round(0.22 * nv) and s.reused == 0 for s in eff.stats.steps)


def test_vla_cache_on_static_frames_matches_full(oft_policy, frames, actions):
    """Reusing a token whose inputs did not change is exact."""
    full = actions(oft_policy, [frames[0]] * 3)
    got = actions(oft_policy.with_hooks(VLACache()), [frames[0]] * 3)
    assert max((a - b).abs().max().item() for a, b in zip(got, full, strict=True)) <= 1e-5


def test_vla_cache_on_a_two_view_pooled_policy():
    """mt10-style inputs (a second view pooled 2 x 2): patch similarity follows each view's own
    token grid, so a change in the second view marks that view's coarse tokens, not others."""
    from vlarun.accel.baselines import patch_similarity

    before = torch.rand(1, 2, 3, 16, 16)
    now = before.clone()
    now[:, 1, :, :8, :8] = torch.rand(3, 8, 8)  # top-left quarter of view 2 changes
    sim = patch_similarity(now, before, (16, 4))  # view 1: 4x4 grid, view 2: pooled 2x2
    assert sim.shape == (1, 20)
    assert torch.allclose(sim[0, :16], torch.ones(16))  # view 1 untouched
    assert sim[0, 16] < 0.99 and torch.allclose(sim[0, 17:], torch.ones(3))
    with pytest.raises(ValueError, match="not a square grid"):
        patch_similarity(now, before, (16, 5))


def test_vla_cache_runs_on_mt10_shapes():
    from vlarun.models.tokenizer import load_tokenizer
    from vlarun.paths import checkpoints_dir
    from vlarun.policy.base import Policy

    random = Policy.from_preset("mt10-oft", seed=0)  # the shipped BPE fits its 32-token prompt
    base = dataclasses.replace(random, tokenizer=load_tokenizer(checkpoints_dir() / "tiny-ar", 512))
    fast = base.with_setting("vla-cache:0.34")
    rng = np.random.default_rng(0)
    views = rng.integers(0, 255, (2, 128, 128, 3), dtype=np.uint8)
    for _ in range(2):
        out = fast.run_stages(views, "open the drawer", state=np.zeros(4, np.float32))
    assert torch.isfinite(out.outputs["actions"]).all()
    assert fast.stats.steps[-1].reused > 0  # identical frames: static tokens were reused


def test_uncapped_vla_cache_recomputes_every_changed_token_and_reuses_from_layer_one(
    oft_policy, frames, actions
):
    """TRIAGE's Table I form: no budget, so a frame that changes everywhere is recomputed
    whole, a static one is reused except its task-relevant tokens; layer 0 is the only shared
    layer (its attention gives relevance), so reuse starts at layer 1."""
    from vlarun.policy.methods import token_policy

    nv = oft_policy.model.cfg.num_visual
    fast = oft_policy.with_hooks(token_policy("vla-cache-uncapped"))
    actions(fast, [frames[0], frames[0], 255 - frames[0]])
    first, static, changed = fast.stats.steps
    assert first.recomputed == nv
    relevant = round(0.1 * nv)  # VLACacheConfig.relevant_fraction: never reused
    assert static.recomputed == relevant and static.reused == nv - relevant
    assert changed.recomputed == nv and changed.pruned == 0
    assert fast.hooks.tokens.last_plan.last_shared_layer == 0
    capped = oft_policy.with_setting("vla-cache:0.1")
    actions(capped, [frames[0], 255 - frames[0]])
    # the cap binds where uncapped does not
    assert capped.stats.steps[-1].recomputed == round(0.1 * nv)
    with pytest.raises(ValueError, match="takes no budget"):
        from vlarun.sim.evaluate import check_candidate

        check_candidate("vla-cache-uncapped:0.34")


def test_a_shared_layer_is_named_for_triages_family_only_and_reaches_its_config(
    oft_policy, frames, actions
):
    """``drop-all:0.07@0``: TRIAGE's ranking and drop taken after layer 0 instead of 2 (the
    sensitivity check at the paper's share of the depth); the runtime's plans never use it."""
    from vlarun.bench.accel_table import _knob
    from vlarun.sim.evaluate import build_candidate, check_candidate, shared_layer

    assert shared_layer("drop-all:0.07@0") == ("drop-all:0.07", 0)
    assert shared_layer("triage:0.34") == ("triage:0.34", None)
    check_candidate("keep-all:0.18@1")
    for bad, match in (
        ("fastv:0.07@0", "take a shared layer"),
        ("drop-all:0.07@x", "whole number"),
        ("drop-all:0.07@-1", "whole number"),
    ):
        with pytest.raises(ValueError, match=match):
            check_candidate(bad)
    built = build_candidate(oft_policy, "drop-all:0.07@0")
    assert built.hooks.tokens.cfg.layer == 0 and built.hooks.tokens.cfg.rest == "prune"
    actions(built, [frames[0], 255 - frames[0]])  # the second query prunes, after layer 0
    assert built.hooks.tokens.last_plan.last_shared_layer == 0
    assert built.stats.steps[-1].pruned > 0
    assert build_candidate(oft_policy, "drop-all:0.07").hooks.tokens.cfg.layer == 2
    depth = oft_policy.model.cfg.llm.num_layers
    with pytest.raises(ValueError, match="shared layer must be"):
        build_candidate(oft_policy, f"triage:0.07@{depth - 1}")
    assert _knob("triage:0.07@0") == (None, None)  # not the runtime's TRIAGE: no setting row
    assert _knob("triage:0.07") == ("token_budget", 0.07)
