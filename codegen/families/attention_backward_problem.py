"""The attention backward family's problem: an ``sdpa_backward`` node's tensors, its kernel
parameters, the ``delta`` scratch and the preprocess kernel that fills it, and the CUDA the
backward kernels share (the score gradient of one query row and one key).

The forward's problem (:class:`~.attention_problem.Attention`, without outputs) describes Q,
K, V, the bias, scale, lengths and masks: the backward reuses its constants, lengths and
score function, so both passes agree on which keys each row sees. With P = 2^(score - lse)
(log2 units, lse = STATS log2(e)), ``delta_i = sum_d dO[i, d] O[i, d]`` and
``dS = P (dO·V - delta)`` (graphdnn/ops/attention_backward.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, KernelParams, indent, kernel_source, pattern_name
from ..cuda_types import load, store
from ..kernel import Kernel, Scratch
from .attention_problem import (
    LOG2E,
    Attention,
    AttentionParams,
    constants,
    coordinates,
    dropout_factor,
    element,
    query_rows,
)

DELTA = "delta"  # scratch: rowsum(dO * O) per (b, h, i), float, in [B, Hq, rows a sequence may have] order
DQ_ACCUM = "dq_accum"  # scratch of the Hopper path: dQ / scale summed in fp32, [B, Hq, rows, D] like DELTA
PREPROCESS_THREADS = 128


@dataclass(frozen=True)
class AttentionBackward:
    problem: Attention  # Q, K, V, bias, scale, lengths and masks (no outputs)
    o: Tensor
    d_o: Tensor
    stats: Tensor
    dq: Tensor
    dk: Tensor
    dv: Tensor
    deterministic: bool  # use_deterministic_algorithm: only kernels that sum in a fixed order

    @property
    def rows(self) -> int:
        """Query rows over every batch and head: the entries of ``delta`` (a packed Q's sequences
        each have max_seq_len_q rows, or every token: the rows are each sequence's own)."""
        a = self.problem
        return a.batch * a.heads * a.rows_per_sequence

    @property
    def scratch(self) -> Scratch:
        return Scratch(DELTA, 4 * self.rows)

    @property
    def dq_scratch(self) -> Scratch:
        return Scratch(DQ_ACCUM, 4 * self.rows * self.problem.d)


def backward_of(fused: FusedNode) -> AttentionBackward:
    node = fused.anchor
    assert node is not None and node.op == "sdpa_backward"
    tensors = {role: node.input(role) for role in ("Q", "K", "V", "O", "DO", "STATS")}
    tensors |= {role: node.output(role) for role in ("DQ", "DK", "DV")}
    q, k, v, o, d_o, stats, dq, dk, dv = tensors.values()
    assert all(t is not None for t in tensors.values())
    problem = Attention(
        node, q, k, v, None, None, node.input("BIAS"), node.input("ATTN_SCALE"),  # type: ignore[arg-type]
        node.input("SEQ_LEN_Q"), node.input("SEQ_LEN_KV"), None, None, node.input("SEED"), node.input("OFFSET"),
        node.input("RAGGED_OFFSET_Q"), node.input("RAGGED_OFFSET_KV"),
    )  # fmt: skip
    deterministic = node.attributes.use_deterministic_algorithm  # type: ignore[attr-defined]
    return AttentionBackward(problem, o, d_o, stats, dq, dk, dv, deterministic)  # type: ignore[arg-type]


def declare(ab: AttentionBackward, dq_accum: bool = False, params: KernelParams | None = None) -> AttentionParams:
    """Every tensor once (one tensor may fill several roles), the outputs writable, ``delta``
    and (``dq_accum``) the fp32 dQ sums; after ``params``' declarations (tensor maps) if given."""
    a = ab.problem
    params = KernelParams() if params is None else params
    declared: dict[int, str] = {}

    def name_of(tensor: Tensor, writable: bool = False) -> str:
        if tensor.id not in declared:
            declared[tensor.id] = params.tensor(tensor, writable=writable)
        return declared[tensor.id]

    inputs: dict[str, Tensor | None] = {"Q": a.q, "K": a.k, "V": a.v, "O": ab.o, "DO": ab.d_o, "STATS": ab.stats}
    inputs |= {"ATTN_SCALE": a.scale, "BIAS": a.bias, "SEQ_LEN_Q": a.seq_len_q, "SEQ_LEN_KV": a.seq_len_kv}
    inputs |= {"SEED": a.seed, "OFFSET": a.offset, "RAGGED_OFFSET_Q": a.ragged_q, "RAGGED_OFFSET_KV": a.ragged_kv}
    names = {role: name_of(t) for role, t in inputs.items() if t is not None and not t.is_constant}
    names |= {role: name_of(t, writable=True) for role, t in (("DQ", ab.dq), ("DK", ab.dk), ("DV", ab.dv))}
    names[DELTA] = params.scratch(DELTA, "float")
    if dq_accum:
        names[DQ_ACCUM] = params.scratch(DQ_ACCUM, "float")
    return AttentionParams(params, names)


def preprocess_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """``delta[b, h, i] = sum_d dO[b, h, i, d] O[b, h, i, d]``, one warp per row (its lanes read
    consecutive columns; every lane takes part in the reduction, rows past the end included).
    A packed Q's row i of sequence b is token ``q_start + i``; rows past the sequence's are 0.
    (The Hopper path has its own: attention_backward_passes.py.)"""
    a = ab.problem
    declared = declare(ab)
    names, params = declared.names, declared.params

    def value(role: str, tensor: Tensor) -> str:
        return load(tensor.data_type, element(tensor, names[role], coordinates(a, role, "h", "i", "d")), "float")

    rows_per_block = PREPROCESS_THREADS // 32
    rows = delta_rows(a)
    row_sum = f"for (int d = lane; d < DV; d += 32) sum += {value('DO', ab.d_o)} * {value('O', ab.o)};"
    if a.ragged_q is None:
        sums = [f"if (row < {ab.rows}LL)", f"  {row_sum}"]
    else:  # a warp's lanes share their row: the sequence's tokens, then the row if it is the sequence's
        sums = [
            f"if (row < {ab.rows}LL) {{",
            *(f"  {line}" for line in query_rows(a, names)),
            f"  if (i < sq) {row_sum}",
            "}",
        ]
    body = [
        *constants(a),
        f"const long long row = (long long)blockIdx.x * {rows_per_block} + (threadIdx.x >> 5);",
        "const int lane = threadIdx.x & 31;",
        f"const int i = (int)(row % {rows}), h = (int)(row / {rows} % HQ), b = (int)(row / {rows} / HQ);",
        "float sum = 0.0f;",
        *sums,
        "sum = gd::lanes_sum<32>(sum);",
        f"if (row < {ab.rows}LL && lane == 0) {names[DELTA]}[row] = sum;",
    ]
    name, source = kernel_source(
        ctx, fused, pattern_name(fused) + "_delta", params, PREPROCESS_THREADS, indent(body, 1)
    )
    grid = -(-ab.rows // rows_per_block)
    return Kernel(name, source, (grid, 1, 1), (PREPROCESS_THREADS, 1, 1), 0, tuple(params.bindings))


def delta_rows(a: Attention) -> str:
    """C: the rows of a sequence in ``delta`` (SQ, or a packed Q's max_seq_len_q)."""
    return "SQ" if a.rows_per_sequence == a.sq else str(a.rows_per_sequence)


def row_statistics(ab: AttentionBackward, names: dict[str, str], row: str, head: str = "h") -> tuple[str, str]:
    """(lse in log2 units, delta) of query row ``row`` of (b, ``head``): C expressions."""
    stats = element(ab.stats, names["STATS"], coordinates(ab.problem, "STATS", head, row, "0"))
    delta = f"{names[DELTA]}[((long long)b * HQ + ({head})) * {delta_rows(ab.problem)} + ({row})]"
    return f"{load(ab.stats.data_type, stats, 'float')} * {LOG2E}f", delta


def probability_gradients(
    a: Attention, p: str, dp: str, delta: str, head: str, i: str, j: str
) -> tuple[list[str], str, str]:
    """(lines to emit first, the P that dV's Pᵀ dO takes, dS) of the element (``head``, ``i``,
    ``j``) with probability ``p`` and dP = dO·V ``dp``: P and P (dP - delta), or under dropout,
    with the forward's mask Z and r = 1 / (1 - rate), r Z P and P (r Z dP - delta)
    (graphdnn/ops/attention_backward.py). The lines define ``keep`` (r Z)."""
    factor = dropout_factor(a, head, i, j)
    if factor is None:
        return [], p, f"{p} * ({dp} - {delta})"
    return [f"const float keep = {factor};"], f"{p} * keep", f"{p} * ({dp} * keep - {delta})"


def gradient_store(
    a: Attention, role: str, tensor: Tensor, name: str, head: str, row: str, col: str, value: str
) -> str:
    """One element of the gradient in ``role`` (DQ, DK or DV), at row ``row`` of batch b's sequence."""
    return f"{element(tensor, name, coordinates(a, role, head, row, col))} = {store(tensor.data_type, value)};"


def query_range(a: Attention, keys: int, tile: int) -> list[str]:
    """``q_begin`` / ``q_end``: the query rows that can see some key of ``kv0`` .. ``kv0 + keys``;
    ``q_first``: ``q_begin`` rounded down to a tile of ``tile`` rows."""
    lines = ["int q_begin = 0, q_end = sq;"]
    if a.causal:
        lines.append("q_begin = max(0, kv0 - diag);  // row i sees key j when j <= i + diag")
    if a.window:
        lines.append(f"q_end = min(q_end, kv0 + {keys - 1} - diag + {a.window});  // and when j > i + diag - window")
    lines += [
        "if (kv0 >= skv || q_end < q_begin) q_end = q_begin;  // keys past the sequence are seen by no row",
        f"const int q_first = q_begin / {tile} * {tile};",
    ]
    return lines
