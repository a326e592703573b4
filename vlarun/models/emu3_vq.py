"""Emu3's VQ image tokenizer as UniVLA uses it: pixels -> codebook ids -> the LM's image tokens.

The encoder half of transformers' ``Emu3VQVAE`` (``Emu3VQVAE.encode``), with its parameter
names (``encoder.*``, ``quant_conv.*``, ``quantize.embedding.*``; ``vqmodel.`` or
``model.vqmodel.`` in front inside ``Emu3ForConditionalGeneration``), and the layout Emu3's
processor and ``Emu3Model.get_image_tokens`` give one image in the LM's sequence. The decoder
(``decoder.*``, ``post_quant_conv.*``) turns ids back into pixels; nothing here needs it.

  pixels (N, 3, H, W), normalised
    -> conv_in; per level: residual blocks (GroupNorm 32, swish, 3x3 convs), self-attention at
       ``attn_resolutions``, a stride-2 conv but after the last level   (N, C, H/f, W/f)
    -> middle: residual block, self-attention, residual block; GroupNorm, swish, conv_out
                                                                          (N, latent, h, w)
    -> time: the image stands for a clip of ``temporal_factor`` equal frames; causal 3-D convs
       halve the frames log2(T) times (swish after each), 3-D residual blocks (BatchNorm)
                                                                          (N, latent, 1, h, w)
    -> quant_conv (3 x 1 x 1, causal) -> nearest codebook entry per position  (N, h, w) ids

Emu3 runs the 2-D encoder on all T copies of the image; they are equal, so this runs it once and
repeats its output along time (the same numbers, a T-th of the work). Swish is written as Emu3
writes it (``x * sigmoid(x)``): the ids are argmins, and a fused SiLU can round differently.

In the LM's sequence (``VQImageTokens``) an image of h x w codes is
``<|image start|> "h*w" <|image token|>``, then each row's codes as LM ids followed by an
end-of-line id ``<|extra_200|>``, then ``<|extra_201|> <|image end|>``: ``h * (w + 1)`` image
ids between a fixed head and tail (Emu3's ``Emu3Processor.replace_image_token`` and
``Emu3ImageVocabularyMapping.convert_img2bpe``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# transformers' Emu3ImageProcessor defaults (OPENAI_CLIP_MEAN / _STD); a checkpoint's
# preprocessor_config.json may say otherwise (univla.py reads it).
EMU3_MEAN = (0.48145466, 0.4578275, 0.40821073)
EMU3_STD = (0.26862954, 0.26130258, 0.27577711)
GROUPS = 32  # every GroupNorm in the encoder: 32 groups, eps 1e-6


@dataclass(frozen=True)
class VQConfig:
    """Shape of the VQ tokenizer (transformers' ``Emu3VQVAEConfig``, defaults equal) at the
    square ``image_size`` vlarun feeds it. Levels: ``channel_multiplier`` (one per level,
    ``base_channels`` times it), a stride-2 conv between levels, so ids form a grid of
    ``image_size / 2^(levels - 1)`` per side."""

    image_size: int
    codebook_size: int = 32768
    embed_dim: int = 4
    latent_channels: int = 4
    base_channels: int = 256
    channel_multiplier: tuple[int, ...] = (1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = (3,)
    num_heads: int = 1
    temporal_factor: int = 4
    image_mean: tuple[float, float, float] = EMU3_MEAN
    image_std: tuple[float, float, float] = EMU3_STD

    def __post_init__(self) -> None:
        widths = [self.base_channels * m for m in (1, *self.channel_multiplier)]
        if not self.channel_multiplier or any(w % GROUPS for w in widths):
            raise ValueError(f"VQ channel widths {widths} must be multiples of {GROUPS}")
        if self.width % self.num_heads:
            raise ValueError(f"VQ attention: {self.num_heads} heads do not divide {self.width}")
        t = self.temporal_factor
        if t < 1 or t & (t - 1):
            raise ValueError(f"temporal_factor must be a power of 2, got {t}")
        if self.image_size < 1 or self.image_size % self.spatial_factor:
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of the VQ's "
                f"{self.spatial_factor}-pixel code"
            )
        if min(self.image_std) <= 0 or len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValueError("image_mean/std need 3 values each, std > 0")

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.channel_multiplier) - 1)

    @property
    def grid(self) -> int:
        """Codes per side of one image."""
        return self.image_size // self.spatial_factor

    @property
    def width(self) -> int:
        """Channels of the last level, the middle block and every attention block (Emu3's
        ``hidden_size``)."""
        return self.base_channels * self.channel_multiplier[-1]

    @classmethod
    def from_hf(cls, vq: dict, image_size: int, mean=EMU3_MEAN, std=EMU3_STD) -> VQConfig:
        """From an ``Emu3VQVAEConfig`` dict (``vq_config`` of an Emu3 config.json)."""
        defaults = cls(image_size=image_size)
        mult = tuple(vq.get("channel_multiplier", defaults.channel_multiplier))
        base = vq.get("base_channels", defaults.base_channels)
        for key, want in (("double_latent", False), ("in_channels", 3)):
            if vq.get(key, want) != want:
                raise ValueError(f"vq_config {key}={vq[key]!r}; vlarun's VQ encoder has {want}")
        if vq.get("hidden_size", base * mult[-1]) != base * mult[-1]:
            raise ValueError(
                f"vq_config hidden_size={vq['hidden_size']} is not the last level's width "
                f"{base * mult[-1]} (base_channels x channel_multiplier[-1])"
            )
        return cls(
            image_size=image_size,
            codebook_size=vq.get("codebook_size", defaults.codebook_size),
            embed_dim=vq.get("embed_dim", defaults.embed_dim),
            latent_channels=vq.get("latent_channels", defaults.latent_channels),
            base_channels=base,
            channel_multiplier=mult,
            num_res_blocks=vq.get("num_res_blocks", defaults.num_res_blocks),
            attn_resolutions=tuple(vq.get("attn_resolutions", defaults.attn_resolutions)),
            num_heads=vq.get("num_attention_heads", defaults.num_heads),
            temporal_factor=vq.get("temporal_downsample_factor", defaults.temporal_factor),
            image_mean=tuple(mean),
            image_std=tuple(std),
        )

    def num_params(self) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in VQTokenizer(self).parameters())

    def cost(self, images: int) -> tuple[int, int]:
        """(FLOPs, activation elements written) of tokenizing ``images`` images: the convs, the
        attention projections and products, the codebook distances (2 FLOPs per multiply-add;
        norms and swish not counted). The 2-D encoder runs once per image (module docstring)."""
        flops = acts = 0
        s, c = self.image_size, self.base_channels

        def conv(cin: int, cout: int, k: int, positions: int) -> None:
            nonlocal flops, acts
            flops += 2 * cin * cout * k * positions
            acts += cout * positions

        def res(cin: int, cout: int, positions: int) -> None:
            conv(cin, cout, 9, positions)
            conv(cout, cout, 9, positions)
            if cin != cout:
                conv(cin, cout, 1, positions)

        def attn(width: int, n: int) -> None:
            nonlocal flops, acts
            flops += 2 * n * width * width * 4 + 2 * 2 * n * n * width  # q, k, v, out; QK, PV
            acts += 4 * n * width

        conv(3, c, 9, s * s)
        for level, mult in enumerate(self.channel_multiplier):
            cout = self.base_channels * mult
            for _ in range(self.num_res_blocks):
                res(c, cout, s * s)
                c = cout
                if level in self.attn_resolutions:
                    attn(c, s * s)
            if level < len(self.channel_multiplier) - 1:
                s //= 2
                conv(c, c, 9, s * s)
        res(c, c, s * s)
        attn(c, s * s)
        res(c, c, s * s)
        lat, frames = self.latent_channels, self.temporal_factor
        conv(c, lat, 9, s * s)
        while frames > 1:  # (4, 3, 3) stride 2 in time
            frames //= 2
            conv(lat, lat, 36, frames * s * s)
        for _ in range(self.num_res_blocks):
            res3 = frames * s * s
            conv(lat, lat, 27, res3)
            conv(lat, lat, 27, res3)
        conv(lat, self.embed_dim, 3, frames * s * s)
        flops += 2 * frames * s * s * self.embed_dim * self.codebook_size
        return images * flops, images * acts


@dataclass(frozen=True)
class VQImageTokens:
    """Where one image's codes go in the LM's sequence. A code ``c`` is the LM id
    ``visual_start + c`` (Emu3's ``<|visual token 000000|>`` .. in order); ``head`` is
    ``<|image start|>``, the ids of the text "h*w" and ``<|image token|>``; every row of codes is
    followed by ``eol`` (``<|extra_200|>``); ``tail`` is ``<|extra_201|> <|image end|>``."""

    tokenizer: VQConfig
    visual_start: int
    head: tuple[int, ...]
    eol: int
    tail: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.visual_start < 0 or min((*self.head, self.eol, *self.tail), default=0) < 0:
            raise ValueError("VQ image token ids must be >= 0")
        codes = range(self.visual_start, self.visual_start + self.tokenizer.codebook_size)
        marks = [i for i in (*self.head, self.eol, *self.tail) if i in codes]
        if marks:
            raise ValueError(f"image marker ids {marks} fall among the visual token ids")

    @property
    def image_size(self) -> int:
        return self.tokenizer.image_size

    @property
    def tokens_per_image(self) -> int:
        g = self.tokenizer.grid
        return len(self.head) + g * (g + 1) + len(self.tail)

    @property
    def max_id(self) -> int:
        return max(self.visual_start + self.tokenizer.codebook_size - 1, *self.head, self.eol)

    def lm_ids(self, codes: Tensor) -> Tensor:
        """(N, h, w) codebook ids -> (N, tokens_per_image) LM ids."""
        n, h, w = codes.shape
        eol = torch.full((n, h, 1), self.eol, dtype=torch.long, device=codes.device)
        rows = torch.cat((codes.long() + self.visual_start, eol), dim=2).reshape(n, h * (w + 1))
        head = torch.tensor(self.head, dtype=torch.long, device=codes.device).expand(n, -1)
        tail = torch.tensor(self.tail, dtype=torch.long, device=codes.device).expand(n, -1)
        return torch.cat((head, rows, tail), dim=1)


# ---------------------------------------------------------------------------------------------
# Building blocks (names are transformers' Emu3VQVAE names)


def _swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6)


class ResBlock(nn.Module):
    """Pre-norm residual block: GroupNorm, swish, 3x3 conv, twice; a 1x1 shortcut when the
    width changes."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: Tensor) -> Tensor:  # (N, cin, H, W) -> (N, cout, H, W)
        h = self.conv2(_swish(self.norm2(self.conv1(_swish(self.norm1(x))))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class SelfAttention(nn.Module):
    """Multi-head self-attention over the positions of a feature map (no mask, biases)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.out_proj = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:  # (N, L, C) -> (N, L, C)
        n, length, c = x.shape
        split = lambda t: t.view(n, length, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        o = F.scaled_dot_product_attention(q, k, v)  # (N, heads, L, C / heads)
        return self.out_proj(o.transpose(1, 2).reshape(n, length, c))


def _attend(x: Tensor, norm: nn.Module, attn: SelfAttention) -> Tensor:
    """x + attn(norm(x)) over the H*W positions of x (N, C, H, W)."""
    n, c, h, w = x.shape
    y = attn(norm(x).view(n, c, h * w).transpose(1, 2))  # (N, HW, C)
    return x + y.transpose(1, 2).reshape(n, c, h, w)


class Downsample(nn.Module):
    """Stride-2 3x3 conv, padded on the right and bottom only (Emu3 pads (0, 1, 0, 1))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Level(nn.Module):
    """One resolution: ``block`` residual blocks, each followed by attention where the level
    has it (``attn`` / ``attn_norms``), then ``downsample`` unless it is the last level."""

    def __init__(self, cfg: VQConfig, level: int, cin: int) -> None:
        super().__init__()
        cout = cfg.base_channels * cfg.channel_multiplier[level]
        widths = [cin] + [cout] * cfg.num_res_blocks
        self.block = nn.ModuleList(ResBlock(a, b) for a, b in itertools.pairwise(widths))
        with_attn = level in cfg.attn_resolutions
        n = cfg.num_res_blocks if with_attn else 0
        self.attn = nn.ModuleList(SelfAttention(cout, cfg.num_heads) for _ in range(n))
        self.attn_norms = nn.ModuleList(_norm(cout) for _ in range(n))
        if level < len(cfg.channel_multiplier) - 1:
            self.downsample = Downsample(cout)

    def forward(self, x: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = _attend(x, self.attn_norms[i], self.attn[i])
        return self.downsample(x) if hasattr(self, "downsample") else x


class Levels(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        cins = [cfg.base_channels * m for m in (1, *cfg.channel_multiplier[:-1])]
        self.down = nn.ModuleList(Level(cfg, i, c) for i, c in enumerate(cins))

    def forward(self, x: Tensor) -> Tensor:
        for level in self.down:
            x = level(x)
        return x


class Middle(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.block_1, self.block_2 = ResBlock(width, width), ResBlock(width, width)
        self.attn_1, self.attn_norm = SelfAttention(width, heads), _norm(width)

    def forward(self, x: Tensor) -> Tensor:
        return self.block_2(_attend(self.block_1(x), self.attn_norm, self.attn_1))


class CausalConv3d(nn.Module):
    """A 3-D conv over (frames, H, W), padded 'same' in space and with two zero frames before
    the clip (none after) in time, whatever the kernel: Emu3's ``Emu3VQVAEConv3d``."""

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int], stride=(1, 1, 1)):
        super().__init__()
        pads: tuple[int, ...] = ()
        for k, s in zip(kernel[:0:-1], stride[:0:-1], strict=True):  # W, then H
            p = k - s
            pads += (p // 2 + p % 2, p // 2)
        self.pad = (*pads, 2, 0)
        self.conv = nn.Conv3d(cin, cout, kernel, stride=stride)

    def forward(self, x: Tensor) -> Tensor:  # (N, C, T, H, W)
        return self.conv(F.pad(x, self.pad))


class TimeDownsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = CausalConv3d(channels, channels, (4, 3, 3), (2, 1, 1))

    def forward(self, x: Tensor) -> Tensor:  # (N, C, T, H, W) -> (N, C, T / 2, H, W)
        return self.conv(x)


class TimeResBlock(nn.Module):
    """Residual block over (frames, H, W): BatchNorm3d (its running statistics), swish, causal
    3x3x3 convs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.BatchNorm3d(channels), nn.BatchNorm3d(channels)
        self.conv1 = CausalConv3d(channels, channels, (3, 3, 3))
        self.conv2 = CausalConv3d(channels, channels, (3, 3, 3))

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(_swish(self.norm1(x)))
        return x + self.conv2(_swish(self.norm2(h)))


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        lat = cfg.latent_channels
        self.conv_in = nn.Conv2d(3, cfg.base_channels, 3, padding=1)
        self.down_block = Levels(cfg)
        self.middle_block = Middle(cfg.width, cfg.num_heads)
        self.norm_out = _norm(cfg.width)
        self.conv_out = nn.Conv2d(cfg.width, lat, 3, padding=1)
        steps = int(math.log2(cfg.temporal_factor))
        self.time_conv = nn.ModuleList(TimeDownsample(lat) for _ in range(steps))
        self.time_res_stack = nn.ModuleList(TimeResBlock(lat) for _ in range(cfg.num_res_blocks))

    def forward(self, pixels: Tensor) -> Tensor:  # (N, 3, H, W) -> (N, latent, 1, h, w)
        x = self.middle_block(self.down_block(self.conv_in(pixels)))
        x = self.conv_out(_swish(self.norm_out(x)))  # (N, latent, h, w)
        x = x[:, :, None].expand(-1, -1, self.cfg.temporal_factor, -1, -1)  # T equal frames
        for conv in self.time_conv:
            x = _swish(conv(x))
        for block in self.time_res_stack:
            x = block(x)
        return x


class Codebook(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.embed_dim)

    def forward(self, z: Tensor) -> Tensor:  # (N, E, T, h, w) -> (N, T, h, w) nearest ids
        n, e, t, h, w = z.shape
        flat = z.permute(0, 2, 3, 4, 1).reshape(-1, e)  # (N*T*h*w, E)
        book = self.embedding.weight  # (K, E)
        # |z - e|^2 = |z|^2 + |e|^2 - 2 z.e, summed in this order as Emu3 does (ids are argmins)
        dist = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * flat @ book.T
        return dist.argmin(1).view(n, t, h, w)


class VQTokenizer(nn.Module):
    """Images -> codebook ids (N, grid, grid). ``forward`` takes images in [0, 1] and
    normalises them with the config's mean / std; ``encode`` takes normalised pixels of any
    size divisible by the code's ``spatial_factor`` (what ``Emu3VQVAE.encode`` takes)."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quant_conv = CausalConv3d(cfg.latent_channels, cfg.embed_dim, (3, 1, 1))
        self.quantize = Codebook(cfg)

    def normalize(self, images01: Tensor) -> Tensor:
        mean = torch.tensor(self.cfg.image_mean, dtype=images01.dtype, device=images01.device)
        std = torch.tensor(self.cfg.image_std, dtype=images01.dtype, device=images01.device)
        return (images01 - mean[:, None, None]) / std[:, None, None]

    def encode(self, pixels: Tensor) -> Tensor:
        """(N, 3, H, W) normalised -> (N, H / f, W / f) ids."""
        f = self.cfg.spatial_factor
        if pixels.ndim != 4 or pixels.shape[1] != 3 or pixels.shape[2] % f or pixels.shape[3] % f:
            raise ValueError(f"pixels must be (N, 3, H, W) with H, W multiples of {f}")
        z = self.quant_conv(self.encoder(pixels.to(self.dtype)))  # (N, E, 1, h, w)
        return self.quantize(z)[:, 0]

    def forward(self, images01: Tensor) -> Tensor:
        return self.encode(self.normalize(images01))

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.conv_in.weight.dtype


_KEEP = ("encoder.", "quant_conv.", "quantize.")
_PREFIXES = ("model.vqmodel.", "vqmodel.", "")


def vq_name(name: str) -> str | None:
    """An Emu3 VQ weight's name in ``VQTokenizer`` (``vqmodel.`` / ``model.vqmodel.`` prefixes
    dropped; the standalone ``Emu3VQVAE``'s names as they are), or None for a name that is not
    the tokenizer's."""
    for prefix in _PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :].startswith(_KEEP):
            return name[len(prefix) :]
    return None


def is_decoder_weight(name: str) -> bool:
    """The VQ decoder's weights (ids -> pixels), which tokenizing images does not use."""
    rest = name.removeprefix("model.").removeprefix("vqmodel.")
    return rest.startswith(("decoder.", "post_quant_conv."))
