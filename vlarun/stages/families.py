"""Each VLA family as a stage DAG (EcoVLA section 1), with analytic FLOPs, bytes and packets.

  autoregressive: vision -> prefill -> decode
  parallel:       vision -> prefill_head        (prompt + K*D empty action tokens, one pass)
  diffusion/flow: vision -> prefill -> denoise
  rdt:            vision -> prefill -> denoise  (the prefill is the language encoder over the
                  text alone; the image features pass through it to the head, which
                  cross-attends to both: RDT-1b, a shape for costs and emulation only)

The graph can be built from a config alone (costs and packet sizes, no weights: what
``vlarun info`` and the scheduler need) or bound to a model (executable stages).

Real-time chunking (``rtc``): the head stage (denoise, decode) also reads the request's
``RTC_INPUTS`` (the previous chunk's queued actions, d and s, packed by ``graph_inputs``), so
the freeze travels with the request wherever the head runs, over the wire included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vlarun.models.dit_head import DenoiseFeatureCache
from vlarun.models.heads import DiTHead, L1RegressionHead
from vlarun.models.hooks import ChunkInpainter, TokenDecoder
from vlarun.models.llama import KVCache
from vlarun.models.rdt_head import RDTHead
from vlarun.models.vla import VLA, PrefillResult, VLAConfig
from vlarun.stages.graph import Stage, StageCost, StageGraph, TensorSpec
from vlarun.stages.hooks import Hooks
from vlarun.stages.packet import Packet

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
# A real-time chunk request's tensors: the previous chunk's queued actions (B, H, A) in the
# model's action space, the delay d (B,) and the execution horizon s (B,) (accel/rtc.py).
RTC_INPUTS = ("rtc_prev", "rtc_delay", "rtc_exec")
RTC_FAMILIES = ("diffusion", "flow", "autoregressive")


@dataclass(frozen=True)
class Workload:
    """The shapes one inference runs at: batch, instruction tokens, compute dtype."""

    batch: int = 1
    text_tokens: int = 24
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.batch < 1 or self.text_tokens < 0:
            raise ValueError(f"bad workload batch={self.batch} text_tokens={self.text_tokens}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {list(DTYPE_BYTES)}, got {self.dtype!r}")


def prefix_len(cfg: VLAConfig, w: Workload) -> int:
    """Tokens the LM's prefill reads (rdt's language encoder: the instruction alone)."""
    if cfg.family == "rdt":
        return w.text_tokens
    bos = int(cfg.bos_id is not None)  # SmolVLA's prompt has none
    pre = len(cfg.image_prefix_ids)  # LLaVA's "USER: " before its image
    return bos + pre + cfg.num_visual + cfg.num_state_tokens + w.text_tokens


# ---------------------------------------------------------------------------------------------
# Packet schemas


def _graph_inputs(cfg: VLAConfig, w: Workload) -> tuple[TensorSpec, ...]:
    b, s = w.batch, cfg.image_size
    specs = [
        TensorSpec("images", (b, cfg.num_images, 3, s, s), "float32"),
        TensorSpec("text_ids", (b, w.text_tokens), "int64"),
        TensorSpec("text_len", (b,), "int64"),
    ]
    if cfg.family in ("diffusion", "flow", "rdt"):
        specs.append(TensorSpec("noise", (b, cfg.horizon, cfg.action_dim), "float32"))
    if cfg.state_dim:
        specs.append(TensorSpec("state", (b, cfg.state_dim), "float32"))
    return tuple(specs)


def _rtc_specs(cfg: VLAConfig, w: Workload) -> tuple[TensorSpec, ...]:
    b = w.batch
    return (
        TensorSpec("rtc_prev", (b, cfg.horizon, cfg.action_dim), "float32"),
        TensorSpec("rtc_delay", (b,), "int64"),
        TensorSpec("rtc_exec", (b,), "int64"),
    )


def _graph_input(cfg: VLAConfig, w: Workload, name: str) -> TensorSpec:
    (spec,) = (s for s in _graph_inputs(cfg, w) if s.name == name)
    return spec


def _kv_specs(cfg: VLAConfig, w: Workload) -> tuple[TensorSpec, ...]:
    llm, p = cfg.llm, prefix_len(cfg, w)
    shape = (llm.num_layers, w.batch, llm.num_kv_heads, p, llm.hd)
    return (
        TensorSpec("kv_k", shape, w.dtype),
        TensorSpec("kv_v", shape, w.dtype),
        TensorSpec("kv_valid", (llm.num_layers, w.batch, p), "bool"),
    )


def _prefill_out(cfg: VLAConfig, w: Workload) -> tuple[TensorSpec, ...]:
    return (
        *_kv_specs(cfg, w),
        TensorSpec("last_hidden", (w.batch, cfg.llm.hidden_size), w.dtype),
        TensorSpec("next_pos", (w.batch,), "int64"),
    )


def _actions(cfg: VLAConfig, w: Workload) -> TensorSpec:
    return TensorSpec("actions", (w.batch, cfg.horizon, cfg.action_dim), "float32")


# ---------------------------------------------------------------------------------------------
# Costs


def _connector_flops(cfg: VLAConfig, tokens_in: int) -> int:
    vdim, d = sum(v.hidden_size for v in cfg.vision), cfg.llm.hidden_size
    if cfg.connector == "none":  # rdt: the head's adaptor, counted with the head
        return 0
    if cfg.connector == "fused-mlp":
        return 2 * tokens_in * (vdim * 4 * vdim + 4 * vdim * d + d * d)
    if cfg.connector == "mlp":
        return 2 * tokens_in * (vdim * d + d * d)
    return 2 * tokens_in * vdim * d  # linear; pixel-shuffle folds tokens but not FLOPs


def vision_cost(cfg: VLAConfig, w: Workload, vision_params: int) -> StageCost:
    images = w.batch * cfg.num_images
    if cfg.vq is not None:  # a VQ tokenizer: convolutions, then ids (the LM embeds them)
        flops, acts = cfg.vq.tokenizer.cost(images)
        wb = vision_params * DTYPE_BYTES[w.dtype]
        return StageCost(flops, wb, wb + acts * DTYPE_BYTES[w.dtype] + w.batch * cfg.num_visual * 8)
    flops = sum(v.flops(images) for v in cfg.vision)
    flops += _connector_flops(cfg, images * cfg.vision[0].num_patches)
    wb = vision_params * DTYPE_BYTES[w.dtype]
    acts = sum(images * v.seq_len * v.hidden_size * v.num_layers * 8 for v in cfg.vision)
    return StageCost(flops, wb, wb + acts * DTYPE_BYTES[w.dtype])


def _llm_weight_bytes(cfg: VLAConfig, w: Workload, with_head: bool) -> int:
    llm = cfg.llm
    params = llm.num_params(with_embeddings=False)
    if with_head:
        params += llm.vocab_size * llm.hidden_size
    return params * DTYPE_BYTES[w.dtype]


def _kv_bytes(cfg: VLAConfig, w: Workload, length: int) -> int:
    llm = cfg.llm
    return 2 * llm.num_layers * w.batch * llm.num_kv_heads * length * llm.hd * DTYPE_BYTES[w.dtype]


def prefill_cost(cfg: VLAConfig, w: Workload) -> StageCost:
    p = prefix_len(cfg, w)
    ar = cfg.family == "autoregressive"
    flops = w.batch * (cfg.llm.flops(p) + (cfg.llm.head_flops(1) if ar else 0))
    wb = _llm_weight_bytes(cfg, w, with_head=ar)
    acts = w.batch * p * cfg.llm.hidden_size * cfg.llm.num_layers * 8 * DTYPE_BYTES[w.dtype]
    return StageCost(flops, wb, wb + _kv_bytes(cfg, w, p) + acts)


def decode_cost(cfg: VLAConfig, w: Workload) -> StageCost:
    p, n = prefix_len(cfg, w), cfg.num_action_tokens
    llm = cfg.llm
    flops = w.batch * sum(llm.flops(1, context=p + i) + llm.head_flops(1) for i in range(1, n))
    wb = _llm_weight_bytes(cfg, w, with_head=True)
    kv = sum(_kv_bytes(cfg, w, p + i) for i in range(1, n))
    return StageCost(flops, wb, (n - 1) * wb + kv, passes=max(n - 1, 1))


def prefill_head_cost(cfg: VLAConfig, w: Workload, head_params: int) -> StageCost:
    pre, p, n = prefill_cost(cfg, w), prefix_len(cfg, w), cfg.num_action_tokens
    flops = pre.flops + w.batch * (cfg.llm.flops(n, context=p + n) + _oft_flops(cfg))
    hb = head_params * DTYPE_BYTES[w.dtype]
    return StageCost(flops, pre.weight_bytes + hb, pre.bytes + pre.weight_bytes + hb, passes=2)


def _oft_flops(cfg: VLAConfig) -> int:
    with torch.device("meta"):
        return L1RegressionHead(cfg.oft).flops(1)


def denoise_cost(cfg: VLAConfig, w: Workload, head_params: int) -> StageCost:
    hb = head_params * DTYPE_BYTES[w.dtype]
    if cfg.dit is not None:
        steps = cfg.dit.ddim_steps
        with torch.device("meta"):
            flops = DiTHead(cfg.dit).flops(w.batch, steps)
        return StageCost(flops, hb, steps * hb, passes=steps)
    steps, p = cfg.flow.num_steps, prefix_len(cfg, w)
    flops = cfg.flow.flops(w.batch, p)
    return StageCost(flops, hb, steps * (hb + _kv_bytes(cfg, w, p)), passes=steps)


def encoder_cost(cfg: VLAConfig, w: Workload) -> StageCost:
    """rdt's prefill: the language encoder over the instruction alone, bidirectional."""
    n, llm = w.text_tokens, cfg.llm
    flops = w.batch * llm.flops(n, context=n)
    wb = _llm_weight_bytes(cfg, w, with_head=False)
    acts = w.batch * n * llm.hidden_size * llm.num_layers * 8 * DTYPE_BYTES[w.dtype]
    return StageCost(flops, wb, wb + acts)


