"""A Policy: model + tokenizer + action statistics + prompt format, from raw observations to
robot actions. This is the object a user (or the simulator, or the robot agent) calls.

  policy = Policy.load("tiny-ar")                    # a directory, a shipped name or a preset
  actions = policy.predict(image, "open the drawer", state=state)   # (horizon, action_dim)

  fast = policy.with_setting("triage:0.34")          # the same policy under an accelerator
  fast.predict(image, "open the drawer", state=state)
  fast.reset()                                       # before the next episode
  fast.stats.summary()                               # decisions and FLOPs ratio per step

A Policy owns its stage graph (built once per prompt length, ``graph``), the accelerator hooks
it runs with (``hooks``: None for plain inference) and their per-episode state (``reset``).
``with_setting`` applies an ``AccelSetting`` (or its text, ``"triage:0.18+cache:2"``): the same
hooks the robot agent and the edge make from that setting. ``with_hooks`` installs accelerator
objects a setting does not name (a token policy at an absolute budget, a decoder with its own
seed); both return a new Policy sharing the model, with fresh hook state and statistics.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from vlarun.accel.base import FullRecompute
from vlarun.accel.rtc import INPAINTER, RTCRequest
from vlarun.models import lerobot, llava, static_step, univla
from vlarun.models.action_tokens import ProprioNorm
from vlarun.models.checkpoint import load_vla, read_config, select_norm_stats
from vlarun.models.device import resolve_device
from vlarun.models.fast_head import synthetic_fast_tokenizer
from vlarun.models.llama import LlamaConfig
from vlarun.models.presets import PRESETS, get_preset
from vlarun.models.tokenizer import PROMPTS, Tokenizer, load_tokenizer
from vlarun.models.vla import VLA
from vlarun.paths import policy_dir, retired_note
from vlarun.policy.stats import AccelStats
from vlarun.stages.families import Workload, build_graph, graph_inputs
from vlarun.stages.graph import GraphRun, StageGraph
from vlarun.stages.hooks import Hooks
from vlarun.stages.packet import Packet
from vlarun.transforms.int8 import quantize_int8

if TYPE_CHECKING:
    from vlarun.models.dit_head import DenoiseFeatureCache
    from vlarun.models.hooks import TokenDecoder, TokenPolicy
    from vlarun.policy.setting import AccelSetting


class ActionNorm(Protocol):
    """Model actions -> robot units (OpenVLA's ``NormStats``, LeRobot's ``FeatureNorm``, which
    also cuts the model's padded width to the robot's ``dim``)."""

    dim: int

    def unnormalize(self, a: np.ndarray) -> np.ndarray: ...


class StateNorm(Protocol):
    """Robot state -> the model's state input (``ProprioNorm``, LeRobot's ``FeatureNorm``,
    which also pads it to the model's width)."""

    def normalize(self, states: np.ndarray) -> np.ndarray: ...


