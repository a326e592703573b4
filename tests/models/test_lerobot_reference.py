"""LeRobot pi0 / pi05 / SmolVLA / pi0_fast directories in vlarun, against LeRobot's own models
and transformers'.

Each fixture holds what LeRobot's unmodified ``PI0Pytorch`` / ``PI05Pytorch`` /
``VLAFlowMatching`` / ``PI0FastPytorch`` (lerobot 7427f31, on transformers 5.5.4) computed on
the seeded tiny directory ``vlarun.parity.make_lerobot_dir`` writes;
``fixtures/record_lerobot_reference.py`` recorded it (LeRobot cannot be installed here: it needs
Python >= 3.12). The prefix is also checked live against transformers' PaliGemma modules.

pi0_fast's actions are LeRobot's own decoding too: ``PI0FastPolicy.detokenize_actions`` and
``decode_actions_with_fast`` ran unmodified, on the directory's FAST tokenizer (the FAST
processor LeRobot fetches from the hub stands in as the three attributes those methods read).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vlarun import parity
from vlarun.accel.jacobi import JacobiConfig, jacobi_decode
from vlarun.models import lerobot
from vlarun.models.checkpoint import CheckpointError
from vlarun.models.fast_head import FastHead
from vlarun.models.fast_tokens import FastTokenizer
from vlarun.policy.base import Policy

FIXTURES = Path(__file__).parent / "fixtures"
# pi0_fast's greedy choices: vlarun must pick LeRobot's token at every step. The closest choice
# in the fixture is 5.3e-4 from its runner-up (``min_logit_gap``), more than ten times the
# fp32 error of these logits (4e-5 against vlarun in float64, which picks the same tokens).
# The same ids then decode through the same inverse DCT; LeRobot returns it as float32.
FAST_ACTIONS_TOL = 1e-6


@pytest.fixture(scope="module", params=["pi0", "pi05", "smolvla", "pi0_fast"])
def reference(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"lerobot-{request.param}")
    parity.make_lerobot_dir(d, request.param)
    fixture = json.loads((FIXTURES / f"lerobot_{request.param}_reference.json").read_text())
    digest = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    assert digest == fixture["weights_sha256"], "the seeded directory changed: re-record it"
    if "fast_tokenizer_sha256" in fixture:
        fast = hashlib.sha256((d / "fast_tokenizer" / "tokenizer.json").read_bytes()).hexdigest()
        assert fast == fixture["fast_tokenizer_sha256"], "the FAST tokenizer changed: re-record"
    return d, fixture


def test_same_prompt_state_noise_and_actions_as_lerobot(reference):
    d, fixture = reference
    policy = Policy.load(d)
    inputs = parity.lerobot_reference_inputs()
    # LeRobot's tokenizer step puts <bos> in the ids; vlarun's prefix adds it (images first;
    # SmolVLM's tokenizer adds none); pi0_fast's second <bos>, after the prompt, is in the
    # prompt's ids. pi05 and pi0_fast write the binned state into the prompt; pi0 feeds it
    # (padded) to the expert, SmolVLA to a prefix token.
    ids = policy.text_ids(inputs["task"], inputs["state"])
    bos = policy.model.cfg.bos_id
    assert [*([] if bos is None else [bos]), *ids] == fixture["input_ids"]
    if policy.model.cfg.state_dim:
        state = policy.state_tensor(inputs["state"])[0].numpy()
        np.testing.assert_allclose(state, fixture["state_normalised"], atol=1e-6)
    else:
        assert policy.state_tensor(inputs["state"]) is None
        with pytest.raises(ValueError, match="writes the robot state into its prompt"):
            policy.text_ids(inputs["task"])
    if policy.model.cfg.fast is not None:
        _check_fast_code(policy, fixture, inputs)
        return
    packet, _ = policy.inputs(inputs["frames"], inputs["task"], inputs["state"], seed=0)
    assert torch.equal(packet["noise"][0], torch.tensor(fixture["noise"]))
    # frames of two sizes, letterboxed as LeRobot does, through the whole stage graph
    run = policy.run_stages(inputs["frames"], inputs["task"], state=inputs["state"], seed=0)
    chunk = run.outputs["actions"][0].numpy()
    assert np.abs(chunk - np.array(fixture["chunk"])).max() < 1e-5
    actions = policy.unnormalize(run.outputs["actions"][0])
    assert actions.shape == (4, 7)  # the robot's 7 of the model's 32 action dimensions
    assert np.abs(actions - np.array(fixture["actions"])).max() < 1e-5


def _check_fast_code(policy, fixture, inputs) -> None:
    """pi0_fast: the same greedy tokens as LeRobot's KV-cached decoding, up to and including
    its "|" (text ids among them, which both decoders drop), and the same actions."""
    run = policy.run_stages(inputs["frames"], inputs["task"], state=inputs["state"])
    assert run.outputs["action_ids"][0].tolist() == fixture["generated_ids"]
    chunk = run.outputs["actions"][0].numpy()
    assert chunk.shape == (4, 7)  # n_action_steps x the robot's action dimensions, unpadded
    assert np.abs(chunk - np.array(fixture["actions_normalised"])).max() < FAST_ACTIONS_TOL
    actions = policy.unnormalize(run.outputs["actions"][0])
    assert np.abs(actions - np.array(fixture["actions"])).max() < 1e-5  # float32 statistics
    assert policy.model.fast_head.failures == 0


@pytest.mark.parametrize("reference", ["pi0_fast"], indirect=True)
def test_fast_codes_decode_as_lerobot_decodes_them(reference):
    """Hand-made sequences through LeRobot's ``detokenize_actions``: the "Action: " marker
    removed wherever it is, the code cut at "|", text ids dropped, a short code padded, a long
    one cut, an id of the 128 skipped ones the all-zero chunk. Where LeRobot's assertion stops
    the inference (``validate_action_token_prefix`` and no marker) vlarun returns the all-zero
    chunk and counts a failure."""
    d, fixture = reference
    config = json.loads((d / "config.json").read_text())
    fast = FastTokenizer.load(d / "fast_tokenizer", action_horizon=4, action_dim=7)
    heads = {}
    for validate in (False, True):
        cfg = lerobot.vla_config(config | {"validate_action_token_prefix": validate}, d)
        heads[validate] = FastHead(cfg.fast, cfg.llm.vocab_size, fast, 4, 7)
    assert heads[True].cfg.starts == (18, 19) and heads[False].cfg.starts == ()  # "Action" ":"
    for case in fixture["decoded"]:
        head = heads[case["validate"]]
        failures = head.failures
        got = head.decode(case["ids"])
        if "error" in case:
            assert case["error"] == "AssertionError"
            assert not got.any() and head.failures == failures + 1, case["name"]
        else:
            want = np.array(case["actions"])
            assert np.abs(got - want).max() < FAST_ACTIONS_TOL, case["name"]


@pytest.mark.parametrize("reference", ["pi0_fast"], indirect=True)
@torch.no_grad()
def test_jacobi_decoding_lands_on_lerobots_tokens(reference):
    """Plain Jacobi decoding (no early exit) of the FAST code, in its sliding window, from
    random guesses: the same tokens as LeRobot's greedy loop, "|" included."""
    d, fixture = reference
    policy = Policy.load(d)
    model, inputs = policy.model, parity.lerobot_reference_inputs()
    ids = policy.text_ids(inputs["task"], inputs["state"])
    images = policy.image_tensor(inputs["frames"])
    pre = model.prefill(model.build_prefix(model.encode_images(images), [ids]))
    result = jacobi_decode(model, pre, JacobiConfig(window=4, seed=0))
    assert result.tokens[0].tolist() == fixture["generated_ids"]