def rdt_denoise_cost(cfg: VLAConfig, w: Workload, head_params: int) -> StageCost:
    """rdt's head: the adaptors once, then ``steps`` DiT passes, each reading the weights and
    every condition token (its cross-attention projects them again every pass)."""
    r, steps = cfg.rdt, cfg.rdt.steps
    with torch.device("meta"):
        flops = RDTHead(r).flops(w.batch, w.text_tokens)
    hb = head_params * DTYPE_BYTES[w.dtype]
    conds = w.batch * (r.img_tokens + w.text_tokens) * r.hidden_size * DTYPE_BYTES[w.dtype]
    return StageCost(flops, hb, steps * (hb + conds), passes=steps)


# ---------------------------------------------------------------------------------------------
# Stage functions (bound to a model)


class _Runner:
    """Stage functions of one model; each rebuilds what it needs from its packet alone (and,
    under ``hooks``, from the hooks' per-stream state: the token policy's KV cache)."""

    def __init__(
        self, model: VLA, hooks: Hooks | None = None, rtc: ChunkInpainter | None = None
    ) -> None:
        self.model = model
        self.hooks = hooks
        self.rtc = rtc

    def stage(self, name: str):
        """Stage ``name``'s function: its packet moved to the model's device first (a packet
        decoded from the wire, or built on the host, lives on the CPU)."""
        method = getattr(self, name)
        device = self.model.device
        if device.type == "cpu":
            return method

        def on_device(pk: Packet) -> Packet:
            return method(
                Packet({k: t.to(device, non_blocking=True) for k, t in pk.tensors.items()})
            )

        return on_device

    @torch.no_grad()
    def vision(self, pk: Packet) -> Packet:
        if self.model.cfg.vq is not None:  # ids: 8 bytes a token on the wire, not d * 2
            return Packet({"visual_ids": self.model.image_ids(pk["images"])})
        return Packet({"visual": self.model.encode_images(pk["images"])})

    def _prefill(self, pk: Packet) -> PrefillResult:
        ids = [row[:n].tolist() for row, n in zip(pk["text_ids"], pk["text_len"], strict=True)]
        state = pk["state"] if self.model.cfg.proprio_dim else None
        if "visual_ids" in pk.tensors:
            visual = self.model.embed_image_ids(pk["visual_ids"])
        else:
            visual = pk["visual"]
        prefix = self.model.build_prefix(visual, ids, state)
        if self.hooks is not None and self.hooks.tokens is not None:
            return self.hooks.prefill(self.model, prefix, pk["images"], visual)
        return self.model.prefill(prefix)

    @torch.no_grad()
    def prefill(self, pk: Packet) -> Packet:
        pre = self._prefill(pk)
        k, v, valid = pre.cache.export(pre.cache.max_len - self.model.cfg.action_token_room)
        return Packet(
            {
                "kv_k": k,
                "kv_v": v,
                "kv_valid": valid,
                "last_hidden": pre.last_hidden,
                "next_pos": pre.next_pos,
            }
        )

    def _restore(self, pk: Packet) -> PrefillResult:
        cfg = self.model.cfg
        k = pk["kv_k"]
        cache = KVCache.from_export(
            cfg.llm, k, pk["kv_v"], pk["kv_valid"], k.shape[3] + cfg.action_token_room
        )
        return PrefillResult(cache, pk["last_hidden"], pk["next_pos"])

    @torch.no_grad()
    def decode(self, pk: Packet) -> Packet:
        decoder = self.hooks.decoder if self.hooks is not None else None
        forced = None
        if "rtc_prev" in pk.tensors:  # any decoder takes the prefix (greedy, Jacobi, exit)
            refuse_fast_freeze(self.model.cfg)
            tok = self.model.action_tokenizer
            forced = self.rtc.forced_tokens(tok, pk["rtc_prev"], pk["rtc_delay"])
        return Packet(run_head(self.model, self._restore(pk), None, decoder=decoder, forced=forced))

    @torch.no_grad()
    def prefill_head(self, pk: Packet) -> Packet:
        return Packet({"actions": self.model.parallel_head(self._prefill(pk))})

    @torch.no_grad()
    def denoise(self, pk: Packet) -> Packet:
        model = self.model
        state = pk["state"] if "state" in pk.tensors else None
        make = self.hooks.denoise_cache if self.hooks is not None else None
        if model.cfg.dit is not None:  # the DiT reads only the last hidden state
            b = pk["last_hidden"].shape[0]
            pre = PrefillResult(None, pk["last_hidden"], torch.zeros(b, dtype=torch.long))
        else:
            pre = self._restore(pk)
        fc = make() if make is not None else None
        hook = None
        if "rtc_prev" in pk.tensors:
            hook = self.rtc.step_hook(pk["rtc_prev"], pk["rtc_delay"], pk["rtc_exec"])
        return Packet(run_head(model, pre, pk["noise"], state, fc, step_hook=hook))


