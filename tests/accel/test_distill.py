"""Consistency distillation: the training forward matches Jacobi inference; a few steps run,
resume, and export a loadable checkpoint with a model card; a FAST teacher's codes train on
blocks that stop counting at END."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder, action_step
from vlarun.cli import build_parser, command, parse_into, resolve
from vlarun.models.checkpoint import save_vla
from vlarun.models.fast_head import (
    FastConfig,
    code_lengths,
    code_mask,
    pad_after_end,
    smooth_chunks,
    synthetic_fast_tokenizer,
)
from vlarun.models.presets.tiny import tiny_openvla
from vlarun.models.tokenizer import load_tokenizer
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy
from vlarun.sim.distill import (
    DistillConfig,
    Frames,
    block_logits,
    block_mask,
    collect,
    distill,
    distill_losses,
    sample_batch,
)
from vlarun.sim.distill_data import _join, demo_codes, fit_block, load_frames

TINY_AR = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-ar"


def test_distill_a_univla_teacher(tmp_path):
    """Issue 65, 3: a UniVLA-family teacher (VQ image ids inside Emu3's markers, FAST action
    tokens; random weights at tiny-univla's shape, Meta-World's 4 action dimensions) collects
    its Jacobi trajectories from two-view demos, trains, and exports a student that loads as
    the same family and whose own Jacobi decoding is its greedy decoding."""
    pytest.importorskip("metaworld")
    from vlarun.accel.jacobi import jacobi_decode
    from vlarun.models.fast_head import synthetic_fast_tokenizer
    from vlarun.models.presets.tiny import tiny_univla
    from vlarun.sim.demos import collect as collect_demos

    if not (TINY_AR / "dataset_statistics.json").exists():
        pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
    demos = tmp_path / "demos"
    collect_demos(["reach-v3"], 2, demos, image_size=32, progress=False, extra_cameras=("corner2",))
    cfg = dataclasses.replace(tiny_univla(), name="tiny-univla-mw", action_dim=4, chunk=4)
    torch.manual_seed(0)
    model = VLA(cfg).eval()
    model.set_fast_tokenizer(
        synthetic_fast_tokenizer(cfg.horizon, cfg.action_dim, cfg.fast.vocab_size)
    )
    stats = json.loads((TINY_AR / "dataset_statistics.json").read_text())
    teacher_dir = save_vla(model, tmp_path / "teacher", norm_stats=stats)
    got = distill(
        DistillConfig(
            teacher=str(teacher_dir),
            demos=str(demos),
            out=str(tmp_path / "run"),
            frames=8,
            collect_batch=4,
            eval_frames=4,
            steps=2,
            batch=2,
            block=12,
            save_every=1,
            log_every=1,
            warmup=1,
        )
    )
    assert got["step"] == 2 and got["collected"]["frames"] == 8
    student = Policy.from_checkpoint(got["exported"])
    scfg = student.model.cfg
    assert scfg.vq is not None and student.model.fast_head is not None
    images = torch.rand(2, scfg.num_images, 3, scfg.image_size, scfg.image_size)
    ids = [student.text_ids("reach the goal"), student.text_ids("push the puck")]

    def prefill():
        m = student.model
        return m.prefill(m.build_prefix(m.encode_images(images), ids))

    with torch.no_grad():
        greedy = student.model.decode_tokens(prefill())
        r = jacobi_decode(student.model, prefill(), JacobiConfig(init="repeat"))
    assert torch.equal(r.tokens, greedy)


@pytest.fixture(scope="module")
def chunked() -> Policy:
    torch.manual_seed(0)
    model = VLA(dataclasses.replace(tiny_openvla(), chunk=2)).eval()
    return Policy(model, load_tokenizer(None, model.cfg.llm.vocab_size))


def _inputs(policy: Policy, seed: int = 0):
    cfg = policy.model.cfg
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(2, 1, 3, cfg.image_size, cfg.image_size, generator=gen)
    text = [policy.text_ids("open the drawer"), policy.text_ids("push the puck to the goal")]
    n = cfg.num_action_tokens
    ids = policy.model.action_tokenizer.action_ids
    state = torch.randint(ids.start, ids.stop, (2, n), generator=gen)
    fixed = torch.randint(ids.start, ids.stop, (2, n), generator=gen)
    return images, text, state, fixed


def test_block_mask_isolates_blocks():
    m = block_mask(prefix_len=3, block=2, blocks=2)  # prompt 3 | block 2 | block 2
    assert m[:3, :3].equal(torch.ones(3, 3, dtype=torch.bool).tril()) and not m[:3, 3:].any()
    assert m[3:, :3].all()
    assert m[3:5, 3:5].equal(torch.ones(2, 2, dtype=torch.bool).tril()) and not m[3:5, 5:].any()
    assert m[5:, 5:].equal(torch.ones(2, 2, dtype=torch.bool).tril()) and not m[5:, 3:5].any()


@torch.no_grad()
def test_training_forward_equals_a_jacobi_iteration(chunked):
    """Each block's logits == one Jacobi step over that state on the prefix cache."""
    model = chunked.model
    images, text, state, fixed = _inputs(chunked)
    got = block_logits(model, images, text, [state, fixed])
    for block, logits in zip((state, fixed), got, strict=True):
        pre = model.prefill(model.build_prefix(model.encode_images(images), text))
        first = model.language_model.logits(pre.last_hidden)[:, None]
        want = torch.cat((first, action_step(model, pre)(block[:, :-1], 0)), dim=1)
        assert (logits - want).abs().max().item() < 1e-4


