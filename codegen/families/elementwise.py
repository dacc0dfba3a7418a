"""Elementwise kernels: a fused group of pointwise ops (and folded inference batch norms).

The kernel walks the output elements in the memory order of the first output. When all
full-size tensors are packed in that order, element p lives at offset p in each of them,
so threads move VEC elements with one 16-byte access per tensor (when the pointers are
aligned, which the runtime checks); broadcast operands are indexed through coordinates.
Otherwise, and for the last partial vector, every element is indexed through its
coordinates and each tensor's strides.

In a dynamic graph the symbolic dims and strides are kernel arguments (codegen.indexing),
the element count is their product, and the grid is computed at launch from it.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import packed_strides, stride_order
from graphdnn.symbolic import Sym, upper

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load, store
from ..indexing import c_extent, coordinates, is_full, loop_index_type, offset, row_major_index
from ..kernel import DynamicGrid, FusedProgram, Kernel

THREADS = 256
MAX_BLOCKS = 65535


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    outputs = list(fused.outputs)
    dims = outputs[0].dim
    order = stride_order(dims, outputs[0].stride)
    tensors = [*fused.inputs, *outputs]
    compute = compute_of(tensors)
    packed = packed_strides(dims, order)
    contiguous = [t for t in tensors if not t.is_pass_by_value and is_full(t, dims)]
    vectorizable = all(t.stride == packed for t in contiguous)
    widest = max(t.data_type.itemsize for t in contiguous)
    vec = max(1, 16 // widest) if vectorizable else 1
    numel = outputs[0].numel
    blocks = min(max(1, -(-upper(numel) // (vec * THREADS))), MAX_BLOCKS)
    itype = loop_index_type(tensors, upper(numel), blocks * THREADS)
    # The vectors and the elements after them (numbers, or expressions of the EXTENT arguments).
    vectors = f"{numel // vec}" if isinstance(numel, int) else f"{c_extent(numel)} / {vec}"
    tail = f"{numel // vec * vec}" if isinstance(numel, int) else f"{c_extent(numel)} / {vec} * {vec}"
    params = KernelParams()
    names = {t.id: params.tensor(t) for t in fused.inputs}
    names.update({t.id: params.tensor(t, writable=True) for t in outputs})
    aligned = params.aligned_flag()

    def element(p: str, vector_slot: str | None) -> list[str]:
        """Statements computing and storing element p (in `order`); vector_slot: index into loaded vectors."""
        statements = coordinates(p, dims, order, "c", itype)

        def load_operand(t: Tensor) -> str:
            if t.is_pass_by_value:
                return f"({compute}){names[t.id]}"
            if vector_slot is not None and is_full(t, dims):
                return load(t.data_type, f"a{t.id}.v[{vector_slot}]", compute)
            return load(t.data_type, f"{names[t.id]}[{offset(t, dims, 'c')}]", compute)

        values = epilogue.Values(compute, load_operand, lambda t: row_major_index(t, dims, "c"))
        epilogue.apply(fused.epilogue, values)
        statements += values.statements
        for t in outputs:
            value = values.get(t)
            if vector_slot is not None:
                statements.append(f"r{t.id}.v[{vector_slot}] = {store(t.data_type, value)};")
            else:
                statements.append(f"{names[t.id]}[{offset(t, dims, 'c')}] = {store(t.data_type, value)};")
        return statements

    body = [
        f"const {itype} stride = ({itype})gridDim.x * blockDim.x;",
        f"const {itype} first = ({itype})blockIdx.x * blockDim.x + threadIdx.x;",
        f"{itype} tail = 0;",
    ]
    if vec > 1:
        loads = [
            f"const gd::Vec<{cuda_type(t.data_type)}, {vec}> a{t.id} = gd::load_vec<{cuda_type(t.data_type)}, {vec}>({names[t.id]} + base);"
            for t in fused.inputs
            if not t.is_pass_by_value and is_full(t, dims)
        ]
        results = [f"gd::Vec<{cuda_type(t.data_type)}, {vec}> r{t.id};" for t in outputs]
        stores = [f"gd::store_vec<{cuda_type(t.data_type)}, {vec}>({names[t.id]} + base, r{t.id});" for t in outputs]
        body += [
            f"if ({aligned}) {{",
            f"  for ({itype} v = first; v < {vectors}; v += stride) {{",
            f"    const {itype} base = v * {vec};",
            *("    " + line for line in loads + results),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) {{",
            f"      const {itype} p = base + e;",
            *("      " + line for line in element("p", "e")),
            "    }",
            *("    " + line for line in stores),
            "  }",
            f"  tail = {tail};",
            "}",
        ]
    body += [
        f"for ({itype} p = tail + first; p < {c_extent(numel)}; p += stride) {{",
        *("  " + line for line in element("p", None)),
        "}",
    ]
    name, source = kernel_source(ctx, fused, pattern_name(fused), params, THREADS, indent(body, 1))
    grid = DynamicGrid(numel, vec * THREADS, MAX_BLOCKS) if isinstance(numel, Sym) else None
    kernel = Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings), 16, blocks=grid)
    return FusedProgram(fused.name, (kernel,))
