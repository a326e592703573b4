"""Behaviour cloning of three VLA families on one shared trunk, in one forward pass.

The trunk (vision tower, projector, Llama decoder) is trained once; each family adds only its
head, and each exports as its own VLA preset (a suite: tiny-ar/-oft/-dit, or mt10-ar/-oft/-dit):

  sequence: [BOS, visual, (proprio), instruction, pad | AR tokens (teacher forced) | OFT slots]
  mask:     the prompt is causal; AR tokens see the prompt and earlier AR tokens; OFT slots see
            the prompt and each other; nothing sees the OFT slots or (from OFT) the AR tokens.

AR and OFT tokens both take the positions right after each row's prompt, exactly where they sit
at inference, so one pass trains all three losses:
  * autoregressive: cross-entropy on the 256-bin action tokens (OpenVLA);
  * parallel: L1 on the OFT head's chunk;
  * diffusion: epsilon-MSE of the DiT conditioned on the last prompt token's hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlarun.models.dit_head import DiTHead
from vlarun.models.oft_head import L1RegressionHead, empty_action_embeddings
from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA, VLAConfig


@dataclass
class Batch:
    """images (B, 3, S, S) or (B, V, 3, S, S) in [0, 1]; text: token ids per row; actions
    (B, K, D) in [-1, 1]; state (B, proprio_dim) normalised, for configs with a proprio token."""

    images: Tensor
    text: list[list[int]]
    actions: Tensor
    state: Tensor | None = None


@dataclass
class Losses:
    ar: Tensor
    oft: Tensor
    dit: Tensor

    @property
    def total(self) -> Tensor:
        return self.ar + self.oft + self.dit

    def as_floats(self) -> dict[str, float]:
        return {k: float(getattr(self, k).detach()) for k in ("ar", "oft", "dit")}


# Each suite's presets: autoregressive (the trunk), parallel (OFT head), diffusion (DiT head).
SUITES: dict[str, tuple[str, str, str]] = {
    "mw": ("tiny-ar", "tiny-oft", "tiny-dit"),
    "mt10": ("mt10-ar", "mt10-oft", "mt10-dit"),
}


class MultiHeadBC(nn.Module):
    """Shared trunk (the suite's autoregressive VLA) + an OFT head + a DiT head."""

    def __init__(self, suite: str = "mw") -> None:
        super().__init__()
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
        self.presets = tuple(get_preset(n) for n in SUITES[suite])
        self.trunk = VLA(self.presets[0])
        self.oft = L1RegressionHead(self.presets[1].oft)
        self.dit = DiTHead(self.presets[2].dit)

    @property
    def cfg(self) -> VLAConfig:
        return self.trunk.cfg

    def forward(self, batch: Batch) -> Losses:
        vla, cfg = self.trunk, self.trunk.cfg
        lm = vla.language_model
        prefix = vla.build_prefix(vla.encode_images(batch.images), batch.text, batch.state)
        b, p = prefix.pad.shape
        n = cfg.num_action_tokens
        ids = vla.action_tokenizer.encode(batch.actions.reshape(b, n).float()).long()  # (B, n)
        ar_in = lm.embed(ids[:, :-1])  # teacher forcing: token i predicts token i + 1
        oft_in = empty_action_embeddings(b, n, cfg.llm.hidden_size, ar_in.dtype, ar_in.device)
        embeds = torch.cat((prefix.embeds, ar_in, oft_in), dim=1)
        steps_ar = torch.arange(n - 1, device=embeds.device)
        steps_oft = torch.arange(n, device=embeds.device)
        start = (prefix.last + 1)[:, None]
        positions = torch.cat(
            (torch.arange(p).expand(b, p), start + steps_ar, start + steps_oft), dim=1
        )
        pad = torch.cat((prefix.pad, torch.ones(b, 2 * n - 1, dtype=torch.bool)), dim=1)
        hidden = lm(embeds, positions, attn_mask=joint_mask(p, n), pad_mask=pad).hidden
        rows = torch.arange(b)
        last = hidden[rows, prefix.last]  # (B, d): the prompt's final state
        ar_hidden = torch.cat((last[:, None], hidden[:, p : p + n - 1]), dim=1)  # (B, n, d)
        ar_loss = F.cross_entropy(lm.logits(ar_hidden).flatten(0, 1).float(), ids.flatten())
        oft_loss = self.oft.loss(hidden[:, p + n - 1 :], batch.actions)
        dit_loss = self.dit.loss(batch.actions, last.float())
        return Losses(ar_loss, oft_loss.float(), dit_loss.float())

    def export(self) -> dict[str, VLA]:
        """One standalone VLA per family, sharing (copies of) the trained trunk."""
        state = self.trunk.state_dict()
        out = {}
        ar, oft, dit = self.presets
        for cfg, head_attr, head in ((ar, None, None), (oft, "action_head", self.oft),
                                     (dit, "action_model", self.dit)):  # fmt: skip
            vla = VLA(cfg)
            vla.load_state_dict(state, strict=False)
            if head_attr is not None:
                getattr(vla, head_attr).load_state_dict(head.state_dict())
            out[cfg.family] = vla.eval()
        return out


def joint_mask(prefix_len: int, n: int) -> Tensor:
    """(T, T) visibility for [prompt | AR tokens (n - 1) | OFT slots (n)]."""
    p, a = prefix_len, n - 1
    t = p + a + n
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    mask[p : p + a, :p] = True
    mask[p : p + a, p : p + a] = torch.ones(a, a, dtype=torch.bool).tril()
    mask[p + a :, :p] = True
    mask[p + a :, p + a :] = True
    return mask
