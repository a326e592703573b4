"""Behaviour cloning: a few steps run, resume from the saved state, and export loadable VLAs."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from vlarun.models.checkpoint import load_vla
from vlarun.policy.base import Policy
from vlarun.sim.bc_model import joint_mask
from vlarun.sim.demos import collect, load_demos
from vlarun.sim.train import TrainConfig, _chunks, random_shift, train


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    collect(["reach-v3"], 2, out, image_size=128, progress=False)
    return out


def test_train_resume_and_export(tmp_path, demos):
    # precision="fp32" in every run here where precision is not the subject: fp32 is not timed
    # (bf16 on an AVX2 CPU costs ~10 s a run to time), and its runs repeat exactly.
    cfg = TrainConfig(
        precision="fp32",
        demos=str(demos),
        out=str(tmp_path / "run"),
        steps=2,
        batch=2,
        save_every=1,
        log_every=1,
        warmup=1,
    )
    first = train(cfg)
    assert first["step"] == 2
    again = train(TrainConfig(**{**cfg.__dict__, "steps": 3}))
    assert again["step"] == 3  # resumed from step 2, not from 0
    log = [json.loads(line) for line in (tmp_path / "run" / "train.log").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3]
    for name in ("tiny-ar", "tiny-oft", "tiny-dit"):
        path = tmp_path / "run" / "export" / name
        assert {
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "README.md",
            "dataset_statistics.json",
        } <= {p.name for p in path.iterdir()}
        policy = Policy.from_checkpoint(path)
        image = np.zeros((128, 128, 3), np.uint8)
        actions = policy.predict(image, "reach the goal")
        assert actions.shape == (4, 4) and np.isfinite(actions).all()
    model, stats = load_vla(tmp_path / "run" / "export" / "tiny-ar")
    assert "metaworld" in stats and model.cfg.action_dim == 4
    # Export-only with other options describes the run as it trained, not this call's options.
    card = tmp_path / "run" / "export" / "tiny-ar" / "README.md"
    train(TrainConfig(**{**cfg.__dict__, "lr": 0.123}), export_only=True)
    assert f"lr {cfg.lr}," in card.read_text() and "lr 0.123" not in card.read_text()


def test_chunks_repeat_the_last_action_of_each_episode():
    actions = np.arange(5, dtype=np.float32)[:, None]
    episode = np.array([0, 0, 0, 1, 1])
    got = _chunks(actions, episode, 3)[:, :, 0]
    assert got.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]


def test_joint_mask_isolates_the_heads():
    m = joint_mask(prefix_len=3, n_ar=3)  # prompt 3 | AR 2 | OFT 3
    assert m[:3, :3].equal(torch.ones(3, 3, dtype=torch.bool).tril())
    assert m[3:5, 3:5].equal(torch.ones(2, 2, dtype=torch.bool).tril()) and m[3:5, :3].all()
    assert m[5:, 5:].all() and m[5:, :3].all() and not m[5:, 3:5].any()
    assert not m[:5, 5:].any()


def test_random_shift_moves_content_within_bounds():
    img = torch.zeros(1, 3, 16, 16)
    img[:, :, 8, 8] = 1.0
    out = random_shift(img, 2, torch.Generator().manual_seed(0))
    ys, xs = torch.nonzero(out[0, 0] == 1.0, as_tuple=True)
    assert out.shape == img.shape and len(ys) == 1 and abs(int(ys) - 8) <= 2
    assert abs(int(xs) - 8) <= 2


def test_init_from_exported_policies_continues_their_weights(tmp_path, demos):
    cfg = TrainConfig(
        demos=str(demos), out=str(tmp_path / "a"), steps=1, batch=2, warmup=1, precision="fp32"
    )
    train(cfg)
    exported = tmp_path / "a" / "export"
    cont = TrainConfig(
        **{**cfg.__dict__, "out": str(tmp_path / "b"), "init_from": str(exported), "lr": 1e-12}
    )
    train(cont)
    meta = json.loads((tmp_path / "b" / "state.json").read_text())
    assert meta["init_from"].startswith("policies") and meta["step"] == 1
    for name in ("tiny-ar", "tiny-oft", "tiny-dit"):
        before, _ = load_vla(exported / name)
        after, _ = load_vla(tmp_path / "b" / "export" / name)
        for (k, v), w in zip(before.state_dict().items(), after.state_dict().values(), strict=True):
            assert torch.allclose(v, w, atol=1e-6), (name, k)  # lr ~ 0: weights carried over
    bad = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "c"), "init_from": str(tmp_path)})
    with pytest.raises(ValueError, match="no state.safetensors and no exported policies"):
        train(bad)


def test_a_fine_tune_counts_the_samples_of_the_runs_it_grew_from(tmp_path, demos):
    """A run started from another run's state records what that lineage had seen; its model
    cards say so, and the training curve continues across the fine-tune (its x is samples
    seen with the runs before)."""
    from vlarun.sim.curve import CURVE_FILE, lineage_rows
    from vlarun.sim.train import lineage_before

    a = TrainConfig(
        demos=str(demos), out=str(tmp_path / "a"), steps=2, batch=2, warmup=1, precision="fp32"
    )
    train(a)
    b = TrainConfig(**{**a.__dict__, "out": str(tmp_path / "b"), "init_from": a.out, "steps": 3})
    train(b)
    assert json.loads((tmp_path / "b" / "state.json").read_text())["lineage_before"] == 4
    assert lineage_before(tmp_path / "b") == 4 and lineage_before(tmp_path / "a") == 0
    card = (tmp_path / "b" / "export" / "tiny-ar" / "README.md").read_text()
    assert "(6 samples seen; 10 with the runs it grew from)" in card
    for run, samples in (("a", 4), ("b", 6)):
        point = {
            "policy": "tiny-ar",
            "step": samples // 2,
            "samples": samples,
            "success": 0.5,
            "success_ci95": [0.2, 0.8],
        }
        (tmp_path / run / CURVE_FILE).write_text(json.dumps(point) + "\n")
    rows = lineage_rows(tmp_path / "b")
    assert sorted((r["run"], r["lineage_samples"]) for r in rows) == [("a", 4), ("b", 10)]


def test_two_demo_directories_train_as_one(tmp_path, demos):
    from vlarun.sim.demos import load_demos
    from vlarun.sim.train import concat_demos, demo_dirs

    both = concat_demos([load_demos(d) for d in demo_dirs(f"{demos},{demos}")])
    one = load_demos(demos)
    assert len(both) == 2 * len(one)
    assert set(np.unique(both.episode_index)) == set(range(2 * len(one.manifest["episodes"])))
    with pytest.raises(ValueError, match="not a demo directory"):
        demo_dirs(f"{demos},{tmp_path}")


def test_lr_anneals_by_time_budget_when_time_runs_out_first():
    from vlarun.sim.train import lr_at

    cfg = TrainConfig(steps=10_000, warmup=10, lr=1.0, budget_minutes=10)
    assert lr_at(cfg, 5) == pytest.approx(0.6)  # warmup is by steps
    assert lr_at(cfg, 100, seconds=0) == pytest.approx(1.0, abs=1e-3)
    assert lr_at(cfg, 100, seconds=300) == pytest.approx(0.05 + 0.95 * 0.5)  # half the time
    assert lr_at(cfg, 100, seconds=600) == pytest.approx(0.05)  # budget spent: floor
    assert lr_at(TrainConfig(steps=10_000, warmup=10, lr=1.0), 100, seconds=600) > 0.9


def test_tasks_merge_by_name_across_directories(tmp_path, demos):
    from vlarun.sim.demos import load_demos
    from vlarun.sim.train import concat_demos

    other = tmp_path / "push"
    collect(["push-v3"], 1, other, image_size=128, progress=False)
    merged = concat_demos([load_demos(demos), load_demos(other)])
    assert merged.manifest["task_names"] == ["reach-v3", "push-v3"]
    n_reach = len(load_demos(demos))
    assert (merged.task_index[:n_reach] == 0).all() and (merged.task_index[n_reach:] == 1).all()
    assert merged.instructions[1] == load_demos(other).instructions[0]


def test_task_weights_spend_batches_where_they_are_asked_and_bad_ones_fail_first(tmp_path, demos):
    from vlarun.sim.text import build_tokenizer
    from vlarun.sim.train import DemoSampler, parse_task_weights

    other = tmp_path / "push"
    collect(["push-v3"], 1, other, image_size=128, progress=False)
    both = f"{demos},{other}"
    tok = build_tokenizer([], tmp_path / "tokenizer.json")

    def push_share(weights):
        s = DemoSampler(both, 8, tok, 0, 1, balance=True, task_weights=weights)
        return float((s.task[s.draw(4000)] == 1).float().mean())

    assert push_share(None) == pytest.approx(0.5, abs=0.04)  # balanced: the tasks equally
    assert push_share({"push-v3": 3.0}) == pytest.approx(0.75, abs=0.04)  # reach weighs 1
    with pytest.raises(ValueError, match="pick-place-v3, not in .*its tasks: reach-v3, push-v3"):
        DemoSampler(both, 8, tok, 0, 1, balance=True, task_weights={"pick-place-v3": 2.0})
    for bad in ("push-v3", "push-v3=0", "push-v3=-1", "push-v3=inf", "push-v3=x", "=2"):
        with pytest.raises(ValueError, match="not TASK=W"):
            parse_task_weights(bad)
    with pytest.raises(ValueError, match="weighted twice"):
        parse_task_weights("push-v3=2,push-v3=3")
    with pytest.raises(ValueError, match="only --balance"):
        TrainConfig(task_weights="push-v3=2", balance=False)
    with pytest.raises(ValueError, match="not TASK=W"):
        TrainConfig(task_weights="push-v3=two")


def test_state_noise_moves_only_the_hand_and_keeps_the_stream(tmp_path, demos):
    """--state-noise: metres on the hand's xyz (normalised by the state's own spread), the
    gripper clean, images / actions / the batch stream of a noiseless run unchanged."""
    from vlarun.sim.text import build_tokenizer
    from vlarun.sim.train import DemoSampler

    tok = build_tokenizer([], tmp_path / "tokenizer.json")
    clean = DemoSampler(str(demos), 8, tok, 0, 1, balance=True)
    noisy = DemoSampler(str(demos), 8, tok, 0, 1, balance=True, state_noise=0.05)
    a, b = clean.sample(256, 0, step=3), noisy.sample(256, 0, step=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.actions, b.actions)
    assert torch.equal(a.state[:, 3:], b.state[:, 3:])  # the gripper
    std = np.maximum(clean.stats_json["metaworld"]["proprio"]["std"][:3], 1e-2)
    metres = ((b.state[:, :3] - a.state[:, :3]).numpy() * std).std(0)
    assert metres == pytest.approx([0.05] * 3, rel=0.2)
    assert torch.equal(noisy.sample(256, 0, step=3).state, b.state)  # reproducible per step
    with pytest.raises(ValueError, match="state noise must be in"):
        TrainConfig(state_noise=-0.01)


def test_early_share_draws_episode_starts_within_each_task(tmp_path, demos):
    """--early-share: that share of samples comes from the episodes' first frames (where only
    the image says where the goal is); the task mix and a run without it are unchanged."""
    from vlarun.sim.text import build_tokenizer
    from vlarun.sim.train import DemoSampler

    tok = build_tokenizer([], tmp_path / "tokenizer.json")
    plain = DemoSampler(str(demos), 8, tok, 0, 1, balance=True)
    early = DemoSampler(str(demos), 8, tok, 0, 1, balance=True, early_share=0.5, early_steps=4)
    steps = torch.from_numpy(load_demos(demos).step_index)
    natural = float((steps[plain.draw(4000)] < 4).float().mean())
    drawn = float((steps[early.draw(4000)] < 4).float().mean())
    assert natural < 0.15  # reach's episodes are ~45 frames
    assert drawn == pytest.approx(0.5 + 0.5 * natural, abs=0.04)
    again = DemoSampler(str(demos), 8, tok, 0, 1, balance=True)
    assert torch.equal(plain.sample(16, 0, step=5).actions, again.sample(16, 0, step=5).actions)
    with pytest.raises(ValueError, match="early share must be in"):
        TrainConfig(early_share=1.0)
    with pytest.raises(ValueError, match="only --balance"):
        TrainConfig(early_share=0.2, balance=False)


def test_precision_is_chosen_by_measurement():
    from vlarun.sim.train import choose_precision

    auto = choose_precision("auto", width=64, rows=64)
    assert auto.reason.startswith("auto: ") and "GFLOP/s" in auto.reason
    steps = []
    timed = choose_precision("auto", step=lambda: steps.append(torch.is_autocast_enabled("cpu")))
    assert "training step" in timed.reason and steps == [False] * 3 + [True] * 3
    # An explicit fp32 runs no step (it is never the slow choice); an explicit bf16 is timed
    # against fp32, so that a CPU where it is slower says so.
    steps.clear()
    fp32 = choose_precision("fp32", step=lambda: steps.append(torch.is_autocast_enabled("cpu")))
    assert fp32.bf16 is False and steps == [] and "not timed" in fp32.reason
    bf16 = choose_precision("bf16", step=lambda: steps.append(torch.is_autocast_enabled("cpu")))
    assert bf16.label == "bf16 autocast" and steps == [False] * 3 + [True] * 3
    assert bf16.reason.startswith("bf16 as asked: training step")
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp16")


def test_wrist_suite_trains_five_losses_and_exports_four_families(tmp_path):
    """mt10w: two views (workspace + wrist), targets for the auxiliary head, a flow expert on
    the prefix K/V; each exported family predicts its chunk (4 steps AR, 8 the others)."""
    d = tmp_path / "demos"
    collect(["reach-v3"], 1, d, extra_cameras=("wrist",), progress=False)
    cfg = TrainConfig(
        precision="fp32",
        suite="mt10w",
        demos=str(d),
        out=str(tmp_path / "run"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from="",
    )
    train(cfg)
    log = json.loads((tmp_path / "run" / "train.log").read_text().splitlines()[0])
    assert {"ar", "oft", "dit", "flow", "aux"} <= set(log) and all(
        np.isfinite(log[k]) for k in ("ar", "oft", "dit", "flow", "aux")
    )
    image = np.zeros((128, 128, 3), np.uint8)
    for name, steps in (("mt10w-ar", 4), ("mt10w-oft", 8), ("mt10w-dit", 8), ("mt10w-flow", 8)):
        policy = Policy.from_checkpoint(tmp_path / "run" / "export" / name)
        actions = policy.predict([image, image], "reach the goal", state=np.zeros(4, np.float32))
        assert actions.shape == (steps, 4) and np.isfinite(actions).all()
    exported = load_vla(tmp_path / "run" / "export" / "mt10w-flow")[0]
    assert not any(k.startswith("aux") for k in exported.state_dict())  # training-only head


def test_sigterm_saves_state_and_exports(tmp_path, demos):
    """A run cut by SIGTERM (a benchmark needs the machine) saves its state and exports, and
    the next call resumes from that step."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    code = (
        "from vlarun.sim.train import TrainConfig, train; "
        f"train(TrainConfig(demos={str(demos)!r}, out={str(out)!r}, steps=10000, batch=2, "
        "warmup=1, log_every=1, save_every=100000, precision='fp32'))"
    )
    err_file = (tmp_path / "stderr").open("w")  # a file, not a pipe nobody drains
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=err_file)
    log = out / "train.log"
    deadline = time.time() + 300
    while not (log.exists() and log.read_text().count("\n") >= 2) and time.time() < deadline:
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, err
    assert "stopping after this step" in err
    step = json.loads((out / "state.json").read_text())["step"]
    assert 2 <= step < 10000  # saved where it stopped, not at save_every
    assert (out / "export" / "tiny-ar" / "model.safetensors").exists()
    again = train(
        TrainConfig(
            demos=str(demos), out=str(out), steps=step + 1, batch=2, warmup=1, precision="fp32"
        )
    )
    assert again["step"] == step + 1


