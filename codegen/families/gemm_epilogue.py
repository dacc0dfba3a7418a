"""The GEMM family's fused epilogue (folded batch norm, bias, residual, activations...) at each
output element, rendered by codegen.epilogue from the accumulator: per element on the SIMT
path, from a shared-memory staged accumulator tile on the tensor-core paths."""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from .. import epilogue
from ..cuda_types import cuda_type, load, rounded, store
from ..indexing import coordinates, divides, offset, row_major_index
from .gemm_problem import Problem, batch_coords, pixel_coordinates, tensor_core_types
from .tensor_core import zero


class Epilogue:
    """Statements turning the accumulator at output coordinates c0.. into stored outputs."""

    def __init__(
        self,
        fused: FusedNode,
        problem: Problem,
        names: dict[int, str],
        compute: str,
        preloaded: dict[int, str] | None = None,
    ) -> None:
        self.fused, self.problem, self.names, self.compute = fused, problem, names, compute
        self.preloaded = preloaded or {}  # tensor id -> register array indexed by the column slot `e`

    def statements(self, acc: str, vector_slot: str | None = None, vectors: frozenset[int] = frozenset()) -> list[str]:
        """``vectors``: operands already loaded as 8-wide vectors ``in{id}`` (the vector path)."""
        out = self.problem.out
        dims = out.dim

        def load_operand(t: Tensor) -> str:
            if t.is_pass_by_value:
                return f"({self.compute}){self.names[t.id]}"
            if t.id in self.preloaded:
                return f"{self.preloaded[t.id]}[e]"
            if t.id in vectors:
                return load(t.data_type, f"in{t.id}.v[e]", self.compute)
            return load(t.data_type, f"{self.names[t.id]}[{offset(t, dims, 'c')}]", self.compute)

        values = epilogue.Values(self.compute, load_operand, lambda t: row_major_index(t, dims, "c"))
        values.define(out, rounded(out.data_type, acc, self.compute))
        epilogue.apply(self.fused.epilogue, values)
        lines = list(values.statements)
        for t in self.fused.outputs:
            value = store(t.data_type, values.get(t))
            if vector_slot is None:
                lines.append(f"{self.names[t.id]}[{offset(t, dims, 'c')}] = {value};")
            else:
                lines.append(f"r{t.id}.v[{vector_slot}] = {value};")
        return lines


def accumulator_type(p: Problem) -> str:
    """The C type of ``p``'s tensor-core accumulators, and of the staged tile the epilogue reads:
    int for int8 operands (s32, exact), float otherwise."""
    types = tensor_core_types(p)
    return types.accumulator if types is not None else "float"


def epilogue_compute(p: Problem) -> str:
    """The epilogue's compute type: double after an int32 accumulator (every int32 and its
    products with float scales are exact in double, as in the float64 reference), else float."""
    return "double" if accumulator_type(p) == "int" else "float"


def staged_epilogue(
    fused: FusedNode,
    p: Problem,
    names: dict[int, str],
    itype: str,
    c_stride: int,
    aligned: str,
    staging: list[str],
) -> list[str]:
    """Accumulators -> shared memory -> 8 consecutive output columns per thread -> epilogue.

    ``staging`` writes the path's accumulators into the BM x BN tile ``staged`` (rows of
    ``c_stride`` accumulators), after every thread is done with the pipeline's shared memory.
    """
    acc = accumulator_type(p)
    fetch = [
        f"*reinterpret_cast<{acc}4*>(acc8) = *reinterpret_cast<const {acc}4*>(staged + row * {c_stride} + col);",
        f"*reinterpret_cast<{acc}4*>(acc8 + 4) = *reinterpret_cast<const {acc}4*>(staged + row * {c_stride} + col + 4);",
    ]
    return stage_accumulators(staging, acc) + tile_epilogue(fused, p, names, itype, aligned, fetch)


