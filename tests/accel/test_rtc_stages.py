"""Real-time chunking through the stage graph: the request's freeze (queued actions, d, s) is
part of its packet, so the head freezes the first d actions exactly wherever it runs, the
packet crossing the wire included."""

import numpy as np
import pytest
import torch

from vlarun.accel.rtc import RTCRequest
from vlarun.policy.base import Policy
from vlarun.stages.families import RTC_INPUTS, build_graph


@pytest.fixture(scope="module", params=["tiny-pi0", "tiny-cogact", "tiny-ar"])
def policy(request):
    policy = Policy.load(request.param, seed=0)  # tiny-ar: the shipped checkpoint (H = 4)
    if request.param == "tiny-cogact":  # a zero output layer would make every sample equal
        torch.nn.init.normal_(policy.model.action_model.final_layer.linear.weight, std=0.5)
    return policy


def _frame(policy, value: int) -> np.ndarray:
    size = policy.model.cfg.image_size
    return np.full((size, size, 3), value, np.uint8)


def _state(policy):
    n = policy.state_size
    return np.zeros(n, np.float32) if n else None


def test_the_first_d_actions_equal_the_queued_ones_exactly(policy):
    h = policy.model.cfg.horizon
    st = _state(policy)
    first = policy.run_stages(_frame(policy, 40), "open the drawer", state=st, seed=1)
    previous = first.outputs["actions"][0].numpy()  # (H, A) in the model's action space
    n = min(5, h - 1)  # actions still queued when the next request is sent
    queued = previous[h - n :]
    rtc = RTCRequest.build(queued, h, latency_s=0.09, period_s=0.05)  # ceil(1.8) = 2
    assert (rtc.delay, rtc.execution_horizon) == (2, h - n)
    free = policy.run_stages(_frame(policy, 200), "open the drawer", state=st, seed=2)
    # Every stage's input packet through the wire codec: the freeze crosses it exactly.
    run = policy.run_stages(
        _frame(policy, 200), "open the drawer", state=st, seed=2, serialize=True, rtc=rtc
    )
    got, free = run.outputs["actions"][0].numpy(), free.outputs["actions"][0].numpy()
    assert not np.array_equal(free[:2], queued[:2])  # the freeze is what makes them equal
    np.testing.assert_array_equal(got[:2], queued[:2])
    assert not np.array_equal(got[2:n], queued[2:])  # the rest is the new chunk's own


def test_the_freeze_is_in_the_head_stage_schema(policy):
    cfg = policy.model.cfg
    graph = build_graph(cfg, rtc=object())  # specs only: no model bound
    head = graph.stages[-1]
    specs = {s.name: s for s in head.inputs}
    assert set(RTC_INPUTS) <= set(specs) and set(RTC_INPUTS) <= {s.name for s in graph.graph_inputs}
    assert specs["rtc_prev"].shape == (1, cfg.horizon, cfg.action_dim)
    assert not set(RTC_INPUTS) & {s.name for s in build_graph(cfg).graph_inputs}


def test_a_regressed_chunk_cannot_be_inpainted():
    cfg = Policy.from_preset("tiny-oft", seed=0).model.cfg
    with pytest.raises(ValueError, match="real-time chunking needs"):
        build_graph(cfg, rtc=object())


def test_the_request_keeps_its_invariant():
    q = np.zeros((6, 4), np.float32)
    assert RTCRequest.build(q[:0], 8, 0.1, 0.05) is None  # nothing queued: nothing to freeze
    r = RTCRequest.build(q, 8, 1.0, 0.05)  # 20 steps of delay, clipped to the overlap
    assert (r.delay, r.execution_horizon) == (6, 2) and r.padded().shape == (8, 4)
    full = RTCRequest.build(np.zeros((8, 4)), 8, 0.0, 0.05)  # a chunk keeps one action of its own
    assert full.execution_horizon == 1 and full.previous.shape == (7, 4)
    with pytest.raises(ValueError, match="H - s <= n"):
        RTCRequest(q[:2], 1, 4, 8)  # an overlap of 4 over 2 queued actions
    with pytest.raises(ValueError, match="finite"):
        RTCRequest(np.full((6, 4), np.nan), 1, 2, 8)


def test_a_fast_model_refuses_the_token_freeze_in_one_line():
    """A FAST code is a DCT of the whole chunk: no prefix of it is the first d actions, so
    the forced-prefix freeze is refused, not run as if the code were binned tokens."""
    policy = Policy.load("tiny-pi0-fast", seed=0)
    h = policy.model.cfg.horizon
    queued = np.zeros((h - 2, policy.model.cfg.action_dim), np.float32)
    rtc = RTCRequest.build(queued, h, latency_s=0.09, period_s=0.05)
    with pytest.raises(ValueError, match="FAST"):
        policy.run_stages(_frame(policy, 9), "open the drawer", state=_state(policy), rtc=rtc)
