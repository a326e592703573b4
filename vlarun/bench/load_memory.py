"""`vlarun bench load`: peak memory of loading a VLA checkpoint in bf16, against the
checkpoint's size.

  vlarun bench load DIR --make      # first: a random-weight ~1.1B VLA (TinyLlama-shaped LM,
                                    # OpenVLA's tiny vision towers), saved in bf16
  vlarun bench load DIR --make --layout llava
                                    # or a random-weight ~1.4B LLaVA-VLA in transformers' own
                                    # layout (LlavaForConditionalGeneration.save_pretrained:
                                    # CLIP ViT-L/14-336, a TinyLlama-shaped LM; the parity extra)
  vlarun bench load DIR             # checkpoint bytes, peak RSS growth

The load runs in a fresh child process, which reads its peak resident set (VmHWM) before and
after ``load_vla(DIR, bfloat16)``, and again after reading every weight
once (safetensors maps the file: pages become resident as they are first read, as the first
inference would): the growth is what loading cost. Run it with PYTHONPATH pointing at another
commit's tree to compare loaders. The target is growth <= 1.3 x the checkpoint's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt


@dataclass(frozen=True)
class BenchLoadOptions:
    """Peak memory of loading a checkpoint in bf16 against its size (a fresh process)."""

    directory: str = opt(help="checkpoint directory", positional=True)
    make: bool = opt(False, "first write a random-weight ~1.1B VLA there (bf16)")
    layout: str = opt(
        "vlarun",
        "with --make: vlarun (its own safetensors) or llava (transformers' "
        "LlavaForConditionalGeneration, ~1.4B; needs pip install -e '.[parity]')",
        choices=("vlarun", "llava"),
    )
    json: bool = opt(False, "print one JSON object")


CHILD = """
import json, os, sys, time
import torch
from vlarun.models.checkpoint import load_vla
from vlarun.runtime.testbed.procs import status_kb

def hwm_kib():  # this process's peak RSS: VmHWM is per address space, so it starts afresh at
    # exec, unlike ru_maxrss, which Linux carries over from the parent (it may have just
    # written a multi-GB checkpoint)
    return status_kb("self", "VmHWM")

base = hwm_kib()
t = time.perf_counter()
model, _ = load_vla(sys.argv[1], torch.bfloat16)
seconds = time.perf_counter() - t
peak = hwm_kib()
params = sum(p.numel() for p in model.parameters())
with torch.no_grad():  # read every weight once, as the first inference does
    for p in model.parameters():
        p.sum()
used = hwm_kib()
print(json.dumps({"base_kib": base, "peak_kib": peak, "used_kib": used, "params": params,
                  "seconds": seconds, "dtype": str(model.dtype)}))
"""


def make(out: Path) -> dict:
    """A random-weight ~1.1B VLA (TinyLlama-shaped LM, OpenVLA's tiny vision towers) saved in
    bf16 at ``out``."""
    import dataclasses

    import torch

    from vlarun.models.checkpoint import random_vla, save_vla
    from vlarun.models.llama import LlamaConfig
    from vlarun.models.presets import get_preset

    base = get_preset("tiny-openvla")
    llm = LlamaConfig(
        vocab_size=32064,
        hidden_size=2048,
        intermediate_size=5632,
        num_layers=22,
        num_heads=32,
        num_kv_heads=4,
        max_positions=2048,
    )
    cfg = dataclasses.replace(base, name="load-memory-1b", llm=llm, action_vocab_size=32000)
    torch.manual_seed(0)
    model = random_vla(cfg, torch.bfloat16)
    save_vla(model, out)
    return {"made": str(out), "params": sum(p.numel() for p in model.parameters())}


# The words of LLaVA-1.5's prompt (llava.llava_prompt): a LLaVA directory needs a tokenizer.json
# that puts <image> at the config's image id; the load reads only the ids before <image>.
LLAVA_PROMPT_WORDS = [
    "<unk>",
    "<s>",
    "</s>",
    "USER",
    ":",
    "What",
    "action",
    "should",
    "the",
    "robot",
    "take",
    "to",
    "?",
    "ASSISTANT",
]
LLAVA_IMAGE_ID = 32000  # llava-hf's: the first id after Llama's 32,000
# LLaVA-1.5's CLIP ViT-L/14 at 336 px and a TinyLlama-shaped Llama: ~1.4B parameters (the
# 7B one does not fit this bench's budget)
LLAVA_1B = (
    dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
         image_size=336, projection_dim=768),
    dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
         num_key_value_heads=4, vocab_size=32064, max_position_embeddings=2048),
)  # fmt: skip


def write_llava_tokenizer(directory: Path, words, image_id: int) -> None:
    """A word-level tokenizer.json over ``words`` with LLaVA's <image> as a special token at
    ``image_id``: enough for vlarun's LLaVA loader, which tokenizes the prompt with it."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from vlarun.models import llava

    vocab = {w: i for i, w in enumerate(words)} | {llava.IMAGE_TOKEN: image_id}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.add_special_tokens([AddedToken(llava.IMAGE_TOKEN, special=True)])
    tok.save(str(Path(directory) / "tokenizer.json"))


def hf_llava_config(vision: dict, text: dict, image_id: int):
    """transformers' ``LlavaConfig`` as LLaVA-1.5 sets it (CLIP with quick-GELU and 14 px
    patches, feature layer -2 without CLS, a GELU projector) around the given sizes."""
    import transformers

    return transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            **{"patch_size": 14, "hidden_act": "quick_gelu"} | vision
        ),
        text_config=transformers.LlamaConfig(**{"bos_token_id": 1, "eos_token_id": 2} | text),
        image_token_index=image_id,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )


