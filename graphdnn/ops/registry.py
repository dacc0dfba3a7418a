"""The table of op definitions by kind, which ``ops.base.register`` fills.

A module of its own, importing nothing, so that an IR node can name its definition
(``ir.Node.definition``) without the IR importing the op contract, which imports the IR
for its hooks' types. Values are :class:`graphdnn.ops.base.Op` instances.
"""

from typing import Any

DEFINITIONS: dict[str, Any] = {}
