"""`vlarun train`: behaviour cloning on scripted Meta-World demonstrations, resumable.

Runs in the foreground (start it with nohup/& for the background); every ``save_every`` steps it
writes ``state.safetensors`` (weights and AdamW moments, no pickle) and ``state.json`` (step,
elapsed time, config) into ``out``; starting again with the same ``out`` resumes there. Progress
goes to stderr, one JSON line per ``log_every`` steps to ``out/train.log``. At the end (and with
``--export-only``) each family is exported as a standalone checkpoint under ``out/export/``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from vlarun import config as cfgio
from vlarun.config import opt
from vlarun.models.action_tokens import NormStats, ProprioNorm
from vlarun.models.checkpoint import load_vla, save_vla
from vlarun.models.tokenizer import openvla_prompt
from vlarun.sim.bc_model import SUITES, Batch, MultiHeadBC
from vlarun.sim.demos import Demos, load_demos
from vlarun.sim.text import build_tokenizer


@dataclass(frozen=True)
class TrainConfig:
    """Behaviour cloning of a suite's three policies on one shared trunk (resumable)."""

    suite: str = opt(
        "mw",
        "mw: the 4-layer tiny-ar/-oft/-dit; mt10: the 12-layer two-view proprio mt10-ar/-oft/-dit",
        choices=tuple(SUITES),
    )
    demos: str = opt("data/demos128", "demo directory, or several joined by commas")
    out: str = opt("runs/mw", "run directory: state, log and exported policies (resumes there)")
    init_from: str = opt("", "start from a run directory or a directory of tiny-ar/-oft/-dit")
    steps: int = opt(8000, "optimiser steps")
    batch: int = opt(32, "samples per step")
    lr: float = opt(5e-4, "peak learning rate (AdamW)")
    warmup: int = opt(300, "linear warm-up steps")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    shift: int = opt(6, "random-shift augmentation in pixels (DrQ-style); 0 = off")
    save_every: int = opt(250, "steps between resumable state saves")
    log_every: int = opt(25, "steps between train.log lines")
    seed: int = opt(0, "sampling and initialisation seed")
    bf16: bool = opt(True, "bfloat16 autocast (about 4x the fp32 matmul rate on this CPU)")
    max_minutes: float = opt(0.0, "stop (resumably) after this many minutes of this call; 0 = none")
    # The LR anneals by whichever of steps or time runs out first and training ends there, so a
    # slower (shared) machine still finishes its schedule instead of stopping at a high LR.
    budget_minutes: float = opt(0.0, "total minutes of the run (cosine schedule by time); 0 = none")
    threads: int = opt(0, "torch threads; 0 = torch's default")
    export_only: bool = opt(False, "train no further: export the run's saved state")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.lr <= 0:
            raise ValueError("steps, batch and lr must be positive")
        if self.shift < 0:
            raise ValueError(f"shift must be >= 0, got {self.shift}")
        if self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}; valid: {', '.join(SUITES)}")


# ---------------------------------------------------------------------------------------------
# Data