def _weights(run) -> dict:
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(run / "state.safetensors").items() if k.startswith("model.")}


def test_a_run_cut_in_two_equals_a_run_done_at_once(tmp_path, demos):
    """The same batches, the same step count, the same weights: what a run on a new machine
    must continue from the committed state."""
    base = dict(
        demos=str(demos),
        steps=4,
        batch=2,
        warmup=1,
        log_every=1,
        precision="fp32",
        moments_mb=0,
        threads=1,
    )
    whole = train(TrainConfig(out=str(tmp_path / "whole"), **base))
    first = train(TrainConfig(out=str(tmp_path / "cut"), stop_after=2, **base))
    assert first["step"] == 2
    second = train(TrainConfig(out=str(tmp_path / "cut"), **base))
    assert whole["step"] == second["step"] == 4
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    logs = [
        [json.loads(x) for x in (tmp_path / d / "train.log").read_text().splitlines()]
        for d in ("whole", "cut")
    ]
    assert [e["step"] for e in logs[1]] == [1, 2, 3, 4]
    for x, y in zip(*logs, strict=True):  # the same batches: the same losses, step by step
        assert x["ar"] == pytest.approx(y["ar"], rel=1e-4)
    state = json.loads((tmp_path / "cut" / "state.json").read_text())
    assert state["samples"] == 8 and state["moments_saved"] and "statistics" in state


