"""`vlarun train`: behaviour cloning on scripted Meta-World demonstrations, resumable.

Runs in the foreground (start it with nohup/& for the background); every ``save_every`` steps,
every ``save_minutes`` and when stopped it writes ``state.safetensors`` (fp32 weights of every
head, the training-only auxiliary head included; the AdamW moments only while the file stays
under ``moments_mb``; no pickle) and ``state.json`` (step, samples seen, elapsed time, config,
precision) into ``out``: by default ``training/<suite>/`` in the repository, so a new machine
continues the run from a clone (commit the two files when work stops: they replace the last
ones). Starting again with the same ``out`` resumes there: the same schedule position and the
same data stream (batch ``k`` is drawn from a generator seeded by ``(seed, k)``, so a run cut in
two draws exactly the batches of a run done at once); without saved moments the LR re-warms over
``rewarm`` steps while AdamW rebuilds them, and the log says so. A run with no state starts from
the suite's committed checkpoints when they exist. Progress goes
to stderr, one JSON line per ``log_every`` steps to ``out/train.log``. At the end (and with
``--export-only``) each family is exported as a standalone checkpoint under ``out/export/``.

Precision: ``--precision auto`` times a bf16 and an fp32 matmul of the trunk's shape on this CPU
and trains under bf16 autocast only where it is clearly faster (CPUs with AVX-512 BF16 / AMX run
it several times faster than fp32; CPUs without them emulate it, ~100x slower); the choice and
the two rates are printed and written to the log and the model card.
"""

from __future__ import annotations

import dataclasses
import json
import math
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from vlarun import config as cfgio
from vlarun.config import opt
from vlarun.machine import cpu_name
from vlarun.models.action_tokens import NormStats, ProprioNorm
from vlarun.models.checkpoint import load_vla, save_vla
from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR, FastTokenizer
from vlarun.models.presets import get_preset
from vlarun.models.tokenizer import openvla_prompt
from vlarun.models.vit import siglip_to_clip_vit
from vlarun.paths import checkpoints_dir, training_dir
from vlarun.sim.bc_model import AUX_SUITES, SUITES, Batch, MultiHeadBC
from vlarun.sim.demos import DATASET_NAME, Demos, FrameStore, action_statistics, load_demos
from vlarun.sim.text import build_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    """Behaviour cloning of a suite's three policies on one shared trunk (resumable)."""

    suite: str = opt(
        "mw",
        "mw: the 4-layer tiny-ar/-oft/-dit; mt10: the 12-layer two-view proprio mt10-ar/-oft/-dit;"
        " mt10w: mt10 with a wrist camera, 8-step chunks and a flow expert (mt10w-ar/-oft/-dit/"
        "-flow)",
        choices=tuple(SUITES),
    )
    demos: str = opt("data/demos128", "demo directory, or several joined by commas")
    out: str = opt("", "run directory: state, log, exports (default training/SUITE)")
    init_from: str = opt(
        "",
        "start a new run from a run directory or a directory of exported policies (default: "
        "checkpoints/ when it holds the suite's policies)",
    )
    steps: int = opt(8000, "optimiser steps")
    batch: int = opt(32, "samples per step")
    lr: float = opt(5e-4, "peak learning rate (AdamW)")
    warmup: int = opt(300, "linear warm-up steps")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    shift: int = opt(6, "random-shift augmentation in pixels (DrQ-style); 0 = off")
    save_every: int = opt(250, "steps between resumable state saves")
    save_minutes: float = opt(20.0, "minutes between resumable state saves (also on stop)")
    moments_mb: float = opt(
        25.0, "keep the AdamW moments in the state only while the file stays under this size"
    )
    rewarm: int = opt(200, "LR re-warm-up steps after resuming without saved moments")
    stop_after: int = opt(0, "stop (resumably) after this many steps of this call; 0 = none")
    log_every: int = opt(25, "steps between train.log lines")
    seed: int = opt(0, "sampling and initialisation seed")
    precision: str = opt(
        "auto",
        "auto (bf16 where this CPU runs it fast), bf16 or fp32",
        choices=("auto", "bf16", "fp32"),
    )
    balance: bool = opt(True, "sample every task equally often (else every frame)")
    task_weights: str = opt(
        "",
        "with --balance, relative task sampling weights TASK=W,... (unnamed tasks weigh 1), "
        "e.g. reach-v3=2,push-v3=2 to spend more of the batches where success is lost",
    )
    state_noise: float = opt(
        0.0,
        "Gaussian noise (metres, standard deviation) on the hand position of every sampled "
        "state: the hand's displacement from its fixed start then no longer tells which way the "
        "expert went, so the policy must find the goal in the image (0 = off)",
    )
    early_share: float = opt(
        0.0,
        "with --balance, the share of each task's samples drawn from its episodes' first "
        "--early-steps frames, where the hand still sits at its fixed start and only the image "
        "says where the goal is (0 = frames uniformly)",
    )
    early_steps: int = opt(8, "frames at an episode's start that --early-share draws from")
    loss_weights: str = opt(
        "",
        "weights of the heads' losses in the sum the optimiser sees, HEAD=W,... over ar, oft, "
        "dit, flow, aux (unnamed heads weigh 1), e.g. dit=10,flow=4: the diffusion and flow "
        "losses are 10-30x smaller than the autoregressive cross-entropy, so the shared trunk "
        "serves the token heads first (AdamW scales each parameter's step by its own gradients, "
        "so a weight acts through the trunk the heads share, not the head's own step)",
    )
    max_minutes: float = opt(0.0, "stop (resumably) after this many minutes of this call; 0 = none")
    # The LR anneals by whichever of steps or time runs out first and training ends there, so a
    # slower (shared) machine still finishes its schedule instead of stopping at a high LR.
    budget_minutes: float = opt(0.0, "total minutes of the run (cosine schedule by time); 0 = none")
    threads: int = opt(0, "torch threads; 0 = every core torch sees")
    export_only: bool = opt(False, "train no further: export the run's saved state")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.lr <= 0:
            raise ValueError("steps, batch and lr must be positive")
        if self.shift < 0:
            raise ValueError(f"shift must be >= 0, got {self.shift}")
        if not 0.0 <= self.early_share < 1.0 or self.early_steps < 1:
            raise ValueError(
                f"early share must be in [0, 1) and early steps >= 1, got {self.early_share} "
                f"and {self.early_steps}"
            )
        if self.early_share and not self.balance:
            raise ValueError("--early-share draws within each task, which only --balance does")
        if not 0.0 <= self.state_noise <= 0.2:  # 20 cm is a third of the workspace
            raise ValueError(f"state noise must be in [0, 0.2] m, got {self.state_noise}")
        if self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}; valid: {', '.join(SUITES)}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.task_weights and not self.balance:
            raise ValueError("--task-weights weighs tasks, which only --balance samples by")
        parse_task_weights(self.task_weights)  # a malformed list fails here, before any work
        parse_loss_weights(self.loss_weights)

    @property
    def run_dir(self) -> Path:
        return Path(self.out).expanduser() if self.out else default_run_dir(self.suite)


