"""DDIM for the diffusion action head: the beta schedule, the visited timesteps and the
deterministic (eta = 0) sampling loop, as CogACT (guided-diffusion) runs them. Independent of
the network that predicts the noise (``dit_head.DiTHead``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

BETA_SCHEDULES = ("squaredcos_cap_v2", "linear")


def alphas_cumprod(num_train: int, schedule: str = "squaredcos_cap_v2") -> Tensor:
    """Cumulative products of (1 - beta_t), t = 0 .. num_train - 1, in float64.

    * "squaredcos_cap_v2" (CogACT's): betas discretize alpha_bar(s) = cos((s+0.008)/1.008*pi/2)^2
      as beta_t = min(1 - alpha_bar((t+1)/T) / alpha_bar(t/T), 0.999); the cap only bites at the
      last step, where alpha_bar(1) is ~0.
    * "linear": DDPM's 1e-4 .. 0.02 linspace, rescaled by 1000 / T so that other T behave alike.
    """
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    if schedule == "squaredcos_cap_v2":

        def alpha_bar(s: float) -> float:
            return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = torch.tensor(
            [
                min(1 - alpha_bar((i + 1) / num_train) / alpha_bar(i / num_train), 0.999)
                for i in range(num_train)
            ],
            dtype=torch.float64,
            device="cpu",  # host-side even under a `with torch.device(...)` context
        )
    elif schedule == "linear":
        scale = 1000 / num_train
        betas = torch.linspace(
            scale * 1e-4, scale * 0.02, num_train, dtype=torch.float64, device="cpu"
        )
    else:
        raise ValueError(f"unknown beta schedule {schedule!r}; choose from {BETA_SCHEDULES}")
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_timesteps(num_train: int, steps: int) -> list[int]:
    """The train timesteps DDIM visits, in visiting order (descending, ending at 0).

    CogACT's rule (its respace.py, "ddimN"): the smallest integer stride s with
    ``len(range(0, num_train, s)) == steps``, i.e. {0, s, 2s, ...}. When ``steps`` divides
    ``num_train`` this equals diffusers' "leading" spacing, ``arange(steps) * (num_train //
    steps)``; otherwise the two differ (100 train / 7 steps: stride 15 here, 14 in diffusers).
    steps == 1 visits only ``num_train // 2`` (CogACT hard-codes 50 for its 100 steps).
    """
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    if steps < 1 or steps > num_train:
        raise ValueError(f"DDIM steps must be in [1, {num_train}], got {steps}")
    if steps == 1:
        return [num_train // 2]
    for stride in range(1, num_train):
        if len(range(0, num_train, stride)) == steps:
            return list(range(0, num_train, stride))[::-1]
    valid = sorted({len(range(0, num_train, s)) for s in range(1, num_train)} | {1})
    raise ValueError(
        f"{steps} DDIM steps is not reachable with an integer stride over {num_train} train "
        f"timesteps; valid step counts: {valid}"
    )


def ddim_sample_loop(
    eps_fn: Callable[[Tensor, Tensor, int], Tensor],
    noise: Tensor,
    alpha_bar: Tensor,
    timesteps: Sequence[int],
    *,
    clip_denoised: bool = False,
    step_hook: Callable[[int, Tensor, Tensor, float, float], Tensor] | None = None,
) -> Tensor:
    """Deterministic DDIM (eta = 0) from ``noise`` down to x0.

    alpha_bar: ``alphas_cumprod(...)`` over all train timesteps.
    eps_fn(x_t, t, step) predicts the noise in x_t; t is (B,) long, step the index into
    ``timesteps`` (0 for the noisiest). Per step, with a = alpha_bar(t) and a' the alpha_bar of
    the next visited timestep (1 after the last one, so the final step returns x0):
        x0 = (x_t - sqrt(1 - a) * eps) / sqrt(a), optionally clipped to [-1, 1]
        eps = (x_t - sqrt(a) * x0) / sqrt(1 - a)     (re-derived: differs only if clipped)
        x_prev = sqrt(a') * x0 + sqrt(1 - a') * eps
    This is guided-diffusion's ``ddim_sample`` as CogACT runs it (with clip_denoised=False).

    ``step_hook(step, x_prev, noise, sqrt(a'), sqrt(1 - a'))``, when given, may replace x_prev
    after each step (a ``DenoiseStepHook``: inpainting and guidance plug in there).
    """
    x = noise
    ab = alpha_bar.tolist()  # Python float64; scalar * tensor computes in tensor dtype
    for step, t in enumerate(timesteps):
        a = ab[t]
        a_prev = ab[timesteps[step + 1]] if step + 1 < len(timesteps) else 1.0
        t_batch = torch.full((noise.shape[0],), t, dtype=torch.long, device=noise.device)
        eps = eps_fn(x, t_batch, step)
        x0 = math.sqrt(1.0 / a) * x - math.sqrt(1.0 / a - 1.0) * eps
        if clip_denoised:
            x0 = x0.clamp(-1.0, 1.0)
        eps = (math.sqrt(1.0 / a) * x - x0) / math.sqrt(1.0 / a - 1.0)
        x = math.sqrt(a_prev) * x0 + math.sqrt(1.0 - a_prev) * eps
        if step_hook is not None:
            x = step_hook(step, x, noise, math.sqrt(a_prev), math.sqrt(1.0 - a_prev))
    return x