def test_state_without_moments_rewarms_and_says_so(tmp_path, demos, capsys):
    cfg = dict(
        demos=str(demos),
        out=str(tmp_path / "run"),
        steps=2,
        batch=2,
        warmup=1,
        log_every=1,
        precision="fp32",
        moments_mb=0.01,
        rewarm=4,
    )
    train(TrainConfig(**cfg))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "run" / "state.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and not any(k.startswith("opt.") for k in names)
    assert any(".aux" in k or "trunk." in k for k in names)
    train(TrainConfig(**{**cfg, "steps": 4}))
    assert "without AdamW moments" in capsys.readouterr().err
    lrs = [json.loads(x)["lr"] for x in (tmp_path / "run" / "train.log").read_text().splitlines()]
    from vlarun.sim.train import lr_at

    scheduled = lr_at(TrainConfig(**{**cfg, "steps": 4}), 2)
    assert lrs[2] == pytest.approx(scheduled / 4)  # the first step after the resume: 1/4
    assert lrs[3] == pytest.approx(lr_at(TrainConfig(**{**cfg, "steps": 4}), 3) / 2)


def test_goal_suite_grows_from_the_image_only_run_as_the_same_model(tmp_path):
    """mt10g (the goal in the state) starts from an mt10p run: the proprio input widened with
    zero columns, so on the same frames its losses are mt10p's; it trains and its exported
    policies take the 7-value state."""
    from vlarun.sim.bc_model import MultiHeadBC
    from vlarun.sim.text import build_tokenizer
    from vlarun.sim.train import DemoSampler, init_weights

    d = tmp_path / "demos"
    collect(["reach-v3"], 1, d, extra_cameras=("wrist",), progress=False)
    base = TrainConfig(
        precision="fp32",
        suite="mt10p",
        demos=str(d),
        out=str(tmp_path / "p"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from="",
    )
    train(base)
    torch.manual_seed(0)
    grown, source = MultiHeadBC("mt10g"), MultiHeadBC("mt10p")
    said = init_weights(grown, tmp_path / "p", "mt10g")
    assert "widened with zero inputs: trunk.proprio_projector" in said
    assert "fresh: none" in said  # the flow expert's tied lm_head comes with its embedding
    init_weights(source, tmp_path / "p", "mt10p")
    tok = build_tokenizer([], tmp_path / "p" / "tokenizer.json")
    batch = DemoSampler(str(d), grown.chunk, tok, 0, 2, goal_in_state=True).sample(2, 0, step=0)
    assert batch.state.shape == (2, 7)
    plain = dataclasses.replace(batch, state=batch.state[:, :4])
    grown.eval(), source.eval()
    with torch.no_grad():
        a, b = grown(batch), source(plain)
    for k in ("ar", "oft", "aux"):  # the deterministic losses (DiT and flow draw noise)
        torch.testing.assert_close(getattr(a, k), getattr(b, k))
    goal = TrainConfig(
        precision="fp32",
        suite="mt10g",
        demos=str(d),
        out=str(tmp_path / "g"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from=str(tmp_path / "p"),
    )
    train(goal)
    policy = Policy.from_checkpoint(tmp_path / "g" / "export" / "mt10g-oft")
    image = np.zeros((128, 128, 3), np.uint8)
    actions = policy.predict([image, image], "reach the goal", state=np.zeros(7, np.float32))
    assert actions.shape == (8, 4) and np.isfinite(actions).all()
    assert policy.model.cfg.goal_in_state
    # The evaluation loop builds the environment the policy was trained on (its state has the
    # goal) and runs an episode through it.
    from vlarun.sim.evaluate import EvalConfig, evaluate

    out = evaluate(
        EvalConfig(
            policy=str(tmp_path / "g" / "export" / "mt10g-oft"),
            tasks=("reach-v3",),
            episodes=1,
            workers=1,
        )
    )
    assert out["episodes"] == 1


def test_loss_weights_scale_each_head_in_the_total_and_bad_ones_fail_first():
    import torch

    from vlarun.sim.bc_model import Losses
    from vlarun.sim.train import parse_loss_weights

    parts = dict(ar=torch.tensor(0.9), oft=torch.tensor(0.07), dit=torch.tensor(0.03))
    assert float(Losses(**parts).total) == pytest.approx(1.0)
    weighted = Losses(**parts, weights=parse_loss_weights("dit=10,oft=2"))
    assert float(weighted.total) == pytest.approx(0.9 + 0.14 + 0.3)
    # What is logged stays raw.
    assert weighted.as_floats() == pytest.approx({"ar": 0.9, "oft": 0.07, "dit": 0.03})
    with pytest.raises(ValueError, match="loss weights name diffusion; heads: ar, oft, dit"):
        TrainConfig(loss_weights="diffusion=10")
    for bad in ("dit", "dit=0", "dit=-2", "dit=x"):
        with pytest.raises(ValueError, match="not HEAD=W"):
            TrainConfig(loss_weights=bad)


def test_a_run_with_loss_weights_weighs_the_update_not_the_log(tmp_path, demos):
    """The same batches, dit weighed 100: step 1's logged losses (before any update) agree; the
    shared trunk's weights after two steps do not (AdamW makes a head's own update nearly
    free of its loss's scale: a weight acts through the parameters heads share), nor then the
    DiT head's."""
    base = dict(
        demos=str(demos),
        steps=2,
        batch=2,
        warmup=1,
        log_every=1,
        precision="fp32",
        moments_mb=0,
        threads=1,
    )
    plain = train(TrainConfig(out=str(tmp_path / "plain"), **base))
    heavy = train(TrainConfig(out=str(tmp_path / "heavy"), loss_weights="dit=100", **base))
    assert plain["step"] == heavy["step"] == 2
    logs = [
        json.loads((tmp_path / d / "train.log").read_text().splitlines()[0])
        for d in ("plain", "heavy")
    ]
    assert logs[0]["dit"] == pytest.approx(logs[1]["dit"], rel=1e-5)
    a, b = _weights(tmp_path / "plain"), _weights(tmp_path / "heavy")
    for prefix in ("model.trunk.", "model.dit."):
        keys = [k for k in a if k.startswith(prefix)]
        assert keys and any(not torch.allclose(a[k], b[k]) for k in keys), prefix


def test_resuming_with_other_steering_options_is_said_and_recorded(tmp_path, demos, capsys):
    """A run steered between stretches (here: loss weights added at step 1) says so when it
    resumes, keeps each change in its state, and its model cards name it."""
    base = dict(
        demos=str(demos),
        steps=2,
        batch=2,
        warmup=1,
        log_every=1,
        precision="fp32",
        moments_mb=0,
        threads=1,
        out=str(tmp_path / "run"),
    )
    train(TrainConfig(stop_after=1, **base))
    capsys.readouterr()
    train(TrainConfig(loss_weights="dit=10", **base))
    assert "resuming at step 1 with loss_weights = 'dit=10' (it ran with '' until now)" in (
        capsys.readouterr().err
    )
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["changes"] == [{"step": 1, "option": "loss_weights", "old": "", "new": "dit=10"}]
    card = (tmp_path / "run" / "export" / "tiny-dit" / "README.md").read_text()
    assert "from step 1: loss_weights 'dit=10' (until then '')" in card
    assert "loss weights dit=10" in card


def test_fast_suite_grows_the_vocabulary_learns_its_codes_and_exports_a_fast_policy(tmp_path):
    """mt10pf (issue 65): an mt10p run's trunk with FAST action tokens. The vocabulary grows
    (the old ids keep their rows), the run fits its FAST tokenizer on its own chunks and keeps
    it for a resume, each row's target is its code then END with the padding ignored, and the
    exported policy decodes a FAST code into an 8-step chunk."""
    from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR, FastTokenizer
    from vlarun.sim.bc_model import IGNORE, MultiHeadBC
    from vlarun.sim.train import init_weights

    d = tmp_path / "demos"
    collect(["reach-v3"], 1, d, extra_cameras=("wrist",), progress=False)
    base = TrainConfig(
        precision="fp32",
        suite="mt10p",
        demos=str(d),
        out=str(tmp_path / "p"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from="",
    )
    train(base)
    fast = MultiHeadBC("mt10pf")
    said = init_weights(fast, tmp_path / "p", "mt10pf")
    assert "grown with fresh rows: trunk.language_model.lm_head.weight" in said
    from safetensors.torch import load_file

    old = load_file(tmp_path / "p" / "state.safetensors")[
        "model.trunk.language_model.model.embed_tokens.weight"
    ]
    new = fast.trunk.language_model.model.embed_tokens.weight
    assert new.shape[0] == 2 * old.shape[0]
    torch.testing.assert_close(new[: old.shape[0]], old)
    cfg = TrainConfig(
        precision="fp32",
        suite="mt10pf",
        demos=str(d),
        out=str(tmp_path / "f"),
        steps=2,
        batch=2,
        warmup=1,
        log_every=1,
        init_from=str(tmp_path / "p"),
    )
    train(cfg)
    tok = FastTokenizer.load(tmp_path / "f" / FAST_TOKENIZER_DIR)
    assert (tok.action_horizon, tok.action_dim) == (8, 4)
    log = json.loads((tmp_path / "f" / "train.log").read_text().splitlines()[0])
    assert set(log) >= {"ar", "aux"} and "oft" not in log and np.isfinite(log["ar"])
    # Targets: a row's code, END, then nothing the loss reads.
    fast.trunk.set_fast_tokenizer(tok)
    chunks = torch.zeros(2, 8, 4)
    chunks[1] = torch.linspace(-0.5, 0.5, 8)[:, None]
    ids, targets = fast._ar_targets(chunks)
    end = fast.cfg.fast.end_id
    for r in range(2):
        code = fast.trunk.fast_head.encode(chunks[r].numpy())
        assert targets[r, : len(code)].tolist() == code and code[-1] == end
        assert (targets[r, len(code) :] == IGNORE).all() and (ids[r, len(code) :] == end).all()
        back = fast.trunk.fast_head.decode(code)
        assert np.abs(back - chunks[r].numpy()).max() <= 0.5 * np.sqrt(8) / tok.scale + 1e-9
    # A second call resumes with the same vocabulary (not refitted) and exports again.
    before = (tmp_path / "f" / FAST_TOKENIZER_DIR / "tokenizer.json").read_text()
    train(dataclasses.replace(cfg, steps=3))
    assert (tmp_path / "f" / FAST_TOKENIZER_DIR / "tokenizer.json").read_text() == before
    policy = Policy.from_checkpoint(tmp_path / "f" / "export" / "mt10p-fast")
    image = np.zeros((128, 128, 3), np.uint8)
    actions = policy.predict([image, image], "reach the goal", state=np.zeros(4, np.float32))
    assert actions.shape == (8, 4) and np.isfinite(actions).all()


def test_llava_suite_starts_its_clip_tower_from_the_siglip_one_and_exports(tmp_path):
    """mt10pl (issue 65): mt10p-llava grows an mt10p run. The SigLIP tower starts the CLIP one
    through an explicit, logged transfer (never a silent match by name: the blocks share
    names, the positions would shift by one), the rest comes over by name, and the exported
    policy decodes 20 tokens into a 5-step chunk."""
    from vlarun.sim.bc_model import MultiHeadBC
    from vlarun.sim.train import init_weights

    d = tmp_path / "demos"
    collect(["reach-v3"], 1, d, extra_cameras=("wrist",), progress=False)
    base = TrainConfig(
        precision="fp32",
        suite="mt10p",
        demos=str(d),
        out=str(tmp_path / "p"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from="",
    )
    train(base)
    llava = MultiHeadBC("mt10pl")
    said = init_weights(llava, tmp_path / "p", "mt10pl")
    fresh = "class_embedding, vision_model.pre_layrnorm.bias, vision_model.pre_layrnorm.weight"
    assert "vision tower SigLIP -> CLIP" in said and said.endswith(fresh + ")"), said
    from safetensors.torch import load_file

    state = load_file(tmp_path / "p" / "state.safetensors")
    src = {k[12:]: v for k, v in state.items() if k.startswith("model.trunk.")}
    got = llava.trunk.state_dict()
    pos = "vision_backbone.featurizer.vision_model.embeddings.position_embedding.weight"
    bias = "vision_backbone.featurizer.vision_model.embeddings.patch_embedding.bias"
    torch.testing.assert_close(got[pos][1:], src[pos] + src[bias])  # not shifted by one
    for key in (
        "language_model.model.embed_tokens.weight",
        "projector.fc1.weight",
        "vision_backbone.featurizer.vision_model.encoder.layers.0.mlp.fc1.weight",
    ):
        torch.testing.assert_close(got[key], src[key])
    cfg = TrainConfig(
        precision="fp32",
        suite="mt10pl",
        demos=str(d),
        out=str(tmp_path / "l"),
        steps=2,
        batch=2,
        warmup=1,
        log_every=1,
        init_from=str(tmp_path / "p"),
    )
    train(cfg)
    log = json.loads((tmp_path / "l" / "train.log").read_text().splitlines()[0])
    assert set(log) >= {"ar", "aux"} and "oft" not in log and np.isfinite(log["ar"])
    assert "SigLIP -> CLIP" in json.loads((tmp_path / "l" / "state.json").read_text())["init_from"]
    policy = Policy.from_checkpoint(tmp_path / "l" / "export" / "mt10p-llava")
    assert policy.model.cfg.num_action_tokens == 20
    image = np.zeros((128, 128, 3), np.uint8)
    actions = policy.predict([image, image], "reach the goal", state=np.zeros(4, np.float32))
    assert actions.shape == (5, 4) and np.isfinite(actions).all()


def test_a_fast_run_continued_from_another_keeps_its_ids(tmp_path):
    """mt10pf2 continues mt10pf: the FAST tokenizer is the source run's, not refitted."""
    from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR

    d = tmp_path / "demos"
    collect(["reach-v3"], 1, d, extra_cameras=("wrist",), progress=False)
    first = TrainConfig(
        precision="fp32",
        suite="mt10pf",
        demos=str(d),
        out=str(tmp_path / "a"),
        steps=1,
        batch=2,
        warmup=1,
        log_every=1,
        init_from="",
    )
    train(first)
    other = tmp_path / "demos2"  # other chunks: a refit would learn other merges
    collect(["push-v3"], 1, other, extra_cameras=("wrist",), progress=False)
    again = dataclasses.replace(
        first, demos=str(other), out=str(tmp_path / "b"), init_from=str(tmp_path / "a")
    )
    train(again)
    for name in ("tokenizer.json", "processor_config.json"):
        a = (tmp_path / "a" / FAST_TOKENIZER_DIR / name).read_text()
        assert (tmp_path / "b" / FAST_TOKENIZER_DIR / name).read_text() == a
