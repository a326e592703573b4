"""RDT-style diffusion transformer head (Liu et al. 2025, "RDT-1B: a Diffusion Foundation Model
for Bimanual Manipulation", thu-ml/RoboticsDiffusionTransformer).

Unlike CogACT's DiT (dit_head.py), which reads one cognition vector, RDT's DiT cross-attends to
every condition token: its blocks alternate between the language tokens (even blocks) and the
image tokens (odd blocks). Its input sequence is [timestep, control frequency, state, H noisy
actions]; the state and the noisy actions share one adaptor (each concatenated with its
validity mask), and the image and language tokens each pass an adaptor to the DiT's width.
The model predicts the clean sample (``prediction_type: sample``).

The released RDT-1b samples with DPM-Solver++ in 5 steps; ``sample`` here runs deterministic
DDIM at the same step count: the same number of DiT passes, which is what the cost model and
the emulator count. No RDT weights are loaded by vlarun; the module is real and runs (tests run
it at small shapes), and at RDT-1b's shape it is built on the meta device for its parameter
and FLOP counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.ddim import BETA_SCHEDULES, alphas_cumprod, ddim_sample_loop, ddim_timesteps
from vlarun.models.dit_head import TimestepEmbedder


@dataclass(frozen=True)
class RDTConfig:
    """Shape of an RDT head and its adaptors (RDT-1b: ``RDTConfig.rdt_1b()``).

    ``img_tokens``: the image condition's length (cameras x history frames x patches);
    ``lang_dim`` / ``img_dim``: the widths of the language encoder's and the vision tower's
    features the adaptors take; ``state_dim``: the unified state / action space (RDT: 128),
    so ``action_dim`` is at most it."""

    hidden_size: int
    num_layers: int
    num_heads: int
    horizon: int
    action_dim: int
    lang_dim: int
    img_dim: int
    img_tokens: int
    max_lang_tokens: int = 1024
    state_dim: int = 128
    steps: int = 5
    num_train_timesteps: int = 1000
    beta_schedule: str = "squaredcos_cap_v2"

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "horizon",
            "action_dim",
            "lang_dim",
            "img_dim",
            "img_tokens",
            "max_lang_tokens",
            "state_dim",
            "steps",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"RDTConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"RDTConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.action_dim > self.state_dim:
            raise ValueError(
                f"RDTConfig.action_dim ({self.action_dim}) exceeds the unified "
                f"state space ({self.state_dim})"
            )
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"unknown beta schedule {self.beta_schedule!r}")
        ddim_timesteps(self.num_train_timesteps, self.steps)  # raises if unreachable

    @classmethod
    def rdt_1b(cls) -> RDTConfig:
        """RDT-1b's released configuration (configs/base.yaml): DiT 28 x 2048, 32 heads; 64
        actions in a 128-d unified space; 3 cameras x 2 frames of SigLIP So400m/14 at 384 px
        (6 x 729 image tokens of 1152); T5-XXL language features (4096); 5 sampling steps."""
        return cls(
            hidden_size=2048,
            num_layers=28,
            num_heads=32,
            horizon=64,
            action_dim=128,
            lang_dim=4096,
            img_dim=1152,
            img_tokens=6 * 729,
        )


def _adaptor(depth: int, n_in: int, d: int) -> nn.Sequential:
    """RDT's ``mlp{depth}x_gelu`` adaptor: Linear, then (GELU(tanh), Linear) x (depth - 1)."""
    layers: list[nn.Module] = [nn.Linear(n_in, d)]
    for _ in range(depth - 1):
        layers += [nn.GELU(approximate="tanh"), nn.Linear(d, d)]
    return nn.Sequential(*layers)


