"""Named model shapes, one registry (``PRESETS``, ``get_preset``) over three tables: the real
VLAs at true size (real.py: cost modelling, FLOP counts, random-weight benchmarks; nothing
downloads weights), tiny presets of every family that run on a laptop CPU in milliseconds
(tiny.py), and the Meta-World policies vlarun trains itself (metaworld.py).
"""

from __future__ import annotations

from collections.abc import Callable

from vlarun.models.presets.metaworld import (
    mt10_ar,
    mt10_dit,
    mt10_oft,
    mt10g_ar,
    mt10g_dit,
    mt10g_flow,
    mt10g_oft,
    mt10p_ar,
    mt10p_dit,
    mt10p_fast,
    mt10p_flow,
    mt10p_llava,
    mt10p_oft,
    mt10w_ar,
    mt10w_dit,
    mt10w_flow,
    mt10w_oft,
    mw_ar,
    mw_dit,
    mw_oft,
)
from vlarun.models.presets.real import (
    cogact,
    llava_vla_7b,
    openvla_7b,
    openvla_oft,
    pi0,
    pi0_fast,
    pi05,
    rdt_1b,
    smolvla,
    univla,
)
from vlarun.models.presets.tiny import (
    tiny_cogact,
    tiny_oft,
    tiny_openvla,
    tiny_pi0,
    tiny_pi0_fast,
    tiny_smolvla,
    tiny_univla,
)
from vlarun.models.vla import VLAConfig

PRESETS: dict[str, Callable[[], VLAConfig]] = {
    "openvla-7b": openvla_7b,
    "openvla-oft": openvla_oft,
    "llava-vla-7b": llava_vla_7b,
    "cogact": cogact,
    "pi0": pi0,
    "pi05": pi05,
    "pi0-fast": pi0_fast,
    "univla": univla,
    "smolvla": smolvla,
    "rdt-1b": rdt_1b,
    "tiny-openvla": tiny_openvla,
    "tiny-openvla-oft": tiny_oft,
    "tiny-cogact": tiny_cogact,
    "tiny-pi0": tiny_pi0,
    "tiny-pi0-fast": tiny_pi0_fast,
    "tiny-univla": tiny_univla,
    "tiny-smolvla": tiny_smolvla,
    "tiny-ar": mw_ar,
    "tiny-oft": mw_oft,
    "tiny-dit": mw_dit,
    "mt10-ar": mt10_ar,
    "mt10-oft": mt10_oft,
    "mt10-dit": mt10_dit,
    "mt10w-ar": mt10w_ar,
    "mt10w-oft": mt10w_oft,
    "mt10w-dit": mt10w_dit,
    "mt10w-flow": mt10w_flow,
    "mt10p-ar": mt10p_ar,
    "mt10p-oft": mt10p_oft,
    "mt10p-dit": mt10p_dit,
    "mt10p-flow": mt10p_flow,
    "mt10p-fast": mt10p_fast,
    "mt10p-llava": mt10p_llava,
    "mt10g-ar": mt10g_ar,
    "mt10g-oft": mt10g_oft,
    "mt10g-dit": mt10g_dit,
    "mt10g-flow": mt10g_flow,
}
DEFAULT_PRESET = "tiny-openvla"
# A shipped policy and the preset of its shape share one name (tiny-ar, mt10-oft, ...): a name
# means one model, with its trained weights where they load, as a shape where it is costed.
RENAMED = {"mw-ar": "tiny-ar", "mw-oft": "tiny-oft", "mw-dit": "tiny-dit"}


def get_preset(name: str) -> VLAConfig:
    """The preset called ``name``; an unknown name raises listing the valid ones."""
    if name in RENAMED:
        raise ValueError(f"preset {name!r} is now {RENAMED[name]!r} (the shipped policy's name)")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]()
