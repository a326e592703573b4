"""Does `torch.compile` make vlarun's CPU hot paths faster here? Times the static decode step
(``static_step.decode_one``, what ``VLA.decode_tokens`` runs), a Jacobi iteration over 7 tokens
(``static_step.iterate_logits``) and the prefill of the engine benchmark's LM shapes, eager vs
compiled (inductor with freezing; the steps with ``fullgraph=True`` and static shapes: one graph
for every decode position), in one run, alternating, after a warm-up round; checks the compiled
step gives the same tokens. Issue 21 keeps a compiled path only where this measures it faster.

    .venv/bin/python scripts/compile-probe.py [--shapes tiny 1b] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._inductor.config as inductor_config

from vlarun.bench.engine import DECODE_TOKENS, PREFILL_TOKENS, SHAPES, build_pair
from vlarun.models.static_step import compile_steps, decode_one, iterate_logits

JACOBI_TOKENS = 7  # OpenVLA's action tokens: one Jacobi iteration rewrites them all
CACHE_LEN = PREFILL_TOKENS + DECODE_TOKENS + JACOBI_TOKENS + 1  # sized to the request


def _decode(one, model, cache, first, prompt_len: int) -> tuple[float, list[int]]:
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
    _, ours = build_pair(SHAPES[shape], torch.float32)
    ours.eval()
    ids = torch.randint(0, SHAPES[shape].vocab_size, (1, PREFILL_TOKENS),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
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
        cache = ours.new_cache(1, CACHE_LEN)
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
                cache = ours.new_cache(1, CACHE_LEN)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "1b"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [probe(s, a.repeats) for s in a.shapes]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if a.json:
        print(json.dumps({"date": stamp, "torch": torch.__version__, "rows": rows}))
        return
    for r in rows:
        e, c = r["ms"]["eager"], r["ms"]["compiled"]
        print(f"{r['shape']} fp32 ({r['threads']} threads, {stamp}): prefill {e['prefill']:.1f} "
              f"-> {c['prefill']:.1f} ms ({r['speedup']['prefill']:.2f}x), decode "
              f"{e['decode']:.2f} -> {c['decode']:.2f} ms/token ({r['speedup']['decode']:.2f}x), "
              f"Jacobi iteration {e['jacobi_iteration']:.2f} -> {c['jacobi_iteration']:.2f} ms "
              f"({r['speedup']['jacobi_iteration']:.2f}x); "
              f"compile {r['compile_s']:.0f} s; same tokens: {r['same_tokens']}")  # fmt: skip


if __name__ == "__main__":
    main()