def refuse_fast_freeze(cfg: VLAConfig) -> None:
    """Raise for a FAST model: real-time chunking freezes the first d actions as their tokens,
    one per action dimension, and a FAST code is a DCT of the whole chunk, so no prefix of it
    stands for the first d actions (whichever decoder runs). The head stage and the agent ask
    here, so a freeze is refused the same way before or during a request."""
    if cfg.fast is not None:
        raise ValueError(
            "real-time chunking freezes the first d actions as their tokens, one per "
            "action dimension; a FAST code is a DCT of the whole chunk, so no prefix of "
            "it stands for the first d actions: not supported for FAST models"
        )


def run_head(
    model: VLA,
    pre: PrefillResult,
    noise: Tensor | None,
    state: Tensor | None = None,
    feature_cache: DenoiseFeatureCache | None = None,
    decoder: TokenDecoder | None = None,
    step_hook=None,
    forced: Tensor | None = None,
) -> dict:
    """The family's action head after a prefill, the one place it is run (the stage functions
    and the drift diagnostic call it): {"actions": (B, horizon, D), ...}; action tokens are
    decoded by ``decoder`` if given, else greedily, either way after the ``forced`` prefix of
    ids, if any; ``feature_cache`` serves a DiT / flow denoiser, ``step_hook`` transforms its
    state after every step (real-time chunking)."""
    family = model.cfg.family
    if family == "autoregressive":
        if decoder is None:
            ids = model.decode_tokens(pre, forced)
        else:
            ids = decoder.decode(model, pre, forced)
        return {"actions": model.tokens_to_actions(ids), "action_ids": ids}
    if family == "parallel":
        return {"actions": model.parallel_head(pre)}
    # diffusion, flow
    return {"actions": model.denoise(pre, noise, state, feature_cache, step_hook=step_hook)}


