"""Plans as segments: what each remote request carries and brings back, and the schema the
edge checks requests against."""

from __future__ import annotations

import pytest

from vlarun.models.presets import get_preset
from vlarun.runtime.segments import Schema, segments, wanted
from vlarun.stages.families import Workload, build_graph
from vlarun.stages.packet import PacketError

CFG = get_preset("tiny-ar")
GRAPH = build_graph(CFG, None, Workload(1, 12, "float32"))


def _plan(*roles: str) -> dict[str, str]:
    return dict(zip(("vision", "prefill", "decode"), roles, strict=True))


def test_vision_here_rest_there_sends_visual_and_gets_actions():
    plan = _plan("robot", "edge", "edge")
    segs = segments(GRAPH, plan)
    assert [(s.role, s.stages) for s in segs] == [
        ("robot", ("vision",)),
        ("edge", ("prefill", "decode")),
    ]
    assert segs[1].needs == ("visual", "text_ids", "text_len")  # the KV cache stays on the edge
    assert wanted(GRAPH, plan, segs[1]) == ("actions", "action_ids")


def test_edge_prefill_sends_the_kv_cache_back_for_a_robot_decode():
    plan = _plan("edge", "edge", "robot")
    seg = segments(GRAPH, plan)[0]
    assert seg.needs == ("images", "text_ids", "text_len")
    assert set(wanted(GRAPH, plan, seg)) == {"kv_k", "kv_v", "kv_valid", "last_hidden", "next_pos"}


def test_alternating_plan_makes_three_segments():
    plan = _plan("edge", "robot", "edge")
    segs = segments(GRAPH, plan)
    assert [s.role for s in segs] == ["edge", "robot", "edge"]
    assert wanted(GRAPH, plan, segs[0]) == ("visual",)


def test_schema_gives_exact_specs_and_refuses_bad_requests():
    schema = Schema(CFG, "float32", max_batch=4)
    seg, specs = schema.expected(schema.parse_stages("prefill+decode"), 2, 12)
    assert specs["visual"].shape == (2, CFG.num_visual, CFG.llm.hidden_size)
    assert specs["text_ids"].shape == (2, 12)
    for text in ("decode+prefill", "vision+decode", "", "x", "vision+vision"):
        with pytest.raises(PacketError):
            schema.parse_stages(text)
    for batch, tokens in ((0, 12), (5, 12), (1, 0), (1, 10**6), ("1", 12), (1, 2.5)):
        with pytest.raises(PacketError):
            schema.expected(("vision",), batch, tokens)
