"""`vlarun distill`: CEED-VLA consistency distillation of an autoregressive policy (resumable).

Two phases, both resumable in ``out``:

1. collect: the teacher Jacobi-decodes (from random initial guesses, to the fixed point) the
   action tokens of ``frames`` demonstration frames; every intermediate state is kept
   (``trajectories.safetensors``: states (M, n, n) padded with the fixed point, lengths (M,)).
2. train: the student (initialised from the teacher) sees a random non-final state Y of a
   random trajectory and learns to predict the fixed point Y* from it:

     L = L_C + omega * L_AR
     L_C  = KL( stopgrad Q(. | Y*_<i, x) || Q(. | Y_<i, x) )   (forward KL, per action token)
     L_AR = -log Q(Y*_i | Y*_<i, x)                             (or the demo's tokens)

   One forward computes both: [prompt | Y_1..Y_{n-1} | Y*_1..Y*_{n-1}] with the two action
   blocks at the same positions, each seeing the prompt and itself causally, never each other -
   exactly what each block sees at inference on top of the prefix cache. Losses are means over
   tokens (the paper's sums over tokens differ by the constant n, for both terms alike).

Like ``vlarun train`` it runs in the foreground (start it with nohup/& for the background);
state (weights + AdamW moments, safetensors, no pickle) is saved every ``save_every`` steps and
a second call with the same ``out`` resumes; one JSON line per ``log_every`` steps goes to
``out/distill.log``. The student is exported with a model card (teacher vs student Jacobi
iterations on frames not used in training) to ``export``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from vlarun import config as cfgio
from vlarun.accel.jacobi import JacobiConfig, jacobi_decode
from vlarun.config import opt
from vlarun.models.checkpoint import save_vla
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy
from vlarun.sim.demos import FrameStore


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
    init: str = opt("repeat", "initial Jacobi guess of the trajectories",
                    choices=["random", "repeat"])  # fmt: skip
    collect_batch: int = opt(32, "frames per batched Jacobi decode while collecting")
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
        if self.frames < 0 or self.eval_frames < 0 or self.omega < 0:
            raise ValueError("frames, eval_frames and omega must be >= 0")

    @property
    def export_dir(self) -> Path:
        return Path(self.export or Path(self.out) / "export" / f"{Path(self.teacher).name}-ceed")


TRAJECTORIES = "trajectories.safetensors"
SAVE_BATCHES = 10  # collection batches between saves of the partial trajectories


# ---------------------------------------------------------------------------------------------
# Data: demo frames and the teacher's Jacobi trajectories


@dataclasses.dataclass
class Frames:
    """Demo frames in memory: images (N, S, S, 3) or (N, V, S, S, 3) uint8, prompt ids per
    frame, demo action tokens (N, n), the frame order (seeded permutation: collected first,
    held out last), and for a policy with a proprio token the normalised states (N, D)."""

    images: FrameStore | Tensor  # demo frames (memory-mapped) or frames already in memory
    text: list[list[int]]
    demo_tokens: Tensor
    order: Tensor
    states: Tensor | None = None
    num_images: int = 1

    def image_batch(self, idx: Tensor) -> Tensor:
        """(B, V, 3, S, S) floats in [0, 1]: the policy's views of frames ``idx``."""
        x = self.images[idx] if isinstance(self.images, Tensor) else self.images[idx.numpy()]
        x = torch.as_tensor(x)
        x = x[:, None] if x.ndim == 4 else x[:, : self.num_images]
        return x.permute(0, 1, 4, 2, 3).float().div(255.0)

    def state_batch(self, idx: Tensor) -> Tensor | None:
        return None if self.states is None else self.states[idx]


def load_frames(cfg: DistillConfig, teacher: Policy) -> Frames:
    from vlarun.sim.train import DemoSampler  # one loader for BC and distillation

    model = teacher.model
    sampler = DemoSampler(
        cfg.demos,
        model.cfg.chunk,
        teacher.tokenizer,
        cfg.seed,
        model.cfg.num_images,
        goal_in_state=model.cfg.goal_in_state,
    )
    n = model.cfg.num_action_tokens
    chunks = sampler.chunks.reshape(-1, n)
    demo_tokens = model.action_tokenizer.encode(chunks).long()
    order = torch.randperm(len(sampler), generator=torch.Generator().manual_seed(cfg.seed))
    text = [sampler.text[t] for t in sampler.task.tolist()]
    states = sampler.states.float() if model.cfg.proprio_dim else None
    return Frames(sampler.images, text, demo_tokens, order, states, model.cfg.num_images)