@dataclass
class Policy:
    model: VLA
    tokenizer: Tokenizer
    norm: ActionNorm | None = None
    # State normalisation: a proprio token's (required), or a flow expert's where the
    # checkpoint has one (LeRobot); a flow expert without one takes the state as given.
    proprio: StateNorm | None = None
    # Frames of another size are resized to the model's, as the checkpoint's own processor does
    # (OpenVLA: bicubic, its "resize-naive"; LeRobot pi0: "pad", aspect kept, bilinear, black
    # borders); None: they are refused (vlarun's own policies were trained at one size, and a
    # silent resize would hide a camera misconfiguration).
    resize: str | None = None
    # Accelerator settings calibrated for this checkpoint (``calibration.json`` beside its
    # weights, e.g. {"triage": {"delta": 0.5}} from `vlarun calibrate-drift --write-delta`):
    # every token policy built for it starts from these instead of the papers' defaults.
    calibration: dict = field(default_factory=dict)
    # The prompt template the checkpoint was trained with (tokenizer.PROMPTS).
    prompt: str = "openvla"
    # The observation keys the checkpoint declares (LeRobot's ``input_features``): its cameras
    # in the model's order, and its state; () and None where it declares none.
    camera_keys: tuple[str, ...] = ()
    state_key: str | None = None
    # Accelerator hooks the stage graph runs with (``with_setting``, ``with_hooks``); None: plain.
    hooks: Hooks | None = None
    # The LM FLOPs ratios are measured against when the model was transformed (layers pruned):
    # the original's; None: the model's own.
    reference: LlamaConfig | None = None
    # Per-inference accelerator statistics (recorded while a token policy runs the prefill).
    stats: AccelStats = field(default_factory=AccelStats, init=False, repr=False, compare=False)
    _graphs: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _instruction: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        family, h = self.model.cfg.family, self.hooks
        if h is not None and h.denoise_cache is not None and family not in ("diffusion", "flow"):
            raise ValueError("denoise_cache needs a diffusion (DiT) or flow (action expert) policy")
        if h is not None and h.decoder is not None and family != "autoregressive":
            raise ValueError("a token decoder needs an autoregressive (action-token) policy")

    @classmethod
    def from_preset(
        cls,
        name: str,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        llm_layers: int | None = None,
    ) -> Policy:
        """Random weights at a preset's shape (no statistics: actions stay in [-1, 1]; a FAST
        model decodes with ``synthetic_fast_tokenizer``). ``llm_layers``: build the LM with this
        many of its decoder layers (each layer's shape unchanged), for benchmarks of a model
        that would not fit the machine whole (OpenVLA-7B is 30 GB in fp32)."""
        cfg = get_preset(name)
        if llm_layers is not None:
            if not 1 <= llm_layers <= cfg.llm.num_layers:
                raise ValueError(
                    f"{name} has {cfg.llm.num_layers} LM layers: keep 1..{cfg.llm.num_layers}, "
                    f"got {llm_layers}"
                )
            cfg = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm, num_layers=llm_layers))
        torch.manual_seed(seed)
        model = VLA(cfg).to(dtype).eval()
        if model.cfg.fast is not None:  # no trained FAST vocabulary either: a fitted stand-in
            c = model.cfg
            model.set_fast_tokenizer(
                synthetic_fast_tokenizer(c.horizon, c.action_dim, c.fast.vocab_size)
            )
        d = model.cfg.proprio_dim  # no statistics either: the state is fed as given
        proprio = ProprioNorm((0.0,) * d, (1.0,) * d) if d else None
        return cls(model, load_tokenizer(None, model.cfg.llm.vocab_size), None, proprio)

    @classmethod
    def load(
        cls,
        name: str | Path,
        dtype: torch.dtype | str = torch.float32,
        device: str = "cpu",
        compile_steps: str = "",
        *,
        seed: int = 0,
        unnorm_key: str | None = None,
        action_bins: int | None = None,
        action_tokens: int | None = None,
    ) -> Policy:
        """A policy by one name: a checkpoint directory, a shipped policy (``tiny-ar``,
        ``mt10p-oft``, ...), or a preset (random weights drawn from ``seed``), on ``device``
        (cpu, cuda, cuda:N; checked before anything loads). An unknown name raises one
        ValueError listing the shipped policies and the presets. ``compile_steps`` (a
        ``torch.compile`` mode, empty for eager) compiles its static decode / Jacobi steps on
        first use (``static_step``); ``unnorm_key`` picks a checkpoint's action statistics;
        ``action_bins``: a LLaVA directory's action-bin mapping without ``action_bins.json``
        (models/llava.py); ``action_tokens``: an Emu3 (UniVLA) directory's end-of-action id
        without ``action_tokens.json`` (models/univla.py)."""
        target = resolve_device(device)
        # Denoising steps are compiled on CUDA and in the CPU's ``fused`` mode; torch.compile's
        # own modes measured no faster on a CPU (mt10p-flow's expert: 0.30x; fused: 2.6x).
        denoise = target.type == "cuda" or compile_steps == static_step.FUSED
        steps = static_step.compile_steps(compile_steps, denoise) if compile_steps else None
        if isinstance(dtype, str):
            dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        try:
            directory = policy_dir(name)
        except ValueError as missing:
            if str(name) not in PRESETS:
                raise ValueError(f"{missing}; nor a preset ({', '.join(PRESETS)})") from None
            if retired := retired_note(str(name)):  # its trained weights are not here: say so
                warnings.warn(f"{retired}; loading its preset, random weights", stacklevel=2)
            policy = cls.from_preset(str(name), seed, dtype)
        else:  # a directory that exists: its own error, if any, is the one to see
            policy = cls.from_checkpoint(
                directory, unnorm_key, dtype, action_bins=action_bins, action_tokens=action_tokens
            )
        if steps is not None:
            policy.model.steps = steps
        return policy.to(target)

    def to(self, device: torch.device | str) -> Policy:
        """This policy with its model on ``device``; the stage functions move their inputs
        there, and outputs come back to the host where they leave the graph (wire, actions)."""
        device = torch.device(device)
        if device == self.model.device:
            return self
        if self.hooks is not None:  # a KV cache kept on the old device is no use there
            self.hooks.reset()
        return dataclasses.replace(self, model=self.model.to(device))

    @classmethod
    def from_checkpoint(
        cls,
        directory: str | Path,
        unnorm_key: str | None = None,
        dtype: torch.dtype | None = None,
        *,
        action_bins: int | None = None,
        action_tokens: int | None = None,
    ) -> Policy:
        config = read_config(directory)
        if config.get("model_type") in ("openvla", "emu3"):  # before gigabytes of weights load
            require_tokenizer(directory, config["model_type"])
        own = config.get("model_type") == "vlarun"
        if (
            own
            and config.get("tokenizer") != "byte"
            and not (Path(directory) / "tokenizer.json").exists()
        ):
            raise ValueError(
                f"{directory}: no tokenizer.json. This policy was trained on its own tokenizer's "
                "ids (saved beside its weights): copy tokenizer.json back from where the "
                "checkpoint came from"
            )
        model, stats = load_vla(
            directory, dtype, action_bins=action_bins, action_tokens=action_tokens
        )
        tok = load_tokenizer(directory, model.cfg.llm.vocab_size, model.cfg.bos_id)
        if lerobot.is_lerobot(config):  # its processors' statistics and conventions
            io = lerobot.read_io(directory, config, model.cfg)
            for norm, file, what in (
                (
                    io.action,
                    "policy_postprocessor",
                    "actions stay normalised [-1, 1], not robot units",
                ),
                (io.state, "policy_preprocessor", "the state goes in un-normalised"),
            ):
                if not norm.statistics:
                    warnings.warn(f"{directory}: no {file}.json statistics: {what}", stacklevel=2)
            calibration = load_calibration(directory)
            return cls(
                model,
                tok,
                io.action,
                io.state,
                io.resize,
                calibration,
                prompt=io.prompt,
                camera_keys=io.cameras,
                state_key=io.state_key,
            )
        proprio = ProprioNorm.select(stats, unnorm_key) if model.cfg.proprio_dim else None
        resize = frame_resize(directory, model.cfg.image_size)
        calibration = load_calibration(directory)
        prompt = "openvla"
        if llava.is_llava(config):  # LLaVA-1.5's turn
            prompt = "llava"
        elif univla.is_emu3(config):  # the bare instruction
            prompt = "univla"
        return cls(
            model,
            tok,
            select_norm_stats(stats, unnorm_key),
            proprio,
            resize,
            calibration,
            prompt=prompt,
        )

    # -- inputs -------------------------------------------------------------------------------

    @staticmethod
    def observation(obs: dict) -> tuple[np.ndarray, np.ndarray | None]:
        """(image or views, state) from an environment observation: every view the env
        renders (``"views"``, else ``"image"``) and the proprio ``"state"`` if present."""
        return obs.get("views", obs["image"]), obs.get("state")

    @property
    def state_size(self) -> int:
        """Entries of the robot state this policy reads (in its model or its prompt); 0: none."""
        return self.proprio.dim if self.proprio is not None else self.model.cfg.state_dim

    @property
    def cameras(self) -> dict[str, tuple[int, int, int]]:
        """The frames ``predict`` takes, in order: camera name -> (H, W, 3) uint8. Names are
        the checkpoint's own (a LeRobot policy's ``observation.images.*`` keys, a vlarun
        policy's views); a checkpoint that resizes (OpenVLA) takes other sizes too."""
        cfg = self.model.cfg
        names = self.camera_keys or getattr(cfg, "views", ()) or ()
        names = list(names)[: cfg.num_images]
        names += [f"image{i}" for i in range(len(names), cfg.num_images)]
        return {n: (cfg.image_size, cfg.image_size, 3) for n in names}

    @property
    def action_units(self) -> str:
        """ "robot units" where the checkpoint carries action statistics; otherwise what the
        model outputs: "normalised [-1, 1]: no statistics"."""
        known = self.norm is not None and getattr(self.norm, "statistics", True)
        return "robot units" if known else "normalised [-1, 1]: no statistics"

    @property
    def action_shape(self) -> tuple[int, int]:
        """What ``predict`` returns: (horizon, action entries), float32."""
        return (self.model.cfg.horizon, self.action_size)

    def example_observation(self, instruction: str = "open the drawer") -> dict:
        """A valid observation of this policy (black frames, a zero state) as ``predict``'s
        keyword arguments: ``policy.predict(**policy.example_observation())`` runs, and shows
        the shapes a robot must send (as openpi's ``make_droid_example``)."""
        frames = [np.zeros(shape, np.uint8) for shape in self.cameras.values()]
        state = np.zeros(self.state_size, np.float32) if self.state_size else None
        return {"image": frames, "instruction": instruction, "state": state}

    @property
    def action_size(self) -> int:
        """Entries of one robot action: the model's width may be padded (LeRobot's 32)."""
        return self.norm.dim if self.norm is not None else self.model.cfg.action_dim

    def check_state(self, state: np.ndarray | list[float] | None) -> np.ndarray | None:
        """The robot state as float32 numbers, or one ValueError naming what is wrong: not
        numbers (a datetime, text), not this policy's length, or not finite (a NaN state would
        give NaN actions: the robot must fix its sensor, not move on them)."""
        if state is None:
            return None
        raw = np.asarray(state)
        if raw.dtype.kind not in "fiu":
            raise ValueError(f"the state must be numbers, got dtype {raw.dtype}")
        arr = raw.astype(np.float32).reshape(-1)
        if self.state_size and arr.size != self.state_size:
            raise ValueError(
                f"{self.model.cfg.name} reads a state of {self.state_size} numbers, got {arr.size}"
            )
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ValueError(f"the state must be finite: entry {bad[0]} is {arr[bad[0]]}")
        return arr

    def state_tensor(self, state: np.ndarray | None) -> torch.Tensor | None:
        """(1, state_dim) model input: normalised for a proprio token, raw for a flow expert,
        None when the model takes no state."""
        cfg = self.model.cfg
        if not cfg.state_dim:
            return None
        if state is None:
            if cfg.proprio_dim:
                raise ValueError(f"{cfg.name} takes the robot state ({cfg.proprio_dim} numbers)")
            return None
        arr = np.asarray(state, dtype=np.float32).reshape(-1)
        if cfg.proprio_dim and self.proprio is None:
            raise ValueError(f"{cfg.name} has a proprio token but no proprio statistics")
        if self.proprio is not None:
            arr = self.proprio.normalize(arr)
        return torch.as_tensor(arr, dtype=torch.float32)[None]

    def image_tensor(self, image: np.ndarray | list[np.ndarray]) -> torch.Tensor:
        """(H, W, 3) uint8 (or (n_img, H, W, 3), or a list of n_img frames, which may differ
        in size when the checkpoint resizes) -> (1, n_img, 3, S, S) floats in [0, 1]."""
        cfg = self.model.cfg
        frames = list(image) if isinstance(image, list | tuple) else None
        if frames is None:
            arr = np.asarray(image)
            frames = list(arr[None] if arr.ndim == 3 else arr) if arr.ndim in (3, 4) else [arr]
        want = (cfg.num_images, cfg.image_size, cfg.image_size, 3)
        if len(frames) != cfg.num_images or any(np.ndim(f) != 3 for f in frames):
            shapes = [tuple(np.shape(f)) for f in frames]
            size = "x".join(map(str, want[1:]))
            raise ValueError(
                f"{cfg.name} takes {cfg.num_images} frame(s) of {size} (H x W x RGB); got {shapes}"
            )
        views = [self._frame(np.asarray(f)) for f in frames]
        return torch.stack(views)[None]

    def _frame(self, frame: np.ndarray) -> torch.Tensor:
        """One (H, W, 3) uint8 frame -> (3, S, S) floats in [0, 1], resized as the checkpoint's
        processor does, or refused when it is another size and the policy does not resize."""
        cfg = self.model.cfg
        if frame.dtype != np.uint8:
            raise ValueError(f"image must be uint8 RGB, got dtype {frame.dtype}")
        size = (cfg.image_size, cfg.image_size)
        if frame.shape[:2] != size and frame.shape[-1] == 3 and self.resize:
            if self.resize in ("pad", "pad-topleft"):  # LeRobot: on [0, 1] floats, in torch
                x = torch.from_numpy(frame.copy()).permute(2, 0, 1).float().div(255.0)
                return resize_with_pad(x[None], cfg.image_size, self.resize == "pad")[0]
            frame = resize_frame(frame, cfg.image_size, self.resize)
        if frame.shape != (*size, 3):
            raise ValueError(
                f"image is {'x'.join(map(str, frame.shape))}; {cfg.name} expects "
                f"{cfg.num_images}x{cfg.image_size}x{cfg.image_size}x3 (n_images x H x W x RGB)"
            )
        return torch.from_numpy(frame.copy()).permute(2, 0, 1).float().div(255.0)

    def text_ids(self, instruction: str, state: np.ndarray | None = None) -> list[int]:
        """The prompt's token ids (no BOS); ``state`` (raw) is read by templates that write the
        state into the text (pi05), normalised first."""
        if state is not None and self.proprio is not None:
            state = self.proprio.normalize(np.asarray(state, dtype=np.float32).reshape(-1))
        ids = self.tokenizer.encode(PROMPTS[self.prompt](instruction, state))
        if self.prompt == "llava":  # the patch features take <image>'s place (models/llava.py)
            pre, ids = llava.prompt_split(ids, self.tokenizer.token_id(llava.IMAGE_TOKEN))
            if tuple(pre) != self.model.cfg.image_prefix_ids:
                raise ValueError(
                    f"the prompt's ids before <image> {pre} are not the model's "
                    f"{list(self.model.cfg.image_prefix_ids)}"
                )
        ids += list(self.model.cfg.prompt_suffix_ids)  # e.g. OpenVLA's 29871, counted below
        limit = self.model.cfg.max_text_tokens
        if len(ids) > limit:
            raise ValueError(
                f"instruction is {len(ids)} tokens with the prompt template; "
                f"{self.model.cfg.name} allows {limit}"
            )
        return ids

    def inputs(
        self,
        image: np.ndarray,
        instruction: str,
        state: np.ndarray | None = None,
        seed: int = 0,
        rtc: RTCRequest | None = None,
    ) -> tuple[Packet, list[int]]:
        """The stage graph's input packet for one observation (and the prompt ids): images,
        text, the state the model takes, and the noise of a diffusion / flow head, drawn from
        ``seed`` so a run is reproducible; ``rtc``: a real-time chunk's freeze (the graph
        ``graph(n, rtc=True)`` reads it)."""
        state = self.check_state(state)
        ids = self.text_ids(instruction, state)
        cfg = self.model.cfg
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(1, cfg.horizon, cfg.action_dim, generator=gen)
        st = self.state_tensor(state)
        images = self.image_tensor(image)
        return graph_inputs(cfg, images, [ids], noise=noise, state=st, rtc=rtc), ids

    # -- accelerators ---------------------------------------------------------------------------

    def with_setting(self, setting: AccelSetting | str) -> Policy:
        """This policy running ``setting`` (an ``AccelSetting``, or its text: ``"full"``,
        ``"triage:0.34"``, ``"exit:0.5"``, ``"fastv:0.18+cache:2"``) in process, with the
        checkpoint's calibrated knobs: the hooks the robot and the edge make from it. A setting
        with no token policy runs the prefill by full recompute through the same hook path,
        so every step's statistics are recorded and accelerated runs compare like for like.
        ``"int8"`` (weights="int8") quantises a copy of the model first (``transforms.int8``,
        one pass over the weights per call; the original model is untouched)."""
        from vlarun.policy.setting import AccelSetting

        if isinstance(setting, str):
            setting = AccelSetting.parse(setting)
        policy = self
        if setting.weights == "int8":
            setting.check_family(self.model.cfg.family)
            policy = dataclasses.replace(self, model=quantize_int8(self.model))
            setting = dataclasses.replace(setting, weights="native")
        hooks = setting.hooks(self.model.cfg.family, self.calibration) or Hooks()
        return policy.with_hooks(hooks.tokens, hooks.decoder, hooks.denoise_cache)

    def with_hooks(
        self,
        tokens: TokenPolicy | None = None,
        decoder: TokenDecoder | None = None,
        denoise_cache: Callable[[], DenoiseFeatureCache] | None = None,
        *,
        reference: LlamaConfig | None = None,
    ) -> Policy:
        """This policy running accelerator objects a setting does not name: ``tokens`` a
        visual-token policy (None: full recompute), ``decoder`` how an autoregressive head
        decodes its action tokens after the prefill (e.g. ``jacobi.JacobiDecoder``),
        ``denoise_cache`` a factory of a fresh DiT / flow-expert feature cache per inference;
        ``reference`` the LM FLOPs ratios are measured against (a pruned model's original).
        A new Policy sharing the model; the hooks are used as given (their state is its own)."""
        hooks = Hooks(tokens or FullRecompute(), decoder, denoise_cache)
        return dataclasses.replace(self, hooks=hooks, reference=reference or self.reference)

    def reset(self) -> None:
        """A new episode: forget the hooks' state (the KV cache a token policy reuses, the
        decoder's warm start). Nothing to forget without hooks; statistics are kept."""
        if self.hooks is not None:
            self.hooks.reset()

    # -- inference ------------------------------------------------------------------------------

    def graph(self, text_tokens: int, rtc: bool = False) -> StageGraph:
        """The stage graph this policy runs for a prompt of ``text_tokens``, bound to its
        hooks; built once per prompt length (and dtype). ``rtc``: its head also reads a
        real-time chunk's freeze from the request (``inputs(..., rtc=)``)."""
        dtype = "bfloat16" if self.model.dtype == torch.bfloat16 else "float32"
        key = (text_tokens, dtype, rtc)
        if key not in self._graphs:
            w = Workload(1, text_tokens, dtype)
            inpaint = INPAINTER if rtc else None
            self._graphs[key] = build_graph(self.model.cfg, self.model, w, self.hooks, inpaint)
        return self._graphs[key]

    @torch.no_grad()
    def run_stages(
        self,
        image: np.ndarray,
        instruction: str,
        *,
        state: np.ndarray | None = None,
        seed: int = 0,
        serialize: bool = False,
        rtc: RTCRequest | None = None,
    ) -> GraphRun:
        """One inference through the stage graph (per-stage timings included); ``serialize``
        encodes and decodes every stage's input packet, as crossing a network would; ``rtc``
        freezes the new chunk's first d actions to the queued ones (real-time chunking). Under
        hooks, a changed instruction starts a new episode (``reset``), and a step whose
        prefill ran under a token policy is counted in ``stats``."""
        if self.hooks is not None and instruction != self._instruction:
            self.reset()
            self._instruction = instruction
        packet, ids = self.inputs(image, instruction, state, seed, rtc)
        run = self.graph(len(ids), rtc is not None).run(packet, serialize=serialize)
        if self.hooks is not None and self.hooks.tokens is not None:
            llm = self.model.cfg.llm
            plan = getattr(self.hooks.tokens, "last_plan", None)
            self.stats.record(llm, self.reference or llm, self.hooks.last_step, plan)
        return run

    def unnormalize(self, actions: torch.Tensor) -> np.ndarray:
        a = actions.detach().float().cpu().numpy()
        return np.asarray(self.norm.unnormalize(a)) if self.norm is not None else a

    def predict(self, image: np.ndarray, instruction: str, **kw) -> np.ndarray:
        """Actions ``action_shape`` = (horizon, action entries), float32 for every policy, in
        robot units where the checkpoint has statistics (``action_units`` says which)."""
        run = self.run_stages(image, instruction, **kw)
        return self.unnormalize(run.outputs["actions"][0]).astype(np.float32, copy=False)


