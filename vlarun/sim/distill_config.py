"""`vlarun distill`'s options (one module that the run, distill.py, and its data, distill_data.py,
both read)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vlarun.config import opt


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """Consistency distillation (CEED-VLA) of an autoregressive policy on demonstration frames."""

    teacher: str = opt("checkpoints/tiny-ar", "autoregressive policy checkpoint to distil")
    demos: str = opt("data/demos128,data/demos128b", "demo directories joined by commas")
    out: str = opt("runs/ceed", "run directory: trajectories, state, log (resumes there)")
    export: str = opt("", "exported student directory (default: <out>/export/<teacher>-ceed)")
    # e.g. an earlier student, continued under a new learning-rate schedule
    student_init: str = opt("", "checkpoint the student starts from (default: the teacher)")
    frames: int = opt(16000, "demo frames whose teacher Jacobi trajectories are collected; 0 = all")
    # The student learns to jump from *this* guess to the fixed point, so decode it with the
    # same init (``vlarun bench decode --distilled-init``). "repeat" makes the first
    # iteration's inputs a function of the prompt alone instead of noise the student must learn
    # to ignore.
    init: str = opt(
        "repeat", "initial Jacobi guess of the trajectories", choices=["random", "repeat"]
    )
    collect_batch: int = opt(32, "frames per batched Jacobi decode while collecting")
    # mt10p-fast's codes are ~11 ids and END (at most ~30 on its demos): 32 holds them all, and
    # a training block of 32 costs what mt10p-ar's 32 action tokens cost.
    block: int = opt(32, "FAST teachers: most code tokens (END included) a training block holds")
    window: int = opt(
        0,
        "FAST teachers: Jacobi window of the trajectories and the card's "
        "decodes; 0 = the teacher's decode_tokens (what inference uses)",
    )
    # The defaults are the shipped student's run from the teacher, within the 90-minute budget
    # on a 2-core CPU: 7 min of collection, then 78 min of training (the step cap is not reached).
    steps: int = opt(20000, "optimiser steps (a cap; budget_minutes usually ends the run)")
    batch: int = opt(16, "trajectories (demo frames) per step")
    # States of one trajectory share its prompt forward, so 8 states cost ~1.35x one state.
    states: int = opt(8, "intermediate states of each trajectory per step")
    # Decoding starts from state 0 every time, but a uniform draw over a ~6-iteration teacher
    # trajectory shows it ~1 time in 6; exiting after one iteration needs it learned best.
    initial_state: bool = opt(True, "one of each trajectory's states is always its initial guess")
    # The consistency target depends on the action tokens only; skipping the vision tower's
    # backward took tiny-ar's steps from ~19 to ~24 samples/s (2 threads).
    freeze_vision: bool = opt(True, "train the language model and projector only")
    lr: float = opt(3e-4, "peak learning rate (AdamW); the student starts at the teacher")
    warmup: int = opt(50, "linear warm-up steps")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    omega: float = opt(1.0, "weight of the autoregressive loss")
    ar_target: str = opt("fixed-point", "L_AR targets", choices=["fixed-point", "demo"])
    save_every: int = opt(100, "steps between resumable state saves")
    log_every: int = opt(10, "steps between distill.log lines")
    eval_frames: int = opt(64, "held-out frames for the card's iteration counts; 0 = none")
    seed: int = opt(0, "frame choice, initial guesses and sampling seed")
    precision: str = opt(
        "auto",
        "training precision: auto (bf16 where this CPU runs it fast), bf16 or fp32 (collection "
        "runs in fp32)",
        choices=("auto", "bf16", "fp32"),
    )
    max_minutes: float = opt(0.0, "stop (resumably) after this many minutes of this call; 0 = none")
    budget_minutes: float = opt(78.0, "total training minutes (cosine schedule by time); 0 = none")
    threads: int = opt(0, "torch threads; 0 = torch's default")
    export_only: bool = opt(False, "skip collection and training; export the current state")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.lr <= 0 or self.collect_batch < 1:
            raise ValueError("steps, batch, collect_batch and lr must be positive")
        if self.frames < 0 or self.eval_frames < 0 or self.omega < 0 or self.window < 0:
            raise ValueError("frames, eval_frames, omega and window must be >= 0")
        if self.block < 2:
            raise ValueError(f"block must be >= 2 (a code token and END), got {self.block}")

    @property
    def export_dir(self) -> Path:
        return Path(self.export or Path(self.out) / "export" / f"{Path(self.teacher).name}-ceed")
