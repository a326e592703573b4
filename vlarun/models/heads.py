"""Action heads: how a VLA turns language-model outputs into robot actions.

  (a) OpenVLA: actions are 256-bin tokens on the last ids of the vocabulary, decoded to bin
      centers in [-1, 1] and un-normalized with per-dataset 1st/99th-percentile statistics.
  (b) OpenVLA-OFT: K*D zero "empty" action tokens pass once, bidirectionally, through the LLM;
      an MLP-ResNet maps their final hidden states to a (K, D) chunk (L1 regression).
  (c) CogACT: a small DiT, conditioned on one "cognition" hidden state, denoises a (H, D) action
      sequence with deterministic DDIM. Each attention/MLP output goes through an optional
      ``DenoiseFeatureCache`` so accelerators can reuse features across denoising steps without
      any flag in this file.
  (d) flow-matching action expert (pi0-style), added by the lead.

Parameter names of (b) and (c) equal those in the OpenVLA-OFT and CogACT checkpoints (prefixes
such as ``action_model.net.`` aside), so their weights load without renaming.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

ArrayLike = np.ndarray | Tensor

# ----------------------------------------------------------------------------------------------
# (a) OpenVLA discrete action tokens and normalization statistics


class ActionTokenizer:
    """OpenVLA's uniform action binning, mapped onto the last ids of the vocabulary.

    Conventions (identical to openvla ``prismatic/vla/action_tokenizer.py`` and
    ``OpenVLAForActionPrediction.predict_action``):
      * ``bins = linspace(min_action, max_action, n_bins)`` are bin *edges*: n_bins edges give
        only n_bins - 1 intervals, whose midpoints are ``bin_centers``;
      * encode: clip to [min_action, max_action], ``d = np.digitize(a, bins)`` in [1, n_bins]
        (bins[d-1] <= a < bins[d]; a == max_action gives n_bins), token id = vocab_size - d.
        So -1 -> vocab_size - 1 and +1 -> vocab_size - n_bins: the ids are the last n_bins of
        the vocabulary, the least used tokens of a Llama BPE vocabulary;
      * decode: ``bin_centers[clip(vocab_size - id - 1, 0, n_bins - 2)]``; the clip folds
        d == n_bins (only a == max_action) into the last interval.

    ``vocab_size`` is the *tokenizer's* vocabulary (32000 for Llama-2), not the padded embedding
    table: OpenVLA's HF config stores ``text_config.vocab_size`` = 32064 after padding to a
    multiple of 64, and predict_action subtracts ``pad_to_multiple_of`` again
    (see ``from_openvla_config``).
    """

    def __init__(
        self,
        vocab_size: int,
        n_bins: int = 256,
        min_action: float = -1.0,
        max_action: float = 1.0,
    ) -> None:
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2 (edges of at least one interval), got {n_bins}")
        if not max_action > min_action:
            raise ValueError(f"need min_action < max_action, got {min_action} and {max_action}")
        if vocab_size <= n_bins:
            raise ValueError(f"vocab_size ({vocab_size}) must exceed n_bins ({n_bins})")
        self.vocab_size = int(vocab_size)
        self.n_bins = int(n_bins)
        self.min_action = float(min_action)
        self.max_action = float(max_action)
        self.bins = np.linspace(self.min_action, self.max_action, self.n_bins)  # (n_bins,) f64
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0  # (n_bins - 1,) f64
        self._on_device: dict[torch.device, tuple[Tensor, Tensor]] = {}

    @classmethod
    def from_openvla_config(cls, config: Mapping[str, Any]) -> "ActionTokenizer":
        """Build from an OpenVLA HF ``config.json`` (as a dict): the vocabulary the action ids
        count back from is ``text_config.vocab_size - pad_to_multiple_of`` (32064 - 64)."""
        vocab = int(config["text_config"]["vocab_size"]) - int(config["pad_to_multiple_of"])
        return cls(vocab_size=vocab, n_bins=int(config.get("n_action_bins", 256)))

    @property
    def action_ids(self) -> range:
        """The ids encode can produce: the last ``n_bins`` of the vocabulary."""
        return range(self.vocab_size - self.n_bins, self.vocab_size)

    @property
    def action_token_begin_idx(self) -> int:
        """OpenVLA's constant: one below the first action id (31743 for Llama-2). Ids strictly
        greater than this are action tokens."""
        return self.vocab_size - (self.n_bins + 1)

    def _device_tables(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device not in self._on_device:
            self._on_device[device] = (
                torch.as_tensor(self.bins, dtype=torch.float64, device=device),
                torch.as_tensor(self.bin_centers, dtype=torch.float64, device=device),
            )
        return self._on_device[device]

    def encode(self, actions: ArrayLike) -> ArrayLike:
        """Normalized actions (..., D) -> token ids (..., D), int64, same array type as input."""
        if isinstance(actions, Tensor):
            bins, _ = self._device_tables(actions.device)
            # Clip in the input dtype (as np.clip does with a Python-float bound), then compare
            # in float64 against float64 edges, which is what np.digitize does.
            a = actions.clamp(self.min_action, self.max_action).to(torch.float64)
            # bucketize(right=True) returns i with bins[i-1] <= a < bins[i]: np.digitize's rule.
            d = torch.bucketize(a, bins, right=True)
            return self.vocab_size - d
        a = np.clip(np.asarray(actions), self.min_action, self.max_action)
        d = np.digitize(a, self.bins)  # in [1, n_bins]
        return (self.vocab_size - d).astype(np.int64)

    def decode(self, token_ids: ArrayLike) -> ArrayLike:
        """Token ids (..., D) -> normalized actions (..., D) in [-1, 1]: float64 bin centers.

        Ids outside the action range are clipped onto the first/last bin, as OpenVLA does.
        """
        last = self.bin_centers.shape[0] - 1
        if isinstance(token_ids, Tensor):
            _, centers = self._device_tables(token_ids.device)
            d = (self.vocab_size - token_ids.long() - 1).clamp(0, last)
            return centers[d]
        d = np.clip(self.vocab_size - np.asarray(token_ids) - 1, 0, last)
        return self.bin_centers[d]


def _tupled(values: Any, kind: type) -> tuple | None:
    if values is None:
        return None
    return tuple(kind(v) for v in np.asarray(values).reshape(-1).tolist())


def _like(values: Sequence, ref: ArrayLike) -> ArrayLike:
    """Per-dimension statistics as an array that broadcasts against ``ref``."""
    if isinstance(ref, Tensor):
        dtype = torch.bool if isinstance(values[0], bool) else ref.dtype
        return torch.tensor(values, dtype=dtype, device=ref.device)
    return np.array(values)  # float64 / bool, exactly as OpenVLA builds them from JSON lists


def _where(mask: ArrayLike, a: ArrayLike, b: ArrayLike) -> ArrayLike:
    return torch.where(mask, a, b) if isinstance(a, Tensor) else np.where(mask, a, b)


def _clip(x: ArrayLike, lo: float, hi: float) -> ArrayLike:
    return x.clamp(lo, hi) if isinstance(x, Tensor) else np.clip(x, lo, hi)


@dataclass(frozen=True)
class NormStats:
    """Per-action-dimension statistics used to map actions to and from [-1, 1].

    The JSON layout is OpenVLA's ``norm_stats[dataset]["action"]`` entry (also its
    ``dataset_statistics.json``): lists under q01, q99, mask and optionally mean, std, min, max.
    ``mask[i]`` False means dimension i is not normalized (OpenVLA: the absolute gripper
    command); a missing mask means all True, as in OpenVLA. Values are stored as tuples so the
    dataclass stays frozen, hashable and comparable.
    """

    q01: tuple[float, ...]
    q99: tuple[float, ...]
    mask: tuple[bool, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    min: tuple[float, ...] | None = None
    max: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        # Accept lists / arrays / tensors and store tuples (object.__setattr__: frozen class).
        for name in ("q01", "q99", "mean", "std", "min", "max"):
            object.__setattr__(self, name, _tupled(getattr(self, name), float))
        if self.mask is None:
            object.__setattr__(self, "mask", (True,) * len(self.q01))
        else:
            object.__setattr__(self, "mask", _tupled(self.mask, bool))
        dim = len(self.q01)
        if dim == 0:
            raise ValueError("NormStats needs at least one action dimension")
        for name in ("q99", "mask", "mean", "std", "min", "max"):
            value = getattr(self, name)
            if value is not None and len(value) != dim:
                raise ValueError(f"NormStats.{name} has {len(value)} entries, q01 has {dim}")
        bad = [i for i, (lo, hi) in enumerate(zip(self.q01, self.q99, strict=True)) if hi < lo]
        if bad:
            raise ValueError(f"NormStats: q99 < q01 in action dimensions {bad}")

    @property
    def action_dim(self) -> int:
        return len(self.q01)

    def _bounds(self, bounds: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if bounds == "q99":
            return self.q01, self.q99
        if bounds == "minmax":
            if self.min is None or self.max is None:
                raise ValueError("bounds='minmax' needs NormStats.min and NormStats.max")
            return self.min, self.max
        raise ValueError(f"bounds must be 'q99' or 'minmax', got {bounds!r}")

    def unnormalize(
        self, a: ArrayLike, *, bounds: str = "q99", range_eps: float = 0.0
    ) -> ArrayLike:
        """[-1, 1] actions (..., D) -> robot actions: ``0.5*(a+1)*(high-low+eps)+low`` where
        mask, ``a`` unchanged elsewhere.

        Defaults are OpenVLA's predict_action (q01/q99, no eps). OpenVLA-OFT adds
        ``range_eps=1e-8`` and uses ``bounds="minmax"`` for its ALOHA (BOUNDS) checkpoints.
        """
        low_t, high_t = self._bounds(bounds)
        low, high, mask = _like(low_t, a), _like(high_t, a), _like(self.mask, a)
        return _where(mask, 0.5 * (a + 1) * (high - low + range_eps) + low, a)

    def normalize(self, a: ArrayLike, *, bounds: str = "q99") -> ArrayLike:
        """Robot actions (..., D) -> [-1, 1], the inverse of ``unnormalize``.

        As OpenVLA's training data pipeline: ``clip(2*(a-low)/(high-low+1e-8)-1, -1, 1)`` where
        mask, pass-through elsewhere, and 0 in dimensions where min == max (unused dimensions)
        when min/max are known. The 1e-8 keeps constant dimensions finite.
        """
        low_t, high_t = self._bounds(bounds)
        low, high, mask = _like(low_t, a), _like(high_t, a), _like(self.mask, a)
        out = _where(mask, _clip(2 * (a - low) / (high - low + 1e-8) - 1, -1.0, 1.0), a)
        if self.min is not None and self.max is not None:
            unused = [lo == hi for lo, hi in zip(self.min, self.max, strict=True)]
            zeros = torch.zeros_like(out) if isinstance(out, Tensor) else np.zeros_like(out)
            out = _where(_like(unused, a), zeros, out)
        return out

    def to_json_dict(self) -> dict[str, list]:
        """OpenVLA's ``norm_stats[dataset]["action"]`` layout; absent optional fields omitted."""
        out: dict[str, list] = {"q01": list(self.q01), "q99": list(self.q99)}
        out["mask"] = list(self.mask)
        for name in ("mean", "std", "min", "max"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value)
        return out

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> "NormStats":
        """Inverse of ``to_json_dict``; ignores keys it does not know."""
        if "q01" not in d or "q99" not in d:
            raise ValueError(f"action statistics need 'q01' and 'q99'; got keys {sorted(d)}")
        fields = ("q01", "q99", "mask", "mean", "std", "min", "max")
        return cls(**{k: d[k] for k in fields if k in d})

    @classmethod
    def select(cls, norm_stats: Mapping[str, Any], unnorm_key: str | None = None) -> "NormStats":
        """Pick one dataset's action statistics from OpenVLA's nested ``norm_stats``
        (``{dataset: {"action": {...}, "proprio": {...}, ...}}``).

        With ``unnorm_key=None`` the only dataset is chosen; with several, or an unknown key,
        the ValueError lists the keys to choose from (OpenVLA asserts without saying which keys
        are valid in a usable way, a frequent question in its issue tracker).
        """
        keys = sorted(norm_stats)
        if not keys:
            raise ValueError("norm_stats is empty: the checkpoint carries no action statistics")
        if unnorm_key is None:
            if len(keys) != 1:
                raise ValueError(
                    f"the policy was trained on {len(keys)} datasets; pass unnorm_key, one of: "
                    + ", ".join(keys)
                )
            unnorm_key = keys[0]
        if unnorm_key not in norm_stats:
            raise ValueError(f"unnorm_key {unnorm_key!r} not found; available: " + ", ".join(keys))
        entry = norm_stats[unnorm_key]
        return cls.from_json_dict(entry.get("action", entry))  # nested or already flat


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


