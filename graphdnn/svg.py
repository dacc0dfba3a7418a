"""A fused graph's DOT picture rendered to SVG by Graphviz's ``dot`` program (``graphdnn inspect --svg``).

Graphviz is a system program, not a Python package: it is looked up on PATH when a
picture is asked for, and its absence is an error that says how to get one.
"""

from __future__ import annotations

import shutil
import subprocess

from .errors import GraphError

_TIMEOUT_S = 120  # a graph of thousands of nodes lays out in seconds; a hang must not block the CLI


def render_svg(dot: str, path: str) -> None:
    """Write the SVG of the DOT text ``dot`` to ``path`` with ``dot -Tsvg``."""
    program = shutil.which("dot")
    if program is None:
        raise GraphError(
            "--svg renders with Graphviz's 'dot' program, which is not on PATH: install Graphviz "
            "(e.g. apt-get install graphviz, brew install graphviz), or write the DOT text with --dot"
        )
    try:
        done = subprocess.run(
            [program, "-Tsvg", "-o", path], input=dot, capture_output=True, text=True, timeout=_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise GraphError(f"Graphviz's dot ({program}) did not finish {path} in {_TIMEOUT_S} s") from None
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit status {done.returncode}"
        raise GraphError(f"Graphviz's dot ({program}) could not write {path}: {reason}")
