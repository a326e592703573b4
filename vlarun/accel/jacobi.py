"""Jacobi decoding of action tokens, with CEED-VLA's early exit (SEEDS.md section 4).

Greedy decoding of n action tokens y_1..y_n is n - 1 sequential one-token forwards after the
prefill. Jacobi decoding treats it as the fixed-point system

    y_i = argmax_y p(y | y_<i, x),   i = 1..n

and updates every y_i at once from the previous guess: one forward over the n - 1 positions
[y_1, ..., y_{n-1}] (causal among themselves, on top of the prefix KV cache) gives the logits of
y_2..y_n. y_1 needs no iteration: it comes from the prefill's last hidden state. The prefix
(image + instruction) is computed once per control step; only action positions are rewritten,
always at the same cache slots. An iteration after the first recomputes only from the first
input that changed: earlier inputs' keys and logits are functions of unchanged tokens (causal
attention), so they are kept from the iteration that computed them.

Exactness. After k iterations at least y_1..y_{k+1} equal the greedy tokens (each iteration fixes
one more token from the left), so after n - 1 iterations the state *is* the greedy output and no
confirming iteration is needed: plain Jacobi never runs more forwards than greedy does. It stops
earlier when an iteration changes nothing (a fixed point, which is unique: greedy's).

Early exit (CEED-VLA). With sigma set, an iteration whose tokens all have max probability
>= sigma - the minimum over action tokens of the max token probability, y_1's included - ends
decoding and returns that iteration's argmax tokens, converged or not. ``exit_over="unsettled"``
(not in the paper) takes that minimum only over the tokens not yet guaranteed greedy: after k
iterations y_1..y_{k+1} are exact whatever their confidence, and on a distilled student the
least confident token is most often one of the first action's (BENCHMARKS.md), which the
paper's rule waits on although Jacobi has already settled it.

A forced prefix (real-time chunking's frozen actions, ``forced`` as ``VLA.decode_tokens``
takes it) is never iterated on: one forward writes its keys and gives the first free token's
distribution, which plays the prefill's part; the system above is then the free tokens', and
so are the iterations, the exit rule and its confidence.

Batches: rows stop independently (their tokens are frozen, their statistics say when); the batch
runs until every row has stopped. Rows decode at their own positions after right-padded prompts,
as ``VLA.decode_tokens`` does, so a row's output does not depend on its batch mates.

A FAST model's code has no fixed length: ``jacobi_decode`` hands it to ``jacobi_window`` (a
window of guesses that slides as tokens settle, stopping at END). The settings and the result
both solvers share are ``jacobi_contract``'s (re-exported here).

  from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder
  fast = policy.with_hooks(decoder=JacobiDecoder(JacobiConfig(sigma=0.5)))
  fast.predict(image, "open the drawer"); fast.hooks.decoder.summary()
  (a setting names the same decoder: ``policy.with_setting("exit:0.5")``)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from vlarun.accel.jacobi_contract import (  # noqa: F401 (INITS, EXIT_OVER: re-exported)
    EXIT_OVER,
    INITS,
    JacobiConfig,
    JacobiResult,
    fixed_counts,
    min_confidence,
)
from vlarun.accel.jacobi_window import window_decode
from vlarun.models.fast_head import code_lengths
from vlarun.models.static_step import check_room
from vlarun.models.vla import VLA, PrefillResult

# ---------------------------------------------------------------------------------------------
# The rule and the loop (model-free: ``step`` maps action inputs to the next tokens' logits)


def should_exit(logits: Tensor, sigma: float | None) -> Tensor:
    """(B,) bool: CEED-VLA's early-exit rule, min_i max_r p(r | y_<i) >= sigma (the rule
    ``jacobi_solve`` applies with ``exit_over="all"``, from the same ``min_confidence``)."""
    if sigma is None:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    return min_confidence(logits) >= sigma


def exit_confidence(logits: Tensor, k: int, over: str = "all") -> Tensor:
    """(B, n, V) logits of iteration k -> (B,): the minimum confidence the exit rule tests; with
    ``over="unsettled"`` only over y_{k+2}..y_n (1 when none is left)."""
    if over == "all":
        return min_confidence(logits)
    rest = logits[:, k + 1 :]
    if rest.shape[1] == 0:
        return torch.ones(logits.shape[0], device=logits.device)
    return min_confidence(rest)


# (y[:, start : n - 1], start) -> logits (B, n - 1 - start, V) of y[:, start + 1 :]: the
# forward over the action inputs from index ``start`` on (earlier ones are unchanged).
Step = Callable[[Tensor, int], Tensor]


def jacobi_solve(
    first_logits: Tensor, step: Step, init: Tensor, cfg: JacobiConfig | None = None
) -> JacobiResult:
    """Iterate ``step`` from ``init`` (B, n) until each row converges, exits or hits the cap.

    first_logits (B, V): the distribution of y_1 (from the prefill), fixed for the whole solve;
    cfg: default ``JacobiConfig()``.
    """
    cfg = cfg or JacobiConfig()
    b, n = init.shape
    y = init.clone()
    y[:, 0] = first_logits.argmax(-1)
    active = torch.ones(b, dtype=torch.bool, device=y.device)
    iterations = torch.zeros(b, dtype=torch.long, device=y.device)
    converged = torch.zeros_like(active) if n > 1 else active.clone()
    exited = torch.zeros_like(active)
    confidence = min_confidence(first_logits[:, None])
    states = [y]  # y is never written in place from here on
    cap = n - 1 if cfg.max_iters is None else min(cfg.max_iters, n - 1)
    # Row i: the distribution of y_{i+1} from the iteration that last computed it (rows before
    # a recompute's start stay valid: their inputs did not change).
    logits = first_logits.new_empty(b, n, first_logits.shape[-1])
    logits[:, 0] = first_logits
    fed = None  # the state whose inputs the cached action keys were computed from
    for k in range(1, cap + 1):
        start = 0 if fed is None else first_change(fed[:, :-1], y[:, :-1])
        if start < n - 1:
            logits[:, start + 1 :] = step(y[:, start:-1], start)
        fed = y  # never written in place: each iteration makes a new ``y``
        new = logits.argmax(-1)
        # After k iterations y_1..y_{k+1} are greedy's: at k = n - 1 the state is the output.
        done_here = (new == y).all(-1) | (k == n - 1)
        conf = exit_confidence(logits, k, cfg.exit_over)
        exit_here = conf >= cfg.sigma if cfg.sigma is not None else torch.zeros_like(active)
        exit_here &= ~done_here
        confidence = torch.where(active, conf, confidence)
        iterations += active
        y = torch.where(active[:, None], new, y)
        converged |= active & done_here
        exited |= active & exit_here
        active &= ~(done_here | exit_here)
        states.append(y)
        if not bool(active.any()):
            break
    trajectory = torch.stack(states, dim=1)  # (B, K + 1, n)
    return JacobiResult(
        y, iterations, converged, exited, confidence, fixed_counts(trajectory), trajectory
    )


def first_change(before: Tensor, after: Tensor) -> int:
    """First column where any row of (B, m) ``after`` differs from ``before`` (m if none).

    Causal attention makes the keys and logits of inputs before it functions of unchanged
    tokens only, so an iteration recomputes from there on; the result is the same as a full
    recompute (the skipped keys are the cached ones it would have rewritten identically)."""
    changed = (before != after).any(0).nonzero()
    return int(changed[0]) if len(changed) else after.shape[1]


# ---------------------------------------------------------------------------------------------
# On a VLA's prefix cache


def guess_ids(model: VLA) -> range:
    """The LM ids an action token can be: the 256 bins, or a FAST model's FAST ids."""
    c = model.cfg
    return (
        c.fast.lm_range(c.llm.vocab_size)
        if c.fast is not None
        else model.action_tokenizer.action_ids
    )


