"""`link_timeline`: when plans left the edge after a drop and came back after the restore."""

import pytest

from vlarun.runtime.robot.episode import link_timeline


def _row(t: float, edge: bool, fallback: str | None = None, sent: float = 0.05) -> dict:
    """A request begun ``t`` s into the run; ``edge``: an edge answer in time came, sent for
    ``sent`` s after the request began."""
    ran = "vision@edge/prefill@edge/decode@robot" if edge else "vision@robot/prefill@robot"
    return {
        "started_s": 100.0 + t,
        "ran": ran,
        "fallback": fallback,
        "edge_at_s": 100.0 + t + sent if edge and fallback is None else None,
    }


def _connected(client) -> None:
    """Wait until ``client`` has a connection (IMMEDIATE: a send fails until it is up)."""
    import time

    from vlarun.runtime.robot.client import LinkDown

    for _ in range(50):
        try:
            client.health(5.0)
            return
        except LinkDown:
            time.sleep(0.1)


def test_drop_and_restore_are_found_and_timed():
    rows = [_row(t, True) for t in (0, 4, 8.5)]
    rows += [_row(9.2, True, fallback="link timeout")]  # planned edge, ran here: not on the edge
    rows += [_row(t, False) for t in (10, 12, 14.9, 15.3)]
    rows += [_row(15.8, True), _row(16.5, True)]
    t = link_timeline(rows, 100.0, 200.0, [(9.0, 2.0), (15.0, 200.0)])
    assert t["drop_s"] == 9.0 and t["restore_s"] == 15.0
    assert abs(t["left_edge_after_drop_ms"] - 200.0) < 1e-6
    assert abs(t["edge_again_after_restore_ms"] - 850.0) < 1e-6  # when its edge part was sent


def test_a_request_handed_to_the_edge_mid_way_is_the_edges_return():
    """A request that began here before the restore and sent its rest to the edge after it
    (a handoff) is when the edge came back, not the next request planned onto it."""
    rows = [_row(t, True) for t in (0, 4, 8.5)] + [_row(t, False) for t in (10, 12)]
    handed = _row(14.7, True, sent=0.6)  # began 0.3 s before the restore, sent 0.3 s after
    handed["handoff"] = "prefill+decode to the edge"
    rows += [handed, _row(15.8, True)]
    t = link_timeline(rows, 100.0, 200.0, [(9.0, 2.0), (15.0, 200.0)])
    assert abs(t["edge_again_after_restore_ms"] - 300.0) < 1e-6 and t["handoffs"] == 1


def test_never_back_and_no_drop():
    rows = [_row(1, True), _row(10, False), _row(20, False)]
    t = link_timeline(rows, 100.0, 200.0, [(9.0, 2.0), (15.0, 200.0)])
    assert t["edge_again_after_restore_ms"] is None
    up = link_timeline(rows, 100.0, 50.0, [(5.0, 200.0)])  # a rise first is no drop
    assert up["drop_s"] is None and up["restore_s"] is None
    assert up["left_edge_after_drop_ms"] is None and up["edge_again_after_restore_ms"] is None


def test_run_robot_starts_from_the_shaped_bandwidth():
    """`run-robot --link-mbps 20` plans its first request for 20 Mbit/s, not the agent's
    default 1 Gbit/s (which sent the first plans to an edge the link could not reach in time)."""
    from vlarun.apps.runtime import RunRobotOptions, agent_config
    from vlarun.cli import build_parser
    from vlarun.config import parse_into
    from vlarun.policy.setting import AccelSetting

    parser = build_parser("run-robot", RunRobotOptions)
    shaped = parse_into(RunRobotOptions, parser.parse_args(["--link-mbps", "20"]))
    plain = parse_into(RunRobotOptions, parser.parse_args([]))
    assert agent_config(shaped, AccelSetting(), 0.4).bandwidth_mbps == 20.0
    assert agent_config(plain, AccelSetting(), 0.4).bandwidth_mbps == 1000.0


