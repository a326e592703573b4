"""`vlarun distill`: CEED-VLA consistency distillation of an autoregressive policy (resumable).

Two phases, both resumable in ``out``:

1. collect: the teacher Jacobi-decodes (from random initial guesses, to the fixed point) the
   action tokens of ``frames`` demonstration frames; every intermediate state is kept
   (``trajectories.safetensors``: states (M, n, n) padded with the fixed point, lengths (M,);
   ``distill_data.py``).
2. train: the student (initialised from the teacher) sees a random non-final state Y of a
   random trajectory and learns to predict the fixed point Y* from it:

     L = L_C + omega * L_AR
     L_C  = KL( stopgrad Q(. | Y*_<i, x) || Q(. | Y_<i, x) )   (forward KL, per action token)
     L_AR = -log Q(Y*_i | Y*_<i, x)                             (or the demo's tokens)

   One forward computes both: [prompt | Y_1..Y_{n-1} | Y*_1..Y*_{n-1}] with the two action
   blocks at the same positions, each seeing the prompt and itself causally, never each other -
   exactly what each block sees at inference on top of the prefix cache. Losses are means over
   tokens (the paper's sums over tokens differ by the constant n, for both terms alike).

A FAST teacher (pi0-FAST: a variable-length code up to END, ``fast_head.py``) is distilled on
blocks of a fixed width n: the smallest that holds every collected fixed point's code with its
END, capped at ``block`` (a longer code trains on its first n tokens). Its trajectories are the
window solver's (``jacobi_window``) at the window inference uses
(``distill_data.teacher_trajectories`` says why), its demo tokens are the demo chunks' codes
(``distill_data.demo_codes``), and both losses count only the tokens up to and including the
target's END (``fast_head.code_mask``): what follows END is padding, never decoded.

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
from torch import Tensor
from tqdm import tqdm

from vlarun import config as cfgio
from vlarun.accel.jacobi import JacobiConfig, jacobi_decode
from vlarun.models.checkpoint import save_vla
from vlarun.models.fast_head import code_mask
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy
from vlarun.sim.distill_config import DistillConfig
from vlarun.sim.distill_data import Frames, collect, load_frames, load_trajectories

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
    end_id: int | None = None,
) -> DistillLosses:
    """Consistency + AR losses of one batch.

    images (B, V, 3, S, S); state (B, n) or (B, K, n): intermediate Jacobi states (K of the
    same trajectory share the prompt forward, one block each); fixed (B, n): their fixed point;
    ar_tokens (B, n): L_AR targets if not the fixed point (e.g. the demo's tokens); proprio
    (B, D): the robot state, for a policy with a proprio token; end_id: a FAST code's END, after
    which a block is padding: L_C counts the tokens up to and including the fixed point's END,
    L_AR those up to its target's (the fixed point's, or the demo code's)."""
    states = list((state[:, None] if state.dim() == 2 else state).unbind(1))
    blocks = [fixed, *states] + ([ar_tokens] if ar_tokens is not None else [])
    logits = block_logits(model, images, text, blocks, proprio)
    teacher = logits[0]
    target = teacher.detach().log_softmax(-1)  # stop-gradient fixed-point distribution
    keep = None if end_id is None else code_mask(fixed, end_id).float()  # the same per state
    kl = [
        _token_mean((target.exp() * (target - x.log_softmax(-1))).sum(-1), keep)
        for x in logits[1 : 1 + len(states)]
    ]
    consistency = torch.stack(kl).mean()  # mean over states, as one state per forward would
    ar_logits, ar_ids = (teacher, fixed) if ar_tokens is None else (logits[-1], ar_tokens)
    if end_id is None:
        ar = F.cross_entropy(ar_logits.flatten(0, 1), ar_ids.flatten())
    else:
        nll = F.cross_entropy(ar_logits.flatten(0, 1), ar_ids.flatten(), reduction="none")
        ar = _token_mean(nll.view_as(ar_ids), code_mask(ar_ids, end_id).float())
    return DistillLosses(consistency, ar, omega)


def _token_mean(x: Tensor, keep: Tensor | None) -> Tensor:
    """Mean of per-token values (B, n) over the tokens ``keep`` (B, n) marks (all if None)."""
    return x.mean() if keep is None else (x * keep).sum() / keep.sum()


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
        raise ValueError(
            f"{cfg.teacher} is a {teacher.model.cfg.family} policy; distillation "
            "needs an autoregressive (action-token) one"
        )
    torch.manual_seed(cfg.seed)
    student = Policy.from_checkpoint(cfg.student_init or cfg.teacher, dtype=torch.float32).model
    _share_fast_ids(teacher.model, student)
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
            data = load_trajectories(out)
            meta = _loop(cfg, student, opt_, data, frames, meta, out, log_file)
    log_file.close()
    evaluation = evaluate_iterations(cfg, teacher.model, student, frames)
    return export(cfg, student, meta, evaluation)


def _share_fast_ids(teacher: VLA, student: VLA) -> None:
    """A FAST student decodes the teacher's FAST ids: it learns the teacher's codes, and its
    export carries that tokenizer (``save_vla`` writes ``fast_tokenizer/`` from the model)."""
    if teacher.fast_head is None:
        return
    theirs = teacher.fast_head.tokenizer
    if student.fast_head is None:
        student.set_fast_tokenizer(theirs)
        return
    mine = student.fast_head.tokenizer
    same = (mine.bpe.to_str(), mine.scale, mine.min_token) == (
        theirs.bpe.to_str(),
        theirs.scale,
        theirs.min_token,
    )
    if not same:
        raise ValueError(
            f"{student.cfg.name}'s FAST tokenizer is not the teacher's: its ids "
            "would mean other coefficients"
        )


def _loop(cfg, student, opt_, data, frames, meta, out, log_file) -> dict:
    from vlarun.sim.train import resumable_loop

    gen = torch.Generator().manual_seed(cfg.seed + 1 + meta["step"])
    from vlarun.sim.train import choose_precision

    precision = choose_precision(cfg.precision)
    print(f"vlarun distill: precision {precision.reason}", file=sys.stderr)
    meta["precision"] = precision.reason
    end_id = student.cfg.fast.end_id if student.cfg.fast is not None else None

    def losses_at(step: int):
        images, text, state, fixed, idx = sample_batch(
            data, frames, cfg.batch, gen, cfg.states, cfg.initial_state
        )
        # A FAST demo code (N, M) is cut to the block: the student sees the same n positions.
        demo = frames.demo_tokens[idx, : fixed.shape[1]] if cfg.ar_target == "demo" else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.bf16):
            return distill_losses(
                student,
                images,
                text,
                state,
                fixed,
                cfg.omega,
                demo,
                frames.state_batch(idx),
                end_id,
            )

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
    exit output equals the teacher's greedy tokens (a FAST teacher's: the tokens of its code,
    END included, and whole codes; decoded in ``cfg.window``, as collected)."""
    if not cfg.eval_frames:
        return {}
    student.eval()
    idx = frames.order[-cfg.eval_frames :]
    res: dict = {"frames": len(idx), "sigma": sigma}
    fast = teacher.cfg.fast
    greedy = {}
    for name, model in (("teacher", teacher), ("student", student)):
        plain = JacobiConfig(seed=cfg.seed, init=cfg.init, window=cfg.window or None)
        for label, jc in (("jacobi", plain), ("exit", dataclasses.replace(plain, sigma=sigma))):
            iters, toks = [], []
            for part in idx.split(cfg.collect_batch):
                images = frames.image_batch(part)
                text = [frames.text[i] for i in part.tolist()]
                visual = model.encode_images(images)
                pre = model.prefill(model.build_prefix(visual, text, frames.state_batch(part)))
                r = jacobi_decode(model, pre, jc)
                iters.append(r.iterations.float())
                # A FAST batch's tokens end at its longest code: END-pad them to the cap.
                wide = 0 if fast is None else fast.max_tokens - r.tokens.shape[1]
                toks.append(F.pad(r.tokens, (0, wide), value=fast.end_id) if wide else r.tokens)
            res[f"{name}_{label}_iterations"] = float(torch.cat(iters).mean())
            greedy[(name, label)] = torch.cat(toks)
    want = greedy[("teacher", "jacobi")]
    agree = greedy[("student", "exit")] == want
    if fast is None:
        res["student_exit_token_agreement_with_teacher"] = float(agree.float().mean())
        return res
    keep = code_mask(want, fast.end_id)
    res["window"] = cfg.window or teacher.cfg.decode_tokens
    res["teacher_code_length_mean"] = float(keep.sum(1).float().mean())
    res["student_exit_token_agreement_with_teacher"] = float(agree[keep].float().mean())
    res["student_exit_code_agreement_with_teacher"] = float(agree.all(1).float().mean())
    return res


def export(cfg: DistillConfig, student: VLA, meta: dict, evaluation: dict) -> dict:
    teacher_dir = Path(cfg.teacher)
    stats_path = teacher_dir / "dataset_statistics.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    tok = teacher_dir / "tokenizer.json"
    # A student continued from an earlier student (--student-init) keeps a single suffix.
    name = f"{student.cfg.name.removesuffix('-ceed')}-ceed"
    student.cfg = dataclasses.replace(student.cfg, name=name)
    path = save_vla(
        student.eval(),
        cfg.export_dir,
        norm_stats=stats,
        tokenizer_file=tok if tok.exists() else None,
        extra_files={
            "README.md": model_card(cfg, meta, evaluation),
            # Decode from the guesses it learned to jump from: every
            # early-exit setting built for this checkpoint reads this.
            "calibration.json": json.dumps(
                {
                    "_source": f"vlarun distill: trajectories from {cfg.init!r} initial guesses",
                    "jacobi": {"init": cfg.init},
                },
                indent=1,
            ),
        },
    )
    return {
        "step": meta["step"],
        "minutes": meta["seconds"] / 60,
        "exported": str(path),
        "collected": meta.get("collected"),
        "evaluation": evaluation,
    }


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
    if "window" in evaluation:
        e = evaluation
        lines.append(
            f"- FAST code: Jacobi window {e['window']} (`--window {e['window']}` in `vlarun "
            f"bench decode`); the teacher's codes average {e['teacher_code_length_mean']:.1f} "
            "tokens with END; student exit codes equal to the teacher's greedy codes: "
            f"{e['student_exit_code_agreement_with_teacher']:.1%} (tokens compared up to the "
            "teacher's END)"
        )
    lines.append("- speed and success: see BENCHMARKS.md (`vlarun bench decode`)")
    return "\n".join(lines) + "\n"
