"""NVTX ranges for Nsight Systems timelines: off unless ``GRAPHDNN_NVTX=1``.

The switch is read when a plan is bound, never per call: an enabled binding is an
:class:`~graphdnn.runtime.launch.AnnotatedBoundPlan`, so the plain ``BoundPlan`` call
does no NVTX work (not even a check) when the switch is off. The ranges need the optional
``nvtx`` package (``pip install graphdnn[nvtx]``).
"""

from __future__ import annotations

from types import ModuleType

from ..env import env_flag
from ..errors import GraphError

SWITCH = "GRAPHDNN_NVTX"
DOMAIN = "graphdnn"


def ranges() -> ModuleType | None:
    """The ``nvtx`` module when ``GRAPHDNN_NVTX`` is on; None when off."""
    if not env_flag(SWITCH):
        return None
    try:
        import nvtx
    except ImportError as error:
        raise GraphError(f"{SWITCH}=1 needs the nvtx package: pip install nvtx (or graphdnn[nvtx])") from error
    return nvtx
