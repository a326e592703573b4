"""The predictor's recursion on hand-built DAGs, the link EWMA and the calibration terms."""

import math

import pytest

from vlarun.sched.bookings import Slot
from vlarun.sched.calibration import Calibration
from vlarun.sched.catalog import Device
from vlarun.sched.cost import StageWork
from vlarun.sched.link import Link
from vlarun.sched.predictor import DeviceState, predict_placement

# 1 TFLOP/s, no memory limit, no overhead: a stage of n TFLOP takes exactly n seconds.
ROBOT = Device("r", "robot", "robot", 1.0, 1.0, 1.0, 1e9, 8, 2.0, 10.0, 1.0, 1.0, 0.0)
EDGE = Device("e", "edge", "edge", 4.0, 4.0, 4.0, 1e9, 80, 20.0, 100.0, 1.0, 1.0, 0.0)
DEVICES = {"robot": ROBOT, "edge": EDGE}
MB = 1_000_000


def _slot(stage: str, start: float, end: float) -> Slot:
    """Another robot's slot on the edge, never due."""
    return Slot(origin="other", stage=stage, start=start, end=end, deadline=math.inf)


def work(name, seconds_on_robot, parents=(), in_bytes=0, out_bytes=0):
    return StageWork(name, parents, seconds_on_robot * 1e12, 1.0, 1.0, 1, 0, 0, in_bytes, out_bytes)


CHAIN = (work("a", 1.0, (), 1 * MB), work("b", 2.0, ("a",), 2 * MB), work("c", 0.5, ("b",), 0, MB))
DIAMOND = (
    work("a", 1.0),
    work("b", 2.0, ("a",), MB),
    work("c", 0.5, ("a",), MB),
    work("d", 1.0, ("b", "c"), MB),
)
LINK = Link(bandwidth_mbps=8.0, rtt_ms=0.0)  # 1 MB/s: a 1 MB packet takes 1 s


def place(works, roles):
    return {w.name: r for w, r in zip(works, roles, strict=True)}


def test_chain_on_robot_is_the_sum_of_stages():
    p = predict_placement(CHAIN, place(CHAIN, ["robot", "robot", "robot"]), DEVICES, LINK)
    assert p.latency_s == pytest.approx(3.5)
    assert p.transfer_s == 0 and p.bytes_sent == 0
    # energy: robot busy the whole time (util 1): busy_w * 3.5 s
    assert p.energy_j == pytest.approx(10.0 * 3.5)


def test_cut_adds_the_packet_transfer_and_the_return_trip():
    p = predict_placement(CHAIN, place(CHAIN, ["robot", "edge", "edge"]), DEVICES, LINK)
    # a on robot 1 s, send 2 MB (2 s), b on edge 0.5 s, c on edge 0.125 s, 1 MB back (1 s)
    assert p.latency_s == pytest.approx(1 + 2 + 0.5 + 0.125 + 1)
    assert p.bytes_sent == 2 * MB
    starts = {s.name: s.start for s in p.stages}
    assert starts["b"] == pytest.approx(3.0)


def test_first_stage_on_edge_receives_the_sensor_packet():
    p = predict_placement(CHAIN, place(CHAIN, ["edge", "robot", "robot"]), DEVICES, LINK)
    # 1 MB up (1 s), a on edge 0.25 s, 2 MB down (2 s), b 2 s, c 0.5 s on robot
    assert p.latency_s == pytest.approx(1 + 0.25 + 2 + 2 + 0.5)


def test_diamond_waits_for_the_slowest_parent():
    roles = ["robot", "edge", "robot", "robot"]
    p = predict_placement(DIAMOND, place(DIAMOND, roles), DEVICES, LINK)
    # b: a ends 1, +1 s up, 0.5 s on edge, ends 2.5, +1 s down -> ready 3.5
    # c: on robot right after a, ends 1.5 (this predictor has no robot contention between
    #    parallel stages); d starts at max(3.5, 1.5) = 3.5 and runs 1 s
    ends = {s.name: s.end for s in p.stages}
    assert ends["b"] == pytest.approx(2.5)
    assert ends["c"] == pytest.approx(1.5)
    assert p.latency_s == pytest.approx(4.5)


