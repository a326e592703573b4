"""One log line per refusal, rate-limited (issue 45, 7: the servers logged nothing about the
requests they refused)."""

import contextlib
import logging

from vlarun.runtime.edge.refusal_log import RefusalLog


def test_one_line_per_kind_per_second_and_the_held_back_are_counted(caplog):
    caplog.set_level(logging.INFO, logger="vlarun.refusals")
    now = [0.0]
    log = RefusalLog(clock=lambda: now[0])
    for _ in range(50):  # a flood within one second: one line
        log.refused("busy", "robot-a", "the connection limit")
    log.refused("error", "robot-b", "ValueError: the state must be finite")  # another kind
    now[0] = 1.5
    log.refused("busy", "robot-a", "the connection limit")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused busy from robot-a: the connection limit",
        "refused error from robot-b: ValueError: the state must be finite",
        "refused busy from robot-a: the connection limit (+49 more since)",
    ]


def test_the_policy_server_logs_what_it_refuses(caplog):
    import numpy as np
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlarun.policy import Policy
    from vlarun.runtime import openpi

    caplog.set_level(logging.INFO, logger="vlarun.refusals")
    srv = openpi.OpenpiPolicyServer(
        Policy.load("tiny-ar"),
        openpi.get_layout("metaworld"),
        port=0,
        api_key="a-test-key-of-some-length",
    )
    stop = srv.start_in_thread(60)
    try:
        client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key="a-test-key-of-some-length")
        bad = {"image": np.zeros((64, 64, 3), np.uint8), "prompt": "open the drawer"}
        with contextlib.suppress(Exception):  # the refusal itself
            client.infer(bad)
    finally:
        stop()
    said = [r.getMessage() for r in caplog.records if r.name == "vlarun.refusals"]
    assert len(said) == 1 and said[0].startswith("refused error from openpi-") and "64" in said[0]