def initial_state(
    model: VLA, first: Tensor, cfg: JacobiConfig, gen: torch.Generator | None = None
) -> Tensor:
    """(B, n) initial guess after y_1 = ``first`` (B,): random action ids, or y_1 repeated;
    n = every token the model can decode (a FAST model: its cap on the code).

    ("previous" needs the previous output, which only a ``JacobiDecoder`` keeps: here it falls
    back to random ids, as on an episode's first step.)"""
    n = model.cfg.action_token_room
    if cfg.init == "repeat":
        return first[:, None].expand(-1, n).clone()
    gen = gen if gen is not None else torch.Generator().manual_seed(cfg.seed)
    ids = guess_ids(model)
    init = torch.randint(ids.start, ids.stop, (first.shape[0], n), generator=gen)
    return init.to(first.device)


def action_step(model: VLA, pre: PrefillResult, offset: int = 0) -> Step:
    """Logits of y[:, start + 1 :] from inputs y[:, start : n - 1], written at their action
    slots of ``pre.cache``; y are the action tokens from index ``offset`` on (the ones after a
    forced prefix of that many, whose keys are already in the cache), so n = the model's action
    tokens - offset.

    Calls rewrite action slots in place (a slot's old keys are overwritten, never attended to:
    the call's own slots follow its causal mask); slots before ``start`` keep the keys of
    unchanged inputs from an earlier call, and the queries attend to them from the cache."""
    lm = model.language_model
    n = model.cfg.num_action_tokens - offset
    first = pre.next_pos + offset
    positions = first[:, None] + torch.arange(n - 1, device=pre.next_pos.device)[None]
    if n > 1:
        check_room(pre.cache, lm, positions[:, -1])

    def step(tokens: Tensor, start: int = 0) -> Tensor:
        pos = positions[:, start : start + tokens.shape[1]]
        return model.steps.iterate(lm, pre.cache, tokens, pos)  # (B, T, V), static shapes

    return step