def test_availability_queue_and_reservations_delay_edge_stages():
    roles = place(CHAIN, ["robot", "edge", "edge"])
    base = predict_placement(CHAIN, roles, DEVICES, LINK).latency_s
    busy = {"edge": DeviceState(available_at=5.0)}
    assert predict_placement(CHAIN, roles, DEVICES, LINK, state=busy).latency_s == pytest.approx(
        base + 2.0  # b was ready at 3 s, the edge frees at 5 s
    )
    queued = {"edge": DeviceState(queued_s={"b": 0.7})}
    assert predict_placement(CHAIN, roles, DEVICES, LINK, state=queued).latency_s == pytest.approx(
        base + 0.7
    )
    # A reservation [3.2, 4) leaves no room for b's 0.5 s at 3.0; it starts at 4.
    res = DeviceState(reservations=[_slot("b", 3.2, 4.0)])
    p = predict_placement(CHAIN, roles, DEVICES, LINK, state={"edge": res})
    assert {s.name: s.start for s in p.stages}["b"] == pytest.approx(4.0)
    # A reservation that ends before b is ready changes nothing.
    early = DeviceState(reservations=[_slot("x", 0.0, 2.9)])
    assert predict_placement(CHAIN, roles, DEVICES, LINK, state={"edge": early}).latency_s == (
        pytest.approx(base)
    )


def test_period_idle_energy_and_now_offset():
    roles = place(CHAIN, ["robot", "robot", "robot"])
    p = predict_placement(CHAIN, roles, DEVICES, LINK, period_s=10.0, now=100.0)
    assert p.latency_s == pytest.approx(3.5)
    # dynamic 8 W x 3.5 s + idle 2 W over the 10 s period
    assert p.energy_j == pytest.approx(8 * 3.5 + 2 * 10)


def test_calibration_learns_stage_factor_boundary_and_residual():
    cal = Calibration(alpha=0.5)
    for _ in range(30):
        cal.observe_stage("b", "edge", predicted_s=0.5, measured_s=0.75)
        cal.observe_boundary("a", "b", predicted_s=2.0, measured_s=2.1)
        cal.observe_total(("robot", "edge", "edge"), predicted_s=4.0, measured_s=4.2)
    assert cal.factor("b", "edge") == pytest.approx(1.5)
    assert cal.boundary("a", "b") == pytest.approx(0.1)
    roles = place(CHAIN, ["robot", "edge", "edge"])
    p = predict_placement(CHAIN, roles, DEVICES, LINK, cal=cal)
    # b: 0.5 s x 1.5; transfer + 0.1 s; c, never timed on the edge, takes the edge's own
    # factor (b's): 0.125 s x 1.5; residual + 0.2 s (less the prior's fading share)
    assert p.latency_s == pytest.approx(1 + 2.1 + 0.75 + 0.125 * 1.5 + 1 + 0.2, abs=0.005)


def test_link_ewma_follows_a_bandwidth_drop():
    link = Link(bandwidth_mbps=200.0, rtt_ms=10.0, alpha=0.3)
    nbytes = 2 * MB
    for _ in range(20):  # the real link now carries 50 Mbps
        link.observe_transfer(nbytes, 0.005 + nbytes * 8 / 50e6)
    assert link.bandwidth_mbps == pytest.approx(50.0, rel=0.01)
    link.observe_transfer(100, 5.0)  # too small to be a bandwidth sample
    assert link.bandwidth_mbps == pytest.approx(50.0, rel=0.01)
    link.observe_rtt(0.030)
    assert 10.0 < link.rtt_ms < 30.0
    with pytest.raises(ValueError):
        Link(0.0, 1.0)


def _fake_clock():
    now = [0.0]
    return now, lambda: now[0]


def _send(link, mbps: float, nbytes: int = 200_000) -> None:
    link.observe_transfer(nbytes, link.rtt_ms * 1e-3 / 2 + nbytes * 8 / (mbps * 1e6))


def test_a_probe_is_measured_over_the_paths_least_rtt_not_the_edges_slow_answers():
    """Health answers carry the edge's own time (it computes its schedule for them): RTT
    samples of 2 ms on the path and 7 ms when the edge is busy. A 96 KiB probe over 60 Mbit/s
    takes 13.1 ms + the path's 2 ms; taking the EWMA's ~5 ms off it would read ~80 Mbit/s."""
    now, clock = _fake_clock()
    link = Link(60.0, 2.0, clock=clock)
    for rtt in (0.002, 0.002, 0.007, 0.007, 0.007):
        link.observe_rtt(rtt)
        now[0] += 0.5
    assert link.rtt_ms > 4.0 and link.base_rtt_ms == pytest.approx(2.0)
    nbytes = 96 * 1024
    round_trip = 0.002 + nbytes * 8 / 60e6
    link.observe_probe(nbytes, round_trip)  # monitor.feed
    assert link.bandwidth_mbps == pytest.approx(60.0, rel=1e-6)
    now[0] += 11.0  # the 2 ms samples are old now: the least of the window is 7 ms
    link.observe_rtt(0.007)
    assert link.base_rtt_ms == pytest.approx(7.0)


