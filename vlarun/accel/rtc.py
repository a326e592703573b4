"""Real-time chunking (RTC): inpaint the next action chunk onto the one still executing.

Black, Galliker and Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
(arXiv 2506.07339). While a new chunk of H actions is computed, the robot keeps executing the
previous one; the first d actions of the new chunk (d = inference delay in control steps) will
already have run by the time it arrives, so they are frozen to the previous chunk's, the
overlap after them is softly guided toward it with a decaying weight, and the last s (the
execution horizon: steps the new chunk runs before the next one replaces it) are free.

This file holds the weight schedule and a denoising-step transform that applies it. It plugs
into the ``DenoiseStepHook`` of ``FlowMatchingExpert.sample`` and of ``DiTHead.sample``; the
model code holds no RTC branch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def guidance_weights(horizon: int, delay: int, execution_horizon: int) -> Tensor:
    """The RTC soft-mask weights W (H,) over a chunk of ``horizon`` actions, float64.

    The paper's soft masking (arXiv 2506.07339, Sec. 4, "soft masking"), with H the horizon,
    d the delay and s the execution horizon:

        W_i = 1                              if i < d
        W_i = c_i (e^{c_i} - 1) / (e - 1)    if d <= i < H - s
        W_i = 0                              if i >= H - s,
        with c_i = (H - s - i) / (H - s - d + 1),

    so the weight decays exponentially from just under 1 after the frozen prefix to just above 0
    at the end of the overlap (c_i runs from (H - s - d)/(H - s - d + 1) down to 1/(H - s - d + 1);
    neither end of the soft region reaches 1 or 0). Needs 0 <= d <= H - s and 1 <= s <= H: the
    delay must fit inside the overlap (d > H - s would freeze actions the previous chunk does
    not have left), and a chunk must execute at least one action.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if not 1 <= execution_horizon <= horizon:
        raise ValueError(
            f"execution horizon must be in [1, {horizon}] (the horizon), got {execution_horizon}"
        )
    end = horizon - execution_horizon  # first index after the overlap
    if not 0 <= delay <= end:
        raise ValueError(
            f"delay must be in [0, {end}] (horizon {horizon} - execution horizon "
            f"{execution_horizon}), got {delay}"
        )
    w = torch.zeros(horizon, dtype=torch.float64)
    w[:delay] = 1.0
    i = torch.arange(delay, end, dtype=torch.float64)
    c = (end - i) / (end - delay + 1)
    w[delay:end] = c * torch.expm1(c) / (math.e - 1.0)
    return w
