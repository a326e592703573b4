"""Demonstrations as a committed manifest: simulator states in the repository, pixels rendered
where they are needed.

A collection of ~100k frames is ~10 GB of pixels and is lost with the machine it was rendered
on; the simulator states it was rendered from are ~0.2 KB per frame. :func:`save_manifest`
keeps, from a collected directory (``vlarun demos --out DIR``), what makes every frame again:

    NAME/manifest.json   the collection's manifest (tasks, seeds, expert, DART noise, DAgger,
                         cameras, episode boundaries, statistics) with a ``replay`` entry
    NAME/replay.npz      per task: ``TASK.sim_states`` float32 (T, n) (qpos, qvel, mocap),
                         ``TASK.actions`` float32 (T, 4) (the labels), and fingerprints:
                         ``TASK.probe_frames`` int64 (P,) and ``TASK.probe_thumbs`` uint8
                         (P, V, 8, 8, 3), 16 x 16 pixel block means of each episode's first
                         and middle frame

:func:`render_manifest` (``vlarun demos --from-manifest NAME --out DIR``) resets each episode
to its seed, puts the simulator in every stored state, renders the manifest's cameras and
writes shards in :mod:`vlarun.sim.demos`' format (so ``load_demos`` and ``vlarun train`` read
them as if collected here), on all cores with a progress bar. It checks that each episode's seed
resets the simulator to its stored first state, then compares the probe frames' thumbnails with
the committed ones: rendering is not bit-exact across machines (GL drivers), so the check is a
bound on the mean block difference, not a hash. The first frame of an episode is
the one ``reset`` renders (Meta-World's reset leaves a body pose that a state restore updates).

``np.load(..., allow_pickle=False)``: nothing in a manifest can run code.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from tqdm import tqdm

from vlarun.sim.demos import (
    FORMAT,
    MANIFEST,
    STATISTICS,
    FrameStore,
    _memmap_tensor,
    _statistics,
    _write_json,
)
from vlarun.sim.tasks import get_task

REPLAY = "replay.npz"
THUMB_BLOCK = 16  # a 128 px frame becomes 8 x 8 block means
# Mean absolute difference (0-255 levels) of the probe thumbnails above which a rendering is
# not the committed one. Measured: a state restore on the collecting machine differs in < 0.1%
# of pixels (one frame in 2,000 by 6%: a reset pose); a different scene (another seed, another
# camera) differs by tens of levels. Another machine's MuJoCo / Mesa (2026-12-06: mujoco 3.3.0,
# Mesa 22.3.6 llvmpipe) renders the restored mid-episode probes a few levels apart (first
# frames exact): mt10p-clean's tasks 0.0-1.44 on average, drawer-open 2.04 (worst probe 7.7),
# which the first bound (2.0) refused after 17 minutes of rendering.
MAX_THUMB_DIFF = 4.0


def thumbnail(frames: np.ndarray) -> np.ndarray:
    """uint8 (..., S, S, 3) -> uint8 (..., S/16, S/16, 3): 16 x 16 block means."""
    *lead, s, _, c = frames.shape
    k = s // THUMB_BLOCK
    blocks = frames.reshape(*lead, k, THUMB_BLOCK, k, THUMB_BLOCK, c).astype(np.float32)
    return blocks.mean(axis=(-4, -2)).round().astype(np.uint8)


def save_manifest(demo_dir: str | os.PathLike[str], to: str | os.PathLike[str]) -> dict:
    """Write ``to/manifest.json`` and ``to/replay.npz`` from a collected ``demo_dir``.

    Raises ValueError when the collection has no simulator states (collected before format 3).
    """
    src, dst = Path(demo_dir), Path(to)
    manifest = json.loads((src / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{src}: format {manifest.get('format')!r} stores no simulator states;"
            f" collect again (format {FORMAT})"
        )
    arrays: dict[str, list[np.ndarray]] = {}
    for shard in manifest["shards"]:
        task = shard["task"]
        with safe_open(str(src / shard["file"]), framework="np") as f:
            index = f.get_tensor("episode_index")
            starts = np.flatnonzero(np.diff(index, prepend=-1))
            ends = np.append(starts[1:], len(index))
            # Two probes per episode: its first frame (reset alone) and its middle one (restore).
            middle = np.sort(np.concatenate((starts, (starts + ends) // 2)))
            base = sum(len(a) for a in arrays.get(f"{task}.actions", []))
            for key in ("sim_states", "actions"):
                arrays.setdefault(f"{task}.{key}", []).append(f.get_tensor(key))
            images = f.get_slice("images")
            thumbs = np.stack([thumbnail(_views(images[int(i)])) for i in middle])
        arrays.setdefault(f"{task}.probe_frames", []).append(middle.astype(np.int64) + base)
        arrays.setdefault(f"{task}.probe_thumbs", []).append(thumbs)
    dst.mkdir(parents=True, exist_ok=True)
    joined = {k: np.concatenate(v) for k, v in arrays.items()}
    tmp = dst / (REPLAY + ".tmp.npz")
    np.savez_compressed(tmp, **joined)
    tmp.replace(dst / REPLAY)
    frames = sum(len(v) for k, v in joined.items() if k.endswith(".actions"))
    manifest["replay"] = {
        "file": REPLAY,
        "frames": frames,
        "bytes": (dst / REPLAY).stat().st_size,
        "rendered_from": "reset(seed) for each episode's first frame, then MetaWorldEnv.restore",
    }
    _write_json(dst / MANIFEST, manifest)
    return manifest


def _views(frame: np.ndarray) -> np.ndarray:
    return frame if frame.ndim == 4 else frame[None]


@dataclass(frozen=True)
class _RenderJob:
    task: str
    seeds: tuple[int, ...]
    lengths: tuple[int, ...]
    first: int  # the shard's first frame among the task's frames in replay.npz
    path: str
    image_size: int
    cameras: tuple[str, ...]
    manifest_dir: str


def _render_shard(job: _RenderJob) -> dict[str, Any]:
    """Render one shard's episodes from their states; write it as ``collect`` would."""
    from vlarun.sim.env import MetaWorldEnv

    with np.load(Path(job.manifest_dir) / REPLAY, allow_pickle=False) as replay:
        n = sum(job.lengths)
        states = replay[f"{job.task}.sim_states"][job.first : job.first + n]
        actions = replay[f"{job.task}.actions"][job.first : job.first + n]
    env = MetaWorldEnv(
        job.task, image_size=job.image_size, camera=job.cameras[0], extra_cameras=job.cameras[1:]
    )
    images, obs_states, targets = [], [], []
    try:
        at = 0
        for seed, length in zip(job.seeds, job.lengths, strict=True):
            obs, _ = env.reset(seed=seed)
            if not np.allclose(env.sim_state(), states[at], atol=1e-5):
                raise ValueError(
                    f"{job.task}: reset(seed={seed}) does not give the episode's stored first "
                    "state (a different seed, task or Meta-World version than the collection's)"
                )
            for i in range(length):
                if i:
                    obs = env.restore(states[at + i])
                images.append(obs.get("views", obs["image"]))
                obs_states.append(obs["state"])
                targets.append(env.targets)
            at += length
    finally:
        env.close()
    tensors = {
        "images": np.stack(images),
        "states": np.stack(obs_states).astype(np.float32),
        "actions": np.asarray(actions, dtype=np.float32),
        "episode_index": np.concatenate(
            [np.full(n, i, np.int32) for i, n in enumerate(job.lengths)]
        ),
        "step_index": np.concatenate([np.arange(n, dtype=np.int32) for n in job.lengths]),
        "targets": np.stack(targets).astype(np.float32),
        "sim_states": np.asarray(states, dtype=np.float32),
    }
    metadata = {
        "format": FORMAT,
        "task": job.task,
        "instruction": get_task(job.task).instruction,
        "seeds": json.dumps(list(job.seeds)),
    }
    tmp = job.path + ".tmp"
    save_file(tensors, tmp, metadata=metadata)
    os.chmod(tmp, 0o644)
    os.replace(tmp, job.path)
    return {"file": Path(job.path).name, "episodes": len(job.seeds)}


