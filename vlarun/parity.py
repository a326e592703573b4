"""`vlarun check-parity`: vlarun's modules against transformers on identical weights.

Random-weight models of several shapes are built in transformers, their weights loaded into
vlarun, and outputs compared in fp32. With ``checkpoint``, any Llama/Gemma/SigLIP/DINOv2
directory written by transformers' ``save_pretrained`` is loaded into both and compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vlarun.models.checkpoint import load_checked, load_hf_module, vit_config_from_hf
from vlarun.models.llama import LlamaConfig, LlamaLM, RopeScaling
from vlarun.models.token_plan import TokenPlan
from vlarun.models.vit import ViTEncoder, canonical_hf_state_dict

TOL = 1e-4  # fp32 max abs difference allowed against transformers
TOL_SELF = 1e-5  # vlarun's own cache modes against its full forward


@dataclass
class Check:
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "ok": self.ok,
        }


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("check-parity needs transformers: pip install 'vlarun[parity]'") from e
    return transformers


LLAMA_SHAPES = {
    "llama-mha": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=344,
        num_layers=3,
        num_heads=4,
        num_kv_heads=4,
        max_positions=256,
    ),
    "llama-gqa": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=344,
        num_layers=3,
        num_heads=8,
        num_kv_heads=2,
        max_positions=256,
    ),
    "llama3-rope-scaling": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        max_positions=256,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64),
    ),
    "gemma-geglu-hd256": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_positions=256,
        rms_norm_eps=1e-6,
        mlp_act="gelu_tanh",
        gemma_norm=True,
        tie_embeddings=True,
    ),
}


def hf_llama(cfg: LlamaConfig, seed: int = 0):
    """A random transformers Llama/Gemma with vlarun's shape (norm weights randomised too)."""
    tf = _transformers()
    conf_cls = tf.GemmaConfig if cfg.gemma_norm else tf.LlamaConfig
    model_cls = tf.GemmaForCausalLM if cfg.gemma_norm else tf.LlamaForCausalLM
    hf_cfg = {k: v for k, v in cfg.to_hf().items() if k not in ("model_type", "architectures")}
    torch.manual_seed(seed)
    conf = conf_cls(**hf_cfg)
    conf._attn_implementation = "eager"  # the explicit-softmax path: an independent reference
    model = model_cls(conf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2).add_(0.0 if cfg.gemma_norm else 1.0)
    return model


def _llama_checks(name: str, cfg: LlamaConfig) -> list[Check]:
    hf = hf_llama(cfg)
    ours = LlamaLM(cfg).eval()
    load_checked(ours, dict(hf.state_dict()), name)
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        full = ours(ours.embed(ids)).hidden
        got = ours.logits(full)
        cache = ours.new_cache(2, 64)
        pre = ours(ours.embed(ids[:, :30]), torch.arange(30), cache).hidden
        dec = [
            ours(ours.embed(ids[:, p : p + 1]), torch.tensor([p]), cache).hidden
            for p in range(30, 40)
        ]
        cached = torch.cat([pre, *dec], dim=1)
        plan = TokenPlan.full(2, vis_start=1, num_visual=24, last_shared_layer=0)
        planned = ours(ours.embed(ids), torch.arange(40), ours.new_cache(2, 64), plan=plan).hidden
    return [
        Check(f"{name}: logits vs transformers", _diff(ref, got), TOL),
        Check(f"{name}: prefill + cached decode vs full forward", _diff(cached, full), TOL_SELF),
        Check(f"{name}: full-recompute TokenPlan vs plain forward", _diff(planned, full), TOL_SELF),
    ]


def _vit_checks() -> list[Check]:
    tf = _transformers()
    common = dict(
        image_size=56, patch_size=14, hidden_size=96, num_hidden_layers=3, num_attention_heads=4
    )
    models = {
        "siglip": tf.SiglipVisionModel(tf.SiglipVisionConfig(intermediate_size=192, **common)),
        "dinov2": tf.Dinov2Model(tf.Dinov2Config(**common)),
    }
    if hasattr(tf, "Dinov2WithRegistersModel"):
        conf = tf.Dinov2WithRegistersConfig(num_register_tokens=4, **common)
        models["dinov2-registers"] = tf.Dinov2WithRegistersModel(conf)
    checks = []
    px = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    for name, hf in models.items():
        hf.config._attn_implementation = "eager"
        hf.eval()
        vcfg = vit_config_from_hf(hf.config.to_dict())
        ours = ViTEncoder(vcfg).eval()
        load_checked(ours, canonical_hf_state_dict(hf.state_dict(), vcfg.kind), name)
        with torch.no_grad():
            out = hf(pixel_values=px, output_hidden_states=True)
            diff_last = _diff(out.last_hidden_state, ours.last_hidden_state(px))
            n = vcfg.num_prefix_tokens
            diff_feat = _diff(out.hidden_states[-2][:, n:], ours.hidden_states(px)[-2][:, n:])
        checks += [
            Check(f"{name}: last_hidden_state", diff_last, TOL),
            Check(f"{name}: second-to-last layer features", diff_feat, TOL),
        ]
    return checks


def _checkpoint_checks(directory: str | Path) -> list[Check]:
    tf = _transformers()
    kind, ours, config = load_hf_module(directory)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        if kind == "llama":
            hf = tf.AutoModelForCausalLM.from_pretrained(directory).float().eval()
            ids = torch.randint(0, ours.cfg.vocab_size, (1, 32), generator=gen)
            ours = ours.float()
            diff = _diff(hf(input_ids=ids).logits, ours.logits(ours(ours.embed(ids)).hidden))
            return [Check(f"{Path(directory).name}: logits vs transformers", diff, TOL)]
        hf = tf.AutoModel.from_pretrained(directory).float().eval()
        if kind == "siglip" and hasattr(hf, "vision_model") and not hasattr(hf, "embeddings"):
            hf = hf.vision_model if config.get("model_type") == "siglip" else hf
        s = ours.config.image_size
        px = torch.randn(1, 3, s, s, generator=gen)
        ref = hf(pixel_values=px).last_hidden_state
        diff = _diff(ref, ours.float().last_hidden_state(px))
        return [Check(f"{Path(directory).name}: {kind} last_hidden_state", diff, TOL)]


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def check_parity(
    checkpoint: str | Path | None = None, progress: Callable[[str], None] | None = None
) -> dict:
    """Run the checks; returns ``{"ok": bool, "checks": [...]}``."""
    checks: list[Check] = []
    if checkpoint is not None:
        checks += _checkpoint_checks(checkpoint)
    else:
        for name, cfg in LLAMA_SHAPES.items():
            if progress:
                progress(name)
            checks += _llama_checks(name, cfg)
        if progress:
            progress("vision")
        checks += _vit_checks()
    return {"ok": all(c.ok for c in checks), "checks": [c.as_dict() for c in checks]}