def parse_task_weights(text: str) -> dict[str, float]:
    """``"reach-v3=2,push-v3=1.5"`` as ``{task: weight}``; each weight finite and > 0."""
    return _parse_weights(text, "task")


LOSS_HEADS = ("ar", "oft", "dit", "flow", "aux")


def parse_loss_weights(text: str) -> dict[str, float]:
    """``"dit=10,flow=4"`` as ``{head: weight}`` over ``LOSS_HEADS``; each finite and > 0."""
    weights = _parse_weights(text, "head")
    unknown = sorted(set(weights) - set(LOSS_HEADS))
    if unknown:
        raise ValueError(f"loss weights name {', '.join(unknown)}; heads: {', '.join(LOSS_HEADS)}")
    return weights


def _parse_weights(text: str, kind: str) -> dict[str, float]:
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            w = float(value) if sep else float("nan")
        except ValueError:
            w = float("nan")
        if not name or not (0 < w < float("inf")):
            raise ValueError(f"{kind} weight {item!r} is not {kind.upper()}=W with W a number > 0")
        if name in weights:
            raise ValueError(f"{kind} {name!r} is weighted twice in {text!r}")
        weights[name] = w
    return weights


def default_run_dir(suite: str) -> Path:
    """Training state lives in the repository (``training/SUITE``): a machine's cache does not
    outlive it, and a run must continue on the next one."""
    return training_dir() / suite


# ---------------------------------------------------------------------------------------------
# Precision


@dataclass(frozen=True)
class PrecisionChoice:
    bf16: bool
    reason: str

    @property
    def label(self) -> str:
        return "bf16 autocast" if self.bf16 else "fp32"


BF16_MIN_RATIO = 1.5


def choose_precision(
    requested: str,
    width: int = 512,
    rows: int = 2048,
    step: Callable[[], None] | None = None,
) -> PrecisionChoice:
    """bf16 autocast only where this CPU runs it faster than fp32 (measured, not assumed).

    With ``step`` (one forward and backward of the model being trained), times it in both
    precisions (best of 2 after a warm-up): the step is what the choice is about, and a
    matmul alone misleads (on an AMX Xeon bf16 matmuls ran 7.8x fp32 while the mt10p training
    step gained 5%). Without it, times ``rows x width @ width x width`` matmuls. bf16 is chosen
    at >= 1.5x (below that its rounding is not worth it). An explicit bf16 is honoured and
    its measured ratio still reported (a CPU where bf16 is slower says so); an explicit fp32
    is not timed: it is never the slow choice, and timing bf16 on an AVX2 CPU cost ~10 s of
    every training call (3 bf16 steps of the tiny suite at ~2.7 s), resumes included."""
    if requested == "fp32":
        return PrecisionChoice(False, "fp32 as asked (not timed: --precision auto times both)")
    if step is None:
        a32, b32 = torch.randn(rows, width), torch.randn(width, width)
        pairs = {False: (a32, b32), True: (a32.bfloat16(), b32.bfloat16())}

        def step() -> None:
            a, b = pairs[torch.is_autocast_enabled("cpu")]
            a @ b

        what, work = "matmul", 2 * rows * width * width / 1e9
    else:
        what, work = "training step", None
    times = {}
    for bf16 in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            step()  # warm-up: oneDNN picks and caches its kernels
            best = math.inf
            for _ in range(2 if work is None else 5):
                t0 = time.perf_counter()
                step()
                best = min(best, time.perf_counter() - t0)
        times[bf16] = best
    ratio = times[False] / times[True]
    unit = (
        f"bf16 {work / times[True]:.0f} vs fp32 {work / times[False]:.0f} GFLOP/s"
        if work is not None
        else f"bf16 {times[True] * 1e3:.0f} vs fp32 {times[False] * 1e3:.0f} ms"
    )
    measured = f"{what} {unit} ({ratio:.2f}x) on {torch.get_num_threads()} thread(s)"
    if requested == "auto":
        fast = ratio >= BF16_MIN_RATIO
        why = f"bf16 at >= {BF16_MIN_RATIO}x" if fast else f"bf16 under {BF16_MIN_RATIO}x"
        return PrecisionChoice(fast, f"auto: {'bf16' if fast else 'fp32'} ({why}): {measured}")
    return PrecisionChoice(requested == "bf16", f"{requested} as asked: {measured}")


# ---------------------------------------------------------------------------------------------
# Data


HAND_DIMS = 3  # the state's first entries: the hand's xyz in metres (then gripper, then goal)


