"""Real-time chunking (RTC): inpaint the next action chunk onto the one still executing.

Black, Galliker and Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
(arXiv 2506.07339). While a new chunk of H actions is computed, the robot keeps executing the
previous one; the first d actions of the new chunk (d = inference delay in control steps) will
already have run by the time it arrives, so they are frozen to the previous chunk's, the
overlap after them is softly guided toward it with a decaying weight, and the last s (the
execution horizon: steps the new chunk runs before the next one replaces it) are free.

This file holds the delay d a plan implies (``frozen_steps``), the weight schedule and a
denoising-step transform that applies it. The transform plugs into the ``DenoiseStepHook`` of
``FlowMatchingExpert.sample`` and of ``DiTHead.sample``; for the autoregressive family the same
freeze is a forced prefix of action tokens (``forced_action_tokens``, fed to the generic
``forced`` argument of ``VLA.decode_tokens`` or of a token decoder, Jacobi and its early exit
included: ``accel.jacobi.jacobi_decode``). The model code holds no RTC branch.

A request carries its freeze as plain data (``RTCRequest``: the queued actions, d and s), which
the stage graph packs into three tensors of the request's packet, so it crosses the wire to an
edge like any other input; ``Inpainter`` turns a batch of those tensors back into the hook or
the forced prefix (``models.hooks.ChunkInpainter``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vlarun.models.action_tokens import ActionTokenizer

# One-sided 95% of a normal: the tail margin d is sized for (a p95 miss freezes one step too few,
# which the late-chunk alignment of runtime/robot/chunks.py then absorbs).
P95_Z = 1.645


def frozen_steps(
    latency_s: float,
    period_s: float,
    horizon: int,
    execution_horizon: int,
    sigma_s: float = 0.0,
    tail_z: float = P95_Z,
) -> int:
    """The delay d in control steps for a request: d = ceil((latency + z * sigma) / period),
    clipped to [0, H - s].

    ``latency_s`` is the executed plan's predicted latency (``ExecutionPlan.latency_s``, network
    included), ``sigma_s`` its learned spread (0 when unmeasured: the mean alone), so with the
    default z the margin is the p95 under a normal approximation. d counts the actions the
    robot executes while the chunk is computed; it is recomputed per request from the plan
    chosen for it, so when the plan changes (the link drops, the robot goes local) d follows.
    Clipped to H - s, the most the overlap can freeze (``guidance_weights``): a longer delay
    means the previous chunk runs dry first, which the runtime's late-chunk alignment handles.
    """
    values = {"latency_s": latency_s, "period_s": period_s, "sigma_s": sigma_s, "tail_z": tail_z}
    for name, v in values.items():
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    if period_s <= 0:
        raise ValueError(f"period_s (the control period) must be > 0, got {period_s}")
    if latency_s < 0 or sigma_s < 0 or tail_z < 0:
        raise ValueError(
            f"latency_s, sigma_s and tail_z must be >= 0, got {latency_s}, {sigma_s}, {tail_z}"
        )
    if horizon < 1 or not 1 <= execution_horizon <= horizon:
        raise ValueError(
            f"need horizon >= 1 and execution horizon in [1, horizon], got {horizon} and "
            f"{execution_horizon}"
        )
    steps = (latency_s + tail_z * sigma_s) / period_s
    # A latency of exactly k periods lands on a step boundary; float noise (0.15 / 0.05 =
    # 3.0000000000000004) must not push it to k + 1.
    d = math.ceil(steps - 1e-9)
    return min(max(d, 0), horizon - execution_horizon)


def guidance_weights(horizon: int, delay: int, execution_horizon: int) -> Tensor:
    """The RTC soft-mask weights W (H,) over a chunk of ``horizon`` actions, float64.

    The paper's soft masking (arXiv 2506.07339, Eq. 5), with H the horizon, d the delay and s
    the execution horizon:

        W_i = 1                              if i < d
        W_i = c_i (e^{c_i} - 1) / (e - 1)    if d <= i < H - s
        W_i = 0                              if i >= H - s,
        with c_i = (H - s - i) / (H - s - d + 1),

    so the weight decays exponentially from just under 1 after the frozen prefix to just above 0
    at the end of the overlap: c_i runs from (H - s - d) / (H - s - d + 1) down to
    1 / (H - s - d + 1), so neither end of the soft region reaches 1 or 0. (The authors' Kinetix
    code writes the same c_i as a clipped ramp between "prefix attention" start d and end H - s.)

    Needs 0 <= d <= H - s and 1 <= s <= H: the delay must fit inside the overlap (d > H - s
    would freeze actions the previous chunk does not have left), and a chunk must execute at
    least one action.
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