def test_the_prefix_matches_transformers(reference):
    """vlarun's prefill against transformers' own modules on the same weights: PaliGemma
    (SigLIP -> projector -> Gemma over [images, <bos>, text], every token seeing every other)
    or SmolVLM (its vision tower -> pixel-shuffle connector -> Llama over [images, text,
    state], the state in a block of its own)."""
    transformers = pytest.importorskip("transformers")
    d, _ = reference
    policy = Policy.load(d)
    if policy.model.cfg.name == "lerobot-smolvla":
        _check_smolvlm_prefix(transformers, d, policy)
        return
    model, cfg = policy.model, policy.model.cfg
    tower, llm = cfg.vision[0], cfg.llm
    text = transformers.GemmaConfig(
        vocab_size=llm.vocab_size,
        hidden_size=llm.hidden_size,
        num_hidden_layers=llm.num_layers,
        intermediate_size=llm.intermediate_size,
        num_attention_heads=llm.num_heads,
        num_key_value_heads=llm.num_kv_heads,
        head_dim=llm.hd,
        hidden_activation="gelu_pytorch_tanh",
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=tower.hidden_size,
        num_hidden_layers=tower.num_layers,
        num_attention_heads=tower.num_heads,
        intermediate_size=tower.intermediate_size,
        patch_size=tower.patch_size,
        image_size=tower.image_size,
        projection_dim=llm.hidden_size,
        vision_use_head=False,
    )
    hf_cfg = transformers.PaliGemmaConfig(
        text_config=text, vision_config=vision, projection_dim=llm.hidden_size
    )
    hf = transformers.PaliGemmaForConditionalGeneration(hf_cfg).eval()
    prefix = "model.paligemma_with_expert.paligemma."
    state = {
        k[len(prefix) :]: v
        for k, v in load_file(str(d / "model.safetensors")).items()
        if k.startswith(prefix)
    }
    if "lm_head.weight" in state:  # pi0_fast's, saved as LeRobot saves the tied pair
        state["model.language_model.embed_tokens.weight"] = state.pop("lm_head.weight")
    own = hf.state_dict()
    if not any(".vision_tower.vision_model." in k for k in own):  # transformers >= 5.6 names
        state = {
            k.replace("vision_tower.vision_model.", "vision_tower."): v for k, v in state.items()
        }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("lm_head.weight") for k in missing)

    inputs = parity.lerobot_reference_inputs()
    images = policy.image_tensor(inputs["frames"])  # (1, 2, 3, S, S) in [0, 1]
    ids = policy.text_ids(inputs["task"], inputs["state"])
    with torch.no_grad():
        pre = model.prefill(model.build_prefix(model.encode_images(images), [ids]))
        feats = hf.model.get_image_features(images[0] * 2 - 1)
        feats = getattr(feats, "pooler_output", feats)  # an output object in transformers 5
        lm = hf.model.language_model
        text_emb = lm.embed_tokens(torch.tensor([[cfg.bos_id, *ids]]))  # scaled by sqrt(width)
        embeds = torch.cat((feats.reshape(1, -1, llm.hidden_size), text_emb), dim=1)
        n = embeds.shape[1]
        everyone = torch.zeros(1, 1, n, n)  # additive mask: the prefix attends bidirectionally
        out = lm(
            inputs_embeds=embeds, attention_mask=everyone, position_ids=torch.arange(n)[None]
        ).last_hidden_state
    assert pre.lm.hidden.shape == out.shape
    assert (pre.lm.hidden - out).abs().max() < 1e-4