def test_a_probe_as_fast_as_the_paths_round_trip_still_beats_a_bound():
    """On a loopback edge a 96 KiB probe comes back in 0.3 ms, no slower than the least health
    answer: its payload time, the round trip less the path's, is <= 0. It still says the link
    carries >= 96 KiB per 0.3 ms, so it lifts a timeout's bound (such samples used to be
    dropped; with every probe dropped a restored link stayed held at the bound, no handoff)."""
    now, clock = _fake_clock()
    link = Link(100.0, 0.3, clock=clock)
    link.observe_rtt(0.0004)  # the least health answer: slower than the probe below
    link.cap(0.05)  # a request timed out: the link looks down
    assert link.bandwidth_mbps == 0.05
    nbytes = 96 * 1024
    link.observe_probe(nbytes, 0.0003)
    assert link.bandwidth_mbps == pytest.approx(nbytes * 8 / 0.0003 / 1e6)  # the lower bound
    link.cap(0.05)
    link.observe_transfer(nbytes, 0.0001)  # one way, under half the least round trip
    assert link.bandwidth_mbps == pytest.approx(nbytes * 8 / 0.0001 / 1e6)
    link.cap(0.05)
    link.observe_probe(nbytes, 0.0)  # no time at all says nothing
    link.observe_probe(1000, 0.0001)  # nor does a small packet
    assert link.bandwidth_mbps == 0.05


def test_link_estimate_recovers_with_the_first_fast_sample():
    """200 -> 2 -> 200 Mbit/s: the drop shows after two slow samples, the restore with the
    first fast one (the EWMA it replaces needed ~10 samples to climb back past 100)."""
    now, clock = _fake_clock()
    link = Link(200.0, 2.0, clock=clock)
    for _ in range(3):
        _send(link, 200.0)
        now[0] += 0.1
    _send(link, 2.0)
    assert link.bandwidth_mbps == pytest.approx(200.0, rel=1e-6)  # one slow sample: noise
    now[0] += 0.1
    _send(link, 2.0)
    assert link.bandwidth_mbps == pytest.approx(2.0, rel=1e-6)  # two in a row: it changed
    now[0] += 0.5
    _send(link, 200.0)  # one probe after the restore
    assert link.bandwidth_mbps == pytest.approx(200.0, rel=1e-6)


def test_with_every_sample_old_the_newest_one_holds_not_an_older_fast_one():
    """60 Mbit/s, then one slow probe (2 Mbit/s) and a timeout bound: once both samples and
    the bound are old, the link holds at its last word (2), not the fast sample that was in the
    window when the estimate was last taken."""
    now, clock = _fake_clock()
    link = Link(60.0, 0.0, clock=clock, window_s=2.0, cap_s=2.0)
    _send(link, 60.0)
    now[0] += 1.0
    _send(link, 2.0)  # one slow sample: noise so far, the fast one still in the window
    link.cap(2.0)
    assert link.bandwidth_mbps == pytest.approx(2.0, rel=1e-6)
    now[0] += 5.0  # everything expired, no sample since
    link.refresh()
    assert link.bandwidth_mbps == pytest.approx(2.0, rel=1e-6)


def test_a_timeout_bound_expires_or_yields_to_a_faster_sample():
    now, clock = _fake_clock()
    link = Link(200.0, 0.0, clock=clock, cap_s=2.0)
    link.cap(5.0)
    assert link.bandwidth_mbps == 5.0
    now[0] = 1.9
    link.refresh()
    assert link.bandwidth_mbps == 5.0
    now[0] = 2.1  # the bound held its time; the estimate is the samples' (here the start) again
    link.refresh()
    assert link.bandwidth_mbps == 200.0
    link.cap(5.0)
    _send(link, 50.0)  # delivered faster than the bound: the bound is wrong, drop it
    assert link.bandwidth_mbps == pytest.approx(50.0, rel=1e-6)
    now[0] += 10.0  # no sample for a while: the last estimate holds
    link.refresh()
    assert link.bandwidth_mbps == pytest.approx(50.0, rel=1e-6)


def test_a_looser_bound_renews_a_tighter_one_and_a_probe_bound_caps():
    now, clock = _fake_clock()
    link = Link(200.0, 0.0, clock=clock, cap_s=2.0)
    link.cap(2.0)
    now[0] = 1.5
    link.cap(5.0)  # both hold: the link is under 2, now for 2 s more
    assert link.bandwidth_mbps == 2.0
    now[0] = 3.0
    link.refresh()
    assert link.bandwidth_mbps == 2.0
    now[0] = 3.6
    link.refresh()
    assert link.bandwidth_mbps == 200.0
    link.bound(96 * 1024, 0.4)  # a probe that did not come back in 0.4 s: under 1.97 Mbit/s
    assert link.bandwidth_mbps == pytest.approx(96 * 1024 * 8 / 0.4 / 1e6)
    link.bound(1000, 0.4)  # too small to say anything about bandwidth
    assert link.bandwidth_mbps == pytest.approx(96 * 1024 * 8 / 0.4 / 1e6)