# Where each kind of checkpoint's tokenizer.json comes from, for the refusal's hint.
_TOKENIZER_SOURCE = {
    "openvla": "An OpenVLA checkpoint tokenizes its prompt with its Llama tokenizer: copy "
    "tokenizer.json from the repository the weights came from (e.g. openvla/openvla-7b)",
    "emu3": "An Emu3 (UniVLA) checkpoint tokenizes its prompt with Emu3's tokenizer: copy "
    "tokenizer.json from the repository the weights came from",
}


def require_tokenizer(directory: str | Path, kind: str = "openvla") -> None:
    """An OpenVLA or Emu3 directory's ``tokenizer.json``, or one ValueError that says where to
    get it: without it the prompt would be byte ids, not the ids the checkpoint was trained on
    (only vlarun's own checkpoints and presets use the byte-level tokenizer)."""
    if not (Path(directory) / "tokenizer.json").exists():
        raise ValueError(
            f"{directory}: no tokenizer.json. {_TOKENIZER_SOURCE[kind]} into this directory; "
            "vlarun never downloads"
        )


RESIZE_FILTERS = ("bicubic", "bilinear")


def resize_with_pad(frames: torch.Tensor, size: int, centred: bool = True) -> torch.Tensor:
    """(n, 3, H, W) floats in [0, 1] -> (n, 3, size, size): scaled to fit with the aspect
    kept (bilinear, no antialiasing) on black. ``centred``: openpi's ``resize_with_pad_torch``
    as LeRobot's pi0 / pi05 apply it (clamped to [0, 1], centred); otherwise LeRobot's
    ``resize_with_pad`` as SmolVLA applies it (not clamped, padded on the left and top)."""
    h, w = frames.shape[-2:]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    out = torch.nn.functional.interpolate(
        frames, size=(rh, rw), mode="bilinear", align_corners=False
    )
    if not centred:
        return torch.nn.functional.pad(out, (size - rw, 0, size - rh, 0))
    out = out.clamp(0.0, 1.0)
    top, left = (size - rh) // 2, (size - rw) // 2
    return torch.nn.functional.pad(out, (left, size - rw - left, top, size - rh - top))


