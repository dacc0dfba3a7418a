"""NVRTC compilation to cubin through cuda.core, for an explicit target; no GPU needed."""

from __future__ import annotations

import re
from functools import cache

from graphdnn.env import env_flag
from graphdnn.errors import GraphError

from .cubin import exports

# Precise math (the fp32 tests compare at 1e-5); -O3 device code; C++17.
COMPILE_OPTIONS: tuple[tuple[str, object], ...] = (("std", "c++17"), ("device_code_optimize", True))


class CompileError(GraphError):
    """NVRTC rejected a generated kernel: carries the log and the offending source lines."""


@cache
def include_paths() -> tuple[str, ...]:
    """Directories holding cuda_fp16.h and friends (from the nvidia-cuda-runtime wheel)."""
    from cuda import pathfinder

    found = pathfinder.find_nvidia_header_directory("cudart")
    if found is None:
        raise CompileError("CUDA headers not found: install the nvidia-cuda-runtime package (cuda_fp16.h, cuda_bf16.h)")
    return (str(found),)


@cache
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    result, major, minor = nvrtc.nvrtcVersion()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"cannot query the NVRTC version: {result}")
    return f"{major}.{minor}"


def compile_options() -> tuple[tuple[str, object], ...]:
    """COMPILE_OPTIONS, plus ``lineinfo`` under GRAPHDNN_LINEINFO=1: source-line tables in the
    cubin for Nsight Compute and compute-sanitizer (the machine code stays the same); plus
    ``-Ofast-compile=mid -minimal`` under GRAPHDNN_FAST_COMPILE=1: NVVM and ptxas spend less
    effort and the front end leaves out the CUDA runtime's device API (which no generated
    kernel calls), so a check that every kernel compiles takes about half the time, and the
    kernels may run slower (the front end and ptxas still check the source and its inline PTX)."""
    return (
        COMPILE_OPTIONS
        + ((("lineinfo", True),) if env_flag("GRAPHDNN_LINEINFO") else ())
        + ((("ofast_compile", "mid"), ("minimal", True)) if env_flag("GRAPHDNN_FAST_COMPILE") else ())
    )


def options_key() -> str:
    """The compile options, as the plan-cache key records them (read at each key: the switch
    may change within a process, and a cubin with line tables is another entry)."""
    return ";".join(f"{name}={value}" for name, value in compile_options())


def compile_cubin(source: str, name: str, arch: int, arch_suffix: str = "") -> bytes:
    """Compile one kernel source to a cubin for sm_<arch><arch_suffix> (suffix "a": the
    arch-specific target, e.g. sm_90a for wgmma); raise CompileError with context.

    NVRTC reads the source as a C string, so a NUL would silently cut it short: such a
    source is refused, and every cubin must define ``name`` before it is returned."""
    from cuda.core import Program, ProgramOptions
    from cuda.core._utils.cuda_utils import NVRTCError

    target = f"sm_{arch}{arch_suffix}"
    if "\0" in source:
        line = source.count("\n", 0, source.index("\0")) + 1
        raise CompileError(f"kernel '{name}': the generated source holds a NUL character (line {line}); not compiled")
    options = ProgramOptions(
        name=f"{name}.cu", arch=target, include_path=list(include_paths()), **dict(compile_options())
    )
    try:
        program = Program(source, code_type="c++", options=options)
        try:
            code = program.compile("cubin").code
        finally:
            program.close()
    except NVRTCError as error:
        raise CompileError(
            f"NVRTC could not compile kernel '{name}' for {target}:\n{_explain(str(error), source)}"
        ) from None
    cubin = bytes(code)
    if not exports(cubin, name):
        raise CompileError(f"NVRTC compiled kernel '{name}' for {target}, but the cubin does not export '{name}'")
    return cubin


def _explain(log: str, source: str) -> str:
    """The log, followed by the generated lines each error points at (with 2 lines of context)."""
    lines = source.splitlines()
    shown = [log.strip()]
    for number in sorted({int(n) for n in re.findall(r"\.cu\((\d+)\): error", log)})[:5]:
        start, stop = max(number - 3, 0), min(number + 2, len(lines))
        excerpt = "\n".join(f"{'>' if i + 1 == number else ' '} {i + 1:5d} | {lines[i]}" for i in range(start, stop))
        shown.append(f"generated source around line {number}:\n{excerpt}")
    return "\n".join(shown)