class _Attention(nn.Module):
    """Multi-head attention of x's queries over ``c`` (x itself when ``c`` is None), with
    per-head RMS norms on q and k as RDT's blocks have."""

    def __init__(self, dim: int, num_heads: int, fused_qkv: bool) -> None:
        super().__init__()
        self.num_heads, hd = num_heads, dim // num_heads
        if fused_qkv:
            self.qkv = nn.Linear(dim, 3 * dim)
        else:
            self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim)
        self.q_norm, self.k_norm = nn.RMSNorm(hd, eps=1e-6), nn.RMSNorm(hd, eps=1e-6)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, c: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        b, n, d = x.shape
        h = self.num_heads
        if c is None:
            q, k, v = self.qkv(x).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q = self.q(x).reshape(b, n, h, d // h).transpose(1, 2)
            k, v = self.kv(c).reshape(b, c.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, L): True = keep
        y = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v, attn_mask=attn_mask)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class RDTBlock(nn.Module):
    """Self-attention, cross-attention to one condition, then a width-preserving MLP (RDT's
    FFN is d -> d -> d, not 4d), each pre-normed and residual."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.RMSNorm(dim, eps=1e-6) for _ in range(3))
        self.attn = _Attention(dim, num_heads, fused_qkv=True)
        self.cross_attn = _Attention(dim, num_heads, fused_qkv=False)
        self.ffn = _adaptor(2, dim, dim)

    def forward(self, x: Tensor, c: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.cross_attn(self.norm2(x), c, mask)
        return x + self.ffn(self.norm3(x))


class RDTHead(nn.Module):
    """The adaptors, the DiT and its sampler. ``sample`` maps (language features, image
    features, state) to an (B, horizon, action_dim) chunk."""

    def __init__(self, config: RDTConfig) -> None:
        super().__init__()
        c = self.config = config
        d = c.hidden_size
        self.lang_adaptor = _adaptor(2, c.lang_dim, d)
        self.img_adaptor = _adaptor(2, c.img_dim, d)
        self.state_adaptor = _adaptor(3, 2 * c.state_dim, d)  # a vector and its validity mask
        self.t_embedder = TimestepEmbedder(d)
        self.freq_embedder = TimestepEmbedder(d)
        self.x_pos_embed = nn.Parameter(torch.zeros(1, c.horizon + 3, d))
        self.blocks = nn.ModuleList(RDTBlock(d, c.num_heads) for _ in range(c.num_layers))
        self.final_norm = nn.RMSNorm(d, eps=1e-6)
        self.final = nn.Sequential(
            nn.Linear(d, d), nn.GELU(approximate="tanh"), nn.Linear(d, c.state_dim)
        )
        self.register_buffer(
            "alpha_bar",
            alphas_cumprod(c.num_train_timesteps, c.beta_schedule).float(),
            persistent=False,
        )

    def _masked(self, values: Tensor) -> Tensor:
        """(B, N, action_dim) -> (B, N, 2 * state_dim): padded into the unified space, with the
        validity mask beside it (RDT's state / action token layout)."""
        c = self.config
        pad = c.state_dim - values.shape[-1]
        mask = torch.ones_like(values)
        return torch.cat([F.pad(values, (0, pad)), F.pad(mask, (0, pad))], dim=-1)

    def denoise(
        self,
        x: Tensor,
        t: Tensor,
        freq: Tensor,
        state: Tensor,
        lang: Tensor,
        img: Tensor,
        lang_mask: Tensor | None = None,
    ) -> Tensor:
        """One DiT pass: noisy actions x (B, H, A) at timestep t (B,) -> the clean sample."""
        tokens = (
            torch.cat(
                [
                    self.t_embedder(t)[:, None],
                    self.freq_embedder(freq)[:, None],
                    state,
                    self.state_adaptor(self._masked(x)),
                ],
                dim=1,
            )
            + self.x_pos_embed
        )
        conds, masks = (lang, img), (lang_mask, None)
        for i, block in enumerate(self.blocks):  # even blocks read the language, odd the images
            tokens = block(tokens, conds[i % 2], masks[i % 2])
        out = self.final(self.final_norm(tokens))[:, -self.config.horizon :]
        return out[..., : x.shape[-1]]

    def sample(
        self,
        lang_feats: Tensor,
        img_feats: Tensor,
        state: Tensor,
        noise: Tensor,
        ctrl_freq: float = 25.0,
        lang_mask: Tensor | None = None,
    ) -> Tensor:
        """lang_feats (B, L, lang_dim), img_feats (B, img_tokens, img_dim), state (B, A),
        noise (B, H, A) -> actions (B, H, A). The conditions are adapted once, then ``steps``
        DiT passes."""
        c = self.config
        if img_feats.shape[1:] != (c.img_tokens, c.img_dim) or lang_feats.shape[-1] != c.lang_dim:
            raise ValueError(
                f"RDT head takes images (B, {c.img_tokens}, {c.img_dim}) and "
                f"language (B, L, {c.lang_dim}); got {tuple(img_feats.shape)}, "
                f"{tuple(lang_feats.shape)}"
            )
        if lang_feats.shape[1] > c.max_lang_tokens:
            raise ValueError(
                f"{lang_feats.shape[1]} language tokens; RDT takes at most {c.max_lang_tokens}"
            )
        lang, img = self.lang_adaptor(lang_feats), self.img_adaptor(img_feats)
        st = self.state_adaptor(self._masked(state[:, None]))
        freq = torch.full((noise.shape[0],), ctrl_freq, device=noise.device)
        ab = self.alpha_bar.tolist()

        def eps_fn(x: Tensor, t: Tensor, _step: int) -> Tensor:
            # RDT predicts the sample; DDIM's update takes the noise it implies.
            a = ab[int(t[0])]
            x0 = self.denoise(x, t, freq, st, lang, img, lang_mask)
            return (x - math.sqrt(a) * x0) / math.sqrt(1.0 - a)

        steps = ddim_timesteps(c.num_train_timesteps, c.steps)
        return ddim_sample_loop(eps_fn, noise, self.alpha_bar, steps)

    def flops(self, batch: int, lang_tokens: int, steps: int | None = None) -> int:
        """Matmul FLOPs (2 per multiply-add) of ``sample``: the adaptors once, then ``steps``
        DiT passes. Each pass projects every condition token to K and V again (RDT's
        cross-attention does), which dominates: ~73 GFLOP per image block at RDT-1b's shape.
        Norms, activations and softmax are not counted."""
        c = self.config
        steps = c.steps if steps is None else steps
        d, n, h = c.hidden_size, c.horizon + 3, c.horizon
        adapt = (
            lang_tokens * (c.lang_dim * d + d * d)
            + c.img_tokens * (c.img_dim * d + d * d)
            + (2 * c.state_dim * d + 2 * d * d)
        )
        embed = 2 * (TimestepEmbedder.FREQ_DIM * d + d * d) + h * (2 * c.state_dim * d + 2 * d * d)
        self_attn = n * 4 * d * d + 2 * n * n * d
        ffn = 2 * n * d * d

        def cross(tokens: int) -> int:
            return 2 * n * d * d + tokens * 2 * d * d + 2 * n * tokens * d

        layers = sum(
            cross(lang_tokens if i % 2 == 0 else c.img_tokens) for i in range(c.num_layers)
        ) + c.num_layers * (self_attn + ffn)
        readout = n * (d * d + d * c.state_dim)
        return 2 * batch * (adapt + steps * (embed + layers + readout))