class DemoSampler:
    """Demonstration frames (memory-mapped) and their labels; each sample is (image(s),
    instruction ids, normalised action chunk, normalised proprio state, normalised targets).

    ``directory`` may list several demo directories joined by commas (same image size; their
    tasks are merged by name); normalisation statistics are computed over all of them and
    carried by the exported policies. ``goal_in_state`` appends each frame's goal xyz to its
    state (the ``mt10g`` policies: :func:`with_goal_state`). ``balance`` draws a task uniformly,
    then a frame of it, so short-episode tasks (reach) get as many samples as long ones.
    """

    def __init__(
        self,
        directory: str,
        chunk: int,
        tokenizer,
        seed: int,
        num_images: int = 1,
        balance: bool = False,
        goal_in_state: bool = False,
        task_weights: dict[str, float] | None = None,
        state_noise: float = 0.0,
        early_share: float = 0.0,
        early_steps: int = 8,
    ) -> None:
        dirs = demo_dirs(directory)
        demos = concat_demos([load_demos(d) for d in dirs])
        if goal_in_state:
            demos = with_goal_state(demos)
        views = 1 if demos.images.ndim == 4 else demos.images.shape[1]
        if views < num_images:
            raise ValueError(
                f"the policy takes {num_images} views; {directory} holds {views} "
                "(collect with --extra-cameras)"
            )
        self.images = demos.images  # FrameStore: (N, S, S, 3) or (N, V, S, S, 3) uint8
        self.num_images = num_images
        self.stats_json = merged_statistics(demos)
        self.norm = NormStats.select(self.stats_json, None)
        proprio = ProprioNorm.select(self.stats_json)
        self.states = torch.from_numpy(proprio.normalize(demos.states))
        # Noise in metres on the hand xyz (the first three entries), in normalised units: divided
        # by what the normalisation divides by. Gripper (and goal) entries stay clean.
        scale = proprio.scale[:HAND_DIMS]
        self.state_noise = torch.from_numpy((state_noise / scale).astype(np.float32))
        actions = np.asarray(self.norm.normalize(demos.actions), dtype=np.float32)
        self.chunks = torch.from_numpy(_chunks(actions, demos.episode_index, chunk))
        self.task = torch.from_numpy(demos.task_index.astype(np.int64))
        self.text = [tokenizer.encode(openvla_prompt(i)) for i in demos.instructions]
        self.instructions = demos.instructions
        self.manifest = demos.manifest
        self.targets = None
        if demos.targets is not None:
            t = demos.targets.astype(np.float64)
            t = (t - t.mean(0)) / (t.std(0) + 1e-6)
            self.targets = torch.from_numpy(t.astype(np.float32))
        self.balance = balance
        self.by_task = [torch.nonzero(self.task == k)[:, 0] for k in range(len(self.text))]
        early = torch.from_numpy(demos.step_index < early_steps)
        self.early_by_task = [
            torch.nonzero((self.task == k) & early)[:, 0] for k in range(len(self.text))
        ]
        self.early_share = early_share
        names = list(demos.manifest["task_names"])
        unknown = sorted(set(task_weights or {}) - set(names))
        if unknown:
            raise ValueError(
                f"task weights name {', '.join(unknown)}, not in {directory} "
                f"(its tasks: {', '.join(names)})"
            )
        # None keeps the uniform draw (and its random stream) of runs that weigh nothing.
        self.task_weights = None
        if task_weights:
            self.task_weights = torch.tensor(
                [
                    task_weights.get(n, 1.0) if len(t) else 0.0
                    for n, t in zip(names, self.by_task, strict=True)
                ],
                dtype=torch.float64,
            )
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.images)

    def frames(self, idx: Tensor) -> Tensor:
        """uint8 frames ``idx`` as a tensor (B, S, S, 3) or (B, V, S, S, 3)."""
        return torch.from_numpy(self.images[idx.numpy()])

    def draw(self, batch: int) -> Tensor:
        """Frame indices of one batch (task-balanced or uniform over frames)."""
        if not self.balance:
            return torch.randint(0, len(self), (batch,), generator=self.gen)
        if self.task_weights is not None:
            tasks = self.by_task
            pick = torch.multinomial(self.task_weights, batch, replacement=True, generator=self.gen)
        else:
            tasks = [t for t in self.by_task if len(t)]
            pick = torch.randint(0, len(tasks), (batch,), generator=self.gen)
        idx = torch.stack(
            [
                tasks[k][torch.randint(0, len(tasks[k]), (1,), generator=self.gen)][0]
                for k in pick.tolist()
            ]
        )
        if self.early_share:  # drawn only when asked: a run without it keeps its stream
            swap = torch.rand(batch, generator=self.gen) < self.early_share
            for j in torch.nonzero(swap)[:, 0].tolist():
                pool = self.early_by_task[int(self.task[idx[j]])]
                idx[j] = pool[torch.randint(0, len(pool), (1,), generator=self.gen)][0]
        return idx

    def sample(self, batch: int, shift: int, step: int | None = None) -> Batch:
        """One batch; with ``step``, the batch of that step of the run, whatever came before
        (the generator is seeded by ``(seed, step)``: the data stream survives a restart)."""
        if step is not None:
            self.gen.manual_seed(self.seed * 1_000_003 + step)
        idx = self.draw(batch)
        frames = self.frames(idx)
        if frames.ndim == 4:
            frames = frames[:, None]
        frames = frames[:, : self.num_images]  # (B, V, S, S, 3)
        b, v = frames.shape[:2]
        images = frames.flatten(0, 1).permute(0, 3, 1, 2).float().div_(255.0)
        if shift:
            images = random_shift(images, shift, self.gen)
        images = images.view(b, v, *images.shape[1:]) if v > 1 else images
        text = [self.text[t] for t in self.task[idx].tolist()]
        targets = None if self.targets is None else self.targets[idx]
        states = self.states[idx]
        if bool(self.state_noise.any()):  # drawn last: a run without noise keeps its stream
            states = states.clone()
            noise = torch.randn(b, HAND_DIMS, generator=self.gen) * self.state_noise
            states[:, :HAND_DIMS] += noise
        return Batch(images, text, self.chunks[idx], states, targets)


def with_goal_state(demos: Demos) -> Demos:
    """``demos`` with each frame's goal xyz after its hand state (7 values): what
    ``MetaWorldEnv(goal_in_state=True)`` observes, taken from the same simulator call (the
    recorded auxiliary targets), so training and evaluation see one goal."""
    if demos.targets is None:
        raise ValueError(
            "goal-in-state training needs demonstrations that record goal positions "
            "(format 2 or later: 'targets')"
        )
    states = np.concatenate((demos.states, demos.targets[:, 3:6]), axis=1).astype(np.float32)
    return dataclasses.replace(demos, states=states)


def merged_statistics(demos: Demos) -> dict:
    """OpenVLA-layout statistics (actions and proprio) over every frame of ``demos``."""
    proprio = action_statistics(demos.states)
    proprio["mask"] = [True] * demos.states.shape[1]
    return {
        DATASET_NAME: {
            "action": action_statistics(demos.actions),
            "proprio": proprio,
            "num_transitions": len(demos),
            "num_trajectories": len(demos.manifest["episodes"]),
        }
    }


def demo_dirs(spec: str) -> list[Path]:
    """Comma-separated demo directories, each checked to hold a manifest."""
    dirs = [Path(d) for d in spec.split(",") if d]
    for d in dirs:
        if not (d / "manifest.json").exists():
            raise ValueError(f"{d} is not a demo directory (no manifest.json)")
    if not dirs:
        raise ValueError("no demo directory given")
    return dirs


