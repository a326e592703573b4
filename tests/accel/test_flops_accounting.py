"""The FLOPs ratio a token plan is reported at equals what the engine executes, counted by
torch's FLOP counter on the real prefill (attention over masked pruned keys included)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vlarun.models.presets import get_preset
from vlarun.models.token_plan import TokenAction, TokenPlan
from vlarun.models.vla import VLA
from vlarun.policy.stats import prefill_flops_ratio


@pytest.mark.parametrize("preset", ["tiny-openvla-oft", "mt10-oft"])
@pytest.mark.parametrize("rest", [TokenAction.PRUNE, TokenAction.REUSE])
def test_flops_ratio_matches_a_counted_prefill(preset, rest):
    torch.manual_seed(0)
    cfg = get_preset(preset)
    model = VLA(cfg).eval()
    images = torch.rand(1, cfg.num_images, 3, cfg.image_size, cfg.image_size)
    state = torch.zeros(1, cfg.proprio_dim) if cfg.proprio_dim else None
    prefix = model.build_prefix(model.encode_images(images), [[5] * 20], state)
    nv, recomputed, layer = cfg.num_visual, cfg.num_visual // 4, 2
    cache = model.language_model.new_cache(1, prefix.length + cfg.num_action_tokens)

    def counted(plan):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            model.prefill(prefix, cache, plan=plan)
        return fc.get_total_flops()

    full = counted(None)  # also fills every token's cache, so the plan can reuse them
    decisions = torch.full((1, nv), int(rest), dtype=torch.int8)
    decisions[0, :recomputed] = int(TokenAction.RECOMPUTE)
    got = counted(TokenPlan(1, decisions, layer)) / full
    want = prefill_flops_ratio(cfg.llm, cfg.llm, prefix.length, recomputed, nv, layer)
    assert got == pytest.approx(want, abs=2e-3), (got, want)
    assert got < 0.9  # the plan really saved work
