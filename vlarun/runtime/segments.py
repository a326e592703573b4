"""Segments of the stage graph: consecutive stages a plan puts on one side.

A plan maps each stage to the robot or the edge; the runtime runs it as alternating segments.
A remote segment is one request: the robot sends the tensors the segment needs from outside
and names the tensors it wants back, the edge runs the segment's stages one after another,
passing tensors between them in memory (EcoVLA: same-node edges pass inline), so a KV cache
made and consumed on the edge never crosses the link.

The edge checks a request against the schema the graph gives for the request's workload
(batch, instruction length): exact names, dtypes and shapes, before any tensor is allocated;
then the values it read (finite floats, lengths and token ids in range), before any model work.
A request with ``meta.rtc`` carries a real-time chunk's freeze (``families.RTC_INPUTS``) to its
head stage: checked the same way, d and s against the horizon too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from vlarun.accel.base import FullRecompute
from vlarun.accel.rtc import INPAINTER
from vlarun.models.vla import VLAConfig
from vlarun.policy.setting import AccelSetting
from vlarun.sched import execution
from vlarun.stages import wire
from vlarun.stages.families import RTC_FAMILIES, Workload, build_graph
from vlarun.stages.graph import StageGraph, TensorSpec
from vlarun.stages.hooks import Hooks
from vlarun.stages.packet import PacketError

# Which axis of a tensor is the batch: the exported KV cache is (layers, batch, ...).
BATCH_DIM = {"kv_k": 1, "kv_v": 1, "kv_valid": 1}


def batch_dim(name: str) -> int:
    return BATCH_DIM.get(name, 0)


@dataclass(frozen=True)
class Segment:
    """Consecutive stages on one role. ``needs``: tensors from outside the segment (graph
    inputs or earlier stages' outputs); ``makes``: everything its stages output."""

    role: str
    stages: tuple[str, ...]
    needs: tuple[str, ...]
    makes: tuple[str, ...]


def segments(graph: StageGraph, placement: dict[str, str]) -> list[Segment]:
    """Split the graph (topological order) into maximal runs of stages on one role: the
    executor's rule (``sched.execution.segments``), which the fleet simulator runs too."""
    names = [st.name for st in graph.stages]
    roles = [placement[n] for n in names]
    return [
        segment_of(graph, tuple(names[k] for k in run), roles[run.start])
        for run in execution.segments(roles)
    ]


def segment_of(graph: StageGraph, names: tuple[str, ...], role: str = "edge") -> Segment:
    made: list[str] = []
    needs: list[str] = []
    for name in names:
        st = graph.stage(name)
        for spec in st.inputs:
            if spec.name not in made and spec.name not in needs:
                needs.append(spec.name)
        made += [s.name for s in st.outputs]
    return Segment(role, names, tuple(needs), tuple(made))


def wanted(graph: StageGraph, placement: dict[str, str], seg: Segment) -> tuple[str, ...]:
    """What a remote segment must send back: its outputs that a later robot stage reads, plus
    the final outputs (actions) when the segment ends the graph."""
    later = [s for s in graph.stages if s.name not in seg.stages]
    after = graph.stages.index(graph.stage(seg.stages[-1]))
    reads = {
        spec.name
        for st in later
        if graph.stages.index(st) > after and placement[st.name] != seg.role
        for spec in st.inputs
    }
    if seg.stages[-1] == graph.stages[-1].name:
        reads |= {s.name for s in graph.stages[-1].outputs}
    return tuple(n for n in seg.makes if n in reads)


@dataclass(frozen=True, kw_only=True)
class Request:
    """A data request checked against the schema (its tensors not read yet): the stages, what
    it wants back, the reply codec, hook parts to reset, its setting and time budget (s, as
    the robot sent it)."""

    stages: tuple[str, ...]
    want: tuple[str, ...]
    reply_codec: dict
    fresh: tuple[str, ...]
    setting: AccelSetting
    budget_s: float
    rtc: bool = False  # carries a real-time chunk's freeze (RTC_INPUTS)


class Schema:
    """Stage schemas of one model for any workload, cached (building specs is cheap but not
    free, and a robot fleet asks for the same few workloads over and over)."""

    def __init__(self, cfg: VLAConfig, dtype: str, max_batch: int = 8) -> None:
        self.cfg, self.dtype, self.max_batch = cfg, dtype, max_batch
        self.names = tuple(s.name for s in self._graph(1, 1).stages)

    @lru_cache(maxsize=256)  # noqa: B019 - one Schema per server; entries are small
    def _graph(
        self, batch: int, text_tokens: int, token_policy: bool = False, rtc: bool = False
    ) -> StageGraph:
        # Under a token policy the prefill also reads the frames (its schema, not its weights,
        # is what matters here: any token policy stands for all).
        hooks = Hooks(tokens=FullRecompute()) if token_policy else None
        w = Workload(batch, text_tokens, self.dtype)
        return build_graph(self.cfg, None, w, hooks, INPAINTER if rtc else None)

    def parse_stages(self, text: str) -> tuple[str, ...]:
        """'prefill+decode' -> ('prefill', 'decode'); must be consecutive graph stages."""
        names = tuple(text.split("+")) if text else ()
        if not names or any(n not in self.names for n in names):
            raise PacketError(f"unknown stage list {text!r:.80}; stages: {list(self.names)}")
        first = self.names.index(names[0])
        if self.names[first : first + len(names)] != names:
            raise PacketError(f"stages {list(names)} are not consecutive in {list(self.names)}")
        return names

    def expected(
        self,
        names: tuple[str, ...],
        batch: object,
        text_tokens: object,
        token_policy: bool = False,
        rtc: bool = False,
    ) -> tuple[Segment, dict[str, TensorSpec]]:
        """The segment and the exact specs of the tensors a request for it must carry
        (``token_policy``: its setting has a token policy, so the prefill reads the frames;
        ``rtc``: the head reads a real-time chunk's freeze)."""
        if not isinstance(batch, int) or not 1 <= batch <= self.max_batch:
            raise PacketError(f"meta.batch must be an integer in 1..{self.max_batch}")
        limit = self.cfg.max_text_tokens
        if not isinstance(text_tokens, int) or not 1 <= text_tokens <= limit:
            raise PacketError(f"meta.text_tokens must be an integer in 1..{limit}")
        graph = self._graph(batch, text_tokens, token_policy, rtc)
        seg = segment_of(graph, names)
        specs = {s.name: s for s in graph.graph_inputs}
        for st in graph.stages:
            specs.update({s.name: s for s in st.outputs})
        return seg, {n: specs[n] for n in seg.needs}

    def check(self, header: wire.Header) -> Request:
        """Check a data request's header against the stage schema: stage list, batch and
        instruction length, the exact names, dtypes and shapes of its tensors, what it wants
        back, its reply codec and accelerator setting. Raises PacketError naming the first
        problem; nothing is allocated (the edge and a scale-out front share this check)."""
        names = self.parse_stages(header.stage)
        meta = header.meta
        try:
            setting = AccelSetting.from_meta(meta.get("setting"))
            setting.check_family(self.cfg.family)
        except (TypeError, ValueError) as e:
            raise PacketError(f"bad setting: {e}") from None
        rtc = meta.get("rtc", False)
        if not isinstance(rtc, bool):
            raise PacketError("meta.rtc must be true or false")
        if rtc and self.cfg.family not in RTC_FAMILIES:
            raise PacketError(f"real-time chunking needs a {'/'.join(RTC_FAMILIES)} policy")
        seg, specs = self.expected(
            names, meta.get("batch"), meta.get("text_tokens"), setting.token_budget < 1.0, rtc
        )
        got = {e.name: e for e in header.entries}
        if set(got) != set(specs):
            raise PacketError(
                f"stages {list(names)} need tensors {sorted(specs)}, got {sorted(got)}"
            )
        for name, spec in specs.items():
            e = got[name]
            if e.dtype != spec.dtype or e.shape != spec.shape:
                raise PacketError(
                    f"tensor {name!r}: expected {spec.dtype}{list(spec.shape)}, "
                    f"got {e.dtype}{list(e.shape)}"
                )
        last = self._graph(1, 1).stage(names[-1])
        want = meta.get("want", [s.name for s in last.outputs])
        if not isinstance(want, list) or not want or not set(want) <= set(seg.makes):
            raise PacketError(f"meta.want must name outputs of {list(names)}: {list(seg.makes)}")
        codec = meta.get("reply_codec", {})
        if not isinstance(codec, dict):
            raise PacketError("meta.reply_codec must be a map")
        try:
            wire.Codec(**codec)
        except (TypeError, ValueError) as e:
            raise PacketError(f"bad reply_codec: {e}") from None
        fresh = meta.get("fresh", [])
        if not isinstance(fresh, list) or not set(fresh) <= {"tokens", "decoder"}:
            raise PacketError("meta.fresh must be a list of 'tokens' / 'decoder'")
        # The budget as sent: the edge core holds it to its bounds (``edge.core.MAX_BUDGET_S``).
        return Request(
            stages=names,
            want=tuple(want),
            reply_codec=codec,
            fresh=tuple(fresh),
            setting=setting,
            budget_s=header.deadline_s,
            rtc=rtc,
        )

    def check_values(self, tensors: dict) -> None:
        """What a header cannot promise: the values of a request's tensors, checked once they
        are read and before the request is queued (no model work is spent on a bad one).
        Every floating tensor finite (a NaN or infinity image, state, noise or cache); each
        ``text_len`` in 1..the width of ``text_ids``; token ids (``text_ids``,
        ``action_ids``) within the vocabulary; ``next_pos`` within the exported cache.
        Raises PacketError naming the first problem."""
        for name, t in tensors.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise PacketError(f"tensor {name!r} holds NaN or infinity")
        ids = tensors.get("text_ids")
        n = tensors.get("text_len")
        if n is not None and ids is not None and n.numel():
            width = ids.shape[-1]
            if int(n.min()) < 1 or int(n.max()) > width:
                raise PacketError(f"text_len must be in 1..{width} (the width of text_ids)")
        vocab = self.cfg.llm.vocab_size
        for name in ("text_ids", "action_ids"):
            t = tensors.get(name)
            if t is not None and t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab):
                raise PacketError(f"{name} must be token ids in 0..{vocab - 1}")
        d, s = tensors.get("rtc_delay"), tensors.get("rtc_exec")
        if d is not None and s is not None and d.numel():
            h = self.cfg.horizon
            if int(s.min()) < 1 or int(s.max()) > h or int(d.min()) < 0 or bool((d > h - s).any()):
                raise PacketError(f"rtc_exec s must be in 1..{h} and rtc_delay d in 0..{h} - s")
        pos, kv = tensors.get("next_pos"), tensors.get("kv_k")
        if pos is not None and pos.numel():
            top = kv.shape[3] if kv is not None and kv.ndim > 3 else None
            if int(pos.min()) < 0 or (top is not None and int(pos.max()) > top):
                raise PacketError(f"next_pos must be in 0..{top} (the cached positions)")
