"""pi0-FAST in the cost model and the plan space: an autoregressive stage graph whose decode stage
runs the configured FAST tokens per chunk (``VLAConfig.decode_tokens``), not one per value."""

import json
from dataclasses import replace

import pytest
import torch

from vlarun.cli import main
from vlarun.models.presets import get_preset
from vlarun.models.presets.real import PI0_FAST_TOKENS
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_seconds, stage_works
from vlarun.stages.families import Workload, build_graph, param_split


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["pi0-fast", "tiny-pi0-fast"])
def test_graph_is_vision_prefill_decode_over_the_fast_tokens(name):
    cfg = get_preset(name)
    assert cfg.family == "autoregressive" and cfg.decode_tokens > 0
    assert cfg.num_action_tokens == cfg.decode_tokens != cfg.chunk * cfg.action_dim
    graph = build_graph(cfg, w=Workload())
    stages = {s.name: s for s in graph.stages}
    assert list(stages) == ["vision", "prefill", "decode"]
    (ids,) = (t for t in stages["decode"].outputs if t.name == "action_ids")
    assert ids.shape == (1, cfg.decode_tokens)
    # the first token comes from prefill's LM head; decode runs the other n - 1 forwards
    assert stages["decode"].cost.passes == cfg.decode_tokens - 1
    assert param_split(cfg)["head"] == 0  # no flow expert


def test_pi0_fast_shares_pi0s_prefix():
    fast, pi0 = get_preset("pi0-fast"), get_preset("pi0")
    assert fast.decode_tokens == PI0_FAST_TOKENS
    assert (fast.llm, fast.vision, fast.connector, fast.num_images, fast.prefix_causal) == (
        pi0.llm,
        pi0.vision,
        pi0.connector,
        pi0.num_images,
        pi0.prefix_causal,
    )
    split_fast, split_pi0 = param_split(fast), param_split(pi0)
    assert split_fast["vision"] == split_pi0["vision"] and split_fast["llm"] == split_pi0["llm"]


def test_decode_cost_grows_linearly_with_the_token_count():
    """Each decode step re-reads the LM's weights: per-token time is constant up to the KV
    cache's slow growth (under 2% over this range at a 793-token prefix)."""
    base, dev = get_preset("pi0-fast"), get_device("jetson-thor")

    def decode(n: int):
        (work,) = (s for s in stage_works(replace(base, decode_tokens=n)) if s.name == "decode")
        return work, stage_seconds(work, dev)[0]

    (w20, t20), (w40, t40), (w80, t80) = decode(21), decode(41), decode(81)
    assert (w20.passes, w40.passes, w80.passes) == (20, 40, 80)
    assert w80.flops - w40.flops == pytest.approx(2 * (w40.flops - w20.flops), rel=0.02)
    assert t80 - t40 == pytest.approx(2 * (t40 - t20), rel=0.02)
    assert t20 < t40 < t80


def test_decode_tokens_is_checked():
    tiny = get_preset("tiny-pi0-fast")
    with pytest.raises(ValueError, match="decode_tokens must be >= 0"):
        replace(tiny, decode_tokens=-1)
    with pytest.raises(ValueError, match="needs the autoregressive family"):
        replace(get_preset("tiny-pi0"), decode_tokens=8)


def test_tiny_decodes_up_to_its_cap_and_returns_a_chunk():
    """Random weights never write END: decoding runs to the cap, and the code, not being one,
    decodes to the all-zero chunk (openpi's answer), counted."""
    torch.manual_seed(0)
    policy = Policy.from_preset("tiny-pi0-fast")
    model, cfg = policy.model, policy.model.cfg
    images = torch.rand(1, cfg.num_images, 3, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        pre = model.prefill(model.build_prefix(model.encode_images(images), [[5, 6, 7]]))
        ids = model.decode_tokens(pre)
    assert ids.shape == (1, cfg.fast.max_tokens)
    actions = model.tokens_to_actions(ids)
    assert actions.shape == (1, cfg.chunk, cfg.action_dim) and model.fast_head.failures == 1


def test_a_code_length_without_a_fast_head_is_a_cost_model_shape_only():
    cfg = replace(get_preset("tiny-pi0-fast"), fast=None)
    model = VLA(cfg).eval()
    with pytest.raises(NotImplementedError, match="cost model"):
        model.tokens_to_actions(torch.zeros(1, cfg.decode_tokens, dtype=torch.long))
    with pytest.raises(ValueError, match="no FAST tokenizer"):
        VLA(get_preset("tiny-pi0-fast")).tokens_to_actions(torch.zeros(1, 3, dtype=torch.long))


def test_cli_info_predict_plan(capsys):
    info = run_json(capsys, "info", "--model", "pi0-fast")
    assert info["action_tokens"] == PI0_FAST_TOKENS
    assert [s["name"] for s in info["stages"]] == ["vision", "prefill", "decode"]
    assert info["stages"][2]["passes"] == PI0_FAST_TOKENS - 1

    pred = run_json(capsys, "predict", "--model", "pi0-fast", "--robot-device", "jetson-thor")
    ms = {s["name"]: s["latency_ms"] for s in pred["stages"]}
    assert set(ms) == {"vision", "prefill", "decode"} and all(v > 0 for v in ms.values())
    assert ms["decode"] > ms["prefill"]  # 59 weight-bound steps against one pass
    assert pred["latency_ms"] == pytest.approx(sum(ms.values()))

    plan = run_json(
        capsys,
        "plan",
        "--model",
        "pi0-fast",
        "--robot-device",
        "orin-nano-8gb",
        "--edge-device",
        "rtx5090",
        "--link-mbps",
        "200",
        "--link-rtt-ms",
        "5",
    )
    assert set(plan["placement"]) == {"vision", "prefill", "decode"}
    assert set(plan["placement"].values()) <= {"robot", "edge"}
    assert plan["latency_ms"] > 0


def test_decode_tokens_round_trips_through_a_config_file():
    from vlarun import config as cfgio
    from vlarun.models.vla import VLAConfig

    cfg = get_preset("pi0-fast")
    assert cfgio.from_dict(VLAConfig, cfgio.to_dict(cfg)) == cfg