def _unbound(name: str):
    def fn(_: Packet) -> Packet:
        raise RuntimeError(f"stage {name!r} has no model bound; build the graph with a model")

    return fn


# ---------------------------------------------------------------------------------------------
# The graph


def param_split(cfg: VLAConfig) -> dict[str, int]:
    """Parameters per component, counted on the meta device (no memory allocated)."""
    if cfg.family == "rdt":  # no executable VLA: each part on its own
        with torch.device("meta"):
            head = sum(p.numel() for p in RDTHead(cfg.rdt).parameters())
        vision, llm = sum(v.num_params() for v in cfg.vision), cfg.llm.num_params()
        return {"vision": vision, "llm": llm, "head": head, "total": vision + llm + head}
    with torch.device("meta"):
        model = VLA(cfg)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    head = 0
    for attr in ("action_head", "action_model", "action_expert"):
        if hasattr(model, attr):
            head = count(getattr(model, attr))
    split = {
        "vision": count(model.vision_backbone) + count(model.projector),
        "llm": count(model.language_model),
        "head": head,
        "total": count(model),
    }
    if hasattr(model, "proprio_projector"):  # the state token's projection: runs in the prefill
        split["proprio"] = count(model.proprio_projector)
    return split


def build_graph(
    cfg: VLAConfig,
    model: VLA | None = None,
    w: Workload | None = None,
    hooks: Hooks | None = None,
    rtc: ChunkInpainter | None = None,
) -> StageGraph:
    """The stage DAG of ``cfg`` at workload ``w``; executable when ``model`` is given, and
    accelerated by ``hooks`` (token policy, decoder, denoiser cache) when they are given.
    ``rtc``: requests carry a real-time chunk's freeze (``RTC_INPUTS``), which the head stage
    turns into a denoising step hook or a forced token prefix with this inpainter."""
    w = w or Workload()
    if rtc is not None and cfg.family not in RTC_FAMILIES:
        raise ValueError(
            f"real-time chunking needs a {', '.join(RTC_FAMILIES)} policy; {cfg.name} is "
            f"{cfg.family} (its chunk is regressed whole, there is nothing to inpaint)"
        )
    freeze = _rtc_specs(cfg, w) if rtc is not None else ()
    run = _Runner(model, hooks, rtc) if model is not None else None
    fn = run.stage if run is not None else _unbound
    params = param_split(cfg)
    b, d = w.batch, cfg.llm.hidden_size
    text = (
        TensorSpec("text_ids", (b, w.text_tokens), "int64"),
        TensorSpec("text_len", (b,), "int64"),
    )
    # rdt's vision stage hands on the tower's own features (its head adapts them)
    width = cfg.vision_dim if cfg.connector == "none" else d
    visual = TensorSpec("visual", (b, cfg.num_visual, width), w.dtype)
    if cfg.vq is not None:  # a VQ tokenizer hands on LM ids; the prefill embeds them
        visual = TensorSpec("visual_ids", (b, cfg.num_visual), "int64")
    if cfg.proprio_dim:  # the proprio token enters with the prompt
        text = (*text, _graph_input(cfg, w, "state"))
    if hooks is not None and hooks.needs_images:  # a token policy sees the frame itself
        text = (*text, _graph_input(cfg, w, "images"))
    stages = [
        Stage(
            "vision",
            fn("vision"),
            (_graph_inputs(cfg, w)[0],),
            (visual,),
            vision_cost(cfg, w, params["vision"]),
            params=params["vision"],
        )
    ]
    if cfg.family == "rdt":
        return _rdt_graph(cfg, w, stages, visual, text, params)
    if cfg.family == "parallel":
        stages.append(
            Stage(
                "prefill_head",
                fn("prefill_head"),
                (visual, *text),
                (_actions(cfg, w),),
                prefill_head_cost(cfg, w, params["head"]),
                ("vision",),
                params=params["llm"] + params["head"] + params.get("proprio", 0),
            )
        )
        return StageGraph(cfg.name, cfg.family, tuple(stages), _graph_inputs(cfg, w))
    stages.append(
        Stage(
            "prefill",
            fn("prefill"),
            (visual, *text),
            _prefill_out(cfg, w),
            prefill_cost(cfg, w),
            ("vision",),
            params=params["llm"] + params.get("proprio", 0),
        )
    )
    if cfg.family == "autoregressive":
        out = (_actions(cfg, w), TensorSpec("action_ids", (b, cfg.num_action_tokens), "int64"))
        stages.append(
            Stage(
                "decode",
                fn("decode"),
                (*_prefill_out(cfg, w), *freeze),
                out,
                decode_cost(cfg, w),
                ("prefill",),
                params=params["llm"],
            )
        )
    else:
        noise = _graph_input(cfg, w, "noise")
        if cfg.family == "diffusion":
            ins = (_prefill_out(cfg, w)[3], noise)
        else:
            state = (_graph_input(cfg, w, "state"),) if cfg.state_dim else ()  # none: pi05
            ins = (*_prefill_out(cfg, w), noise, *state)
        stages.append(
            Stage(
                "denoise",
                fn("denoise"),
                (*ins, *freeze),
                (_actions(cfg, w),),
                denoise_cost(cfg, w, params["head"]),
                ("prefill",),
                params=params["head"],
            )
        )
    return StageGraph(cfg.name, cfg.family, tuple(stages), (*_graph_inputs(cfg, w), *freeze))