# ----------------------------------------------------------------------------------------------
# (c) CogACT diffusion head: DiT + DDIM

BETA_SCHEDULES = ("squaredcos_cap_v2", "linear")


def alphas_cumprod(num_train: int, schedule: str = "squaredcos_cap_v2") -> Tensor:
    """Cumulative products of (1 - beta_t), t = 0 .. num_train - 1, in float64.

    * "squaredcos_cap_v2" (CogACT's): betas discretize alpha_bar(s) = cos((s+0.008)/1.008*pi/2)^2
      as beta_t = min(1 - alpha_bar((t+1)/T) / alpha_bar(t/T), 0.999); the cap only bites at the
      last step, where alpha_bar(1) is ~0.
    * "linear": DDPM's 1e-4 .. 0.02 linspace, rescaled by 1000 / T so that other T behave alike.
    """
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    if schedule == "squaredcos_cap_v2":

        def alpha_bar(s: float) -> float:
            return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = torch.tensor(
            [
                min(1 - alpha_bar((i + 1) / num_train) / alpha_bar(i / num_train), 0.999)
                for i in range(num_train)
            ],
            dtype=torch.float64,
            device="cpu",  # host-side even under a `with torch.device(...)` context
        )
    elif schedule == "linear":
        scale = 1000 / num_train
        betas = torch.linspace(
            scale * 1e-4, scale * 0.02, num_train, dtype=torch.float64, device="cpu"
        )
    else:
        raise ValueError(f"unknown beta schedule {schedule!r}; choose from {BETA_SCHEDULES}")
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_timesteps(num_train: int, steps: int) -> list[int]:
    """The train timesteps DDIM visits, in visiting order (descending, ending at 0).

    CogACT's rule (its respace.py, "ddimN"): the smallest integer stride s with
    ``len(range(0, num_train, s)) == steps``, i.e. {0, s, 2s, ...}. When ``steps`` divides
    ``num_train`` this equals diffusers' "leading" spacing, ``arange(steps) * (num_train //
    steps)``; otherwise the two differ (100 train / 7 steps: stride 15 here, 14 in diffusers).
    steps == 1 visits only ``num_train // 2`` (CogACT hard-codes 50 for its 100 steps).
    """
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    if steps < 1 or steps > num_train:
        raise ValueError(f"DDIM steps must be in [1, {num_train}], got {steps}")
    if steps == 1:
        return [num_train // 2]
    for stride in range(1, num_train):
        if len(range(0, num_train, stride)) == steps:
            return list(range(0, num_train, stride))[::-1]
    valid = sorted({len(range(0, num_train, s)) for s in range(1, num_train)} | {1})
    raise ValueError(
        f"{steps} DDIM steps is not reachable with an integer stride over {num_train} train "
        f"timesteps; valid step counts: {valid}"
    )


def ddim_sample_loop(
    eps_fn: Callable[[Tensor, Tensor, int], Tensor],
    noise: Tensor,
    alpha_bar: Tensor,
    timesteps: Sequence[int],
    *,
    clip_denoised: bool = False,
) -> Tensor:
    """Deterministic DDIM (eta = 0) from ``noise`` down to x0.

    alpha_bar: ``alphas_cumprod(...)`` over all train timesteps.
    eps_fn(x_t, t, step) predicts the noise in x_t; t is (B,) long, step the index into
    ``timesteps`` (0 for the noisiest). Per step, with a = alpha_bar(t) and a' the alpha_bar of
    the next visited timestep (1 after the last one, so the final step returns x0):
        x0 = (x_t - sqrt(1 - a) * eps) / sqrt(a), optionally clipped to [-1, 1]
        eps = (x_t - sqrt(a) * x0) / sqrt(1 - a)     (re-derived: differs only if clipped)
        x_prev = sqrt(a') * x0 + sqrt(1 - a') * eps
    This is guided-diffusion's ``ddim_sample`` as CogACT runs it (with clip_denoised=False).
    """
    x = noise
    ab = alpha_bar.tolist()  # Python float64; scalar * tensor computes in tensor dtype
    for step, t in enumerate(timesteps):
        a = ab[t]
        a_prev = ab[timesteps[step + 1]] if step + 1 < len(timesteps) else 1.0
        t_batch = torch.full((noise.shape[0],), t, dtype=torch.long, device=noise.device)
        eps = eps_fn(x, t_batch, step)
        x0 = math.sqrt(1.0 / a) * x - math.sqrt(1.0 / a - 1.0) * eps
        if clip_denoised:
            x0 = x0.clamp(-1.0, 1.0)
        eps = (math.sqrt(1.0 / a) * x - x0) / math.sqrt(1.0 / a - 1.0)
        x = math.sqrt(a_prev) * x0 + math.sqrt(1.0 - a_prev) * eps
    return x


# CogACT's action-model sizes: (num_layers, hidden_size, num_heads). DiT-B is its default.
COGACT_DIT_SIZES = {"DiT-S": (6, 384, 4), "DiT-B": (12, 768, 12), "DiT-L": (24, 1024, 16)}


@dataclass(frozen=True)
class DiTConfig:
    """Shape and diffusion settings of a CogACT-style DiT action head.

    horizon = current step + future steps (CogACT: 1 + 15). cfg_dropout > 0 creates the learned
    "uncondition" vector used for classifier-free guidance (CogACT trains with 0.1 and samples
    with cfg_scale 1.5). clip_denoised clamps each step's x0 estimate (CogACT: off); clip_sample
    clamps the final sample to [-1, 1] (CogACT does so before un-normalizing).
    """

    cond_dim: int
    action_dim: int
    horizon: int
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_ratio: float = 4.0
    num_train_timesteps: int = 100
    ddim_steps: int = 10
    beta_schedule: str = "squaredcos_cap_v2"
    cfg_dropout: float = 0.0
    clip_denoised: bool = False
    clip_sample: bool = True

    def __post_init__(self) -> None:
        for name in ("cond_dim", "action_dim", "horizon", "hidden_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DiTConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"DiTConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})"
            )
        if self.mlp_ratio <= 0:
            raise ValueError(f"DiTConfig.mlp_ratio must be > 0, got {self.mlp_ratio}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(
                f"unknown beta schedule {self.beta_schedule!r}; choose from {BETA_SCHEDULES}"
            )
        if not 0.0 <= self.cfg_dropout < 1.0:
            raise ValueError(f"DiTConfig.cfg_dropout must be in [0, 1), got {self.cfg_dropout}")
        ddim_timesteps(self.num_train_timesteps, self.ddim_steps)  # raises if unreachable

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @classmethod
    def cogact(
        cls,
        size: str = "DiT-B",
        *,
        cond_dim: int = 4096,
        action_dim: int = 7,
        future_steps: int = 15,
    ) -> "DiTConfig":
        """CogACT's released configuration for a given DiT size."""
        if size not in COGACT_DIT_SIZES:
            raise ValueError(
                f"unknown CogACT DiT size {size!r}; choose from {list(COGACT_DIT_SIZES)}"
            )
        layers, hidden, heads = COGACT_DIT_SIZES[size]
        return cls(
            cond_dim=cond_dim,
            action_dim=action_dim,
            horizon=future_steps + 1,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            cfg_dropout=0.1,
        )


