"""CogACT-style DiT diffusion action head with deterministic DDIM sampling.

Each attention/MLP output passes through an optional ``DenoiseFeatureCache`` so accelerators
(vlarun/accel) can reuse features across denoising steps without any flag in this file."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.ddim import BETA_SCHEDULES, alphas_cumprod, ddim_sample_loop, ddim_timesteps

ArrayLike = np.ndarray | Tensor

# ----------------------------------------------------------------------------------------------
# (c) CogACT diffusion head: DiT (its DDIM sampling: ddim.py)

# CogACT's action-model sizes: (num_layers, hidden_size, num_heads). DiT-B is its default.
COGACT_DIT_SIZES = {"DiT-S": (6, 384, 4), "DiT-B": (12, 768, 12), "DiT-L": (24, 1024, 16)}


@dataclass(frozen=True)
class DiTConfig:
    """Shape and diffusion settings of a CogACT-style DiT action head.

    horizon = current step + future steps (CogACT: 1 + 15). cfg_dropout > 0 creates the learned
    "uncondition" vector used for classifier-free guidance (CogACT trains with 0.1 and samples
    with cfg_scale 1.5). clip_denoised clamps each step's x0 estimate (CogACT: off); clip_sample
    clamps the final sample to [-1, 1] (CogACT does so before un-normalizing).
    """

    cond_dim: int
    action_dim: int
    horizon: int
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_ratio: float = 4.0
    num_train_timesteps: int = 100
    ddim_steps: int = 10
    beta_schedule: str = "squaredcos_cap_v2"
    cfg_dropout: float = 0.0
    clip_denoised: bool = False
    clip_sample: bool = True

    def __post_init__(self) -> None:
        for name in ("cond_dim", "action_dim", "horizon", "hidden_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DiTConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"DiTConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})"
            )
        if self.mlp_ratio <= 0:
            raise ValueError(f"DiTConfig.mlp_ratio must be > 0, got {self.mlp_ratio}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(
                f"unknown beta schedule {self.beta_schedule!r}; choose from {BETA_SCHEDULES}"
            )
        if not 0.0 <= self.cfg_dropout < 1.0:
            raise ValueError(f"DiTConfig.cfg_dropout must be in [0, 1), got {self.cfg_dropout}")
        ddim_timesteps(self.num_train_timesteps, self.ddim_steps)  # raises if unreachable

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @classmethod
    def cogact(
        cls,
        size: str = "DiT-B",
        *,
        cond_dim: int = 4096,
        action_dim: int = 7,
        future_steps: int = 15,
    ) -> DiTConfig:
        """CogACT's released configuration for a given DiT size."""
        if size not in COGACT_DIT_SIZES:
            raise ValueError(
                f"unknown CogACT DiT size {size!r}; choose from {list(COGACT_DIT_SIZES)}"
            )
        layers, hidden, heads = COGACT_DIT_SIZES[size]
        return cls(
            cond_dim=cond_dim,
            action_dim=action_dim,
            horizon=future_steps + 1,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            cfg_dropout=0.1,
        )


class DenoiseFeatureCache(Protocol):
    """Hook around each DiT residual branch, the one place denoising accelerators plug in.

    Called once per (denoising step, layer, kind) with kind "attn" or "mlp". ``compute`` returns
    the branch output (B, N, hidden) freshly; the cache returns it or a stored tensor of the
    same shape (e.g. EfficientVLA: recompute every N steps, reuse in between). The model holds
    no policy and no flag; with no cache every branch is computed.
    """

    def __call__(
        self, step: int, layer: int, kind: str, compute: Callable[[], Tensor]
    ) -> Tensor: ...


class DenoiseStepHook(Protocol):
    """Hook after each denoising step of the DiT head and the flow expert (inpainting, guidance).

    Called once per step with the step index, the new state x (B, H, A) and where it stands
    on the noising path: x ~ data_scale * x0 + noise_scale * noise, with ``noise`` the
    sample's starting noise (B, H, A). Flow (x_t = t * noise + (1 - t) * x0): data_scale =
    1 - t, noise_scale = t at the step's end time t; DDIM: sqrt(a'), sqrt(1 - a'). The last
    call has exactly data_scale = 1.0 and noise_scale = 0.0: what it returns is the sample
    (before the DiT's final clip). Returns x or a replacement of the same shape; the model
    holds no policy and no flag.
    """

    def __call__(
        self, step: int, x: Tensor, noise: Tensor, data_scale: float, noise_scale: float
    ) -> Tensor: ...