def collect(cfg: DistillConfig, teacher: Policy, frames: Frames, out: Path, log) -> dict:
    """Teacher trajectories of the first ``cfg.frames`` frames of ``frames.order``; resumes
    from a partial ``trajectories.safetensors`` (saved every ``SAVE_BATCHES`` batches)."""
    model = teacher.model
    n = model.cfg.num_action_tokens
    want = min(cfg.frames or len(frames.order), len(frames.order) - cfg.eval_frames)
    have = _load_trajectories(out)
    _check_init(out, cfg.init)
    parts = {k: [v] for k, v in have.items()} if have else {}
    done = int(have["frame"].shape[0]) if have else 0
    gen = torch.Generator().manual_seed(cfg.seed + done)
    bar = tqdm(total=want, initial=done, desc="collect", unit="frame")
    while done < want:
        idx = frames.order[done : min(done + cfg.collect_batch, want)]
        r = teacher_trajectories(model, frames, idx, gen, cfg.init)
        for k, v in r.items():
            parts.setdefault(k, []).append(v)
        done += len(idx)
        if len(parts["frame"]) % SAVE_BATCHES == 0 or done >= want:
            _save_trajectories(out, {k: torch.cat(v) for k, v in parts.items()}, want, cfg.init)
        bar.update(len(idx))
    bar.close()
    data = _load_trajectories(out)
    lengths = data["length"].float()
    summary = {"frames": int(lengths.shape[0]), "tokens": n,
               "teacher_iterations_mean": float((lengths - 1).mean())}  # fmt: skip
    log(f"collected {summary['frames']} trajectories, teacher Jacobi iterations "
        f"{summary['teacher_iterations_mean']:.2f} of at most {n - 1}")  # fmt: skip
    return summary


@torch.no_grad()
def teacher_trajectories(
    model: VLA, frames: Frames, idx: Tensor, gen: torch.Generator, init: str = "random"
) -> dict[str, Tensor]:
    """Jacobi trajectories (plain, to the fixed point, from ``init``) of frames ``idx``."""
    images = frames.image_batch(idx)
    text = [frames.text[i] for i in idx.tolist()]
    visual = model.encode_images(images)
    pre = model.prefill(model.build_prefix(visual, text, frames.state_batch(idx)))
    r = jacobi_decode(model, pre, JacobiConfig(init=init), gen=gen)
    n = model.cfg.num_action_tokens
    states = r.trajectory
    pad = states[:, -1:].expand(-1, n - states.shape[1], -1)  # rows are frozen at their end
    return {
        "frame": idx.clone(),
        "states": torch.cat((states, pad), dim=1).int(),  # (B, n, n): state k = after k iters
        "length": (r.iterations + 1).int(),  # states up to and including the fixed point
    }


def _save_trajectories(out: Path, data: dict[str, Tensor], planned: int, init: str) -> None:
    tmp = out / f"{TRAJECTORIES}.tmp"
    meta = {"planned": str(planned), "init": init}
    save_file({k: v.contiguous() for k, v in data.items()}, tmp, meta)
    tmp.replace(out / TRAJECTORIES)


def _check_init(out: Path, init: str) -> None:
    """Refuse to extend or train on trajectories started from another initial guess (files
    written before the guess was recorded are from random ids)."""
    path = out / TRAJECTORIES
    if not path.exists():
        return
    with safe_open(path, "pt") as f:
        have = (f.metadata() or {}).get("init", "random")
    if have != init:
        raise ValueError(f"{path} holds trajectories from init={have!r}, not init={init!r}; "
                         "use another --out or the same --init")  # fmt: skip


def _load_trajectories(out: Path) -> dict[str, Tensor] | None:
    path = out / TRAJECTORIES
    return load_file(path) if path.exists() else None


# ---------------------------------------------------------------------------------------------
# Loss


@dataclasses.dataclass
class DistillLosses:
    consistency: Tensor
    ar: Tensor
    omega: float

    @property
    def total(self) -> Tensor:
        return self.consistency + self.omega * self.ar

    def as_floats(self) -> dict[str, float]:
        return {"loss_c": float(self.consistency.detach()), "loss_ar": float(self.ar.detach())}