def _check_smolvlm_prefix(transformers, d, policy) -> None:
    model, cfg = policy.model, policy.model.cfg
    vlm = json.loads((d / "vlm_config.json").read_text())
    # LeRobot rotates with its own apply_rope at 10000 (not the text config's theta), and
    # keeps the first num_vlm_layers layers: the reference module is built the same way.
    text = vlm["text_config"] | {"rope_theta": 10000.0, "num_hidden_layers": cfg.llm.num_layers}
    hf_cfg = transformers.SmolVLMConfig(
        text_config=text, vision_config=vlm["vision_config"], scale_factor=vlm["scale_factor"]
    )
    hf = transformers.SmolVLMForConditionalGeneration(hf_cfg).eval()
    prefix = "model.vlm_with_expert.vlm."
    state = {
        k[len(prefix) :]: v
        for k, v in load_file(str(d / "model.safetensors")).items()
        if k.startswith(prefix)
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("lm_head.weight") for k in missing)
    inputs = parity.lerobot_reference_inputs()
    images = policy.image_tensor(inputs["frames"])
    ids = policy.text_ids(inputs["task"], inputs["state"])
    st = policy.state_tensor(inputs["state"])
    with torch.no_grad():
        pre = model.prefill(model.build_prefix(model.encode_images(images), [ids], st))
        m, width = hf.model, cfg.llm.hidden_size
        feats = m.connector(m.vision_model(pixel_values=images[0] * 2 - 1).last_hidden_state)
        text_emb = m.text_model.embed_tokens(torch.tensor([ids]))
        state_emb = model.proprio_projector(st)[:, None]  # LeRobot's state_proj, one Linear
        embeds = torch.cat(
            (feats.reshape(1, -1, width) * width**0.5, text_emb * width**0.5, state_emb), dim=1
        )
        n = embeds.shape[1]
        mask = torch.zeros(1, 1, n, n)
        mask[..., :-1, -1] = torch.finfo(torch.float32).min  # only the state sees the state
        out = m.text_model(
            inputs_embeds=embeds, attention_mask=mask, position_ids=torch.arange(n)[None]
        ).last_hidden_state
    assert pre.lm.hidden.shape == out.shape
    assert (pre.lm.hidden - out).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["pi0", "pi05"])  # SmolVLA's tower has no such level