class TimestepEmbedder(nn.Module):
    """Diffusion timestep -> hidden vector: 256 sinusoidal features, then Linear-SiLU-Linear."""

    FREQ_DIM = 256

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(self.FREQ_DIM, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    @staticmethod
    def sinusoidal(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
        """(B,) -> (B, dim): [cos(t*f), sin(t*f)] with f = max_period^(-i/half), DiT's order."""
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        )
        args = t[:, None].float() * freqs[None]  # (B, half)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = F.pad(emb, (0, 1))
        return emb

    def forward(self, t: Tensor) -> Tensor:
        freq = self.sinusoidal(t, self.FREQ_DIM).to(self.mlp[0].weight.dtype)
        return self.mlp(freq)  # (B, hidden)


class LinearEmbedder(nn.Module):
    """A Linear under ``.linear``, so x_embedder / z_embedder keys match CogACT checkpoints."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with a fused qkv projection (timm layout)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, N, C = x.shape
        # qkv features are ordered (3, heads, head_dim), as in timm-trained checkpoints.
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, N, hd)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, hd), no mask: all tokens see all
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    """fc1 -> GELU(tanh) -> fc2."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).

    CogACT's blocks use no adaLN: the condition is a token in the sequence, so norms carry no
    affine parameters. Each branch is a separate call routed through ``feature_cache``.
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, mlp_hidden)

    def forward(
        self,
        x: Tensor,
        *,
        step: int = 0,
        layer: int = 0,
        feature_cache: DenoiseFeatureCache | None = None,
    ) -> Tensor:
        """(B, N, hidden) -> (B, N, hidden). ``step``/``layer`` only label the cache calls."""

        def attn() -> Tensor:
            return self.attn(self.norm1(x))

        x = x + (attn() if feature_cache is None else feature_cache(step, layer, "attn", attn))

        def mlp() -> Tensor:
            return self.mlp(self.norm2(x))

        return x + (mlp() if feature_cache is None else feature_cache(step, layer, "mlp", mlp))


class FinalLayer(nn.Module):
    """Read-out: affine-free LayerNorm, then Linear to the action dimension."""

    def __init__(self, hidden_size: int, out_dim: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.norm_final(x))


