"""`vlarun demos`: collect scripted-expert demonstrations (:mod:`vlarun.sim.demos`), or render a
committed manifest's frames again (:mod:`vlarun.sim.demo_replay`); also
``python -m vlarun.sim.demos_cli`` with the same flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from vlarun.config import add_options, opt, parse_into
from vlarun.sim import demo_replay
from vlarun.sim.demos import MANIFEST, collect
from vlarun.sim.tasks import MT10, task_names


@dataclass(frozen=True)
class DemosOptions:
    """Collect scripted-expert Meta-World demonstrations (safetensors shards + a JSON
    manifest); with --dagger, a trained policy drives and the expert labels every state."""

    out: str = opt(help="output directory")
    tasks: tuple[str, ...] = opt((), f"task names, mt10 or all ({', '.join(task_names())})")
    episodes: int = opt(0, "successful episodes per task")
    from_manifest: str | None = opt(
        None, "render a committed manifest directory (manifest.json + replay.npz) into --out"
    )
    save_manifest: str | None = opt(
        None,
        "write the manifest and simulator states of --out to this directory (after collecting,"
        " or alone for a collection made earlier)",
    )
    image_size: int = opt(128, "camera frame size")
    seed_start: int = opt(0, "first seed of each task")
    workers: int = opt(1, "collecting processes")
    episodes_per_shard: int = opt(25, "episodes per safetensors shard")
    camera: str | None = opt(None, "camera name (default: workspace)")
    extra_cameras: tuple[str, ...] = opt((), "further views (e.g. left), stored beside")
    episodes_for: tuple[str, ...] = opt(
        (), "per-task counts overriding --episodes, TASK=N (e.g. reach-v3=200)"
    )
    dart_noise: float = opt(0.0, "std of noise on executed xyz actions (DART)")
    dagger: str | None = opt(
        None, "DAgger: this policy drives, the expert labels every visited state (all kept)"
    )
    dagger_beta: float = opt(0.0, "DAgger: share of steps executing the expert")
    overwrite: bool = opt(False, "replace an existing manifest")
    json: bool = opt(False, "print one JSON object (the manifest)")

    def counts(self) -> dict[str, int]:
        """--episodes-for as {task: count}; ValueError names an entry that is not TASK=N."""
        out = {}
        for item in self.episodes_for:
            task, sep, count = item.partition("=")
            if not sep or not count.isdigit():
                raise ValueError(f"--episodes-for takes TASK=N, got {item!r}")
            out[task] = int(count)
        return out


def run_demos(o: DemosOptions) -> dict[str, Any]:
    """`vlarun demos`: ``collect`` with the options' tasks ("mt10", "all" or names), or render
    a committed manifest (``--from-manifest``, :mod:`vlarun.sim.demo_replay`)."""
    try:
        if o.from_manifest:
            if o.tasks or o.episodes:
                raise ValueError(
                    "--from-manifest renders the manifest's own tasks and episodes;"
                    " drop --tasks / --episodes"
                )
            return demo_replay.render_manifest(o.from_manifest, o.out, o.workers, o.overwrite)
        if o.save_manifest and not o.tasks:  # the manifest of a collection made earlier
            return demo_replay.save_manifest(o.out, o.save_manifest)
        if not o.tasks or o.episodes < 1:
            raise ValueError("give --tasks and --episodes (or --from-manifest DIR)")
        manifest = _collect(o)
        if o.save_manifest:
            saved = demo_replay.save_manifest(o.out, o.save_manifest)
            manifest = manifest | {"saved_manifest": {"to": o.save_manifest, **saved["replay"]}}
        return manifest
    except FileExistsError as e:
        raise ValueError(str(e)) from None


def _collect(o: DemosOptions) -> dict[str, Any]:
    tasks = {"all": task_names(), "mt10": list(MT10)}.get(o.tasks[0], list(o.tasks))
    return collect(
        tasks,
        o.episodes,
        o.out,
        image_size=o.image_size,
        seed_start=o.seed_start,
        workers=o.workers,
        episodes_per_shard=o.episodes_per_shard,
        camera=o.camera,
        extra_cameras=o.extra_cameras,
        episodes_for=o.counts(),
        dart_noise=o.dart_noise,
        dagger_policy=o.dagger,
        dagger_beta=o.dagger_beta,
        overwrite=o.overwrite,
    )


def show_demos(manifest: dict[str, Any], out: str | None = None) -> None:
    for name, t in manifest["tasks"].items():
        n, frames, failed = t["episodes"], t["frames"], t["failed"]
        print(f"{name:26s} {n:4d} episodes {frames:6d} frames {failed} failed")
    if "replay" in manifest:  # --save-manifest alone: what to commit
        _show_saved(manifest["replay"])
        return
    where = f" to {out}" if out else ""
    print(f"wrote {len(manifest['shards'])} shards + {MANIFEST}{where}")
    if "saved_manifest" in manifest:
        _show_saved(manifest["saved_manifest"])
    if "fingerprint" in manifest:
        f = manifest["fingerprint"]
        print(
            f"rendered from {manifest['rendered_from']}: {f['probes']} probe frames match the "
            f"committed fingerprints (mean block difference {f['mean_diff']:.2f} levels, "
            f"worst {f['worst_diff']:.2f})"
        )


def _show_saved(r: dict) -> None:
    where = f" to {r['to']}" if "to" in r else ""
    print(
        f"wrote {MANIFEST} + {r['file']}{where} ({r['frames']} frames' simulator states, "
        f"{r['bytes'] / 2**20:.1f} MiB): commit that directory"
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m vlarun.sim.demos_cli ...``: the same as ``vlarun demos ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m vlarun.sim.demos_cli", description=DemosOptions.__doc__
    )
    add_options(parser, DemosOptions)
    try:
        o = parse_into(DemosOptions, parser.parse_args(argv))
        manifest = run_demos(o)
    except ValueError as err:
        parser.error(str(err))
    show_demos(manifest, o.out)


if __name__ == "__main__":
    main()