def _rdt_graph(
    cfg: VLAConfig,
    w: Workload,
    stages: list[Stage],
    visual: TensorSpec,
    text: tuple,
    params: dict[str, int],
) -> StageGraph:
    """rdt's chain after the vision stage: the encoder carries the image features through (a
    cut after it sends both), the head reads image features, language features and state."""
    lang = TensorSpec("lang", (w.batch, w.text_tokens, cfg.llm.hidden_size), w.dtype)
    encoded = (visual, lang, text[1])
    stages.append(
        Stage(
            "prefill",
            _unbound("prefill"),
            (visual, *text),
            encoded,
            encoder_cost(cfg, w),
            ("vision",),
            params=params["llm"],
        )
    )
    ins = (*encoded, _graph_input(cfg, w, "noise"), _graph_input(cfg, w, "state"))
    stages.append(
        Stage(
            "denoise",
            _unbound("denoise"),
            ins,
            (_actions(cfg, w),),
            rdt_denoise_cost(cfg, w, params["head"]),
            ("prefill",),
            params=params["head"],
        )
    )
    return StageGraph(cfg.name, cfg.family, tuple(stages), _graph_inputs(cfg, w))


def graph_inputs(
    cfg: VLAConfig, images, text_ids: list[list[int]], noise=None, state=None, rtc=None
):
    """Pack one batch into the graph's input packet (right-padded ids + lengths); ``rtc`` (an
    ``accel.rtc.RTCRequest``, batch 1) adds the request's ``RTC_INPUTS``."""
    b = len(text_ids)
    longest = max(len(t) for t in text_ids)
    ids = torch.zeros(b, longest, dtype=torch.long)
    for r, t in enumerate(text_ids):
        ids[r, : len(t)] = torch.tensor(t, dtype=torch.long)
    tensors = {
        "images": images if images.ndim == 5 else images[:, None],
        "text_ids": ids,
        "text_len": torch.tensor([len(t) for t in text_ids], dtype=torch.long),
    }
    if cfg.family in ("diffusion", "flow"):
        tensors["noise"] = (
            noise if noise is not None else torch.randn(b, cfg.horizon, cfg.action_dim)
        )
    if cfg.family == "flow" and cfg.flow.state_dim:
        tensors["state"] = state if state is not None else torch.zeros(b, cfg.flow.state_dim)
    elif cfg.proprio_dim:
        if state is None:
            raise ValueError(f"{cfg.name} takes the robot state (proprio_dim {cfg.proprio_dim})")
        tensors["state"] = state
    if rtc is not None:
        if b != 1:
            raise ValueError(f"an RTC request packs one row, got a batch of {b}")
        tensors.update(rtc_inputs(cfg, rtc))
    return Packet(tensors)


def rtc_inputs(cfg: VLAConfig, rtc) -> dict[str, Tensor]:
    """A real-time chunk request (``accel.rtc.RTCRequest``) as the packet's ``RTC_INPUTS``
    (batch 1)."""
    if rtc.horizon != cfg.horizon or rtc.previous.shape[1] != cfg.action_dim:
        raise ValueError(
            f"an RTC request for {cfg.name} holds (H={cfg.horizon}, A={cfg.action_dim}) "
            f"actions; got H={rtc.horizon}, A={rtc.previous.shape[1]}"
        )
    return {
        "rtc_prev": torch.from_numpy(rtc.padded().copy())[None],
        "rtc_delay": torch.tensor([rtc.delay], dtype=torch.long),
        "rtc_exec": torch.tensor([rtc.execution_horizon], dtype=torch.long),
    }


def example_inputs(cfg: VLAConfig, images, text_ids: list[list[int]]) -> Packet:
    """``graph_inputs`` with a zero state where the model reads one: for warm-ups, profiles
    and benchmarks, whose numbers do not depend on the state's values."""
    b = len(text_ids)
    state = torch.zeros(b, cfg.proprio_dim) if cfg.proprio_dim else None
    return graph_inputs(cfg, images, text_ids, state=state)
