"""Checkpoints: round trips, transformers directories, and clear refusals."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vlarun.models.checkpoint import (
    CheckpointError,
    load_hf_module,
    load_vla,
    read_weights,
    save_vla,
    vla_config_from,
)
from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA

TINY = ["tiny-openvla", "tiny-openvla-oft", "tiny-cogact", "tiny-pi0", "tiny-smolvla"]


def _inputs(cfg, batch=1):
    torch.manual_seed(1)
    images = torch.rand(batch, 3, cfg.image_size, cfg.image_size)
    noise = torch.randn(batch, cfg.horizon, cfg.action_dim)
    return images, [[40, 41, 42]] * batch, noise


@pytest.mark.parametrize("name", TINY)
def test_vla_round_trip_in_prismatic_layout(tmp_path, name):
    torch.manual_seed(0)
    cfg = get_preset(name)
    model = VLA(cfg).eval()
    stats = {"demo": {"action": {"q01": [-2.0] * 7, "q99": [2.0] * 7, "mask": [True] * 7}}}
    save_vla(model, tmp_path / "ckpt", norm_stats=stats)
    keys = load_file(tmp_path / "ckpt" / "model.safetensors").keys()
    assert any(k.startswith("vision_backbone.featurizer.blocks.0.attn.qkv") for k in keys)
    assert any(k.startswith("language_model.model.layers.0.self_attn.q_proj") for k in keys)
    loaded, loaded_stats = load_vla(tmp_path / "ckpt")
    assert loaded.cfg == cfg and loaded_stats == stats
    images, ids, noise = _inputs(cfg)
    state = torch.randn(1, cfg.state_dim) if cfg.state_dim else None
    kw = {"noise": noise, "state": state}
    # Equal to float rounding, not bit for bit: BLAS picks its kernel by the tensors'
    # alignment, and the loaded weights sit elsewhere in memory (on an AVX2 CPU tiny-pi0 and
    # tiny-smolvla then differ by ~5e-7; a wrong or missing tensor moves them by ~1).
    torch.testing.assert_close(
        model.act(images, ids, **kw), loaded.act(images, ids, **kw), rtol=0, atol=1e-5
    )


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="refuses pickle"):
        read_weights(tmp_path)
    with pytest.raises(CheckpointError, match="refuses pickle"):
        read_weights(tmp_path / "pytorch_model.bin")


def test_missing_unexpected_and_misshaped_keys_are_named(tmp_path):
    torch.manual_seed(0)
    model = VLA(get_preset("tiny-openvla"))
    save_vla(model, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    state = load_file(path)
    del state["projector.fc1.bias"]
    state["language_model.model.norm.weight"] = torch.ones(5)
    state["surprise.weight"] = torch.zeros(1)
    save_file(state, path)
    with pytest.raises(CheckpointError) as err:
        load_vla(tmp_path / "ckpt")
    msg = str(err.value)
    assert "projector.fc1.bias" in msg and "surprise.weight" in msg
    assert "language_model.model.norm.weight: checkpoint (5,)" in msg


def test_other_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="'bert' model"):
        load_vla(tmp_path)
    with pytest.raises(CheckpointError, match="'bert' model"):
        load_hf_module(tmp_path)


def test_failed_save_leaves_nothing(tmp_path, monkeypatch):
    model = VLA(get_preset("tiny-openvla"))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("vlarun.models.checkpoint.save_file", boom)
    with pytest.raises(OSError):
        save_vla(model, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


transformers = pytest.importorskip("transformers")


def _hf_llama(tmp_path):
    cfg = transformers.LlamaConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    return model


def test_transformers_llama_directory_loads_and_matches(tmp_path):
    hf = _hf_llama(tmp_path)
    kind, ours, _ = load_hf_module(tmp_path)
    ids = torch.randint(0, 101, (1, 16))
    with torch.no_grad():
        diff = (hf(input_ids=ids).logits - ours.logits(ours(ours.embed(ids)).hidden)).abs().max()
    assert kind == "llama" and diff <= 1e-4, diff


@pytest.mark.parametrize("kind", ["siglip", "dinov2", "clip"])
def test_transformers_vision_directory_loads_and_matches(tmp_path, kind):
    torch.manual_seed(0)
    if kind == "clip":
        cfg = transformers.CLIPVisionConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        )
        hf = transformers.CLIPVisionModel(cfg).eval()
    elif kind == "siglip":
        cfg = transformers.SiglipVisionConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        )
        hf = transformers.SiglipVisionModel(cfg).eval()
    else:
        cfg = transformers.Dinov2Config(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4
        )
        hf = transformers.Dinov2Model(cfg).eval()
    hf.save_pretrained(tmp_path)
    got_kind, ours, _ = load_hf_module(tmp_path)
    px = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        diff = (hf(pixel_values=px).last_hidden_state - ours.last_hidden_state(px)).abs().max()
    assert got_kind == kind and diff <= 1e-4, diff


def test_openvla_directories_append_29871_and_allow_long_prompts():
    """OpenVLA's predict_action appends token 29871 after "Out:"; its checkpoints carry that
    as a property, counted in a text budget that is the LM context minus everything else."""
    from vlarun.models.checkpoint import vla_config_from
    from vlarun.models.tokenizer import ByteTokenizer
    from vlarun.models.vla import VLA
    from vlarun.policy import Policy

    cfg = vla_config_from({"model_type": "openvla", "text_config": {"vocab_size": 32064}})
    assert cfg.prompt_suffix_ids == (29871,)
    assert cfg.max_text_tokens == 2048 - 1 - 256 - 7 and cfg.max_sequence == 2048
    with torch.device("meta"):
        model = VLA(cfg)
    policy = Policy(model, ByteTokenizer(cfg.llm.vocab_size))
    ids = policy.text_ids("open the drawer")
    assert ids[-1] == 29871 and ids[:-1] == ByteTokenizer(32064).encode(
        "In: What action should the robot take to open the drawer?\nOut:"
    )
    assert len(policy.text_ids("go " * 500)) > 1000  # no 48-token cap
    own = get_preset("tiny-openvla")
    assert own.prompt_suffix_ids == ()  # our own checkpoints were trained without it


def test_streamed_bf16_load_costs_about_the_checkpoint_in_memory(tmp_path):
    """A ~170M-parameter bf16 directory loads in a fresh process with a peak growth within
    1.3 x its size, every weight read once (the loader builds on the meta device and puts each
    tensor in place; building in fp32 and casting cost 4 x before). Sharded, as 7B ones are."""
    import dataclasses
    import subprocess
    import sys

    from vlarun.models.llama import LlamaConfig

    llm = LlamaConfig(
        vocab_size=32064,
        hidden_size=1024,
        intermediate_size=2816,
        num_layers=12,
        num_heads=16,
        num_kv_heads=4,
        max_positions=1024,
    )
    cfg = dataclasses.replace(get_preset("tiny-openvla"), llm=llm, action_vocab_size=32000)
    from vlarun.models.checkpoint import random_vla

    model = random_vla(cfg, torch.bfloat16)
    out = save_vla(model, tmp_path / "ckpt")
    state = load_file(out / "model.safetensors")
    names = sorted(state)
    half = len(names) // 2
    (out / "model.safetensors").unlink()
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, out / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    del state, model
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "vlarun.cli", "bench", "load", str(out), "--json"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)
    assert r["params"] > 150e6 and r["dtype"] == "torch.bfloat16"
    assert r["ratio_after_reading_every_weight"] <= 1.3, r


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("use_fused_vision_backbone", False, "use_fused_vision_backbone=False"),
        ("timm_model_ids", ["vit_base_patch16_clip_224"], "timm_model_ids="),
        ("image_sizes", [224, 384], r"image_sizes=\[224, 384\]"),
        ("image_sizes", [225, 225], "multiple of their 14-pixel patch"),
        ("n_action_bins", 512, "n_action_bins=512"),
    ],
)
def test_a_prismatic_field_vlarun_cannot_build_is_named_in_one_line(field, value, message):
    config = {"model_type": "openvla", "text_config": {"vocab_size": 32064}, field: value}
    with pytest.raises(CheckpointError, match=message) as err:
        vla_config_from(config, "ckpt")
    assert "\n" not in str(err.value) and "ckpt/config.json" in str(err.value)


def test_prismatic_text_config_and_image_size_shape_the_model():
    """The LM's sizes come from text_config and the towers' resolution from image_sizes, not
    from the 7B preset: another Prismatic shape builds (here a small Llama at 112 px)."""
    text = {
        "vocab_size": 544,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    config = {
        "model_type": "openvla",
        "text_config": text,
        "image_sizes": [112, 112],
        "llm_max_length": 1024,
        "pad_to_multiple_of": 32,
    }
    cfg = vla_config_from(config, "ckpt")
    assert (cfg.llm.hidden_size, cfg.llm.num_layers, cfg.llm.num_kv_heads) == (64, 2, 2)
    assert cfg.llm.max_positions == 1024 and cfg.image_size == 112
    assert cfg.num_visual == (112 // 14) ** 2 and cfg.action_vocab_size == 512


def test_openvla_directories_resize_any_frame_bicubic(tmp_path):
    """An OpenVLA-layout directory takes frames of any size, resized bicubic to the processor's
    size before anything else (as its processor does); vlarun's own checkpoints refuse them."""
    import numpy as np
    from PIL import Image

    from vlarun.policy import Policy

    torch.manual_seed(0)
    model = VLA(get_preset("tiny-openvla"))
    out = save_vla(model, tmp_path / "ours")
    frame = np.random.default_rng(0).integers(0, 255, (96, 160, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="expects"):
        Policy.from_checkpoint(out).image_tensor(frame)
    size = model.cfg.image_size
    processor = {"image_resize_strategy": "resize-naive", "input_sizes": [[3, size, size]] * 2}
    (out / "preprocessor_config.json").write_text(json.dumps(processor))
    from vlarun.policy.base import frame_resize

    assert frame_resize(out, size) is None  # a vlarun directory keeps refusing
    (out / "config.json").write_text(json.dumps({"model_type": "openvla"}))
    assert frame_resize(out, size) == "bicubic"
    from vlarun.models.tokenizer import ByteTokenizer

    policy = Policy(model, ByteTokenizer(model.cfg.llm.vocab_size), resize="bicubic")
    want = np.asarray(Image.fromarray(frame).resize((size, size), Image.BICUBIC))
    got = policy.image_tensor(frame)
    assert got.shape == (1, 1, 3, size, size)
    expected = torch.from_numpy(want.copy()).permute(2, 0, 1).float().div(255)[None, None]
    assert torch.equal(got, expected)
    (out / "preprocessor_config.json").write_text(json.dumps({"input_sizes": [[3, 448, 448]]}))
    with pytest.raises(ValueError, match="input sizes"):
        frame_resize(out, size)


def test_a_policy_that_lost_its_tokenizer_is_refused_in_one_line(tmp_path, capsys):
    """Without tokenizer.json a shipped policy read its prompt as bytes and said only "58
    tokens; tiny-ar allows 32" (issue 45, 6). A checkpoint saved without a tokenizer says so
    in its config and still loads (byte-level on purpose)."""
    import shutil

    from vlarun.cli import main
    from vlarun.paths import checkpoints_dir
    from vlarun.policy import Policy

    lost = tmp_path / "tiny-ar"
    shutil.copytree(checkpoints_dir() / "tiny-ar", lost)
    (lost / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Policy.load(str(lost))
    image = tmp_path / "f.npy"
    np.save(image, np.zeros((128, 128, 3), np.uint8))
    argv = ["act", "--policy", str(lost), "--image", str(image), "--instruction", "open drawer"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no tokenizer.json" in err, err
    model = Policy.from_preset("tiny-openvla").model  # byte-level: its prompt fits in bytes
    bytes_level = save_vla(model, tmp_path / "bytes")
    assert json.loads((bytes_level / "config.json").read_text())["tokenizer"] == "byte"
    assert Policy.load(str(bytes_level)).predict(np.zeros((64, 64, 3), np.uint8), "x").shape


def test_a_directory_without_weights_or_config_says_which_is_missing(tmp_path, capsys):
    """A LeRobot directory without model.safetensors said "88 missing keys" (its processor
    statistics were read as weights); a directory without config.json said "neither a
    checkpoint directory nor a shipped policy" (issue 45, 7)."""
    from vlarun import parity
    from vlarun.cli import main

    parity.make_lerobot_dir(tmp_path / "lr", "pi0")
    (tmp_path / "lr" / "model.safetensors").unlink()
    (tmp_path / "empty").mkdir()
    (tmp_path / "openpi" / "params").mkdir(parents=True)  # openpi's JAX tree: orbax params
    for d, needle in (
        ("lr", "no model.safetensors"),
        ("empty", "without config.json"),
        ("openpi", "openpi JAX / orbax checkpoint"),
    ):
        argv = ["act", "--policy", str(tmp_path / d), "--image", "x.png", "--instruction", "x"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