class RealTimeChunking:
    """A ``DenoiseStepHook`` that inpaints a new chunk onto the previous one, per request.

    ``previous`` (n, A) or (B, n, A): the previous chunk's actions from the new chunk's first
    step on (the ones still queued when the request was sent, then whatever it planned after),
    in the model's normalised action space, n >= H - s (actions past the overlap are unused).
    ``delay`` d: control steps the robot executes while this chunk is computed;
    ``execution_horizon`` s: steps this chunk runs before the next one replaces it.

    After every denoising step the state x is pulled toward the previous chunk noised to the
    same level, y = data_scale * previous + noise_scale * noise (the sample's starting noise):

        x_i <- y_i                        i < d        (frozen)
        x_i <- W_i y_i + (1 - W_i) x_i    d <= i < H - s (soft, ``guidance_weights``)
        x_i unchanged                     i >= H - s   (free)

    The last step's y is the previous chunk itself, so the first d actions of the result equal
    it bit for bit (the DiT clips its sample to [-1, 1] afterwards: a previous chunk from the
    same head already lies inside, so the clip leaves them alone).

    This is the guided-inpainting (replacement) variant the paper discusses as a baseline, not
    its pi-GDM guidance: pi-GDM adds a vector-Jacobian product through the denoiser at every
    step (a backward pass per step, and the sample loops run without autograd), while
    replacement costs one blend per step and needs no gradient. Its known weakness, which the
    paper's guidance addresses: the denoiser may not fully reconcile the free part with the
    replaced overlap, so the seam after H - s is less smooth than pi-GDM's.
    """

    def __init__(self, previous: Tensor, delay: int, execution_horizon: int, horizon: int) -> None:
        self.weights = guidance_weights(horizon, delay, execution_horizon)  # validates d, s, H
        if previous.dim() == 2:
            previous = previous[None]
        if previous.dim() != 3:
            raise ValueError(
                f"previous chunk must be (n, A) or (B, n, A), got {tuple(previous.shape)}"
            )
        overlap = horizon - execution_horizon
        n = previous.shape[1]
        if n < overlap:
            raise ValueError(
                f"previous chunk has {n} actions; the overlap needs {overlap} "
                f"(horizon {horizon} - execution horizon {execution_horizon})"
            )
        target = torch.zeros(
            previous.shape[0],
            horizon,
            previous.shape[2],
            dtype=previous.dtype,
            device=previous.device,
        )
        keep = min(n, horizon)
        target[:, :keep] = previous[:, :keep]
        self.target = target  # (B or 1, H, A); zeros past the previous chunk, where W = 0
        self.delay, self.overlap = delay, overlap

    def __call__(
        self, step: int, x: Tensor, noise: Tensor, data_scale: float, noise_scale: float
    ) -> Tensor:
        rows, h, a = self.target.shape
        if x.shape[1:] != (h, a) or rows not in (1, x.shape[0]):
            raise ValueError(
                f"chunk ({'B' if rows == 1 else rows}, {h}, {a}) expected, got {tuple(x.shape)}"
            )
        prev = self.target.to(device=x.device, dtype=x.dtype)
        if data_scale == 1.0 and noise_scale == 0.0:
            y = prev.expand_as(x)  # the last step: exactly the previous chunk
        else:
            y = data_scale * prev + noise_scale * noise.to(x.dtype)
        w = self.weights.to(device=x.device, dtype=x.dtype)[:, None]  # (H, 1)
        out = torch.where(w > 0, w * y + (1 - w) * x, x)
        out[:, : self.delay] = y[:, : self.delay]  # frozen: a copy, not a blend with weight 1
        return out


def forced_action_tokens(tokenizer: ActionTokenizer, previous: Tensor, delay: int) -> Tensor:
    """RTC for the autoregressive family: the token prefix (B, d * A) that freezes a new chunk's
    first d actions to the previous chunk's.

    ``previous`` (n, A) or (B, n, A): the previous chunk's normalised actions from the new
    chunk's first step on, as for ``RealTimeChunking``. Its first d actions are re-tokenised
    (OpenVLA's binning, one token per action dimension, action-major as the model decodes
    them); passed as ``VLA.decode_tokens``' ``forced`` (``VLA.act``'s ``forced_tokens``, a
    Jacobi decoder's ``forced``), they make the new chunk's first d actions the previous ones'
    bin centers exactly, and the model decodes the rest after them, conditioned on the prefix
    (greedily, or by Jacobi iterations over the free tokens alone). A chunk the same model
    decoded is already bin centers, so its first d actions come back unchanged.
    There is no soft region: a token is forced or free.
    """
    if previous.dim() == 2:
        previous = previous[None]
    if previous.dim() != 3:
        raise ValueError(f"previous chunk must be (n, A) or (B, n, A), got {tuple(previous.shape)}")
    if not 0 <= delay <= previous.shape[1]:
        raise ValueError(
            f"delay must be in [0, {previous.shape[1]}] (the previous chunk's actions), got {delay}"
        )
    ids = tokenizer.encode(previous[:, :delay])  # (B, d, A)
    return torch.as_tensor(ids, dtype=torch.long).reshape(previous.shape[0], -1)


