"""Target architectures: what users write for one, and the default (the current GPU's).

Kernels compile to cubin for one ``sm_XY``; a cubin runs on GPUs of the same major
version and an equal or higher minor one (sm_80 code runs on sm_86, not on sm_90).
"""

from __future__ import annotations

import re

from .errors import GraphError

DEFAULT_ARCH = 90  # the target when no GPU is present to ask
# Architectures NVRTC 13.0 compiles for (nvrtcGetSupportedArchs; sm_75 Turing to sm_121): what the
# command line accepts as a target.
TARGETS = (75, 80, 86, 87, 88, 89, 90, 100, 103, 107, 110, 120, 121)
# SMs of the target's largest part (A100, H100/H200 SXM), for launch heuristics that size grids
# to the GPU; on a part with fewer the extra blocks start as others finish (correct, a longer tail).
SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132}
DEFAULT_SMS = 132  # a target not listed: a Hopper's count


def parse_arch(arch: str | int | None) -> int:
    """'sm_90' / 'sm_90a' / '90' / 90 -> 90; None -> the default target (sm_90)."""
    if arch is None:
        return DEFAULT_ARCH
    if isinstance(arch, int) and not isinstance(arch, bool):
        return arch
    found = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3})a?", str(arch).strip())
    if not found:
        raise GraphError(f"unknown target architecture {arch!r}; expected e.g. 'sm_80' or 'sm_90'")
    return int(found.group(1))


def parse_target(arch: str) -> int:
    """What the command line accepts as ``--arch``: :func:`parse_arch`, and one of TARGETS."""
    parsed = parse_arch(arch)
    if parsed not in TARGETS:
        known = ", ".join(arch_name(a) for a in TARGETS)
        raise GraphError(f"{arch_name(parsed)} is not a target NVRTC compiles for; choose one of {known}")
    return parsed


def sm_count(arch: int) -> int:
    return SM_COUNT.get(arch, DEFAULT_SMS)


def arch_name(arch: int) -> str:
    return f"sm_{arch}"


def resolve_arch(arch: str | int | None) -> int:
    """An explicit target as given; None: the current GPU's, else sm_90 (no GPU present).

    Only the None case asks the driver, so the import is here: compiling for a named target
    never loads the runtime (which stays out of the compile path's module-level imports).
    """
    if arch is not None:
        return parse_arch(arch)
    from .runtime.driver import current_gpu_arch

    found = current_gpu_arch()
    return DEFAULT_ARCH if found is None else found


def runs_on(code_arch: int, device_arch: int) -> bool:
    """True when a cubin built for ``code_arch`` can run on a GPU of ``device_arch``."""
    return code_arch // 10 == device_arch // 10 and code_arch % 10 <= device_arch % 10