class DenoiseFeatureCache(Protocol):
    """Hook around each DiT residual branch, the one place denoising accelerators plug in.

    Called once per (denoising step, layer, kind) with kind "attn" or "mlp". ``compute`` returns
    the branch output (B, N, hidden) freshly; the cache returns it or a stored tensor of the
    same shape (e.g. EfficientVLA: recompute every N steps, reuse in between). The model holds
    no policy and no flag; with no cache every branch is computed.
    """

    def __call__(
        self, step: int, layer: int, kind: str, compute: Callable[[], Tensor]
    ) -> Tensor: ...


class TimestepEmbedder(nn.Module):
    """Diffusion timestep -> hidden vector: 256 sinusoidal features, then Linear-SiLU-Linear."""

    FREQ_DIM = 256

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(self.FREQ_DIM, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    @staticmethod
    def sinusoidal(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
        """(B,) -> (B, dim): [cos(t*f), sin(t*f)] with f = max_period^(-i/half), DiT's order."""
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        )
        args = t[:, None].float() * freqs[None]  # (B, half)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = F.pad(emb, (0, 1))
        return emb

    def forward(self, t: Tensor) -> Tensor:
        freq = self.sinusoidal(t, self.FREQ_DIM).to(self.mlp[0].weight.dtype)
        return self.mlp(freq)  # (B, hidden)


class LinearEmbedder(nn.Module):
    """A Linear under ``.linear``, so x_embedder / z_embedder keys match CogACT checkpoints."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with a fused qkv projection (timm layout)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, N, C = x.shape
        # qkv features are ordered (3, heads, head_dim), as in timm-trained checkpoints.
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, N, hd)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, hd), no mask: all tokens see all
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    """fc1 -> GELU(tanh) -> fc2."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).

    CogACT's blocks use no adaLN: the condition is a token in the sequence, so norms carry no
    affine parameters. Each branch is a separate call routed through ``feature_cache``.
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, mlp_hidden)

    def forward(
        self,
        x: Tensor,
        *,
        step: int = 0,
        layer: int = 0,
        feature_cache: DenoiseFeatureCache | None = None,
    ) -> Tensor:
        """(B, N, hidden) -> (B, N, hidden). ``step``/``layer`` only label the cache calls."""

        def attn() -> Tensor:
            return self.attn(self.norm1(x))

        x = x + (attn() if feature_cache is None else feature_cache(step, layer, "attn", attn))

        def mlp() -> Tensor:
            return self.mlp(self.norm2(x))

        return x + (mlp() if feature_cache is None else feature_cache(step, layer, "mlp", mlp))