def block_mask(prefix_len: int, block: int, blocks: int) -> Tensor:
    """(T, T) visibility for [prompt | block 1 | ... | block k]: the prompt is causal; each
    block sees the whole prompt and itself causally, and no other block."""
    p, t = prefix_len, prefix_len + block * blocks
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    tri = torch.ones(block, block, dtype=torch.bool).tril()
    for i in range(blocks):
        s = p + i * block
        mask[s : s + block, :p] = True
        mask[s : s + block, s : s + block] = tri
    return mask


def block_logits(
    model: VLA,
    images: Tensor,
    text: list[list[int]],
    blocks: list[Tensor],
    proprio: Tensor | None = None,
) -> list[Tensor]:
    """Logits (B, n, V) of every action token for each block of guesses (B, n), in one forward.

    Row i of a block's logits is the distribution of y_i given the prompt and the block's
    y_<i: exactly what a Jacobi iteration over that block computes on the prefix cache."""
    lm = model.language_model
    prefix = model.build_prefix(model.encode_images(images), text, proprio)
    b, p = prefix.pad.shape
    n = blocks[0].shape[1]
    embeds = torch.cat([prefix.embeds] + [lm.embed(x[:, :-1]) for x in blocks], dim=1)
    steps = (prefix.last + 1)[:, None] + torch.arange(n - 1)[None]  # (B, n - 1)
    positions = torch.cat([torch.arange(p).expand(b, p)] + [steps] * len(blocks), dim=1)
    pad = torch.cat((prefix.pad, torch.ones(b, len(blocks) * (n - 1), dtype=torch.bool)), dim=1)
    mask = block_mask(p, n - 1, len(blocks))
    hidden = lm(embeds, positions, attn_mask=mask, pad_mask=pad).hidden
    last = hidden[torch.arange(b), prefix.last][:, None]  # (B, 1, d): predicts y_1
    out = []
    for i in range(len(blocks)):
        s = p + i * (n - 1)
        out.append(lm.logits(torch.cat((last, hidden[:, s : s + n - 1]), dim=1)).float())
    return out


def distill_losses(
    model: VLA,
    images: Tensor,
    text: list[list[int]],
    state: Tensor,
    fixed: Tensor,
    omega: float = 1.0,
    ar_tokens: Tensor | None = None,
    proprio: Tensor | None = None,
) -> DistillLosses:
    """Consistency + AR losses of one batch.

    images (B, V, 3, S, S); state (B, n) or (B, K, n): intermediate Jacobi states (K of the
    same trajectory share the prompt forward, one block each); fixed (B, n): their fixed point;
    ar_tokens (B, n): L_AR targets if not the fixed point (e.g. the demo's tokens); proprio
    (B, D): the robot state, for a policy with a proprio token."""
    states = list((state[:, None] if state.dim() == 2 else state).unbind(1))
    blocks = [fixed, *states] + ([ar_tokens] if ar_tokens is not None else [])
    logits = block_logits(model, images, text, blocks, proprio)
    teacher = logits[0]
    target = teacher.detach().log_softmax(-1)  # stop-gradient fixed-point distribution
    kl = [(target.exp() * (target - x.log_softmax(-1))).sum(-1).mean()
          for x in logits[1 : 1 + len(states)]]  # fmt: skip
    consistency = torch.stack(kl).mean()  # mean over states, as one state per forward would
    ar_logits, ar_ids = (teacher, fixed) if ar_tokens is None else (logits[-1], ar_tokens)
    ar = F.cross_entropy(ar_logits.flatten(0, 1), ar_ids.flatten())
    return DistillLosses(consistency, ar, omega)


# ---------------------------------------------------------------------------------------------
# Training