def write_llava(out: Path, vision: dict, text: dict, image_id: int = LLAVA_IMAGE_ID) -> int:
    """A random-weight LLaVA directory written by transformers itself (``save_pretrained``,
    safetensors, bf16), with the action-bin mapping (256 bins below ``image_id``, 5 x 7) and a
    tokenizer that knows LLaVA's prompt, as a user's directory has. Returns its parameters."""
    import torch

    # A missing transformers is a ModuleNotFoundError, which the CLI names as the parity extra.
    import transformers

    from vlarun.models import llava

    cfg = hf_llava_config(vision, text, image_id)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy of the parameters
    try:
        model = transformers.LlavaForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(default)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    del model
    write_llava_tokenizer(out, LLAVA_PROMPT_WORDS, image_id)
    bins = {"vocab_size": image_id, "n_bins": llava.N_BINS, "chunk": 5, "action_dim": 7}
    (out / llava.ACTION_BINS_FILE).write_text(json.dumps(bins))
    return params


def make_llava(out: Path) -> dict:
    """``--make --layout llava``: LLAVA_1B written by transformers (write_llava)."""
    return {"made": str(out), "layout": "llava", "params": write_llava(out, *LLAVA_1B)}


def measure(directory: Path) -> dict:
    """Checkpoint bytes against the peak resident growth of loading it in a fresh process."""
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory)], capture_output=True, text=True, check=True
    )
    r = json.loads(p.stdout.strip().splitlines()[-1])
    growth = (r["peak_kib"] - r["base_kib"]) * 1024
    used = (r["used_kib"] - r["base_kib"]) * 1024
    return {
        "checkpoint_bytes": size,
        "peak_growth_bytes": growth,
        "ratio": round(growth / size, 3),
        "growth_after_reading_every_weight_bytes": used,
        "ratio_after_reading_every_weight": round(used / size, 3),
        **r,
    }


def run(o: BenchLoadOptions) -> dict:
    d = Path(o.directory)
    made = None
    if o.make:
        made = make_llava(d) if o.layout == "llava" else make(d)
    if not any(d.glob("*.safetensors")):
        raise FileNotFoundError(f"{d}: no *.safetensors (make one with --make)")
    return {"made": made} | measure(d)


def show(r: dict) -> None:
    gib = 1024**3
    print(
        f"checkpoint {r['checkpoint_bytes'] / gib:.2f} GiB ({r['params'] / 1e9:.2f} B params, "
        f"{r['dtype']}), loaded in {r['seconds']:.1f} s: peak growth "
        f"{r['peak_growth_bytes'] / gib:.2f} GiB ({r['ratio']:.2f}x), after reading every "
        f"weight {r['growth_after_reading_every_weight_bytes'] / gib:.2f} GiB "
        f"({r['ratio_after_reading_every_weight']:.2f}x)"
    )


OPTIONS = {"bench-load": BenchLoadOptions}
RUN = {"bench-load": run}
SHOW = {"bench-load": show}
