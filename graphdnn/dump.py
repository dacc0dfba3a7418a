"""Generated CUDA sources on disk, to read, diff or compile by hand.

``GRAPHDNN_DUMP_DIR=DIR`` writes every kernel's source there as it is handed to NVRTC
(before, so a kernel NVRTC rejects is there too); ``graphdnn inspect --cuda --out DIR``
writes a graph's kernels without compiling them. A file is named after the kernel's entry
point (which ends in its content hash) and target: ``gd_add_relu_7c8771f17b.sm_90.cu``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import GraphError
from .lower import KernelSource


def dump_directory() -> Path | None:
    """``$GRAPHDNN_DUMP_DIR``, or None when it is unset or empty."""
    value = os.environ.get("GRAPHDNN_DUMP_DIR", "").strip()
    return Path(value).expanduser() if value else None


def file_name(source: KernelSource, arch: int) -> str:
    return f"{source.name}.{source.target(arch)}.cu"


def write_sources(directory: Path, sources: Iterable[KernelSource], arch: int, *, why: str) -> list[Path]:
    """Write each source to ``directory`` (created if need be); the files written. ``why``
    names what chose the directory, for the error when it cannot be written."""
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for source in sources:
            path = directory / file_name(source, arch)
            path.write_text(source.source, encoding="utf-8")
            written.append(path)
    except OSError as error:
        raise GraphError(f"cannot write generated kernel sources to {directory} ({why}): {error.strerror}") from None
    return written