def render_manifest(
    manifest_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    workers: int = 0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Render a committed manifest's frames into ``out_dir``; returns the manifest, with a
    ``fingerprint`` entry (probes compared, worst and mean block difference).

    Raises:
        FileExistsError: ``out_dir`` holds a manifest and ``overwrite`` is False.
        ValueError: the manifest has no replay, or the rendered probes differ from the
            committed ones by more than :data:`MAX_THUMB_DIFF` (a different simulator or
            renderer: the message names the task and the difference).
    """
    src, out = Path(manifest_dir), Path(out_dir)
    if not (src / MANIFEST).is_file():
        raise FileNotFoundError(
            f"no {MANIFEST} in {src} (want a committed manifest folder, e.g. "
            "assets/demos/mt10p-clean)"
        )
    manifest = json.loads((src / MANIFEST).read_text())
    if "replay" not in manifest or not (src / REPLAY).exists():
        raise ValueError(f"{src}: no {REPLAY} beside {MANIFEST} (not a committed manifest)")
    if (out / MANIFEST).exists() and not overwrite:
        raise FileExistsError(f"{out / MANIFEST} exists; pass --overwrite to replace it")
    check_fingerprints(src, None, manifest)  # the probes alone, before minutes of rendering
    out.mkdir(parents=True, exist_ok=True)
    per_shard = _shard_episodes(manifest)
    jobs, first = [], dict.fromkeys(manifest["task_names"], 0)
    for shard in manifest["shards"]:
        eps = per_shard[shard["file"]]
        task = shard["task"]
        jobs.append(
            _RenderJob(
                task,
                tuple(e["seed"] for e in eps),
                tuple(e["frames"] for e in eps),
                first[task],
                str(out / Path(shard["file"]).name),
                manifest["image_size"],
                tuple(manifest["cameras"]),
                str(src),
            )
        )
        first[task] += sum(e["frames"] for e in eps)
    workers = workers or os.cpu_count() or 1
    bar = tqdm(total=manifest["num_frames"], desc="rendering", unit="frame", disable=not progress)
    frames_of = {job.path: sum(job.lengths) for job in jobs}
    if workers == 1:
        for job in jobs:
            _render_shard(job)
            bar.update(frames_of[job.path])
    else:
        ctx = multiprocessing.get_context("spawn")  # a forked child would share GL state
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = {pool.submit(_render_shard, job): job for job in jobs}
            for future in as_completed(futures):
                future.result()
                bar.update(frames_of[futures[future].path])
    bar.close()
    fingerprint = check_fingerprints(src, out, manifest)
    rendered = {k: v for k, v in manifest.items() if k != "replay"}
    rendered["rendered_from"] = str(src)
    rendered["fingerprint"] = fingerprint
    _write_json(out / STATISTICS, _statistics(out, manifest["shards"]))
    _write_json(out / MANIFEST, rendered)  # last: its presence marks a complete collection
    return rendered


# Probes per task rendered alone before a set is rendered (those of its first 8 episodes).
EARLY_PROBES = 16


def check_fingerprints(manifest_dir: Path, out: Path | None, manifest: dict) -> dict:
    """Compare the rendered probe frames with the committed thumbnails; ValueError past the
    bound, naming the task and the difference. ``out`` None: render the first
    ``EARLY_PROBES`` of each task alone (seconds), so that a renderer that does not match is
    refused before the whole set is rendered (minutes), not after."""
    worst, diffs = 0.0, []
    with np.load(manifest_dir / REPLAY, allow_pickle=False) as replay:
        for task in manifest["task_names"]:
            probes = replay[f"{task}.probe_frames"]
            want = replay[f"{task}.probe_thumbs"].astype(np.float32)
            if out is None:
                probes, want = probes[:EARLY_PROBES], want[:EARLY_PROBES]
            if out is None:
                views = _render_probes(manifest, task, replay[f"{task}.sim_states"], probes)
            else:
                frames = _task_frames(out, manifest, task)
                views = [frames[int(i)] for i in probes]
            got = np.stack([thumbnail(_views(v)) for v in views]).astype(np.float32)
            diff = np.abs(got - want).mean(axis=tuple(range(1, got.ndim)))  # per probe
            diffs.append(diff)
            if diff.mean() > MAX_THUMB_DIFF:
                raise ValueError(
                    f"{task}: rendered frames differ from the committed fingerprints by "
                    f"{diff.mean():.2f} levels on average (bound {MAX_THUMB_DIFF}): a different "
                    "simulator, renderer or camera than the one that collected them"
                )
            worst = max(worst, float(diff.max()))
    every = np.concatenate(diffs)
    return {"probes": int(len(every)), "mean_diff": float(every.mean()), "worst_diff": worst}


def _shard_episodes(manifest: dict) -> dict[str, list[dict]]:
    """Each shard's episodes in their order within it (the order its frames are stored in)."""
    per_shard: dict[str, list[dict]] = {}
    for ep in manifest["episodes"]:
        per_shard.setdefault(ep["shard"], []).append(ep)
    return {f: sorted(eps, key=lambda e: e["index_in_shard"]) for f, eps in per_shard.items()}


def _render_probes(manifest: dict, task: str, states: np.ndarray, probes: np.ndarray) -> list:
    """The views of ``task``'s frames ``probes`` (indices in manifest order), each rendered as
    ``_render_shard`` renders it: its episode reset to its seed, then its state restored."""
    from vlarun.sim.env import MetaWorldEnv

    per_shard = _shard_episodes(manifest)
    episodes = [e for s in manifest["shards"] if s["task"] == task for e in per_shard[s["file"]]]
    starts = np.cumsum([0] + [e["frames"] for e in episodes])
    cams = manifest["cameras"]
    env = MetaWorldEnv(
        task, image_size=manifest["image_size"], camera=cams[0], extra_cameras=tuple(cams[1:])
    )
    out = []
    try:
        for i in (int(i) for i in probes):
            k = int(np.searchsorted(starts, i, side="right")) - 1
            obs, _ = env.reset(seed=episodes[k]["seed"])
            if i > starts[k]:
                obs = env.restore(states[i])
            out.append(obs.get("views", obs["image"]))
    finally:
        env.close()
    return out


def _task_frames(out: Path, manifest: dict, task: str) -> FrameStore:
    """``task``'s rendered frames in manifest order (probes index into these), memory-mapped."""
    return FrameStore(
        [
            _memmap_tensor(out / Path(s["file"]).name, "images")
            for s in manifest["shards"]
            if s["task"] == task
        ]
    )
