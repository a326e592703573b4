"""Does `torch.compile` make vlarun's CPU hot paths faster here? Times the one-token decode step
and the prefill of the engine benchmark's LM shapes, eager vs compiled (inductor, freezing, static
shapes: vlarun's cache attends to its filled part only, so each decode position is a graph), in one
run, alternating, after warm-up; checks the compiled step gives the same tokens. Issue 21 keeps
a compiled path only where this measures it faster.

    .venv/bin/python scripts/compile-probe.py [--shapes tiny 1b] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._inductor.config as inductor_config

from vlarun.bench.engine import CACHE_LEN, DECODE_TOKENS, PREFILL_TOKENS, SHAPES, build_pair

# Static shapes: one graph per (prompt length, decode position), at most 1 + DECODE_TOKENS per
# task (a VLA's prompt length is fixed by its task; its decode positions repeat every
# inference). dynamic=True fails in inductor here (torch 2.13: a NameError in generated code).
DYNAMIC = False


def _decode(model, cache, first, prompt_len: int) -> tuple[float, list[int]]:
    tok, toks = first, []
    t0 = time.perf_counter()
    for i in range(DECODE_TOKENS):
        out = model(model.embed(tok), torch.tensor([prompt_len + i]), cache)
        tok = model.logits(out.hidden).argmax(-1)
        toks.append(int(tok))
    return (time.perf_counter() - t0) / DECODE_TOKENS, toks


def _prefill(model, cache, ids) -> tuple[float, torch.Tensor]:
    cache.reset()
    t0 = time.perf_counter()
    out = model(model.embed(ids), torch.arange(ids.shape[1]), cache)
    tok = model.logits(out.hidden[:, -1:]).argmax(-1)
    return time.perf_counter() - t0, tok


def probe(shape: str, repeats: int) -> dict:
    _, ours = build_pair(SHAPES[shape], torch.float32)
    ours.eval()
    ids = torch.randint(0, SHAPES[shape].vocab_size, (1, PREFILL_TOKENS),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    # Freezing: weights become constants, which inductor's oneDNN linear lowering requires
    # (the engine prepacks them for oneDNN; without freezing the lowering asserts).
    inductor_config.freezing = True
    compiled = torch.compile(ours, dynamic=DYNAMIC)
    t0 = time.perf_counter()
    with torch.no_grad():
        cache = ours.new_cache(1, CACHE_LEN)
        _, tok = _prefill(compiled, cache, ids)
        _decode(compiled, cache, tok, PREFILL_TOKENS)
    compile_s = time.perf_counter() - t0
    times = {"eager": {"prefill": [], "decode": []}, "compiled": {"prefill": [], "decode": []}}
    tokens = {}
    with torch.no_grad():
        for r in range(repeats + 1):
            for name, m in (("eager", ours), ("compiled", compiled)):
                cache = ours.new_cache(1, CACHE_LEN)
                p, tok = _prefill(m, cache, ids)
                d, toks = _decode(m, cache, tok, PREFILL_TOKENS)
                tokens[name] = toks
                if r:  # the first round warms both
                    times[name]["prefill"].append(p * 1e3)
                    times[name]["decode"].append(d * 1e3)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    return {
        "shape": shape,
        "threads": torch.get_num_threads(),
        "compile_s": compile_s,
        "ms": med,
        "speedup": {k: med["eager"][k] / med["compiled"][k] for k in ("prefill", "decode")},
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
              f"{e['decode']:.2f} -> {c['decode']:.2f} ms/token ({r['speedup']['decode']:.2f}x); "
              f"compile {r['compile_s']:.0f} s; same tokens: {r['same_tokens']}")  # fmt: skip


if __name__ == "__main__":
    main()