def sample_batch(
    data: dict[str, Tensor],
    frames: Frames,
    batch: int,
    gen: torch.Generator,
    per_row: int = 1,
    initial: bool = False,
):
    """Random trajectories and ``per_row`` random non-final states of each, drawn with
    replacement (the fixed point itself only when the initial guess already was one); with
    ``initial`` the first state of each row is always state 0, the initial guess:
    state (B, per_row, n), fixed (B, n)."""
    rows = torch.randint(0, data["frame"].shape[0], (batch,), generator=gen)
    length = data["length"][rows].long()
    k = (torch.rand(batch, per_row, generator=gen) * (length[:, None] - 1).clamp(min=1)).long()
    if initial:
        k[:, 0] = 0
    states = data["states"][rows].long()  # (B, n, n)
    state = states[torch.arange(batch)[:, None], k]
    fixed = states[torch.arange(batch), length - 1]
    idx = data["frame"][rows].long()
    return frames.image_batch(idx), [frames.text[i] for i in idx.tolist()], state, fixed, idx


def distill(cfg: DistillConfig) -> dict:
    from vlarun.models.device import cpu_only

    cpu_only(cfg.device, "vlarun distill")
    """Collect (or resume collecting), train (or resume training), export."""
    from vlarun.sim.train import load_state

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "distill.log").open("a")

    def log(msg: str) -> None:
        tqdm.write(msg, file=sys.stderr)  # stdout is for the result (--json)

    teacher = Policy.from_checkpoint(cfg.teacher, dtype=torch.float32)
    if teacher.model.cfg.family != "autoregressive":
        raise ValueError(f"{cfg.teacher} is a {teacher.model.cfg.family} policy; distillation "
                         "needs an autoregressive (action-token) one")  # fmt: skip
    torch.manual_seed(cfg.seed)
    student = Policy.from_checkpoint(cfg.student_init or cfg.teacher, dtype=torch.float32).model
    if cfg.freeze_vision:
        student.vision_backbone.requires_grad_(False)
    params = [p for p in student.parameters() if p.requires_grad]
    opt_ = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    meta = load_state(out, student, opt_)
    if meta is None:
        meta = {"step": 0, "seconds": 0.0, "config": cfgio.to_dict(cfg)}
    frames = load_frames(cfg, teacher)
    collected = meta.get("collected")
    if not cfg.export_only:
        collected = collect(cfg, teacher, frames, out, log)
        meta["collected"] = collected
        log_file.write(json.dumps({"collected": collected}) + "\n")
        spent = cfg.budget_minutes and meta["seconds"] / 60 >= cfg.budget_minutes
        if meta["step"] < cfg.steps and not spent:
            data = _load_trajectories(out)
            meta = _loop(cfg, student, opt_, data, frames, meta, out, log_file)
    log_file.close()
    evaluation = evaluate_iterations(cfg, teacher.model, student, frames)
    return export(cfg, student, meta, evaluation)


def _loop(cfg, student, opt_, data, frames, meta, out, log_file) -> dict:
    from vlarun.sim.train import resumable_loop

    gen = torch.Generator().manual_seed(cfg.seed + 1 + meta["step"])
    from vlarun.sim.train import choose_precision

    precision = choose_precision(cfg.precision)
    print(f"vlarun distill: precision {precision.reason}", file=sys.stderr)
    meta["precision"] = precision.reason

    def losses_at(step: int):
        images, text, state, fixed, idx = sample_batch(
            data, frames, cfg.batch, gen, cfg.states, cfg.initial_state
        )
        demo = frames.demo_tokens[idx] if cfg.ar_target == "demo" else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.bf16):
            return distill_losses(student, images, text, state, fixed, cfg.omega, demo,
                                  frames.state_batch(idx))  # fmt: skip

    meta = resumable_loop(cfg, student, opt_, meta, out, losses_at, log_file, "distill")
    student.eval()
    return meta


# ---------------------------------------------------------------------------------------------
# Evaluation and export


