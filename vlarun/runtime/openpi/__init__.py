"""openpi's WebSocket policy protocol, served by vlarun (`vlarun serve-policy`), so an
unmodified ``openpi-client`` drives a vlarun policy.

observation.py     msgpack-numpy frames checked before anything is built; observation layouts
policy_server.py   the server: API key before the upgrade, per-connection and total limits,
                   requests queued on an in-process edge's stage queues
memory.py          giving a burst's freed request memory back to the operating system

The names a client of this room needs are re-exported here (``openpi.OpenpiPolicyServer``).
"""

from vlarun.runtime.openpi.observation import (
    LAYOUTS,
    MAX_FRAME,
    ObservationLayout,
    expected_inputs,
    get_layout,
    packb,
    unpackb,
)
from vlarun.runtime.openpi.policy_server import Busy, OpenpiPolicyServer, ServeLimits

__all__ = [
    "LAYOUTS",
    "MAX_FRAME",
    "Busy",
    "ObservationLayout",
    "OpenpiPolicyServer",
    "ServeLimits",
    "expected_inputs",
    "get_layout",
    "packb",
    "unpackb",
]