@torch.no_grad()
def test_training_forward_takes_both_views_and_the_state_of_a_deep_mt10_policy():
    """mt10-ar (two views, a proprio token): the training forward still equals a Jacobi
    iteration on the prefix the policy builds, and Frames hands out both views and the state."""
    policy = Policy.from_preset("mt10-ar", seed=0)
    model, cfg = policy.model, policy.model.cfg
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 255, (3, 2, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8)
    states = torch.randn(3, cfg.proprio_dim, generator=gen)
    ids = [1, 2, 3]
    frames = Frames(raw, [ids] * 3, torch.zeros(3, 1), torch.arange(3), states, cfg.num_images)
    idx = torch.tensor([0, 2])
    images, proprio = frames.image_batch(idx), frames.state_batch(idx)
    assert images.shape == (2, 2, 3, cfg.image_size, cfg.image_size)
    assert torch.equal(images[1, 1], raw[2, 1].permute(2, 0, 1).float() / 255)
    n = cfg.num_action_tokens
    act = model.action_tokenizer.action_ids
    block = torch.randint(act.start, act.stop, (2, n), generator=gen)
    text = [ids, ids]
    (got,) = block_logits(model, images, text, [block], proprio)
    pre = model.prefill(model.build_prefix(model.encode_images(images), text, proprio))
    first = model.language_model.logits(pre.last_hidden)[:, None]
    want = torch.cat((first, action_step(model, pre)(block[:, :-1], 0)), dim=1)
    assert (got - want).abs().max().item() < 1e-4


@torch.no_grad()
def test_consistency_loss_vanishes_at_the_fixed_point(chunked):
    images, text, _, fixed = _inputs(chunked, 1)
    same = distill_losses(chunked.model, images, text, fixed, fixed)
    assert abs(same.consistency.item()) < 1e-5
    images, text, state, fixed = _inputs(chunked, 2)
    other = distill_losses(chunked.model, images, text, state, fixed, omega=0.5)
    assert other.consistency.item() > 0
    assert other.total.item() == pytest.approx(other.consistency.item() + 0.5 * other.ar.item())


@torch.no_grad()
def test_several_states_share_one_forward(chunked):
    """K states of a trajectory in one forward: the consistency loss is the mean of the K
    one-state losses, and the AR loss is the same (it depends on the fixed point only)."""
    model = chunked.model
    images, text, a, fixed = _inputs(chunked, 3)
    b = _inputs(chunked, 4)[2]
    both = distill_losses(model, images, text, torch.stack((a, b), dim=1), fixed)
    one = [distill_losses(model, images, text, s, fixed) for s in (a, b)]
    want = (one[0].consistency + one[1].consistency) / 2
    assert both.consistency.item() == pytest.approx(want.item(), rel=1e-4)
    assert both.ar.item() == pytest.approx(one[0].ar.item(), rel=1e-4)


