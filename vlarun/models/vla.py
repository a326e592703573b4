"""A VLA = vision backbone + projector + Llama-family LM + action head, for four families.

  autoregressive (OpenVLA): actions as 256-bin tokens decoded greedily one by one, or
                            (pi0-FAST) the chunk's FAST code, decoded up to END (fast_head.py);
  parallel (OpenVLA-OFT):   K*D empty action tokens decoded in one bidirectional pass, L1 head;
  diffusion (CogACT):       a DiT denoises an action chunk conditioned on the last LM state;
  flow (pi0, SmolVLA):      an action expert attends to the prefix KV cache, N Euler steps.

Sequence layout (all families): [BOS, visual tokens, proprio token (if the config has one),
instruction tokens, right padding]. Visual tokens sit right after BOS as in OpenVLA, so their
indices are the same in every row (TokenPlans need that); rows with shorter instructions are
right-padded and continue decoding at their own positions, which keeps every row's relative
positions identical to running it alone.

The model is split into the stage functions the stage graph (vlarun/stages) calls:
``encode_images`` -> ``prefill`` -> ``decode_tokens`` | ``parallel_head`` | ``denoise``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.dit_head import DenoiseFeatureCache, DenoiseStepHook
from vlarun.models.emu3_vq import VQImageTokens, VQTokenizer
from vlarun.models.fast_head import FastConfig, FastHead, pad_after_end
from vlarun.models.fast_tokens import FastTokenizer
from vlarun.models.flow_expert import FlowExpertConfig, FlowMatchingExpert
from vlarun.models.heads import (
    ActionTokenizer,
    DiTConfig,
    DiTHead,
    L1RegressionHead,
    OFTHeadConfig,
    empty_action_embeddings,
)
from vlarun.models.llama import AttnProbe, KVCache, LlamaConfig, LlamaLM, LMOutput
from vlarun.models.rdt_head import RDTConfig
from vlarun.models.static_step import DecodeSteps, check_room, prefill_mask
from vlarun.models.token_plan import DeferredPlan, TokenPlan
from vlarun.models.tokenizer import BOS_ID, PAD_ID
from vlarun.models.vit import FusedVisionBackbone, Projector, SingleVisionBackbone, ViTConfig

# "rdt": a language encoder and a vision tower feeding a cross-attending diffusion head
# (RDT-1b); the cost model and the emulator read its shape, vlarun builds no executable one.
FAMILIES = ("autoregressive", "parallel", "diffusion", "flow", "rdt")
# none: rdt's head adapts the features; vq: a VQ tokenizer's codes are LM tokens (UniVLA / Emu3)
CONNECTORS = ("mlp", "fused-mlp", "linear", "pixel-shuffle", "none", "vq")
# A static prefill pads the prefix to a multiple of this (VLA._static_prefill): one compiled
# shape for every prompt length within the bucket, at most 15 padding tokens of work.
PREFILL_BUCKET = 16


@dataclass(frozen=True)
class VLAConfig:
    """A VLA's shape. Exactly one head config matches ``family`` (autoregressive needs none;
    its ``fast`` says how a FAST code is written, when the tokens are one)."""

    name: str
    family: str
    llm: LlamaConfig
    # (dinov2, siglip) = fused OpenVLA backbone, or (siglip,); () with a VQ tokenizer (``vq``)
    vision: tuple[ViTConfig, ...]
    connector: str = "fused-mlp"
    pixel_shuffle: int = 1  # SmolVLA folds s x s patches into one token
    num_images: int = 1
    action_dim: int = 7
    chunk: int = 1
    max_text_tokens: int = 48
    # Per-view average pooling of the projected patch tokens (1 = none; empty = none for every
    # view): a secondary view can cost a quarter of the main one's tokens at the same pixels.
    view_pool: tuple[int, ...] = ()
    # Proprioceptive state (e.g. hand xyz + gripper) as one LM token after the visual ones, the
    # way OpenVLA-OFT's proprio projector feeds it; 0 = no state input to the prefix.
    proprio_dim: int = 0
    # Token ids appended after the prompt's "Out:". OpenVLA's ``predict_action`` appends 29871
    # (Llama's "▁") when the prompt does not end in it, and its checkpoints were trained so: a
    # checkpoint property (set from model_type "openvla"), counted in ``max_text_tokens``; our
    # own policies were trained without it.
    prompt_suffix_ids: tuple[int, ...] = ()
    # Token ids between BOS and the visual tokens: LLaVA-1.5's prompt puts its image after
    # "USER: " (llava.py), so the patch features sit at the place of its <image> token. The same
    # ids in every row, so the visual indices stay the same in every row (TokenPlans need that).
    image_prefix_ids: tuple[int, ...] = ()
    # Names of the cameras the views come from, in order (e.g. ("workspace", "left")), so an
    # environment can render what the policy was trained on; empty = unnamed.
    views: tuple[str, ...] = ()
    # The state ends with the task's goal xyz (Meta-World's own MT setting,
    # ``partially_observable=False``): a labelled variant, never a VLA's headline input, which
    # sees the goal only through the cameras. The environment builds the state to match.
    goal_in_state: bool = False
    action_vocab_size: int | None = None  # OpenVLA: vocab without the padding to 64 (32000)
    prefix_causal: bool = True  # pi0 attends bidirectionally within the prefix
    # PaliGemma's layout (pi0): the visual tokens come first, then BOS and the text, so
    # positions match a LeRobot / openpi checkpoint; OpenVLA's (default) puts BOS first.
    images_first: bool = False
    bos_id: int | None = BOS_ID  # PaliGemma's <bos> is 2, Llama's <s> is 1; None: no BOS
    # SmolVLA's layout: the state token after each row's text, in an attention block of its
    # own (it sees the whole prefix, the images and text do not see it), through one Linear;
    # image and text embeddings scaled by sqrt(width) (``scale_embeddings``).
    proprio_after_text: bool = False
    proprio_linear: bool = False
    scale_embeddings: bool = False
    # Tokens the LM decodes per chunk when the chunk is not one token per action value: FAST
    # (pi0-FAST) codes a whole chunk as a variable-length BPE sequence, so this is its expected
    # length, what the cost model counts decode steps by. 0 = one token per value (OpenVLA's
    # 256 bins: chunk * action_dim). Autoregressive family only.
    decode_tokens: int = 0
    # How the LM writes the FAST code (ids, END, the cap on its length: fast_head.py); None
    # with decode_tokens set: a shape for the cost model only, its tokens never become actions.
    fast: FastConfig | None = None
    oft: OFTHeadConfig | None = None
    dit: DiTConfig | None = None
    flow: FlowExpertConfig | None = None
    rdt: RDTConfig | None = None
    # UniVLA / Emu3 (univla.py): the vision is a VQ tokenizer whose codes, inside Emu3's image
    # markers, are LM tokens the LM embeds with its own table (connector "vq", no towers).
    vq: VQImageTokens | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose from {FAMILIES}")
        if self.connector not in CONNECTORS:
            raise ValueError(f"unknown connector {self.connector!r}; choose from {CONNECTORS}")
        if (self.connector == "vq") != (self.vq is not None):
            raise ValueError("connector 'vq' and a vq tokenizer config go together")
        if self.vq is not None:
            self._check_vq()
        elif not 1 <= len(self.vision) <= 2:
            raise ValueError("vision must hold one tower, or two (dinov2, siglip) to fuse")
        needed = {"parallel": "oft", "diffusion": "dit", "flow": "flow", "rdt": "rdt"}.get(
            self.family
        )
        for head in ("oft", "dit", "flow", "rdt"):
            if (getattr(self, head) is not None) != (head == needed):
                raise ValueError(f"family {self.family!r} needs head config {needed!r} only")
        if self.flow is not None:
            self.flow.check_compatible(self.llm)
        if (self.connector == "none") != (self.family == "rdt"):
            raise ValueError("connector 'none' (the head adapts the image features) is rdt's alone")
        if self.rdt is not None:
            self._check_rdt()
        if self.vq is None:
            g = self.vision[0].grid
            if self.pixel_shuffle < 1 or g % self.pixel_shuffle:
                raise ValueError(f"pixel_shuffle {self.pixel_shuffle} must divide the grid {g}")
            if self.view_pool and len(self.view_pool) != self.num_images:
                raise ValueError(
                    f"view_pool has {len(self.view_pool)} entries for {self.num_images} images"
                )
            side = g // self.pixel_shuffle
            for pool in self.view_pool:
                if pool < 1 or side % pool:
                    raise ValueError(f"view_pool {pool} must divide the token grid side {side}")
        if self.views and len(self.views) != self.num_images:
            raise ValueError(f"views {self.views} name {len(self.views)} of {self.num_images}")
        if self.proprio_dim < 0:
            raise ValueError(f"proprio_dim must be >= 0, got {self.proprio_dim}")
        if self.goal_in_state and self.state_dim < 3:
            raise ValueError("goal_in_state needs a state of at least 3 values (the goal xyz)")
        if self.decode_tokens < 0:
            raise ValueError(f"decode_tokens must be >= 0, got {self.decode_tokens}")
        if self.decode_tokens and self.family != "autoregressive":
            raise ValueError(f"decode_tokens needs the autoregressive family, not {self.family!r}")
        if self.fast is not None:
            if not self.decode_tokens:
                raise ValueError("a FAST head needs decode_tokens (its expected code length)")
            self.fast.check_compatible(self.llm.vocab_size)
        if self.proprio_dim and self.flow is not None and self.flow.state_dim:
            raise ValueError("a flow model takes its state in the expert or the prefix, not both")
        if (self.proprio_after_text or self.bos_id is None) and not self.images_first:
            raise ValueError("proprio_after_text and bos_id None need images_first")
        if self.image_prefix_ids and (self.images_first or self.bos_id is None):
            raise ValueError("image_prefix_ids go between BOS and the images: not images_first")
        if self.family != "rdt" and self.max_sequence > self.llm.max_positions:
            raise ValueError(
                f"{self.name}: sequence of {self.max_sequence} tokens exceeds the LM context "
                f"({self.llm.max_positions})"
            )

    def _check_vq(self) -> None:
        if self.vision or self.pixel_shuffle != 1 or self.view_pool:
            raise ValueError(
                f"{self.name}: a VQ tokenizer's codes are the image tokens: no ViT towers, "
                "pixel_shuffle or view_pool"
            )
        if self.vq.max_id >= self.llm.vocab_size:
            raise ValueError(
                f"{self.name}: image token id {self.vq.max_id} is outside the LM's "
                f"{self.llm.vocab_size} ids"
            )

    def _check_rdt(self) -> None:
        r, v = self.rdt, self.vision[0]
        if len(self.vision) != 1 or r.img_dim != v.hidden_size:
            widths = [x.hidden_size for x in self.vision]
            raise ValueError(
                f"{self.name}: the RDT head adapts one tower's {r.img_dim}-d "
                f"features; the vision is {widths}"
            )
        if r.img_tokens != self.num_images * v.num_patches:
            raise ValueError(
                f"{self.name}: {self.num_images} images x {v.num_patches} patches "
                f"is not the head's {r.img_tokens} image tokens"
            )
        if r.lang_dim != self.llm.hidden_size or self.max_text_tokens > r.max_lang_tokens:
            raise ValueError(
                f"{self.name}: the language encoder ({self.llm.hidden_size}-d, up to "
                f"{self.max_text_tokens} tokens) does not fit the head "
                f"({r.lang_dim}-d, {r.max_lang_tokens})"
            )
        if r.action_dim != self.action_dim or self.chunk != r.horizon:
            raise ValueError(
                f"{self.name}: action_dim / chunk must be the head's ({r.action_dim}, {r.horizon})"
            )

    @property
    def image_size(self) -> int:
        return self.vq.image_size if self.vq is not None else self.vision[0].image_size

    @property
    def tokens_per_image(self) -> int:
        if self.vq is not None:  # the codes, an end-of-row id per row, Emu3's markers
            return self.vq.tokens_per_image
        return self.vision[0].num_patches // self.pixel_shuffle**2

    @property
    def pools(self) -> tuple[int, ...]:
        """Each view's token pooling factor."""
        return self.view_pool or (1,) * self.num_images

    def tokens_of_view(self, view: int) -> int:
        return self.tokens_per_image // self.pools[view] ** 2

    @property
    def num_visual(self) -> int:
        return sum(self.tokens_of_view(v) for v in range(self.num_images))

    @property
    def num_state_tokens(self) -> int:
        return 1 if self.proprio_dim else 0

    @property
    def state_dim(self) -> int:
        """Length of the state vector an inference takes (prefix proprio or flow expert)."""
        if self.flow is not None and self.flow.state_dim:
            return self.flow.state_dim
        if self.rdt is not None:  # RDT's unified state space
            return self.rdt.state_dim
        return self.proprio_dim

    @property
    def vis_start(self) -> int:
        # first, or right after BOS (and LLaVA's "USER: ")
        return 0 if self.images_first else 1 + len(self.image_prefix_ids)

    @property
    def num_action_tokens(self) -> int:
        """Tokens the LM itself emits per inference (AR) or holds as placeholders (OFT)."""
        if self.decode_tokens:
            return self.decode_tokens
        return self.chunk * self.action_dim if self.family in ("autoregressive", "parallel") else 0

    @property
    def action_token_room(self) -> int:
        """Cache slots after the prompt for decoded (or placeholder) tokens: FAST's cap on its
        code, else ``num_action_tokens``."""
        return self.fast.max_tokens if self.fast is not None else self.num_action_tokens

    @property
    def max_sequence(self) -> int:
        return (
            1
            + len(self.image_prefix_ids)
            + self.num_visual
            + self.num_state_tokens
            + self.max_text_tokens
            + self.action_token_room
        )

    @property
    def vision_dim(self) -> int:
        return sum(v.hidden_size for v in self.vision) * self.pixel_shuffle**2

    @property
    def horizon(self) -> int:
        """Actions returned per inference."""
        if self.dit is not None:
            return self.dit.horizon
        if self.flow is not None:
            return self.flow.horizon
        if self.rdt is not None:
            return self.rdt.horizon
        return self.chunk


