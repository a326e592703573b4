"""SpecPrune-VLA's static stage: changed patches and each view's most attended tokens are kept,
at most Nv - B static ones pruned, and a real run through the stage graph."""

import pytest
import torch

from vlarun.accel.specprune import SpecPruneConfig, static_prune_mask


def _kept(mask) -> list[int]:
    return mask.nonzero().flatten().tolist()


def test_changed_and_attended_tokens_are_kept_and_the_budget_is_a_floor():
    # Two views of 4; tokens 2 and 5 changed, the instruction looks at 0 and 7 (one per view).
    sim = torch.tensor([1.0, 0.999, 0.5, 0.995, 0.999, 0.2, 0.998, 0.997])
    rel = torch.tensor([0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.8])

    def kept(budget, threshold=0.99):
        return _kept(static_prune_mask(sim, rel, (4, 4), 0.25, threshold, budget))

    # B = 4: each view prunes at most 2 static patches, the most similar: 0 and 1, then 4 and
    # 6; token 0 is the first view's local token, so it stays.
    assert kept(4) == [0, 2, 3, 5, 7]
    # B = 5: at most 1 per view (4 - round(2.5)): 0 (local, kept) and 4.
    assert kept(5) == [0, 1, 2, 3, 5, 6, 7]
    # Nearly everything changed: only token 0 is static, and it is local: all kept, B or not.
    assert kept(2, threshold=0.9999) == list(range(8))


def test_each_view_keeps_its_share_of_the_budget():
    """A still view beside a moving one (the workspace camera beside the wrist's) keeps its
    share of B, however many tokens the moving view keeps."""
    sim = torch.tensor([1.0] * 8 + [0.0] * 8)
    rel = torch.zeros(16)
    keep = static_prune_mask(sim, rel, (8, 8), 0.0, 0.99, budget=4)
    assert int(keep[:8].sum()) == 2 and bool(keep[8:].all())


def test_views_must_cover_the_tokens():
    with pytest.raises(ValueError, match="views hold 6 tokens"):
        static_prune_mask(torch.ones(8), torch.ones(8), (3, 3), 0.25, 0.99, 2)


def test_config_is_validated():
    with pytest.raises(ValueError, match="local_share"):
        SpecPruneConfig(local_share=2.0)
    with pytest.raises(ValueError, match="similarity"):
        SpecPruneConfig(similarity=-2.0)


def test_runs_through_the_graph_keeping_at_least_the_budget(oft_policy, frames, instruction):
    """The first query runs in full; later ones keep the moving block's tokens and at least B."""
    nv = oft_policy.model.cfg.num_visual
    fast = oft_policy.with_setting("specprune:0.1")
    for f in frames[:4]:
        out = fast.run_stages(f, instruction, serialize=True).outputs["actions"]
        assert torch.isfinite(out).all()
    steps = fast.stats.steps
    assert steps[0].recomputed == nv
    floor = round(0.1 * nv)
    assert all(floor <= s.recomputed < nv and s.reused == 0 for s in steps[1:])
    # The block moves 4 px a frame across 8 px patches: more than the floor changed each step.
    assert any(s.recomputed > floor for s in steps[1:])


def test_a_new_episode_starts_in_full(oft_policy, frames, instruction):
    """After reset() there is no previous frame to compare with: the first query runs in full."""
    nv = oft_policy.model.cfg.num_visual
    fast = oft_policy.with_setting("specprune:0.1")
    for f in frames[:2]:
        fast.run_stages(f, instruction, serialize=True)
    fast.reset()
    fast.run_stages(frames[2], instruction, serialize=True)
    assert [s.recomputed == nv for s in fast.stats.steps] == [True, False, True]