def test_sample_batch_draws_non_final_states_of_each_trajectory():
    n = 4
    states = torch.arange(3 * n * n).reshape(3, n, n)  # every state distinct
    data = {"states": states, "length": torch.tensor([3, 1, 4]), "frame": torch.tensor([0, 1, 2])}
    frames = Frames(
        torch.zeros(3, 8, 8, 3, dtype=torch.uint8),
        [[1], [2], [3]],
        torch.zeros(3, n, dtype=torch.long),
        torch.arange(3),
    )
    _, text, state, fixed, idx = sample_batch(data, frames, 64, torch.Generator().manual_seed(0), 5)
    assert state.shape == (64, 5, n) and fixed.shape == (64, n)
    for row, f in enumerate(idx.tolist()):
        length = int(data["length"][f])
        assert torch.equal(fixed[row], states[f, length - 1]) and text[row] == [f + 1]
        allowed = states[f, : max(length - 1, 1)]  # a 1-state trajectory: the fixed point
        assert all((allowed == s).all(-1).any() for s in state[row])


def test_sample_batch_can_pin_the_initial_guess():
    n = 4
    states = torch.arange(3 * n * n).reshape(3, n, n)
    data = {"states": states, "length": torch.tensor([3, 2, 4]), "frame": torch.tensor([0, 1, 2])}
    frames = Frames(
        torch.zeros(3, 8, 8, 3, dtype=torch.uint8),
        [[1], [2], [3]],
        torch.zeros(3, n, dtype=torch.long),
        torch.arange(3),
    )
    gen = torch.Generator().manual_seed(0)
    _, _, state, _, idx = sample_batch(data, frames, 32, gen, 4, initial=True)
    assert torch.equal(state[:, 0], states[idx, 0])  # every row's first state is its guess
    later = state[:, 1:] != states[idx, 0][:, None]
    assert later.any(-1).any()  # the others are still drawn from the whole trajectory


def test_collection_from_repeat_guesses_is_not_mixed_with_random(chunked, tmp_path):
    cfg = chunked.model.cfg
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (4, cfg.image_size, cfg.image_size, 3), generator=gen)
    frames = Frames(
        images.to(torch.uint8),
        [chunked.text_ids("open the drawer")] * 4,
        torch.zeros(4, 14, dtype=torch.long),
        torch.arange(4),
    )
    base = DistillConfig(teacher="unused", frames=2, collect_batch=2, eval_frames=1, init="repeat")
    collect(base, chunked, frames, tmp_path, lambda m: None)
    states = load_file(tmp_path / "trajectories.safetensors")["states"]
    first = states[:, 1, 0]  # after one iteration y_1 is the prefill's token: the guess repeats it
    assert (states[:, 0] == first[:, None]).all()
    with pytest.raises(ValueError, match="init='repeat'"):
        collect(
            dataclasses.replace(base, init="random", frames=3),
            chunked,
            frames,
            tmp_path,
            lambda m: None,
        )


def test_collection_resumes_where_it_stopped(chunked, tmp_path):
    """A second call with more frames keeps the first trajectories and adds only the rest."""
    cfg = chunked.model.cfg
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (8, cfg.image_size, cfg.image_size, 3), generator=gen)
    text = [chunked.text_ids("open the drawer")] * 8
    frames = Frames(
        images.to(torch.uint8),
        text,
        torch.zeros(8, 14, dtype=torch.long),
        torch.randperm(8, generator=gen),
    )
    base = DistillConfig(teacher="unused", frames=3, collect_batch=2, eval_frames=2)
    first = collect(base, chunked, frames, tmp_path, lambda m: None)
    before = load_file(tmp_path / "trajectories.safetensors")
    again = collect(dataclasses.replace(base, frames=5), chunked, frames, tmp_path, lambda m: None)
    after = load_file(tmp_path / "trajectories.safetensors")
    assert first["frames"] == 3 and again["frames"] == 5
    assert torch.equal(after["frame"], frames.order[:5])  # collected in order, held-out last
    assert torch.equal(after["states"][:3], before["states"])
    n = cfg.num_action_tokens
    final = after["states"][torch.arange(5), after["length"].long() - 1]
    assert after["states"].shape == (5, n, n) and (after["states"][:, -1] == final).all()