@dataclass
class Prefix:
    """The LM input for one batch. embeds (B, P, d); pad (B, P) False at padding;
    last (B,) index of each row's last real token (its next token goes at last + 1);
    blocks (B, P) or None: attention blocks (a token sees the tokens of its block and of the
    blocks before it; SmolVLA's state token is block 1), None = the config's causal flag."""

    embeds: Tensor
    pad: Tensor
    last: Tensor
    blocks: Tensor | None = None

    @property
    def length(self) -> int:
        return self.embeds.shape[1]


@dataclass
class PrefillResult:
    """Output of the prefill stage: the filled cache, each row's last hidden state (B, d), and
    ``next_pos`` (B,) the position of each row's first generated token."""

    cache: KVCache
    last_hidden: Tensor
    next_pos: Tensor
    lm: LMOutput | None = None


class PixelShuffleConnector(nn.Module):
    """SmolVLM's connector: fold s x s neighbouring patches into channels, then one Linear."""

    def __init__(self, vision_dim: int, llm_dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(vision_dim, llm_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D) -> (B, N / s^2, D * s^2) -> (B, ., llm)
        b, n, d = x.shape
        g, s = math.isqrt(n), self.scale
        x = x.view(b, g // s, s, g // s, s, d).permute(0, 1, 3, 2, 4, 5)
        return self.proj(x.reshape(b, (g // s) ** 2, s * s * d))


def build_connector(cfg: VLAConfig) -> nn.Module:
    if cfg.connector == "vq":  # the codes are embedded by the LM's own table
        return nn.Identity()
    vdim = sum(v.hidden_size for v in cfg.vision)
    if cfg.connector == "pixel-shuffle":
        return PixelShuffleConnector(cfg.vision_dim, cfg.llm.hidden_size, cfg.pixel_shuffle)
    if cfg.connector == "linear":
        return nn.Linear(vdim, cfg.llm.hidden_size)
    return Projector(vdim, cfg.llm.hidden_size, fused=cfg.connector == "fused-mlp")


class VLA(nn.Module):
    """Parameter names follow OpenVLA's prismatic layout: ``vision_backbone.*``,
    ``projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``; heads are
    ``action_head.*`` (OFT), ``action_model.*`` (CogACT DiT), ``action_expert.*`` (pi0)."""

    def __init__(self, cfg: VLAConfig) -> None:
        super().__init__()
        if cfg.family == "rdt":
            raise ValueError(
                f"{cfg.name} is an RDT-family shape for the cost model and the emulator (vlarun "
                "info / predict / fleet, --emulate): vlarun builds no executable RDT policy"
            )
        self.cfg = cfg
        if cfg.vq is not None:
            self.vision_backbone = VQTokenizer(cfg.vq.tokenizer)
        elif len(cfg.vision) == 2:
            self.vision_backbone = FusedVisionBackbone(*cfg.vision)
        else:
            self.vision_backbone = SingleVisionBackbone(cfg.vision[0])
        self.projector = build_connector(cfg)
        if cfg.proprio_dim and cfg.proprio_linear:  # SmolVLA's state_proj
            self.proprio_projector = nn.Linear(cfg.proprio_dim, cfg.llm.hidden_size)
        elif cfg.proprio_dim:
            self.proprio_projector = ProprioProjector(cfg.proprio_dim, cfg.llm.hidden_size)
        self.language_model = LlamaLM(cfg.llm)
        if cfg.oft is not None:
            self.action_head = L1RegressionHead(cfg.oft)
        if cfg.dit is not None:
            self.action_model = DiTHead(cfg.dit)
        if cfg.flow is not None:
            self.action_expert = FlowMatchingExpert(cfg.flow)
        self.action_tokenizer = ActionTokenizer(
            vocab_size=cfg.action_vocab_size or cfg.llm.vocab_size
        )
        # FAST's vocabulary is a file beside the weights, not a shape: ``set_fast_tokenizer``
        # binds one (the checkpoint loader, or a preset's synthetic one).
        self.fast_head: FastHead | None = None
        # The static decode / Jacobi steps (static_step.py); ``static_step.compile_steps()``
        # swaps in compiled ones (CUDA graphs on a GPU).
        self.steps = DecodeSteps()

    def set_fast_tokenizer(self, tokenizer: FastTokenizer) -> None:
        """Decode this model's FAST codes with ``tokenizer`` (its chunk shape must be the
        model's)."""
        c = self.cfg
        if c.fast is None:
            raise ValueError(f"{c.name} decodes no FAST tokens (its config has no fast head)")
        self.fast_head = FastHead(c.fast, c.llm.vocab_size, tokenizer, c.horizon, c.action_dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.language_model.dtype

    @property
    def device(self) -> torch.device:
        # The embedding, not the LM head: a weight-only int8 head (transforms.int8) has no
        # float ``weight``.
        return self.language_model.model.embed_tokens.weight.device

    # -- stage 1: vision ----------------------------------------------------------------------

    def encode_images(self, images: Tensor) -> Tensor:
        """images (B, n_img, 3, H, W) or (B, 3, H, W) floats in [0, 1] -> (B, Nv, d_llm)."""
        if self.cfg.vq is not None:
            return self.embed_image_ids(self.image_ids(images))
        if images.ndim == 4:
            images = images[:, None]
        self._check_images(images)
        b, n = images.shape[:2]
        flat = images.reshape(b * n, *images.shape[2:]).to(self.dtype)
        tokens = self.projector(self.vision_backbone(flat))  # (B*n, N, d)
        tokens = tokens.reshape(b, n, *tokens.shape[1:])  # (B, n, N, d)
        pools = self.cfg.pools
        if all(p == 1 for p in pools):
            return tokens.reshape(b, n * tokens.shape[2], tokens.shape[3])
        return torch.cat([_pool_tokens(tokens[:, v], p) for v, p in enumerate(pools)], dim=1)

    def image_ids(self, images: Tensor) -> Tensor:
        """A VQ model's vision stage: images (B, n_img, 3, H, W) or (B, 3, H, W) in [0, 1] ->
        LM ids (B, Nv): each view's codes inside Emu3's image markers (emu3_vq.py)."""
        if self.cfg.vq is None:
            raise ValueError(f"{self.cfg.name} has no VQ tokenizer: its images are features")
        if images.ndim == 4:
            images = images[:, None]
        self._check_images(images)
        b, n = images.shape[:2]
        codes = self.vision_backbone(images.reshape(b * n, *images.shape[2:]).to(self.dtype))
        return self.cfg.vq.lm_ids(codes).reshape(b, -1)  # (B, n * tokens_per_image)

    def embed_image_ids(self, ids: Tensor) -> Tensor:
        """(B, Nv) image LM ids -> (B, Nv, d): the prefill's first step for a VQ model."""
        return self.language_model.embed(ids)

    def _check_images(self, images: Tensor) -> None:
        c = self.cfg
        want = (c.num_images, 3, c.image_size, c.image_size)
        if tuple(images.shape[1:]) != want:
            raise ValueError(
                f"images must be (B, {', '.join(map(str, want))}) for {c.name}, "
                f"got {tuple(images.shape)}"
            )
        if not images.is_floating_point():
            raise ValueError(f"images must be float in [0, 1], got {images.dtype}")

    # -- stage 2: prefill -----------------------------------------------------------------------

    def build_prefix(
        self, visual: Tensor, text_ids: list[list[int]], state: Tensor | None = None
    ) -> Prefix:
        """[BOS, visual, proprio, text, pad] embeddings for a batch of tokenised instructions;
        [visual, proprio, BOS, text, pad] when ``images_first`` (PaliGemma), and
        [visual, text, proprio, pad] with ``proprio_after_text`` (SmolVLA: each row's state
        token right after its own text, so its position follows the row's last word).

        ``state`` (B, proprio_dim), normalised, is required exactly when the config has a
        proprio token."""
        cfg = self.cfg
        b = visual.shape[0]
        if len(text_ids) != b:
            raise ValueError(f"{len(text_ids)} instructions for {b} images")
        visual = visual.to(self.dtype)
        dev = visual.device
        state_tok = None
        if cfg.proprio_dim:
            want = (b, cfg.proprio_dim)
            if state is None or tuple(state.shape) != want:
                got = None if state is None else tuple(state.shape)
                raise ValueError(f"{cfg.name} needs a state of shape {want}, got {got}")
            state_tok = self.proprio_projector(state.to(dev, self.dtype))[:, None]
        if state_tok is not None and not cfg.proprio_after_text:
            visual = torch.cat((visual, state_tok), dim=1)  # the state rides after the views
        longest = max(len(t) for t in text_ids)
        if longest > cfg.max_text_tokens:
            raise ValueError(
                f"instruction has {longest} tokens; {cfg.name} allows at most {cfg.max_text_tokens}"
            )
        bos = int(cfg.bos_id is not None)
        ids = torch.full((b, bos + longest), PAD_ID, dtype=torch.long, device=dev)
        pad_text = torch.zeros(b, bos + longest, dtype=torch.bool, device=dev)
        if bos:
            ids[:, 0], pad_text[:, 0] = cfg.bos_id, True
        for r, t in enumerate(text_ids):
            ids[r, bos : bos + len(t)] = torch.tensor(t, dtype=torch.long)
            pad_text[r, bos : bos + len(t)] = True
        emb = self.language_model.embed(ids)
        if cfg.scale_embeddings:  # SmolVLA scales the images' and the text's, not the state's
            scale = math.sqrt(cfg.llm.hidden_size)
            emb, visual = emb * scale, visual * scale
        vis_pad = torch.ones(b, visual.shape[1], dtype=torch.bool, device=dev)
        lengths = torch.tensor([len(t) for t in text_ids], device=dev)
        if cfg.proprio_after_text:
            emb = torch.cat((emb, torch.zeros_like(emb[:, :1])), dim=1)  # room for the state
            pad_text = torch.cat((pad_text, torch.zeros_like(pad_text[:, :1])), dim=1)
            if state_tok is not None:
                at = bos + lengths  # each row's slot right after its text
                rows = torch.arange(b, device=dev)
                emb[rows, at] = state_tok[:, 0].to(emb.dtype)
                pad_text[rows, at] = True
                lengths = lengths + 1
        if cfg.images_first:
            embeds = torch.cat((visual.to(emb.dtype), emb), dim=1)
            pad = torch.cat((vis_pad, pad_text), dim=1)
        else:
            head, head_pad = emb[:, :1], pad_text[:, :1]
            if cfg.image_prefix_ids:  # LLaVA's "USER: " between BOS and the image
                pre = torch.tensor(cfg.image_prefix_ids, dtype=torch.long, device=dev)
                head = torch.cat((head, self.language_model.embed(pre)[None].expand(b, -1, -1)), 1)
                head_pad = torch.ones(b, head.shape[1], dtype=torch.bool, device=dev)
            embeds = torch.cat((head, visual.to(emb.dtype), emb[:, 1:]), dim=1)
            pad = torch.cat((head_pad, vis_pad, pad_text[:, 1:]), dim=1)
        # index of each row's last real token
        last = visual.shape[1] + bos - 1 + len(cfg.image_prefix_ids) + lengths
        blocks = None
        if cfg.proprio_after_text and state_tok is not None:
            blocks = torch.zeros(b, embeds.shape[1], dtype=torch.long, device=dev)
            blocks[torch.arange(b, device=dev), last] = 1  # the state token's own block
        return Prefix(embeds, pad, last, blocks)

    def prefill(
        self,
        prefix: Prefix,
        cache: KVCache | None = None,
        *,
        plan: TokenPlan | DeferredPlan | None = None,
        probe: AttnProbe | None = None,
    ) -> PrefillResult:
        """Fill (or, under a TokenPlan, partially refresh) the cache with the prefix."""
        if plan is None and probe is None and cache is None and self.steps.prefill is not None:
            return self._static_prefill(prefix)
        b, p = prefix.pad.shape
        extra = self.cfg.action_token_room
        if cache is None:
            cache = self.language_model.new_cache(b, p + extra)
        if plan is None:
            cache.reset()
        else:
            cache.invalidate_from(p)  # last step's action tokens
        blocks = prefix.blocks
        out = self.language_model(
            prefix.embeds,
            torch.arange(p, device=prefix.embeds.device),
            cache,
            causal=self.cfg.prefix_causal,
            attn_mask=None if blocks is None else blocks[:, None, :] <= blocks[:, :, None],
            pad_mask=prefix.pad,
            plan=plan,
            probe=probe,
        )
        last_rows = _output_rows(out, prefix.last)
        last_hidden = out.hidden[torch.arange(b), last_rows]
        return PrefillResult(cache, last_hidden, prefix.last + 1, out)

    def _static_prefill(self, prefix: Prefix) -> PrefillResult:
        """The prefill as one static-shape step (``steps.prefill``, compiled): the prefix is
        right-padded to a multiple of ``PREFILL_BUCKET`` tokens, so that prompts of nearby
        lengths share one compiled prefill and one compiled decode step (the cache's length is
        part of their shape); the padding is masked as a batch's padding is, and its cache
        slots stay invalid, so the decode writes its tokens where it always does."""
        b, p = prefix.pad.shape
        size = -(-p // PREFILL_BUCKET) * PREFILL_BUCKET
        embeds, pad, blocks = prefix.embeds, prefix.pad, prefix.blocks
        if size > p:
            more = size - p
            embeds = F.pad(embeds, (0, 0, 0, more))
            pad = F.pad(pad, (0, more), value=False)
            blocks = None if blocks is None else F.pad(blocks, (0, more), value=int(blocks.max()))
        lm = self.language_model
        cache = lm.new_cache(b, size + self.cfg.action_token_room)
        positions = torch.arange(size, device=embeds.device)
        mask = prefill_mask(self.cfg.prefix_causal, blocks, pad)
        hidden = self.steps.prefill(lm, embeds, positions, cache, mask)
        cache.valid[:, :, :size] = pad
        last_hidden = hidden[torch.arange(b), prefix.last]
        return PrefillResult(cache, last_hidden, prefix.last + 1, LMOutput(hidden))

    # -- stage 3: the family's head ---------------------------------------------------------------

    def forced_width(self, pre: PrefillResult, forced: Tensor | None) -> int:
        """m, the width of a forced prefix of action token ids (0 for None), checked: (B, m)
        with m at most the tokens the model decodes. Every decoder of action tokens (greedy
        here, Jacobi in accel/jacobi.py) takes the same prefix, so they refuse the same ones."""
        if forced is None:
            return 0
        b, n = pre.last_hidden.shape[0], self.cfg.action_token_room
        if forced.dim() != 2 or forced.shape[0] != b or forced.shape[1] > n:
            raise ValueError(
                f"forced tokens must be (B={b}, m <= {n}) (batch, at most the {n} action "
                f"tokens the model decodes), got {tuple(forced.shape)}"
            )
        return forced.shape[1]

    def first_free_logits(self, pre: PrefillResult, forced: Tensor | None = None) -> Tensor:
        """Logits (B, V) of the first action token after a forced prefix (B, m), m < n: from
        the prefill's last hidden state when m = 0, else from one forward of the forced tokens
        at their action slots (``steps.iterate``), which also writes their keys into
        ``pre.cache``, as if they had been decoded, for the free tokens after them to attend
        to. Shared by every decoder so that a forced prefix conditions them identically."""
        lm = self.language_model
        if self.forced_width(pre, forced) == 0:
            return lm.logits(pre.last_hidden)
        pos = pre.next_pos
        forced = forced.to(pos.device, torch.long)
        at = pos[:, None] + torch.arange(forced.shape[1], device=pos.device)[None]  # (B, m)
        return self.steps.iterate(lm, pre.cache, forced, at)[:, -1]

    def decode_tokens(self, pre: PrefillResult, forced: Tensor | None = None) -> Tensor:
        """Autoregressive greedy decoding of the action tokens -> ids (B, n): one static-shape
        step per token (``static_step.decode_one``), positions checked once. n is chunk*D
        (256-bin tokens), or for FAST up to ``fast.max_tokens``: decoding stops once every row
        has written END, and a row's tokens after its END are END (``fast_head.pad_after_end``).

        ``forced`` (B, m) with 0 <= m <= n: the first m tokens are these ids instead of the
        model's, and greedy decoding continues after them (real-time chunking forces the
        actions that execute while the chunk is computed, accel/rtc.py). The forced tokens go
        through the LM in one forward (``first_free_logits``, as a Jacobi iteration does),
        which writes their keys and gives the logits of token m."""
        lm = self.language_model
        n = self.cfg.action_token_room
        end = self.cfg.fast.end_id if self.cfg.fast is not None else None
        m = self.forced_width(pre, forced)
        check_room(pre.cache, lm, pre.next_pos + n - 2)
        if m == n:
            out = forced.to(pre.next_pos.device, torch.long).clone()  # nothing left to decode
            return out if end is None else pad_after_end(out, end)
        tok = self.first_free_logits(pre, forced).argmax(-1)  # token m, (B,)
        out = [tok]
        if m:
            out = [*forced.to(tok.device, torch.long).unbind(1), tok]
        pos = pre.next_pos + m
        ended = None if end is None else (torch.stack(out, dim=1) == end).any(1)  # (B,)
        for _ in range(n - m - 1):
            if ended is not None and bool(ended.all()):  # every row has written END
                break
            tok = self.steps.one(lm, pre.cache, tok, pos)
            out.append(tok)
            pos = pos + 1
            if ended is not None:
                ended |= tok == end
        ids = torch.stack(out, dim=1)
        return ids if end is None else pad_after_end(ids, end)

    def tokens_to_actions(self, ids: Tensor) -> Tensor:
        """Decoded ids (B, n) -> normalised actions (B, horizon, action_dim): bin centers, or
        the FAST code decoded (the all-zero chunk for a row that is no code, as openpi)."""
        if self.cfg.fast is not None:
            if self.fast_head is None:
                raise ValueError(
                    f"{self.cfg.name} decodes FAST tokens but has no FAST tokenizer: load a "
                    "checkpoint with its fast_tokenizer/ directory, or call set_fast_tokenizer"
                )
            return self.fast_head.actions(ids)
        if self.cfg.decode_tokens:
            raise NotImplementedError(
                f"{self.cfg.name}: its {self.cfg.decode_tokens} decoded tokens code the chunk, "
                "and its config says nothing of how (no fast head): this shape serves the cost "
                "model and the plan space only"
            )
        acts = self.action_tokenizer.decode(ids.cpu())
        acts = torch.as_tensor(acts, dtype=torch.float32)
        return acts.view(ids.shape[0], self.cfg.chunk, self.cfg.action_dim)

    def parallel_head(self, pre: PrefillResult) -> Tensor:
        """OFT: K*D zero embeddings after each row's prompt, one bidirectional pass -> (B, K, D)."""
        b = pre.last_hidden.shape[0]
        n = self.cfg.num_action_tokens
        x = empty_action_embeddings(b, n, self.cfg.llm.hidden_size, self.dtype)
        pos = pre.next_pos[:, None] + torch.arange(n, device=x.device)[None]
        h = self.language_model(x, pos, pre.cache, causal=False).hidden  # (B, K*D, d)
        return self.action_head(h).float()

    def denoise(
        self,
        pre: PrefillResult,
        noise: Tensor | None = None,
        state: Tensor | None = None,
        feature_cache: DenoiseFeatureCache | None = None,
        step_hook: DenoiseStepHook | None = None,
    ) -> Tensor:
        """Diffusion (DiT on the last hidden state) or flow (expert on the prefix cache), with
        the static steps of ``self.steps``; ``feature_cache`` serves a denoising cache,
        ``step_hook`` a per-step transform of the state (inpainting, e.g. real-time chunking)."""
        if self.cfg.dit is not None:
            if noise is not None:  # drawn in fp32 by the policy; the DiT runs in the model's dtype
                noise = noise.to(pre.last_hidden.dtype)
            return self.action_model.sample(
                pre.last_hidden,
                noise=noise,
                feature_cache=feature_cache,
                eps=self.steps.eps,
                step_hook=step_hook,
            ).float()
        b = pre.last_hidden.shape[0]
        if state is None:
            state = torch.zeros(b, self.cfg.flow.state_dim, device=pre.last_hidden.device)
        return self.action_expert.sample(
            pre.cache,
            state,
            noise=noise,
            start=pre.next_pos,
            feature_cache=feature_cache,
            forward=self.steps.expert,
            step_hook=step_hook,
        )

    # -- everything at once ---------------------------------------------------------------------

    @torch.no_grad()
    def act(
        self,
        images: Tensor,
        text_ids: list[list[int]],
        *,
        noise: Tensor | None = None,
        state: Tensor | None = None,
        step_hook: DenoiseStepHook | None = None,
        forced_tokens: Tensor | None = None,
    ) -> Tensor:
        """One inference: normalised actions (B, horizon, action_dim) in [-1, 1].
        ``step_hook``: see ``denoise`` (diffusion and flow families only); ``forced_tokens``:
        a forced prefix of action token ids, see ``decode_tokens`` (autoregressive only)."""
        prefix_state = state if self.cfg.proprio_dim else None
        pre = self.prefill(self.build_prefix(self.encode_images(images), text_ids, prefix_state))
        family = self.cfg.family
        if step_hook is not None and family in ("autoregressive", "parallel"):
            raise ValueError(f"a denoising step hook needs a diffusion or flow model, not {family}")
        if forced_tokens is not None and family != "autoregressive":
            raise ValueError(f"forced action tokens need an autoregressive model, not {family}")
        if family == "autoregressive":
            return self.tokens_to_actions(self.decode_tokens(pre, forced_tokens))
        if family == "parallel":
            return self.parallel_head(pre)
        return self.denoise(pre, noise=noise, state=state, step_hook=step_hook)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class ProprioProjector(nn.Module):
    """State vector -> one LM embedding (OpenVLA-OFT's two-layer GELU MLP)."""

    def __init__(self, state_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(state_dim, llm_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, state: Tensor) -> Tensor:  # (B, S) -> (B, d)
        return self.fc2(self.act(self.fc1(state)))


def _pool_tokens(tokens: Tensor, pool: int) -> Tensor:
    """(B, g*g, d) patch tokens -> (B, (g/p)^2, d) by averaging p x p neighbours."""
    if pool == 1:
        return tokens
    b, n, d = tokens.shape
    g = math.isqrt(n)
    grid = tokens.transpose(1, 2).reshape(b, d, g, g)
    return torch.nn.functional.avg_pool2d(grid, pool).flatten(2).transpose(1, 2)


def _output_rows(out: LMOutput, last: Tensor) -> Tensor:
    """Where each row's last real token landed in ``out.hidden`` (plans drop rows)."""
    if out.index is None:
        return last
    return (out.index == last[:, None]).float().argmax(dim=1)
