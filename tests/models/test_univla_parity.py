"""UniVLA (Emu3) against transformers' ``Emu3ForConditionalGeneration`` and ``Emu3VQVAE``
(issue 65, item 2).

A tiny random Emu3 (VQ tokenizer with attention and temporal blocks, Llama-shaped text model,
a ``vocabulary_map`` with the image markers and visual tokens) is saved with
``save_pretrained`` (safetensors) beside a word-level ``tokenizer.json``, a FAST tokenizer and
``action_tokens.json``, and loaded by vlarun's loader (checkpoint.load_vla, univla.py). At two
image sizes, two views per row: the VQ codes (``Emu3VQVAE.encode``), the image tokens as the LM
sees them (``Emu3Model.get_image_tokens`` inside the processor's markers), the logits at the
prompt's last position, and 10 greedy tokens (``generate(do_sample=False)`` vs
``VLA.decode_tokens``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vlarun.models import univla
from vlarun.models.checkpoint import CheckpointError, load_vla, model_config
from vlarun.models.emu3_vq import VQConfig, VQTokenizer, vq_name
from vlarun.models.fast_head import synthetic_fast_tokenizer
from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR

transformers = pytest.importorskip("transformers")

# The tiny vocabulary: words and digits below 44, FAST ids 44..299 (LM id 299 - f, 299 being
# pad - 1 as in UniVLA), then Emu3's specials and markers, then 128 visual tokens.
WORDS = ["<unk>", "pick", "up", "the", "cup", "open", "drawer", "put", "in", "bowl"]
DIGITS = {c: 30 + i for i, c in enumerate("0123456789*")}
PAD, END, BOS, EOS, IMAGE = 300, 301, 302, 303, 304
MARKERS = {
    univla.IMAGE_START: 305,
    univla.IMAGE_END: 306,
    univla.IMAGE_WRAPPER: 307,
    univla.END_OF_ROW: 308,
    univla.END_OF_FRAME: 309,
}
VISUAL0, CODES, VOCAB = 320, 128, 448
VIEWS, CHUNK, DIM, MAX_TOKENS, GREEDY = 2, 10, 7, 16, 10
LOGIT_TOL = 1e-4


def vocabulary_map() -> dict[str, int]:
    vocab = {w: i for i, w in enumerate(WORDS)} | DIGITS | MARKERS
    vocab |= {univla.VISUAL.format(i): VISUAL0 + i for i in range(CODES)}
    specials = {"<|endoftext|>": PAD, "<|extra_199|>": END, "<|extra_203|>": BOS}
    return vocab | specials | {"<|extra_204|>": EOS, "<image>": IMAGE}


def tiny_vq() -> dict:
    return dict(
        codebook_size=CODES,
        embed_dim=4,
        latent_channels=4,
        base_channels=32,
        channel_multiplier=[1, 2, 2],
        num_res_blocks=1,
        attn_resolutions=[1, 2],
        hidden_size=64,
        num_attention_heads=2,
        temporal_downsample_factor=4,
    )


def spread(model, seed: int) -> None:
    """HF inits norms to 1 and the BatchNorm statistics to (0, 1): spread every parameter and
    statistic so a swapped or dropped weight shows and greedy choices are not near ties."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.08)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


def hf_emu3(seed: int = 0):
    torch.manual_seed(seed)
    text = transformers.Emu3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    vq = transformers.Emu3VQVAEConfig(**tiny_vq())
    cfg = transformers.Emu3Config(vq_config=vq, text_config=text, vocabulary_map=vocabulary_map())
    model = transformers.Emu3ForConditionalGeneration(cfg).eval()
    spread(model, seed)
    return model