def run_command(argv: list[str]) -> dict:
    """``vlarun distill ...`` through its generated flags (only this command's parser)."""
    key, module, rest = resolve(argv)
    cls, run, _ = command(key, module)
    return run(parse_into(cls, build_parser(key, cls).parse_args(rest)))


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    pytest.importorskip("metaworld")
    from vlarun.sim.demos import collect

    out = tmp_path_factory.mktemp("demos")
    collect(["reach-v3"], 2, out, image_size=128, progress=False)
    return out


def test_distill_runs_resumes_and_exports(tmp_path, demos):
    if not (TINY_AR / "config.json").exists():
        pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
    run = tmp_path / "run"
    cfg = DistillConfig(
        teacher=str(TINY_AR),
        demos=str(demos),
        out=str(run),
        frames=6,
        collect_batch=4,
        eval_frames=4,
        steps=2,
        batch=2,
        save_every=1,
        log_every=1,
        warmup=1,
    )
    first = distill(cfg)
    assert first["step"] == 2 and first["collected"]["frames"] == 6
    traj = load_file(run / "trajectories.safetensors")
    n = 16  # tiny-ar: 4 steps x 4 dims
    assert traj["states"].shape == (6, n, n) and (traj["length"] >= 2).all()
    # Resume through the command line, with demo tokens as the AR targets.
    argv = [
        "distill",
        "--teacher",
        str(TINY_AR),
        "--demos",
        str(demos),
        "--out",
        str(run),
        "--frames",
        "6",
        "--collect-batch",
        "4",
        "--eval-frames",
        "4",
        "--steps",
        "3",
        "--batch",
        "2",
        "--save-every",
        "1",
        "--log-every",
        "1",
        "--warmup",
        "1",
        "--ar-target",
        "demo",
        "--json",
    ]
    again = run_command(argv)
    assert again["step"] == 3  # resumed from step 2, not from 0
    lines = [json.loads(x) for x in (run / "distill.log").read_text().splitlines()]
    assert [e["step"] for e in lines if "step" in e] == [1, 2, 3]
    assert {"loss_c", "loss_ar", "lr"} <= set(lines[-1])
    export = Path(again["exported"])
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "README.md",
        "dataset_statistics.json",
    } <= {p.name for p in export.iterdir()}
    assert "consistency distillation" in (export / "README.md").read_text()
    assert {"teacher_jacobi_iterations", "student_exit_iterations"} <= set(again["evaluation"])
    student = Policy.from_checkpoint(export)
    assert student.model.cfg.name.endswith("-ceed") and student.norm is not None
    # Early exit on the student decodes from the guesses it was distilled from.
    assert student.calibration == {"jacobi": {"init": cfg.init}}
    from vlarun.policy.setting import AccelSetting

    decoder = AccelSetting(early_exit_sigma=0.5).hooks("autoregressive", student.calibration)
    assert decoder.decoder.cfg.init == cfg.init
    # A new run continuing from that student (fresh schedule) starts from its weights.
    cont = dataclasses.replace(
        cfg,
        out=str(tmp_path / "cont"),
        student_init=str(export),
        steps=1,
        states=3,
        export=str(tmp_path / "cont-export"),
    )
    assert distill(dataclasses.replace(cont, export_only=True))["step"] == 0
    exported = load_file(tmp_path / "cont-export" / "model.safetensors")
    assert all(
        torch.equal(v, load_file(export / "model.safetensors")[k]) for k, v in exported.items()
    )
    assert f"initialised from `{export}`" in (tmp_path / "cont-export" / "README.md").read_text()
    # Frozen vision: the tower keeps the teacher's weights, the language model moves.
    frozen = dataclasses.replace(
        cont,
        out=str(tmp_path / "frozen"),
        student_init="",
        steps=2,
        freeze_vision=True,
        initial_state=True,
        lr=1e-2,
        export=str(tmp_path / "frozen-export"),
    )
    distill(frozen)
    teacher_w = load_file(TINY_AR / "model.safetensors")
    frozen_w = load_file(tmp_path / "frozen-export" / "model.safetensors")
    vision = [k for k in teacher_w if k.startswith("vision_backbone.")]
    assert vision and all(torch.equal(frozen_w[k], teacher_w[k]) for k in vision)
    lm = [k for k in teacher_w if k.startswith("language_model.")]
    assert any(not torch.equal(frozen_w[k], teacher_w[k]) for k in lm)
    assert "vision tower frozen" in (tmp_path / "frozen-export" / "README.md").read_text()
    again_name = Policy.from_checkpoint(tmp_path / "cont-export").model.cfg.name
    assert again_name == student.model.cfg.name  # one "-ceed" suffix, not two
    fast = student.with_hooks(decoder=JacobiDecoder())
    actions = fast.predict(np.zeros((128, 128, 3), np.uint8), "reach the goal")
    assert actions.shape == (4, 4) and np.isfinite(actions).all()


