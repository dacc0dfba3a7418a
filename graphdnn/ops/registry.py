"""The table of op definitions by kind, which ``ops.base.register`` fills.

A module of its own, importing only the errors, so that an IR node can name its
definition (``ir.Node.definition``) without the IR importing the op contract, which
imports the IR for its hooks' types. Values are :class:`graphdnn.ops.base.Op` instances
(typed Any here for the same reason; ``ops.base.get_op`` gives them their type).
"""

from typing import Any

from ..errors import UnknownOpError

DEFINITIONS: dict[str, Any] = {}


def lookup(kind: str, *, node: str | None = None, path: str | None = None) -> Any:
    """The definition of op ``kind``; UnknownOpError (located at ``node`` / ``path``) if none."""
    try:
        return DEFINITIONS[kind]
    except KeyError:
        raise UnknownOpError(f"unknown op '{kind}'", node=node, path=path) from None
