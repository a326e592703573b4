"""Reservations across robots: the edge's committed schedule (whose stage runs when, due when)
comes with every reply and health answer, and a robot's scheduler places its edge stages after
the slots that run before it (EDF), so another robot's work moves its plan."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from vlarun.runtime.agent import AgentConfig
from vlarun.runtime.client import EdgeClient, LinkDown, ping
from vlarun.runtime.planning import decide, edge_state, make_scheduler
from vlarun.runtime.server import EdgeServer, ServerConfig, robot_id
from vlarun.runtime.transport import Security
from vlarun.sched.link import Link
from vlarun.stages.families import graph_inputs

INSECURE = Security(insecure=True)
INSTRUCTION = "open the drawer"
STAGES = ("vision", "prefill", "decode")


def _inputs(policy, seed):
    cfg = policy.model.cfg
    ids = policy.text_ids(INSTRUCTION)
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(1, 1, 3, cfg.image_size, cfg.image_size, generator=g)
    return graph_inputs(cfg, images, [ids]), {"batch": 1, "text_tokens": len(ids)}


def _client(address: str) -> EdgeClient:
    c = EdgeClient(address, INSECURE)
    end = time.monotonic() + 5
    while True:  # the connection takes a moment; IMMEDIATE refuses sends until then
        try:
            c.health(0.5)
            return c
        except LinkDown:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def test_the_edge_returns_its_committed_schedule_across_two_robots(policy):
    cfg = ServerConfig(max_batch=1)  # one request per batch: the second robot must wait
    with EdgeServer(policy, INSECURE, cfg) as srv:
        srv.warmup()
        ping(srv.address, INSECURE, count=1, timeout_s=3.0)
        clients = [_client(srv.address) for _ in range(2)]
        seen: list[list[dict]] = []
        replies = []
        stop = threading.Event()

        def watch() -> None:  # what a third robot's health request would be told
            while not stop.is_set():
                seen.append(srv.schedule())
                time.sleep(0.002)

        def robot(k: int) -> None:
            inputs, meta = _inputs(policy, k)
            replies.append(clients[k].run(STAGES, inputs, ("actions",), 5.0, 5.0, meta))

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=robot, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stop.set()
        watcher.join()
        health = clients[0].health(2.0)[0]
        for c in clients:
            c.close()
    both = [s for s in seen if len({slot["robot"] for slot in s}) == 2]
    assert both, "the schedule never held both robots' work"
    sched = max(both, key=len)
    for a, b in zip(sched, sched[1:], strict=False):  # one worker: slots follow one another
        assert b["start_ms"] >= a["end_ms"] - 1e-6 and b["end_ms"] >= b["start_ms"]
        assert b["deadline_ms"] >= a["deadline_ms"] - 1e-6 or a["start_ms"] == 0.0  # EDF
    assert {slot["stage"] for slot in sched} <= set(STAGES)
    assert len(replies) == 2 and all(isinstance(r.schedule, list) for r in replies)
    assert health["schedule"] == []  # nothing left once both are answered


def test_a_robot_plans_its_edge_stages_after_other_robots_reservations(policy):
    text = len(policy.text_ids(INSTRUCTION))
    sched = make_scheduler(policy.model.cfg, AgentConfig(slo_s=0.5), text, "float32")
    link = Link(1000.0, 1.0)
    edge_only = int(np.flatnonzero(sched.edge.all(axis=1))[0])
    robot_only = int(np.flatnonzero(~sched.edge.any(axis=1))[0])
    idle = sched.score(link, 0.0, edge_state({}, []))
    other = robot_id(b"another robot")
    busy = [  # another robot's decode running for 300 ms, then its vision queued, due first
        {"robot": other, "stage": "decode", "start_ms": 0.0, "end_ms": 300.0, "deadline_ms": 320.0},
        {"robot": other, "stage": "vision", "start_ms": 300.0, "end_ms": 350.0,
         "deadline_ms": 400.0},
        # due after this request's deadline and not started: EDF serves this request first
        {"robot": other, "stage": "vision", "start_ms": 350.0, "end_ms": 5000.0,
         "deadline_ms": 9000.0},
    ]  # fmt: skip
    state = edge_state({}, busy, age_s=0.0, slo_s=0.5)
    got = [(r.start, r.end) for r in state.reservations]
    assert np.allclose(got, [(0.0, 0.3), (0.3, 0.35)])
    loaded = sched.score(link, 0.0, state)
    delay = loaded.latency[edge_only] - idle.latency[edge_only]
    assert 0.34 <= delay <= 0.36  # its edge stages start after both slots that go first
    assert loaded.latency[robot_only] == idle.latency[robot_only]  # the robot's own work
    # An older schedule: the running slot has 100 ms less left.
    aged = sched.score(link, 0.0, edge_state({}, busy, age_s=0.1, slo_s=0.5))
    assert abs(loaded.latency[edge_only] - aged.latency[edge_only] - 0.1) < 1e-9
    # A schedule that fills the edge past the deadline: the plan keeps every stage home.
    full = [{"robot": other, "stage": "decode", "start_ms": 0.0, "end_ms": 10_000.0,
             "deadline_ms": 100.0}]  # fmt: skip
    plan = decide(sched, link, {}, full, 0.0)
    assert set(plan.placement.values()) == {"robot"}
