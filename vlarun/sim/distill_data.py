"""`vlarun distill`'s data: demo frames and the teacher's Jacobi trajectories (``distill.py``
trains on them).

``trajectories.safetensors`` holds, per collected frame: frame (its index), states (n, n): the
Jacobi state after k iterations in row k, padded with the fixed point; length: the states up to
and including the fixed point; for a FAST teacher also code (its fixed point's code length, END
included) and iterations (the window solver's). Its metadata says what the states depend on
(``trajectory_meta``: the initial guess; a FAST teacher's window, block cap and block width n),
so a resumed collection never mixes trajectories collected otherwise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from vlarun.accel.jacobi import JacobiConfig, jacobi_decode
from vlarun.models.fast_head import FastConfig, code_lengths
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy
from vlarun.sim.demos import FrameStore

if TYPE_CHECKING:
    from vlarun.sim.distill_config import DistillConfig

TRAJECTORIES = "trajectories.safetensors"
SAVE_BATCHES = 10  # collection batches between saves of the partial trajectories


@dataclasses.dataclass
class Frames:
    """Demo frames in memory: images (N, S, S, 3) or (N, V, S, S, 3) uint8, prompt ids per
    frame, demo action tokens (N, n; a FAST policy's: (N, M) codes, ``demo_codes``), the frame
    order (seeded permutation: collected first, held out last), and for a policy with a proprio
    token the normalised states (N, D)."""

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
    if model.cfg.fast is not None:
        demo_tokens = demo_codes(model, sampler.chunks)
    else:
        chunks = sampler.chunks.reshape(-1, model.cfg.num_action_tokens)
        demo_tokens = model.action_tokenizer.encode(chunks).long()
    order = torch.randperm(len(sampler), generator=torch.Generator().manual_seed(cfg.seed))
    text = [sampler.text[t] for t in sampler.task.tolist()]
    states = sampler.states.float() if model.cfg.proprio_dim else None
    return Frames(sampler.images, text, demo_tokens, order, states, model.cfg.num_images)


def demo_codes(model: VLA, chunks: Tensor) -> Tensor:
    """Normalised demo chunks (N, T, D) -> (N, M) LM ids: each chunk's FAST code and END, as
    ``vlarun train`` teaches it (``FastHead.encode``, ``bc_model._ar_targets``), END-padded
    after END to the model's cap M (a code past the cap is cut there, without END)."""
    fast = model.cfg.fast
    if model.fast_head is None:
        raise ValueError(f"{model.cfg.name} has no FAST tokenizer (its fast_tokenizer/ directory)")
    out = torch.full((chunks.shape[0], fast.max_tokens), fast.end_id, dtype=torch.long)
    for row, chunk in enumerate(chunks.float().numpy()):
        code = model.fast_head.encode(chunk)[: fast.max_tokens]
        out[row, : len(code)] = torch.tensor(code)
    return out


def collect(cfg: DistillConfig, teacher: Policy, frames: Frames, out: Path, log) -> dict:
    """Teacher trajectories of the first ``cfg.frames`` frames of ``frames.order``; resumes
    from a partial ``trajectories.safetensors`` (saved every ``SAVE_BATCHES`` batches)."""
    model = teacher.model
    fast = model.cfg.fast
    want = min(cfg.frames or len(frames.order), len(frames.order) - cfg.eval_frames)
    have = load_trajectories(out)
    meta = trajectory_meta(cfg, model)
    _check_meta(out, meta)
    parts = {k: [v] for k, v in have.items()} if have else {}
    done = int(have["frame"].shape[0]) if have else 0
    gen = torch.Generator().manual_seed(cfg.seed + done)
    bar = tqdm(total=want, initial=done, desc="collect", unit="frame")
    while done < want:
        idx = frames.order[done : min(done + cfg.collect_batch, want)]
        r = teacher_trajectories(model, frames, idx, gen, cfg.init, cfg.window, cfg.block)
        for k, v in r.items():
            parts.setdefault(k, []).append(v)
        done += len(idx)
        if len(parts["frame"]) % SAVE_BATCHES == 0 or done >= want:
            _save_trajectories(out, _join(parts, fast), want, meta)
        bar.update(len(idx))
    bar.close()
    data = load_trajectories(out)
    lengths = data["length"].float()
    n = int(data["states"].shape[-1])
    iterations = data["iterations"].float() if fast is not None else lengths - 1
    summary = {
        "frames": int(lengths.shape[0]),
        "tokens": n,
        "teacher_iterations_mean": float(iterations.mean()),
    }
    if fast is None:
        log(
            f"collected {summary['frames']} trajectories, teacher Jacobi iterations "
            f"{summary['teacher_iterations_mean']:.2f} of at most {n - 1}"
        )
        return summary
    code = data["code"].float()
    summary |= {
        "window": int(meta["window"]),
        "code_length_mean": float(code.mean()),
        "code_length_max": int(code.max()),
        "codes_over_block": int((code > n).sum()),
    }
    log(
        f"collected {summary['frames']} trajectories, teacher Jacobi iterations "
        f"{summary['teacher_iterations_mean']:.2f} (window {meta['window']}); codes of "
        f"{summary['code_length_mean']:.1f} tokens with END (max {summary['code_length_max']}); "
        f"training blocks of {n} tokens ({summary['codes_over_block']} codes cut)"
    )
    return summary


@torch.no_grad()
def teacher_trajectories(
    model: VLA,
    frames: Frames,
    idx: Tensor,
    gen: torch.Generator,
    init: str = "random",
    window: int = 0,
    block: int = 32,
) -> dict[str, Tensor]:
    """Jacobi trajectories (plain, to the fixed point, from ``init``) of frames ``idx``: states
    (B, n, n), state k = after k iterations; length (B,): states up to and including the fixed
    point. A FAST teacher's also keep code (B,), each fixed point's code length with END, and
    iterations (B,), the solver's.

    A FAST code is decoded by the window solver at ``window`` guesses (0: ``decode_tokens``,
    the window inference uses), and its states are those inference meets: the settled, exact
    tokens, then the window's guesses. A code no longer than the window plus the prefill's
    token fits the window from the first iteration, and then the states on its tokens are
    ``jacobi_solve``'s (plain Jacobi over the whole code); a longer one's window slides, and
    the tokens ahead of it keep their initial guess until it reaches them, as they do at
    inference. An early exit (sigma) accepts the window's proposals and slides on, so the
    exiting decoder meets the same kind of state: exact tokens, then guesses in a window. The
    block (n = the longest code with END in the batch, at most ``block``) holds every token a
    loss counts; after n - 1 iterations its n tokens are exact, so a cut trajectory ends there.
    """
    images = frames.image_batch(idx)
    text = [frames.text[i] for i in idx.tolist()]
    visual = model.encode_images(images)
    pre = model.prefill(model.build_prefix(visual, text, frames.state_batch(idx)))
    r = jacobi_decode(model, pre, JacobiConfig(init=init, window=window or None), gen=gen)
    fast = model.cfg.fast
    if fast is None:
        states, length = fit_block(r.trajectory, r.iterations + 1, model.cfg.num_action_tokens)
        return {"frame": idx.clone(), "states": states.int(), "length": length.int()}
    code = code_lengths(r.tokens, fast.end_id)  # r.tokens: END-padded after each row's END
    n = max(2, min(block, int(code.max())))
    states, length = fit_block(r.trajectory, r.iterations + 1, n, fast.end_id)
    return {
        "frame": idx.clone(),
        "states": states.int(),
        "length": length.int(),
        "code": code.int(),
        "iterations": r.iterations.int(),
    }


def fit_block(
    states: Tensor, length: Tensor, n: int, end_id: int | None = None
) -> tuple[Tensor, Tensor]:
    """Trajectories (B, K, m) with ``length`` (B,) states each -> (B, n, n) and their lengths:
    the first n states of the first n tokens; fewer states are padded with the last (rows are
    frozen at their end), fewer tokens with END (they follow the code's END). After n - 1
    iterations at least n tokens are exact, so a longer trajectory's state n - 1 is the
    block's fixed point: lengths are capped at n."""
    states = states[:, :n, :n]
    b, k, m = states.shape
    if m < n:
        if end_id is None:
            raise ValueError(f"{m} tokens cannot be padded to {n} without an END id")
        states = torch.cat((states, states.new_full((b, k, n - m), end_id)), dim=2)
    if k < n:
        states = torch.cat((states, states[:, -1:].expand(-1, n - k, -1)), dim=1)
    return states, length.clamp(max=n)


def _join(parts: dict[str, list[Tensor]], fast: FastConfig | None) -> dict[str, Tensor]:
    """Collected batches as one dict; a FAST teacher's blocks padded to the widest batch's."""
    parts = dict(parts)
    if fast is not None:
        n = max(int(s.shape[-1]) for s in parts["states"])
        blocks = [
            fit_block(s, k, n, fast.end_id)
            for s, k in zip(parts["states"], parts["length"], strict=True)
        ]
        parts["states"], parts["length"] = [s for s, _ in blocks], [k for _, k in blocks]
    return {k: torch.cat(v) for k, v in parts.items()}


def trajectory_meta(cfg: DistillConfig, model: VLA) -> dict[str, str]:
    """What the trajectories depend on besides the frames: the initial guess and, for a FAST
    teacher, the window and the block cap (trajectories collected otherwise are refused)."""
    meta = {"init": cfg.init}
    if model.cfg.fast is not None:
        meta |= {"window": str(cfg.window or model.cfg.decode_tokens), "block": str(cfg.block)}
    return meta


def _save_trajectories(
    out: Path, data: dict[str, Tensor], planned: int, meta: dict[str, str]
) -> None:
    tmp = out / f"{TRAJECTORIES}.tmp"
    meta = {"planned": str(planned)} | meta
    if "block" in meta:  # a FAST teacher's: the training block width n, as collected so far
        meta["width"] = str(data["states"].shape[-1])
    save_file({k: v.contiguous() for k, v in data.items()}, tmp, meta)
    tmp.replace(out / TRAJECTORIES)


def _check_meta(out: Path, want: dict[str, str]) -> None:
    """Refuse to extend or train on trajectories collected otherwise (``trajectory_meta``;
    files written before the guess was recorded are from random ids)."""
    path = out / TRAJECTORIES
    if not path.exists():
        return
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    for key, value in want.items():
        have = meta.get(key, "random" if key == "init" else None)
        if have != value:
            raise ValueError(
                f"{path} holds trajectories from {key}={have!r}, not "
                f"{key}={value!r}; use another --out or the same --{key}"
            )


def load_trajectories(out: Path) -> dict[str, Tensor] | None:
    path = out / TRAJECTORIES
    return load_file(path) if path.exists() else None