def concat_demos(parts: list[Demos]) -> Demos:
    """Frames of several collections as one: episode indices made unique, tasks merged by name
    (the first collection's order, then tasks only later ones hold)."""
    first = parts[0]
    for p in parts[1:]:
        if p.images.shape[1:] != first.images.shape[1:]:  # sizes and view counts
            shapes = f"{first.images.shape[1:]} vs {p.images.shape[1:]}"
            raise ValueError(f"demo directories hold different image shapes: {shapes}")
        if (p.targets is None) != (first.targets is None):
            raise ValueError("some demo directories carry targets and others do not")
    if len(parts) == 1:
        return first
    names: list[str] = []
    for p in parts:
        names += [t for t in p.manifest["task_names"] if t not in names]
    tasks = {}
    for p in parts:
        tasks.update({t: info for t, info in p.manifest["tasks"].items() if t not in tasks})
    remap = [np.array([names.index(t) for t in p.manifest["task_names"]]) for p in parts]
    offsets = np.cumsum([0] + [len(p.manifest["episodes"]) for p in parts[:-1]])
    manifest = dict(
        first.manifest,
        task_names=names,
        tasks=tasks,
        episodes=[e for p in parts for e in p.manifest["episodes"]],
    )
    return Demos(
        images=FrameStore.join([p.images for p in parts]),
        states=np.concatenate([p.states for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        episode_index=np.concatenate(
            [p.episode_index + o for p, o in zip(parts, offsets, strict=True)]
        ),
        step_index=np.concatenate([p.step_index for p in parts]),
        task_index=np.concatenate(
            [m[p.task_index] for p, m in zip(parts, remap, strict=True)]
        ).astype(np.int32),
        manifest=manifest,
        targets=None if first.targets is None else np.concatenate([p.targets for p in parts]),
    )


def _chunks(actions: np.ndarray, episode: np.ndarray, k: int) -> np.ndarray:
    """(N, K, D): actions t..t+K-1 of the same episode, the last action repeated at its end."""
    n = actions.shape[0]
    out = np.empty((n, k, actions.shape[1]), dtype=np.float32)
    for j in range(k):
        src = np.minimum(np.arange(n) + j, n - 1)
        same = episode[src] == episode
        # Walk back to the episode's last frame where t + j leaves the episode.
        fixed = src.copy()
        while not same.all():
            fixed[~same] -= 1
            same = episode[fixed] == episode
        out[:, j] = actions[fixed]
    return out


def random_shift(images: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Pad by replication and crop back at a random offset per image."""
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode="replicate")
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    rows = (oy[:, None] + torch.arange(h)[None])[:, None, :, None].expand(b, 3, h, w + 2 * pad)
    out = padded.gather(2, rows)
    cols = (ox[:, None] + torch.arange(w)[None])[:, None, None, :].expand(b, 3, h, w)
    return out.gather(3, cols)


# ---------------------------------------------------------------------------------------------
# State (resumable, pickle-free)


def _unique_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The state dict without aliases of a tensor already in it (tied embeddings: safetensors
    refuses shared storage; loading the first name restores both)."""
    seen: set[int] = set()
    out = {}
    for k, v in model.state_dict().items():
        if v.data_ptr() in seen and v.numel():
            continue
        seen.add(v.data_ptr())
        out[k] = v
    return out


def save_state(
    out: Path, model: torch.nn.Module, opt: torch.optim.AdamW, meta: dict, moments_mb: float = 0
) -> dict:
    """Write ``state.safetensors`` (fp32 weights, and the AdamW moments when the file stays
    under ``moments_mb``; 0 = always) and ``state.json``; returns the meta as written."""
    tensors = {f"model.{k}": v.float().contiguous() for k, v in _unique_state(model).items()}
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    moments[f"opt.{names[id(p)]}.{key}"] = torch.as_tensor(st[key]).contiguous()
    nbytes = sum(t.numel() * t.element_size() for t in (*tensors.values(), *moments.values()))
    keep = not moments_mb or nbytes <= moments_mb * 2**20
    if keep:
        tensors |= moments
    meta = meta | {"moments_saved": keep and bool(moments)}
    tmp = out / "state.safetensors.tmp"
    save_file(tensors, tmp)
    tmp.replace(out / "state.safetensors")
    tmp = out / "state.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(out / "state.json")
    return meta


def load_state(out: Path, model: torch.nn.Module, opt: torch.optim.AdamW) -> dict | None:
    """Resume from ``out``: weights, moments where saved (else ``rewarm_from`` marks the step
    the LR re-warms from), and the meta (step, seconds, ...). None where there is no state."""
    if not (out / "state.safetensors").exists():
        return None
    tensors = load_file(out / "state.safetensors")
    weights = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    missing = set(_unique_state(model)) - set(weights)
    if missing:
        raise ValueError(f"{out / 'state.safetensors'} lacks {sorted(missing)[:5]}")
    model.load_state_dict(weights, strict=False)  # tied aliases come with their first name
    restored = 0
    for name, p in model.named_parameters():
        if f"opt.{name}.exp_avg" in tensors:
            restored += 1
            opt.state[p] = {
                key: tensors[f"opt.{name}.{key}"] for key in ("exp_avg", "exp_avg_sq", "step")
            }
    meta = json.loads((out / "state.json").read_text())
    if not restored and meta.get("step", 0):
        meta["rewarm_from"] = meta["step"]
    return meta


# The exported checkpoints' names, per suite and family: the presets' own (one name, one model).
EXPORT_NAMES = SUITES
FAMILY_NAMES = EXPORT_NAMES["mw"]
# A suite whose trunk has the shape of another's starts from that one's policies when it has
# none of its own (mt10w: mt10's trunk, a wrist camera instead of the mirrored view).
# mt10g (the goal in the state) grows mt10p: its proprio input is 3 values wider (_load_matching).
# mt10pl (LLaVA's shape) grows mt10p with a CLIP tower where mt10p has SigLIP (_vision_tower).
GROWS_FROM: dict[str, tuple[str, ...]] = {
    "mt10w": ("mt10",),
    "mt10p": ("mt10w", "mt10"),
    "mt10g": ("mt10p",),
    "mt10pf": ("mt10p",),
    "mt10pl": ("mt10p",),
}


def _source_tokenizer(source: Path, suite: str = "mw") -> Path | None:
    ar_dir = source / EXPORT_NAMES[suite]["autoregressive"]
    for cand in (source / "tokenizer.json", ar_dir / "tokenizer.json"):
        if cand.exists():
            return cand
    return None


def init_weights(model: MultiHeadBC, source: Path, suite: str = "mw") -> str:
    """Start a new run from earlier weights (the optimiser and step count start afresh).

    ``source`` is a training run directory (its ``state.safetensors``) or a directory holding
    exported policies (e.g. ``checkpoints/``): the suite's own (``tiny-ar``, ``mt10w-flow``, ...)
    or, for a suite that grows another (mt10w from mt10), that suite's. Every tensor whose name
    and shape match is taken; heads the source lacks or shapes that changed (a longer chunk)
    start fresh, and the returned line says how many tensors came from where.
    """
    if (source / "state.safetensors").exists():
        tensors = load_file(source / "state.safetensors")
        weights, said = _vision_tower(
            model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
        )
        return f"run {source} ({_load_matching(model, weights)}{said})"
    for candidate in (suite, *GROWS_FROM.get(suite, ())):
        dirs = {fam: source / name for fam, name in EXPORT_NAMES[candidate].items()}
        if (dirs["autoregressive"] / "config.json").exists():
            break
    else:
        raise ValueError(f"--init-from {source}: no state.safetensors and no exported policies")
    weights = {}
    prefixes = {
        "parallel": ("oft.", "action_head."),
        "diffusion": ("dit.", "action_model."),
        "flow": ("flow.", "action_expert."),
    }
    for family, d in dirs.items():
        if not (d / "config.json").exists():
            continue
        vla, _ = load_vla(d)
        state = vla.state_dict()
        if family == "autoregressive":
            weights.update({f"trunk.{k}": v for k, v in state.items()})
        elif family in prefixes:
            ours, theirs = prefixes[family]
            weights.update(
                {ours + k[len(theirs) :]: v for k, v in state.items() if k.startswith(theirs)}
            )
    weights, said = _vision_tower(model, weights)
    return f"policies {source} ({candidate} suite; {_load_matching(model, weights)}{said})"


TOWER = "trunk.vision_backbone.featurizer."


def _tower_kind(keys) -> str:
    """Which ViT a tower's (HF-named) tensors come from: CLIP and DINOv2 name their class
    tokens apart; SigLIP has none."""
    if any(k.endswith("embeddings.class_embedding") for k in keys):
        return "clip"
    return "dinov2" if any(k.endswith("embeddings.cls_token") for k in keys) else "siglip"


def _vision_tower(model: MultiHeadBC, weights: dict[str, Tensor]) -> tuple[dict, str]:
    """The source's vision tower made to fit the model's, and what was done, said (a note
    for the init line; empty when the towers are of one kind).

    Towers of two kinds share most tensor names (SigLIP's and CLIP's blocks are named alike),
    so matching by name alone would load a tower into another silently, and SigLIP's N
    positions into CLIP's CLS + N rows shifted by one. A SigLIP tower starts a CLIP one
    through ``siglip_to_clip_vit`` (the patch conv, blocks and final norm; the class token and
    ``pre_layrnorm`` fresh): on mt10p's data it starts mt10p-llava at an AR loss of 1.05
    against 1.72 with a fresh tower, 0.89 against 0.98 after 40 steps (2026-12-06). Any other
    change of kind starts the tower fresh."""
    ours = model.cfg.vision[0].kind
    tower = {k[len(TOWER) :]: v for k, v in weights.items() if k.startswith(TOWER)}
    if len(model.cfg.vision) != 1 or not tower or _tower_kind(tower) == ours:
        return weights, ""
    theirs = _tower_kind(tower)
    rest = {k: v for k, v in weights.items() if not k.startswith(TOWER)}
    if (theirs, ours) != ("siglip", "clip"):
        return rest, f"; the source's {theirs} vision tower dropped: the {ours} tower starts fresh"
    moved = {TOWER + k: v for k, v in siglip_to_clip_vit(tower).items()}
    fresh = sorted(
        k.removeprefix(TOWER) for k in model.state_dict() if k.startswith(TOWER) and k not in moved
    )
    said = (
        f"; vision tower SigLIP -> CLIP: {len(moved)} tensors from the SigLIP tower (its "
        f"patch conv bias folded into the positions), fresh: {', '.join(fresh)}"
    )
    return rest | moved, said


def _load_matching(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> str:
    """Copy the tensors whose name and shape match; say what was taken and what was not.

    A weight matrix that only gained inputs (same rows, more columns: the proprio projector
    of a policy whose state gained the goal) is widened with zero columns, so the new inputs
    start ignored and the model starts as exactly the one it grows from."""
    own = model.state_dict()
    match = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    widened, grown = [], []
    for k, v in weights.items():
        mine = own.get(k)
        if mine is None or k in match or not mine.ndim == v.ndim == 2:
            continue
        if mine.shape[0] == v.shape[0] and mine.shape[1] > v.shape[1]:
            wide = torch.zeros_like(mine)
            wide[:, : v.shape[1]] = v
            match[k] = wide
            widened.append(k)
        elif mine.shape[1] == v.shape[1] and mine.shape[0] > v.shape[0]:
            # A vocabulary that grew (mt10p-fast's FAST ids above mt10p's 512): the old ids keep
            # their rows, the new ones keep their fresh initialisation.
            rows = mine.detach().clone()
            rows[: v.shape[0]] = v
            match[k] = rows
            grown.append(k)
    model.load_state_dict(match, strict=False)
    # Tied aliases (the flow expert's lm_head is its embedding) load with their first name.
    unique = _unique_state(model)
    loaded = [k for k in unique if k in match]
    fresh = sorted({k.split(".")[0] for k in unique if k not in match})
    line = f"{len(loaded)} of {len(unique)} tensors loaded; fresh: {', '.join(fresh) or 'none'}"
    line += f"; widened with zero inputs: {', '.join(widened)}" if widened else ""
    return line + (f"; grown with fresh rows: {', '.join(grown)}" if grown else "")


def parent_run(run: Path) -> Path | None:
    """The run directory ``run`` started from (its ``--init-from``), or None: started fresh,
    from exported policies, or from itself."""
    state = json.loads((Path(run) / "state.json").read_text())
    parent = state.get("config", {}).get("init_from") or ""
    if not parent or not (Path(parent) / "state.json").exists():
        return None
    return None if Path(parent).resolve() == Path(run).resolve() else Path(parent)


def lineage_samples(run: Path, _depth: int = 0) -> int:
    """Samples seen by ``run`` and by every run it grew from."""
    if _depth > 16 or not (Path(run) / "state.json").exists():
        return 0
    state = json.loads((Path(run) / "state.json").read_text())
    return int(state.get("samples", 0)) + lineage_before(run, _depth)


def lineage_before(run: Path, _depth: int = 0) -> int:
    """Samples every run ``run`` grew from had seen when it started from them (0 for a run
    started fresh or from exported policies). Read from the state where the run recorded it,
    else from its parents' states as they are now."""
    if not (Path(run) / "state.json").exists():
        return 0
    state = json.loads((Path(run) / "state.json").read_text())
    if "lineage_before" in state:
        return int(state["lineage_before"])
    parent = parent_run(run)
    return 0 if parent is None else lineage_samples(parent, _depth + 1)


def default_init(cfg: TrainConfig) -> Path | None:
    """Where a run with no state starts: --init-from, else the committed checkpoints of the
    suite (so training continues the shipped policies), else nothing (random weights)."""
    if cfg.init_from:
        return Path(cfg.init_from)
    shipped = checkpoints_dir()
    for suite in (cfg.suite, *GROWS_FROM.get(cfg.suite, ())):
        if (shipped / EXPORT_NAMES[suite]["autoregressive"] / "config.json").exists():
            return shipped
    return None


# ---------------------------------------------------------------------------------------------
# Loop


def lr_at(
    cfg: TrainConfig, step: int, seconds: float = 0.0, rewarm_from: int | None = None
) -> float:
    """Linear warmup, then cosine to 5% of ``lr`` over steps or ``budget_minutes``; after a
    resume without moments (``rewarm_from``), the scheduled LR ramps up again over
    ``cfg.rewarm`` steps."""
    if rewarm_from is not None and step >= rewarm_from:
        ramp = min(1.0, (step - rewarm_from + 1) / max(1, getattr(cfg, "rewarm", 1)))
        return ramp * lr_at(cfg, step, seconds)
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.budget_minutes:
        progress = max(progress, seconds / (60 * cfg.budget_minutes))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(cfg: TrainConfig, export_only: bool = False) -> dict:
    from vlarun.models.device import cpu_only

    cpu_only(cfg.device, "vlarun train")
    export_only = export_only or cfg.export_only
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = cfg.run_dir
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    init_from = default_init(cfg)
    tokenizer_path = out / "tokenizer.json"
    data_manifest = json.loads((demo_dirs(cfg.demos)[0] / "manifest.json").read_text())
    instructions = [data_manifest["tasks"][t]["instruction"] for t in data_manifest["task_names"]]
    if init_from is not None and not tokenizer_path.exists():
        # Reuse the source's tokenizer: the embeddings being continued were trained on its ids.
        source_tok = _source_tokenizer(init_from, cfg.suite)
        if source_tok is not None:
            shutil.copyfile(source_tok, tokenizer_path)
    tokenizer = build_tokenizer(instructions, tokenizer_path)
    model = MultiHeadBC(cfg.suite)
    fast_dir = out / FAST_TOKENIZER_DIR
    source_fast = None if init_from is None else init_from / FAST_TOKENIZER_DIR
    if (
        model.cfg.fast is not None
        and not fast_dir.is_dir()
        and source_fast is not None
        and source_fast.is_dir()
    ):
        # A run continued from a FAST run keeps its ids: its embeddings were trained on them.
        shutil.copytree(source_fast, fast_dir)
    if model.cfg.fast is not None and fast_dir.is_dir():  # a resumed run keeps its vocabulary
        model.trunk.set_fast_tokenizer(
            FastTokenizer.load(
                fast_dir, action_horizon=model.cfg.horizon, action_dim=model.cfg.action_dim
            )
        )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    meta = load_state(out, model, opt)
    if meta is None:
        meta = {"step": 0, "seconds": 0.0, "config": cfgio.to_dict(cfg)}
        if init_from is not None:
            meta["init_from"] = init_weights(model, init_from, cfg.suite)
            if (init_from / "state.json").exists():  # a run: what it had seen counts too
                meta["lineage_before"] = lineage_samples(init_from)
            print(f"vlarun train: initialised from {meta['init_from']}", file=sys.stderr)
    elif not export_only:
        _note_changes(cfg, meta)
    if meta.get("rewarm_from") is not None:
        print(
            f"vlarun train: resuming at step {meta['step']} without AdamW moments (the state "
            f"keeps them only under {cfg.moments_mb:g} MB): the LR re-warms over {cfg.rewarm} "
            "steps",
            file=sys.stderr,
        )
    spent = cfg.budget_minutes and meta["seconds"] / 60 >= cfg.budget_minutes
    if not export_only and meta["step"] < cfg.steps and not spent:
        # Batch k is drawn from (seed, k) whatever ran before: a resumed run continues the stream.
        sampler = DemoSampler(
            cfg.demos,
            model.chunk,
            tokenizer,
            cfg.seed,
            model.cfg.num_images,
            balance=cfg.balance,
            goal_in_state=model.cfg.goal_in_state,
            task_weights=parse_task_weights(cfg.task_weights),
            state_noise=cfg.state_noise,
            early_share=cfg.early_share,
            early_steps=cfg.early_steps,
        )
        if model.cfg.fast is not None and model.trunk.fast_head is None:
            model.trunk.set_fast_tokenizer(fit_fast_tokenizer(sampler, model.cfg, fast_dir))
        probe = sampler.sample(cfg.batch, cfg.shift, step=-1)  # not a batch of the run

        def one_step() -> None:
            model(probe).total.backward()

        precision = choose_precision(cfg.precision, step=one_step)
        model.zero_grad(set_to_none=True)
        print(f"vlarun train: precision {precision.reason}", file=sys.stderr)
        meta["precision"] = precision.reason
        if cfg.suite in AUX_SUITES and sampler.targets is None:
            raise ValueError(
                f"suite {cfg.suite} trains on targets; {cfg.demos} has none "
                "(collect again: format 2 stores them)"
            )
        meta = _loop(cfg, model, opt, sampler, meta, out, precision.bf16)
    if model.cfg.fast is not None and model.trunk.fast_head is None:
        raise ValueError(
            f"{out} has no {FAST_TOKENIZER_DIR}/: a FAST policy exports only "
            "after its run fitted one (train it first)"
        )
    # An export-only call describes the run as it trained, not this call's options (which may
    # name other demos or leave the LR at its default).
    return export(run_config(cfg, meta) if export_only else cfg, model, meta, out)


def run_config(cfg: TrainConfig, meta: dict) -> TrainConfig:
    """The options the saved run last trained with: its starting config, each recorded steering
    change applied, this call's output directory kept. Options a later vlarun retired are
    dropped (their values were recorded in the state)."""
    saved = dict(meta.get("config", {}))
    for change in meta.get("changes", []):
        saved[change["option"]] = change["new"]
    known = {f.name for f in dataclasses.fields(TrainConfig) if f.init}
    saved = {k: v for k, v in saved.items() if k in known}
    return dataclasses.replace(cfgio.from_dict(TrainConfig, saved), out=cfg.out)


# The FAST vocabulary is fitted on this many training chunks (spread evenly over the frames): a
# BPE over ~20k codes of 32 coefficients takes seconds and sees every task.
FAST_FIT_CHUNKS = 20_000
# FAST's quantisation scale. On mt10p-clean's 8 x 4 chunks (2,000 held-out chunks, 512 ids,
# 2026-12-06): scale 10 (the reference's default) codes 7.6 ids at a mean error of 0.013 (max
# 0.105, 5% of the action range); 20: 10.5 ids, 0.0077; 40: 11.4 ids, 0.0033 (max 0.026), about
# the 256 bins' own step. Meta-World's scripted actions are jerky, not 50 Hz smooth, so the
# precision is bought for 4 more ids.
FAST_SCALE = 40.0


def fit_fast_tokenizer(sampler: DemoSampler, cfg, directory: Path) -> FastTokenizer:
    """Fit a FAST tokenizer on the run's own normalised chunks, save it in ``directory`` (the
    run's, so a resumed run and its export use the same ids) and say how long its codes are."""
    chunks = sampler.chunks[:, : cfg.chunk].numpy()
    pick = np.linspace(0, len(chunks) - 1, min(FAST_FIT_CHUNKS, len(chunks))).astype(int)
    tok = FastTokenizer.fit(
        list(chunks[pick].astype(np.float64)), scale=FAST_SCALE, vocab_size=cfg.fast.vocab_size
    )
    lengths = [len(tok.encode(c)) for c in chunks[pick[::10]]]
    tok.save(directory)
    print(
        f"vlarun train: FAST tokenizer fitted on {len(pick)} chunks of {cfg.chunk} x "
        f"{cfg.action_dim}: codes of {np.mean(lengths):.1f} ids on average (max "
        f"{max(lengths)}, cap {cfg.fast.max_tokens - 1}); {tok.clamped} coefficients clamped",
        file=sys.stderr,
    )
    if max(lengths) >= cfg.fast.max_tokens:
        raise ValueError(
            f"a FAST code of {max(lengths)} ids exceeds the preset's cap "
            f"({cfg.fast.max_tokens - 1} before END)"
        )
    return tok


# Options that change what a run learns from; resuming with another value is allowed (a run is
# steered between stretches) but said, and kept in the state beside the config it started with.
STEERING = ("loss_weights", "task_weights", "state_noise", "early_share", "early_steps")


def _note_changes(cfg, meta: dict) -> None:
    """Say which steering options a resumed run continues with other values than it last ran
    with, and record each change (step, option, old, new) in ``meta["changes"]``."""
    now = cfgio.to_dict(cfg)
    last = dict(meta.get("config", {}))
    for change in meta.get("changes", []):
        last[change["option"]] = change["new"]
    for name in STEERING:
        old = last.get(name, TrainConfig.__dataclass_fields__[name].default)
        if now.get(name) != old:
            meta.setdefault("changes", []).append(
                {"step": meta["step"], "option": name, "old": old, "new": now.get(name)}
            )
            said = f"{name} = {now.get(name)!r} (it ran with {old!r} until now)"
            print(f"vlarun train: resuming at step {meta['step']} with {said}", file=sys.stderr)


def resumable_loop(cfg, model, opt, meta: dict, out: Path, losses_at, log, desc: str) -> dict:
    """The optimisation loop shared by `vlarun train` and `vlarun distill`.

    ``losses_at(step)`` samples a batch and returns its losses (``.total``, ``.as_floats()``);
    ``cfg`` carries steps, batch, lr/warmup, log_every, save_every, max_minutes, budget_minutes
    (and, where it has them, save_minutes, moments_mb, rewarm, stop_after).
    Logs a JSON line every ``log_every`` steps to ``log``, saves resumable state every
    ``save_every`` steps or ``save_minutes`` and when the time limit or budget runs out;
    returns the updated meta.

    SIGTERM or SIGINT (Ctrl-C, ``kill``) ends the run after the current step with its state
    saved, and the caller goes on to export: a run can be cut at any time, e.g. to give a
    benchmark the machine, and resumes where it stopped. (SIGSTOP would also pause it, but the
    paused time would count against ``budget_minutes``.)
    """
    model.train()
    start_step, t0, seconds0 = meta["step"], time.time(), meta["seconds"]
    save_minutes = getattr(cfg, "save_minutes", 0.0)
    moments_mb = getattr(cfg, "moments_mb", 0.0)
    stop_after = getattr(cfg, "stop_after", 0)
    rewarm_from = meta.get("rewarm_from")
    last_save = time.time()
    bar = tqdm(total=cfg.steps, initial=start_step, desc=desc, unit="step")
    stop = _StopRequest()
    for step in range(start_step, cfg.steps):
        lr = lr_at(cfg, step, meta["seconds"], rewarm_from)
        for g in opt.param_groups:
            g["lr"] = lr
        losses = losses_at(step)
        opt.zero_grad(set_to_none=True)
        losses.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        meta = meta | {
            "step": step + 1,
            "samples": (step + 1) * cfg.batch,
            "seconds": seconds0 + time.time() - t0,
        }
        bar.update(1)
        if (step + 1) % cfg.log_every == 0:
            rate = (step + 1 - start_step) * cfg.batch / (time.time() - t0)
            entry = {
                "step": step + 1,
                "samples": (step + 1) * cfg.batch,
                "lr": lr,
                "samples_per_s": round(rate, 1),
                "minutes": round(meta["seconds"] / 60, 2),
            } | losses.as_floats()
            log.write(json.dumps(entry) + "\n")
            log.flush()
            bar.set_postfix(
                {k: f"{v:.3f}" for k, v in losses.as_floats().items()}
                | {"sps": entry["samples_per_s"]}
            )
        done = step + 1 == cfg.steps
        out_of_time = (cfg.max_minutes and (time.time() - t0) / 60 >= cfg.max_minutes) or (
            cfg.budget_minutes and meta["seconds"] / 60 >= cfg.budget_minutes
        )
        cut = stop_after and step + 1 - start_step >= stop_after
        due = save_minutes and (time.time() - last_save) / 60 >= save_minutes
        if (step + 1) % cfg.save_every == 0 or due or done or out_of_time or cut or stop.requested:
            meta = save_state(out, model, opt, meta, moments_mb)
            last_save = time.time()
        if out_of_time or cut or stop.requested:
            break
    bar.close()
    stop.restore()
    meta["samples_per_s"] = round(
        (meta["step"] - start_step) * cfg.batch / max(time.time() - t0, 1e-9), 1
    )
    return meta


class _StopRequest:
    """Turns SIGTERM / SIGINT into a flag the loop checks between steps (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second signal: stop now, without waiting for the step
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nsignal {signum}: stopping after this step (state saved)", file=sys.stderr)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Prefetcher:
    """Draws the batches of steps ``start, start + 1, ...`` in a thread, ``depth`` ahead of the
    optimiser (drawing a batch, ~0.1 s, is ~10% of a step once steps are fast)."""

    def __init__(self, sampler: DemoSampler, batch: int, shift: int, start: int, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._halt = threading.Event()
        self._next = start

        def produce() -> None:
            step = start
            while not self._halt.is_set():
                item = (step, sampler.sample(batch, shift, step))
                while not self._halt.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1

        self._thread = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
        self._thread.start()

    def get(self, step: int) -> Batch:
        """The batch of ``step`` (steps are asked for in order)."""
        if step != self._next:
            raise RuntimeError(f"batches are drawn in order: asked for {step}, next {self._next}")
        got, batch = self._queue.get()
        self._next = got + 1
        return batch

    def close(self) -> None:
        self._halt.set()
        self._thread.join()


def _loop(cfg, model, opt, sampler: DemoSampler, meta: dict, out: Path, bf16: bool) -> dict:
    meta["demos_manifest"] = {
        "tasks": sampler.manifest["task_names"],
        "episodes": len(sampler.manifest["episodes"]),
        "frames": len(sampler),
    }
    meta["statistics"] = sampler.stats_json  # saved with every state: export needs no demos
    batches = Prefetcher(sampler, cfg.batch, cfg.shift, meta["step"])
    weights = parse_loss_weights(cfg.loss_weights)

    def losses_at(step: int):
        batch = batches.get(step)
        # The heads' noise (diffusion timesteps, flow times) comes from the global generator:
        # seeded by step, so a resumed run draws what a run done at once would.
        torch.manual_seed(cfg.seed * 1_000_003 + step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            losses = model(batch)
        losses.weights = weights
        return losses

    try:
        with (out / "train.log").open("a") as log:
            meta = resumable_loop(cfg, model, opt, meta, out, losses_at, log, "train")
    finally:
        batches.close()
    print(
        f"vlarun train: {meta['samples_per_s']} samples/s ({'bf16 autocast' if bf16 else 'fp32'}"
        f", {torch.get_num_threads()} threads); {meta['step'] * cfg.batch} samples seen",
        file=sys.stderr,
    )
    return meta


def export(cfg: TrainConfig, model: MultiHeadBC, meta: dict, out: Path) -> dict:
    """Write one checkpoint per family (bf16 weights, config, statistics, tokenizer, card)."""
    stats = meta.get("statistics")
    if stats is None:  # exporting a run saved before statistics were kept in its state
        demos = concat_demos([load_demos(d) for d in demo_dirs(cfg.demos)])
        stats = merged_statistics(with_goal_state(demos) if model.cfg.goal_in_state else demos)
    written = {}
    if "lineage_before" not in meta:  # a run started before runs recorded it: its parents'
        meta = {**meta, "lineage_before": lineage_before(out)}
    for family, vla in model.export().items():
        name = EXPORT_NAMES[cfg.suite][family]
        card = model_card(name, family, cfg, meta)
        # Stored in bf16 (half the bytes in git); loaded into fp32 unless a dtype is asked for.
        path = save_vla(
            vla.to(torch.bfloat16),
            out / "export" / name,
            norm_stats=stats,
            tokenizer_file=out / "tokenizer.json",
            extra_files={"README.md": card},
        )
        written[name] = str(path)
    return {"step": meta["step"], "minutes": meta["seconds"] / 60, "exported": written}


def _data_names(demos: str) -> str:
    """The demo directories by name, not by one machine's path (a card outlives the cache)."""
    return ",".join(Path(d).name for d in demos.split(",") if d)


def model_card(name: str, family: str, cfg: TrainConfig, meta: dict) -> str:
    precision = meta.get("precision", cfg.precision)
    start = (
        f"- initialised from: {meta['init_from']}; the steps and wall time below are this "
        "run's only\n"
        if meta.get("init_from")
        else ""
    )
    before = meta.get("lineage_before", 0)
    lineage = (
        f"; {before + meta['step'] * cfg.batch:,} with the runs it grew from" if before else ""
    )
    inputs = (
        "- inputs: **the goal xyz in the state** (Meta-World's own MT observation, "
        "`partially_observable=False`): a labelled variant, never in a table with the "
        "image-only policies\n"
        if get_preset(name).goal_in_state
        else ""
    )
    return (
        f"# {name}\n\nA {family} VLA trained by behaviour cloning on scripted Meta-World v3 "
        f"demonstrations (`vlarun train`).\n\n- data: `{_data_names(cfg.demos)}` "
        f"({meta.get('demos_manifest', 'see manifest')})\n{inputs}{start}"
        f"- steps: {meta['step']} x batch {cfg.batch}, lr {cfg.lr}, "
        f"random shift {cfg.shift} px, "
        + (f"{cfg.state_noise * 100:g} cm of noise on the hand state, " if cfg.state_noise else "")
        + (f"task weights {cfg.task_weights}, " if cfg.task_weights else "")
        + (f"loss weights {cfg.loss_weights}, " if cfg.loss_weights else "")
        + (
            f"{cfg.early_share:.0%} of samples from the first {cfg.early_steps} frames, "
            if cfg.early_share
            else ""
        )
        + f"{precision}, "
        f"{cfg.threads or 'default'} torch thread(s)\n"
        + "".join(
            f"- from step {c['step']}: {c['option']} {c['new']!r} (until then {c['old']!r})\n"
            for c in meta.get("changes", [])
        )
        + f"- wall time: {meta['seconds'] / 60:.1f} min ({meta['step'] * cfg.batch} samples seen"
        f"{lineage}) on {meta.get('cpu', cpu_name())}\n"
        f"- success: `vlarun eval --policy {name} --tasks mt10 --episodes 25 --json` measures it;"
        " the run's training curve (`curve.jsonl` beside its state) has each stretch's\n"
    )