@dataclass(frozen=True)
class RTCRequest:
    """What one request for a real-time chunk carries.

    ``previous`` (n, A): the actions still queued when the request is sent, from the new chunk's
    first step on, in the model's action space; ``delay`` d: the steps of them the robot
    executes while the chunk is computed; ``execution_horizon`` s: the new chunk's steps past
    the overlap, s = H - overlap. Invariant: 1 <= s <= H and 0 <= d <= H - s <= n (the
    overlap only spans queued actions; a new chunk executes at least one action of its own).
    """

    previous: np.ndarray
    delay: int
    execution_horizon: int
    horizon: int

    def __post_init__(self) -> None:
        prev = np.asarray(self.previous, dtype=np.float32)
        if prev.ndim != 2 or not np.isfinite(prev).all():
            raise ValueError(f"previous must be finite (n, A) actions, got shape {prev.shape}")
        object.__setattr__(self, "previous", prev)
        h, s, d = self.horizon, self.execution_horizon, self.delay
        if not 1 <= s <= h or not 0 <= d <= h - s or h - s > len(prev):
            raise ValueError(
                f"need 1 <= s <= H and 0 <= d <= H - s <= n, got H={h}, s={s}, d={d}, "
                f"n={len(prev)} queued actions"
            )

    @classmethod
    def build(
        cls,
        previous: np.ndarray,
        horizon: int,
        latency_s: float,
        period_s: float,
        sigma_s: float = 0.0,
    ) -> RTCRequest | None:
        """The request for a chunk asked for while ``previous`` (n, A) is still queued: the
        overlap is those actions (at most H - 1), s = H - overlap, and d is ``frozen_steps``
        of the executed plan's predicted latency and spread. None when nothing is queued
        (nothing to freeze: the chunk is free)."""
        overlap = min(len(previous), horizon - 1)
        if overlap < 1:
            return None
        s = horizon - overlap
        d = frozen_steps(latency_s, period_s, horizon, s, sigma_s)
        return cls(np.asarray(previous)[:overlap], d, s, horizon)

    def padded(self) -> np.ndarray:
        """(H, A) float32: the overlap, then its last action repeated (rows past the overlap
        have weight 0; they only keep the packet's shape fixed)."""
        prev = self.previous[: self.horizon]
        if len(prev) == self.horizon:
            return prev
        tail = np.repeat(prev[-1:], self.horizon - len(prev), axis=0)
        return np.concatenate([prev, tail])


class _RowGroups:
    """One ``RealTimeChunking`` per group of rows sharing (d, s), applied to those rows."""

    def __init__(self, groups: list[tuple[Tensor, RealTimeChunking]]) -> None:
        self.groups = groups

    def __call__(
        self, step: int, x: Tensor, noise: Tensor, data_scale: float, noise_scale: float
    ) -> Tensor:
        out = x.clone()
        for rows, hook in self.groups:
            rows = rows.to(x.device)
            out[rows] = hook(step, x[rows], noise[rows], data_scale, noise_scale)
        return out


class Inpainter:
    """``models.hooks.ChunkInpainter``: RTC's freeze made from a batch's request tensors
    (``rtc_prev`` (B, H, A), ``rtc_delay`` (B,), ``rtc_exec`` (B,)), which the stage graph
    reads from the packet. Rows of different (d, s), batched on an edge, each get their own."""

    def step_hook(self, previous: Tensor, delay: Tensor, execution_horizon: Tensor):
        horizon = previous.shape[1]
        keys = [
            (int(d), int(s))
            for d, s in zip(delay.tolist(), execution_horizon.tolist(), strict=True)
        ]
        if len(set(keys)) == 1:
            d, s = keys[0]
            return RealTimeChunking(previous, d, s, horizon)
        groups = []
        for d, s in dict.fromkeys(keys):
            rows = torch.tensor([i for i, k in enumerate(keys) if k == (d, s)])
            groups.append((rows, RealTimeChunking(previous[rows], d, s, horizon)))
        return _RowGroups(groups)

    def forced_tokens(self, tokenizer: ActionTokenizer, previous: Tensor, delay: Tensor) -> Tensor:
        ds = set(delay.tolist())
        if len(ds) != 1:
            raise ValueError(f"a forced token prefix needs one delay per batch, got {sorted(ds)}")
        return forced_action_tokens(tokenizer, previous, int(ds.pop()))


INPAINTER = Inpainter()
