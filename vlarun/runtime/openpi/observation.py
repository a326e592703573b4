"""openpi's observation frames as vlarun reads them: msgpack-numpy (openpi's array encoding),
checked before anything is built (every array's dtype and shape against its bytes; object, void
and complex dtypes refused; lists, containers and the prompt bounded while parsing), and the
observation layouts (where a client puts its cameras, state and instruction).

The server that speaks the protocol is ``policy_server.py`` beside this file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

MAX_FRAME = 16 * 2**20  # a 224 px two-camera observation is ~0.3 MB; 16 MiB leaves room
MAX_ARRAY_DIMS = 8
REFUSED_KINDS = "VOc"  # void (structured), object (pickle), complex: as openpi's own decoder
SCALAR_KINDS = "biuf"  # what a numpy scalar in a request may be: a bool or a number
# An observation is a flat map of a few arrays, a state and a prompt: these leave room for
# nested layouts and short lists while bounding what a frame can make the decoder build.
MAX_LIST_LEN = 1024
MAX_CONTAINERS = 256

# -- msgpack-numpy: openpi's array encoding -----------------------------------------------------


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in REFUSED_KINDS:
            raise ValueError(f"cannot send arrays of dtype {obj.dtype}")
        arr = np.ascontiguousarray(obj)
        return {
            b"__ndarray__": True,
            b"data": arr.tobytes(),
            b"dtype": arr.dtype.str,
            b"shape": list(arr.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape = obj.get(b"shape")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_ARRAY_DIMS:
            raise ValueError(f"array shape must be a list of at most {MAX_ARRAY_DIMS} sizes")
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"array shape {shape} must hold non-negative integers")
        data = obj.get(b"data")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            got = len(data) if isinstance(data, bytes) else type(data).__name__
            raise ValueError(f"array of {dtype} {tuple(shape)} does not match its {got} bytes")
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only view, no copy
    if b"__npgeneric__" in obj:
        dtype, data = _dtype(obj.get(b"dtype")), obj.get(b"data")
        # A scalar is a number (openpi sends ``obj.item()``): a text or time scalar is built
        # from whatever ``data`` holds before any limit sees it (15 MiB of bytes as "<U1" is a
        # 63 MB string), and is no observation's value.
        if dtype.kind not in SCALAR_KINDS or type(data) not in (bool, int, float):
            what = type(data).__name__
            raise ValueError(
                f"a numpy scalar must be one number (bool, int or float), got "
                f"dtype {dtype.str} holding {what}"
            )
        return dtype.type(data)
    return obj


def _dtype(spec: Any) -> np.dtype:
    if not isinstance(spec, str):
        raise ValueError(f"array dtype must be a string, got {type(spec).__name__}")
    try:
        dtype = np.dtype(spec)
    except TypeError:
        raise ValueError(f"unknown array dtype {spec!r}") from None
    if dtype.kind in REFUSED_KINDS:
        raise ValueError(f"array dtype {spec!r} is refused (object, void or complex)")
    return dtype


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes, max_str_bytes: int | None = None) -> Any:
    """One msgpack-numpy object. Every limit is checked while parsing, before the object it
    bounds is built: a text longer than ``max_str_bytes`` (the prompt is the only long text
    a request has), a list or map longer than a real observation needs, and more than
    ``MAX_CONTAINERS`` lists and maps in all (without it a 16 MiB frame of one-byte
    elements becomes ~16 M Python objects, ~10x its size and seconds of CPU)."""
    count = [0]

    def counted(kind: Callable) -> Callable:
        def hook(obj: Any) -> Any:
            count[0] += 1
            if count[0] > MAX_CONTAINERS:
                raise ValueError(f"a request holds at most {MAX_CONTAINERS} lists and maps")
            return kind(obj)

        return hook

    try:
        return msgpack.unpackb(
            data,
            object_hook=counted(_decode),
            list_hook=counted(list),
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_LIST_LEN,
            max_map_len=MAX_LIST_LEN,
            max_str_len=max_str_bytes or len(data),
        )
    except ValueError as e:  # msgpack says "N exceeds max_str_len(M)": say what it bounds
        if "max_str_len" in str(e):
            raise ValueError(
                f"a text in the request is longer than {max_str_bytes} bytes (--max-prompt-bytes)"
            ) from None
        raise


# -- observation layouts ------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservationLayout:
    """Where a robot client puts the cameras, the state and the instruction in its dict.

    image_keys: the views in the policy's order (the first is required, the rest are used when
    present and the policy takes that many); state_key: the proprio vector; prompt_key: text."""

    name: str
    image_keys: tuple[str, ...]
    state_key: str
    prompt_key: str = "prompt"

    def inputs(
        self, obs: Any, num_images: int, max_prompt_bytes: int = 4096
    ) -> tuple[np.ndarray, np.ndarray | None, str]:
        """(images (V, H, W, 3) uint8 or a list of V frames of different sizes, state or
        None, instruction) from one request; a prompt over ``max_prompt_bytes`` is refused.
        The cheap checks (keys, the prompt's size, each view's declared shape) come before
        any copy or stacking."""
        if not isinstance(obs, dict):
            raise ValueError(f"an observation must be a dict, got {type(obs).__name__}")
        missing = [k for k in (self.image_keys[0], self.prompt_key) if k not in obs]
        if missing:
            raise ValueError(
                f"observation lacks {missing} (layout {self.name!r}: keys "
                f"{[*self.image_keys, self.state_key, self.prompt_key]})"
            )
        prompt = obs[self.prompt_key]
        if type(prompt) not in (str, bytes):  # not a subclass either: np.str_ is a str
            raise ValueError(f"{self.prompt_key!r} must be text, got {type(prompt).__name__}")
        # The byte length before any decoding or tokenizing: a tokenizer holds the interpreter
        # for as long as the text is (seconds for megabytes), stalling every other client.
        size = len(prompt) if isinstance(prompt, bytes) else len(prompt.encode())
        if size > max_prompt_bytes:
            raise ValueError(f"{self.prompt_key!r} is {size} bytes; at most {max_prompt_bytes}")
        if isinstance(prompt, bytes):
            prompt = prompt.decode()
        # Every camera the request sends is checked, the ones this policy does not read too
        # (issue 64: an oversized second_image sent to a one-view policy was ignored, not
        # refused like the first).
        present = [k for k in self.image_keys if k in obs]
        for key in present:
            v = obs[key]
            if (
                not isinstance(v, np.ndarray)
                or v.ndim != 3
                or v.shape[-1] != 3
                or v.dtype != np.uint8
            ):
                what = f"{v.dtype}{v.shape}" if isinstance(v, np.ndarray) else type(v).__name__
                raise ValueError(f"{key!r} must be an (H, W, 3) uint8 array, got {what}")
        views = [obs[k] for k in present][:num_images]
        if len(views) == 1:
            images = views[0]
        elif len({v.shape for v in views}) == 1:
            images = np.stack(views)
        else:  # cameras of different sizes: the policy resizes each, or says it cannot
            images = views
        state = obs.get(self.state_key)
        if state is not None:
            # The count before any conversion (issue 64: a uint8 state of 16M entries was made
            # float32, 64 MB per request, before this limit was read).
            n = len(state) if isinstance(state, (list, tuple)) else np.size(state)
            if n > MAX_LIST_LEN:
                shape = np.shape(state) if isinstance(state, np.ndarray) else (n,)
                raise ValueError(
                    f"{self.state_key!r} must hold at most {MAX_LIST_LEN} numbers, "
                    f"got shape {shape}"
                )
            raw = np.asarray(state)
            if raw.dtype.kind not in "fiu":
                raise ValueError(f"{self.state_key!r} must be numbers, got dtype {raw.dtype}")
            if raw.size > MAX_LIST_LEN:  # nested lists: their size is known once made
                raise ValueError(
                    f"{self.state_key!r} must hold at most {MAX_LIST_LEN} numbers, "
                    f"got shape {raw.shape}"
                )
            state = raw.astype(np.float32)
            bad = np.flatnonzero(~np.isfinite(state.ravel()))
            if bad.size:  # named as act and Policy.predict name it
                raise ValueError(
                    f"{self.state_key!r} must be finite: entry {int(bad[0])} is "
                    f"{state.ravel()[bad[0]]}"
                )
        return images, state, prompt


def expected_inputs(policy, layout: ObservationLayout) -> dict:
    """What a client must send, for the metadata frame and the start line: each image key with
    the (H, W, 3) uint8 frame it takes (and whether other sizes are resized), the state's
    length (0: none read)."""
    shapes = list(policy.cameras.values())
    keys = layout.image_keys[: len(shapes)]
    return {
        "image_shapes": {k: list(shape) for k, shape in zip(keys, shapes, strict=True)},
        "image_resize": policy.resize is not None,
        "state_size": policy.state_size,
    }


LAYOUTS: dict[str, ObservationLayout] = {
    # vlarun's Meta-World observation names: the workspace camera, the second view, the state.
    "metaworld": ObservationLayout("metaworld", ("image", "second_image"), "state"),
    # openpi's LIBERO example client.
    "libero": ObservationLayout(
        "libero", ("observation/image", "observation/wrist_image"), "observation/state"
    ),
}


def get_layout(name: str) -> ObservationLayout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown observation layout {name!r}; valid: {', '.join(LAYOUTS)}")
    return LAYOUTS[name]
