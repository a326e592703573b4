"""Who the edge serves, quick. Without --authorized-keys a Curve edge serves any client that
knows its public key (what docs/security.md says; here on loopback); so `serve-edge` on a
non-loopback --host refuses to start without --authorized-keys, and with --insecure, unless
--allow-any-client is given: one line naming the flags, before anything loads or binds."""

from __future__ import annotations

import pytest
import zmq

from vlarun.apps.runtime import ServeEdgeOptions
from vlarun.cli import main
from vlarun.policy import Policy
from vlarun.runtime.edge.server import EdgeServer
from vlarun.runtime.robot.client import ping
from vlarun.runtime.transport import KeyPair, Security, edge_security, generate_keys, load_keys


def test_without_authorized_keys_any_client_that_knows_the_public_key_is_served(tmp_path):
    keys = generate_keys(tmp_path, "edge")
    with EdgeServer(Policy.load("tiny-ar"), edge_security(False, keys["secret"], None)) as srv:
        stranger = Security(
            own=KeyPair(*zmq.curve_keypair()), server_public=load_keys(keys["public"]).public
        )
        r = ping(srv.address, stranger, count=1, timeout_s=5.0)
        assert r["secure"] and r["health"]["ok"]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--host", "0.0.0.0"], ("--authorized-keys", "--allow-any-client")),
        (["--host", "192.0.2.7", "--insecure"], ("--insecure", "--allow-any-client")),
        (["--host", "::", "--authorized-keys", "robots", "--insecure"], ("--allow-any-client",)),
        (["--host", "eth0"], ("--authorized-keys", "--allow-any-client")),
    ],
)
def test_a_non_loopback_edge_needs_authorized_keys_or_allow_any_client(argv, names, capsys):
    assert main(["serve-edge", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in names), err
    assert "0.0.0.0" in err or argv[1] in err


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"host": "localhost"},
        {"host": "::1", "insecure": True},
        {"host": "0.0.0.0", "authorized_keys": "robots"},
        {"host": "0.0.0.0", "allow_any_client": True},
        {"host": "0.0.0.0", "insecure": True, "allow_any_client": True},
    ],
)
def test_what_starts_without_complaint(kw):
    ServeEdgeOptions(**kw)  # the check is at parse time: nothing is bound here