def test_a_transfer_longer_than_a_second_keeps_its_connection(server):
    """A message that takes 1.6 s on the link: the heartbeat the robot sends after it waits
    behind it, so a 1 s heartbeat timeout dropped the connection mid-request and the reply
    was lost (every edge plan on a 10 Mbit/s link fell back). The reply arrives."""

    import zmq

    from vlarun.runtime.robot.client import EdgeClient
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security

    relay, via = procs.start_relay(server.address, 2.0)  # 400 kB: 1.6 s
    client = EdgeClient(via, Security(insecure=True), zmq.Context.instance())
    try:
        _connected(client)
        took = client.probe(400_000, timeout_s=6.0)
        assert 1.5 < took < 4.0
    finally:
        client.close()
        procs.stop(relay)


def test_a_dropped_link_stays_capped_and_a_restored_one_shows_within_two_probes(server):
    """The monitor's probes, not the agent's requests, keep an idle robot's link estimate
    honest: at 1 Mbit/s a 96 KiB probe cannot come back within its timeout, and that failure
    is an upper bound renewed before the last one expires, so the estimate stays under
    2 Mbit/s for the whole drop (before: the bound of the request that timed out expired after
    2 s and the next request tried the edge again, waiting out its deadline); once slow, the
    light probes that time out renew it. After the restore the first light probe through
    calls a full one, whose sample lifts the bound."""
    import time

    import zmq

    from vlarun.runtime.robot.monitor import LinkMonitor
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security
    from vlarun.sched.link import Link

    relay, via = procs.start_relay(server.address, 1.0, schedule="5:200")
    t0 = time.monotonic()  # the relay counts its schedule from about now
    link = Link(200.0, 1.0)
    mon = LinkMonitor(via, Security(insecure=True), zmq.Context.instance()).start(wait_s=3.0)
    try:
        worst = 0.0
        while time.monotonic() - t0 < 4.5:  # the drop: every refresh, as a request would
            time.sleep(0.1)
            link.refresh()
            mon.feed(link)
            if time.monotonic() - t0 > 1.0:  # the first failed probe has had its 0.4 s
                worst = max(worst, link.bandwidth_mbps)
        assert worst < 2.5, f"the estimate rose to {worst:.1f} Mbit/s while the link was at 1"
        back = None
        while time.monotonic() - t0 < 9.0:
            time.sleep(0.05)
            link.refresh()
            mon.feed(link)
            if link.bandwidth_mbps > 20.0:
                back = time.monotonic() - t0 - 5.0
                break
        # one light probe's spacing (16 KiB at 1 Mbit/s: 0.13 s, at most half the link's
        # time) plus the light and the full probe (was 0.8 s spacing after a failed full one)
        assert back is not None and back < 0.8, f"restored link seen after {back} s"
        assert mon.light_probes > 0
    finally:
        mon.stop()
        procs.stop(relay)


def test_a_reset_socket_does_not_wait_behind_an_abandoned_request(server):
    """The agent resets its data socket after a request times out (``_try_remote``): the
    abandoned request's bytes still queued for a slow link would otherwise hold up every later
    message on that socket. At 2 Mbit/s, 400 kB take 1.6 s: a health check sent after them
    on the same socket misses a 0.5 s wait; on a fresh socket it comes back."""
    import time

    import zmq

    from vlarun.runtime.robot.client import EdgeClient, LinkDown
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security

    relay, via = procs.start_relay(server.address, 2.0)
    clients = [EdgeClient(via, Security(insecure=True), zmq.Context.instance()) for _ in "ab"]
    try:
        for client in clients:
            _connected(client)
        kept, fresh = clients
        for client in clients:
            with pytest.raises(LinkDown):
                client.probe(400_000, timeout_s=0.2)
        fresh.reset()
        with pytest.raises(LinkDown):
            kept.health(0.5)  # behind the 400 kB
        fresh_took = None
        for _ in range(50):  # the fresh socket reconnects first
            try:
                fresh_took = fresh.health(0.5)[1]
                break
            except LinkDown:
                time.sleep(0.05)
        assert fresh_took is not None and fresh_took < 0.5
    finally:
        for client in clients:
            client.close()
        procs.stop(relay)