class DemoSampler:
    """All frames in memory; each sample is (image(s), instruction ids, normalised action chunk,
    normalised proprio state).

    ``directory`` may list several demo directories joined by commas (same tasks and image
    size); normalisation uses the first one's statistics, which the exported policies carry.
    """

    def __init__(
        self, directory: str, chunk: int, tokenizer, seed: int, num_images: int = 1
    ) -> None:
        dirs = demo_dirs(directory)
        demos = concat_demos([load_demos(d) for d in dirs])
        views = 1 if demos.images.ndim == 4 else demos.images.shape[1]
        if views < num_images:
            raise ValueError(
                f"the policy takes {num_images} views; {directory} holds {views} "
                "(collect with --extra-cameras)"
            )
        self.images = torch.from_numpy(demos.images)  # (N, S, S, 3) or (N, V, S, S, 3) uint8
        self.num_images = num_images
        self.stats_json = json.loads((dirs[0] / "dataset_statistics.json").read_text())
        self.norm = NormStats.select(self.stats_json, None)
        self.states = torch.from_numpy(ProprioNorm.select(self.stats_json).normalize(demos.states))
        actions = np.asarray(self.norm.normalize(demos.actions), dtype=np.float32)
        self.chunks = torch.from_numpy(_chunks(actions, demos.episode_index, chunk))
        self.task = torch.from_numpy(demos.task_index.astype(np.int64))
        self.text = [tokenizer.encode(openvla_prompt(i)) for i in demos.instructions]
        self.instructions = demos.instructions
        self.manifest = demos.manifest
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.images.shape[0]

    def sample(self, batch: int, shift: int) -> Batch:
        idx = torch.randint(0, len(self), (batch,), generator=self.gen)
        frames = self.images[idx]
        if frames.ndim == 4:
            frames = frames[:, None]
        frames = frames[:, : self.num_images]  # (B, V, S, S, 3)
        b, v = frames.shape[:2]
        images = frames.flatten(0, 1).permute(0, 3, 1, 2).float().div_(255.0)
        if shift:
            images = random_shift(images, shift, self.gen)
        images = images.view(b, v, *images.shape[1:]) if v > 1 else images
        text = [self.text[t] for t in self.task[idx].tolist()]
        return Batch(images, text, self.chunks[idx], self.states[idx])


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
    """Frames of several collections as one (episode indices made unique, same task order)."""
    first = parts[0]
    for p in parts[1:]:
        if p.manifest["task_names"] != first.manifest["task_names"]:
            raise ValueError(
                f"demo directories hold different tasks: {first.manifest['task_names']} vs "
                f"{p.manifest['task_names']}"
            )
        if p.images.shape[1:] != first.images.shape[1:]:  # sizes and view counts
            shapes = f"{first.images.shape[1:]} vs {p.images.shape[1:]}"
            raise ValueError(f"demo directories hold different image shapes: {shapes}")
    if len(parts) == 1:
        return first
    offsets = np.cumsum([0] + [len(p.manifest["episodes"]) for p in parts[:-1]])
    manifest = dict(first.manifest, episodes=[e for p in parts for e in p.manifest["episodes"]])
    return Demos(
        images=np.concatenate([p.images for p in parts]),
        states=np.concatenate([p.states for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        episode_index=np.concatenate(
            [p.episode_index + o for p, o in zip(parts, offsets, strict=True)]
        ),
        step_index=np.concatenate([p.step_index for p in parts]),
        task_index=np.concatenate([p.task_index for p in parts]),
        manifest=manifest,
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


def save_state(out: Path, model: MultiHeadBC, opt: torch.optim.AdamW, meta: dict) -> None:
    tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    tensors[f"opt.{names[id(p)]}.{key}"] = torch.as_tensor(st[key]).contiguous()
    tmp = out / "state.safetensors.tmp"
    save_file(tensors, tmp)
    tmp.replace(out / "state.safetensors")
    (out / "state.json").write_text(json.dumps(meta, indent=1))


def load_state(out: Path, model: MultiHeadBC, opt: torch.optim.AdamW) -> dict | None:
    if not (out / "state.safetensors").exists():
        return None
    tensors = load_file(out / "state.safetensors")
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    for name, p in model.named_parameters():
        if f"opt.{name}.exp_avg" in tensors:
            opt.state[p] = {
                key: tensors[f"opt.{name}.{key}"] for key in ("exp_avg", "exp_avg_sq", "step")
            }
    return json.loads((out / "state.json").read_text())


# The exported checkpoints' names, per suite and family.
EXPORT_NAMES = {
    "mw": {"autoregressive": "tiny-ar", "parallel": "tiny-oft", "diffusion": "tiny-dit"},
    "mt10": {"autoregressive": "mt10-ar", "parallel": "mt10-oft", "diffusion": "mt10-dit"},
}
FAMILY_NAMES = EXPORT_NAMES["mw"]


def _source_tokenizer(source: Path, suite: str = "mw") -> Path | None:
    ar_dir = source / EXPORT_NAMES[suite]["autoregressive"]
    for cand in (source / "tokenizer.json", ar_dir / "tokenizer.json"):
        if cand.exists():
            return cand
    return None


def init_weights(model: MultiHeadBC, source: Path, suite: str = "mw") -> str:
    """Start a new run from earlier weights (the optimiser and step count start afresh).

    ``source`` is a training run directory (its ``state.safetensors``) or a directory holding
    the three exported policies (``tiny-ar``, ``tiny-oft``, ``tiny-dit``, e.g. ``checkpoints/``),
    so a fresh clone can continue training the shipped policies.
    """
    if (source / "state.safetensors").exists():
        tensors = load_file(source / "state.safetensors")
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        return f"run {source}"
    dirs = {fam: source / name for fam, name in EXPORT_NAMES[suite].items()}
    missing = [str(d) for d in dirs.values() if not (d / "config.json").exists()]
    if missing:
        raise ValueError(
            f"--init-from {source}: no state.safetensors and no exported policies at {missing}"
        )
    trunk, _ = load_vla(dirs["autoregressive"])
    oft, _ = load_vla(dirs["parallel"])
    dit, _ = load_vla(dirs["diffusion"])
    model.trunk.load_state_dict(trunk.state_dict())
    model.oft.load_state_dict(oft.action_head.state_dict())
    model.dit.load_state_dict(dit.action_model.state_dict())
    return f"policies {source}"


# ---------------------------------------------------------------------------------------------
# Loop


def lr_at(cfg: TrainConfig, step: int, seconds: float = 0.0) -> float:
    """Linear warmup, then cosine to 5% of ``lr`` over steps or ``budget_minutes``."""
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
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    tokenizer_path = out / "tokenizer.json"
    data_manifest = json.loads((demo_dirs(cfg.demos)[0] / "manifest.json").read_text())
    instructions = [data_manifest["tasks"][t]["instruction"] for t in data_manifest["task_names"]]
    if cfg.init_from and not tokenizer_path.exists():
        # Reuse the source's tokenizer: the embeddings being continued were trained on its ids.
        source_tok = _source_tokenizer(Path(cfg.init_from), cfg.suite)
        if source_tok is not None:
            shutil.copyfile(source_tok, tokenizer_path)
    tokenizer = build_tokenizer(instructions, tokenizer_path)
    model = MultiHeadBC(cfg.suite)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    meta = load_state(out, model, opt)
    if meta is None:
        meta = {"step": 0, "seconds": 0.0, "config": cfgio.to_dict(cfg)}
        if cfg.init_from:
            meta["init_from"] = init_weights(model, Path(cfg.init_from), cfg.suite)
    spent = cfg.budget_minutes and meta["seconds"] / 60 >= cfg.budget_minutes
    if not export_only and meta["step"] < cfg.steps and not spent:
        sampler = DemoSampler(
            cfg.demos, model.cfg.chunk, tokenizer, cfg.seed + meta["step"], model.cfg.num_images
        )
        meta = _loop(cfg, model, opt, sampler, meta, out)
    return export(cfg, model, meta, out)


def resumable_loop(cfg, model, opt, meta: dict, out: Path, losses_at, log, desc: str) -> dict:
    """The optimisation loop shared by `vlarun train` and `vlarun distill`.

    ``losses_at(step)`` samples a batch and returns its losses (``.total``, ``.as_floats()``);
    ``cfg`` carries steps, batch, lr/warmup, log_every, save_every, max_minutes, budget_minutes.
    Logs a JSON line every ``log_every`` steps to ``log``, saves resumable state every
    ``save_every`` steps and when the time limit or budget runs out; returns the updated meta.
    """
    model.train()
    start_step, t0, seconds0 = meta["step"], time.time(), meta["seconds"]
    bar = tqdm(total=cfg.steps, initial=start_step, desc=desc, unit="step")
    for step in range(start_step, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step, meta["seconds"])
        losses = losses_at(step)
        opt.zero_grad(set_to_none=True)
        losses.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        meta = meta | {"step": step + 1, "seconds": seconds0 + time.time() - t0}
        bar.update(1)
        if (step + 1) % cfg.log_every == 0:
            rate = (step + 1 - start_step) * cfg.batch / (time.time() - t0)
            entry = {
                "step": step + 1,
                "lr": lr_at(cfg, step, meta["seconds"]),
                "samples_per_s": round(rate, 1),
                "minutes": round(meta["seconds"] / 60, 2),
            } | losses.as_floats()
            log.write(json.dumps(entry) + "\n")
            log.flush()
            bar.set_postfix({k: f"{v:.3f}" for k, v in losses.as_floats().items()} | {
                "sps": entry["samples_per_s"]})  # fmt: skip
        done = step + 1 == cfg.steps
        out_of_time = (cfg.max_minutes and (time.time() - t0) / 60 >= cfg.max_minutes) or (
            cfg.budget_minutes and meta["seconds"] / 60 >= cfg.budget_minutes
        )
        if (step + 1) % cfg.save_every == 0 or done or out_of_time:
            save_state(out, model, opt, meta)
        if out_of_time:
            break
    bar.close()
    return meta


def _loop(cfg, model, opt, sampler: DemoSampler, meta: dict, out: Path) -> dict:
    def losses_at(step: int):
        batch = sampler.sample(cfg.batch, cfg.shift)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            return model(batch)

    with (out / "train.log").open("a") as log:
        meta = resumable_loop(cfg, model, opt, meta, out, losses_at, log, "train")
    meta["demos_manifest"] = {
        "tasks": sampler.manifest["task_names"],
        "episodes": len(sampler.manifest["episodes"]),
        "frames": len(sampler),
    }
    return meta


def export(cfg: TrainConfig, model: MultiHeadBC, meta: dict, out: Path) -> dict:
    """Write one checkpoint per family (weights, config, statistics, tokenizer, card)."""
    stats = json.loads((demo_dirs(cfg.demos)[0] / "dataset_statistics.json").read_text())
    written = {}
    for family, vla in model.export().items():
        name = EXPORT_NAMES[cfg.suite][family]
        card = model_card(name, family, cfg, meta)
        path = save_vla(
            vla,
            out / "export" / name,
            norm_stats=stats,
            tokenizer_file=out / "tokenizer.json",
            extra_files={"README.md": card},
        )
        written[name] = str(path)
    return {"step": meta["step"], "minutes": meta["seconds"] / 60, "exported": written}


def model_card(name: str, family: str, cfg: TrainConfig, meta: dict) -> str:
    precision = "bf16 autocast" if cfg.bf16 else "fp32"
    start = (
        f"- initialised from: `{cfg.init_from}` ({meta.get('init_from', 'its weights')}); the "
        "steps and wall time below are this run's only\n"
        if cfg.init_from
        else ""
    )
    return (
        f"# {name}\n\nA {family} VLA trained by behaviour cloning on scripted Meta-World v3 "
        f"demonstrations (`vlarun train`).\n\n- data: `{cfg.demos}` "
        f"({meta.get('demos_manifest', 'see manifest')})\n{start}- steps: {meta['step']} x batch "
        f"{cfg.batch}, lr {cfg.lr}, random shift {cfg.shift} px, {precision}, "
        f"{cfg.threads or 'default'} torch thread(s)\n"
        f"- wall time: {meta['seconds'] / 60:.1f} min on this repository's development CPU\n"
        "- success: see BENCHMARKS.md (`vlarun eval`)\n"
    )
