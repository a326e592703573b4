"""A Policy = model + tokenizer + statistics + the stage graph, with accelerator hooks.

base.py         Policy: raw observations in, robot actions out, through the stage graph it
                owns; ``with_setting`` / ``with_hooks`` run it under accelerators
stats.py        what a hooked policy's inferences did (decisions, FLOPs ratio per step)
methods.py      method ids (full, triage, fastv, vla-cache, ...) -> token policies; EfficientVLA
setting.py      AccelSetting: a plan's knob values as data, the same hooks on robot and edge
"""

from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting

__all__ = ["AccelSetting", "Policy"]