def write_tokenizer(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)} | {"<|extra_203|>": BOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|extra_203|>", special=True)])
    tok.save(str(directory / "tokenizer.json"))


def save_emu3(model, directory: Path, image_size: int, spec_file: bool = True) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    synthetic_fast_tokenizer(CHUNK, DIM, 256).save(directory / FAST_TOKENIZER_DIR)
    if spec_file:
        spec = {"end_id": END, "max_tokens": MAX_TOKENS, "chunk": CHUNK, "action_dim": DIM}
        spec |= {"image_size": image_size, "num_images": VIEWS}
        (directory / univla.ACTION_TOKENS_FILE).write_text(json.dumps(spec))
    return directory


def image_block(grid: int) -> list[int]:
    """One image as Emu3's processor writes it, ``<image>`` standing for its h * (w + 1) ids."""
    size = [DIGITS[c] for c in f"{grid}*{grid}"]
    head = [MARKERS[univla.IMAGE_START], *size, MARKERS[univla.IMAGE_WRAPPER]]
    tail = [MARKERS[univla.END_OF_FRAME], MARKERS[univla.IMAGE_END]]
    return head + [IMAGE] * grid * (grid + 1) + tail


@pytest.mark.parametrize("size", [(32, 32), (48, 40)])
def test_vq_codes_match_emu3_vqvae(size: tuple[int, int]) -> None:
    """The standalone ``Emu3VQVAE`` (its own names), non-square images included."""
    torch.manual_seed(0)
    hf = transformers.Emu3VQVAE(transformers.Emu3VQVAEConfig(**tiny_vq())).eval()
    spread(hf, 1)
    ours = VQTokenizer(VQConfig.from_hf(tiny_vq(), 32)).eval()
    state = {vq_name(k): v for k, v in hf.state_dict().items()}
    ours.load_state_dict({k: v for k, v in state.items() if k is not None}, strict=True)
    h, w = size
    pixels = torch.randn(3, 3, h, w, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = torch.stack(hf.encode(pixels, torch.tensor([[h, w]] * 3)).image_tokens)
        codes = ours.encode(pixels)
    assert codes.shape == theirs.shape == (3, h // 4, w // 4)
    assert torch.equal(codes, theirs)
    assert codes.unique().numel() > 8  # not one code everywhere


@pytest.mark.parametrize("image_size", [32, 48])
def test_univla_matches_transformers(tmp_path: Path, image_size: int) -> None:
    hf = hf_emu3()
    d = save_emu3(hf, tmp_path / "emu3", image_size)
    vla, _ = load_vla(d, torch.float32)
    cfg, grid = vla.cfg, image_size // 4
    assert (cfg.image_size, cfg.num_images, cfg.horizon, cfg.action_dim) == (image_size, 2, 10, 7)
    assert cfg.fast.lm_range(VOCAB) == range(PAD - 256, PAD) and cfg.fast.end_id == END

    images = torch.rand(
        2, VIEWS, 3, image_size, image_size, generator=torch.Generator().manual_seed(1)
    )
    flat = images.reshape(2 * VIEWS, 3, image_size, image_size)
    pixels = vla.vision_backbone.normalize(flat)  # Emu3's processor's mean / std
    sizes = torch.tensor([[image_size, image_size]] * 2 * VIEWS)
    block = image_block(grid)
    with torch.no_grad():
        codes = vla.vision_backbone.encode(pixels)
        their_codes = torch.stack(hf.model.vqmodel.encode(pixels, sizes).image_tokens)
        assert torch.equal(codes, their_codes)
        ours = vla.image_ids(images).reshape(2 * VIEWS, len(block))
        theirs = hf.model.get_image_tokens(pixels, sizes).reshape(2 * VIEWS, -1)
    holes = torch.tensor(block) == IMAGE
    assert torch.equal(ours[:, holes], theirs.long())  # the codes and each row's end-of-row
    assert torch.equal(ours[:, ~holes], torch.tensor(block)[~holes].expand(2 * VIEWS, -1))

    text = [[1, 2, 3, 4], [5, 3, 6]]  # "pick up the cup", "open the drawer"
    rows = [[BOS, *block * VIEWS, *t] for t in text]
    with torch.no_grad():
        prefill = vla.prefill(vla.build_prefix(vla.encode_images(images), text))
        our_logits = vla.language_model.logits(prefill.last_hidden)
        our_tokens = vla.decode_tokens(prefill)[:, :GREEDY]
        diff, equal = 0.0, 0
        for r, ids in enumerate(rows):  # one row at a time: HF pads left, vlarun right
            ids = torch.tensor([ids])
            px, sz = pixels[r * VIEWS : (r + 1) * VIEWS], sizes[:VIEWS]
            logits = hf(input_ids=ids, pixel_values=px, image_sizes=sz).logits[0, -1]
            diff = max(diff, (our_logits[r] - logits).abs().max().item())
            hf.generation_config.eos_token_id = None  # vlarun stops at END only
            gen = hf.generate(
                input_ids=ids,
                pixel_values=px,
                image_sizes=sz,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=GREEDY,
                do_sample=False,
                pad_token_id=PAD,
            )[0, ids.shape[1] :]
            assert END not in gen.tolist()  # so vlarun decoded all ten as well
            assert torch.equal(our_tokens[r], gen), (our_tokens[r], gen)
            equal += GREEDY
    assert diff <= LOGIT_TOL, diff
    print(
        f"univla parity {image_size}px x {VIEWS} views: VQ codes {codes.numel()}/"
        f"{codes.numel()} equal, logits {diff:.2e}, {equal}/{equal} greedy tokens equal"
    )


def test_transformers5_layout_and_action_tokens_option(tmp_path: Path) -> None:
    """The same weights under transformers 5's in-memory names (``model.text_model``,
    ``lm_head``, ``model.vqmodel``), the mapping given as the loader's option (the
    end-of-action id; the rest UniVLA's LIBERO defaults: 200 px views, 10 x 7, 80 tokens)."""
    hf = hf_emu3()
    old = save_emu3(hf, tmp_path / "old", 32, spec_file=False)
    new = tmp_path / "new"
    new.mkdir()
    renames = {
        "text_model.model.": "model.text_model.",
        "text_model.lm_head.": "lm_head.",
        "vqmodel.": "model.vqmodel.",
    }
    state = {}
    for k, v in load_file(old / "model.safetensors").items():
        prefix = next(p for p in renames if k.startswith(p))
        state[renames[prefix] + k[len(prefix) :]] = v
    save_file(state, new / "model.safetensors")
    for f in ("config.json", "tokenizer.json"):
        (new / f).write_text((old / f).read_text())
    synthetic_fast_tokenizer(CHUNK, DIM, 256).save(new / FAST_TOKENIZER_DIR)
    a, _ = load_vla(old, torch.float32, action_tokens=END)
    b, _ = load_vla(new, torch.float32, action_tokens=END)
    assert (a.cfg.image_size, a.cfg.fast.max_tokens, a.cfg.fast.end_id) == (200, 80, END)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not any(k.startswith("vision_backbone.decoder") for k in sa)  # not loaded


def test_univla_refusals(tmp_path: Path) -> None:
    d = save_emu3(hf_emu3(), tmp_path / "emu3", 32, spec_file=False)
    with pytest.raises(CheckpointError, match="no action_tokens.json and no action_tokens option"):
        load_vla(d, torch.float32)
    fast = d / FAST_TOKENIZER_DIR / "tokenizer.json"
    kept = fast.read_text()
    fast.unlink()
    with pytest.raises(CheckpointError, match="no fast_tokenizer/tokenizer.json"):
        load_vla(d, torch.float32, action_tokens=END)
    fast.write_text(kept)
    config = json.loads((d / "config.json").read_text())
    bias = config | {"text_config": config["text_config"] | {"attention_bias": True}}
    (d / "config.json").write_text(json.dumps(bias))
    with pytest.raises(CheckpointError, match="attention_bias=True"):
        load_vla(d, torch.float32, action_tokens=END)
    vocab = dict(config["vocabulary_map"])
    del vocab[univla.VISUAL.format(CODES - 1)]
    (d / "config.json").write_text(json.dumps(config | {"vocabulary_map": vocab}))
    missing = re.escape(f"vocabulary_map has no '{univla.VISUAL.format(CODES - 1)}'")
    with pytest.raises(CheckpointError, match=missing):
        load_vla(d, torch.float32, action_tokens=END)
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer.json").unlink()
    from vlarun.policy.base import Policy

    with pytest.raises(ValueError, match="no tokenizer.json. An Emu3"):
        Policy.load(d, action_tokens=END)


def test_univla_policy(tmp_path: Path) -> None:
    """A Policy over an Emu3 directory feeds the bare instruction after BOS and the two views'
    image tokens; its stage graph, over the wire (the vision stage hands on int64 ids, not
    embeddings), gives the model's own actions, a 10 x 7 FAST chunk."""
    import numpy as np

    from vlarun.policy.base import Policy

    d = save_emu3(hf_emu3(), tmp_path / "emu3", 32)
    policy = Policy.load(d)
    assert policy.prompt == "univla" and policy.text_ids("pick up the cup") == [1, 2, 3, 4]
    rng = np.random.default_rng(4)
    frames = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(VIEWS)]
    run = policy.run_stages(frames, "pick up the cup", serialize=True)
    assert run.outputs["visual_ids"].dtype == torch.int64
    assert run.outputs["visual_ids"].shape == (1, policy.model.cfg.num_visual)
    direct = policy.model.act(policy.image_tensor(frames), [[1, 2, 3, 4]])
    assert direct.shape == (1, CHUNK, DIM)
    assert torch.equal(run.outputs["actions"], direct)


def test_univla_presets() -> None:
    cfg = model_config("univla")
    llm, vq = cfg.llm, cfg.vq
    assert (llm.vocab_size, llm.hidden_size, llm.num_layers, llm.num_kv_heads) == (
        184622,
        4096,
        32,
        8,
    )
    assert 8.4e9 < llm.num_params() < 8.6e9  # Emu3-8B's text model
    assert (vq.tokenizer.grid, vq.tokens_per_image, cfg.num_visual) == (25, 659, 1318)
    assert vq.visual_start + vq.tokenizer.codebook_size == llm.vocab_size
    assert cfg.fast.lm_range(llm.vocab_size).stop - 1 == 151642  # UniVLA's last_token_id
    assert cfg.fast.end_id == 151845 and cfg.horizon == 10 and cfg.action_dim == 7
    from vlarun.stages.families import build_graph

    vision = build_graph(cfg).stages[0]
    assert vision.outputs[0].name == "visual_ids"
    assert vision.cost.flops == cfg.vq.tokenizer.cost(2)[0]


def test_vq_flops_are_the_counted_forward() -> None:
    """``VQConfig.cost`` against the FLOPs torch counts in a forward (attention on the math
    kernel, which the counter sees)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = VQConfig.from_hf(tiny_vq(), 32)
    model = VQTokenizer(cfg).eval()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(torch.rand(2, 3, 32, 32))
    assert fc.get_total_flops() == cfg.cost(2)[0]
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())


def test_tiny_univla_graph_is_the_model() -> None:
    """tiny-univla (random weights, a synthetic FAST vocabulary) through its stage graph, the
    image ids handed from the vision stage to the prefill, equals ``VLA.act``."""
    from vlarun.policy.base import Policy
    from vlarun.stages.families import build_graph, graph_inputs

    model = Policy.from_preset("tiny-univla").model
    images = torch.rand(1, 2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    ids = [[5, 6, 7]]
    graph = build_graph(model.cfg, model)
    out = graph.run(graph_inputs(model.cfg, images, ids)).outputs
    assert out["visual_ids"].shape == (1, 158)
    assert torch.equal(out["actions"], model.act(images, ids))


def test_tiny_univla_saves_and_loads(tmp_path: Path) -> None:
    """vlarun's own format keeps the VQ tokenizer's Emu3 names and its BatchNorm statistics
    (stored buffers: a checkpoint without them is refused as missing keys); ``random_vla``
    gives them their initial values, not ``to_empty``'s garbage."""
    from vlarun.models.checkpoint import random_vla, save_vla
    from vlarun.policy.base import Policy

    model = Policy.from_preset("tiny-univla").model
    stat = "vision_backbone.encoder.time_res_stack.0.norm1.running_var"
    with torch.no_grad():
        model.get_buffer(stat).uniform_(0.5, 1.5)
    save_vla(model, tmp_path / "tiny")
    loaded, _ = load_vla(tmp_path / "tiny", torch.float32)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    images = torch.rand(1, 2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    assert torch.equal(model.act(images, [[5, 6]]), loaded.act(images, [[5, 6]]))
    weights = load_file(tmp_path / "tiny" / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if k != stat}, tmp_path / "tiny" / "model.safetensors"
    )
    with pytest.raises(CheckpointError, match="1 missing keys: " + re.escape(stat)):
        load_vla(tmp_path / "tiny", torch.float32)
    fresh = random_vla(model_config("tiny-univla"), torch.float32)
    assert torch.equal(fresh.get_buffer(stat), torch.ones_like(fresh.get_buffer(stat)))
