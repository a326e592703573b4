"""`vlarun bench compile`: does ``torch.compile`` make vlarun's hot paths faster on this
machine? A compiled path is kept only where this measures it faster.

* steps: the static decode step (``static_step.decode_one``, what ``VLA.decode_tokens``
  runs), a Jacobi iteration over 7 tokens (``static_step.iterate_logits``) and the prefill of
  the engine benchmark's LM shapes, eager vs compiled (inductor with freezing; the steps with
  ``fullgraph=True`` and static shapes: one graph for every decode position), alternating
  after a warm-up round; checks the compiled step gives the same tokens;
* policies: whole-policy ``predict()`` of the tiny DiT and flow presets, eager vs compiled
  steps with the denoising included (``compile_steps("default", denoise=True)``); on the CPU
  this measured no faster, so ``Policy.load`` compiles the denoising steps only on CUDA.

Medians over ``--repeats`` after one warm-up round. Run it on a quiet machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from vlarun.config import opt

PARTS = ("steps", "policies")


@dataclass(frozen=True)
class BenchCompileOptions:
    """torch.compile against eager: the engine's decode / Jacobi / prefill steps on LM shapes,
    and whole-policy predict() of the tiny DiT and flow presets."""

    parts: tuple[str, ...] = opt(PARTS, "steps (LM shapes) and/or policies (tiny DiT, flow)")
    shapes: tuple[str, ...] = opt(("tiny", "1b"), "engine LM shapes of the steps part")
    policies: tuple[str, ...] = opt(("tiny-cogact", "tiny-pi0"), "policies of the policies part")
    repeats: int = opt(5, "timed rounds (after one warm-up round)")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown parts {unknown}; valid: {', '.join(PARTS)}")
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")


JACOBI_TOKENS = 7  # OpenVLA's action tokens: one Jacobi iteration rewrites them all


def _decode(one, model, cache, first, prompt_len: int) -> tuple[float, list[int]]:
    from vlarun.bench.engine import DECODE_TOKENS

    tok, toks = first, []
    t0 = time.perf_counter()
    for i in range(DECODE_TOKENS):
        tok = one(model, cache, tok, torch.tensor([prompt_len + i]))
        toks.append(int(tok))
    return (time.perf_counter() - t0) / DECODE_TOKENS, toks


def _iterate(many, model, cache, prompt_len: int) -> float:
    block = torch.arange(JACOBI_TOKENS)[None]
    pos = prompt_len + torch.arange(JACOBI_TOKENS)[None]
    t0 = time.perf_counter()
    many(model, cache, block, pos).argmax(-1).tolist()  # the host reads the tokens, as Jacobi does
    return time.perf_counter() - t0


def _prefill(forward, model, cache, ids) -> tuple[float, torch.Tensor]:
    cache.reset()
    t0 = time.perf_counter()
    out = forward(model.embed(ids), torch.arange(ids.shape[1]), cache)
    tok = model.logits(out.hidden[:, -1]).argmax(-1)
    return time.perf_counter() - t0, tok


def probe(shape: str, repeats: int) -> dict:
    """Eager vs compiled prefill, decode step and Jacobi iteration of one engine LM shape."""
    import torch._inductor.config as inductor_config

    from vlarun.bench.engine import DECODE_TOKENS, PREFILL_TOKENS, SHAPES, build_pair
    from vlarun.models.static_step import compile_steps, decode_one, iterate_logits

    cache_len = PREFILL_TOKENS + DECODE_TOKENS + JACOBI_TOKENS + 1  # sized to the request
    _, ours = build_pair(SHAPES[shape], torch.float32)
    ours.eval()
    ids = torch.randint(
        0, SHAPES[shape].vocab_size, (1, PREFILL_TOKENS), generator=torch.Generator().manual_seed(0)
    )
    # Freezing: weights become constants, which inductor's oneDNN linear lowering requires
    # (the engine prepacks them for oneDNN; without freezing the lowering asserts).
    inductor_config.freezing = True
    steps = compile_steps("default")
    variants = {
        "eager": (ours, decode_one, iterate_logits),
        "compiled": (torch.compile(ours, dynamic=False), steps.one, steps.iterate),
    }
    t0 = time.perf_counter()
    with torch.no_grad():  # compile every graph once
        forward, one, many = variants["compiled"]
        cache = ours.new_cache(1, cache_len)
        _, tok = _prefill(forward, ours, cache, ids)
        _decode(one, ours, cache, tok, PREFILL_TOKENS)
        _iterate(many, ours, cache, PREFILL_TOKENS)
    compile_s = time.perf_counter() - t0
    kinds = ("prefill", "decode", "jacobi_iteration")
    times = {n: {k: [] for k in kinds} for n in variants}
    tokens = {}
    with torch.no_grad():
        for r in range(repeats + 1):
            for name, (forward, one, many) in variants.items():
                cache = ours.new_cache(1, cache_len)
                p, tok = _prefill(forward, ours, cache, ids)
                d, toks = _decode(one, ours, cache, tok, PREFILL_TOKENS)
                j = _iterate(many, ours, cache, PREFILL_TOKENS)
                tokens[name] = toks
                if r:  # the first round warms both
                    for k, v in zip(kinds, (p, d, j), strict=True):
                        times[name][k].append(v * 1e3)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    return {
        "shape": shape,
        "threads": torch.get_num_threads(),
        "compile_s": compile_s,
        "ms": med,
        "speedup": {k: med["eager"][k] / med["compiled"][k] for k in kinds},
        "jacobi_over_decode": {n: med[n]["jacobi_iteration"] / med[n]["decode"] for n in med},
        "same_tokens": tokens["eager"] == tokens["compiled"],
    }


def policy_probe(name: str, repeats: int) -> dict:
    """Eager vs compiled (denoising included) ``predict()`` of one policy."""
    import numpy as np
    import torch._inductor.config as inductor_config

    from vlarun.models.static_step import compile_steps
    from vlarun.policy.base import Policy

    inductor_config.freezing = True
    eager, comp = Policy.load(name), Policy.load(name)
    comp.model.steps = compile_steps("default", denoise=True)
    size, n = eager.model.cfg.image_size, eager.model.cfg.num_images
    fr = np.random.default_rng(0).integers(0, 255, (n, size, size, 3), dtype=np.uint8)
    img = fr if n > 1 else fr[0]
    t0 = time.perf_counter()
    comp.predict(img, "open the drawer")
    compile_s = time.perf_counter() - t0
    ts: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(repeats + 1):
        for k, p in (("eager", eager), ("compiled", comp)):
            t = time.perf_counter()
            p.predict(img, "open the drawer")
            if r:  # the first round warms both
                ts[k].append((time.perf_counter() - t) * 1e3)
    m = {k: statistics.median(v) for k, v in ts.items()}
    same = bool(np.allclose(eager.predict(img, "x"), comp.predict(img, "x"), atol=1e-4))
    return {
        "policy": name,
        "ms": m,
        "speedup": m["eager"] / m["compiled"],
        "compile_s": compile_s,
        "same_actions": same,
    }


def run(o: BenchCompileOptions) -> dict:
    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": [probe(s, o.repeats) for s in o.shapes] if "steps" in o.parts else [],
        "policies": [policy_probe(p, o.repeats) for p in o.policies]
        if "policies" in o.parts
        else [],
    }


def show(r: dict) -> None:
    for x in r["rows"]:
        e, c, s = x["ms"]["eager"], x["ms"]["compiled"], x["speedup"]
        print(
            f"{x['shape']} fp32 ({x['threads']} threads, {r['date']}): prefill "
            f"{e['prefill']:.1f} -> {c['prefill']:.1f} ms ({s['prefill']:.2f}x), decode "
            f"{e['decode']:.2f} -> {c['decode']:.2f} ms/token ({s['decode']:.2f}x), Jacobi "
            f"iteration {e['jacobi_iteration']:.2f} -> {c['jacobi_iteration']:.2f} ms "
            f"({s['jacobi_iteration']:.2f}x); compile {x['compile_s']:.0f} s; "
            f"same tokens: {x['same_tokens']}"
        )
    for x in r["policies"]:
        print(
            f"{x['policy']} predict ({r['threads']} threads): {x['ms']['eager']:.1f} -> "
            f"{x['ms']['compiled']:.1f} ms ({x['speedup']:.2f}x); compile "
            f"{x['compile_s']:.0f} s; same actions: {x['same_actions']}"
        )


OPTIONS = {"bench-compile": BenchCompileOptions}
RUN = {"bench-compile": run}
SHOW = {"bench-compile": show}
