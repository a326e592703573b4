#!/usr/bin/env python3
"""What this CPU does fast: fp32 vs bf16 matmul GFLOP/s, and the time of one behaviour-cloning
step of the deep MT10 trunk (batch 16, all three heads, AdamW) in fp32 and bf16 autocast.

    .venv/bin/python scripts/cpu-probe.py [--threads N]   (prints one JSON object)

Run it on a quiet machine; the numbers decide whether to train in bf16 (``vlarun train --bf16``)
or fp32 (``--no-bf16``) here.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from vlarun.sim.bc_model import Batch, MultiHeadBC


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 3) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def train_step_s(bf16: bool, steps: int = 3) -> float:
    torch.manual_seed(0)
    model = MultiHeadBC("mt10")
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    cfg, b = model.cfg, 16
    batch = Batch(torch.rand(b, cfg.num_images, 3, 128, 128), [[5, 6, 7, 8, 9, 10]] * b,
                  torch.rand(b, 4, 4) * 2 - 1, torch.randn(b, cfg.proprio_dim))  # fmt: skip

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(batch).total
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up
    return min(_timed(step) for _ in range(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-bf16-step", action="store_true", help="bf16 steps can take minutes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = {
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "matmul_gflops_fp32": round(matmul_gflops(torch.float32), 1),
        "matmul_gflops_bf16": round(matmul_gflops(torch.bfloat16), 1),
        "mt10_train_step_s_fp32": round(train_step_s(False), 2),
    }
    if not args.skip_bf16_step:
        out["mt10_train_step_s_bf16"] = round(train_step_s(True), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
