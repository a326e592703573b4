"""SAFE-Pruner's plans on hand-built attention: the forecast steers what is kept, a shift of
attention makes the next step a keyframe, and a real run through the stage graph."""

from types import SimpleNamespace

import pytest
import torch

from vlarun.accel.safe_pruner import SAFEPruner, SAFEPrunerConfig, _Memory
from vlarun.models.token_plan import ProbeResult, TokenAction

NV, D = 8, 4


def _probe(row: list[float]) -> ProbeResult:
    return ProbeResult(torch.tensor(row).view(1, 1, 1, NV), torch.zeros(1, 1, NV, 2))


def onehot(*idx, w=1.0):
    row = [0.01] * NV
    for i in idx:
        row[i] = w
    return row


FEATS = torch.eye(NV, D * 2)[None]  # every token its own direction: correspondence = identity
STEP = SimpleNamespace(num_visual=NV, batch=1, vis_start=1, visual=FEATS)


def _primed(forecast, **cfg) -> SAFEPruner:
    p = SAFEPruner(SAFEPrunerConfig(**cfg))
    f = torch.tensor(forecast)[None]
    p.memory = _Memory(f / f.sum(), FEATS.clone())
    p.keyframe_due = False
    return p


def _kept(p: SAFEPruner, row) -> list[int]:
    d = p._decide(STEP, _probe(row), p.memory.forecast).decisions[0]
    assert not (d == int(TokenAction.REUSE)).any()  # a pruner never reuses
    return (d == int(TokenAction.RECOMPUTE)).nonzero().flatten().tolist()


def test_the_deep_forecast_keeps_what_shallow_attention_misses():
    """Shallow attention looks at 0 and 1; the keyframe's deep layer at 6. With the forecast
    (lambda 1) token 6 is kept over token 1; without it (lambda 0) it is not."""
    row = onehot(0, 1)
    row[1] = 0.5
    forecast = onehot(6)
    assert _kept(_primed(forecast, budget=2, memory_weight=1.0), row) == [0, 6]
    assert _kept(_primed(forecast, budget=2, memory_weight=0.0), row) == [0, 1]


def test_an_attention_shift_makes_the_next_step_a_keyframe():
    p = _primed(onehot(6), budget=2, shift_threshold=0.9)
    _kept(p, onehot(0, 1))  # the first step after the keyframe sets the reference
    assert not p.keyframe_due
    _kept(p, onehot(0, 1))  # the same attention: no shift
    assert not p.keyframe_due
    _kept(p, onehot(4, 5))  # attention moved elsewhere: cosine ~0
    assert p.keyframe_due
    assert p.last_signals["shift_similarity"][0] < 0.1


def test_config_is_validated():
    with pytest.raises(ValueError, match="budget"):
        SAFEPrunerConfig(budget=0)
    with pytest.raises(ValueError, match="shift_threshold"):
        SAFEPrunerConfig(shift_threshold=1.5)
    with pytest.raises(ValueError, match="memory_weight"):
        SAFEPrunerConfig(memory_weight=-1)


def test_runs_through_the_graph_with_keyframes_at_full_compute(oft_policy, frames, instruction):
    """Step 1 is a keyframe (full), later steps keep exactly the budget until attention shifts;
    with a threshold no cosine reaches every step after the reference step is followed by a
    keyframe, so full and pruned steps alternate."""
    nv = oft_policy.model.cfg.num_visual
    fast = oft_policy.with_setting("safe-pruner:0.25")
    for f in frames[:3]:
        out = fast.run_stages(f, instruction, serialize=True).outputs["actions"]
        assert torch.isfinite(out).all()
    steps = fast.stats.steps
    assert steps[0].recomputed == nv and steps[0].flops_ratio == pytest.approx(1.0)
    assert all(
        s.recomputed == round(0.25 * nv) and s.pruned == nv - s.recomputed for s in steps[1:]
    )
    assert all(s.reused == 0 for s in steps)

    from vlarun.accel.safe_pruner import SAFEPruner as P

    always = oft_policy.with_hooks(P(SAFEPrunerConfig(budget_fraction=0.25, shift_threshold=1.0)))
    for f in frames[:5]:
        always.run_stages(f, instruction, serialize=True)
    full = [s.recomputed == nv for s in always.stats.steps]
    # keyframe, reference step (sets the reference, cannot shift), pruned + shift, keyframe, ...
    assert full == [True, False, False, True, False]


def test_a_new_episode_starts_with_a_keyframe(oft_policy, frames, instruction):
    nv = oft_policy.model.cfg.num_visual
    fast = oft_policy.with_setting("safe-pruner:0.25")
    for f in frames[:2]:
        fast.run_stages(f, instruction, serialize=True)
    fast.reset()
    fast.run_stages(frames[2], instruction, serialize=True)
    assert [s.recomputed == nv for s in fast.stats.steps] == [True, False, True]
