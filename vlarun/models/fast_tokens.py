"""FAST action tokens (Pertsch et al. 2025, "FAST: Efficient Action Tokenization for VLAs").

A normalised action chunk ``x`` (T, D) -- normalised by ``NormStats.normalize``, this module does
no normalisation of its own -- becomes a variable-length list of BPE ids:

  1. ``c = C @ x``: the orthonormal DCT-II along time, per action dimension (``C = dct_matrix(T)``,
     the same as ``scipy.fft.dct(x, axis=0, norm="ortho")``);
  2. ``q = round(c * scale)``: integer coefficients, most of the high frequencies become 0;
  3. ``q.reshape(-1)`` in C order: frequency-major, i.e. all D dimensions of frequency 0, then all
     of frequency 1, ... so the zero tail of every dimension ends up together at the end;
  4. each integer ``v`` becomes the character ``chr(max(v - min_token, 0))`` and the string is
     BPE-encoded with a HF ``tokenizers`` tokenizer (``tokenizer.json``).

Decoding inverts each step: BPE decode -> ``ord(ch) + min_token`` -> reshape (T, D) ->
``C.T @ (q / scale)``. These are the conventions of the reference processor
(``physical-intelligence/fast``, ``processing_action_tokenizer.UniversalActionProcessor``, used
by openpi and LeRobot); a directory it saved (``tokenizer.json`` + ``processor_config.json``
with ``scale`` / ``min_token`` / ``time_horizon`` / ``action_dim``) loads here, and ``save``
writes the same two files.

Error bound. Rounding moves each coefficient by at most ``0.5 / scale``; C is orthonormal, so
the reconstruction error of one action dimension has L2 norm ``||C.T d|| = ||d|| <=
0.5 * sqrt(T) / scale``, which also bounds every single entry. A coefficient below
``min_token / scale`` is clamped to ``min_token`` as the reference does (silently there; this
module counts it in ``FastTokenizer.clamped``), so the bound holds only for chunks whose
coefficients stay in the range ``fit`` saw.

Where this departs from the reference, on purpose:
  * malformed ids (out of the vocabulary, bytes that are not UTF-8, a count other than T * D)
    raise ``FastDecodeError``; the reference prints the error and returns an all-zero chunk,
    i.e. the middle of every action range. The model's head (``fast_head.FastHead``) catches
    the error and does that, counting it; ``relaxed`` is LeRobot's variant (pad or cut the
    coefficient count);
  * ``fit`` seeds the BPE alphabet with the 256 byte-level symbols, so every byte of every
    character is in the vocabulary and no coefficient is ever dropped as unknown (the reference
    seeds it with the raw characters, which its byte-level pre-tokenizer never produces above
    127, so a byte never seen in training would be dropped silently).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# chr() of a surrogate (0xD800..0xDFFF) cannot be UTF-8 encoded; shifted coefficients must stay
# below it (|coefficient * scale| < 55,000: far beyond any normalised chunk).
_MAX_CHAR = 0xD7FF
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "processor_config.json"
FAST_TOKENIZER_DIR = "fast_tokenizer"  # where a checkpoint keeps the two, beside its weights


class FastDecodeError(ValueError):
    """A token sequence that does not decode to a (T, D) chunk of coefficients."""


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix (n, n), float64: ``(C @ x)[k] = s_k * sum_t x[t] *
    cos(pi * k * (2t + 1) / (2n))`` with ``s_0 = sqrt(1/n)``, ``s_k = sqrt(2/n)``. ``C.T`` is its
    inverse (the DCT-III)."""
    if n < 1:
        raise ValueError(f"DCT length must be >= 1, got {n}")
    k = np.arange(n, dtype=np.float64)[:, None]  # (n, 1) frequency
    t = np.arange(n, dtype=np.float64)[None, :]  # (1, n) time
    c = np.cos(np.pi * k * (2 * t + 1) / (2 * n)) * math.sqrt(2.0 / n)
    c[0] /= math.sqrt(2.0)
    return c