def frame_resize(directory: str | Path, size: int) -> str | None:
    """How a checkpoint's own processor resizes frames, or None (refuse other sizes): OpenVLA
    directories resize any frame to the processor's size, bicubic ("resize-naive"); their
    ``preprocessor_config.json``, when present, must agree with the model's input size."""
    import json

    d = Path(directory)
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
    if config.get("model_type") != "openvla":
        return None
    pre = d / "preprocessor_config.json"
    if pre.exists():
        p = json.loads(pre.read_text())
        strategy = p.get("image_resize_strategy", "resize-naive")
        if strategy != "resize-naive":
            raise ValueError(f"{pre}: image_resize_strategy {strategy!r}; vlarun does resize-naive")
        sizes = {
            int(s[-1]) if isinstance(s, list) else int(s)
            for s in p.get("input_sizes", [[3, size, size]])
        }
        if sizes != {size}:
            raise ValueError(f"{pre}: input sizes {sorted(sizes)} but the model takes {size}")
    return "bicubic"


def resize_frame(frame: np.ndarray, size: int, how: str) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8 with PIL's filter (what torchvision's Resize
    does on a PIL image, as OpenVLA's processor runs it)."""
    from PIL import Image

    if how not in RESIZE_FILTERS:
        raise ValueError(f"resize must be one of {RESIZE_FILTERS}, got {how!r}")
    method = Image.BICUBIC if how == "bicubic" else Image.BILINEAR
    return np.asarray(Image.fromarray(frame).resize((size, size), method))


