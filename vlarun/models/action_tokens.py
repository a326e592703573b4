"""OpenVLA's discrete action tokens and per-dataset action normalisation statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

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
    def from_openvla_config(cls, config: Mapping[str, Any]) -> ActionTokenizer:
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

    @property
    def dim(self) -> int:
        """Entries of one action."""
        return len(self.q01)

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
    def from_json_dict(cls, d: Mapping[str, Any]) -> NormStats:
        """Inverse of ``to_json_dict``; ignores keys it does not know."""
        if "q01" not in d or "q99" not in d:
            raise ValueError(f"action statistics need 'q01' and 'q99'; got keys {sorted(d)}")
        fields = ("q01", "q99", "mask", "mean", "std", "min", "max")
        return cls(**{k: d[k] for k in fields if k in d})

    @classmethod
    def select(cls, norm_stats: Mapping[str, Any], unnorm_key: str | None = None) -> NormStats:
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


@dataclass(frozen=True)
class ProprioNorm:
    """The map from a robot's proprio state to the policy's state input: zero mean, unit spread.

    ``std`` is floored at 0.01 (1 cm, or 1% of the gripper's range) so a dimension the
    demonstrations barely move cannot turn a small deviation at test time into a huge input,
    and the result is clipped to [-5, 5]. Training and inference use this one function.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"proprio mean {self.mean} and std {self.std} must match in length")

    @classmethod
    def select(cls, norm_stats: Mapping[str, Any], unnorm_key: str | None = None) -> ProprioNorm:
        """The ``proprio`` entry of one dataset in OpenVLA's nested ``norm_stats``."""
        keys = sorted(norm_stats)
        if unnorm_key is None:
            if len(keys) != 1:
                raise ValueError(f"pick a dataset for the proprio statistics: {', '.join(keys)}")
            unnorm_key = keys[0]
        entry = norm_stats[unnorm_key]
        if "proprio" not in entry:
            raise ValueError(f"dataset {unnorm_key!r} has no proprio statistics")
        p = entry["proprio"]
        return cls(tuple(float(x) for x in p["mean"]), tuple(float(x) for x in p["std"]))

    @property
    def dim(self) -> int:
        return len(self.mean)

    @property
    def scale(self) -> np.ndarray:
        """What ``normalize`` divides each entry by: its spread, floored at 0.01."""
        return np.maximum(np.asarray(self.std), 1e-2)

    def normalize(self, states: np.ndarray) -> np.ndarray:
        s = np.asarray(states, dtype=np.float64)
        if s.shape[-1] != len(self.mean):
            raise ValueError(f"state has {s.shape[-1]} entries; expected {len(self.mean)}")
        return np.clip((s - np.asarray(self.mean)) / self.scale, -5.0, 5.0).astype(np.float32)
