"""Llama-family decoder with a preallocated, position-indexed KV cache.

Covers the language models inside the VLAs vlarun serves: Llama-2 (OpenVLA, CogACT), Llama-style
GQA models (SmolVLM), and the Gemma variant pi0 uses (GeGLU, (1 + w) RMSNorm, sqrt(d) embedding
scale, head_dim 256, one KV head). Parameter names equal Hugging Face's ``LlamaForCausalLM`` /
``GemmaForCausalLM`` so checkpoints load without renaming.

One ``forward`` serves every mode; what differs is only which positions are written and which
cached keys are visible:
  * prefill:         all prompt tokens, causal;
  * decode:          one token at position p, attends to the cache up to p;
  * multi-token:     n tokens at given positions (Jacobi decoding), causal among themselves;
  * bidirectional:   ``causal=False`` (OFT's empty action tokens see each other);
  * partial recompute: a ``TokenPlan`` (see token_plan.py) - shallow layers on all tokens, deep
    layers on recomputed tokens only, attending to reused tokens' cached K/V;
  * (prefix attention - an action expert reading another decoder's cache, pi0 - and the
    static decode / Jacobi steps live in static_step.py.)
Shallow-layer attention probes and layer skipping are arguments, not flags inside the blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.attn_context import Context
from vlarun.models.device import prepack_supported
from vlarun.models.kv_cache import KVCache  # noqa: F401 (re-exported)
from vlarun.models.token_plan import DeferredPlan, ProbeResult, TokenAction, TokenPlan  # noqa: F401 (re-exported)

# ----------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as real checkpoints use it (HF ``rope_scaling``/``rope_parameters``).

    kind: "default" (none), "linear" (positions divided by ``factor``), or "llama3" (Llama 3.1's
    wavelength-dependent smoothing between ``low_freq_factor`` and ``high_freq_factor``).
    """

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("default", "linear", "llama3"):
            raise ValueError(
                f"unsupported RoPE scaling {self.kind!r}; use default, linear or llama3"
            )
        if self.factor <= 0:
            raise ValueError(f"RoPE scaling factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-family decoder. ``head_dim`` defaults to hidden_size // num_heads."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_positions: int = 2048
    mlp_act: str = "silu"  # "silu" = SwiGLU (Llama); "gelu_tanh" = GeGLU (Gemma)
    gemma_norm: bool = False  # Gemma: RMSNorm scales by (1 + w), embeddings by sqrt(hidden)
    tie_embeddings: bool = False
    # Adaptive RMSNorm (pi05's action expert): every norm reads a (B, c) conditioning vector
    # and one Linear gives its scale, shift and a gate on the residual branch; 0 = plain norms.
    norm_cond_dim: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LlamaConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} not divisible by {self.num_heads} heads"
            )
        if self.hd % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.hd}")
        if self.mlp_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"mlp_act must be 'silu' or 'gelu_tanh', got {self.mlp_act!r}")

    @property
    def hd(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    def num_params(self, with_embeddings: bool = True) -> int:
        d, f, hd = self.hidden_size, self.intermediate_size, self.hd
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        norm = (self.norm_cond_dim + 1) * 3 * d if self.norm_cond_dim else d
        per_layer = attn + 3 * d * f + 2 * norm
        total = self.num_layers * per_layer + norm
        if with_embeddings:
            total += self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return total

    def flops(self, tokens: int, context: int | None = None, layers: int | None = None) -> int:
        """Forward FLOPs (2 per multiply-add) for ``tokens`` new tokens attending to ``context``
        keys in total (default: causal prefill, mean context tokens/2), without the LM head."""
        n_layers = self.num_layers if layers is None else layers
        d, f, hd = self.hidden_size, self.intermediate_size, self.hd
        proj = 2 * tokens * d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 2 * tokens * 3 * d * f
        mean_ctx = (tokens + 1) / 2 if context is None else context
        attn = 2 * 2 * tokens * mean_ctx * self.num_heads * hd  # QK^T and PV
        return int(n_layers * (proj + mlp + attn))

    def head_flops(self, tokens: int) -> int:
        return 2 * tokens * self.hidden_size * self.vocab_size

    @classmethod
    def from_hf(cls, hf: dict) -> LlamaConfig:
        """Build from a Hugging Face config.json dict (Llama or Gemma)."""
        model_type = hf.get("model_type", "llama")
        if model_type not in ("llama", "gemma", "mistral"):
            raise ValueError(f"config.json is a {model_type!r} model, not a Llama/Gemma decoder")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = RopeScaling(
            kind=kind,
            factor=float(rope.get("factor", 1.0)),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_positions=int(rope.get("original_max_position_embeddings", 8192)),
        )
        gemma = model_type == "gemma"
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6 if gemma else 1e-5),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_positions=hf.get("max_position_embeddings", 2048),
            mlp_act="gelu_tanh" if gemma else "silu",
            gemma_norm=gemma,
            tie_embeddings=hf.get("tie_word_embeddings", gemma),
        )

    def to_hf(self) -> dict:
        """The Hugging Face config.json dict for this shape."""
        rope: dict = {"rope_type": self.rope_scaling.kind, "rope_theta": self.rope_theta}
        if self.rope_scaling.kind != "default":
            rope |= {"factor": self.rope_scaling.factor}
        if self.rope_scaling.kind == "llama3":
            rope |= {
                "low_freq_factor": self.rope_scaling.low_freq_factor,
                "high_freq_factor": self.rope_scaling.high_freq_factor,
                "original_max_position_embeddings": self.rope_scaling.original_max_positions,
            }
        return {
            "model_type": "gemma" if self.gemma_norm else "llama",
            "architectures": ["GemmaForCausalLM" if self.gemma_norm else "LlamaForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hd,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_positions,
            "hidden_act": "gelu_pytorch_tanh" if self.mlp_act == "gelu_tanh" else "silu",
            "tie_word_embeddings": self.tie_embeddings,
        }


# ----------------------------------------------------------------------------------------------
# Building blocks


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (as HF does) - bf16 variance loses too much precision."""

    def __init__(self, dim: int, eps: float, gemma: bool) -> None:
        super().__init__()
        self.eps = eps
        self.gemma = gemma
        # Gemma stores w and scales by (1 + w), so its neutral weight is 0.
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.type_as(x)


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm (openpi's pi05 expert; LeRobot ``PiGemmaRMSNorm`` with a condition):
    ``dense(cond)`` (B, c) -> (scale, shift, gate); returns ``(norm(x) * (1 + scale) + shift,
    gate)``, the gate scaling the residual branch this norm feeds. fp32 inside, as RMSNorm."""

    def __init__(self, dim: int, eps: float, cond_dim: int) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond).unsqueeze(1).chunk(3, dim=-1)  # (B, 1, d) each
        return (h * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def make_norm(cfg: LlamaConfig) -> nn.Module:
    """The norm a decoder of this shape uses (plain, or adaptive when conditioned)."""
    if cfg.norm_cond_dim:
        return AdaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_cond_dim)
    return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma_norm)


