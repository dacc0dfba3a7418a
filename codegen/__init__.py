"""CUDA C++ generation per fused-node family, and NVRTC compilation to cubin.

The emit stage (``emit_partition``, ``emitter``) is imported on first use: it pulls in
fusion_rules, which reading ``codegen.nvrtc`` (the compile options and NVRTC version
that the plan-cache key records) must not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .kernel import FusedProgram, Kernel, Param, ParamKind, Scratch
from .nvrtc import CompileError, compile_cubin, nvrtc_version

if TYPE_CHECKING:
    from .emit import emit_partition, emitter

__all__ = [
    "CompileError",
    "FusedProgram",
    "Kernel",
    "Param",
    "ParamKind",
    "Scratch",
    "compile_cubin",
    "emit_partition",
    "emitter",
    "nvrtc_version",
]


def __getattr__(name: str) -> Any:
    if name in ("emit_partition", "emitter"):
        from . import emit

        return getattr(emit, name)
    raise AttributeError(f"module 'codegen' has no attribute {name!r}")