class FastTokenizer:
    """FAST: DCT + scale-and-round + BPE over the integers, for chunks of a fixed (T, D).

    ``bpe`` is a HF ``tokenizers.Tokenizer`` (the checkpoint's ``tokenizer.json``); its ids are
    the FAST ids 0 .. ``vocab_size`` - 1, before any model maps them into its own vocabulary.
    ``clamped`` counts coefficients ``encode`` clamped up to ``min_token`` so far.
    """

    def __init__(
        self,
        bpe: Tokenizer,
        *,
        action_horizon: int,
        action_dim: int,
        scale: float = 10.0,
        min_token: int = 0,
    ) -> None:
        if action_horizon < 1 or action_dim < 1:
            raise ValueError(f"need a chunk of >= 1 x >= 1, got ({action_horizon}, {action_dim})")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.bpe = bpe
        self.action_horizon = int(action_horizon)
        self.action_dim = int(action_dim)
        self.scale = float(scale)
        self.min_token = int(min_token)
        self.clamped = 0
        self._dct = dct_matrix(self.action_horizon)  # (T, T)

    @property
    def vocab_size(self) -> int:
        """FAST ids are 0 .. vocab_size - 1."""
        return self.bpe.get_vocab_size()

    # ------------------------------------------------------------------------------------------
    # chunk <-> integer coefficients

    def _check_chunk(self, chunk: np.ndarray) -> np.ndarray:
        x = np.asarray(chunk, dtype=np.float64)
        if x.shape != (self.action_horizon, self.action_dim):
            raise ValueError(
                f"action chunk has shape {x.shape}; this tokenizer encodes "
                f"({self.action_horizon}, {self.action_dim})"
            )
        if not np.isfinite(x).all():
            raise ValueError("action chunk contains NaN or inf")
        return x

    def coefficients(self, chunk: np.ndarray) -> np.ndarray:
        """Normalised chunk (T, D) -> quantised DCT coefficients (T frequencies, D), int64."""
        x = self._check_chunk(chunk)
        return np.rint(self._dct @ x * self.scale).astype(np.int64)  # rint: as np.around

    def chunk_from_coefficients(self, q: np.ndarray) -> np.ndarray:
        """Quantised coefficients (T, D) -> chunk (T, D), float64: the inverse DCT of q / scale."""
        q = np.asarray(q)
        if q.shape != (self.action_horizon, self.action_dim):
            raise ValueError(
                f"coefficients have shape {q.shape}; expected "
                f"({self.action_horizon}, {self.action_dim})"
            )
        return self._dct.T @ (q / self.scale)

    # ------------------------------------------------------------------------------------------
    # integer coefficients <-> BPE ids

    def _to_text(self, q: np.ndarray) -> str:
        shifted = q.reshape(-1) - self.min_token  # C order: frequency-major
        self.clamped += int((shifted < 0).sum())
        shifted = np.maximum(shifted, 0)  # the reference's clamp
        if shifted.max() > _MAX_CHAR:
            raise ValueError(
                f"a DCT coefficient of {int(shifted.max()) + self.min_token} / {self.scale} is too "
                "large to encode; is the chunk normalised?"
            )
        return "".join(map(chr, shifted.tolist()))

    def encode(self, chunk: np.ndarray) -> list[int]:
        """Normalised chunk (T, D) -> FAST ids (variable length)."""
        text = self._to_text(self.coefficients(chunk))
        ids = self.bpe.encode(text).ids
        # A character whose bytes are not all in the vocabulary would vanish without an error
        # (BPE without an unknown token drops it); a file from fit() cannot do that, any other
        # file is checked here.
        if self.bpe.decode(ids, skip_special_tokens=False) != text:
            raise ValueError(
                "decoding the BPE ids does not give this chunk's coefficients back: the "
                "tokenizer file's vocabulary (or decoder) does not cover them"
            )
        return ids

    def decode_coefficients(self, ids: Sequence[int], *, relaxed: bool = False) -> np.ndarray:
        """FAST ids -> quantised coefficients (T, D), int64; FastDecodeError if malformed.

        ``relaxed`` (LeRobot's ``relaxed_action_decoding``): a count other than T * D is cut to
        T * D, or padded with zero coefficients (no motion at those frequencies), instead of
        raising; ids outside the vocabulary and broken UTF-8 still raise."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise FastDecodeError(
                f"ids {bad[:8]} are outside the FAST vocabulary 0..{self.vocab_size - 1}"
            )
        text = self.bpe.decode(ids, skip_special_tokens=False)
        if "\ufffd" in text:  # bytes that do not form UTF-8 characters
            raise FastDecodeError("the ids split a coefficient's UTF-8 bytes: not a FAST sequence")
        n = self.action_horizon * self.action_dim
        if len(text) != n and not relaxed:
            raise FastDecodeError(
                f"the ids decode to {len(text)} coefficients; a ({self.action_horizon}, "
                f"{self.action_dim}) chunk has {n}"
            )
        q = np.zeros(n, dtype=np.int64)
        kept = min(len(text), n)
        q[:kept] = np.fromiter(map(ord, text[:kept]), dtype=np.int64, count=kept) + self.min_token
        return q.reshape(self.action_horizon, self.action_dim)

    def decode(self, ids: Sequence[int], *, relaxed: bool = False) -> np.ndarray:
        """FAST ids -> normalised chunk (T, D), float64; FastDecodeError if malformed (see
        ``decode_coefficients`` for ``relaxed``)."""
        return self.chunk_from_coefficients(self.decode_coefficients(ids, relaxed=relaxed))

    # ------------------------------------------------------------------------------------------
    # training and files

    @classmethod
    def fit(
        cls,
        chunks: Sequence[np.ndarray],
        *,
        scale: float = 10.0,
        vocab_size: int = 1024,
        min_frequency: int = 2,
    ) -> FastTokenizer:
        """Learn BPE merges over the quantised coefficients of ``chunks`` (each (T, D), all the
        same shape, normalised). ``min_token`` is the smallest coefficient seen, as in the
        reference. ``vocab_size`` counts the 256 byte symbols plus the merges."""
        if not chunks:
            raise ValueError("fit needs at least one action chunk")
        shape = np.shape(chunks[0])
        if len(shape) != 2 or any(np.shape(c) != shape for c in chunks):
            raise ValueError(f"fit needs (T, D) chunks of one shape; the first is {shape}")
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet):
            raise ValueError(f"vocab_size must be >= {len(alphabet)} (the byte alphabet)")
        probe = cls(
            Tokenizer(models.BPE()), action_horizon=shape[0], action_dim=shape[1], scale=scale
        )
        qs = [probe.coefficients(c) for c in chunks]
        min_token = int(min(q.min() for q in qs))
        # Byte-level BPE, as the reference: characters above 127 are two UTF-8 bytes, and the
        # pre-tokenizer's regex splits runs by character class, so a merge never crosses a
        # letter / non-letter boundary (the reference file is built the same way).
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=False,
            special_tokens=[],
            initial_alphabet=alphabet,
            max_token_length=10000,  # long zero tails may become one token, as the reference
        )
        out = cls(
            bpe, action_horizon=shape[0], action_dim=shape[1], scale=scale, min_token=min_token
        )
        bpe.train_from_iterator((out._to_text(q) for q in qs), trainer=trainer)
        out.clamped = 0
        return out

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``processor_config.json`` (the reference's keys)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.bpe.save(str(d / TOKENIZER_FILE))
        config = {
            "processor_class": "UniversalActionProcessor",
            "scale": self.scale,
            "min_token": self.min_token,
            "vocab_size": self.vocab_size,
            "time_horizon": self.action_horizon,
            "action_dim": self.action_dim,
        }
        (d / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        action_horizon: int | None = None,
        action_dim: int | None = None,
    ) -> FastTokenizer:
        """Read a FAST directory. The universal FAST+ file stores no chunk shape
        (``time_horizon`` / ``action_dim`` null); pass it here. Given values override the file."""
        d = Path(directory)
        missing = [n for n in (TOKENIZER_FILE, CONFIG_FILE) if not (d / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{d} is not a FAST tokenizer directory: missing {missing}")
        config = json.loads((d / CONFIG_FILE).read_text())
        horizon = action_horizon or config.get("time_horizon")
        dim = action_dim or config.get("action_dim")
        if horizon is None or dim is None:
            raise ValueError(
                f"{d / CONFIG_FILE} does not fix the chunk shape (time_horizon / action_dim); "
                "pass action_horizon and action_dim"
            )
        return cls(
            Tokenizer.from_file(str(d / TOKENIZER_FILE)),
            action_horizon=int(horizon),
            action_dim=int(dim),
            scale=float(config.get("scale", 10.0)),
            min_token=int(config.get("min_token", 0)),
        )
