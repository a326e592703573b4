"""SpecPrune-VLA's static stage: changed patches and each view's most attended tokens are kept,
at most Nv - B static ones pruned, and a real run through the stage graph."""

import pytest
import torch

from vlarun.accel.specprune import SpecPruneConfig, static_prune_mask


def _kept(mask) -> list[int]:
    return mask.nonzero().flatten().tolist()


def test_changed_and_attended_tokens_are_kept_and_the_budget_is_a_floor():
    # Two views of 4 tokens; tokens 2 and 5 changed, the instruction looks at 0 and 7.
    sim = torch.tensor([1.0, 0.999, 0.5, 0.995, 0.999, 0.2, 0.998, 0.997])
    rel = torch.tensor([0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.8])
    keep = static_prune_mask(sim, rel, (4, 4), local_share=0.25, threshold=0.99, budget=4)
    # Local 0 and 7, changed 2 and 5: already 4 = B; every static one pruned.
    assert _kept(keep) == [0, 2, 5, 7]
    # A larger floor keeps the least similar static tokens (3: 0.995, 7 is local already).
    keep = static_prune_mask(sim, rel, (4, 4), local_share=0.25, threshold=0.99, budget=5)
    assert _kept(keep) == [0, 2, 3, 5, 7]
    # More changed tokens than the floor: all of them kept anyway.
    keep = static_prune_mask(sim, rel, (4, 4), local_share=0.25, threshold=0.9999, budget=2)
    assert _kept(keep) == list(range(8))  # only token 0 (similarity 1.0) is static: local


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
