"""An accelerator setting as data: what a plan names, what crosses the wire, what builds hooks.

The scheduler's plans name knob values (``sched.plans``: token_budget, cache_interval,
early_exit_sigma, layers_kept); the robot and the edge must both turn the same values into the
same hooks, whichever side each stage runs on. ``AccelSetting`` is that value: frozen,
validated, sent in a request's ``meta["setting"]`` as a small map, and ``hooks(family)`` makes
the stage hooks from it (``stages.hooks.Hooks``), the one way either side does; in process,
``Policy.with_setting(setting)`` runs a policy under it.

  AccelSetting.parse("triage:0.34")           TRIAGE recomputing 34% of the visual tokens
  AccelSetting.parse("exit:0.5")              Jacobi decoding with early exit at sigma 0.5
  AccelSetting.parse("triage:0.18+cache:2")   knobs joined by "+"
  AccelSetting.parse("int8")                  weight-only int8 LM and action head

``layers_kept`` is a model transform (the pruned model has other weights), not a hook: a
setting with layers_kept < 1 is refused here until the runtime can load pruned weights.
``weights="int8"`` is a model transform too (``transforms.int8``), but one made from the
checkpoint's own weights in one pass, so ``Policy.with_setting`` applies it in process; the
stage hooks cannot express it, so ``hooks`` (what the runtime's robot and edge call) refuses it
until the runtime holds the quantised model. The plan space names it (knob ``weights`` in
``sched.plans``, priced as int8 bytes streamed and held; its accuracy cost is unmeasured), and
the runtime's scheduler leaves it out (``runtime.costview.RUNTIME_REFUSES``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from vlarun.accel.feature_cache import every_n_steps
from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder
from vlarun.policy.methods import BUDGETLESS, METHODS, token_policy
from vlarun.stages.hooks import Hooks

# Token policies a budget can run with (efficientvla's token selection is stateless per step,
# the others keep the KV cache across steps; all are hooks).
TOKEN_METHODS = tuple(m for m in METHODS if m not in BUDGETLESS)
# Which families each knob applies to (as the plan space's KNOB_FAMILIES).
FAMILIES = {
    "token_budget": ("autoregressive", "parallel", "diffusion", "flow"),
    "cache_interval": ("diffusion", "flow"),
    "early_exit_sigma": ("autoregressive",),
    "weights": ("autoregressive", "parallel", "diffusion", "flow"),
}
# How the LM's and the action head's weights are stored: the checkpoint's dtype, or int8.
WEIGHTS = ("native", "int8")


@dataclass(frozen=True)
class AccelSetting:
    """Knob values of one request. The identity (every default) is plain inference.

    token_budget: fraction of visual tokens recomputed each step (1.0: all), by ``token_method``;
    cache_interval: DiT / flow-expert features recomputed every N denoising steps (1: always);
    early_exit_sigma: Jacobi decoding with CEED's early exit at this confidence (None: greedy
        autoregressive decoding);
    weights: "native" (the checkpoint's dtype) or "int8" (``transforms.int8``: weight-only
        per-channel int8 of the LM's and the action head's projections)."""

    token_budget: float = 1.0
    token_method: str = "triage"
    cache_interval: int = 1
    early_exit_sigma: float | None = None
    weights: str = "native"

    def __post_init__(self) -> None:
        if not (isinstance(self.token_budget, int | float) and 0.0 < self.token_budget <= 1.0):
            raise ValueError(f"token_budget must be in (0, 1], got {self.token_budget!r}")
        if self.token_method not in TOKEN_METHODS:
            raise ValueError(
                f"token_method must be one of {TOKEN_METHODS}, got {self.token_method!r}"
            )
        if not (isinstance(self.cache_interval, int) and 1 <= self.cache_interval <= 100):
            raise ValueError(
                f"cache_interval must be an integer in 1..100, got {self.cache_interval!r}"
            )
        s = self.early_exit_sigma
        if s is not None and not (isinstance(s, int | float) and 0.0 < s <= 1.0):
            raise ValueError(f"early_exit_sigma must be in (0, 1] or None, got {s!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")

    # -- what it is ------------------------------------------------------------------------------

    @property
    def identity(self) -> bool:
        return (
            self.token_budget == 1.0
            and self.cache_interval == 1
            and self.early_exit_sigma is None
            and self.weights == "native"
        )

    @property
    def key(self) -> tuple:
        """Hashable and equal for equal settings (the method matters only under a budget)."""
        method = self.token_method if self.token_budget < 1.0 else None
        return (self.token_budget, method, self.cache_interval, self.early_exit_sigma, self.weights)

    def stateful_stages(self, family: str) -> dict[str, str]:
        """Stage -> hook part whose state carries from one control step to the next: the token
        policy keeps the KV cache of the stage that runs the prefill; the Jacobi decoder its
        random generator (and warm start). The feature cache is made afresh per inference."""
        out = {}
        if self.token_budget < 1.0:
            out["prefill_head" if family == "parallel" else "prefill"] = "tokens"
        if self.early_exit_sigma is not None:
            out["decode"] = "decoder"
        return out

    def check_family(self, family: str) -> None:
        """Raise ValueError naming each knob that does not apply to ``family``."""
        bad = [
            k
            for k, fams in FAMILIES.items()
            if getattr(self, k) != getattr(AccelSetting, k) and family not in fams
        ]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} {'does' if len(bad) == 1 else 'do'} not apply to a {family} "
                f"policy ({', '.join(f'{k}: {FAMILIES[k]}' for k in bad)})"
            )

    def hooks(self, family: str, calibration: dict | None = None) -> Hooks | None:
        """Fresh hooks (own state) running this setting on a ``family`` policy with the
        checkpoint's ``calibration`` (``Policy.calibration``); None: plain. Int8 weights are a
        model transform, not a hook: refused here (``Policy.with_setting`` applies them)."""
        self.check_family(family)
        if self.weights != "native":
            raise ValueError(
                f"weights={self.weights} is a model transform the stage hooks cannot run "
                "(Policy.with_setting applies it in process; the runtime does not yet)"
            )
        if self.identity:
            return None
        tokens = None
        if self.token_budget < 1.0:
            tokens = token_policy(self.token_method, self.token_budget, calibration)
        decoder = None
        if self.early_exit_sigma is not None:
            # A distilled student decodes from the guesses it was distilled from (its
            # checkpoint's calibration says which); others from random ones, as the paper.
            init = (calibration or {}).get("jacobi", {}).get("init", "random")
            decoder = JacobiDecoder(JacobiConfig(sigma=float(self.early_exit_sigma), init=init))
        cache = every_n_steps(self.cache_interval) if self.cache_interval > 1 else None
        return Hooks(tokens, decoder, cache)

    # -- conversions -----------------------------------------------------------------------------

    def to_meta(self) -> dict:
        """The map a request carries (only what differs from the identity)."""
        default = AccelSetting()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @classmethod
    def from_meta(cls, meta: object) -> AccelSetting:
        """Parse a request's ``meta["setting"]``; ValueError names what is wrong."""
        if meta is None:
            return cls()
        if not isinstance(meta, dict):
            raise ValueError("setting must be a map")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in meta if k not in known)
        if unknown:
            raise ValueError(f"unknown setting keys {unknown[:4]}; known: {sorted(known)}")
        return cls(**meta)

    @classmethod
    def from_knobs(cls, knobs: dict, token_method: str = "triage") -> AccelSetting:
        """The setting an ExecutionPlan names (``plan.settings``: knob -> value). A knob the
        runtime cannot execute is refused, never silently dropped."""
        kept = knobs.get("layers_kept", 1.0)
        if kept is not None and kept != 1.0:
            raise ValueError(
                f"layers_kept={kept} is a model transform the runtime does not execute yet"
            )
        interval = knobs.get("cache_interval", 1)
        return cls(
            token_budget=float(knobs.get("token_budget", 1.0)),
            token_method=token_method,
            cache_interval=int(interval) if interval is not None else 1,
            early_exit_sigma=knobs.get("early_exit_sigma"),
            # Carried, not dropped: ``hooks`` refuses int8 where the runtime cannot run it.
            weights=knobs.get("weights", "native"),
        )

    def knobs(self) -> dict:
        """This setting as the plan space's knob map (the inverse of ``from_knobs``)."""
        return {
            "token_budget": self.token_budget,
            "cache_interval": self.cache_interval,
            "early_exit_sigma": self.early_exit_sigma,
            "weights": self.weights,
        }

    @classmethod
    def parse(cls, text: str) -> AccelSetting:
        """'full' | 'triage:0.34' | 'fastv:0.18' | 'exit:0.5' | 'cache:2' | 'int8', joined
        by '+'."""
        kw: dict = {}
        for part in filter(None, (p.strip() for p in text.split("+"))):
            name, _, value = part.partition(":")
            if name == "full" and not value:
                continue
            if name == "int8":
                if value:
                    raise ValueError(f"int8 takes no value (got {part!r}): write int8")
                kw["weights"] = "int8"
                continue
            if not value:
                raise ValueError(f"setting part {part!r} needs a value, e.g. triage:0.34")
            try:
                if name in TOKEN_METHODS:
                    kw.update(token_method=name, token_budget=float(value))
                elif name == "exit":
                    kw["early_exit_sigma"] = float(value)
                elif name == "cache":
                    kw["cache_interval"] = int(value)
                else:
                    raise ValueError(
                        f"unknown setting part {name!r}; "
                        f"use one of {TOKEN_METHODS}, exit, cache, int8"
                    )
            except ValueError as e:
                if "unknown setting" in str(e):
                    raise
                raise ValueError(f"bad value in setting part {part!r}") from None
        return cls(**kw)

    def __str__(self) -> str:
        parts = []
        if self.token_budget < 1.0:
            parts.append(f"{self.token_method}:{self.token_budget:g}")
        if self.early_exit_sigma is not None:
            parts.append(f"exit:{self.early_exit_sigma:g}")
        if self.cache_interval > 1:
            parts.append(f"cache:{self.cache_interval}")
        if self.weights != "native":
            parts.append(self.weights)
        return "+".join(parts) or "full"
