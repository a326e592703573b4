"""TRIAGE's state across queries, on hand-built probes: each test fails if one of the mistakes
its name describes is made once in vlarun/accel/triage.py (checked by injecting each).

A fake step gives ``_decide`` what the prefill would: the values and attention of the shallow
layer, for 8 visual tokens, batch 1, one KV head."""

from types import SimpleNamespace

import torch

from vlarun.accel.triage import Triage, TriageConfig, _Episode, fill_budget
from vlarun.models.token_plan import ProbeResult

NV, HD = 8, 4


def _triage(**kw) -> Triage:
    defaults = dict(budget=2, kappa=0, kappa_reference_tokens=NV, mu=0.0, delta=0.3, max_age=50)
    return Triage(TriageConfig(**(defaults | kw)))


def _start(t: Triage, values: torch.Tensor, memory: torch.Tensor | None = None) -> None:
    """The state the first (full) query leaves: every token cached, all important."""
    mem = memory if memory is not None else torch.full((1, NV), 1 / NV)
    t.state = _Episode(
        query=1,
        reference=values.clone(),
        last_recompute=torch.zeros(1, NV, dtype=torch.long),
        has_cache=torch.ones(1, NV, dtype=torch.bool),
        important=torch.ones(1, NV, dtype=torch.bool),
        memory=mem,
        memory_feats=torch.eye(NV)[None],  # token i of any frame matches first-frame token i
    )


def _probe(values: torch.Tensor, attention: torch.Tensor) -> ProbeResult:
    return ProbeResult(attention.view(1, 1, 1, NV), values)


STEP = SimpleNamespace(num_visual=NV, batch=1, vis_start=1)


def _query(t: Triage, values, attention, carried=None):
    carried = carried if carried is not None else t.state.memory
    plan = t._decide(STEP, _probe(values, attention), carried)
    return plan, dict(t.last_signals)


def test_drift_is_measured_from_the_last_recompute_not_the_last_query():
    """Token 7 is never important, so never recomputed; its values creep by 0.1 of their norm a
    query. Anchored at its last recompute, drift accumulates past delta = 0.3 by the 4th query
    and the cache turns invalid; re-anchored every query it would stay at 0.1 and valid."""
    t = _triage(budget=2)
    base = torch.ones(1, 1, NV, HD)
    _start(t, base)
    attention = torch.tensor([8.0, 7, 6, 5, 4, 3, 2, 0])  # token 7 least important
    drifts, valid = [], []
    for q in range(1, 6):
        v = base.clone()
        v[..., 7, :] *= 1 + 0.1 * q
        _, sig = _query(t, v, attention, carried=torch.zeros(1, NV))
        drifts.append(float(sig["drift"][0, 7]))
        valid.append(bool(sig["valid"][0, 7]))
    assert [round(d, 3) for d in drifts] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert valid[:2] == [True, True] and not valid[3]


def test_deep_saliency_is_probed_once_per_episode():
    """The first query probes the last layer (deep saliency); later ones only the shallow one,
    and ``end`` never rewrites the memory once recorded."""
    asked = []
    step = SimpleNamespace(
        num_layers=6,
        visual=torch.eye(NV)[None],
        action_query_index=lambda: torch.tensor([9]),
        probe=lambda layer, query: asked.append(layer) or ("probe", layer),
    )
    t = _triage(layer=2)
    plan, probe = t.begin(step)
    assert plan is None and asked == [5]
    _start(t, torch.ones(1, 1, NV, HD), memory=torch.arange(NV, dtype=torch.float)[None])
    memory = t.state.memory.clone()
    t.begin(step)
    assert asked == [5, 2]
    t.end(step, pre=None)  # must not touch the recorded memory (pre is not even read)
    assert torch.equal(t.state.memory, memory)


def test_carried_memory_counts_in_importance():
    """Uniform shallow attention; the carried saliency singles out token 6. Only through the
    memory can token 6 enter the important set (ties go to lower indices) and be recomputed."""
    t = _triage(budget=1)
    values = torch.ones(1, 1, NV, HD)
    _start(t, values)
    carried = torch.zeros(1, NV)
    carried[0, 6] = 1.0
    plan, sig = _query(t, values, torch.ones(NV), carried=carried)
    assert bool(sig["important"][0, 6])
    assert int(sig["importance"][0].argmax()) == 6


def test_newly_important_tokens_are_mandatory():
    """Budget 1. Token 0 has long been important and drifts fast (an optional refresh); token 5
    is valid but has just entered the important set: it is mandatory and takes the budget."""
    t = _triage(budget=1, kappa=1, delta=10.0)  # important set = 2 tokens; nothing invalid
    base = torch.ones(1, 1, NV, HD)
    _start(t, base)
    t.state.important = torch.zeros(1, NV, dtype=torch.bool)
    t.state.important[0, 0] = True  # token 0 was important at the previous query
    v = base.clone()
    v[..., 0, :] *= 1.5  # token 0: drift 0.5, the fastest
    attention = torch.zeros(NV)
    attention[0], attention[5] = 1.0, 0.9
    _, sig = _query(t, v, attention, carried=torch.zeros(1, NV))
    recompute = t.last_plan.decisions[0] == 0  # TokenAction.RECOMPUTE
    assert bool(sig["important"][0, 5]) and bool(sig["important"][0, 0])
    assert recompute.nonzero().flatten().tolist() == [5]


def test_maintenance_is_served_before_mandatory_tokens_when_they_compete():
    """Budget 4, mu 0.25: one maintenance slot. Four important tokens are all invalid (all
    mandatory); the oldest unimportant cached token still gets its slot first."""
    important = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    chosen = fill_budget(
        budget=4,
        important=important,
        has_cache=torch.ones(NV, dtype=torch.bool),
        valid=~important,
        newly=torch.zeros(NV, dtype=torch.bool),
        age=torch.tensor([1, 1, 1, 1, 2, 9, 3, 4]),
        drift=torch.zeros(NV),
        importance=torch.tensor([0.9, 0.8, 0.7, 0.6, 0.1, 0.1, 0.1, 0.1]),
        mu=0.25,
    )
    assert chosen.nonzero().flatten().tolist() == [0, 1, 2, 5]
