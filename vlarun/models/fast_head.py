"""pi0-FAST's action head: FAST ids inside the LM's vocabulary, the end token, and the way back
from decoded ids to an action chunk.

The LM decodes a variable-length sequence ``[a_1, ..., a_k, END]`` greedily after the prefix.
Each ``a_i`` is a FAST id ``f`` (``fast_tokens.py``) written as the LM id ``V - 1 - skip - f``,
openpi's ``_act_tokens_to_paligemma_tokens``: FAST ids count down from the top of the LM's
vocabulary ``V``, below the ``skip`` ids kept there for special tokens (PaliGemma: 128). The map
is its own inverse. Decoding stops at END (openpi ``Pi0FAST.sample_actions`` stops at PaliGemma's
<eos>) or after ``FastConfig.max_tokens`` tokens.

Malformed output. openpi's ``FASTTokenizer.extract_actions`` returns an all-zero (T, D) chunk
when the decoded text holds no action marker, and the FAST processor's ``decode`` returns zeros
(the middle of every normalised range) when its ids do not decode to T x D coefficients.
``FastHead.decode`` does the same for an id outside the FAST range before END, ids that do not
decode and a wrong coefficient count, and counts each in ``failures`` (openpi prints it).
``FastConfig.relaxed`` is LeRobot's decoding (``PI0FastPolicy.decode_actions_with_fast``, which
always relaxes): a wrong count is cut or padded with zero coefficients instead, and an LM id
below the FAST range (a text token, whose FAST id lies past the FAST vocabulary) is dropped, as
the BPE decoder LeRobot calls drops ids it does not know. A sequence cut off at ``max_tokens``
without END is decoded as it stands (usually a wrong count, so zeros unless relaxed).

Layout. vlarun's own sequence is the FAST ids and END only; openpi's LM also writes the text
"Action: " before them and "|" after them. LeRobot's pi0_fast decodes that text itself, as
vlarun does with ``FastConfig.strip`` (the "Action: " ids, removed wherever they occur before
END), ``starts`` (its ``validate_action_token_prefix``: the code must begin "Action" ":") and
``end_id`` (the "|" id).

Departures from LeRobot, on purpose: a code that fails ``starts`` is a failure (zeros, counted)
where LeRobot's assertion stops the whole inference; a code whose ids split a coefficient's
UTF-8 bytes is a failure where LeRobot decodes the replacement character U+FFFD as a
coefficient of 65533 + min_token.

Random-weight presets have no trained vocabulary: ``synthetic_fast_tokenizer`` fits one on
seeded smooth chunks of the preset's shape, so every step of the path is the real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from vlarun.models.fast_tokens import FastDecodeError, FastTokenizer


@dataclass(frozen=True)
class FastConfig:
    """How the LM writes a FAST code. vocab_size: FAST ids 0..vocab_size - 1 (the tokenizer
    file's vocabulary); max_tokens: the most tokens one chunk decodes, END included (openpi's
    ``max_decoding_steps``); end_id: the LM id that ends the code (PaliGemma's <eos> is 1);
    skip_tokens: ids at the top of the LM vocabulary that are not FAST ids (PaliGemma: 128);
    relaxed: LeRobot's decoding of a wrong coefficient count and of text ids (module
    docstring); strip: LM ids of a text marker removed wherever it occurs before END (LeRobot:
    "Action: "); starts: LM ids a code must begin with, else it is no code (LeRobot's
    ``validate_action_token_prefix``: "Action" ":"); () for none."""

    vocab_size: int
    max_tokens: int
    end_id: int
    skip_tokens: int = 0
    relaxed: bool = False
    strip: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.max_tokens < 2:
            raise ValueError(
                f"FAST needs vocab_size >= 1 and max_tokens >= 2 (one id and END), got "
                f"{self.vocab_size} and {self.max_tokens}"
            )
        if self.skip_tokens < 0 or self.end_id < 0:
            raise ValueError("skip_tokens and end_id must be >= 0")

    def lm_range(self, lm_vocab: int) -> range:
        """The LM ids that carry FAST ids."""
        top = lm_vocab - self.skip_tokens  # one past the highest FAST id's LM id
        return range(top - self.vocab_size, top)

    def check_compatible(self, lm_vocab: int) -> None:
        ids = self.lm_range(lm_vocab)
        if ids.start < 0:
            raise ValueError(
                f"{self.vocab_size} FAST ids below {self.skip_tokens} skipped ids do not fit an "
                f"LM vocabulary of {lm_vocab}"
            )
        if not 0 <= self.end_id < lm_vocab or self.end_id in ids:
            raise ValueError(
                f"end_id {self.end_id} must be an LM id outside the FAST ids "
                f"{ids.start}..{ids.stop - 1} (vocabulary {lm_vocab})"
            )
        text = [i for i in (*self.strip, *self.starts) if i in ids or not 0 <= i < lm_vocab]
        if text:
            raise ValueError(f"marker ids {text} must be LM ids outside the FAST ids")


def code_lengths(ids: Tensor, end_id: int) -> Tensor:
    """(B, L) decoded ids -> (B,): tokens up to and including each row's first END (L if none)."""
    is_end = ids == end_id
    first = is_end.int().argmax(1)
    return torch.where(is_end.any(1), first + 1, torch.full_like(first, ids.shape[1]))


def code_mask(ids: Tensor, end_id: int) -> Tensor:
    """(B, L) ids -> (B, L) bool: the tokens up to and including each row's first END (all L
    if none); what follows END is no part of the code."""
    keep = torch.arange(ids.shape[1], device=ids.device)[None]
    return keep < code_lengths(ids, end_id)[:, None]