def rope_inv_freq(cfg: LlamaConfig) -> Tensor:
    """Inverse frequencies (hd/2,) including the configured scaling variant."""
    hd = cfg.hd
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    s = cfg.rope_scaling
    if s.kind == "linear":
        inv = inv / s.factor
    elif s.kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        wavelen = 2 * math.pi / inv
        low_wl = s.original_max_positions / s.low_freq_factor
        high_wl = s.original_max_positions / s.high_freq_factor
        scaled = torch.where(wavelen > low_wl, inv / s.factor, inv)
        smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
        )
        blended = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = torch.where(medium, blended, scaled)
    return inv.float()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.hd
        self.n_heads, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, hd
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project and rotate. x (B, T, d) -> q (B, H, T, hd), k/v (B, KVH, T, hd)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False
    ) -> Tensor:
        """q (B, H, T, hd), k/v (B, KVH, S, hd), mask (B, 1, T, S) bool or None (all visible,
        or plain causal with S == T when ``is_causal``) -> (B, T, d)."""
        gqa = self.n_kv != self.n_heads
        if q.shape[2] == 1 and q.dtype == torch.bfloat16 and q.device.type == "cpu":
            # One-token decode: torch's CPU flash kernel is ~4x slower in bf16 than in fp32 for a
            # single query (1.1B shape: 540 vs 120 us a layer, upcasts included), and fp32 is
            # at least as accurate. K/V here are only the filled cache slots, so the casts
            # are small.
            out = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=gqa
            ).to(q.dtype)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa
            )
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))