class DiTHead(nn.Module):
    """CogACT's action model: a DiT that predicts the noise in an (H, A) action sequence.

    Sequence = [condition token, H action tokens] + learned position embeddings, where the
    condition token = Linear(cognition feature) + timestep embedding. The cognition feature is
    the LLM's final hidden state at the last prompt token. Output: epsilon for the H actions.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.x_embedder = LinearEmbedder(c.action_dim, c.hidden_size)
        self.t_embedder = TimestepEmbedder(c.hidden_size)
        self.z_embedder = LinearEmbedder(c.cond_dim, c.hidden_size)
        if c.cfg_dropout > 0:
            # Learned "no condition" input for classifier-free guidance. Shape (1, cond_dim) as
            # in CogACT's checkpoints (its condition carries a length-1 token axis).
            self.z_embedder.uncondition = nn.Parameter(torch.empty(1, c.cond_dim))
        # +1 position for the condition token.
        self.positional_embedding = nn.Parameter(torch.empty(c.horizon + 1, c.hidden_size))
        self.blocks = nn.ModuleList(
            DiTBlock(c.hidden_size, c.num_heads, c.mlp_hidden) for _ in range(c.num_layers)
        )
        self.final_layer = FinalLayer(c.hidden_size, c.action_dim)
        # Not a buffer: Module.to(bfloat16) would round the schedule; it is moved per use.
        self.alphas_cumprod = alphas_cumprod(c.num_train_timesteps, c.beta_schedule)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """DiT's initialization: Xavier linears with zero bias, N(0, 0.02) embedders, position
        embeddings N(0, 1/hidden), and a zero output layer so training starts from eps = 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for lin in (self.x_embedder.linear, self.z_embedder.linear, *self.t_embedder.mlp[::2]):
            nn.init.normal_(lin.weight, std=0.02)
        if hasattr(self.z_embedder, "uncondition"):
            nn.init.normal_(self.z_embedder.uncondition, std=0.02)
        nn.init.normal_(self.positional_embedding, std=self.config.hidden_size**-0.5)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def forward(
        self,
        noisy: Tensor,
        t: Tensor,
        cond: Tensor,
        *,
        step: int = 0,
        feature_cache: DenoiseFeatureCache | None = None,
    ) -> Tensor:
        """Predict the noise: noisy (B, H, A), t (B,) train timesteps, cond (B, cond_dim)
        -> eps (B, H, A). ``step`` is the denoising step index handed to ``feature_cache``."""
        c = self.config
        if noisy.shape[1:] != (c.horizon, c.action_dim) or cond.shape[-1] != c.cond_dim:
            raise ValueError(
                f"expected noisy (B, {c.horizon}, {c.action_dim}) and cond (B, {c.cond_dim}), "
                f"got {tuple(noisy.shape)} and {tuple(cond.shape)}"
            )
        x = self.x_embedder(noisy)  # (B, H, d)
        cond_token = self.t_embedder(t) + self.z_embedder(cond)  # (B, d)
        x = torch.cat([cond_token[:, None], x], dim=1) + self.positional_embedding  # (B, H+1, d)
        for i, block in enumerate(self.blocks):
            x = block(x, step=step, layer=i, feature_cache=feature_cache)
        # Only the action tokens are read out; skipping the condition token saves a row.
        return self.final_layer(x[:, 1:])  # (B, H, A)

    def _uncondition(self, batch: int) -> Tensor:
        if not hasattr(self.z_embedder, "uncondition"):
            raise ValueError("classifier-free guidance needs a head built with cfg_dropout > 0")
        return self.z_embedder.uncondition.expand(batch, -1)  # (B, cond_dim)

    @torch.no_grad()
    def sample(
        self,
        cond: Tensor,
        steps: int | None = None,
        noise: Tensor | None = None,
        feature_cache: DenoiseFeatureCache | None = None,
        *,
        cfg_scale: float = 1.0,
        generator: torch.Generator | None = None,
        eps: Callable[..., Tensor] | None = None,
        step_hook: DenoiseStepHook | None = None,
    ) -> Tensor:
        """Denoise an action sequence for cond (B, cond_dim) -> normalized actions (B, H, A).

        Deterministic DDIM (eta = 0) over ``ddim_timesteps(num_train_timesteps, steps)``
        (steps defaults to config.ddim_steps); the result depends only on ``noise``, drawn from
        ``generator`` when not given. cfg_scale > 1 applies classifier-free guidance,
        eps = eps_uncond + cfg_scale * (eps_cond - eps_uncond), as CogACT does. ``eps(head,
        x, t, cond)``, when given, predicts the noise of steps without a feature cache.
        ``step_hook`` sees (and may replace) the state after every step.
        """
        c = self.config
        B = cond.shape[0]
        timesteps = ddim_timesteps(c.num_train_timesteps, c.ddim_steps if steps is None else steps)
        if noise is None:
            noise = torch.randn(
                (B, c.horizon, c.action_dim), generator=generator, device=cond.device
            ).to(cond.dtype)
        use_cfg = cfg_scale != 1.0
        if use_cfg:
            cond = torch.cat([cond, self._uncondition(B).to(cond.dtype)], dim=0)  # (2B, cond)

        # ``eps`` (static_step.dit_eps, possibly compiled) serves the plain steps; a feature
        # cache needs the step and layer indices, so it runs the module itself.
        plain = eps if eps is not None and feature_cache is None else None

        def predict(x: Tensor, t: Tensor, step: int) -> Tensor:
            if plain is not None:
                return plain(self, x, t, cond)
            return self(x, t, cond, step=step, feature_cache=feature_cache)

        def eps_fn(x: Tensor, t: Tensor, step: int) -> Tensor:
            if not use_cfg:
                return predict(x, t, step)
            eps_c, eps_u = predict(torch.cat([x, x]), t.repeat(2), step).chunk(2)
            return eps_u + cfg_scale * (eps_c - eps_u)

        x = ddim_sample_loop(
            eps_fn,
            noise,
            self.alphas_cumprod,
            timesteps,
            clip_denoised=c.clip_denoised,
            step_hook=step_hook,
        )
        return x.clamp(-1.0, 1.0) if c.clip_sample else x

    def loss(
        self, actions: Tensor, cond: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Epsilon-prediction MSE at uniformly drawn train timesteps.

        actions (B, H, A) in [-1, 1], cond (B, cond_dim). With cfg_dropout > 0, that fraction of
        conditions is replaced by the learned uncondition. ``generator`` (on actions' device)
        makes t, noise and dropout reproducible.
        """
        c = self.config
        B, device = actions.shape[0], actions.device
        t = torch.randint(0, c.num_train_timesteps, (B,), generator=generator, device=device)
        noise = torch.randn(actions.shape, generator=generator, device=device).to(actions.dtype)
        ab = self.alphas_cumprod.to(device)[t].to(actions.dtype)[:, None, None]  # (B, 1, 1)
        x_t = ab.sqrt() * actions + (1 - ab).sqrt() * noise  # q(x_t | x_0)
        if c.cfg_dropout > 0:
            drop = torch.rand(B, generator=generator, device=device) < c.cfg_dropout
            cond = torch.where(drop[:, None], self._uncondition(B).to(cond.dtype), cond)
        return F.mse_loss(self(x_t, t, cond), noise)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops(self, batch: int, steps: int | None = None, *, cfg: bool = False) -> int:
        """Matmul FLOPs (2 per multiply-add) of ``sample``: steps denoiser passes, each on
        2*batch rows under classifier-free guidance. Norms, activations, softmax not counted."""
        c = self.config
        steps = c.ddim_steps if steps is None else steps
        rows = batch * (2 if cfg else 1)
        d, n, h = c.hidden_size, c.horizon + 1, c.horizon
        embed = h * c.action_dim * d + TimestepEmbedder.FREQ_DIM * d + d * d + c.cond_dim * d
        per_layer = n * 3 * d * d + 2 * n * n * d + n * d * d + 2 * n * d * c.mlp_hidden
        readout = h * d * c.action_dim
        return 2 * rows * steps * (embed + c.num_layers * per_layer + readout)