def _sharp_logits(monkeypatch, n: int = 4, vocab: int = 6):
    """Replace the model's block logits by fixed, sharp ones (requiring grad), so the loss's
    formula is tested on distributions where forward and reverse KL differ clearly."""
    import vlarun.sim.distill as distill_mod

    gen = torch.Generator().manual_seed(7)
    teacher = (3 * torch.randn(2, n, vocab, generator=gen)).requires_grad_()
    student = (3 * torch.randn(2, n, vocab, generator=gen)).requires_grad_()
    monkeypatch.setattr(distill_mod, "block_logits", lambda *a, **k: [teacher, student])
    return teacher, student


def test_consistency_is_the_forward_kl_from_the_fixed_point(chunked, monkeypatch):
    """L_C = KL(P_fixed || Q_state) = sum p (log p - log q), not the reverse KL."""
    teacher, student = _sharp_logits(monkeypatch)
    fixed = torch.zeros(2, 4, dtype=torch.long)
    got = distill_losses(chunked.model, None, None, fixed, fixed).consistency
    logp, logq = teacher.log_softmax(-1), student.log_softmax(-1)
    forward = (logp.exp() * (logp - logq)).sum(-1).mean()
    reverse = (logq.exp() * (logq - logp)).sum(-1).mean()
    assert abs(forward.item() - reverse.item()) > 0.1  # the case tells the two apart
    assert got.item() == pytest.approx(forward.item(), rel=1e-6)


def test_consistency_gradient_stops_at_the_fixed_point_distribution(chunked, monkeypatch):
    """The target distribution is a constant: no gradient reaches the fixed point's logits, and
    the student's gradient is that of the formula with the target detached."""
    teacher, student = _sharp_logits(monkeypatch)
    fixed = torch.zeros(2, 4, dtype=torch.long)
    loss = distill_losses(chunked.model, None, None, fixed, fixed).consistency
    g_teacher, g_student = torch.autograd.grad(loss, [teacher, student], allow_unused=True)
    assert g_teacher is None or g_teacher.abs().max().item() == 0.0
    logp = teacher.detach().log_softmax(-1)
    want = torch.autograd.grad(
        (logp.exp() * (logp - student.log_softmax(-1))).sum(-1).mean(), student
    )[0]
    assert (g_student - want).abs().max().item() < 1e-7


