"""OpenVLA-OFT's parallel decoding head: K*D empty action tokens, one bidirectional LLM pass,
an MLP-ResNet L1 regression onto a (K, D) action chunk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

ArrayLike = np.ndarray | Tensor

# ----------------------------------------------------------------------------------------------
# (b) OpenVLA-OFT parallel decoding: L1 regression head


@dataclass(frozen=True)
class OFTHeadConfig:
    """OpenVLA-OFT's L1 regression head.

    LIBERO checkpoints: llm_dim 4096, action_dim 7, chunk 8, hidden_dim 4096, num_blocks 2
    (ALOHA: action_dim 14, chunk 25; Bridge: chunk 5).
    """

    llm_dim: int
    action_dim: int
    chunk: int
    hidden_dim: int
    num_blocks: int = 2

    def __post_init__(self) -> None:
        for name in ("llm_dim", "action_dim", "chunk", "hidden_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"OFTHeadConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.num_blocks < 0:
            raise ValueError(f"OFTHeadConfig.num_blocks must be >= 0, got {self.num_blocks}")

    @property
    def num_action_tokens(self) -> int:
        """How many empty action tokens the LLM decodes in parallel: chunk * action_dim."""
        return self.chunk * self.action_dim


class MLPResNetBlock(nn.Module):
    """Pre-norm residual block: x + ReLU(Linear(LayerNorm(x)))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        # A Sequential named ``ffn`` so the keys match OFT checkpoints (ffn.0 = norm, ffn.1 = fc).
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    """LayerNorm -> Linear -> ReLU -> residual blocks -> LayerNorm -> Linear."""

    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList(
            MLPResNetBlock(hidden_dim) for _ in range(num_blocks)
        )
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


def empty_action_embeddings(
    batch: int,
    num_tokens: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Input embeddings of OFT's K*D placeholder action tokens: zeros (batch, num_tokens, dim).

    OpenVLA-OFT appends K*D placeholder ids after the prompt and then multiplies the input
    embeddings by ``~action_mask``, so those positions enter the LLM as exact zero vectors at
    train and test time alike. Their content is therefore not the embedding of any id; all they
    carry is their position (RoPE), and with bidirectional attention they gather the
    observation from the prompt. Building the zeros directly skips a useless embedding lookup.
    (OFT also appends a stop token, id 2, after them; that one keeps its real embedding.)
    """
    return torch.zeros(batch, num_tokens, dim, dtype=dtype, device=device)


class L1RegressionHead(nn.Module):
    """OFT head: final hidden states of the K*D action tokens -> a (K, D) action chunk.

    The D hidden states of one chunk step are concatenated (token order is step-major: tokens
    k*D .. k*D + D - 1 belong to step k) and one MLP-ResNet regresses that step's D actions.
    """

    def __init__(self, config: OFTHeadConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.model = MLPResNet(c.num_blocks, c.action_dim * c.llm_dim, c.hidden_dim, c.action_dim)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, K*D, llm_dim) -> normalized actions (B, K, D)."""
        c = self.config
        if hidden.ndim != 3 or hidden.shape[1:] != (c.num_action_tokens, c.llm_dim):
            raise ValueError(
                f"expected hidden (B, {c.num_action_tokens}, {c.llm_dim}), "
                f"got {tuple(hidden.shape)}"
            )
        x = hidden.reshape(hidden.shape[0], c.chunk, c.action_dim * c.llm_dim)  # (B, K, D*llm)
        return self.model(x)  # (B, K, D)

    def loss(self, hidden: Tensor, target: Tensor) -> Tensor:
        """Mean absolute error against target actions (B, K, D), OFT's training loss."""
        return F.l1_loss(self.forward(hidden), target)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops(self, batch: int) -> int:
        """Matmul FLOPs (2 per multiply-add) of one forward; norms and ReLUs not counted."""
        c = self.config
        rows = batch * c.chunk
        per_row = c.action_dim * c.llm_dim * c.hidden_dim  # fc1
        per_row += c.num_blocks * c.hidden_dim * c.hidden_dim  # residual blocks
        per_row += c.hidden_dim * c.action_dim  # fc2
        return 2 * rows * per_row
