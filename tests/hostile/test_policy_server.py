"""`serve-policy` against hostile clients, quick subset (runs in `make test`): each check
starts its own server on loopback, with limits small enough to reach in a fraction of a
second, and asserts the server answered in one line, kept serving, and logged no traceback.
The heavy versions (RSS measured on a server process) are in test_policy_server_slow.py."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
import urllib.request

import msgpack
import numpy as np
import pytest

pytest.importorskip("openpi_client")
from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from vlarun.policy import Policy  # noqa: E402
from vlarun.runtime import openpi  # noqa: E402
from vlarun.runtime.edge.server import MAX_SEEN  # noqa: E402

KEY = "hostile-key"
OBS = {"image": np.zeros((128, 128, 3), np.uint8), "prompt": "open the drawer"}


@pytest.fixture(scope="module")
def policy():
    import torch

    torch.set_num_threads(1)  # the model's threads would only fight the server's for cores
    return Policy.load("tiny-ar")


@pytest.fixture(scope="module")
def shared(policy):
    """One server for the module (building one warms a model up: seconds on a busy CPU)."""
    lim = openpi.ServeLimits(max_frame=8 << 20, max_inflight_bytes=16 << 20)
    srv = openpi.OpenpiPolicyServer(
        policy, openpi.get_layout("metaworld"), port=0, api_key=KEY, limits=lim
    )
    stop = srv.start_in_thread(60)
    yield srv
    stop()


@pytest.fixture
def serve(shared):
    """The shared server with these limits for one test (the server reads them per request;
    the handshake timeout and frame size are fixed at start, so tests leave them alone)."""
    base = shared.limits

    def start(**limits) -> openpi.OpenpiPolicyServer:
        shared.limits = dataclasses.replace(base, **limits)
        return shared

    yield start
    shared.limits = base


def _raw(srv, key: str | None = KEY, **kw):
    headers = {"Authorization": f"Api-Key {key}"} if key else {}
    ws = connect(
        f"ws://127.0.0.1:{srv.port}",
        additional_headers=headers,
        max_size=None,
        compression=None,
        open_timeout=5,
        **kw,
    )
    ws.recv(timeout=5)  # the metadata frame
    return ws


def _health_ms(srv) -> float:
    t0 = time.perf_counter()
    assert urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz", timeout=5).read()
    return 1e3 * (time.perf_counter() - t0)


def _no_tracebacks(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


def test_a_huge_prompt_is_refused_while_parsing_and_health_stays_fast(serve, caplog):
    """A 4 MB prompt (openpi's protocol, a real client) is refused with one line naming the
    limit before anything is tokenized; /healthz answers meanwhile, and so do others."""
    caplog.set_level(logging.INFO)
    srv = serve()
    client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="longer than 4096 bytes") as err:
        client.infer({**OBS, "prompt": "x" * 4_000_000})
    assert time.perf_counter() - t0 < 5.0
    assert "Traceback" not in str(err.value) and "/" not in str(err.value).split("\n", 1)[1]
    assert _health_ms(srv) < 1000
    other = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
    assert other.infer(OBS)["actions"].shape == (4, 4)
    with pytest.raises(ValueError, match="at most 10"):  # bytes, not str: the same check
        openpi.get_layout("metaworld").inputs({**OBS, "prompt": b"y" * 11}, 1, 10)
    _no_tracebacks(caplog)


def test_a_frame_of_a_million_tiny_lists_is_refused_before_it_is_built():
    frame = msgpack.packb({"image": [[0]] * 1_000_000, "prompt": "x"})
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="exceeds max_array_len|at most 256 lists"):
        openpi.unpackb(frame)
    nested = msgpack.packb({"image": [[[0] * 4] * 1000] * 3, "prompt": "x"})
    with pytest.raises(ValueError, match="at most 256 lists and maps"):
        openpi.unpackb(nested)
    assert time.perf_counter() - t0 < 2.0


def test_two_authorization_headers_get_400_and_no_traceback(serve, caplog):
    caplog.set_level(logging.INFO)
    srv = serve()
    from websockets.datastructures import Headers

    headers = Headers([("Authorization", f"Api-Key {KEY}"), ("Authorization", "Api-Key x")])
    with pytest.raises(InvalidStatus) as err:
        connect(f"ws://127.0.0.1:{srv.port}", additional_headers=headers, open_timeout=5)
    assert err.value.response.status_code == 400
    assert _raw(srv) is not None  # and the server still serves
    _no_tracebacks(caplog)


def test_connections_beyond_the_cap_get_503_busy(serve):
    base = serve().connections  # earlier tests' clients may still be open
    srv = serve(max_connections=base + 2)
    held = [_raw(srv), _raw(srv)]
    with pytest.raises(InvalidStatus) as err:
        _raw(srv)
    assert err.value.response.status_code == 503 and b"busy" in err.value.response.body
    held[0].close()
    deadline = time.monotonic() + 5
    while srv.connections >= base + 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _raw(srv) is not None  # a freed slot is usable again
    held[1].close()


def test_a_request_beyond_its_time_budget_is_busy_at_once(serve):
    """A budget no request can meet: the client hears "busy" (close 1013) without waiting."""
    srv = serve(budget_s=0.001)
    client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="busy: .*--budget-s"):
        client.infer(OBS)
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(ConnectionClosed) as closed:
        client.infer(OBS)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


def test_bytes_in_flight_beyond_the_total_cap_are_busy(serve):
    """The total cap counts every connection's frames: with one 1 MiB frame's room, a frame
    that would not fit while another is in flight is refused; the first is still served."""
    srv = serve(max_inflight_bytes=8 << 20)
    srv.inflight_bytes = (8 << 20) - 1000  # another client's request, as the server counts it
    ws = _raw(srv)
    ws.send(openpi.packb(OBS))
    reply = ws.recv(timeout=10)
    assert isinstance(reply, str) and reply.startswith("vlarun: busy:") and "inflight" in reply
    srv.inflight_bytes = 0
    client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
    assert client.infer(OBS)["actions"].shape == (4, 4)


def test_a_client_that_leaves_has_its_queued_work_dropped_without_a_traceback(serve, caplog):
    """Clients send a request and disconnect at once while others' requests occupy the
    model: the leavers' queued requests are dropped (cancelled, never run) and nothing is
    logged; the server keeps serving."""
    caplog.set_level(logging.INFO)
    srv = serve()
    base, gone, served = srv.connections, srv.refusals["gone"], srv.requests
    frame = openpi.packb(OBS)
    for _ in range(12):
        ws = _raw(srv)
        ws.send(frame)
        ws.close()
    deadline = time.monotonic() + 30
    while srv.connections > base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.connections == base and srv.inflight_bytes == 0
    assert sum(srv.edge.queues.depth().values()) == 0
    assert srv.refusals["gone"] - gone + srv.requests - served >= 12
    assert srv.edge.stats["cancelled"] >= 1
    client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
    assert client.infer(OBS)["actions"].shape == (4, 4)
    _no_tracebacks(caplog)


def test_silent_peers_are_closed_by_the_handshake_and_idle_timeouts(policy):
    """A handshake that never ends, and an authenticated connection that never sends its
    first request: closed by their own timeouts, not the (long) idle one between requests
    (40 silent connections held 30 of 30 slots for 120 s, issue 45, 12)."""
    lim = openpi.ServeLimits(handshake_timeout_s=0.5, idle_timeout_s=120, first_frame_timeout_s=0.5)
    srv = openpi.OpenpiPolicyServer(
        policy, openpi.get_layout("metaworld"), port=0, api_key=KEY, limits=lim
    )
    stop = srv.start_in_thread(60)
    try:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a handshake that never ends
        t0 = time.perf_counter()
        while raw.recv(4096):  # the server closes it; recv returns b""
            pass
        assert time.perf_counter() - t0 < 3.0
        raw.close()
        ws = _raw(srv)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    finally:
        stop()


def test_the_seen_clients_table_is_pruned(serve):
    srv = serve()
    now = time.monotonic()
    for k in range(MAX_SEEN):  # connections that each sent one request, long ago
        srv.edge.core.touch(f"gone-{k}".encode(), now - 5.0)
    srv.edge.core.touch(b"live", now)
    assert list(srv.edge.core.seen()) == [b"live"]


def test_a_numpy_scalar_prompt_is_refused_before_its_string_is_built(serve, caplog):
    """15 MiB of bytes tagged as a numpy "<U1" scalar became a 63 MB string before the prompt
    limit saw it (issue 45, 10): a numpy scalar must be one number, checked on its header."""
    caplog.set_level(logging.INFO)
    srv = serve()
    # openpi's msgpack_numpy tags with bytes keys (b"__npgeneric__"), as its client sends.
    generic = {b"__npgeneric__": True, b"data": b"\0" * (7 << 20), b"dtype": "<U1"}
    image = {
        b"__ndarray__": True,
        b"data": OBS["image"].tobytes(),
        b"dtype": "|u1",
        b"shape": [128, 128, 3],
    }
    frame = msgpack.packb({"image": image, "prompt": generic}, use_bin_type=True)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="a numpy scalar must be one number"):
        openpi.unpackb(frame, 4096)
    assert time.perf_counter() - t0 < 1.0
    ws = _raw(srv)
    ws.send(frame)
    reply = ws.recv(timeout=30)
    assert "a numpy scalar must be one number" in str(reply)
    ws.close()
    small = {b"__npgeneric__": True, b"data": b"abcd", b"dtype": "<U1"}  # a str subclass
    with pytest.raises(ValueError, match="must be one number"):
        openpi.unpackb(msgpack.packb({"prompt": small}, use_bin_type=True))
    number = {b"__npgeneric__": True, b"data": 2.5, b"dtype": "<f4"}  # openpi's own encoding
    assert openpi.unpackb(msgpack.packb({"x": number}, use_bin_type=True))["x"] == 2.5
    _no_tracebacks(caplog)


@pytest.mark.parametrize(
    "state,needle",
    [
        (np.array(["2026-01-01"] * 4, dtype="datetime64[D]"), "must be numbers, got dtype"),
        (np.array([np.nan, 0, 0, 0], np.float32), "must be finite: entry 0 is nan"),
    ],
)
def test_a_state_that_is_not_finite_numbers_is_refused(state, needle):
    """datetime64 converts to float silently; NaN passes any range check (issue 45, 13)."""
    with pytest.raises(ValueError, match=needle):
        openpi.get_layout("metaworld").inputs({**OBS, "state": state}, 1, 4096)


def test_a_state_of_the_wrong_length_is_refused_by_the_server():
    """1000 floats for a 4-number state: refused by the policy before anything runs."""
    srv = openpi.OpenpiPolicyServer(
        Policy.load("mt10p-oft"), openpi.get_layout("metaworld"), port=0, api_key=KEY
    )
    stop = srv.start_in_thread(60)
    try:
        client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
        obs = {"image": OBS["image"], "second_image": OBS["image"], "prompt": "reach the goal"}
        with pytest.raises(RuntimeError, match="reads a state of 4 numbers, got 1000"):
            client.infer({**obs, "state": np.zeros(1000, np.float32)})
        again = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
        assert again.infer({**obs, "state": np.zeros(4, np.float32)})["actions"].shape[1] == 4
    finally:
        stop()


def test_the_metadata_says_what_to_send(serve):
    """Keys, frame sizes and the state's length, before the first request (a 224 px frame to
    tiny-ar failed with "expects 1x128x128x3" and nothing had told the client 128)."""
    srv = serve()
    meta = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY).get_server_metadata()
    assert meta["image_shapes"] == {"image": [128, 128, 3]}
    assert meta["state_size"] == 0 and meta["image_resize"] is False


def test_one_api_key_cannot_hold_every_connection_slot(tmp_path):
    """Two clients' keys, a share of one connection each: a second connection with key A is
    answered 503 naming the per-key limit while key B still gets in; once A's first connection
    closes, A gets in again (issue 45, 12: one key held 30 of 30 slots)."""
    import websockets.sync.client as ws_client
    from websockets.exceptions import InvalidStatus

    from vlarun.policy import Policy
    from vlarun.runtime import openpi
    from vlarun.runtime.transport import read_keys

    keys = tmp_path / "keys"
    keys.write_text("# one per client\nkey-a\nkey-b\n")
    keys.chmod(0o600)
    assert read_keys(keys) == ("key-a", "key-b")
    srv = openpi.OpenpiPolicyServer(
        Policy.load("tiny-ar"),
        openpi.get_layout("metaworld"),
        port=0,
        api_key=read_keys(keys),
        limits=openpi.ServeLimits(max_connections=2),
    )
    stop = srv.start_in_thread(30)
    url = f"ws://127.0.0.1:{srv.port}"

    def connect(key: str):
        return ws_client.connect(
            url,
            additional_headers={"Authorization": f"Api-Key {key}"},
            max_size=None,
            open_timeout=10,
        )

    try:
        a = connect("key-a")
        a.recv(timeout=10)  # the metadata frame: the handler holds the slot
        with pytest.raises(InvalidStatus) as refused:
            connect("key-a")
        assert refused.value.response.status_code == 503
        assert b"per-key" in refused.value.response.body or b"share" in refused.value.response.body
        b = connect("key-b")
        b.recv(timeout=10)
        a.close()
        deadline = time.monotonic() + 10
        while srv.by_key.get(0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        again = connect("key-a")
        again.recv(timeout=10)
        again.close()
        b.close()
    finally:
        stop()