def stage_accumulators(staging: list[str], accumulator: str = "float") -> list[str]:
    """``staging`` (a path's accumulators into the staged tile ``staged`` of ``accumulator``
    elements at the start of shared memory), then a barrier: the tile is whole before anyone
    reads it."""
    return [
        f"{accumulator}* const staged = reinterpret_cast<{accumulator}*>(smem);",
        *staging,
        "__syncthreads();",
    ]


def tile_epilogue(
    fused: FusedNode,
    p: Problem,
    names: dict[int, str],
    itype: str,
    aligned: str,
    fetch: list[str],
    batch_index: str = "blockIdx.z",
    chunks_per_thread: int | None = None,
) -> list[str]:
    """The epilogue of a BM x BN block tile (at ``block_m``, ``block_n``), 8 consecutive output
    columns per thread and chunk: ``fetch`` fills ``acc8[8]`` (``accumulator_type``) with the accumulators of
    tile row ``row``, columns ``col``.. (output row ``m`` < GM), then every output is stored.
    The tensor-core kernels fetch from their staged tile, the split-K reduction sums the
    slices' partial tiles (gemm_splitk.py): one epilogue for both.

    A thread's 8 columns are the same in every chunk it handles (THREADS is a multiple of
    BN/8), so operands that vary only along the columns (batch-norm statistics, biases) are
    loaded into registers once, before the chunk loop.

    ``chunks_per_thread``: every thread handles exactly that many chunks (BM * BN / 8 a multiple
    of THREADS). Full-size operands (a residual, SwiGLU's other half) are then loaded for all of
    a thread's chunks before the first is used, so their memory latencies overlap instead of
    adding up chunk after chunk.
    """
    compute = epilogue_compute(p)
    out = p.out
    rank = len(out.dim)
    wgrad = p.node.op == "conv_wgrad"
    column_axis = 1 if p.image_output or wgrad else rank - 1
    coordinate = "c"
    column = f"{coordinate}{column_axis}"
    # The chunk's first column and column e's coordinate: a wgrad column is (taps, channel), the
    # 8 columns of a chunk one tap and 8 consecutive channels where C % 8 == 0; else each column
    # finds its own (an image gathered element by element, gemm_wgrad_gather.py).
    first_column, column_e = ("w1", "w1 + e") if wgrad else ("(block_n + col)", "block_n + col + e")
    own_taps = wgrad and out.static_dim[1] % 8 != 0
    column_coords: list[str] = []
    anchor_inputs = {t.id for t in p.node.input_tensors()}  # A, B (and a grouped GEMM's offsets)
    operands = [t for t in fused.inputs if t.id not in anchor_inputs]
    per_column = [
        t
        for t in operands
        if not t.is_pass_by_value
        and all(d == 1 for axis, d in enumerate((1,) * (rank - len(t.dim)) + t.dim) if axis != column_axis)
    ]
    preloaded = {t.id: f"col{t.id}" for t in per_column}
    epi = Epilogue(fused, p, names, compute, preloaded)
    hoisted = [f"{compute} col{t.id}[8];" for t in per_column]
    if per_column:
        hoisted += [
            "#pragma unroll",
            "for (int e = 0; e < 8; ++e) {",
            f"  const int {column} = block_n + (tid % (BN / 8)) * 8 + e;",
            *(
                f"  col{t.id}[e] = {column} < GN ? {load(t.data_type, f'{names[t.id]}[{offset(t, out.dim, coordinate)}]', compute)} : {zero(compute)};"
                for t in per_column
            ),
            "}",
        ]
    # 8 consecutive columns form one aligned 16-byte (or wider) vector of every output when
    # the column stride is 1 and every other stride keeps 8-element alignment.
    vector_ok = not own_taps and all(_columns_contiguous(t, column_axis) for t in fused.outputs)
    if p.image_output:
        coords = pixel_coordinates(p, "m", itype)
    elif wgrad:
        taps = coordinates("(block_n + col)", out.static_dim, (*range(2, rank), 1), "w", "int")
        coords = [f"const {itype} c0 = m;", *taps, *(f"const int c{axis} = w{axis};" for axis in range(2, rank))]
        if own_taps:  # column e's taps and channel, in the loop over e
            taps = coordinates("(block_n + col + e)", out.static_dim, (*range(2, rank), 1), "w", "int")
            column_coords = [*taps, *(f"const int c{axis} = w{axis};" for axis in range(1, rank))]
            coords = [f"const {itype} c0 = m;"]
    else:
        coords = [f"const {itype} c{rank - 2} = m;", *batch_coords(p, itype, batch_index)]
    # Full-size operands laid out like the output (a residual) arrive as one vector too.
    full = [t for t in operands if t.dim == out.dim and _columns_contiguous(t, column_axis)] if vector_ok else []
    vector_ok_here = f"{aligned} && block_n + col + 8 <= GN"

    def vector_load(t: Tensor) -> str:
        first = offset(t, out.dim, "c").replace(column, first_column)
        return f"gd::load_vec<{cuda_type(t.data_type)}, 8>({names[t.id]} + {first})"

    chunk_start = [
        "  const int row = chunk / (BN / 8), col = (chunk % (BN / 8)) * 8;",
        f"  const {itype} m = block_m + row;",
        "  if (m >= GM) continue;",
        *("  " + c for c in coords),
    ]
    prefetch = chunks_per_thread is not None and bool(full)
    if prefetch:
        lines = [
            *hoisted,
            *(f"gd::Vec<{cuda_type(t.data_type)}, 8> pre{t.id}[{chunks_per_thread}];" for t in full),
            "#pragma unroll",
            f"for (int i = 0; i < {chunks_per_thread}; ++i) {{",
            "  const int chunk = tid + i * THREADS;",
            *chunk_start,
            f"  if ({vector_ok_here}) {{",
            *(f"    pre{t.id}[i] = {vector_load(t)};" for t in full),
            "  }",
            "}",
            "#pragma unroll",
            f"for (int i = 0; i < {chunks_per_thread}; ++i) {{",
            "  const int chunk = tid + i * THREADS;",
        ]
    else:
        lines = [*hoisted, "for (int chunk = tid; chunk < BM * BN / 8; chunk += THREADS) {"]
    lines += [*chunk_start, f"  {accumulator_type(p)} acc8[8];", *("  " + line for line in fetch)]
    if vector_ok:
        results = [f"gd::Vec<{cuda_type(t.data_type)}, 8> r{t.id};" for t in fused.outputs]
        stores = []
        for t in fused.outputs:
            first_offset = offset(t, out.dim, "c").replace(column, first_column)
            stores.append(f"gd::store_vec<{cuda_type(t.data_type)}, 8>({names[t.id]} + {first_offset}, r{t.id});")
        vector_loads = [
            f"const gd::Vec<{cuda_type(t.data_type)}, 8> in{t.id} = {f'pre{t.id}[i]' if prefetch else vector_load(t)};"
            for t in full
        ]
        lines += [
            f"  if ({vector_ok_here}) {{",
            *("    " + line for line in results + vector_loads),
            "#pragma unroll",
            "    for (int e = 0; e < 8; ++e) {",
            f"      const int {column} = {column_e};",
            *(
                "      " + line
                for line in epi.statements("acc8[e]", vector_slot="e", vectors=frozenset(t.id for t in full))
            ),
            "    }",
            *("    " + line for line in stores),
            "    continue;",
            "  }",
        ]
    lines += [
        "#pragma unroll",
        "  for (int e = 0; e < 8; ++e) {",
        *([] if own_taps else [f"    const int {column} = {column_e};"]),
        f"    if ({'block_n + col + e' if wgrad else column} >= GN) break;",
        *("    " + line for line in column_coords),
        *("    " + line for line in epi.statements("acc8[e]")),
        "  }",
        "}",
    ]
    return lines


def _columns_contiguous(t: Tensor, column_axis: int) -> bool:
    """8 consecutive columns of ``t`` form one aligned vector: column stride 1, and every other
    stride keeps 8-element alignment."""
    return t.stride[column_axis] == 1 and all(
        divides(s, 8) for axis, s in enumerate(t.stride) if axis != column_axis and t.dim[axis] != 1
    )
