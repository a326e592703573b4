"""The contract of Jacobi decoding (``jacobi.py``, ``jacobi_window.py``): its settings, its
result, and the two statistics both solvers compute (the exit rule's confidence and when each
token settled)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

INITS = ("random", "repeat", "previous")
EXIT_OVER = ("all", "unsettled")


@dataclass(frozen=True)
class JacobiConfig:
    """sigma: early-exit threshold on the minimum max-probability (None: run to the fixed
    point, output == greedy); max_iters: cap on Jacobi forwards (None: n - 1, which already
    guarantees the greedy output); init: initial guess of y_2..y_n, "random" (uniform over the
    action-token ids, as the paper), "repeat" (y_1 repeated) or "previous" (a warm start: the
    last action of the previous control step's chunk, held over the whole chunk; random on an
    episode's first step, see ``JacobiDecoder``); seed: of the random guesses; exit_over: the
    tokens whose minimum confidence the exit rule tests, "all" (the paper) or "unsettled" (those
    after the ones k iterations have made exact); window: for a variable-length code (FAST), the
    guesses iterated at once (``jacobi_window``; None: the config's ``decode_tokens``)."""

    sigma: float | None = None
    max_iters: int | None = None
    init: str = "random"
    seed: int = 0
    exit_over: str = "all"
    window: int | None = None

    def __post_init__(self) -> None:
        if self.sigma is not None and not 0.0 < self.sigma <= 1.0:
            raise ValueError(f"sigma must be in (0, 1], got {self.sigma}")
        if self.max_iters is not None and self.max_iters < 1:
            raise ValueError(f"max_iters must be >= 1, got {self.max_iters}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.exit_over not in EXIT_OVER:
            raise ValueError(f"exit_over must be one of {EXIT_OVER}, got {self.exit_over!r}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@dataclass
class JacobiResult:
    """One decode of a batch.

    tokens (B, n): the output; iterations (B,): Jacobi forwards each row took part in;
    converged (B,): the output is the fixed point (== greedy); exited (B,): stopped by the
    sigma rule before converging; confidence (B,): the rule's min over tokens (``exit_over``)
    of the max probability at the last iteration (y_1's alone when n == 1); fixed (B, K + 1):
    tokens that reached their final value at iteration k and kept it (k = 0: already right in
    the initial state); trajectory (B, K + 1, n): state after each iteration (K = the batch's
    iterations), rows frozen after they stop.
    """

    tokens: Tensor
    iterations: Tensor
    converged: Tensor
    exited: Tensor
    confidence: Tensor
    fixed: Tensor
    trajectory: Tensor


def min_confidence(logits: Tensor) -> Tensor:
    """(B, n, V) logits -> (B,): min over tokens of the max token probability (fp32)."""
    return logits.float().softmax(-1).amax(-1).amin(-1)


def fixed_counts(trajectory: Tensor) -> Tensor:
    """(B, K + 1, n) states -> (B, K + 1): tokens first equal to their final value at step k
    and unchanged from then on (a token right by luck behind wrong ones counts too)."""
    final = trajectory[:, -1:]
    same = trajectory == final  # (B, K + 1, n)
    # Stays right from k on: the reversed cumulative AND over iterations.
    stays = same.flip(1).int().cumprod(1).flip(1).bool()
    first = stays.int().argmax(1)  # (B, n): first k from which the token stays final
    k = trajectory.shape[1]
    return torch.nn.functional.one_hot(first, k).sum(1)