def test_losses_count_a_fast_code_up_to_its_end_only(chunked, monkeypatch):
    """What follows END is padding: logits there change neither loss, and each loss is the mean
    over its target's tokens up to and including END (the fixed point's for L_C, the demo
    code's for L_AR)."""
    teacher, student = _sharp_logits(monkeypatch)
    end = 5
    fixed = torch.tensor([[2, 5, 1, 3], [1, 2, 3, 4]])  # END second in row 0, none in row 1
    demo = torch.tensor([[1, 2, 5, 0], [5, 1, 1, 1]])
    keep, demo_keep = code_mask(fixed, end), code_mask(demo, end)

    def losses():
        one = distill_losses(chunked.model, None, None, fixed, fixed, end_id=end)
        two = distill_losses(chunked.model, None, None, fixed, fixed, ar_tokens=demo, end_id=end)
        return one.consistency.item(), one.ar.item(), two.ar.item()

    before = losses()
    logp, logq = teacher.log_softmax(-1), student.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    assert before[0] == pytest.approx(kl[keep].mean().item(), rel=1e-6)
    nll = -logp.gather(-1, fixed[..., None])[..., 0]
    assert before[1] == pytest.approx(nll[keep].mean().item(), rel=1e-6)
    with torch.no_grad():  # scramble every logit after a target's END
        gen = torch.Generator().manual_seed(1)
        teacher[~keep] += 5 * torch.randn(teacher[~keep].shape, generator=gen)
        student[~(keep | demo_keep)] += 5 * torch.randn(
            student[~(keep | demo_keep)].shape, generator=gen
        )
    assert losses() == pytest.approx(before, rel=1e-6)


def test_fast_blocks_are_cut_and_padded_to_one_width():
    """A trajectory is cut to the block's first n states and tokens (its state n - 1 is then
    the block's fixed point), or padded: later states with its last, later tokens with END; a
    resumed collection's narrower batches are padded to the widest."""
    end = 9
    traj = torch.arange(2 * 5 * 6).reshape(2, 5, 6)  # (B, K + 1 = 5 states, 6 tokens)
    cut, length = fit_block(traj, torch.tensor([5, 3]), 4, end)
    assert torch.equal(cut, traj[:, :4, :4]) and length.tolist() == [4, 3]
    wide, same = fit_block(cut[:, :3, :3], torch.tensor([3, 2]), 5, end)
    assert wide.shape == (2, 5, 5) and same.tolist() == [3, 2]
    assert torch.equal(wide[:, :3, :3], cut[:, :3, :3]) and (wide[:, :, 3:] == end).all()
    assert torch.equal(wide[:, 3:, :3], cut[:, 2:3, :3].expand(-1, 2, -1))
    parts = {
        "frame": [torch.tensor([0, 1]), torch.tensor([2])],
        "states": [cut[:, :2, :2], torch.zeros(1, 3, 3, dtype=torch.long)],
        "length": [torch.tensor([2, 1]), torch.tensor([3])],
    }
    joined = _join(parts, FastConfig(vocab_size=4, max_tokens=8, end_id=end))
    assert joined["states"].shape == (3, 3, 3) and joined["length"].tolist() == [2, 1, 3]


def test_demo_codes_decode_back_to_the_demo_chunks():
    """A FAST policy's demo tokens are the chunks' codes (``FastHead.encode``, as training
    writes them), END-padded to the cap: decoded, they come back within FAST's bound."""
    model = Policy.from_preset("tiny-pi0-fast", seed=0).model
    fast = model.cfg.fast
    chunks = torch.tensor(np.stack(smooth_chunks(6, 8, 7, seed=3)), dtype=torch.float32)
    codes = demo_codes(model, chunks)
    assert codes.shape == (6, fast.max_tokens) and (code_lengths(codes, fast.end_id) > 1).all()
    assert torch.equal(codes, pad_after_end(codes, fast.end_id))
    assert (code_lengths(codes, fast.end_id) < fast.max_tokens).all()  # every code has END
    bound = 0.5 * math.sqrt(8) / model.fast_head.tokenizer.scale
    assert (model.tokens_to_actions(codes) - chunks).abs().max().item() <= bound + 1e-6


