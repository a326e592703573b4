"""OpenVLA-OFT's pickled heads: converted once (weights_only), then loaded from safetensors."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from vlarun.apps.convert import convert
from vlarun.cli import main
from vlarun.models.checkpoint import CheckpointError, stream_weights, vla_config_from
from vlarun.models.oft_files import PLATFORMS, HeadsError, pickled_heads
from vlarun.models.oft_head import L1RegressionHead, OFTHeadConfig
from vlarun.models.vla import ProprioProjector

pytestmark = pytest.mark.filterwarnings("ignore:reading .*weights_only")

LLM = 32
HEAD = OFTHeadConfig(llm_dim=LLM, action_dim=7, chunk=8, hidden_dim=48, num_blocks=2)
TEXT = {
    "vocab_size": 544,
    "hidden_size": LLM,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
OPENVLA = {
    "model_type": "openvla",
    "text_config": TEXT,
    "image_sizes": [112, 112],
    "llm_max_length": 2048,
    "pad_to_multiple_of": 32,
}


def _oft_dir(tmp_path, steps=("5000", "10000"), proprio_dim=8):
    """A directory as OpenVLA-OFT's fine-tuning leaves it: config.json plus DDP-prefixed head
    state dicts saved with torch.save at two steps. Returns (dir, modules of the last step)."""
    d = tmp_path / "oft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(OPENVLA))
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        head, proj = L1RegressionHead(HEAD), ProprioProjector(proprio_dim, LLM)
        for kind, module in (("action_head", head), ("proprio_projector", proj)):
            state = {f"module.{k}": v for k, v in module.state_dict().items()}
            torch.save(state, d / f"{kind}--{step}_checkpoint.pt")
    return d, head, proj


def test_conversion_keeps_every_tensor_under_vlarun_names(tmp_path):
    d, head, proj = _oft_dir(tmp_path)
    with pytest.warns(UserWarning, match="weights_only=True"):
        meta = convert(d, PLATFORMS["libero"])
    assert meta | {"sources": None} == {
        "chunk": 8,
        "action_dim": 7,
        "num_images": 2,
        "llm_dim": LLM,
        "hidden_dim": 48,
        "num_blocks": 2,
        "proprio_dim": 8,
        "sources": None,
    }
    assert set(meta["sources"]) == {
        "action_head--10000_checkpoint.pt",
        "proprio_projector--10000_checkpoint.pt",
    }
    state = load_file(d / "oft_heads.safetensors")
    new_head, new_proj = L1RegressionHead(HEAD), ProprioProjector(8, LLM)
    new_head.load_state_dict({k[12:]: v for k, v in state.items() if k.startswith("action_head.")})
    new_proj.load_state_dict({k[18:]: v for k, v in state.items() if k.startswith("proprio_")})
    x, s = torch.randn(2, HEAD.num_action_tokens, LLM), torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(new_head(x), head(x)) and torch.equal(new_proj(s), proj(s))
    assert json.loads((d / "oft_heads.json").read_text()) == meta


def test_the_step_is_chosen_latest_then_highest_or_as_asked(tmp_path):
    d, _, _ = _oft_dir(tmp_path, steps=("900", "10000", "latest"))
    assert pickled_heads(d)["action_head"].name == "action_head--latest_checkpoint.pt"
    assert pickled_heads(d, "900")["action_head"].name == "action_head--900_checkpoint.pt"
    with pytest.raises(HeadsError, match=r"no action_head--7_checkpoint.pt \(steps: 10000, 900"):
        pickled_heads(d, "7")


def test_a_pickle_that_holds_code_is_refused_and_nothing_is_written(tmp_path):
    d, _, _ = _oft_dir(tmp_path, steps=("1",))
    torch.save(
        {"module.model.fc1.weight": torch.zeros(2, 7), "hook": os.getcwd, "n": 1},
        d / "action_head--2_checkpoint.pt",
    )
    with pytest.raises(HeadsError, match="action_head--2_checkpoint.pt: not a plain state dict"):
        convert(d, PLATFORMS["libero"])
    assert not (d / "oft_heads.safetensors").exists() and not (d / "oft_heads.json").exists()


def test_sizes_that_disagree_with_the_platform_name_the_key(tmp_path):
    d, _, _ = _oft_dir(tmp_path, steps=("1",))
    with pytest.raises(HeadsError, match="proprio_projector.fc1.weight takes 8 state numbers"):
        convert(d, PLATFORMS["bridge"])  # bridge: 7 state numbers
    with pytest.raises(HeadsError, match="fc2.weight emits 7 action numbers, the platform 14"):
        convert(d, PLATFORMS["aloha"])
    assert not (d / "oft_heads.safetensors").exists()


def test_a_converted_directory_is_the_parallel_family(tmp_path):
    d, _, _ = _oft_dir(tmp_path)
    with pytest.raises(CheckpointError, match=f"vlarun convert {d} --platform"):
        vla_config_from(OPENVLA, d)  # the pickles alone are never loaded
    with pytest.warns(UserWarning):
        convert(d, PLATFORMS["libero"])
    cfg = vla_config_from(OPENVLA, d)
    assert (cfg.family, cfg.chunk, cfg.action_dim, cfg.num_images, cfg.proprio_dim) == (
        "parallel",
        8,
        7,
        2,
        8,
    )
    assert cfg.oft == HEAD and cfg.prompt_suffix_ids == (29871,)
    assert cfg.max_text_tokens == 2048 - 1 - cfg.num_visual - 1 - 56  # 1: the proprio token
    assert cfg.max_sequence == 2048
    assert vla_config_from(OPENVLA, tmp_path).family == "autoregressive"  # no heads there
    wide = OPENVLA | {"text_config": TEXT | {"hidden_size": 64, "num_attention_heads": 4}}
    with pytest.raises(CheckpointError, match="reads 32-wide LM states, the LM is 64 wide"):
        vla_config_from(wide, d)


def test_sharded_weights_stream_with_the_converted_heads(tmp_path):
    d, _, _ = _oft_dir(tmp_path, steps=("1",))
    from safetensors.torch import save_file

    save_file({"language_model.lm_head.weight": torch.zeros(4, LLM)}, d / "model-1.safetensors")
    index = {"weight_map": {"language_model.lm_head.weight": "model-1.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.warns(UserWarning):
        convert(d, PLATFORMS["libero"])
    names = {n for n, _ in stream_weights(d)}
    assert "language_model.lm_head.weight" in names
    assert "action_head.model.fc1.weight" in names and "proprio_projector.fc2.bias" in names


def test_convert_command(tmp_path, capsys):
    d, _, _ = _oft_dir(tmp_path, steps=("1",))
    assert main(["convert", str(d), "--platform", "libero", "--json"]) == 0
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert r["chunk"] == 8 and r["proprio_dim"] == 8 and "weights_only=True" in out.err
    assert main(["convert", str(d), "--platform", "bridge"]) == 2  # one clear line, exit 2
    assert "7" in capsys.readouterr().err