@torch.no_grad()
def evaluate_iterations(
    cfg: DistillConfig, teacher: VLA, student: VLA, frames: Frames, sigma: float = 0.5
) -> dict:
    """Mean Jacobi iterations (to the fixed point, and with exit at ``sigma``) of teacher and
    student on the held-out frames (the end of the frame order), and how often the student's
    exit output equals the teacher's greedy tokens."""
    if not cfg.eval_frames:
        return {}
    student.eval()
    idx = frames.order[-cfg.eval_frames :]
    res: dict = {"frames": len(idx), "sigma": sigma}
    greedy = {}
    for name, model in (("teacher", teacher), ("student", student)):
        plain = JacobiConfig(seed=cfg.seed, init=cfg.init)
        for label, jc in (("jacobi", plain), ("exit", dataclasses.replace(plain, sigma=sigma))):
            iters, toks = [], []
            for part in idx.split(cfg.collect_batch):
                images = frames.image_batch(part)
                text = [frames.text[i] for i in part.tolist()]
                visual = model.encode_images(images)
                pre = model.prefill(model.build_prefix(visual, text, frames.state_batch(part)))
                r = jacobi_decode(model, pre, jc)
                iters.append(r.iterations.float())
                toks.append(r.tokens)
            res[f"{name}_{label}_iterations"] = float(torch.cat(iters).mean())
            greedy[(name, label)] = torch.cat(toks)
    agree = greedy[("student", "exit")] == greedy[("teacher", "jacobi")]
    res["student_exit_token_agreement_with_teacher"] = float(agree.float().mean())
    return res


def export(cfg: DistillConfig, student: VLA, meta: dict, evaluation: dict) -> dict:
    teacher_dir = Path(cfg.teacher)
    stats_path = teacher_dir / "dataset_statistics.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    tok = teacher_dir / "tokenizer.json"
    # A student continued from an earlier student (--student-init) keeps a single suffix.
    name = f"{student.cfg.name.removesuffix('-ceed')}-ceed"
    student.cfg = dataclasses.replace(student.cfg, name=name)
    path = save_vla(student.eval(), cfg.export_dir, norm_stats=stats,
                    tokenizer_file=tok if tok.exists() else None,
                    extra_files={"README.md": model_card(cfg, meta, evaluation),
                                 # Decode from the guesses it learned to jump from: every
                                 # early-exit setting built for this checkpoint reads this.
                                 "calibration.json": json.dumps(
                                     {"_source": "vlarun distill: trajectories from "
                                      f"{cfg.init!r} initial guesses",
                                      "jacobi": {"init": cfg.init}}, indent=1)})  # fmt: skip
    return {"step": meta["step"], "minutes": meta["seconds"] / 60, "exported": str(path),
            "collected": meta.get("collected"), "evaluation": evaluation}  # fmt: skip


def model_card(cfg: DistillConfig, meta: dict, evaluation: dict) -> str:
    name = cfg.export_dir.name
    lines = [
        f"# {name}",
        "",
        f"`{cfg.teacher}` after CEED-VLA consistency distillation (`vlarun distill`): from any "
        "intermediate Jacobi state the student predicts the teacher's fixed point, so Jacobi "
        "decoding with early exit (`JacobiConfig(sigma=0.5)`) needs fewer iterations.",
        "",
        f"- teacher: `{cfg.teacher}`; data: `{cfg.demos}`, trajectories: {meta.get('collected')}",
        f"- loss: forward KL to the stop-gradient fixed-point distribution + {cfg.omega} x AR "
        f"({cfg.ar_target} targets)",
        f"- student initialised from `{cfg.student_init or cfg.teacher}`"
        + (", vision tower frozen" if cfg.freeze_vision else ""),
        f"- initial Jacobi guess: `{cfg.init}` (decode with the same: `JacobiConfig(init="
        f"{cfg.init!r})`, `vlarun bench decode --distilled-init {cfg.init}`)"
        + ("; state 0 in every trajectory's states" if cfg.initial_state else ""),
        f"- steps: {meta['step']} x batch {cfg.batch} frames x {cfg.states} states, lr {cfg.lr}, "
        f"{meta.get('precision', cfg.precision)}",
        f"- wall time: {meta['seconds'] / 60:.1f} min of training on this repository's CPU",
    ]
    if evaluation:
        e = evaluation
        lines.append(
            f"- Jacobi iterations on {e['frames']} held-out demo frames (mean): teacher "
            f"{e['teacher_jacobi_iterations']:.2f} to the fixed point, "
            f"{e['teacher_exit_iterations']:.2f} with exit at sigma {e['sigma']}; student "
            f"{e['student_jacobi_iterations']:.2f} and {e['student_exit_iterations']:.2f}; "
            f"student exit tokens equal to the teacher's greedy tokens: "
            f"{e['student_exit_token_agreement_with_teacher']:.1%}"
        )
    lines.append("- speed and success: see BENCHMARKS.md (`vlarun bench decode`)")
    return "\n".join(lines) + "\n"
