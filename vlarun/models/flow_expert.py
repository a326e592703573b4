"""pi0-style flow-matching action expert.

A second, narrower decoder (pi0: Gemma-300M, width 1024) whose tokens are the robot state and H
noisy actions. In every layer its queries attend to the VLM prefix's cached K/V of the same layer
plus its own tokens, so the prefix (images + instruction) is computed once per control step and
shared by all N denoising steps. Integration runs from pure noise at t = 1 to actions at t = 0
with Euler steps of dt = -1/N (openpi ``Pi0.sample_actions``).

Parameter names follow openpi's PyTorch port (``state_proj``, ``action_in_proj``,
``action_time_mlp_in/out``, ``action_out_proj``); the expert decoder is ``expert.model.*``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.dit_head import DenoiseFeatureCache, DenoiseStepHook
from vlarun.models.llama import BranchCache, KVCache, LlamaConfig, LlamaLM
from vlarun.models.static_step import expert_forward


@dataclass(frozen=True)
class FlowExpertConfig:
    """Action expert shape. ``expert`` must match the VLM decoder in number of layers, KV heads
    and head_dim (its queries read the VLM's cached keys layer by layer)."""

    expert: LlamaConfig
    action_dim: int
    horizon: int
    state_dim: int  # 0: no state token (pi05 writes the state into the prompt instead)
    num_steps: int = 10
    # How the flow time enters: "mlp" (pi0: concatenated to each noisy action, through
    # action_time_mlp_in/out) or "adarms" (pi05: time_mlp_in/out condition every norm of the
    # expert, adaptive RMSNorm with gated residuals).
    time_cond: str = "mlp"
    # SmolVLA: every layer i with i % cross_every != 0 is a cross-attention layer, whose keys
    # and values are the expert's own projections (from ``cross_kv_dim`` wide inputs) of the
    # prefix's cached keys and values, and whose queries sit at positions 0.. (0 = none).
    cross_every: int = 0
    cross_kv_dim: int = 0
    causal_actions: bool = False  # SmolVLA: action token i sees actions <= i (pi0: all)

    def __post_init__(self) -> None:
        for name in ("action_dim", "horizon", "num_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"FlowExpertConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.state_dim < 0:
            raise ValueError(f"FlowExpertConfig.state_dim must be >= 0, got {self.state_dim}")
        if self.time_cond not in ("mlp", "adarms"):
            raise ValueError(f"time_cond must be 'mlp' or 'adarms', got {self.time_cond!r}")
        if self.cross_every < 0 or (self.cross_every > 1 and self.cross_kv_dim <= 0):
            raise ValueError("cross-attention layers need cross_every >= 2 and cross_kv_dim > 0")

    @property
    def cross_layers(self) -> frozenset[int]:
        """The layers whose queries read projected prefix keys only (SmolVLA's odd ones)."""
        if self.cross_every < 2:
            return frozenset()
        return frozenset(i for i in range(self.expert.num_layers) if i % self.cross_every)

    def check_compatible(self, vlm: LlamaConfig) -> None:
        e = self.expert
        pairs = {
            "num_layers": (e.num_layers, vlm.num_layers),
            "num_kv_heads": (e.num_kv_heads, vlm.num_kv_heads),
            "head_dim": (e.hd, vlm.hd),
        }
        bad = {k: v for k, v in pairs.items() if v[0] != v[1]}
        if bad:
            raise ValueError(
                f"action expert and VLM differ in {bad} (expert, vlm); they must agree"
            )

    @property
    def num_state_tokens(self) -> int:
        return 1 if self.state_dim else 0

    @property
    def num_tokens(self) -> int:
        return self.num_state_tokens + self.horizon  # [state token] + action tokens

    @property
    def expert_config(self) -> LlamaConfig:
        """The expert decoder as built: no vocabulary, adaptive norms when time conditions them."""
        cond = self.expert.hidden_size if self.time_cond == "adarms" else 0
        return dataclasses.replace(
            self.expert, vocab_size=1, tie_embeddings=True, norm_cond_dim=cond
        )

    def num_params(self) -> int:
        w = self.expert.hidden_size
        io = self.num_state_tokens * (self.state_dim + 1) * w + (self.action_dim + 1) * w
        io += (2 * w + 1) * w if self.time_cond == "mlp" else (w + 1) * w  # time MLP in
        io += (w + 1) * w + (w + 1) * self.action_dim
        return self.expert_config.num_params(with_embeddings=False) + io

    def flops(self, batch: int, prefix_len: int, steps: int | None = None) -> int:
        n = self.num_steps if steps is None else steps
        t = self.num_tokens
        per_step = (
            self.expert.flops(t, context=prefix_len + t) + 2 * t * 4 * self.expert.hidden_size**2
        )
        return batch * n * per_step


def sincos_time_embedding(t: Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0):
    """Sine-cosine embedding of flow time t in [0, 1] (B,) -> (B, dim); the short periods are
    what let the expert tell nearby times apart (openpi ``posemb_sincos`` uses these bounds)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.double()[:, None] * (2 * math.pi / period)[None]
    return torch.cat((angle.sin(), angle.cos()), dim=-1).float()


class FlowMatchingExpert(nn.Module):
    def __init__(self, cfg: FlowExpertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # The expert never embeds or emits vocabulary tokens; a 1-entry table keeps LlamaLM whole.
        self.expert = LlamaLM(cfg.expert_config)
        kv = cfg.expert.num_kv_heads * cfg.expert.hd
        for i in cfg.cross_layers:  # their K/V read the prefix's K/V, not the expert's tokens
            attn = self.expert.model.layers[i].self_attn
            attn.k_proj = nn.Linear(cfg.cross_kv_dim, kv, bias=False)
            attn.v_proj = nn.Linear(cfg.cross_kv_dim, kv, bias=False)
        w = cfg.expert.hidden_size
        if cfg.state_dim:
            self.state_proj = nn.Linear(cfg.state_dim, w)
        self.action_in_proj = nn.Linear(cfg.action_dim, w)
        if cfg.time_cond == "mlp":
            self.action_time_mlp_in = nn.Linear(2 * w, w)
            self.action_time_mlp_out = nn.Linear(w, w)
        else:
            self.time_mlp_in = nn.Linear(w, w)
            self.time_mlp_out = nn.Linear(w, w)
        self.action_out_proj = nn.Linear(w, cfg.action_dim)

    def suffix_mask(self, device: torch.device | str = "cpu") -> Tensor:
        """(T, T): the state token (if any) sees itself; action tokens see it and each other."""
        t = self.cfg.num_tokens
        mask = torch.ones(t, t, dtype=torch.bool, device=device)
        mask[: self.cfg.num_state_tokens, self.cfg.num_state_tokens :] = False
        if self.cfg.causal_actions:
            mask &= torch.ones(t, t, dtype=torch.bool, device=device).tril()
        return mask

    def velocity(
        self,
        prefix: KVCache,
        state: Tensor,
        x_t: Tensor,
        t: Tensor,
        start: Tensor | None = None,
        feature_cache: BranchCache | None = None,
        forward: Callable[..., Tensor] | None = None,
    ) -> Tensor:
        """Predicted flow velocity (B, H, A) at noisy actions x_t (B, H, A) and time t (B,).
        ``forward`` (``static_step.expert_forward`` or a compiled copy) runs the expert when
        no feature cache is given.

        start (B,): position of each row's first suffix token (default: after the whole
        prefix); right-padded rows pass their own so positions match running them alone."""
        w = self.cfg.expert.hidden_size
        dtype = self.action_in_proj.weight.dtype
        act = self.action_in_proj(x_t.to(dtype))  # (B, H, w)
        time = sincos_time_embedding(t, w).to(dtype)  # (B, w)
        cond = None
        if self.cfg.time_cond == "mlp":
            both = torch.cat((act, time[:, None].expand_as(act)), -1)
            act = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(both)))
        else:  # pi05: the time conditions the expert's norms; the tokens are the actions alone
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
        tokens = act
        if self.cfg.state_dim:
            state_tok = self.state_proj(state.to(dtype))[:, None]  # (B, 1, w)
            tokens = torch.cat((state_tok, act), dim=1)  # (B, 1 + H, w)
        offsets = torch.arange(tokens.shape[1], device=tokens.device)
        if start is None:
            start = torch.full((tokens.shape[0],), prefix.filled_length(), device=tokens.device)
        positions = start[:, None].to(tokens.device) + offsets[None]  # (B, T)
        mask = self.suffix_mask(tokens.device)
        fn = forward if forward is not None and feature_cache is None else expert_forward
        out = fn(
            self.expert, tokens, positions, prefix, mask, feature_cache, cond, self.cfg.cross_layers
        )
        return self.action_out_proj(out[:, self.cfg.num_state_tokens :]).float()

    @torch.no_grad()
    def sample(
        self,
        prefix: KVCache,
        state: Tensor,
        noise: Tensor | None = None,
        steps: int | None = None,
        start: Tensor | None = None,
        feature_cache: DenoiseFeatureCache | None = None,
        forward: Callable[..., Tensor] | None = None,
        step_hook: DenoiseStepHook | None = None,
    ) -> Tensor:
        """Integrate from noise (t = 1) to actions (t = 0): N Euler steps. Returns (B, H, A).

        ``feature_cache`` sees every expert attention/MLP branch as (step, layer, kind,
        compute), the same hook as the DiT head's, so denoising caches work on both;
        ``step_hook`` sees (and may replace) x after every step, as the DiT head's does."""
        n = self.cfg.num_steps if steps is None else steps
        b = state.shape[0]
        x = noise if noise is not None else torch.randn(b, self.cfg.horizon, self.cfg.action_dim)
        x = x.float()
        start_noise = x
        dt = -1.0 / n
        for i in range(n):
            t = torch.full((b,), 1.0 + i * dt, device=x.device)
            fc = None if feature_cache is None else functools.partial(feature_cache, i)
            x = x + dt * self.velocity(prefix, state, x, t, start, fc, forward)
            if step_hook is not None:
                t_end = 1.0 - (i + 1) / n  # exactly 0.0 after the last step
                x = step_hook(i, x, start_noise, 1.0 - t_end, t_end)
        return x

    def loss(
        self, prefix: KVCache, state: Tensor, actions: Tensor, start: Tensor | None = None
    ) -> Tensor:
        """Flow-matching loss: regress u = noise - actions at x_t = t*noise + (1-t)*actions,
        t ~ Beta(1.5, 1) shifted away from 0 as pi0 trains (more weight on noisy times)."""
        b = actions.shape[0]
        noise = torch.randn(actions.shape, device=actions.device)
        beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
        t = beta.sample((b,)).to(actions.device) * 0.999 + 0.001
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
        return F.mse_loss(self.velocity(prefix, state, x_t, t, start), noise - actions)
