"""What the two tensor-core GEMM kernels (mma.sync: gemm_mma.py, wgmma: gemm_sm90.py) share: the
block tile, the kernel parameters, the block prelude (constants, shared-memory tiles, thread and
block coordinates, loaders), the staged epilogue and the launch. A path adds its device
functions, its warps' roles, its main loop and how its accumulators reach the staged tile.

A dynamic matmul's M is the runtime value GM (an EXTENT argument) and its grid is computed at
launch: along x (ceil(M / BM) tiles) when only M is symbolic; along z (the batch count) when
the batch is, x then staying at the tiles of the largest M with the blocks past the call's M
returning at once (a launch has one dynamic grid extent)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..indexing import c_extent
from ..kernel import Kernel
from .gemm_epilogue import staged_epilogue
from .gemm_loaders import (
    ASYNC_COPY_PRELUDE,
    SmemTiles,
    a_loader_setup,
    b_loader_setup,
    element_types,
    load_tile_lambda,
)
from .gemm_problem import Problem, batch_offsets, declare, dynamic_grid, index_type_of, tensor_core_layout
from .gemm_splitk import PARTIALS, KSlices, store_partials


@dataclass(frozen=True)
class BlockShape:
    """A block's tile: BM x BN outputs, k tiles of BK elements of ``element_bytes`` bytes through
    STAGES shared-memory buffers, THREADS threads."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    threads: int
    element_bytes: int = 2

    @property
    def a_stage(self) -> int:
        """Bytes of one stage's A tile."""
        return self.block_m * self.block_k * self.element_bytes

    @property
    def b_stage(self) -> int:
        return self.block_n * self.block_k * self.element_bytes

    @property
    def shared_bytes(self) -> int:
        """Shared memory the block uses: the pipeline's stages, then (reused) the staged
        accumulator tile of 4-byte accumulators."""
        return max(self.stages * (self.a_stage + self.b_stage), self.block_m * self.c_stride * 4)

    @property
    def c_stride(self) -> int:
        """Floats per staged accumulator row (+4: fewer bank conflicts, 16-byte rows)."""
        return self.block_n + 4


class TensorCoreBlock:
    """One tensor-core kernel for ``p`` being written: its parameters (declared first, so both
    paths bind them in the same order) and the shared parts of its body. With split-K
    (``slices.split`` > 1) a block walks one K slice and stores its partial tile instead of
    running the epilogue (gemm_splitk.py)."""

    def __init__(self, fused: FusedNode, p: Problem, shape: BlockShape, tiles: SmemTiles, slices: KSlices) -> None:
        layout = tensor_core_layout(p)
        assert layout is not None
        self.fused, self.p, self.shape, self.tiles, self.layout, self.slices = fused, p, shape, tiles, layout, slices
        self.params, self.names = declare(fused, p)
        self.aligned = self.params.aligned_flag()
        if slices.split > 1:
            self.params.scratch(PARTIALS, "float")
        self.itype = index_type_of(fused, p)

    def prelude(self, shared_memory: list[str], warp_roles: str, prefetch: bool = False) -> list[str]:
        """Constants, the A and B tiles in ``smem`` (declared by ``shared_memory``), thread and
        block coordinates (``warp_roles``: what the path's warps compute), and the loaders
        (``prefetch``: a gathered image's through registers, gemm_wgrad_gather.py)."""
        p, s, itype = self.p, self.shape, self.itype
        lines = [
            *element_types(p),
            f"constexpr int BM = {s.block_m}, BN = {s.block_n}, BK = {s.block_k}, STAGES = {s.stages}, THREADS = {s.threads};",
            *self.sizes(),
            *self.slices.setup(),
            *shared_memory,
            "unsigned char* const a_smem = smem;",
            f"unsigned char* const b_smem = smem + STAGES * {s.a_stage};",
            "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
            warp_roles,
            *self.tile_origin(),
        ]
        a_chunks = s.block_m * s.block_k // self.tiles.chunk // s.threads
        b_chunks = s.block_n * s.block_k // self.tiles.chunk // s.threads
        x, w = self.names[p.a.id], self.names[p.b.id]
        lines += a_loader_setup(p, itype, a_chunks, s.threads, self.tiles)
        lines += b_loader_setup(p, itype, b_chunks, s.threads, self.layout, self.tiles)
        lines += load_tile_lambda(
            p,
            x,
            w,
            itype,
            a_chunks,
            b_chunks,
            s.a_stage,
            s.b_stage,
            s.block_n,
            self.layout,
            self.aligned,
            self.tiles,
            self.slices,
            prefetch,
        )
        return lines

    def tile_origin(self) -> list[str]:
        """The block's tile: its first row ``block_m`` and column ``block_n``, and for a matmul the
        batch offsets ``a_base`` / ``b_base`` of its A and B."""
        p, itype = self.p, self.itype
        lines = [f"const {itype} block_m = ({itype})blockIdx.x * BM;", "const int block_n = blockIdx.y * BN;"]
        if p.is_dynamic:
            lines.append("if (block_m >= GM) return;  // a tile past this call's M: the grid is sized for the largest")
        if not p.is_conv and not p.is_grad:
            lines += batch_offsets(p, itype, self.slices.batch_index)
        return lines

    def grid(self) -> tuple[int, int, int]:
        """One block per output tile, batch index and K slice."""
        s, p = self.shape, self.p
        return (-(-p.m // s.block_m), -(-p.n // s.block_n), math.prod(p.batch) * self.slices.split)

    def sizes(self) -> list[str]:
        """GM, GN, GK and KTILES: constants, but GM of a dynamic matmul read from its EXTENT arguments."""
        p, s = self.p, self.shape
        ktiles = -(-p.k // s.block_k)
        if not p.is_dynamic:
            return [f"constexpr int GM = {p.m}, GN = {p.n}, GK = {p.k}, KTILES = {ktiles};"]
        return [
            f"const int GM = (int){c_extent(p.m_extent)};",
            f"constexpr int GN = {p.n}, GK = {p.k}, KTILES = {ktiles};",
        ]

    def epilogue(self, staging: list[str]) -> list[str]:
        """The staged epilogue, after ``staging`` wrote the accumulators into the staged tile;
        with split-K, the staged tile into the partials instead."""
        if self.slices.split > 1:
            return store_partials(self.p, self.shape.c_stride, staging)
        return staged_epilogue(self.fused, self.p, self.names, self.itype, self.shape.c_stride, self.aligned, staging)

    def kernel(
        self, ctx: EmitContext, body: list[str], path: str, device_functions: str, shared: int, arch_suffix: str = ""
    ) -> Kernel:
        """The kernel of ``body``, named after the fused pattern and ``path``, with the loaders' and
        the path's ``device_functions`` before it; one block per output tile, batch index and K slice."""
        s, p, split = self.shape, self.p, self.slices.split
        pattern = pattern_name(self.fused) + path + ("_splitk" if split > 1 else "")
        functions = ASYNC_COPY_PRELUDE + device_functions
        name, source = kernel_source(
            ctx, self.fused, pattern, self.params, s.threads, indent(body, 1), device_functions=functions
        )
        grid = self.grid()
        bindings = tuple(self.params.bindings)
        blocks = dynamic_grid(p, s.block_m)
        return Kernel(
            name,
            source,
            grid,
            (s.threads, 1, 1),
            shared,
            bindings,
            alignment=16,
            arch_suffix=arch_suffix,
            blocks=blocks,
        )