class PackedLinear(nn.Module):
    """A bias-free ``nn.Linear`` whose weight is pre-reordered into oneDNN's blocked layout.

    ``F.linear`` on CPU re-packs the weight on every call (bf16: oneDNN; fp32: MKL sgemm, which
    packs too). Packing once at load time makes batch-1 decode GEMVs stream weights ~1.4-2x
    faster (bf16 2048x11264: 15 -> 25-36 GB/s) and fp32 prefill GEMMs ~1.4x faster (140 -> 205
    GFLOP/s); bf16 prefill gains ~7%. ``weight`` stays the original tensor, so state_dict names
    and checkpoint loading are unchanged; the packed copy costs one extra weight's memory."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear only replaces bias-free projections")
        self.weight = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # batch-size hint 1: the layout chosen for decode also runs prefill GEMMs at full speed.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


class MLP(nn.Module):
    """Gated MLP: SwiGLU for Llama, GeGLU (tanh gelu) for Gemma."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gelu = cfg.mlp_act == "gelu_tanh"

    def forward(self, x: Tensor) -> Tensor:
        g = self.gate_proj(x)
        g = F.gelu(g, approximate="tanh") if self.gelu else F.silu(g)
        return self.down_proj(g * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = make_norm(cfg)
        self.post_attention_layernorm = make_norm(cfg)


# ----------------------------------------------------------------------------------------------
# Forward-time contracts


# (layer, "attn" | "mlp", compute) -> the branch output: compute() or a stored tensor.
BranchCache = Callable[[int, str, Callable[[], Tensor]], Tensor]


@dataclass(frozen=True)
class AttnProbe:
    """Ask one layer for attention probabilities from chosen queries to a key range.

    layer: which layer (must run on all tokens, i.e. <= a plan's last_shared_layer);
    query_index: (Nq,) indices into the tokens of this call;
    key_start, key_end: absolute positions of the keys of interest (the visual tokens).
    """

    layer: int
    query_index: Tensor
    key_start: int
    key_end: int


@dataclass
class LMOutput:
    """hidden (B, T', d) after the final norm. T' = T unless a TokenPlan pruned/reused tokens
    from the deep layers; then ``index`` (B, T') gives each output row's index in the input."""

    hidden: Tensor
    index: Tensor | None = None
    probe: ProbeResult | None = None


# ----------------------------------------------------------------------------------------------
# The model


class Decoder(nn.Module):
    """Embeddings, layers and final norm; HF name: ``model``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = make_norm(cfg)
        self.init_buffers()

    def init_buffers(self, device: torch.device | str | None = None) -> None:
        """The RoPE tables, computed from the config (never stored in a checkpoint). A model
        built on the meta device (``checkpoint.load_vla`` streams weights into one) calls this
        again with ``device="cpu"`` to make them real."""
        pos = torch.arange(self.cfg.max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(pos, rope_inv_freq(self.cfg).to(pos.device))
        emb = torch.cat((freqs, freqs), dim=-1)  # (S, hd)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)


class LlamaLM(nn.Module):
    """A Llama-family causal LM (HF ``LlamaForCausalLM`` / ``GemmaForCausalLM`` names)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # -- small public helpers ------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def embed(self, ids: Tensor) -> Tensor:
        """Token ids (B, T) -> input embeddings (B, T, d), Gemma's sqrt(d) scale included."""
        x = self.model.embed_tokens(ids)
        if self.cfg.gemma_norm:
            x = x * torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype)
        return x

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        return KVCache(self.cfg, batch, max_len, self.dtype, self.model.embed_tokens.weight.device)

    @torch.no_grad()
    def prepack(self) -> LlamaLM:
        """Swap every projection (and the LM head) for a oneDNN-prepacked ``PackedLinear``.

        CPU inference only: call after loading weights and casting dtype; the weights must not
        change afterwards (the packed copies would go stale). No-op without oneDNN."""
        if self.model.embed_tokens.weight.device.type != "cpu":
            return self
        if not prepack_supported(self.dtype):
            return self
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear and child.bias is None:
                    setattr(module, name, PackedLinear(child))
        return self

    # -- forward -------------------------------------------------------------------------------

    def forward(
        self,
        embeds: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        *,
        causal: bool = True,
        attn_mask: Tensor | None = None,
        pad_mask: Tensor | None = None,
        plan: TokenPlan | DeferredPlan | None = None,
        probe: AttnProbe | None = None,
        skip_layers: frozenset[int] = frozenset(),
        kv_out: list[tuple[Tensor, Tensor]] | None = None,
    ) -> LMOutput:
        """Run the decoder over ``embeds`` (B, T, d).

        positions: (T,) or (B, T) absolute positions (default 0..T-1); RoPE uses them and the
            cache is written at them.
        cache: written at ``positions``; keys visible to a query are the valid cached slots
            (up to the query's position when causal) plus the tokens of this call.
        causal / attn_mask: mask among the tokens of this call; ``attn_mask`` (T, T) or
            (B, T, T) bool overrides ``causal``.
        pad_mask: (B, T) bool, False for padding tokens (never attended to).
        plan: partial recompute (requires ``cache``); a ``DeferredPlan`` is decided after the
            shared layers from this call's probe.
        probe: return attention probabilities at one shallow layer.
        skip_layers: layer indices not executed (their cache slots are left untouched).
        kv_out: a list that receives each layer's attended (keys, values), (B, KVH, S, hd) after
            RoPE, with their autograd history: training an action expert on the prefix K/V of
            the same pass that trains the decoder (the cache cannot hold that pass, whose
            action-token groups share positions).

        An action expert attending to this decoder's cache (pi0) and the one-token decode /
        Jacobi steps run in ``static_step`` (no host synchronisation), over these same layers.
        """
        b, t, _ = embeds.shape
        if positions is None:
            positions = torch.arange(t, device=embeds.device)
        if plan is not None and cache is None:
            raise ValueError("a TokenPlan needs a KV cache holding the reused tokens")
        if plan is not None and probe is not None and probe.layer > plan.last_shared_layer:
            raise ValueError(
                f"probe layer {probe.layer} is deeper than the plan's shared layers "
                f"(0..{plan.last_shared_layer}); only those see every token"
            )
        self._check_positions(positions, cache)
        rope = (self.model.rope_cos, self.model.rope_sin, self.dtype)
        ctx = Context.build(rope, embeds, positions, cache, causal, attn_mask, pad_mask)
        x, probe_out = embeds, None
        n_layers = len(self.model.layers)
        split = plan.last_shared_layer + 1 if plan is not None else n_layers
        for i in range(min(split, n_layers)):
            if i in skip_layers:
                continue
            x, p = self._layer(
                i, x, ctx, probe if probe is not None and probe.layer == i else None, kv_out
            )
            probe_out = p or probe_out
        index = None
        if isinstance(plan, DeferredPlan):
            plan = plan.resolve(probe_out)
        if plan is not None and split < n_layers:
            x, ctx, index = self._enter_deep_layers(x, ctx, plan, cache, split)
            for i in range(split, n_layers):
                if i not in skip_layers:
                    x, _ = self._layer(i, x, ctx, None)
        return LMOutput(self.model.norm(x), index, probe_out)

    def _check_positions(self, positions: Tensor, cache: KVCache | None) -> None:
        top = int(positions.max()) if positions.numel() else 0
        limit = cache.max_len if cache is not None else self.cfg.max_positions
        if top >= min(limit, self.cfg.max_positions):
            raise ValueError(
                f"position {top} exceeds the context ({min(limit, self.cfg.max_positions)} "
                "tokens); shorten the instruction or raise max_positions"
            )

    def _layer(
        self,
        i: int,
        x: Tensor,
        ctx: Context,
        probe: AttnProbe | None,
        kv_out: list[tuple[Tensor, Tensor]] | None = None,
    ) -> tuple[Tensor, ProbeResult | None]:
        layer = self.model.layers[i]
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.input_layernorm(x), ctx.cos, ctx.sin)
        keys, values = ctx.keys_values(i, k, v)
        if kv_out is not None:
            kv_out.append((keys, values))
        probe_out = _probe(q, keys, values, probe, ctx) if probe is not None else None
        x = x + attn.attend(q, keys, values, ctx.sdpa_mask, ctx.sdpa_causal)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, probe_out

    def _enter_deep_layers(
        self, x: Tensor, ctx: Context, plan: TokenPlan, cache: KVCache, split: int
    ) -> tuple[Tensor, Context, Tensor]:
        """Keep recomputed and non-visual tokens; prune/reuse the others in layers >= split."""
        b, t, _ = x.shape
        keep = plan.deep_keep_mask(t).to(x.device)  # (B, T)
        index = keep.nonzero()[:, 1].view(b, -1)  # (B, T') equal counts by the plan's invariant
        vis = plan.vis_start + torch.arange(plan.num_visual, device=x.device)
        vis_pos = ctx.positions_bt[:, vis]  # (B, Nv)
        rows = torch.arange(b, device=x.device)[:, None]
        pruned = (plan.decisions == TokenAction.PRUNE).to(x.device)
        reused = (plan.decisions == TokenAction.REUSE).to(x.device)
        deep_valid = cache.valid[split:]  # (L', B, S)
        missing = reused & ~deep_valid[:, rows, vis_pos].all(dim=0)
        if bool(missing.any()):
            raise ValueError(
                f"TokenPlan reuses {int(missing.sum())} tokens that have no cached K/V"
            )
        # Pruned tokens disappear from every deep layer; reused ones keep their old slots.
        deep_valid[:, rows.expand_as(vis_pos)[pruned], vis_pos[pruned]] = False
        cache.layered = True
        x = x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))
        ctx = ctx.subset(index)
        return x, ctx, index


def _probe(q: Tensor, keys: Tensor, values: Tensor, probe: AttnProbe, ctx: Context) -> ProbeResult:
    """Explicit softmax for a handful of query rows only; the layer itself keeps using SDPA, so
    probing never forces the slow attention path on all tokens. Key positions are indices into
    the attended keys (= absolute positions when a cache is used)."""
    qi = probe.query_index.to(q.device)
    qs = q[:, :, qi]  # (B, H, Nq, hd)
    n_rep = q.shape[1] // keys.shape[1]
    kk = keys.repeat_interleave(n_rep, dim=1) if n_rep > 1 else keys
    scores = (qs.float() @ kk.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~ctx.mask[:, :, qi], float("-inf"))
    probs = scores.softmax(-1)  # normalised over every visible key, as the layer itself does
    span = slice(probe.key_start, probe.key_end)
    return ProbeResult(probs[..., span], values[:, :, span])
