"""The edge refuses what a header cannot promise, quick: NaN / infinity tensors, a
`text_len` outside 1..the width of `text_ids`, token ids outside the vocabulary, a `next_pos`
beyond the cache. Each is answered with a one-line error before any model work (the edge's
compute time does not move), and the next valid request is served."""

from __future__ import annotations

import time

import pytest
import torch

from vlarun.policy import Policy
from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.robot.client import EdgeClient, ping
from vlarun.runtime.transport import Security
from vlarun.stages.families import Workload, build_graph, graph_inputs
from vlarun.stages.packet import Packet

INSECURE = Security(insecure=True)
STAGES = ("vision", "prefill", "decode")


@pytest.fixture(scope="module")
def edge():
    torch.set_num_threads(1)
    policy = Policy.load("tiny-ar")
    cfg = policy.model.cfg
    ids = policy.text_ids("open the drawer")
    inputs = graph_inputs(cfg, torch.rand(1, 1, 3, cfg.image_size, cfg.image_size), [ids])
    graph = build_graph(cfg, policy.model, Workload(1, len(ids), "float32"))
    run = graph.run(inputs, serialize=False).outputs
    with EdgeServer(policy, INSECURE, ServerConfig()) as srv:
        ping(srv.address, INSECURE, count=1, timeout_s=5.0)
        client = EdgeClient(srv.address, INSECURE)
        end = time.monotonic() + 5
        while time.monotonic() < end:  # connected when health is answered
            try:
                client.health(0.5)
                break
            except ConnectionError:
                time.sleep(0.02)
        try:
            yield srv, client, dict(inputs.tensors), run, {"batch": 1, "text_tokens": len(ids)}
        finally:
            client.close()


def _bad(t: torch.Tensor, where, value) -> torch.Tensor:
    t = t.clone()
    t[where] = value
    return t


CASES = {
    "nan image": (
        STAGES,
        lambda i, r: {**i, "images": _bad(i["images"], (0, 0, 0, 5), float("nan"))},
        "'images' holds NaN or infinity",
    ),  # noqa: E501
    "inf image": (
        STAGES,
        lambda i, r: {**i, "images": _bad(i["images"], (0, 0, 1), float("inf"))},
        "'images' holds NaN or infinity",
    ),  # noqa: E501
    "-inf visual": (
        STAGES[1:],
        lambda i, r: {
            "visual": _bad(r["visual"], (0, 3), -float("inf")),
            "text_ids": i["text_ids"],
            "text_len": i["text_len"],
        },
        "'visual' holds NaN",
    ),  # noqa: E501
    "nan kv cache": (
        STAGES[2:],
        lambda i, r: {
            **{k: r[k] for k in ("kv_k", "kv_valid", "last_hidden", "next_pos")},
            "kv_v": _bad(r["kv_v"], (0, 0, 0, 0), float("nan")),
        },
        "'kv_v' holds NaN",
    ),  # noqa: E501
    "text_len 0": (
        STAGES,
        lambda i, r: {**i, "text_len": torch.tensor([0])},
        "text_len must be in 1..",
    ),  # noqa: E501
    "text_len negative": (
        STAGES,
        lambda i, r: {**i, "text_len": torch.tensor([-7])},
        "text_len must be in 1..",
    ),  # noqa: E501
    "text_len past text_ids": (
        STAGES,
        lambda i, r: {**i, "text_len": i["text_len"] + 1},
        "text_len must be in 1..",
    ),  # noqa: E501
    "text_len huge": (
        STAGES,
        lambda i, r: {**i, "text_len": torch.tensor([2**62])},
        "text_len must be in 1..",
    ),  # noqa: E501
    "token id past the vocabulary": (
        STAGES,
        lambda i, r: {**i, "text_ids": _bad(i["text_ids"], (0, 2), 10**9)},
        "text_ids must be token ids",
    ),  # noqa: E501
    "negative token id": (
        STAGES,
        lambda i, r: {**i, "text_ids": _bad(i["text_ids"], (0, 0), -1)},
        "text_ids must be token ids",
    ),  # noqa: E501
    "next_pos past the cache": (
        STAGES[2:],
        lambda i, r: {
            **{k: r[k] for k in ("kv_k", "kv_v", "kv_valid", "last_hidden")},
            "next_pos": r["next_pos"] + 10**6,
        },
        "next_pos must be in 0..",
    ),  # noqa: E501
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_values_are_refused_in_one_line_before_any_model_work(edge, case):
    srv, client, inputs, run, meta = edge
    stages, make, why = CASES[case]
    before = dict(srv.stats)
    with pytest.raises(RuntimeError) as err:
        client.run(stages, Packet(make(inputs, run)), ("actions",), 5.0, 5.0, meta)
    msg = str(err.value)
    assert why in msg and "\n" not in msg and len(msg) < 300, msg
    assert srv.stats["errors"] == before["errors"] + 1
    assert srv.stats["compute_s"] == before["compute_s"]  # refused before any stage ran
    assert srv.stats["replies"] == before["replies"]


def test_a_valid_request_is_served_after_the_bad_ones(edge):
    srv, client, inputs, run, meta = edge
    t0 = time.monotonic()
    rep = client.run(STAGES, Packet(inputs), ("actions",), 5.0, 5.0, meta)
    assert torch.equal(rep.packet["actions"], run["actions"]) and time.monotonic() - t0 < 5.0