def pad_after_end(ids: Tensor, end_id: int) -> Tensor:
    """(B, L) ids with every token after a row's first END set to END (rows of one batch end at
    different steps; what follows an END is no part of the code)."""
    after = (
        torch.arange(ids.shape[1], device=ids.device)[None] >= code_lengths(ids, end_id)[:, None]
    )
    return torch.where(after, torch.full_like(ids, end_id), ids)


class FastHead:
    """A FAST tokenizer bound to a model's vocabulary and chunk shape; ``failures`` counts the
    sequences that decoded to the all-zero chunk."""

    def __init__(
        self,
        cfg: FastConfig,
        lm_vocab: int,
        tokenizer: FastTokenizer,
        horizon: int,
        action_dim: int,
    ) -> None:
        cfg.check_compatible(lm_vocab)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ValueError(
                f"the FAST tokenizer has {tokenizer.vocab_size} ids; the model reserves "
                f"{cfg.vocab_size} (FastConfig.vocab_size)"
            )
        shape = (tokenizer.action_horizon, tokenizer.action_dim)
        if shape != (horizon, action_dim):
            raise ValueError(
                f"the FAST tokenizer codes {shape[0]} x {shape[1]} chunks; the model predicts "
                f"{horizon} x {action_dim}"
            )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.lm_vocab = lm_vocab
        self.ids = cfg.lm_range(lm_vocab)
        self.failures = 0

    def _flip(self, ids: np.ndarray) -> np.ndarray:
        """FAST id <-> LM id (the map is its own inverse)."""
        return self.lm_vocab - 1 - self.cfg.skip_tokens - ids

    def encode(self, chunk: np.ndarray) -> list[int]:
        """Normalised chunk (T, D) -> the LM ids the model should decode: its code, then END."""
        fast = np.asarray(self.tokenizer.encode(chunk), dtype=np.int64)
        return self._flip(fast).tolist() + [self.cfg.end_id]

    def decode(self, ids: Sequence[int]) -> np.ndarray:
        """Decoded LM ids (a row, END and what follows it ignored) -> normalised chunk (T, D),
        float64; the all-zero chunk (counted in ``failures``) if they are not a FAST code."""
        cfg = self.cfg
        row = [int(i) for i in ids]
        code = row[: row.index(cfg.end_id)] if cfg.end_id in row else row
        try:
            if cfg.starts and code[: len(cfg.starts)] != list(cfg.starts):
                raise FastDecodeError("the code does not start with the marker")
            code = np.asarray(_without(code, cfg.strip), dtype=np.int64)
            if cfg.relaxed:  # text ids: LeRobot's BPE decoder skips ids past the FAST vocabulary
                code = code[code >= self.ids.start]
            if not ((code >= self.ids.start) & (code < self.ids.stop)).all():
                raise FastDecodeError("an id before END is not a FAST id")
            return self.tokenizer.decode(self._flip(code).tolist(), relaxed=cfg.relaxed)
        except FastDecodeError:
            self.failures += 1
            return np.zeros((self.tokenizer.action_horizon, self.tokenizer.action_dim))

    def actions(self, ids: Tensor) -> Tensor:
        """(B, L) decoded ids -> (B, T, D) float32 normalised actions."""
        rows = [self.decode(r) for r in ids.cpu().tolist()]
        return torch.as_tensor(np.stack(rows), dtype=torch.float32)


def _without(ids: list[int], marker: tuple[int, ...]) -> list[int]:
    """``ids`` with every occurrence of ``marker`` removed, scanning left to right and looking
    again at the same place after a removal (LeRobot's ``detokenize_actions`` loop)."""
    if not marker:
        return ids
    out, n, i = list(ids), len(marker), 0
    while i <= len(out) - n:
        if tuple(out[i : i + n]) == marker:
            del out[i : i + n]
        else:
            i += 1
    return out


# ---------------------------------------------------------------------------------------------
# A vocabulary for random-weight presets


def smooth_chunks(n: int, horizon: int, action_dim: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` normalised chunks that move like a robot over one chunk: per dimension a random
    offset, velocity and acceleration (quadratic in time), clipped to [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, horizon)[None, :, None]  # (1, T, 1)
    a = rng.uniform(-0.8, 0.8, (n, 1, action_dim))
    v = rng.uniform(-0.5, 0.5, (n, 1, action_dim))
    c = rng.uniform(-0.3, 0.3, (n, 1, action_dim))
    return list(np.clip(a + v * t + c * t**2, -1.0, 1.0))


@lru_cache(maxsize=8)
def _synthetic_files(horizon: int, action_dim: int, vocab_size: int, seed: int) -> tuple[str, int]:
    # 1000 chunks: at 8 x 7 and 512 ids, ~14 tokens per chunk (fitting takes ~0.2 s)
    tok = FastTokenizer.fit(smooth_chunks(1000, horizon, action_dim, seed), vocab_size=vocab_size)
    return tok.bpe.to_str(), tok.min_token


def synthetic_fast_tokenizer(
    horizon: int, action_dim: int, vocab_size: int, seed: int = 0
) -> FastTokenizer:
    """A FAST tokenizer fitted on ``smooth_chunks`` (deterministic for a seed; a fresh object
    each call, so its counters are its own)."""
    text, min_token = _synthetic_files(horizon, action_dim, vocab_size, seed)
    return FastTokenizer(
        Tokenizer.from_str(text), action_horizon=horizon, action_dim=action_dim, min_token=min_token
    )
