"""A fresh edge on a busy CPU refused 17 of 29 requests for over 10 s: its warm-up estimate,
taken while the CPU was busy, moved only 20% per execution toward what the edge achieved
(issue 45, 15). The warm-up now keeps the fastest of three passes, as a prior that the first
real execution replaces."""

import pytest

from vlarun.sched.queue_model import StageTimes


def test_the_first_execution_replaces_the_warm_up_estimate():
    t = StageTimes()
    t.measured("prefill", 1.332, 1, 0.0, prior=True)  # the busy warm-up
    t.measured("prefill", 1.080, 1, 1.0)  # what it achieves
    assert t.est_s["prefill"] == pytest.approx(1.080)
    t.measured("prefill", 2.0, 1, 2.0)  # from here on, the usual EWMA
    assert t.est_s["prefill"] == pytest.approx(0.8 * 1.080 + 0.2 * 2.0)


def test_the_edge_warms_up_with_priors_for_every_stage():
    from vlarun.policy import Policy
    from vlarun.runtime.edge.server import EdgeServer, ServerConfig
    from vlarun.runtime.transport import Security

    policy = Policy.load("tiny-ar")
    edge = EdgeServer(policy, Security(insecure=True), ServerConfig("inproc://warm-test"))
    try:
        edge.warmup()
        stages = {s.name for s in edge.graph.stages}
        assert edge.queues.prior == stages and set(edge.queues.est_s) == stages
    finally:
        edge.stop()
