"""Running the stage graph, with every packet serialised between stages, equals a direct call."""

import pytest
import torch

from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA
from vlarun.stages.families import Workload, build_graph, graph_inputs

TINY = ["tiny-openvla", "tiny-openvla-oft", "tiny-cogact", "tiny-pi0", "tiny-smolvla"]
# Two views (the second pooled) and a proprio token, in every head family.
MT10 = ["mt10-ar", "mt10-oft", "mt10-dit"]


@pytest.mark.parametrize("name", TINY + MT10)
def test_graph_run_equals_direct_call(name):
    torch.manual_seed(0)
    cfg = get_preset(name)
    model = VLA(cfg).eval()
    images = torch.rand(2, cfg.num_images, 3, cfg.image_size, cfg.image_size)
    ids = [[11, 12, 13, 14, 15], [21, 22, 23]]
    state = torch.randn(2, cfg.proprio_dim) if cfg.proprio_dim else None
    packet = graph_inputs(cfg, images, ids, state=state)
    direct = model.act(
        images, ids, noise=packet.tensors.get("noise"), state=packet.tensors.get("state")
    )
    graph = build_graph(cfg, model, Workload(batch=2, text_tokens=5, dtype="float32"))
    run = graph.run(packet, serialize=True)
    assert torch.equal(run.outputs["actions"], direct), (
        (run.outputs["actions"] - direct).abs().max()
    )
    assert [t.name for t in run.timings] == [s.name for s in graph.stages]
    for timing, stage in zip(run.timings[1:], graph.stages[1:], strict=True):
        assert timing.in_bytes == stage.in_bytes, stage.name  # schema sizes are the real sizes


REAL = ["openvla-7b", "pi0", "pi05", "smolvla", "cogact", "openvla-oft", "rdt-1b"]


@pytest.mark.parametrize("name", TINY + MT10 + REAL)
def test_graph_costs_are_positive_and_ordered(name):
    cfg = get_preset(name)
    graph = build_graph(cfg)
    assert graph.stages[0].name == "vision"
    for st in graph.stages:
        assert st.cost.flops > 0 and st.cost.bytes >= st.cost.weight_bytes > 0, st.name
    with pytest.raises(RuntimeError, match="no model bound"):
        graph.stages[0].fn(None)


def test_openvla_prefill_flops_close_to_two_params_tokens():
    cfg = get_preset("openvla-7b")
    w = Workload(text_tokens=24)
    graph = build_graph(cfg, w=w)
    tokens = 1 + cfg.num_visual + w.text_tokens
    llm_params = cfg.llm.num_params()
    ratio = graph.stage("prefill").cost.flops / (2 * llm_params * tokens)
    assert 0.95 <= ratio <= 1.05, ratio
