"""Accelerated inference runs through the one stage graph: every family, with every packet
serialised between stages, gives exactly the in-process result, step after step."""

import numpy as np
import pytest
import torch

from vlarun.accel.feature_cache import every_n_steps
from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder
from vlarun.accel.triage import Triage, TriageConfig
from vlarun.policy import Policy

INSTRUCTION = "push the red block to the goal"

SETTINGS = {
    "triage-oft": ("tiny-openvla-oft", lambda: dict(tokens=Triage(TriageConfig(budget=16)))),
    "triage+jacobi-exit-ar": (
        "tiny-openvla",
        lambda: dict(
            tokens=Triage(TriageConfig(budget=16)), decoder=JacobiDecoder(JacobiConfig(sigma=0.5))
        ),
    ),
    "dit-cache": ("tiny-cogact", lambda: dict(denoise_cache=every_n_steps(3))),
    "flow-cache": ("tiny-pi0", lambda: dict(denoise_cache=every_n_steps(3))),
}


def _frames(size: int, n: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    background = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    out = []
    for t in range(n):
        f = background.copy()
        f[4 + 3 * t : 14 + 3 * t, 8:24] = 255
        out.append(f)
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_serialised_stage_by_stage_equals_in_process(setting):
    preset, hooks = SETTINGS[setting]
    base = Policy.from_preset(preset, seed=0)
    cfg = base.model.cfg
    frames = _frames(cfg.image_size)
    if cfg.num_images > 1:
        frames = [np.stack([f] * cfg.num_images) for f in frames]
    state = np.zeros(cfg.state_dim, np.float32) if cfg.state_dim else None
    local, remote = base.with_hooks(**hooks()), base.with_hooks(**hooks())
    for i, frame in enumerate(frames):
        a = local.run_stages(frame, INSTRUCTION, state=state, seed=i)
        b = remote.run_stages(frame, INSTRUCTION, state=state, seed=i, serialize=True)
        assert torch.equal(a.outputs["actions"], b.outputs["actions"]), (setting, i)
        assert [t.name for t in b.timings] == [
            s.name for s in local.graph(len(base.text_ids(INSTRUCTION))).stages
        ]
        assert all(t.in_bytes > 0 for t in b.timings)  # real packets, not 0-byte timings
    assert [dataclass_tuple(s) for s in local.stats.steps] == [
        dataclass_tuple(s) for s in remote.stats.steps
    ]
    if "triage" in setting:  # the token policy really acted: tokens were reused or pruned
        assert any(s.reused + s.pruned > 0 for s in local.stats.steps[1:])


def dataclass_tuple(s):
    return (s.recomputed, s.reused, s.pruned, round(s.flops_ratio, 12))


def test_the_prefill_stage_takes_the_frame_only_under_a_token_policy():
    base = Policy.from_preset("tiny-openvla-oft", seed=0)
    n = len(base.text_ids(INSTRUCTION))
    plain = base.with_hooks().graph(n)  # FullRecompute tokens
    assert "images" in [s.name for s in plain.stage("prefill_head").inputs]
    from vlarun.stages.families import Workload, build_graph

    graph = build_graph(base.model.cfg, base.model, Workload(1, n, "float32"))
    assert "images" not in [s.name for s in graph.stage("prefill_head").inputs]