class FinalLayer(nn.Module):
    """Read-out: affine-free LayerNorm, then Linear to the action dimension."""

    def __init__(self, hidden_size: int, out_dim: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.norm_final(x))


class DiTHead(nn.Module):
    """CogACT's action model: a DiT that predicts the noise in an (H, A) action sequence.

    Sequence = [condition token, H action tokens] + learned position embeddings, where the
    condition token = Linear(cognition feature) + timestep embedding. The cognition feature is
    the LLM's final hidden state at the last prompt token. Output: epsilon for the H actions.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.x_embedder = LinearEmbedder(c.action_dim, c.hidden_size)
        self.t_embedder = TimestepEmbedder(c.hidden_size)
        self.z_embedder = LinearEmbedder(c.cond_dim, c.hidden_size)
        if c.cfg_dropout > 0:
            # Learned "no condition" input for classifier-free guidance. Shape (1, cond_dim) as
            # in CogACT's checkpoints (its condition carries a length-1 token axis).
            self.z_embedder.uncondition = nn.Parameter(torch.empty(1, c.cond_dim))
        # +1 position for the condition token.
        self.positional_embedding = nn.Parameter(torch.empty(c.horizon + 1, c.hidden_size))
        self.blocks = nn.ModuleList(
            DiTBlock(c.hidden_size, c.num_heads, c.mlp_hidden) for _ in range(c.num_layers)
        )
        self.final_layer = FinalLayer(c.hidden_size, c.action_dim)
        # Not a buffer: Module.to(bfloat16) would round the schedule; it is moved per use.
        self.alphas_cumprod = alphas_cumprod(c.num_train_timesteps, c.beta_schedule)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """DiT's initialization: Xavier linears with zero bias, N(0, 0.02) embedders, position
        embeddings N(0, 1/hidden), and a zero output layer so training starts from eps = 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for lin in (self.x_embedder.linear, self.z_embedder.linear, *self.t_embedder.mlp[::2]):
            nn.init.normal_(lin.weight, std=0.02)
        if hasattr(self.z_embedder, "uncondition"):
            nn.init.normal_(self.z_embedder.uncondition, std=0.02)
        nn.init.normal_(self.positional_embedding, std=self.config.hidden_size**-0.5)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def forward(
        self,
        noisy: Tensor,
        t: Tensor,
        cond: Tensor,
        *,
        step: int = 0,
        feature_cache: DenoiseFeatureCache | None = None,
    ) -> Tensor:
        """Predict the noise: noisy (B, H, A), t (B,) train timesteps, cond (B, cond_dim)
        -> eps (B, H, A). ``step`` is the denoising step index handed to ``feature_cache``."""
        c = self.config
        if noisy.shape[1:] != (c.horizon, c.action_dim) or cond.shape[-1] != c.cond_dim:
            raise ValueError(
                f"expected noisy (B, {c.horizon}, {c.action_dim}) and cond (B, {c.cond_dim}), "
                f"got {tuple(noisy.shape)} and {tuple(cond.shape)}"
            )
        x = self.x_embedder(noisy)  # (B, H, d)
        cond_token = self.t_embedder(t) + self.z_embedder(cond)  # (B, d)
        x = torch.cat([cond_token[:, None], x], dim=1) + self.positional_embedding  # (B, H+1, d)
        for i, block in enumerate(self.blocks):
            x = block(x, step=step, layer=i, feature_cache=feature_cache)
        # Only the action tokens are read out; skipping the condition token saves a row.
        return self.final_layer(x[:, 1:])  # (B, H, A)

    def _uncondition(self, batch: int) -> Tensor:
        if not hasattr(self.z_embedder, "uncondition"):
            raise ValueError("classifier-free guidance needs a head built with cfg_dropout > 0")
        return self.z_embedder.uncondition.expand(batch, -1)  # (B, cond_dim)

    @torch.no_grad()
    def sample(
        self,
        cond: Tensor,
        steps: int | None = None,
        noise: Tensor | None = None,
        feature_cache: DenoiseFeatureCache | None = None,
        *,
        cfg_scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Denoise an action sequence for cond (B, cond_dim) -> normalized actions (B, H, A).

        Deterministic DDIM (eta = 0) over ``ddim_timesteps(num_train_timesteps, steps)``
        (steps defaults to config.ddim_steps); the result depends only on ``noise``, drawn from
        ``generator`` when not given. cfg_scale > 1 applies classifier-free guidance,
        eps = eps_uncond + cfg_scale * (eps_cond - eps_uncond), as CogACT does.
        """
        c = self.config
        B = cond.shape[0]
        timesteps = ddim_timesteps(c.num_train_timesteps, c.ddim_steps if steps is None else steps)
        if noise is None:
            noise = torch.randn(
                (B, c.horizon, c.action_dim), generator=generator, device=cond.device
            ).to(cond.dtype)
        use_cfg = cfg_scale != 1.0
        if use_cfg:
            cond = torch.cat([cond, self._uncondition(B).to(cond.dtype)], dim=0)  # (2B, cond)

        def eps_fn(x: Tensor, t: Tensor, step: int) -> Tensor:
            if not use_cfg:
                return self(x, t, cond, step=step, feature_cache=feature_cache)
            eps = self(torch.cat([x, x]), t.repeat(2), cond, step=step, feature_cache=feature_cache)
            eps_c, eps_u = eps.chunk(2)
            return eps_u + cfg_scale * (eps_c - eps_u)

        x = ddim_sample_loop(
            eps_fn, noise, self.alphas_cumprod, timesteps, clip_denoised=c.clip_denoised
        )
        return x.clamp(-1.0, 1.0) if c.clip_sample else x

    def loss(
        self, actions: Tensor, cond: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Epsilon-prediction MSE at uniformly drawn train timesteps.

        actions (B, H, A) in [-1, 1], cond (B, cond_dim). With cfg_dropout > 0, that fraction of
        conditions is replaced by the learned uncondition. ``generator`` (on actions' device)
        makes t, noise and dropout reproducible.
        """
        c = self.config
        B, device = actions.shape[0], actions.device
        t = torch.randint(0, c.num_train_timesteps, (B,), generator=generator, device=device)
        noise = torch.randn(actions.shape, generator=generator, device=device).to(actions.dtype)
        ab = self.alphas_cumprod.to(device)[t].to(actions.dtype)[:, None, None]  # (B, 1, 1)
        x_t = ab.sqrt() * actions + (1 - ab).sqrt() * noise  # q(x_t | x_0)
        if c.cfg_dropout > 0:
            drop = torch.rand(B, generator=generator, device=device) < c.cfg_dropout
            cond = torch.where(drop[:, None], self._uncondition(B).to(cond.dtype), cond)
        return F.mse_loss(self(x_t, t, cond), noise)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops(self, batch: int, steps: int | None = None, *, cfg: bool = False) -> int:
        """Matmul FLOPs (2 per multiply-add) of ``sample``: steps denoiser passes, each on
        2*batch rows under classifier-free guidance. Norms, activations, softmax not counted."""
        c = self.config
        steps = c.ddim_steps if steps is None else steps
        rows = batch * (2 if cfg else 1)
        d, n, h = c.hidden_size, c.horizon + 1, c.horizon
        embed = h * c.action_dim * d + TimestepEmbedder.FREQ_DIM * d + d * d + c.cond_dim * d
        per_layer = n * 3 * d * d + 2 * n * n * d + n * d * d + 2 * n * d * c.mlp_hidden
        readout = h * d * c.action_dim
        return 2 * rows * steps * (embed + c.num_layers * per_layer + readout)


# --- (d) flow-matching action expert: added by the lead ---
