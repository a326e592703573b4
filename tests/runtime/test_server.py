"""Edge server: results equal local execution, batching across robots, health, and robust
handling of malformed messages while well-formed robots keep being served."""

from __future__ import annotations

import random
import threading
import time
import tracemalloc

import pytest
import torch

from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.robot.client import EdgeClient, ping
from vlarun.runtime.transport import Security
from vlarun.stages import wire
from vlarun.stages.families import Workload, build_graph, graph_inputs
from vlarun.stages.packet import Packet

INSECURE = Security(insecure=True)
INSTRUCTION = "open the drawer"  # as conftest.py (not importable: several conftests)


def _local(policy, seed=0):
    cfg = policy.model.cfg
    ids = policy.text_ids(INSTRUCTION)
    graph = build_graph(cfg, policy.model, Workload(1, len(ids), "float32"))
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(1, 1, 3, cfg.image_size, cfg.image_size, generator=g)
    inputs = graph_inputs(cfg, images, [ids])
    return graph, inputs, graph.run(inputs, serialize=False), ids


def _client(address: str) -> EdgeClient:
    c = EdgeClient(address, INSECURE)
    ping(address, INSECURE, count=1, timeout_s=3.0)  # wait for the connection
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            c.health(0.5)
            return c
        except ConnectionError:
            time.sleep(0.02)
    raise AssertionError("edge did not answer")


def test_remote_segment_equals_local_and_reports_timings(server, policy):
    graph, inputs, local, ids = _local(policy)
    client = _client(server.address)
    try:
        visual = local.outputs["visual"]
        packet = Packet(
            {"visual": visual, "text_ids": inputs["text_ids"], "text_len": inputs["text_len"]}
        )
        meta = {"batch": 1, "text_tokens": len(ids)}
        rep = client.run(("prefill", "decode"), packet, ("actions",), 5.0, 5.0, meta)
        assert torch.equal(rep.packet["actions"], local.outputs["actions"])
        assert [t.stage for t in rep.timings] == ["prefill", "decode"]
        assert all(t.compute_s > 0 and t.batch == 1 for t in rep.timings)
        assert 0 < rep.server_s < rep.wall_s
        # whole graph remotely, reply reduced to bf16 on the way back
        full = client.run(
            ("vision", "prefill", "decode"),
            inputs,
            ("actions",),
            5.0,
            5.0,
            meta,
            wire.Codec("bf16"),
        )
        assert torch.allclose(full.packet["actions"], local.outputs["actions"], atol=1e-2)
        with pytest.raises(RuntimeError, match="need tensors"):
            client.run(("decode",), packet, ("actions",), 5.0, 5.0, meta)
    finally:
        client.close()


def test_health_and_ping(server):
    r = ping(server.address, INSECURE, count=3, timeout_s=3.0)
    assert r["rtt_ms"] > 0 and r["count"] == 3
    assert set(r["queue"]) == {"vision", "prefill", "decode"}
    assert r["health"]["model"] == "tiny-ar" and r["health"]["ok"]