def _fast_teacher(directory: Path) -> Path:
    """tiny-ar's weights writing a FAST code (a synthetic vocabulary over its 256 action ids)
    up to END, whose LM head row is 1.05 x bin 390's: on the reach demos a code ends after 1
    or 9 tokens, or runs to the cap of 16 without END. Its window is 4 tokens."""
    policy = Policy.from_checkpoint(TINY_AR)
    end = 3
    fast = FastConfig(vocab_size=256, max_tokens=16, end_id=end)
    cfg = dataclasses.replace(policy.model.cfg, name="tiny-fast", decode_tokens=4, fast=fast)
    model = VLA(cfg)
    model.load_state_dict(policy.model.state_dict())
    with torch.no_grad():
        head = model.language_model.lm_head.weight
        head[end] = 1.05 * head[390]
    model.set_fast_tokenizer(synthetic_fast_tokenizer(cfg.horizon, cfg.action_dim, 256))
    stats = json.loads((TINY_AR / "dataset_statistics.json").read_text())
    return save_vla(
        model.eval(), directory, norm_stats=stats, tokenizer_file=TINY_AR / "tokenizer.json"
    )


def test_distill_a_fast_teacher(tmp_path, demos):
    """A FAST teacher collects its codes' window trajectories (fixed points = greedy's codes)
    on blocks of the longest code, capped; trains 2 steps on demo codes; exports a student
    that carries the teacher's FAST tokenizer and decodes with it."""
    if not (TINY_AR / "config.json").exists():
        pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
    teacher_dir = _fast_teacher(tmp_path / "tiny-fast")
    run = tmp_path / "run"
    cfg = DistillConfig(
        teacher=str(teacher_dir),
        demos=str(demos),
        out=str(run),
        frames=24,
        collect_batch=8,
        eval_frames=4,
        steps=2,
        batch=2,
        block=12,
        save_every=1,
        log_every=1,
        warmup=1,
        ar_target="demo",
    )
    got = distill(cfg)
    assert got["step"] == 2
    data = load_file(run / "trajectories.safetensors")
    with safe_open(run / "trajectories.safetensors", "pt") as f:
        meta = f.metadata()
    n, end = 12, 3
    code = data["code"].long()
    assert (code < n).any() and (code > n).any()  # codes that end in the block, codes cut
    assert data["states"].shape == (24, n, n) and got["collected"]["tokens"] == n
    assert {k: meta[k] for k in ("init", "window", "block", "width")} == {
        "init": cfg.init,
        "window": "4",
        "block": "12",
        "width": "12",
    }
    # The fixed points are the teacher's greedy codes, up to END or the block's end.
    teacher = Policy.from_checkpoint(teacher_dir)
    frames = load_frames(cfg, teacher)
    idx, model = data["frame"].long(), teacher.model
    with torch.no_grad():
        pre = model.prefill(
            model.build_prefix(
                model.encode_images(frames.image_batch(idx)), [frames.text[i] for i in idx.tolist()]
            )
        )
        greedy = model.decode_tokens(pre)
    assert torch.equal(code, code_lengths(greedy, end))
    fixed = data["states"][torch.arange(24), data["length"].long() - 1].long()
    keep = code_mask(fixed, end)
    assert torch.equal(keep.sum(1), code.clamp(max=n))
    assert torch.equal(fixed[keep], greedy[:, :n][keep])
    # The export carries the teacher's FAST tokenizer, loads with it and decodes.
    export = Path(got["exported"])
    for name in ("tokenizer.json", "processor_config.json"):
        mine = (export / "fast_tokenizer" / name).read_bytes()
        assert mine == (teacher_dir / "fast_tokenizer" / name).read_bytes()
    student = Policy.from_checkpoint(export)
    assert student.model.fast_head is not None and student.calibration["jacobi"]["init"] == cfg.init
    assert "Jacobi window 4" in (export / "README.md").read_text()
    assert "student_exit_code_agreement_with_teacher" in got["evaluation"]
    decoder = JacobiDecoder(JacobiConfig(sigma=0.5, init=cfg.init))
    actions = student.with_hooks(decoder=decoder).predict(
        np.zeros((128, 128, 3), np.uint8), "reach the goal"
    )
    assert actions.shape == (4, 4) and np.isfinite(actions).all()
