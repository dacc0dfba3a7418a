"""Boolean environment switches (GRAPHDNN_REQUIRE_CACHED, GRAPHDNN_DISABLE_CACHE, GRAPHDNN_LINEINFO, ...), parsed one way.

A switch is on for 1/true/yes/on and off for 0/false/no/off or empty/unset (any case,
surrounding blanks ignored). Anything else is an error rather than a guess: reading
``GRAPHDNN_REQUIRE_CACHED=False`` as "set, so true" would turn a switch on that its
author meant to turn off.
"""

from __future__ import annotations

import os

from .errors import GraphError

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """The value of the boolean environment variable ``name`` (unset: False)."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise GraphError(f"environment variable {name}={value!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")