def test_batches_same_stage_from_two_robots(policy):
    cfg = ServerConfig(batch_window_s=0.2)  # generous: both requests surely inside one window
    graph, inputs, local, ids = _local(policy)
    _, inputs2, local2, _ = _local(policy, seed=1)
    with EdgeServer(policy, INSECURE, cfg) as srv:
        clients = [_client(srv.address) for _ in range(2)]
        for robot in (b"a", b"b"):  # both robots active
            srv.core.touch(robot, time.monotonic())
        out = [None, None]

        def go(i, inp):
            meta = {"batch": 1, "text_tokens": len(ids)}
            out[i] = clients[i].run(
                ("vision",), inp.subset(["images"]), ("visual",), 5.0, 5.0, meta
            )

        threads = [
            threading.Thread(target=go, args=(i, p)) for i, p in enumerate((inputs, inputs2))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for c in clients:
            c.close()
    assert [r.timings[0].batch for r in out] == [2, 2]
    assert torch.allclose(out[0].packet["visual"], local.outputs["visual"], atol=1e-5)
    assert torch.allclose(out[1].packet["visual"], local2.outputs["visual"], atol=1e-5)


def _flood(server, dealer, vision_request, malformed, n: int, seed: int = 0) -> dict:
    """n malformed messages from one robot while another robot keeps making good requests."""
    bad = dealer(server.address)
    good = _client(server.address)
    stop, good_ok = threading.Event(), []

    def well_formed():
        meta = {"batch": 1, "text_tokens": 12}
        images = Packet({"images": torch.rand(1, 1, 3, 128, 128)})
        while not stop.is_set():
            rep = good.run(("vision",), images, ("visual",), 5.0, 5.0, meta)
            good_ok.append(rep.packet["visual"].shape == (1, 256, 192))

    t = threading.Thread(target=well_formed)
    t.start()
    rng = random.Random(seed)
    errors = 0
    tracemalloc.start()
    try:
        for _ in range(n):
            bad.send_multipart(malformed(vision_request, rng))
            reply = wire.decode(bad.recv_multipart())  # RCVTIMEO: raises instead of hanging
            errors += reply.kind == "error"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stop.set()
        t.join(10)
        good.close()
    return {"errors": errors, "peak": peak, "good": good_ok}


def test_malformed_messages_answered_and_good_robot_served(
    server, dealer, vision_request, malformed
):
    r = _flood(server, dealer, vision_request, malformed, 500)
    assert r["errors"] == 500
    assert r["peak"] < 64 << 20  # claims ran to terabytes; nothing near that was allocated
    assert r["good"] and all(r["good"])
    assert server._threads[0].is_alive() and server._threads[1].is_alive()
    assert ping(server.address, INSECURE, count=1)["health"]["errors"] >= 500


@pytest.mark.slow
def test_ten_thousand_malformed_messages(server, dealer, vision_request, malformed):
    r = _flood(server, dealer, vision_request, malformed, 10_000, seed=1)
    assert r["errors"] == 10_000 and r["peak"] < 64 << 20
    assert r["good"] and all(r["good"])


def test_cli_ping_and_keys(server, tmp_path, capsys):
    import json

    from vlarun.cli import main

    assert main(["ping", "--edge", server.address, "--insecure", "--json", "--count", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rtt_ms"] > 0 and set(out["queue"]) == {"vision", "prefill", "decode"}
    assert main(["keys", "--out", str(tmp_path), "--name", "robot7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["public"].endswith("robot7.key")
    assert main(["ping", "--edge", "tcp://127.0.0.1:9", "--insecure", "--timeout-s", "0.3"]) == 2
    assert "no answer" in capsys.readouterr().err


def test_bandwidth_probe_is_answered(server):
    client = _client(server.address)
    try:
        assert 0 < client.probe(200_000, timeout_s=5.0) < 5.0
    finally:
        client.close()


def test_overloaded_edge_refuses_at_once(policy):
    cfg = ServerConfig(max_queued=0)
    with EdgeServer(policy, INSECURE, cfg) as srv:
        client = _client(srv.address)
        try:
            images = Packet({"images": torch.rand(1, 1, 3, 128, 128)})
            with pytest.raises(RuntimeError, match="overloaded"):
                client.run(
                    ("vision",), images, ("visual",), 5.0, 5.0, {"batch": 1, "text_tokens": 12}
                )
        finally:
            client.close()


def test_admission_refuses_at_once_what_cannot_finish_before_its_deadline(policy, dealer):
    """A burst of requests whose deadlines fit only a few of them: the edge answers every one,
    most either with a result or with a refusal on arrival (fast, naming the prediction)
    instead of queueing them to expire; a request with time to spare is served."""
    cfg = ServerConfig(max_batch=1, admission=True)
    with EdgeServer(policy, INSECURE, cfg) as srv:
        srv.warmup()
        est = srv.queues.work_s(("vision",))
        assert est > 0
        ids = policy.text_ids(INSTRUCTION)
        packet = Packet({"images": torch.rand(1, 1, 3, 128, 128)})
        budget = 3.5 * est  # room for about three requests in a row
        meta = {"batch": 1, "text_tokens": len(ids), "want": ["visual"]}
        socks = [dealer(srv.address) for _ in range(12)]
        for rid, sock in enumerate(socks, start=1):
            sock.send_multipart(
                wire.encode(
                    wire.Message(
                        "data", rid=rid, stage="vision", deadline_s=budget, meta=meta, packet=packet
                    )
                )
            )
        kinds = []
        for sock in socks:
            reply = wire.decode(sock.recv_multipart())
            if reply.kind == "result":
                kinds.append("result")
            elif "refused: predicted to finish" in reply.meta["error"]:
                kinds.append("refused")
            else:  # admitted on a prediction the machine then did not keep
                assert reply.meta["error"] == "deadline passed on the edge", reply.meta
                kinds.append("expired")
        assert kinds.count("result") >= 1 and kinds.count("refused") >= 6, kinds
        assert srv.stats["refused"] == kinds.count("refused")
        assert srv.stats["expired"] == kinds.count("expired")
        assert srv.stats["errors"] == 0  # a refusal is not an error
        roomy = wire.Message(
            "data", rid=99, stage="vision", deadline_s=100 * est + 1.0, meta=meta, packet=packet
        )
        socks[0].send_multipart(wire.encode(roomy))
        assert wire.decode(socks[0].recv_multipart()).kind == "result"


def test_a_stale_estimate_is_not_enough_to_refuse(policy, dealer):
    """Refusals rest on fresh measurements: once the edge has not run a stage for a while, a
    request is admitted again and measures it, so a busy spell cannot close the edge for good."""
    cfg = ServerConfig(max_batch=1, admission=True, admission_fresh_s=0.3)
    with EdgeServer(policy, INSECURE, cfg) as srv:
        srv.warmup()
        est = srv.queues.work_s(("vision",))
        ids = policy.text_ids(INSTRUCTION)
        packet = Packet({"images": torch.rand(1, 1, 3, 128, 128)})
        meta = {"batch": 1, "text_tokens": len(ids), "want": ["visual"]}
        sock = dealer(srv.address)
        tight = wire.Message(
            "data", rid=1, stage="vision", deadline_s=0.2 * est, meta=meta, packet=packet
        )
        sock.send_multipart(wire.encode(tight))
        assert "refused" in wire.decode(sock.recv_multipart()).meta.get("error", "")
        time.sleep(0.4)  # the estimate is now stale
        sock.send_multipart(
            wire.encode(
                wire.Message(
                    "data", rid=2, stage="vision", deadline_s=0.2 * est, meta=meta, packet=packet
                )
            )
        )
        reply = wire.decode(sock.recv_multipart())
        assert "refused" not in reply.meta.get("error", "")  # admitted: ran (or expired) instead
        assert srv.stats["refused"] == 1