CALIBRATION_FILE = "calibration.json"
# What a calibration file may set, per accelerator: checked on load, so a typo fails loudly.
CALIBRATED = {"triage": ("delta", "max_age"), "jacobi": ("init",)}
# Knobs whose value is a word rather than a number, with the words allowed.
CALIBRATED_WORDS = {("jacobi", "init"): ("random", "repeat")}


def load_calibration(directory: str | Path) -> dict:
    """A checkpoint's calibrated accelerator settings ({} when it has none); ValueError names
    an unknown accelerator or knob, or a value that is not a number."""
    path = Path(directory) / CALIBRATION_FILE
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    out = {}
    for name, knobs in data.items():
        if name.startswith("_"):  # "_source" and other notes
            continue
        if name not in CALIBRATED or not isinstance(knobs, dict):
            raise ValueError(f"{path}: unknown accelerator {name!r}; known: {sorted(CALIBRATED)}")
        for k, v in knobs.items():
            words = CALIBRATED_WORDS.get((name, k))
            ok = v in words if words else isinstance(v, int | float) and not isinstance(v, bool)
            if k not in CALIBRATED[name] or not ok:
                allowed = f" (one of {words})" if words else ""
                raise ValueError(
                    f"{path}: {name}.{k}={v!r}; calibratable: {CALIBRATED[name]}{allowed}"
                )
        out[name] = dict(knobs)
    return out
