"""``moe_grouped_matmul`` on tensor cores. On sm_90, the warp-specialised TMA engine
(gemm_ws.py) over a persistent schedule of the grouped tiles (gemm_grouped_ws.py); elsewhere,
and where TMA cannot describe the operands, the GEMM family's mma.sync kernel (gemm_mma.py; or
when tuned so the cp.async-fed wgmma one, gemm_sm90.py) with its loaders, pipeline and staged
epilogue, over blocks that find their expert, row tile and column tile from the offsets on
the GPU (gemm_grouped_block.py). Either way: one launch for every expert, nothing for an
expert without rows, ragged row tiles predicated, rows no expert holds written as zeros.

It takes fp16 or bf16 token and weight (the same type, fp32 accumulation, float compute) from
sm_80 on, with token K-contiguous and the weight's rows either N- or K-contiguous, every
other stride and the contiguous extent in 16-byte chunks (K and N multiples of 8 for an
[E, K, N] row-major weight): what the GEMM family's loaders read. Everything else (fp32,
fp8 and integer operands, a double compute type, other layouts) stays on the direct
family's SIMT kernel (direct_moe.py), correct for any input and many times slower;
``simt_reason`` says why, and the compile log records it.

Tuning (``graphdnn.compile(tuning={node: ...})``; ``candidates`` lists them): ``{"path":
"simt"}``, ``{"path": "mma", "block_m", "block_n", "stages"}`` (a gemm_mma tile), ``{"path":
"wgmma", ...}`` (sm_90, a gemm_sm90 tile) or ``{"path": "ws", "block_n", "stages"}`` (sm_90, an
engine tile: 128 rows, ``gemm_ws.tiles``). The default on sm_90 is the engine (``ws_choice``);
elsewhere mma.sync with 128 x 128 tiles, 64 rows high when the experts average under 256 rows
(a ragged last tile wastes less) and 64 wide when N <= 64.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Node

from ..context import EmitContext
from ..kernel import Kernel
from . import gemm_ws as ws
from .gemm_grouped_block import GroupedBlock
from .gemm_grouped_ws import GroupedSchedule
from .gemm_mma import TILE_CANDIDATES, TileConfig, mma_kernel
from .gemm_problem import Problem, tensor_core_layout
from .gemm_sm90 import ARCH as WGMMA_ARCH
from .gemm_sm90 import TILES as WGMMA_TILES
from .gemm_sm90 import wgmma_kernel
from .tensor_core import TENSOR_CORE_TYPES

LOG = logging.getLogger("graphdnn.compile")
PATHS = ("simt", "mma", "wgmma", "ws")
# The engine's 128 x 256 tile's time in 128 x 128 ones', for ``ws_choice``'s count of waves:
# fitted to benchmarks/grouped_gemm.py on an H100 (benchmarks/RESULTS.md, issue 12), where it
# picks the faster tile in 4 of the 5 cases (the fifth 3.5% slower) and the wider tile's flat
# choice lost 11% at 8 experts x 4096 tokens (3.1 waves of wide tiles, 5.7 of narrow ones).
WIDE_TILE_COST = 1.55
WS_KEYS = frozenset({"path", "block_n", "stages"})


def grouped_problem(node: Node) -> Problem:
    """The node as the GEMM family sees one expert's product: A = token [S, K], B = weight [K, N]
    of the block's expert (its batch offset is the block's), M = S rows at most (a token of the
    frontend's form, [1, S, K], is the same matrix: its unit axis has no offset)."""
    token, weight, out = node.input("token"), node.input("weight"), node.output("output")
    assert token is not None and weight is not None and out is not None
    rows, k = token.static_dim[-2:]
    return Problem(node, token, weight, out, rows, weight.static_dim[2], k, 1, ())


def simt_reason(p: Problem, arch: int, compute: str) -> str | None:
    """Why the grouped matmul ``p`` runs on the SIMT kernel on sm_``arch`` with ``compute`` (the
    C type its node asks to compute in), or None when the tensor cores take it."""
    token, weight = p.a, p.b
    name = f"moe_grouped_matmul '{p.node.name}'"
    if token.data_type not in TENSOR_CORE_TYPES or weight.data_type is not token.data_type:
        return (
            f"{name} multiplies {token.data_type.value} by {weight.data_type.value}: the tensor-core path takes "
            "fp16 or bf16 token and weight of the same type"
        )
    if arch < 80:
        return f"{name}: the tensor-core path needs sm_80 or later (mma.sync bf16/fp16), the target is sm_{arch}"
    if compute != "float":
        return f"{name} asks for {compute} compute; the tensor cores accumulate in fp32"
    if tensor_core_layout(p) is None:
        return (
            f"{name}: token '{token.name}' (dims {list(token.dim)}, strides {list(token.stride)}) and weight "
            f"'{weight.name}' (dims {list(weight.dim)}, strides {list(weight.stride)}) are not in 16-byte chunks: the "
            "tensor cores need token stride 1 along K, weight stride 1 along K or N, the contiguous extents (K, and N "
            "when N-contiguous) and every other stride multiples of 8"
        )
    return None


def default_choice(p: Problem, arch: int) -> dict[str, object]:
    """The path and tile without tuning (module docstring)."""
    if ws.supported(p, arch):
        return ws_choice(p, arch)
    experts = p.b.static_dim[0]
    block_m = 128 if p.m >= 256 * experts else 64
    block_n = 64 if p.n <= 64 else 128
    tile = next(t for t in TILE_CANDIDATES if (t.block_m, t.block_n) == (block_m, block_n))
    return {"path": "mma", "block_m": block_m, "block_n": block_n, "stages": tile.stages}


def grouped_kernel(fused: FusedNode, ctx: EmitContext, node: Node, compute: str) -> Kernel | None:
    """The tensor-core kernel of the grouped matmul ``node`` (the choice ``ctx.tuning``, else the
    default), or None when it stays on the SIMT kernel (``{"path": "simt"}``, or ``simt_reason``)."""
    p = grouped_problem(node)
    choice: Mapping[str, object] = ctx.tuning
    path = choice.get("path")
    if path is not None and path not in PATHS:
        raise UnsupportedError(
            f"grouped matmul tuning {dict(choice)}: path must be one of {', '.join(PATHS)}", node=node.name
        )
    if path == "simt":
        return None
    reason = simt_reason(p, ctx.arch, compute)
    if reason is not None:
        if path is not None:
            raise UnsupportedError(f"grouped matmul tuning {dict(choice)}: {reason}", node=node.name)
        LOG.info("%s; it runs on the SIMT kernel", reason)
        return None
    if path is None:
        choice = default_choice(p, ctx.arch)
        ctx = dataclasses.replace(ctx, tuning=dict(choice))  # the wgmma kernel reads its tile there
    if choice["path"] == "ws":
        return _ws_kernel(fused, ctx, p, choice)
    if choice["path"] == "wgmma":
        if ctx.arch != WGMMA_ARCH:
            raise UnsupportedError(
                f"grouped matmul tuning {dict(choice)}: wgmma needs sm_90, the target is sm_{ctx.arch}", node=node.name
            )
        return wgmma_kernel(fused, ctx, p, 1, GroupedBlock)
    tile = TileConfig(int(choice["block_m"]), int(choice["block_n"]), int(choice["stages"]))  # type: ignore[call-overload]
    if tile not in TILE_CANDIDATES:
        raise UnsupportedError(
            f"grouped matmul tuning {dict(choice)}: the mma.sync tiles are "
            + ", ".join(f"{t.block_m}x{t.block_n} ({t.stages} stages)" for t in TILE_CANDIDATES),
            node=node.name,
        )
    return mma_kernel(fused, ctx, p, tile, 1, GroupedBlock)


def ws_choice(p: Problem, arch: int) -> dict[str, object]:
    """The engine's tile for ``p`` (the deepest ring): of 128 x 128 and 128 x 256, the one whose
    waves of tiles over the SMs take less time, a wide tile's time WIDE_TILE_COST narrow ones'.
    The row tiles are those of rows routed evenly: S / 128, and half a ragged tile per expert
    (``expected_row_tiles``); the units run in waves of one per SM, the last one full or not."""
    sms, rows = sm_count(arch), expected_row_tiles(p)

    def waves(block_n: int) -> int:
        return -(-rows * -(-p.n // block_n) // sms)

    wide = waves(256) * WIDE_TILE_COST < waves(128)
    return dict(ws.tiles(256 if wide else 128)[0])


def expected_row_tiles(p: Problem) -> int:
    """Row tiles of 128 for S rows over E experts of about S / E rows each: S / 128, and half a
    tile more per expert that holds rows (its last tile is ragged, half full on average)."""
    return -(-p.m // ws.BLOCK_M) + min(p.b.static_dim[0], p.m) // 2


def candidates(p: Problem, arch: int, compute: str) -> list[dict[str, object]]:
    """Every tensor-core choice for ``p`` on sm_``arch`` (none where ``simt_reason`` says so): the
    mma.sync tiles, on sm_90 the wgmma tiles and the engine's where TMA can describe the operands."""
    if simt_reason(p, arch, compute) is not None:
        return []
    mma: list[dict[str, object]] = [
        {"path": "mma", "block_m": t.block_m, "block_n": t.block_n, "stages": t.stages} for t in TILE_CANDIDATES
    ]
    if arch != WGMMA_ARCH:
        return mma
    wgmma: list[dict[str, object]] = [
        {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages} for bm, bn, stages in WGMMA_TILES
    ]
    engine = [dict(c) for bn in ws.BLOCK_NS for c in ws.tiles(bn)] if ws.supported(p, arch) else []
    return mma + wgmma + engine


def _ws_kernel(fused: FusedNode, ctx: EmitContext, p: Problem, choice: Mapping[str, object]) -> Kernel:
    """The engine's kernel for the tuning ``choice`` (its tile checked by ``ws.ws_kernel``)."""
    if not ws.supported(p, ctx.arch) or set(choice) - WS_KEYS:
        raise UnsupportedError(
            f"grouped matmul tuning {dict(choice)}: the warp-specialised engine takes keys {sorted(WS_KEYS)} "
            f"on sm_90 with operands TMA can describe, the target is sm_{ctx.arch}",
            node=p.node.name,
        )
    return ws.ws_kernel(fused, dataclasses.replace(ctx, tuning=dict(choice)), p, GroupedSchedule(p))