def test_a_flat_tower_layout_loads_the_same(kind, tmp_path):
    """Directories saved from transformers >= 5.6 modules have no ``vision_model`` level."""
    d, flat = tmp_path / "nested", tmp_path / "flat"
    parity.make_lerobot_dir(d, kind)
    shutil.copytree(d, flat)
    state = load_file(str(d / "model.safetensors"))
    assert any("vision_tower.vision_model." in k for k in state)
    state = {k.replace("vision_tower.vision_model.", "vision_tower."): v for k, v in state.items()}
    save_file(state, flat / "model.safetensors")
    a, b = Policy.load(d).model.state_dict(), Policy.load(flat).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_what_vlarun_cannot_load_is_one_line(reference, tmp_path):
    d, _ = reference
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    (bad / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json.*(paligemma-3b|SmolVLM2)"):
        Policy.load(bad)
    if (d / "fast_tokenizer").exists():
        (bad / "tokenizer.json").write_text((d / "tokenizer.json").read_text())
        shutil.rmtree(bad / "fast_tokenizer")
        with pytest.raises(
            CheckpointError,
            match="no fast_tokenizer.*fast-action-tokenizer's "
            "tokenizer.json and processor_config.json",
        ):
            Policy.load(bad)
        shutil.copytree(d / "fast_tokenizer", bad / "fast_tokenizer")
        (bad / "tokenizer.json").write_text(parity._word_tokenizer_json())  # not 257152 entries
        with pytest.raises(CheckpointError, match="tokens; LeRobot places the FAST ids"):
            Policy.load(bad)
    if (d / "vlm_config.json").exists():
        (bad / "tokenizer.json").write_text((d / "tokenizer.json").read_text())
        (bad / "vlm_config.json").unlink()
        with pytest.raises(CheckpointError, match="no vlm_config.json.*SmolVLM2-500M"):
            Policy.load(bad)
    config = json.loads((d / "config.json").read_text())
    for field, value, words in (
        ("use_visual_memory", True, "use_visual_memory=true"),
        ("add_image_special_tokens", True, "add_image_special_tokens=true"),
        ("use_relative_actions", True, "use_relative_actions"),
        *(
            ()
            if config["type"] == "smolvla"
            else (
                ("paligemma_variant", "gemma_7b", "paligemma_variant 'gemma_7b'; known"),
                ("image_resolution", [56, 64], "must be square"),
            )
        ),
        *(
            ()
            if config["type"] != "smolvla"
            else (
                ("num_expert_layers", 2, "num_expert_layers=2 of 4"),
                ("resize_imgs_with_padding", [64, 64], "but the vision tower takes 32"),
            )
        ),
        *(
            ()
            if config["type"] != "pi0_fast"
            else (
                ("image_resolution", [112, 112], "at 224 px whatever this says"),
                ("temperature", 0.5, "temperature=0.5 .*decodes greedily"),
            )
        ),
    ):
        shutil.copytree(d, tmp_path / field, dirs_exist_ok=True)
        (tmp_path / field / "config.json").write_text(json.dumps(config | {field: value}))
        with pytest.raises(CheckpointError, match=words):
            Policy.load(tmp_path / field)


def test_frames_and_states_are_checked(reference):
    d, _ = reference
    policy = Policy.load(d)
    inputs = parity.lerobot_reference_inputs()
    with pytest.raises(ValueError, match="takes 2 frame"):
        policy.image_tensor(inputs["frames"][:1])
    with pytest.raises(ValueError, match="reads a state of 8 numbers, got 5"):
        policy.inputs(inputs["frames"], inputs["task"], np.zeros(5, np.float32))


@pytest.mark.parametrize("kind", ["pi0", "pi05"])  # pi0_fast's directory is saved so already
def test_the_head_saved_under_its_own_name_loads_as_the_embedding(kind, tmp_path):
    """LeRobot saves through huggingface_hub's save_torch_state_dict, which keeps the tied
    PaliGemma head and embedding once, under the head's name (first in sort order)."""
    d, saved = tmp_path / "embedding", tmp_path / "head"
    parity.make_lerobot_dir(d, kind)
    shutil.copytree(d, saved)
    state = load_file(str(d / "model.safetensors"))
    prefix = "model.paligemma_with_expert.paligemma."
    embedding = prefix + "model.language_model.embed_tokens.weight"
    state[prefix + "lm_head.weight"] = state.pop(embedding)
    save_file(state, saved / "model.safetensors")
    a, b = Policy.load(d).model.state_dict(), Policy.load(saved).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_retired_pi0fast_type_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi0fast", "input_features": {}}))
    with pytest.raises(CheckpointError, match="earlier pi0-FAST port.*type 'pi0_fast'"):
        Policy.load(tmp_path)
