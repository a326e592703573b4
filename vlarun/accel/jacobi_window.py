"""Jacobi decoding of a variable-length code (pi0-FAST) in a window that slides as tokens settle.

A FAST code has no fixed length: greedy decoding writes tokens until END, at most M of them
(``FastConfig.max_tokens``). Here Jacobi decoding iterates W guesses at a time (default: the
code's expected length, ``VLAConfig.decode_tokens``) in a window that slides along the sequence:

  state: y_0..y_{M-1} (y_0 from the prefill, exact; the rest guesses); S: the first S tokens are
  settled (final); F: the inputs y_0..y_{F-1} have their keys in the cache.
  iteration: feed the inputs whose keys are missing and the W - 1 guesses after the settled
  ones, y[F : S + W - 1], at their positions (earlier keys come from the cache): the logits
  propose y[F + 1 : S + W], W of them for unsettled tokens. The proposal for y_S is exact (its
  inputs are settled), and so is every next one while the guess before it was right: S becomes
  the first index i >= S whose proposal differs from the guess, plus one (S + W when none
  does). The proposals replace the unsettled guesses (the Jacobi update); F becomes the first
  fed input that changed. Without early exit F = S - 1, so a forward is W tokens wide.

Each iteration settles at least one token, so plain Jacobi never runs more forwards than greedy
decoding (at most M - 1), and its output is greedy's token for token: only exact tokens settle.
A row is done when END is among its settled tokens or all M are; rows stop independently.

Early exit (CEED-VLA's rule on a window). When the minimum over the window's proposals (all of
them; with ``exit_over="unsettled"`` those from y_S on) of the max token probability reaches
sigma, the proposals are accepted as they stand (S = S + W) and the window slides on; with a
window that covers the rest of the sequence (W >= M - 1) that ends decoding, the paper's rule.
The next forward writes the accepted tokens' keys (from F, the first that changed) and proposes
W more: it is wider than W by the tokens accepted.

Rows of a batch share the forward's width (the widest row's; a narrower one feeds more guesses).
Its start is clamped so it never passes the cache's room (the last token is never an input);
near the end it re-feeds settled inputs, whose keys come out the same. With W = M - 1 and no
END the states are ``jacobi.jacobi_solve``'s, iteration for iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vlarun.accel.jacobi_contract import JacobiConfig, JacobiResult, fixed_counts, min_confidence
from vlarun.models.fast_head import pad_after_end
from vlarun.models.static_step import check_room
from vlarun.models.vla import VLA, PrefillResult

# (tokens (B, W), index (B, W)) -> logits (B, W, V): the distribution of the token after each
# input, the inputs being tokens y[index] (token i sits at position next_pos + i).
WindowStep = Callable[[Tensor, Tensor], Tensor]


def _first(mask: Tensor, values: Tensor, default: Tensor) -> Tensor:
    """(B,) each row's entry of ``values`` (B, W) at its first True of ``mask``, else
    ``default``."""
    at = mask.int().argmax(1, keepdim=True)
    return torch.where(mask.any(1), values.gather(1, at)[:, 0], default)


def _finished(y: Tensor, settled: Tensor, end_id: int | None) -> Tensor:
    """(B,) rows whose settled tokens hold END, or that settled all of theirs."""
    m = y.shape[1]
    done = settled >= m
    if end_id is None:
        return done
    inside = torch.arange(m, device=y.device)[None] < settled[:, None]
    return done | ((y == end_id) & inside).any(1)


def window_solve(
    first_logits: Tensor,
    step: WindowStep,
    init: Tensor,
    cfg: JacobiConfig | None = None,
    window: int = 8,
    end_id: int | None = None,
) -> JacobiResult:
    """Slide a ``window`` of Jacobi guesses over ``init`` (B, M) until every row is done, or
    ``cfg.max_iters`` forwards ran (rows still going return their state as it stands).

    first_logits (B, V): the distribution of y_0, from the prefill. The result's tokens are cut
    after the longest code (END-padded after each row's END); its trajectory is (B, K + 1, M)."""
    cfg = cfg or JacobiConfig()
    b, m = init.shape
    if m < 2:
        raise ValueError(f"a window needs a sequence of >= 2 tokens, got {m}")
    dev = init.device
    w = max(1, min(window, m - 1))
    y = init.clone()
    y[:, 0] = first_logits.argmax(-1)
    settled = torch.ones(b, dtype=torch.long, device=dev)
    fed = torch.zeros(b, dtype=torch.long, device=dev)
    active = ~_finished(y, settled, end_id)
    iterations = torch.zeros(b, dtype=torch.long, device=dev)
    exited = torch.zeros(b, dtype=torch.bool, device=dev)
    confidence = min_confidence(first_logits[:, None])
    states = [y]
    cap = m - 1 if cfg.max_iters is None else min(cfg.max_iters, m - 1)
    for _ in range(cap):
        if not bool(active.any()):
            break
        # y[F : S + W - 1]: keys to write, then W - 1 guesses (S - F = 1 without exits)
        t = min(int((settled - fed)[active].max()) + w - 1, m - 1)
        start = fed.clamp(max=m - 1 - t)
        idx = start[:, None] + torch.arange(t, device=dev)  # (B, T) indices of the inputs
        inputs = y.gather(1, idx)
        logits = step(inputs, idx)  # proposals for indices idx + 1
        new, out = logits.argmax(-1), idx + 1
        guess = y.gather(1, out)
        open_ = out >= settled[:, None]  # proposals for tokens not settled yet
        wrong = open_ & (new != guess)
        last = start + t  # the last proposal's index
        reach = _first(wrong, out, last) + 1  # settled through the first wrong proposal
        probs = logits.float().softmax(-1).amax(-1)  # (B, W)
        tested = open_ if cfg.exit_over == "unsettled" else torch.ones_like(open_)
        conf = torch.where(tested, probs, torch.ones_like(probs)).amin(1)
        exit_here = torch.zeros_like(active)
        if cfg.sigma is not None:
            exit_here = (conf >= cfg.sigma) & (reach <= last) & active
        reach = torch.where(exit_here, last + 1, reach)
        y_new = y.scatter(1, out, torch.where(open_, new, guess))
        changed = y_new.gather(1, idx) != inputs
        fed_new = _first(changed, idx, last)
        y = torch.where(active[:, None], y_new, y)
        settled = torch.where(active, reach.clamp(max=m), settled)
        fed = torch.where(active, fed_new, fed)
        confidence = torch.where(active, conf, confidence)
        iterations += active
        exited |= exit_here
        active &= ~_finished(y, settled, end_id)
        states.append(y)
    trajectory = torch.stack(states, dim=1)  # (B, K + 1, M)
    converged = ~active & ~exited
    tokens = y
    if end_id is not None:
        tokens = pad_after_end(y, end_id)
        length = int((tokens != end_id).sum(1).max()) + 1  # the longest code, END included
        tokens = tokens[:, : min(length, m)]
    # Tokens after the output (guesses past END) never settle: they are not counted.
    fixed = fixed_counts(trajectory[:, :, : tokens.shape[1]])
    return JacobiResult(tokens, iterations, converged, exited, confidence, fixed, trajectory)


@torch.no_grad()
def window_decode(
    model: VLA,
    pre: PrefillResult,
    init: Tensor,
    cfg: JacobiConfig | None = None,
) -> JacobiResult:
    """Window-Jacobi-decode a FAST model's code after a prefill; init (B, M) the guesses
    (``jacobi.initial_state``); the window is ``cfg.window`` or the config's
    ``decode_tokens``."""
    cfg, fast = cfg or JacobiConfig(), model.cfg.fast
    if fast is None:
        raise ValueError(f"{model.cfg.name} decodes a fixed number of tokens: use jacobi_decode")
    lm = model.language_model
    check_room(pre.cache, lm, pre.next_pos + fast.max_tokens - 2)
    first = lm.logits(pre.last_hidden)

    def step(tokens: Tensor, idx: Tensor) -> Tensor:
        positions = pre.next_pos[:, None] + idx
        return model.steps.iterate(lm, pre.cache, tokens, positions)  # (B, W, V)

    window = cfg.window or model.cfg.decode_tokens
    return window_solve(first, step, init.to(first.device), cfg, window, fast.end_id)