@torch.no_grad()
def jacobi_decode(
    model: VLA,
    pre: PrefillResult,
    cfg: JacobiConfig | None = None,
    init: Tensor | None = None,
    gen: torch.Generator | None = None,
    forced: Tensor | None = None,
) -> JacobiResult:
    """Jacobi-decode the action tokens after a prefill (``cfg``: default ``JacobiConfig()``).
    init (B, n): the initial guess (default: ``cfg.init``, random ids drawn from ``gen``, or one
    seeded by ``cfg.seed``). A FAST model's variable-length code is decoded in a sliding window
    (``jacobi_window``).

    ``forced`` (B, m): the first m tokens are these ids, as ``VLA.decode_tokens`` takes them
    (real-time chunking's frozen actions, accel/rtc.py). They are not iterated on: one forward
    writes their keys (``VLA.first_free_logits``, the same as greedy's) and gives the
    distribution of token m, which plays the prefill's part for the n - m free tokens after
    them; Jacobi iterations, their statistics and the early-exit rule see only those, so the
    forced tokens come out verbatim and, without exit, the free ones are greedy's after the
    same prefix. ``init``'s first m columns are unused. (A FAST code takes no forced prefix:
    none of its prefixes stands for the first actions, and RTC refuses FAST models.)"""
    cfg = cfg or JacobiConfig()
    m = model.forced_width(pre, forced)
    if m and model.cfg.fast is not None:
        raise ValueError(
            f"{model.cfg.name} decodes a FAST code: Jacobi decoding takes no forced prefix of it"
        )
    if m == model.cfg.action_token_room:
        return settled(forced.to(pre.next_pos.device, torch.long))
    first = model.first_free_logits(pre, forced)
    if init is None:
        init = initial_state(model, first.argmax(-1), cfg, gen)
    if model.cfg.fast is not None:
        return window_decode(model, pre, init, cfg)
    r = jacobi_solve(first, action_step(model, pre, m), init[:, m:].to(first.device), cfg)
    return r if m == 0 else after_prefix(forced.to(r.tokens.device, torch.long), r)


def settled(tokens: Tensor) -> JacobiResult:
    """The result of a decode with nothing left to iterate: ``tokens`` (B, n), all forced."""
    b = tokens.shape[0]
    none = torch.zeros(b, dtype=torch.long, device=tokens.device)
    trajectory = tokens[:, None]
    return JacobiResult(
        tokens,
        none,
        none == 0,
        none != 0,
        torch.ones(b, device=tokens.device),
        fixed_counts(trajectory),
        trajectory,
    )


