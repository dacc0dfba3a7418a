"""What the tensor-core depthwise and small-group kernels share (grouped_conv_mma.py: forward,
wgrad_mma.py: weight gradient): a block's warps, its im2col tile in shared memory and the
ldmatrix addresses into it.

A run of 8 channels (16 bytes) is an mma's n (or, in the weight gradient, its rows' channels).
A block takes RB = min(8, runs) consecutive runs (blockIdx.y picks them) and, per step, P = 16 x
``tiles`` consecutive output pixels; warp w takes run w % RB and, when RB < 8, every S-th tile
of the step (S = 8 / RB slots). The step's image is staged as im2col: [tap][pixel][run], a
16-byte chunk per (tap, pixel, run), each thread copying one (pixel, run)'s chunks at every tap
with cp.async (zeros outside the image; element by element where the runtime's ``aligned``
flag is 0), so that a warp's copies at a tap read RB x 16 contiguous bytes of 4 pixels: few
cache lines a request. (A first version loaded the mma fragments straight from the image, a
lane's 16 bytes at its own pixel and tap: about 20 cache lines a request, 0.6-0.7x cuDNN.)
A pixel's row of chunks is ROW bytes (RB rounded up to a power of two, x 16), its chunk c
stored at c ^ (pixel % chunks), so that the 8 rows an ldmatrix reads (8 pixels, one run) fall
in distinct banks. The filter's taps are padded to an even count with a tap of zeros
(written once), so that mmas take taps in pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvAttributes

from ..cuda_types import cuda_type
from ..indexing import offset_at
from .channel_runs import STAGED_BYTES, run_width
from .tensor_core import TENSOR_CORE_TYPES

WARPS = 8
THREADS = 32 * WARPS
TILE = 16  # output pixels of an mma tile
RUN = 8  # channels of a run: 16 bytes of fp16/bf16


@dataclass(frozen=True)
class Blocks:
    """A grid of ``blocks`` x ``chunks`` blocks of WARPS warps: ``width`` runs a block (RB),
    ``slots`` warps a run, ``tiles`` tiles a warp per step of ``pixels`` pixels, ``steps`` steps
    a block (the last ones partly past the image)."""

    runs: int
    width: int
    slots: int
    chunks: int
    tiles: int
    pixels: int
    blocks: int
    steps: int
    taps: int  # padded to an even count
    row: int  # bytes of a pixel's chunks in shared memory
    extra: int  # bytes staged after the im2col tile (the weight gradient's dy)
    stages: int  # tiles in shared memory: 2 stages the next step's during this one's products

    @property
    def tap_bytes(self) -> int:
        return self.pixels * self.row

    @property
    def buffer_bytes(self) -> int:
        return self.taps * self.tap_bytes + self.extra

    @property
    def shared_bytes(self) -> int:
        return self.stages * self.buffer_bytes


def blocks_of(
    channels: int, taps: int, pixels: int, tiles: int, per_sm: int, stages: int, arch: int, extra_rows: int = 0
) -> Blocks | None:
    """The grid for ``channels`` channels, ``taps`` filter taps and ``pixels`` output pixels at
    ``tiles`` tiles a warp, ``per_sm`` blocks per SM and ``stages`` tiles in shared memory; None
    where they do not fit (``extra_rows``: rows staged besides the image's taps)."""
    runs = channels // RUN
    width = min(WARPS, runs)
    slots = WARPS // width
    chunks = -(-runs // width)
    step = TILE * tiles * slots
    row = RUN * 2 * (1 << (width - 1).bit_length())
    padded = taps + taps % 2
    if stages * (padded + extra_rows) * step * row > STAGED_BYTES:
        return None
    steps_total = -(-pixels // step)
    blocks = max(1, min(sm_count(arch) * per_sm // chunks, steps_total))
    steps = -(-steps_total // blocks)
    blocks = -(-steps_total // steps)
    return Blocks(runs, width, slots, chunks, tiles, step, blocks, steps, padded, row, extra_rows * step * row, stages)


def fitting(
    blocks: Callable[[int], Blocks | None],
    tiles: int,
    stages: int,
    tuning: Mapping[str, object],
    what: str,
    node: str,
) -> Blocks:
    """``blocks(tiles)``, or, where the tuning does not set ``tiles``, the most tiles a warp below
    that fit in shared memory; an error naming ``node`` where none fits."""
    b = blocks(tiles)
    while b is None and tiles > 1 and "tiles" not in tuning:
        tiles -= 1
        b = blocks(tiles)
    if b is None:
        raise UnsupportedError(
            f"{what} tuning {dict(tuning)}: {stages} x {tiles} tiles a warp do not fit in shared memory", node=node
        )
    return b


def takes_mma_types(x: Tensor, dims: int) -> bool:
    """fp16 or bf16 with runs of 8 channels, 2-d."""
    return x.data_type in TENSOR_CORE_TYPES and run_width(x.data_type) == RUN and dims == 4


def warp_roles(b: Blocks) -> list[str]:
    """lane, g, t, warp; c (the warp's run in the block), slot, run, live."""
    return [
        "const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;",
        f"const int c = warp % {b.width}, slot = warp / {b.width}, run = blockIdx.y * {b.width} + c;",
        f"const bool live = slot < {b.slots} && run < {b.runs};",
    ]


def declare_tile(b: Blocks, taps: int) -> list[str]:
    """The shared tiles; an odd filter's padding tap zeroed once in each (the steps never copy to it)."""
    lines = [f"__shared__ __align__(128) unsigned char tile[{b.shared_bytes}];"]
    for buffer in range(b.stages if taps < b.taps else 0):
        lines.append(
            f"for (int i = threadIdx.x; i < {b.tap_bytes // 4}; i += {THREADS}) "
            f"reinterpret_cast<unsigned*>(tile + {buffer * b.buffer_bytes + taps * b.tap_bytes})[i] = 0u;"
        )
    return lines


def steps(b: Blocks, itype: str, copies: Callable[[str, str], list[str]], products: list[str]) -> list[str]:
    """The block's loop over its steps: ``copies(first, buffer)`` stages the step whose first
    pixel is ``first`` into the tile at byte ``buffer``; ``products`` read the step ``first``
    from the tile at byte ``buffer``. With 2 stages the next step's copies are in flight
    during this one's products."""

    def first(step: str) -> str:
        return f"(({itype})({step}) * {b.blocks} + blockIdx.x) * {b.pixels}"

    if b.stages == 1:
        return [
            "#pragma unroll 1",
            f"for (int it = 0; it < {b.steps}; ++it) {{",
            f"  const {itype} first = {first('it')};",
            "  const int buffer = 0;",
            "  __syncthreads();  // the previous step's reads of the tile",
            *("  " + line for line in copies("first", "buffer")),
            f"  {COMMIT}",
            f"  {WAIT.format(0)}",
            "  __syncthreads();",
            *("  " + line for line in products),
            "}",
        ]
    return [
        "{",
        "  const int buffer = 0;",
        f"  const {itype} first = {first('0')};",
        *("  " + line for line in copies("first", "buffer")),
        f"  {COMMIT}",
        "}",
        "#pragma unroll 1",
        f"for (int it = 0; it < {b.steps}; ++it) {{",
        f"  const {itype} first = {first('it')};",
        f"  const int buffer = it % 2 * {b.buffer_bytes};",
        f"  if (it + 1 < {b.steps}) {{  // the next step, into the other buffer (read in the previous step)",
        f"    const {itype} next = {first('it + 1')};",
        *("    " + line for line in copies("next", f"{b.buffer_bytes} - buffer")),
        "  }",
        f"  {COMMIT}  // an empty group after the last step: one group a step",
        f"  {WAIT.format(1)}",
        "  __syncthreads();",
        *("  " + line for line in products),
        "  __syncthreads();  // the reads of this buffer, before the next step copies into it",
        "}",
    ]


COMMIT = 'asm volatile("cp.async.commit_group;\\n" ::);'
WAIT = 'asm volatile("cp.async.wait_group {};\\n" ::: "memory");'


def copies(
    b: Blocks,
    x: Tensor,
    x_name: str,
    a: ConvAttributes,
    out: tuple[int, int, int],
    taps_w: int,
    taps: int,
    itype: str,
    aligned: str,
    first: str,
    buffer: str,
    loss: tuple[Tensor, str] | None = None,
) -> list[str]:
    """Statements copying the pixels from ``first`` on into the tile at byte ``buffer`` (and,
    with ``loss``, dy's chunks of the same pixels after the taps)."""
    n, out_h, out_w = out
    element = cuda_type(x.data_type)
    pixels = n * out_h * out_w
    spread = b.row // 16  # chunks a row

    def chunk(to: str, at: str, inside: str, base: str) -> list[str]:
        return [
            f"if ({aligned}) copy16(smem_addr({to}), {inside} ? {at} : {base}, {inside});",
            "else {",
            "  #pragma unroll",
            f"  for (int j = 0; j < {RUN}; ++j) reinterpret_cast<{element}*>({to})[j] = "
            f"{inside} ? ({at})[j] : {element}(0.0f);",
            "}",
        ]

    image_at = offset_at(x, ["n", "rb * 8", "hi", "wi"])
    per_tap = []
    for f in range(taps):
        r, s = f // taps_w, f % taps_w
        per_tap += [
            "{",
            f"  const {itype} hi = h0 + {r * a.dilation[0]}, wi = w0 + {s * a.dilation[1]};",
            f"  const bool inside = ok && hi >= 0 && hi < {x.static_dim[2]} && wi >= 0 && wi < {x.static_dim[3]};",
            *("  " + line for line in chunk(f"row + {f * b.tap_bytes}", f"{x_name} + ({image_at})", "inside", x_name)),
            "}",
        ]
    if loss is not None:
        dy, dy_name = loss
        per_tap += chunk(
            f"row + {b.taps * b.tap_bytes}", f"{dy_name} + ({offset_at(dy, ['n', 'rb * 8', 'p', 'q'])})", "ok", dy_name
        )
    return [
        f"for (int e = threadIdx.x; e < {b.pixels * b.width}; e += {THREADS}) {{",
        f"  const int cc = e % {b.width}, px = e / {b.width};",
        f"  const int rb = blockIdx.y * {b.width} + cc;",
        f"  const {itype} m = {first} + px;",
        f"  const bool ok = m < {pixels} && rb < {b.runs};",
        f"  const {itype} q = m % {out_w}, p = m / {out_w} % {out_h}, n = m / {out_w * out_h};",
        f"  const {itype} h0 = p * {a.stride[0]} - {a.pre_padding[0]}, w0 = q * {a.stride[1]} - {a.pre_padding[1]};",
        f"  unsigned char* const row = tile + {buffer} + px * {b.row} + (cc ^ px % {spread}) * 16;",
        *("  " + line for line in per_tap),
        "}",
    ]


def matrix_row(b: Blocks, pixel: str, tap: str) -> str:
    """The address of the warp's run's chunk at pixel ``pixel`` and tap ``tap`` of the tile at
    byte ``buffer`` (an ldmatrix row)."""
    return f"smem_addr(tile + buffer + ({tap}) * {b.tap_bytes} + ({pixel}) * {b.row} + (c ^ ({pixel}) % {b.row // 16}) * 16)"


def taps_of(w: Tensor) -> int:
    return math.prod(w.static_dim[2:])
