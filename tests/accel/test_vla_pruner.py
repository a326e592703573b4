"""VLA-Pruner's plans on hand-built attention: the semantic set, the smoothed action set, the
budget split, and a real run through the stage graph."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vlarun.accel.vla_pruner import VLAPruner, VLAPrunerConfig
from vlarun.models.token_plan import ProbeResult, TokenAction

NV = 8


def _probe(text_rows: list[list[float]]) -> ProbeResult:
    """Attention of the instruction queries (the last row is the action query) over 8 tokens."""
    probs = torch.tensor(text_rows, dtype=torch.float).view(1, 1, len(text_rows), NV)
    return ProbeResult(probs, torch.zeros(1, 1, NV, 2))


STEP = SimpleNamespace(num_visual=NV, batch=1, vis_start=1)


def _kept(pruner: VLAPruner, rows) -> list[int]:
    plan = pruner._decide(STEP, _probe(rows))
    d = plan.decisions[0]
    assert not (d == int(TokenAction.REUSE)).any()  # a pruner never reuses
    return (d == int(TokenAction.RECOMPUTE)).nonzero().flatten().tolist()


def onehot(*idx, w=1.0):
    row = [0.01] * NV
    for i in idx:
        row[i] = w
    return row


def test_budget_splits_between_the_semantic_and_the_action_sets():
    p = VLAPruner(VLAPrunerConfig(budget=4, split=0.5))
    # Instruction tokens look at 1 and 2; the action query (last row) at 6 and 7.
    rows = [onehot(1, 2), onehot(1, 2), onehot(6, 7)]
    assert _kept(p, rows) == [1, 2, 6, 7]
    # All to semantics: the action query's own row still counts among the instruction rows,
    # but two instruction rows outweigh it.
    q = VLAPruner(VLAPrunerConfig(budget=2, split=1.0))
    assert _kept(q, rows) == [1, 2]


def test_action_attention_is_smoothed_over_steps():
    """After three steps attending to 6 and 7, one step attending to 4 and 5 does not displace
    them (decay 0.8); with no smoothing it would."""
    smooth = VLAPruner(VLAPrunerConfig(budget=4, split=0.5, decay=0.8))
    fresh = VLAPruner(VLAPrunerConfig(budget=4, split=0.5, decay=0.0))
    for p in (smooth, fresh):
        for _ in range(3):
            _kept(p, [onehot(1, 2), onehot(1, 2), onehot(6, 7)])
    turn = [onehot(1, 2), onehot(1, 2), onehot(4, 5)]
    assert _kept(smooth, turn) == [1, 2, 6, 7]
    assert _kept(fresh, turn) == [1, 2, 4, 5]
    smooth.reset()
    assert _kept(smooth, turn) == [1, 2, 4, 5]  # a new episode starts without memory


def test_config_is_validated():
    with pytest.raises(ValueError, match="split"):
        VLAPrunerConfig(split=1.5)
    with pytest.raises(ValueError, match="budget"):
        VLAPrunerConfig(budget=0)


def test_runs_through_the_graph_and_keeps_exactly_the_budget(oft_policy, frames, instruction):

    fast = oft_policy.with_setting("vla-pruner:0.25")
    for f in frames[:3]:
        out = fast.run_stages(f, instruction, serialize=True).outputs["actions"]
        assert torch.isfinite(out).all()
    nv = oft_policy.model.cfg.num_visual
    assert [s.recomputed for s in fast.stats.steps] == [round(0.25 * nv)] * 3
    assert all(s.reused == 0 and s.pruned == nv - round(0.25 * nv) for s in fast.stats.steps)
    assert all(s.flops_ratio < 1.0 for s in fast.stats.steps)
    assert np.isfinite(fast.stats.summary()["flops_ratio"])
