"""What codegen hands to the runtime: kernels with their launch shape and parameters.

A static graph's dims are part of its signature, so its kernels' dims, strides, grid and
block are compile-time constants; at run time only pointers and pass-by-value scalars
change. A dynamic graph's kernels (the families that take runtime extents) read each
symbol from an EXTENT parameter and launch a :class:`DynamicGrid`; their static dims stay
constants. A parameter is an 8-byte word (a pointer, a double for a runtime scalar, a
64-bit flag or extent) or a TMA tensor map (TENSOR_MAP_WORDS words, which the
driver encodes at bind time from the tensor's address), so argument packing stays a flat
array of words.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from graphdnn.program import TensorMap
from graphdnn.symbolic import Extent, Sym, Symbol

if TYPE_CHECKING:
    from graphdnn.ir import Tensor


class ParamKind(enum.Enum):
    TENSOR = "tensor"  # device pointer of a graph tensor (input, output or workspace intermediate)
    SCALAR = "scalar"  # value of a pass-by-value runtime scalar, as a double
    SCRATCH = "scratch"  # device pointer of a scratch buffer of the fused node
    ALIGNED = "aligned"  # 1 if every pointer of the launch is aligned to the kernel's vector size
    TENSOR_MAP = "tensor_map"  # a TMA tensor map of a graph tensor (gd::TensorMapArg in the kernel)
    EXTENT = "extent"  # a symbol's value in this call, as a long long (codegen.indexing.c_extent names it)


@dataclass(frozen=True)
class Param:
    kind: ParamKind
    tensor: int | None = None  # tensor id for TENSOR, SCALAR and TENSOR_MAP (of a graph tensor)
    scratch: str | None = None  # scratch buffer name for SCRATCH and TENSOR_MAP of scratch
    tensor_map: TensorMap | None = None  # TENSOR_MAP (its sizes at the symbols' maxima)
    symbol: Symbol | None = None  # EXTENT
    # TENSOR_MAP of a dynamic graph's tensor: the map's dims, then its byte strides, as extents
    # (lowering makes the symbolic ones TensorMap.symbolic); () when they are static
    map_sizes: tuple[Extent, ...] = ()


@dataclass(frozen=True)
class DynamicGrid:
    """The grid of a kernel whose work depends on symbols: ``ceil(count / per_block) *
    multiplier * times`` blocks, at least 1 and at most ``cap``, along ``grid_axis`` (0: x, 2:
    z), computed at each launch. ``times``: symbols whose values multiply the rounded count (an
    attention prefill's symbolic batch beside its symbolic Sq: ``ceil(Sq / rows) * heads * batch``)."""

    count: Sym
    per_block: int
    cap: int
    grid_axis: int = 0
    multiplier: int = 1
    times: tuple[Symbol, ...] = ()


@dataclass(frozen=True)
class SizeBucket:
    """The sizes a dynamic graph's kernel variant serves: it runs when ``low <= count <= high``
    at the call's symbol values; its launch choices are the static plan's at ``high``
    (codegen.buckets)."""

    count: Sym
    low: int
    high: int


def param_name(tensor: Tensor) -> str:
    """A tensor's parameter name in every kernel: s<id> for a runtime scalar (a double), t<id> for
    a pointer (generated names are renumbered after emission, consistently)."""
    return f"s{tensor.id}" if tensor.is_pass_by_value else f"t{tensor.id}"


@dataclass(frozen=True)
class Scratch:
    """Workspace a fused node needs besides its tensors (e.g. partial sums)."""

    name: str
    bytes: int


@dataclass(frozen=True)
class Kernel:
    name: str  # the extern "C" entry point
    source: str
    grid: tuple[int, int, int]  # with ``blocks``: the grid at the symbols' maxima
    block: tuple[int, int, int]
    shared_bytes: int
    params: tuple[Param, ...]
    alignment: int = 16  # bytes the ALIGNED flag checks
    # "a": compile for the arch-specific target sm_XYa (wgmma, setmaxnreg), whose code runs
    # on sm_XY itself only; "": the portable sm_XY target
    arch_suffix: str = ""
    blocks: DynamicGrid | None = None  # grid x computed at launch (a dynamic graph's kernel)
    bucket: SizeBucket | None = None  # one variant of several: the sizes it runs at

    @property
    def body(self) -> str:
        """The source without its header comment: what decides the compiled code (with the target)."""
        return strip_header(self.source)

    @property
    def content_hash(self) -> str:
        """Names the compiled kernel: the body, and the arch-specific target when there is one."""
        digest = hashlib.sha256(self.body.encode())
        if self.arch_suffix:
            digest.update(f"\0target sm_XY{self.arch_suffix}".encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class FusedProgram:
    """The kernels (run in order) and scratch of one fused node. ``aliases`` holds (tensor,
    source) ids of an output stored in its source's memory, so that no kernel writes it (a
    reshape or transpose that leaves every element where it was)."""

    fused: str
    kernels: tuple[Kernel, ...]
    scratch: tuple[Scratch, ...] = ()
    aliases: tuple[tuple[int, int], ...] = ()


HEADER_MARK = "// ---- end of header ----"
HELPERS = (Path(__file__).parent / "include" / "graphdnn.cuh").read_text()


def strip_header(source: str) -> str:
    """The source after the header mark; the last one, as a name in the header may spell the mark."""
    return source.rpartition(HEADER_MARK)[2]


def compose(*, header: str, headers: list[str], body: str) -> str:
    """A complete kernel source: the descriptive comment, includes, helpers, the kernel."""
    includes = "".join(f"#include <{h}>\n" for h in headers)
    comment = "".join(f"// {comment_safe(line)}\n" for line in header.split("\n"))
    return f"{comment}{HEADER_MARK}\n{includes}{HELPERS}\n{body}"


def comment_safe(text: str) -> str:
    """``text`` as printable ASCII that cannot leave a ``//`` comment: names reach the header
    comment, and must never change the code after it. Anything outside printable ASCII, and
    the backslash (which at a line's end would splice the next line into the comment), is
    written ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN``; ``*/`` becomes ``*\\x2f`` so the text
    stays inert inside a block comment as well."""
    escaped = "".join(char if " " <= char <= "~" and char != "\\" else _escape(char) for char in text)
    return escaped.replace("*/", "*\\x2f")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def kernel_name(pattern: str, body: str) -> str:
    """gd_<pattern>_<hash of the body>: identical kernels get identical names everywhere."""
    slug = re.sub(r"[^0-9a-zA-Z]+", "_", pattern).strip("_").lower() or "kernel"
    digest = hashlib.sha256(body.encode()).hexdigest()[:10]
    return f"gd_{slug}_{digest}"
