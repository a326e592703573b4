"""Behaviour cloning of three or four VLA families on one shared trunk, in one forward pass.

The trunk (vision tower, projector, Llama decoder) is trained once; each family adds only its
head, and each exports as its own VLA preset (a suite: tiny-ar/-oft/-dit, mt10-ar/-oft/-dit, or
mt10w-ar/-oft/-dit/-flow):

  sequence: [BOS, visual, (proprio), instruction, pad | AR tokens (teacher forced) | OFT slots]
  mask:     the prompt is causal; AR tokens see the prompt and earlier AR tokens; OFT slots see
            the prompt and each other; nothing sees the OFT slots or (from OFT) the AR tokens.

AR and OFT tokens both take the positions right after each row's prompt, exactly where they sit
at inference, so one pass trains every loss:
  * autoregressive: cross-entropy on the 256-bin action tokens (OpenVLA);
  * parallel: L1 on the OFT head's chunk;
  * diffusion: epsilon-MSE of the DiT conditioned on the last prompt token's hidden state;
  * flow (pi0): velocity MSE of an action expert reading each layer's prefix K/V of this pass;
  * auxiliary (training only, never exported): the object's and goal's positions regressed from
    the last prompt token's state, so the trunk must find them in the pixels.
The AR head may predict a shorter chunk than the continuous heads (its first steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.dit_head import DiTHead
from vlarun.models.flow_expert import FlowMatchingExpert
from vlarun.models.kv_cache import KVCache
from vlarun.models.oft_head import L1RegressionHead, empty_action_embeddings
from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA, VLAConfig


@dataclass
class Batch:
    """images (B, 3, S, S) or (B, V, 3, S, S) in [0, 1]; text: token ids per row; actions
    (B, K, D) in [-1, 1] (K: the longest chunk of any head); state (B, proprio_dim) normalised,
    for configs with a proprio token; targets (B, 6) normalised object + goal positions."""

    images: Tensor
    text: list[list[int]]
    actions: Tensor
    state: Tensor | None = None
    targets: Tensor | None = None


@dataclass
class Losses:
    ar: Tensor
    oft: Tensor | None = None  # None: the suite has no such head (mt10pf, mt10pl)
    dit: Tensor | None = None
    flow: Tensor | None = None
    aux: Tensor | None = None
    # What each part weighs in ``total`` (training's --loss-weights; unnamed parts weigh 1).
    weights: dict[str, float] = field(default_factory=dict)

    def parts(self) -> dict[str, Tensor]:
        return {k: v for k, v in vars(self).items() if k != "weights" and v is not None}

    @property
    def total(self) -> Tensor:
        return sum(self.weights.get(k, 1.0) * v for k, v in self.parts().items())

    def as_floats(self) -> dict[str, float]:
        return {k: float(v.detach()) for k, v in self.parts().items()}


# Each suite's presets by family: autoregressive (the trunk), parallel (OFT head), diffusion (DiT
# head) and, where present, flow (pi0-style action expert).
SUITES: dict[str, dict[str, str]] = {
    "mw": {"autoregressive": "tiny-ar", "parallel": "tiny-oft", "diffusion": "tiny-dit"},
    "mt10": {"autoregressive": "mt10-ar", "parallel": "mt10-oft", "diffusion": "mt10-dit"},
    "mt10w": {
        "autoregressive": "mt10w-ar",
        "parallel": "mt10w-oft",
        "diffusion": "mt10w-dit",
        "flow": "mt10w-flow",
    },
    "mt10p": {
        "autoregressive": "mt10p-ar",
        "parallel": "mt10p-oft",
        "diffusion": "mt10p-dit",
        "flow": "mt10p-flow",
    },
    # pi0-FAST's output on mt10p's trunk (issue 65): the trunk alone, its action tokens a FAST
    # code (variable length, END-terminated) instead of 256-bin tokens.
    "mt10pf": {"autoregressive": "mt10p-fast"},
    # LLaVA-VLA's shape on mt10p's trunk (issue 65): the trunk alone, a CLIP tower and 5-step
    # chunks of 256-bin tokens (20 per inference).
    "mt10pl": {"autoregressive": "mt10p-llava"},
    "mt10g": {
        "autoregressive": "mt10g-ar",
        "parallel": "mt10g-oft",
        "diffusion": "mt10g-dit",
        "flow": "mt10g-flow",
    },
}
# Suites whose demonstrations carry object and goal positions for the auxiliary head.
AUX_SUITES = frozenset({"mt10w", "mt10p", "mt10pf", "mt10pl", "mt10g"})
NUM_TARGETS = 6  # object xyz + goal xyz
IGNORE = -100  # a target the AR loss skips (a FAST row's padding after its END)


class MultiHeadBC(nn.Module):
    """Shared trunk (the suite's autoregressive VLA) + an OFT head + a DiT head (+ a flow
    expert and a training-only auxiliary head, where the suite has them)."""

    def __init__(self, suite: str = "mw") -> None:
        super().__init__()
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
        self.presets = {fam: get_preset(n) for fam, n in SUITES[suite].items()}
        self.trunk = VLA(self.presets["autoregressive"])
        parallel, diffusion = self.presets.get("parallel"), self.presets.get("diffusion")
        self.oft = L1RegressionHead(parallel.oft) if parallel is not None else None
        self.dit = DiTHead(diffusion.dit) if diffusion is not None else None
        flow = self.presets.get("flow")
        self.flow = FlowMatchingExpert(flow.flow) if flow is not None else None
        width = self.trunk.cfg.llm.hidden_size
        self.aux = (
            nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, NUM_TARGETS))
            if suite in AUX_SUITES
            else None
        )

    @property
    def cfg(self) -> VLAConfig:
        return self.trunk.cfg

    @property
    def chunk(self) -> int:
        """Action steps a sample must carry: the longest chunk of any head."""
        return max(c.chunk for c in self.presets.values())

    def forward(self, batch: Batch) -> Losses:
        vla, cfg = self.trunk, self.trunk.cfg
        lm = vla.language_model
        prefix = vla.build_prefix(vla.encode_images(batch.images), batch.text, batch.state)
        b, p = prefix.pad.shape
        n_oft = self.oft.config.num_action_tokens if self.oft is not None else 0
        ids, targets = self._ar_targets(batch.actions[:, : cfg.chunk])  # (B, n_ar) each
        n_ar = ids.shape[1]
        ar_in = lm.embed(ids[:, :-1])  # teacher forcing: token i predicts token i + 1
        oft_in = empty_action_embeddings(b, n_oft, cfg.llm.hidden_size, ar_in.dtype, ar_in.device)
        embeds = torch.cat((prefix.embeds, ar_in, oft_in), dim=1)
        start = (prefix.last + 1)[:, None]
        positions = torch.cat(
            (
                torch.arange(p).expand(b, p),
                start + torch.arange(n_ar - 1, device=embeds.device),
                start + torch.arange(n_oft, device=embeds.device),
            ),
            dim=1,
        )
        pad = torch.cat((prefix.pad, torch.ones(b, n_ar - 1 + n_oft, dtype=torch.bool)), dim=1)
        kv: list[tuple[Tensor, Tensor]] | None = [] if self.flow is not None else None
        mask = joint_mask(p, n_ar, n_oft)
        hidden = lm(embeds, positions, attn_mask=mask, pad_mask=pad, kv_out=kv).hidden
        rows = torch.arange(b)
        last = hidden[rows, prefix.last]  # (B, d): the prompt's final state
        ar_hidden = torch.cat((last[:, None], hidden[:, p : p + n_ar - 1]), dim=1)  # (B, n, d)
        logits = lm.logits(ar_hidden).flatten(0, 1).float()
        losses = Losses(F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE))
        if self.oft is not None:
            oft_chunk = self.oft.config.chunk
            oft_loss = self.oft.loss(hidden[:, p + n_ar - 1 :], batch.actions[:, :oft_chunk])
            losses.oft = oft_loss.float()
        if self.dit is not None:
            horizon = self.dit.config.horizon
            losses.dit = self.dit.loss(batch.actions[:, :horizon], last.float()).float()
        if self.flow is not None:
            losses.flow = self._flow_loss(kv, prefix.pad, prefix.last + 1, batch.actions).float()
        if self.aux is not None and batch.targets is not None:
            losses.aux = F.mse_loss(self.aux(last).float(), batch.targets.float())
        return losses

    def _ar_targets(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """The action tokens a row's chunk (B, chunk, D) should decode, as inputs and targets.

        256-bin tokens: a fixed count, inputs = targets. A FAST code (``trunk.fast_head``):
        each row's code and END, rows padded with END to the longest, the padding ignored by
        the loss (``IGNORE``), so a row learns to stop exactly where its code does."""
        vla = self.trunk
        if vla.fast_head is None:
            flat = actions.reshape(actions.shape[0], -1).float()
            ids = vla.action_tokenizer.encode(flat).long()
            return ids, ids
        codes = [vla.fast_head.encode(row) for row in actions.float().numpy()]
        n = max(len(c) for c in codes)
        end = vla.cfg.fast.end_id
        ids = torch.full((len(codes), n), end, dtype=torch.long)
        targets = torch.full((len(codes), n), IGNORE, dtype=torch.long)
        for r, code in enumerate(codes):
            ids[r, : len(code)] = torch.tensor(code)
            targets[r, : len(code)] = ids[r, : len(code)]
        return ids, targets

    def _flow_loss(
        self, kv: list[tuple[Tensor, Tensor]], valid: Tensor, start: Tensor, actions: Tensor
    ) -> Tensor:
        """The expert's loss on this pass's prefix K/V (slots 0..p-1 of every layer), exactly
        the cache a prefill leaves for it at inference."""
        p = valid.shape[1]
        k = torch.stack([keys[:, :, :p] for keys, _ in kv])  # (L, B, KVH, p, hd)
        v = torch.stack([values[:, :, :p] for _, values in kv])
        layers = k.shape[0]
        cache = KVCache.from_export(
            self.trunk.cfg.llm, k, v, valid[None].expand(layers, -1, -1), max_len=p
        )
        horizon = self.flow.cfg.horizon
        state = torch.zeros(actions.shape[0], 0, device=actions.device)
        return self.flow.loss(cache, state, actions[:, :horizon].float(), start)

    def export(self) -> dict[str, VLA]:
        """One standalone VLA per family, sharing (copies of) the trained trunk."""
        state = self.trunk.state_dict()
        heads = {
            "parallel": ("action_head", self.oft),
            "diffusion": ("action_model", self.dit),
            "flow": ("action_expert", self.flow),
        }
        out = {}
        for family, cfg in self.presets.items():
            vla = VLA(cfg)
            vla.load_state_dict(state, strict=False)
            if self.trunk.fast_head is not None and cfg.fast is not None:
                vla.set_fast_tokenizer(self.trunk.fast_head.tokenizer)
            if family in heads:
                attr, head = heads[family]
                getattr(vla, attr).load_state_dict(head.state_dict())
            out[family] = vla.eval()
        return out


def joint_mask(prefix_len: int, n_ar: int, n_oft: int | None = None) -> Tensor:
    """(T, T) visibility for [prompt | AR tokens (n_ar - 1) | OFT slots (n_oft, default n_ar)]."""
    n_oft = n_ar if n_oft is None else n_oft
    p, a = prefix_len, n_ar - 1
    t = p + a + n_oft
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    mask[p : p + a, :p] = True
    mask[p : p + a, p : p + a] = torch.ones(a, a, dtype=torch.bool).tril()
    mask[p + a :, :p] = True
    mask[p + a :, p + a :] = True
    return mask
