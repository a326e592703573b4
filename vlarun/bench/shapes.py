"""Inputs and shapes the accelerator benchmarks time on: a slowly changing synthetic scene,
and random-weight ~1B OpenVLA-like policies (autoregressive, or with CogACT's DiT head) where
compute rather than per-call overhead dominates."""

from __future__ import annotations

import numpy as np
import torch


def synthetic_stream(
    size: int, n: int, instruction: str, state_dim: int = 0
) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """A slowly changing scene (random background, a moving block) for random-weight models,
    as (instruction, frame, state) queries (a zero state when the model takes one)."""
    rng = np.random.default_rng(0)
    bg = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    out = []
    for t in range(n):
        f = bg.copy()
        y = (t * size // 40) % (size * 3 // 4)
        f[y : y + size // 5, size // 4 : size // 2] = 255
        out.append((instruction, f, np.zeros(state_dim, np.float32) if state_dim else None))
    return out


def large_policy(llm=None, family: str = "autoregressive", dit_size: str = "DiT-B"):
    """A random-weight OpenVLA-like policy: SigLIP-S-ish ViT at 224 px / 14 (256 visual
    tokens), TinyLlama-1.1B LM (or ``llm``); autoregressive 7-dim actions, or with
    ``family="diffusion"`` CogACT's DiT action module (``dit_size``, default DiT-Base; 16
    actions, 10 DDIM steps). bf16
    and prepacked where this CPU runs bf16 natively, else fp32 (emulated bf16 is ~190x slower
    and would time the emulation, not the method)."""
    from vlarun.models.device import bf16_is_fast
    from vlarun.models.dit_head import DiTConfig
    from vlarun.models.llama import LlamaConfig
    from vlarun.models.tokenizer import load_tokenizer
    from vlarun.models.vit import ViTConfig
    from vlarun.models.vla import VLA, VLAConfig
    from vlarun.policy.base import Policy

    llm = llm or LlamaConfig(
        vocab_size=32064,
        hidden_size=2048,
        intermediate_size=5632,
        num_layers=22,
        num_heads=32,
        num_kv_heads=4,
        max_positions=512,
    )
    vit = ViTConfig(
        kind="siglip",
        image_size=224,
        patch_size=14,
        hidden_size=384,
        num_layers=6,
        num_heads=6,
        intermediate_size=1536,
    )
    head = {}
    if family == "diffusion":
        dit = DiTConfig.cogact(dit_size, cond_dim=llm.hidden_size, action_dim=7, future_steps=15)
        head = {"dit": dit, "chunk": 16}
    cfg = VLAConfig(
        name=f"openvla-like-1b{'-dit' if family == 'diffusion' else ''}",
        family=family,
        llm=llm,
        vision=(vit,),
        connector="mlp",
        action_dim=7,
        chunk=head.pop("chunk", 1),
        max_text_tokens=128,
        **head,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if bf16_is_fast() else torch.float32
    model = VLA(cfg).to(dtype).eval()
    model.language_model.prepack()
    return Policy(model, load_tokenizer(None, llm.vocab_size))


def large_label(policy) -> str:
    """The ~1B row's name, with the dtype it ran in."""
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    return f"{policy.model.cfg.name} (random, {dtype})"
