"""`vlarun bench cpu`: what this CPU does fast: fp32 vs bf16 matmul GFLOP/s, and the time of
one behaviour-cloning step of the deep MT10 trunk (batch 16, all three heads, AdamW) in fp32
and in bf16 autocast. The numbers decide whether to train in bf16 (``vlarun train --bf16``) or
in fp32 (``--no-bf16``) here. Run it on a quiet machine.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import torch

from vlarun.config import opt
from vlarun.sim.bc_model import Batch, MultiHeadBC


@dataclass(frozen=True)
class BenchCpuOptions:
    """fp32 vs bf16 on this CPU: matmul GFLOP/s and one MT10 behaviour-cloning step."""

    threads: int = opt(2, "torch threads")
    bf16_step: bool = opt(True, "also time the bf16 training step (can take minutes)")
    json: bool = opt(False, "print one JSON object")


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
    batch = Batch(
        torch.rand(b, cfg.num_images, 3, 128, 128),
        [[5, 6, 7, 8, 9, 10]] * b,
        torch.rand(b, 4, 4) * 2 - 1,
        torch.randn(b, cfg.proprio_dim),
    )

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(batch).total
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up
    return min(_timed(step) for _ in range(steps))


def run(o: BenchCpuOptions) -> dict:
    torch.set_num_threads(o.threads)
    out = {
        "cpu": platform.processor() or platform.machine(),
        "threads": o.threads,
        "torch": torch.__version__,
        "matmul_gflops_fp32": round(matmul_gflops(torch.float32), 1),
        "matmul_gflops_bf16": round(matmul_gflops(torch.bfloat16), 1),
        "mt10_train_step_s_fp32": round(train_step_s(False), 2),
    }
    if o.bf16_step:
        out["mt10_train_step_s_bf16"] = round(train_step_s(True), 2)
    return out


def show(r: dict) -> None:
    bf16 = r.get("mt10_train_step_s_bf16")
    step = f", bf16 {bf16:.2f} s" if bf16 is not None else ""
    print(
        f"{r['cpu']} ({r['threads']} threads): matmul fp32 {r['matmul_gflops_fp32']:.1f} "
        f"GFLOP/s, bf16 {r['matmul_gflops_bf16']:.1f} GFLOP/s; MT10 training step fp32 "
        f"{r['mt10_train_step_s_fp32']:.2f} s{step}"
    )


OPTIONS = {"bench-cpu": BenchCpuOptions}
RUN = {"bench-cpu": run}
SHOW = {"bench-cpu": show}
