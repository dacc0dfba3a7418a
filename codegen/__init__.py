"""CUDA C++ generation per fused-node family, and NVRTC compilation to cubin."""

from .emit import emit_partition, emitter
from .kernel import FusedProgram, Kernel, Param, ParamKind, Scratch
from .nvrtc import CompileError, compile_cubin, nvrtc_version

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
