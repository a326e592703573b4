"""Vision Transformer towers of VLA policies: SigLIP, DINOv2 (+registers), CLIP, OpenVLA's fusion.

Three flavours of one pre-LN ViT: SigLIP (HF ``SiglipVisionModel``: no CLS token, tanh GELU,
``post_layernorm``; pi0, SmolVLA, OpenVLA's second tower), DINOv2 (HF ``Dinov2Model`` /
``Dinov2WithRegistersModel``: CLS + register tokens, layer scale, exact GELU, ``layernorm``)
and CLIP (HF ``CLIPVisionModel``: CLS token, a bias-free patch conv, ``pre_layrnorm`` on the
embeddings, quick GELU, ``post_layernorm`` on the pooled CLS only; LLaVA's tower).

Parameter names are the Hugging Face checkpoint names, so HF weights load without renaming; a load
hook also accepts the names transformers >= 5 uses in memory (no ``vision_model.`` prefix, DINOv2
``q_proj``/``o_proj``). ``forward`` returns what OpenVLA (and LLaVA-1.5) feeds its projector:
the patch tokens of the second-to-last block (timm
``get_intermediate_layers(n={depth - 2})``), and runs only the blocks that needs. OpenVLA's own
checkpoint stores the towers under timm names: the renames live in ``vit_names``
(``timm_to_hf_vit`` / ``hf_to_timm_vit``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.vit_names import (  # noqa: F401 (re-exported: the names belong to the towers)
    IGNORED_HF_PREFIXES,
    canonical_hf_state_dict,
    hf_to_timm_vit,
    siglip_to_clip_vit,
    timm_to_hf_vit,
)

# ----------------------------------------------------------------------------------------------
# Config

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' constants of that name
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_KINDS = ("siglip", "dinov2", "clip")
_DEFAULT_MEAN_STD = {
    "siglip": ((0.5,) * 3, (0.5,) * 3),
    "dinov2": (IMAGENET_MEAN, IMAGENET_STD),
    "clip": (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
}
# HF SigLIP uses gelu_pytorch_tanh, HF DINOv2 exact gelu, OpenAI's CLIP (and so LLaVA's tower)
# quick_gelu, x * sigmoid(1.702 x). timm's `vit_so400m_patch14_siglip_224` (what OpenVLA runs)
# uses exact nn.GELU, so the OpenVLA SigLIP tower sets "none" explicitly.
_DEFAULT_GELU = {"siglip": "tanh", "dinov2": "none", "clip": "quick"}
_GELUS = ("tanh", "none", "quick")
# HF's config defaults: CLIPVisionConfig 1e-5, SigLIP and DINOv2 1e-6.
_DEFAULT_EPS = {"siglip": 1e-6, "dinov2": 1e-6, "clip": 1e-5}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class ViTConfig:
    """Shape of one ViT tower. ``image_mean``/``image_std``/``gelu_approximate`` default per kind.

    feature_layer indexes HF ``hidden_states`` (embeddings first): -2 (default, OpenVLA and
    LLaVA-1.5) is the output of block ``num_layers - 1``; -1 means HF ``last_hidden_state``: all
    blocks plus the final norm for SigLIP and DINOv2, all blocks and no norm for CLIP (whose
    ``post_layernorm`` only norms the pooled CLS token).
    """

    kind: str  # "siglip" | "dinov2" | "clip"
    image_size: int
    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    layer_norm_eps: float | None = None  # per kind (HF's defaults) when None
    num_registers: int = 0
    feature_layer: int = -2
    image_mean: tuple[float, float, float] | None = None
    image_std: tuple[float, float, float] | None = None
    # torch's GELU `approximate` ("tanh" | "none"), or "quick": CLIP's x * sigmoid(1.702 x)
    gelu_approximate: str | None = None

    def __post_init__(self) -> None:
        _require(self.kind in _KINDS, f"ViTConfig.kind must be one of {_KINDS}, got {self.kind!r}.")
        sizes = (self.image_size, self.patch_size, self.hidden_size, self.num_layers)
        sizes += (self.num_heads, self.intermediate_size)
        _require(min(sizes) > 0, f"ViTConfig sizes must be positive, got {self}.")
        S, P, D, H = self.image_size, self.patch_size, self.hidden_size, self.num_heads
        L = self.num_layers
        # SigLIP's patch conv floors as Hugging Face's does: So400m/14 at 384 px (RDT-1b) sees
        # 27 x 27 patches and ignores the last 6 pixel rows and columns.
        _require(
            S % P == 0 or (self.kind == "siglip" and S >= P),
            f"image_size {S} is not divisible by patch_size {P}.",
        )
        _require(D % H == 0, f"hidden_size {D} is not divisible by num_heads {H}.")
        _require(
            self.num_registers >= 0 and not (self.kind != "dinov2" and self.num_registers),
            f"num_registers must be >= 0 (0 unless dinov2), got {self.num_registers}.",
        )
        _require(
            -(L + 1) <= self.feature_layer <= -1,
            f"feature_layer must be in [-{L + 1}, -1], got {self.feature_layer}.",
        )
        # Frozen dataclass: per-kind defaults are filled in through object.__setattr__.
        eps = _DEFAULT_EPS[self.kind] if self.layer_norm_eps is None else self.layer_norm_eps
        object.__setattr__(self, "layer_norm_eps", eps)
        _require(self.layer_norm_eps > 0, f"layer_norm_eps must be > 0, got {self.layer_norm_eps}.")
        mean, std = _DEFAULT_MEAN_STD[self.kind]
        object.__setattr__(self, "image_mean", tuple(self.image_mean or mean))
        object.__setattr__(self, "image_std", tuple(self.image_std or std))
        gelu = self.gelu_approximate or _DEFAULT_GELU[self.kind]
        object.__setattr__(self, "gelu_approximate", gelu)
        _require(
            len(self.image_mean) == len(self.image_std) == 3 and min(self.image_std) > 0,
            f"image_mean/std need 3 values (std > 0), got {self.image_mean}/{self.image_std}.",
        )
        _require(
            self.gelu_approximate in _GELUS,
            f"gelu_approximate must be one of {_GELUS}, got {self.gelu_approximate!r}.",
        )

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: CLS + registers for DINOv2, CLS for CLIP, none for SigLIP."""
        return {"siglip": 0, "dinov2": 1 + self.num_registers, "clip": 1}[self.kind]

    @property
    def last_state_normed(self) -> bool:
        """Whether HF's ``last_hidden_state`` (feature_layer -1) passes the final norm: not
        CLIP's, whose ``post_layernorm`` applies to the pooled CLS token alone."""
        return self.kind != "clip"

    @property
    def seq_len(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    @property
    def feature_blocks(self) -> int:
        """How many blocks ``forward`` runs to produce ``feature_layer``."""
        if self.feature_layer == -1:
            return self.num_layers
        return self.num_layers + 1 + self.feature_layer

    def num_params(self) -> int:
        """Parameter count of ``ViTEncoder(self)``, analytically."""
        D, I, P, N = self.hidden_size, self.intermediate_size, self.patch_size, self.num_patches
        embed = 3 * P * P * D + D  # conv patch embedding with bias
        if self.kind == "siglip":
            embed += N * D
        elif self.kind == "dinov2":  # positions incl. CLS slot, CLS, mask token, registers
            embed += (N + 1) * D + D + D + self.num_registers * D
        else:  # no conv bias; positions incl. CLS slot, CLS, pre_layrnorm
            embed += -D + (N + 1) * D + D + 2 * D
        block = 4 * (D * D + D) + (D * I + I) + (I * D + D) + 2 * 2 * D
        block += 2 * D if self.kind == "dinov2" else 0  # layer scales
        return embed + self.num_layers * block + 2 * D  # + final norm

    def flops(self, batch: int, layers: int | None = None) -> int:
        """Forward FLOPs (2 per multiply-add) of the patch embedding and ``layers`` blocks
        (default: the blocks ``forward`` runs). Norms, GELU, softmax and adds are ignored."""
        layers = self.feature_blocks if layers is None else layers
        if not 0 <= layers <= self.num_layers:
            raise ValueError(f"layers must be in [0, {self.num_layers}], got {layers}.")
        D, I, T = self.hidden_size, self.intermediate_size, self.seq_len
        patch = self.num_patches * 3 * self.patch_size**2 * D
        block = 4 * T * D * D + 2 * T * T * D + 2 * T * D * I  # q,k,v,o + QK^T, AV + MLP
        return 2 * batch * (patch + layers * block)

    @classmethod
    def siglip_so400m(cls, image_size: int = 224, **overrides) -> ViTConfig:
        """SigLIP So400m/14 (google/siglip-so400m-patch14-224 / -384)."""
        # kind, image_size, patch_size, hidden_size, num_layers, num_heads, intermediate_size
        return cls("siglip", image_size, 14, 1152, 27, 16, 4304, **overrides)

    @classmethod
    def clip_large(cls, image_size: int = 336, **overrides) -> ViTConfig:
        """CLIP ViT-L/14 (openai/clip-vit-large-patch14-336: LLaVA-1.5's tower)."""
        return cls("clip", image_size, 14, 1024, 24, 16, 4096, **overrides)

    @classmethod
    def dinov2_large(cls, image_size: int = 224, num_registers: int = 4, **overrides) -> ViTConfig:
        """DINOv2 ViT-L/14, by default with 4 registers (OpenVLA's timm reg4 tower)."""
        regs = dict(num_registers=num_registers)
        return cls("dinov2", image_size, 14, 1024, 24, 16, 4096, **regs, **overrides)


def openvla_vision_configs(image_size: int = 224) -> tuple[ViTConfig, ViTConfig]:
    """(featurizer, fused_featurizer) configs of OpenVLA's "dinosiglip-vit-so-224px" backbone.

    OpenVLA builds SigLIP through timm, whose so400m model uses exact GELU (not HF's tanh form).
    """
    return (
        ViTConfig.dinov2_large(image_size),
        ViTConfig.siglip_so400m(image_size, gelu_approximate="none"),
    )


# ----------------------------------------------------------------------------------------------
# Layers


class _Scope(nn.Module):
    """Parameter-free container whose only job is reproducing HF's module nesting (and hence its
    state_dict keys), e.g. DINOv2's ``attention.attention.query``."""

    def __init__(self, **children: nn.Module | nn.Parameter) -> None:
        super().__init__()
        for name, child in children.items():
            setattr(self, name, child)


def _attention(x: Tensor, q: nn.Linear, k: nn.Linear, v: nn.Linear, num_heads: int) -> Tensor:
    """Bidirectional multi-head self-attention on (B, T, D) -> (B, T, D), before out-projection."""
    B, T, D = x.shape
    # (B, T, D) -> (B, H, T, hd); SDPA's default scale is hd**-0.5, as in both HF models.
    heads = [p(x).view(B, T, num_heads, D // num_heads).transpose(1, 2) for p in (q, k, v)]
    y = F.scaled_dot_product_attention(*heads)  # (B, H, T, hd)
    return y.transpose(1, 2).reshape(B, T, D)


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2 (the same names in all three HF models)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.approximate = cfg.gelu_approximate

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        if self.approximate == "quick":  # HF's QuickGELUActivation
            return self.fc2(h * torch.sigmoid(1.702 * h))
        return self.fc2(F.gelu(h, approximate=self.approximate))


class SiglipEmbeddings(nn.Module):
    """Conv patches + learned positions (an nn.Embedding weight (N, D), added to every token)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.patch_embedding = nn.Conv2d(3, D, cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.num_patches, D)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        return x + self.position_embedding.weight  # (B, N, D)


class ClipEmbeddings(nn.Module):
    """[CLS, conv patches (no bias)] + learned positions for 1 + N tokens (HF CLIP's names)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.class_embedding = nn.Parameter(torch.empty(D))
        self.patch_embedding = nn.Conv2d(3, D, cfg.patch_size, stride=cfg.patch_size, bias=False)
        self.position_embedding = nn.Embedding(cfg.num_patches + 1, D)
        # HF CLIP's initialisation (initializer_range 0.02), for towers trained from scratch.
        nn.init.normal_(self.class_embedding, std=D**-0.5)
        nn.init.normal_(self.patch_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding.weight, std=0.02)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)  # (B, 1, D)
        return torch.cat([cls, x], dim=1) + self.position_embedding.weight  # (B, 1 + N, D)


class SiglipLayer(nn.Module):
    """Pre-LN block: x + attn(ln1(x)); x + mlp(ln2(x)). CLIP's layer has the same names."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.num_heads = cfg.num_heads
        self.layer_norm1 = nn.LayerNorm(D, eps=eps)
        self.self_attn = _Scope(
            **{n: nn.Linear(D, D) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
        )
        self.layer_norm2 = nn.LayerNorm(D, eps=eps)
        self.mlp = Mlp(cfg)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        a = self.self_attn
        h = _attention(self.layer_norm1(x), a.q_proj, a.k_proj, a.v_proj, self.num_heads)
        x = x + a.out_proj(h)
        return x + self.mlp(self.layer_norm2(x))


class Dinov2Embeddings(nn.Module):
    """[CLS, patches] + positions (CLS slot included), then registers inserted after CLS.

    Registers get no position embedding (as in DINOv2-reg and HF Dinov2WithRegisters).
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        # Only used for masked-image pretraining; kept so HF checkpoints load strictly.
        self.mask_token = nn.Parameter(torch.zeros(1, D))
        self.position_embeddings = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, D))
        if cfg.num_registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, cfg.num_registers, D))
        self.patch_embeddings = _Scope(
            projection=nn.Conv2d(3, D, cfg.patch_size, stride=cfg.patch_size)
        )
        self.num_registers = cfg.num_registers
        for p in (self.cls_token, self.position_embeddings):
            nn.init.trunc_normal_(p, std=0.02)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        B = x.shape[0]
        x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1 + N, D)
        x = x + self.position_embeddings
        if self.num_registers:
            regs = self.register_tokens.expand(B, -1, -1)  # (B, R, D)
            x = torch.cat([x[:, :1], regs, x[:, 1:]], dim=1)  # (B, 1 + R + N, D)
        return x


