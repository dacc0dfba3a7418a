"""Top-k, the router and the mixture-of-experts movement ops: simple, deterministic kernels.

- ``topk`` and ``moe_router``: one warp per row. Each of the k rounds, every lane scans its
  elements (lane, lane + 32, ...) for the first one in the selection order that comes after
  the element the previous round chose, and the warp keeps the first of those
  (``gd::warp_first``): k passes over the row, no sorting, any row length. The router
  computes each expert's score on the fly (softmax: the row's max and sum first), keeps
  the k chosen scores in registers and renormalises them.
- ``gather``, ``moe_unpermute``: one output element per thread; an index out of range gives
  a zero row (gather) or is skipped (unpermute), as docs/ops.md says.
- ``moe_grouped_matmul``: the tensor-core grouped GEMM (gemm_grouped.py) for fp16 / bf16
  operands in 16-byte chunks from sm_80 on; otherwise one output element per thread (SIMT).
  A row that no expert holds is zero on both.
- ``moe_permutation``: one block; a thread per expert counts its choices, thread 0 turns
  the counts into offsets, then each expert's thread writes its slots in token order.
  Choices of an out-of-range expert get slot -1 and the permuted rows left over token -1.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.moe import GatherAttributes, MoePermutationAttributes
from graphdnn.ops.topk import MoeRouterAttributes, RouterScore, TopkAttributes

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import coordinates, offset_at
from ..kernel import FusedProgram, Scratch
from ..pointwise import literal
from .direct_common import (
    THREADS,
    anchor_of,
    blocks_for,
    compute_for,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    read,
    warp_stride,
    written,
)
from .gemm_grouped import grouped_kernel


def _at(tensor: Tensor, axis: int, along: str) -> str:
    """The offset of the element at coordinates c*, with ``along`` on ``axis``."""
    return offset_at(tensor, [along if d == axis else f"c{d}" for d in range(len(tensor.static_dim))])


def _selection(k: int, key: str, itype: str, extent: int, compute: str) -> list[str]:
    """k rounds of warp selection over elements j < extent, whose key is the expression
    ``key`` (of j); round r leaves its choice in ``best_v``/``best_i`` on every lane and
    runs the statements after it (the caller's ``SELECTED`` marker)."""
    return [
        f"{compute} prev_v = 0;",
        "long long prev_i = -1;",
        f"for (int r = 0; r < {k}; ++r) {{",
        f"  {compute} best_v = 0;",
        "  long long best_i = -1;",
        f"  for ({itype} j = lane; j < {extent}; j += 32) {{",
        f"    const {compute} v = {key};",
        "    if ((prev_i < 0 || gd::ranks_before(prev_v, prev_i, v, (long long)j)) &&",
        "        (best_i < 0 || gd::ranks_before(v, (long long)j, best_v, best_i))) {",
        "      best_v = v;",
        "      best_i = j;",
        "    }",
        "  }",
        "  gd::warp_first(best_v, best_i);",
        "  SELECTED",
        "  prev_v = best_v;",
        "  prev_i = best_i;",
        "}",
    ]


def _with_selected(lines: list[str], selected: list[str]) -> list[str]:
    at = lines.index("  SELECTED")
    return [*lines[:at], *("  " + line for line in selected), *lines[at + 1 :]]


def emit_topk(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x, values, indices = node.input("input"), node.output("values"), node.output("indices")
    a = node.attributes
    assert x is not None and values is not None and indices is not None and isinstance(a, TopkAttributes)
    axis = a.axis % len(x.static_dim)
    rows = x.static_numel // x.static_dim[axis]
    row_dims = tuple(1 if d == axis else extent for d, extent in enumerate(x.static_dim))
    compute, itype = compute_for(fused), loop_index_type([x, values, indices], rows * 32)
    params = KernelParams()
    source = params.tensor(x)
    stores = []
    if written(fused, values):
        name = params.tensor(values, writable=True)
        stores.append(f"if (lane == 0) {name}[{_at(values, axis, 'r')}] = {store(values.data_type, 'best_v')};")
    if written(fused, indices):
        name = params.tensor(indices, writable=True)
        stores.append(f"if (lane == 0) {name}[{_at(indices, axis, 'r')}] = ({cuda_type(indices.data_type)})best_i;")
    key = read(x, source, _at(x, axis, "j"), compute)
    body = [
        *coordinates("row", row_dims, stride_order(x.static_dim, x.static_stride), "c", itype),
        *_with_selected(_selection(a.k, key, itype, x.static_dim[axis], compute), stores),
    ]
    loop = warp_stride("row", rows, itype, body)
    return FusedProgram(fused.name, (make_kernel(ctx, fused, "topk", params, loop, (blocks_for(rows * 32), 1, 1)),))


def emit_router(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """Scores in fp32 with the precise expf; the selection key is the logit, or the score plus
    the bias when there is one, as the reference chooses."""
    node = anchor_of(fused)
    logits, bias = node.input("logits"), node.input("bias")
    weights, indices = node.output("weights"), node.output("indices")
    a = node.attributes
    assert logits is not None and weights is not None and indices is not None
    assert isinstance(a, MoeRouterAttributes)
    experts = logits.static_dim[-1]
    rows = logits.static_numel // experts
    axis = len(logits.static_dim) - 1
    itype = loop_index_type([logits, weights, indices], rows * 32)
    params = KernelParams()
    source = params.tensor(logits)
    logit = read(logits, source, _at(logits, axis, "j"), "float")
    body = coordinates("row", (*logits.static_dim[:-1], 1), range(len(logits.static_dim)), "c", itype)
    if a.score_function is RouterScore.SOFTMAX:
        body += [
            f"float top = {literal(float('-inf'), 'float')};",
            f"for ({itype} j = lane; j < {experts}; j += 32) top = gd::NanMax()(top, {logit});",
            "top = gd::lanes_reduce<32>(top, gd::NanMax());",
            "float total = 0.0f;",
            f"for ({itype} j = lane; j < {experts}; j += 32) total += expf({logit} - top);",
            "total = gd::lanes_sum<32>(total);",
        ]
        score = f"(expf({logit} - top) / total)"
        chosen_score = "expf(best_l - top) / total"
    else:
        score = f"(1.0f / (1.0f + expf(-{logit})))"
        chosen_score = "1.0f / (1.0f + expf(-best_l))"
    steer = "" if bias is None else read(bias, params.tensor(bias), offset_at(bias, ["j"]), "float")
    key = f"{score} + {steer}" if steer else logit
    # The chosen expert's logit, re-read: its score follows from it.
    keep = [
        f"const float best_l = {read(logits, source, _at(logits, axis, 'best_i'), 'float')};",
        f"chosen_w[r] = {chosen_score};",
        "chosen_i[r] = best_i;",
        "sum += chosen_w[r];",
    ]
    body += [
        f"float chosen_w[{a.k}];",
        f"long long chosen_i[{a.k}];",
        "float sum = 0.0f;",
        *_with_selected(_selection(a.k, key, itype, experts, "float"), keep),
    ]
    factor = literal(a.scaling_factor, "float")
    weight = f"chosen_w[r] / sum * {factor}" if a.renormalize else f"chosen_w[r] * {factor}"
    stores = []
    if written(fused, weights):
        name = params.tensor(weights, writable=True)
        stores.append(f"    {name}[{_at(weights, axis, 'r')}] = {store(weights.data_type, weight)};")
    if written(fused, indices):
        name = params.tensor(indices, writable=True)
        stores.append(f"    {name}[{_at(indices, axis, 'r')}] = ({cuda_type(indices.data_type)})chosen_i[r];")
    body += ["if (lane == 0) {", f"  for (int r = 0; r < {a.k}; ++r) {{", *stores, "  }", "}"]
    loop = warp_stride("row", rows, itype, body)
    kernel = make_kernel(ctx, fused, "moe_router", params, loop, (blocks_for(rows * 32), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_gather(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x, index, y = node.input("input"), node.input("index"), node.output("y")
    a = node.attributes
    assert x is not None and index is not None and y is not None and isinstance(a, GatherAttributes)
    axis = a.axis % len(x.static_dim)
    compute, itype = compute_for(fused), loop_index_type([x, index, y], y.static_numel)
    params = KernelParams()
    source, picks, out = params.tensor(x), params.tensor(index), params.tensor(y, writable=True)
    body = [
        *coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype),
        f"const long long i = (long long){picks}[{offset_at(index, [f'c{axis}'])}];",
        f"const {compute} v = i >= 0 && i < {x.static_dim[axis]} ? {read(x, source, _at(x, axis, 'i'), compute)} : 0;",
        f"{out}[{_at(y, axis, f'c{axis}')}] = {store(y.data_type, 'v')};",
    ]
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, "gather", params, loop, (blocks_for(y.static_numel), 1, 1)),)
    )


def emit_unpermute(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x, slot, weights, y = node.input("input"), node.input("slot"), node.input("weights"), node.output("y")
    assert x is not None and slot is not None and y is not None
    compute, itype = compute_for(fused), loop_index_type([x, slot, y], y.static_numel)
    params = KernelParams()
    source, slots = params.tensor(x), params.tensor(slot)
    scales = params.tensor(weights) if weights is not None else None
    out = params.tensor(y, writable=True)
    term = read(x, source, offset_at(x, ["s", "c1"]), compute)
    if weights is not None and scales is not None:
        term = f"{read(weights, scales, offset_at(weights, ['c0', 'j']), compute)} * {term}"
    body = [
        *coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype),
        f"{compute} acc = 0;",
        f"for (int j = 0; j < {slot.static_dim[1]}; ++j) {{  // in order: the same sum every run",
        f"  const long long s = (long long){slots}[{offset_at(slot, ['c0', 'j'])}];",
        f"  if (s >= 0 && s < {x.static_dim[0]}) acc += {term};",
        "}",
        f"{out}[{offset_at(y, ['c0', 'c1'])}] = {store(y.data_type, 'acc')};",
    ]
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "moe_unpermute", params, loop, (blocks_for(y.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_grouped_matmul(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """On tensor cores where they take the operands (gemm_grouped.py), else SIMT: a thread per
    output element finds its row's expert (the last whose first row is at or before it) and
    walks K; correct for any offsets and types."""
    node = anchor_of(fused)
    compute = compute_for(fused)
    tensor_cores = grouped_kernel(fused, ctx, node, compute)
    if tensor_cores is not None:
        return FusedProgram(fused.name, (tensor_cores,))
    token, weight, offsets = node.input("token"), node.input("weight"), node.input("first_token_offset")
    out_t = node.output("output")
    assert token is not None and weight is not None and offsets is not None and out_t is not None
    itype = loop_index_type([token, weight, offsets, out_t], out_t.static_numel)
    params = KernelParams()
    a, b, firsts = params.tensor(token), params.tensor(weight), params.tensor(offsets)
    out = params.tensor(out_t, writable=True)
    # the frontend's form has a unit axis first (token [1, S, K], offsets [E, 1, 1]): index 0
    *unit, row, column = (f"c{axis}" for axis in range(len(out_t.dim)))
    body = [
        *coordinates("p", out_t.static_dim, stride_order(out_t.static_dim, out_t.static_stride), "c", itype),
        "int e = -1;",
        f"for (int i = 0; i < {weight.static_dim[0]}; ++i) {{",
        f"  if ((long long){firsts}[{offset_at(offsets, ['i'] + ['0'] * (len(offsets.dim) - 1))}] <= (long long){row}) e = i;",
        "}",
        f"{compute} acc = 0;",
        "if (e >= 0) {",
        f"  for ({itype} k = 0; k < {token.static_dim[-1]}; ++k) {{",
        f"    acc += {read(token, a, offset_at(token, [*unit, row, 'k']), compute)} * "
        f"{read(weight, b, offset_at(weight, ['e', 'k', column]), compute)};",
        "  }",
        "}",
        f"{out}[{offset_at(out_t, [*unit, row, column])}] = {store(out_t.data_type, 'acc')};",
    ]
    loop = grid_stride("p", first_thread(itype), out_t.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "moe_grouped_matmul", params, loop, (blocks_for(out_t.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_permutation(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    chosen = node.input("expert_indices")
    token_index, slot, firsts = (node.output(role) for role in ("token_index", "slot", "first_token_offset"))
    a = node.attributes
    assert chosen is not None and token_index is not None and slot is not None and firsts is not None
    assert isinstance(a, MoePermutationAttributes)
    experts, (tokens, k) = a.num_experts, chosen.static_dim
    count = tokens * k
    itype = loop_index_type([chosen, token_index, slot], count + THREADS)
    params = KernelParams()
    source = params.tensor(chosen)
    starts = params.scratch("starts", "long long")  # counts, then each expert's first row
    choice = f"(long long){source}[{offset_at(chosen, [f'q / {k}', f'q % {k}'])}]"
    assign, left_over, dropped, offsets = [], [], [], []
    if written(fused, token_index):
        name = params.tensor(token_index, writable=True)
        assign.append(f"{name}[{offset_at(token_index, ['row'])}] = q / {k};")
        left_over.append(f"{name}[{offset_at(token_index, ['q'])}] = -1;")
    if written(fused, slot):
        name = params.tensor(slot, writable=True)
        assign.append(f"{name}[{offset_at(slot, [f'q / {k}', f'q % {k}'])}] = row;")
        dropped.append(f"if (e < 0 || e >= {experts}) {name}[{offset_at(slot, [f'q / {k}', f'q % {k}'])}] = -1;")
    if written(fused, firsts):
        name = params.tensor(firsts, writable=True)
        offsets.append(
            f"for (int e = threadIdx.x; e < {experts}; e += {THREADS}) {name}[{offset_at(firsts, ['e'])}] = {starts}[e];"
        )
    body = [
        "__shared__ long long routed;",
        f"for (int e = threadIdx.x; e < {experts}; e += {THREADS}) {{",
        "  long long n = 0;",
        f"  for ({itype} q = 0; q < {count}; ++q) n += {choice} == e;",
        f"  {starts}[e] = n;",
        "}",
        "__syncthreads();",
        "if (threadIdx.x == 0) {",
        "  long long row = 0;",
        f"  for (int e = 0; e < {experts}; ++e) {{",
        f"    const long long n = {starts}[e];",
        f"    {starts}[e] = row;",
        "    row += n;",
        "  }",
        "  routed = row;",
        "}",
        "__syncthreads();",
        *offsets,
        f"for (int e = threadIdx.x; e < {experts}; e += {THREADS}) {{",
        f"  long long row = {starts}[e];",
        f"  for ({itype} q = 0; q < {count}; ++q) {{",
        f"    if ({choice} == e) {{",
        *("      " + line for line in assign),
        "      ++row;",
        "    }",
        "  }",
        "}",
        f"for ({itype} q = threadIdx.x; q < {count}; q += {THREADS}) {{",
        f"  const long long e = {choice};",
        *("  " + line for line in dropped),
        *(f"  if (q >= routed) {line}" for line in left_over),
        "}",
    ]
    kernel = make_kernel(ctx, fused, "moe_permutation", params, body, (1, 1, 1))
    return FusedProgram(fused.name, (kernel,), (Scratch("starts", 8 * experts),))