def after_prefix(forced: Tensor, r: JacobiResult) -> JacobiResult:
    """A solve of the free tokens ``r`` behind the ``forced`` (B, m) ones: the forced tokens
    lead its output and every state of its trajectory (fixed from the start, so ``fixed``
    counts them at k = 0); iterations, convergence, exits and confidence are the free
    tokens'."""
    k = r.trajectory.shape[1]
    trajectory = torch.cat((forced[:, None].expand(-1, k, -1), r.trajectory), dim=2)
    return JacobiResult(
        torch.cat((forced, r.tokens), dim=1),
        r.iterations,
        r.converged,
        r.exited,
        r.confidence,
        fixed_counts(trajectory),
        trajectory,
    )


def held_action(previous: Tensor, action_dim: int) -> Tensor:
    """(B, n) tokens of a chunk -> (B, n): its last action's tokens repeated over the chunk.

    The warm start of ``init="previous"``: the chunk was executed open loop, so the next chunk
    starts where it ended, and a held action is the guess that assumes nothing about motion."""
    last = previous[:, -action_dim:]
    return last.repeat(1, previous.shape[1] // action_dim)


# ---------------------------------------------------------------------------------------------
# Decoders: strategies a hooked Policy runs after the prefill


@dataclass
class DecodeStep:
    """Statistics of one decode call (one control step), per batch row."""

    tokens: int
    iterations: list[int]
    fixed_per_iteration: list[list[int]]  # tokens newly fixed at iteration 1..k of each row
    converged: list[bool]
    exited: list[bool]
    confidence: list[float]
    seconds: float


class GreedyDecoder:
    """Autoregressive greedy decoding (``VLA.decode_tokens``): n - 1 one-token forwards."""

    name = "ar"

    def __init__(self) -> None:
        self.steps: list[DecodeStep] = []

    def reset(self) -> None:
        pass

    def decode(self, model: VLA, pre: PrefillResult, forced: Tensor | None = None) -> Tensor:
        """``forced`` (B, m): a forced prefix of ids (``VLA.decode_tokens``); its one forward
        is not counted, as the prefill is not: a row's one-token forwards are those after
        token m."""
        t0 = time.perf_counter()
        ids = model.decode_tokens(pre, forced)
        n, b = ids.shape[1], ids.shape[0]
        m = 0 if forced is None else forced.shape[1]
        fast = model.cfg.fast  # a FAST row took one forward per token of its own code
        lengths = code_lengths(ids, fast.end_id).tolist() if fast is not None else [n] * b
        forwards = [max(k - 1 - m, 0) for k in lengths]
        self.steps.append(
            DecodeStep(
                n,
                forwards,
                [[1] * k for k in forwards],
                [True] * b,
                [False] * b,
                [float("nan")] * b,
                time.perf_counter() - t0,
            )
        )
        return ids

    def summary(self) -> dict:
        return summarise_steps(self.steps)


@dataclass
class JacobiDecoder:
    """Jacobi decoding (+ early exit when ``cfg.sigma`` is set) as a Policy's decoder hook
    (``Policy.with_hooks(decoder=...)``; ``with_setting("exit:0.5")`` makes one).

    Random initial guesses come from a generator reseeded by ``reset`` (each episode), so runs
    are reproducible. With ``cfg.init == "previous"`` the decoder remembers each call's output
    until ``reset`` and starts the next call from it (``held_action``). ``last`` is the latest
    call's full result (trajectory included)."""

    cfg: JacobiConfig = field(default_factory=JacobiConfig)
    steps: list[DecodeStep] = field(default_factory=list)
    last: JacobiResult | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._gen = torch.Generator().manual_seed(self.cfg.seed)

    @property
    def name(self) -> str:
        if self.cfg.sigma is None:
            return "jacobi"
        over = "" if self.cfg.exit_over == "all" else f"-{self.cfg.exit_over}"
        return f"jacobi-exit{over}@{self.cfg.sigma:g}"

    def reset(self) -> None:
        self._gen.manual_seed(self.cfg.seed)
        self.last = None

    def decode(self, model: VLA, pre: PrefillResult, forced: Tensor | None = None) -> Tensor:
        """``forced`` (B, m): a forced prefix of ids, not iterated on (``jacobi_decode``)."""
        t0 = time.perf_counter()
        init = self._warm_start(model, pre)
        r = jacobi_decode(model, pre, self.cfg, init=init, gen=self._gen, forced=forced)
        seconds = time.perf_counter() - t0
        self.steps.append(step_stats(r, seconds))
        self.last = r
        return r.tokens

    def summary(self) -> dict:
        return summarise_steps(self.steps)

    def _warm_start(self, model: VLA, pre: PrefillResult) -> Tensor | None:
        """The "previous" initial guess, or None (use ``cfg.init``) when there is none yet. A
        FAST code's tokens do not map to actions: its guess is the previous code itself,
        END-padded to the cap."""
        prev = self.last.tokens if self.last is not None else None
        if self.cfg.init != "previous" or prev is None or prev.shape[0] != pre.next_pos.shape[0]:
            return None
        fast = model.cfg.fast
        if fast is not None:
            pad = prev.new_full((prev.shape[0], fast.max_tokens - prev.shape[1]), fast.end_id)
            return torch.cat((prev, pad), dim=1)
        return held_action(prev, model.cfg.action_dim)


def step_stats(r: JacobiResult, seconds: float) -> DecodeStep:
    iters = r.iterations.tolist()
    fixed = [row[1 : k + 1] for row, k in zip(r.fixed.tolist(), iters, strict=True)]
    return DecodeStep(
        int(r.tokens.shape[1]),
        iters,
        fixed,
        r.converged.tolist(),
        r.exited.tolist(),
        r.confidence.tolist(),
        seconds,
    )


def summarise_steps(steps: list[DecodeStep]) -> dict:
    """Means over decode calls and rows: iterations (and how many rows took k = 1, 2, ...),
    tokens fixed per iteration, exits."""
    if not steps:
        return {"steps": 0}
    iters = np.array([k for s in steps for k in s.iterations], dtype=float)
    per_iter = [np.mean(f) for s in steps for f in s.fixed_per_iteration if f]
    rows = [(c, e) for s in steps for c, e in zip(s.converged, s.exited, strict=True)]
    secs = np.array([s.seconds for s in steps])
    tokens = np.array([s.tokens * len(s.iterations) for s in steps])
    speed = tokens / secs
    return {
        "steps": len(steps),
        "iterations_mean": float(iters.mean()),
        "iterations_max": int(iters.max()),
        "iterations_histogram": np.bincount(iters.astype(int))[1:].tolist(),
        "fixed_per_iteration_mean": float(np.mean(per_iter)) if per_iter else float("nan"),
        "converged_fraction": float(np.mean([c for c, _ in rows])),
        "exited_fraction": float(np.mean([e for _, e in rows])),
        "tokens_per_s_mean": float(speed.mean()),
        "tokens_per_s_min": float(speed.min()),
        "tokens_per_s_max": float(speed.max()),
    }


def make_decoder(
    method: str,
    sigma: float | None = None,
    seed: int = 0,
    exit_over: str = "all",
    max_iters: int | None = None,
    init: str = "random",
    window: int | None = None,
):
    """``ar`` (greedy), ``jacobi`` (to the fixed point: exact, so never capped) or
    ``jacobi-exit`` (needs sigma; its rule tests ``exit_over`` tokens; at most ``max_iters``
    iterations); both Jacobi decoders start from ``init`` guesses and iterate ``window`` of a
    FAST code's tokens at once (None: its expected length)."""
    if method == "ar":
        return GreedyDecoder()
    if method == "jacobi":
        return JacobiDecoder(JacobiConfig(seed=seed, init=init, window=window))
    if method == "jacobi-exit":
        if sigma is None:
            raise ValueError("jacobi-exit needs sigma")
        cfg = JacobiConfig(
            sigma=sigma,
            seed=seed,
            exit_over=exit_over,
            max_iters=max_iters,
            init=init,
            window=window,
        )
        return JacobiDecoder(cfg)
    raise ValueError(f"unknown decoder {method!r}; choose ar, jacobi or jacobi-exit")