class Dinov2Layer(nn.Module):
    """Pre-LN block with layer scale: x + ls1 * attn(norm1(x)); x + ls2 * mlp(norm2(x))."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        D, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(D, eps=eps)
        self.attention = _Scope(
            attention=_Scope(query=nn.Linear(D, D), key=nn.Linear(D, D), value=nn.Linear(D, D)),
            output=_Scope(dense=nn.Linear(D, D)),
        )
        self.layer_scale1 = _Scope(lambda1=nn.Parameter(torch.ones(D)))
        self.norm2 = nn.LayerNorm(D, eps=eps)
        self.mlp = Mlp(cfg)
        self.layer_scale2 = _Scope(lambda1=nn.Parameter(torch.ones(D)))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        sa = self.attention.attention
        h = _attention(self.norm1(x), sa.query, sa.key, sa.value, self.num_heads)
        x = x + self.attention.output.dense(h) * self.layer_scale1.lambda1
        return x + self.mlp(self.norm2(x)) * self.layer_scale2.lambda1


# ----------------------------------------------------------------------------------------------
# Encoder


def _hf_load_pre_hook(module: ViTEncoder, state_dict: dict, prefix: str, *_) -> None:
    """Rewrite this encoder's slice of ``state_dict`` (in place) into canonical HF names."""
    ours = {k[len(prefix) :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(prefix)}
    for key, value in canonical_hf_state_dict(ours, module.config.kind).items():
        state_dict[prefix + key] = value


class ViTEncoder(nn.Module):
    """A SigLIP, DINOv2 or CLIP vision tower whose ``state_dict`` uses Hugging Face's names.

    Input is normalised pixels (B, 3, S, S) as HF takes them (see ``normalize``); compute runs in
    the parameters' dtype (fp32 or bf16).
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = cfg = config
        D, eps, L = cfg.hidden_size, cfg.layer_norm_eps, cfg.num_layers
        if cfg.kind == "siglip":
            self.vision_model = _Scope(
                embeddings=SiglipEmbeddings(cfg),
                encoder=_Scope(layers=nn.ModuleList(SiglipLayer(cfg) for _ in range(L))),
                post_layernorm=nn.LayerNorm(D, eps=eps),
            )
        elif cfg.kind == "clip":
            # post_layernorm never touches the patch features (HF norms the pooled CLS with it);
            # kept so HF checkpoints load strictly and a loaded tower can be saved back whole.
            self.vision_model = _Scope(
                embeddings=ClipEmbeddings(cfg),
                pre_layrnorm=nn.LayerNorm(D, eps=eps),  # sic: HF's (and OpenAI's) spelling
                encoder=_Scope(layers=nn.ModuleList(SiglipLayer(cfg) for _ in range(L))),
                post_layernorm=nn.LayerNorm(D, eps=eps),
            )
        else:
            self.embeddings = Dinov2Embeddings(cfg)
            self.encoder = _Scope(layer=nn.ModuleList(Dinov2Layer(cfg) for _ in range(L)))
            self.layernorm = nn.LayerNorm(D, eps=eps)
        self._register_load_state_dict_pre_hook(_hf_load_pre_hook, with_module=True)

    # Uniform handles on the kind-specific submodules (properties, so nothing is registered twice).
    @property
    def embed(self) -> nn.Module:
        return self.embeddings if self.config.kind == "dinov2" else self.vision_model.embeddings

    @property
    def blocks(self) -> nn.ModuleList:
        if self.config.kind == "dinov2":
            return self.encoder.layer
        return self.vision_model.encoder.layers

    @property
    def final_norm(self) -> nn.LayerNorm:
        return self.layernorm if self.config.kind == "dinov2" else self.vision_model.post_layernorm

    @property
    def embed_dim(self) -> int:
        return self.config.hidden_size

    def _check_pixels(self, x: Tensor, name: str = "pixel_values") -> None:
        S, kind = self.config.image_size, self.config.kind
        want = f"{name} must be a floating-point (B, 3, {S}, {S}) tensor for this {kind} encoder"
        if not isinstance(x, Tensor):
            raise ValueError(f"{want}, got {type(x).__name__}.")
        if x.ndim != 4 or x.shape[1] != 3 or tuple(x.shape[2:]) != (S, S):
            raise ValueError(f"{want}, got shape {tuple(x.shape)}.")
        if not x.is_floating_point():
            raise ValueError(f"{want}, got dtype {x.dtype}.")

    def _embed(self, pixel_values: Tensor) -> Tensor:
        self._check_pixels(pixel_values)
        dtype = self.final_norm.weight.dtype
        x = self.embed(pixel_values.to(dtype))  # (B, T, D)
        # CLIP norms the embeddings before the first block; HF's hidden_states[0] is after it.
        return self.vision_model.pre_layrnorm(x) if self.config.kind == "clip" else x

    def forward(self, pixel_values: Tensor) -> Tensor:
        """Patch features per ``config.feature_layer``: (B, num_patches, hidden).

        Runs only ``config.feature_blocks`` blocks; prefix tokens (CLS, registers) are dropped
        (LLaVA's vision_feature_select_strategy "default").
        """
        x = self._embed(pixel_values)  # (B, T, D)
        for block in self.blocks[: self.config.feature_blocks]:
            x = block(x)
        if self.config.feature_layer == -1 and self.config.last_state_normed:
            x = self.final_norm(x)
        return x[:, self.config.num_prefix_tokens :]  # (B, N, D)

    def hidden_states(self, pixel_values: Tensor) -> list[Tensor]:
        """Every hidden state like HF ``output_hidden_states=True``: embeddings output, then each
        block's output (no final norm), all tokens. num_layers + 1 tensors of (B, T, D)."""
        states = [self._embed(pixel_values)]
        for block in self.blocks:
            states.append(block(states[-1]))
        return states

    def last_hidden_state(self, pixel_values: Tensor) -> Tensor:
        """All blocks then the final norm (none for CLIP), all tokens (HF ``last_hidden_state``):
        (B, T, D)."""
        x = self.hidden_states(pixel_values)[-1]
        return self.final_norm(x) if self.config.last_state_normed else x

    def normalize(self, images01: Tensor) -> Tensor:
        """(B, 3, S, S) floats in [0, 1] -> (x - mean) / std with this tower's constants."""
        self._check_pixels(images01, "images01")
        # Python-float constants: exact in any dtype, nothing to keep on device, graph-capturable.
        mean, std = self.config.image_mean, self.config.image_std
        return torch.stack([(images01[:, c] - mean[c]) / std[c] for c in range(3)], dim=1)

    def num_params(self) -> int:
        return self.config.num_params()

    def flops(self, batch: int, layers: int | None = None) -> int:
        return self.config.flops(batch, layers)


# ----------------------------------------------------------------------------------------------
# Backbones and projector (OpenVLA / prismatic)


class SingleVisionBackbone(nn.Module):
    """One tower on [0, 1] images (pi0 / SmolVLA: SigLIP only). Output (B, N, D)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.featurizer = ViTEncoder(config)

    @property
    def embed_dim(self) -> int:
        return self.featurizer.embed_dim

    def forward(self, images01: Tensor) -> Tensor:
        return self.featurizer(self.featurizer.normalize(images01))  # (B, N, D)

    def num_params(self) -> int:
        return self.featurizer.num_params()

    def flops(self, batch: int) -> int:
        return self.featurizer.flops(batch)


class FusedVisionBackbone(nn.Module):
    """OpenVLA's DINOv2 + SigLIP featurizer: both towers see the same image, each normalised with
    its own mean/std; patch features are concatenated on channels -> (B, N, d_dino + d_siglip).

    Attribute names mirror prismatic's ``vision_backbone.featurizer`` / ``.fused_featurizer``.
    """

    def __init__(self, featurizer: ViTConfig, fused_featurizer: ViTConfig) -> None:
        super().__init__()
        a, b = featurizer, fused_featurizer
        if (a.image_size, a.grid) != (b.image_size, b.grid):
            raise ValueError(
                f"fused towers must share image size and patch grid, got {a.image_size}px "
                f"({a.grid}x{a.grid} patches) vs {b.image_size}px ({b.grid}x{b.grid} patches)."
            )
        self.featurizer = ViTEncoder(featurizer)
        self.fused_featurizer = ViTEncoder(fused_featurizer)

    @property
    def embed_dim(self) -> int:
        return self.featurizer.embed_dim + self.fused_featurizer.embed_dim

    def forward(self, images01: Tensor) -> Tensor:
        a = self.featurizer(self.featurizer.normalize(images01))  # (B, N, d_dino)
        b = self.fused_featurizer(self.fused_featurizer.normalize(images01))  # (B, N, d_siglip)
        return torch.cat([a, b], dim=-1)  # (B, N, d_dino + d_siglip)

    def num_params(self) -> int:
        return self.featurizer.num_params() + self.fused_featurizer.num_params()

    def flops(self, batch: int) -> int:
        return self.featurizer.flops(batch) + self.fused_featurizer.flops(batch)


class Projector(nn.Module):
    """OpenVLA's vision -> LLM projector (prismatic ``PrismaticProjector``).

    Source: openvla/openvla ``prismatic/extern/hf/modeling_prismatic.py``. Fused backbone:
    fc1 (v -> 4v), GELU, fc2 (4v -> llm), GELU, fc3 (llm -> llm); otherwise fc1 (v -> llm), GELU,
    fc2 (llm -> llm). All Linear with bias; GELU is ``nn.GELU()`` i.e. exact (erf).
    """

    def __init__(self, vision_dim: int, llm_dim: int, fused: bool) -> None:
        super().__init__()
        self.vision_dim, self.llm_dim, self.fused = vision_dim, llm_dim, fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)

    def _dims(self) -> list[tuple[int, int]]:
        v, m = self.vision_dim, self.llm_dim
        return [(v, 4 * v), (4 * v, m), (m, m)] if self.fused else [(v, m), (m, m)]

    def forward(self, x: Tensor) -> Tensor:  # (B, N, vision_dim) -> (B, N, llm_dim)
        x = self.fc2(F.gelu(self.fc1(x)))
        return self.fc3(F.gelu(x)) if self.fused else x

    def num_params(self) -> int:
        return sum(i * o + o for i, o in self._dims())

    def flops(self, tokens: int) -> int:
        """Forward FLOPs for ``tokens`` patch tokens (2 per multiply-add)."""
        return 2 * tokens * sum(i * o for i, o in self._dims())
