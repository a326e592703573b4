"""Action heads: how a VLA turns language-model outputs into robot actions.

  (a) OpenVLA: actions are 256-bin tokens on the last ids of the vocabulary, decoded to bin
      centers in [-1, 1] and un-normalized with per-dataset 1st/99th-percentile statistics.
  (b) OpenVLA-OFT: K*D zero "empty" action tokens pass once, bidirectionally, through the LLM;
      an MLP-ResNet maps their final hidden states to a (K, D) chunk (L1 regression).
  (c) CogACT: a small DiT, conditioned on one "cognition" hidden state, denoises a (H, D) action
      sequence with deterministic DDIM. Each attention/MLP output goes through an optional
      ``DenoiseFeatureCache`` so accelerators can reuse features across denoising steps without
      any flag in this file.
  (d) pi0: a flow-matching action expert attends to the prefix KV cache (flow_expert.py).

One file per head; this module gathers them.

Parameter names of (b) and (c) equal those in the OpenVLA-OFT and CogACT checkpoints (prefixes
such as ``action_model.net.`` aside), so their weights load without renaming.
"""

from vlarun.models.action_tokens import ActionTokenizer, NormStats
from vlarun.models.ddim import alphas_cumprod, ddim_sample_loop, ddim_timesteps
from vlarun.models.dit_head import (
    COGACT_DIT_SIZES,
    DenoiseFeatureCache,
    DiTBlock,
    DiTConfig,
    DiTHead,
)
from vlarun.models.flow_expert import FlowExpertConfig, FlowMatchingExpert
from vlarun.models.oft_head import L1RegressionHead, OFTHeadConfig, empty_action_embeddings

__all__ = [
    "ActionTokenizer",
    "NormStats",
    "OFTHeadConfig",
    "L1RegressionHead",
    "empty_action_embeddings",
    "COGACT_DIT_SIZES",
    "DenoiseFeatureCache",
    "DiTBlock",
    "DiTConfig",
    "DiTHead",
    "alphas_cumprod",
    "ddim_sample_loop",
    "ddim_timesteps",
    "FlowExpertConfig",
    "FlowMatchingExpert",
]
