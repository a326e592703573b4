"""A Policy = model + tokenizer + statistics + the stage graph; accelerated, it adds hooks.

base.py         Policy: raw observations in, robot actions out, through the stage graph
accelerated.py  AcceleratedPolicy: a Policy with a token policy, a decoder and a denoiser
                cache, keeping the KV cache across control steps
methods.py      method ids (full, triage, fastv, vla-cache, efficientvla, ...) -> policies
setting.py      AccelSetting: a plan's knob values as data, the same hooks on robot and edge
"""

from vlarun.policy.accelerated import AcceleratedPolicy, accelerate
from vlarun.policy.base import Policy

__all__ = ["AcceleratedPolicy", "Policy", "accelerate"]
