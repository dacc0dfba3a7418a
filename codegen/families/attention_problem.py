"""The attention family's problem: an ``sdpa`` node's tensors, masks and lengths, its kernel
parameters, and the CUDA both attention paths share: which (batch, head, query block) a
block computes, each batch's effective lengths, the visible key range of a block of rows,
one score's scale / bias / ALiBi / mask, dropout's mask (the same bits in every kernel,
forward and backward), and the final write of a row of O and STATS.

A dynamic graph's forward attention (attention.extents_refusal) has a symbolic batch, symbolic
sequence lengths (Sq, Skv) or both (not on the decode kernels). Q, K, V, O, STATS, a bias and the
lengths keep the batch out of their strides (the batch outermost in memory). ``SQ`` / ``SKV``
and the strides that hold them are read from the kernel's EXTENT arguments: every loop bound,
mask and tail tile already works from them. The grid, one block per work item (``ceil(Sq / rows
per block)`` row blocks per head and sequence), is computed at launch, and a kernel that walks
the items counts them from its EXTENT arguments (attention_extents.py).

Masks follow the reference (graphdnn/ops/attention.py): key j is visible from query row i
when j < skv, j <= i + diag under a causal mask and j > i + diag - window under a sliding
window, where diag is skv - sq for the bottom-right alignment and 0 otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fusion_rules import FusedNode
from graphdnn.ir import Node, Tensor
from graphdnn.ops.attention import Masks, alibi_slopes, kv_length
from graphdnn.symbolic import Extent, Sym, upper

from ..context import KernelParams, scalar_value
from ..cuda_types import cuda_type, load
from ..epilogue import rounded_constant, scalar_integer
from ..indexing import c_extent, divides, offset_at
from ..pointwise import bernoulli_threshold, literal
from .tensor_core import TENSOR_CORE_TYPES

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class Attention:
    node: Node
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor | None  # each output only when the fused node writes it to memory (None in the backward)
    stats: Tensor | None
    bias: Tensor | None
    scale: Tensor | None
    seq_len_q: Tensor | None
    seq_len_kv: Tensor | None
    page_table_k: Tensor | None  # a paged KV cache: K and V are page pools [pages, Hk, page_size, D]
    page_table_v: Tensor | None
    seed: Tensor | None  # dropout's Philox key and counter offset (with attrs.dropout_probability)
    offset: Tensor | None
    ragged_q: Tensor | None = None  # packed sequences' token offsets (graphdnn/ops/attention_ragged.py)
    ragged_kv: Tensor | None = None
    # roles read from the fused node's scratch (name by role) instead of their tensors: Q and K
    # rotated by the RoPE pre-pass (attention_rotary.py), packed [B, H, S, D]
    rotated: dict[str, str] = field(default_factory=dict)
    rotary_q_theta: float | None = None  # RoPE on Q, which the kernel applies in its prologue
    rotary_k_theta: float | None = None  # RoPE on K, which the kernel applies as its keys land

    @property
    def attrs(self) -> Masks:
        """The node's masks: an sdpa's or an sdpa_backward's attributes."""
        masks: Masks = self.node.attributes  # type: ignore[assignment]
        return masks

    @property
    def batch(self) -> int:
        """Q's dim 0, or for a packed Q (dim 0 of 1) the sequence lengths'; in a dynamic graph its
        maximum (the grid's size there, and what the heuristics choose for: :func:`at_batch`)."""
        return upper(self.batch_extent)

    @property
    def batch_extent(self) -> Extent:
        """:attr:`batch` as a dim: a symbol in a dynamic graph."""
        if self.ragged_q is not None and self.seq_len_q is not None:
            return self.seq_len_q.dim[0]
        return self.q.dim[0]

    @property
    def is_dynamic(self) -> bool:
        """A symbolic batch (the sequence lengths may be symbolic without it: :attr:`dynamic_lengths`)."""
        return isinstance(self.batch_extent, Sym)

    @property
    def dynamic_lengths(self) -> bool:
        """Sq or Skv is symbolic: kernels read them (and the strides holding them) at run time."""
        return isinstance(self.sq_extent, Sym) or isinstance(self.skv_extent, Sym)

    @property
    def rows_per_sequence(self) -> int:
        """The query rows a sequence may have: Sq, or a packed Q's max_seq_len_q (the grid's)."""
        longest: int | None = getattr(self.attrs, "max_seq_len_q", None)
        return self.sq if longest is None else min(longest, self.sq)

    @property
    def ragged(self) -> bool:
        return self.ragged_q is not None or self.ragged_kv is not None

    @property
    def heads(self) -> int:
        return self.q.static_axis(1)

    @property
    def kv_heads(self) -> int:
        return self.k.static_axis(1)

    @property
    def sq(self) -> int:
        """Sq; in a dynamic graph its maximum (grids, workspace and heuristics are sized for it)."""
        return upper(self.sq_extent)

    @property
    def sq_extent(self) -> Extent:
        return self.q.dim[2]

    def row_blocks(self, block_m: int) -> str:
        """C: this call's blocks of ``block_m`` query rows, from Sq's EXTENT argument."""
        return f"({c_extent(self.sq_extent)} + {block_m - 1}) / {block_m}"

    @property
    def skv(self) -> int:
        """The keys a sequence may have (with a paged cache, not K's dim 2: its page size); in a
        dynamic graph its maximum."""
        return upper(self.skv_extent)

    @property
    def skv_extent(self) -> Extent:
        return kv_length(self.node) if self.paged else self.k.dim[2]  # K's own: at_skv replaces it

    @property
    def paged(self) -> bool:
        return self.page_table_k is not None

    @property
    def d(self) -> int:
        return self.q.static_axis(3)

    @property
    def dv(self) -> int:
        return self.v.static_axis(3)

    @property
    def causal(self) -> bool:
        return self.attrs.use_causal_mask or self.attrs.use_causal_mask_bottom_right

    @property
    def bottom_right(self) -> bool:
        return self.attrs.use_causal_mask_bottom_right

    @property
    def window(self) -> int:
        """The sliding window, 0 for none. One of at least SQ + SKV keys hides no key of any row
        (key j is hidden when j <= i + diag - window, and i + diag < SQ + SKV): it is none, which
        also keeps 64-bit lengths out of the kernels' int arithmetic."""
        window = self.attrs.sliding_window_length or 0
        return 0 if window >= self.sq + self.skv else window

    @property
    def padded(self) -> bool:
        return self.attrs.use_padding_mask

    @property
    def dropout(self) -> float | None:
        """The drop rate, None without dropout."""
        return self.attrs.dropout_probability


def on_tensor_cores(a: Attention) -> bool:
    """Q, K and V all fp16 or all bf16: the flash kernels' types."""
    types = {a.q.data_type, a.k.data_type, a.v.data_type}
    return len(types) == 1 and types <= TENSOR_CORE_TYPES


def attention_of(fused: FusedNode) -> Attention:
    node = fused.anchor
    assert node is not None and node.op == "sdpa"
    q, k, v = node.input("Q"), node.input("K"), node.input("V")
    assert q is not None and k is not None and v is not None
    written = {t.id for t in fused.outputs}
    o, stats = node.output("O"), node.output("STATS")
    return Attention(
        node,
        q,
        k,
        v,
        o if o is not None and o.id in written else None,
        stats if stats is not None and stats.id in written else None,
        node.input("BIAS"),
        node.input("ATTN_SCALE"),
        node.input("SEQ_LEN_Q"),
        node.input("SEQ_LEN_KV"),
        node.input("PAGE_TABLE_K"),
        node.input("PAGE_TABLE_V"),
        node.input("SEED"),
        node.input("OFFSET"),
        node.input("RAGGED_OFFSET_Q"),
        node.input("RAGGED_OFFSET_KV"),
    )


@dataclass
class AttentionParams:
    """The kernel parameters of an attention kernel and the C names of its tensors."""

    params: KernelParams
    names: dict[str, str]


def declare(a: Attention, params: KernelParams | None = None) -> AttentionParams:
    """One parameter per tensor, however many roles it fills (self-attention may pass one
    tensor as K and V, or as Q, K and V), after those already in ``params`` (tensor maps)."""
    params = params if params is not None else KernelParams()
    declared: dict[int, str] = {}

    def name_of(tensor: Tensor, writable: bool = False) -> str:
        if tensor.id not in declared:
            declared[tensor.id] = params.tensor(tensor, writable=writable)
        return declared[tensor.id]

    names = {role: params.scratch(name, f"const {cuda_type(tensor.data_type)}") for role, name, tensor in _rotated(a)}
    inputs = {"Q": a.q, "K": a.k, "V": a.v, "ATTN_SCALE": a.scale, "BIAS": a.bias}
    inputs |= {"SEQ_LEN_Q": a.seq_len_q, "SEQ_LEN_KV": a.seq_len_kv}
    inputs |= {"PAGE_TABLE_K": a.page_table_k, "PAGE_TABLE_V": a.page_table_v, "SEED": a.seed, "OFFSET": a.offset}
    inputs |= {"RAGGED_OFFSET_Q": a.ragged_q, "RAGGED_OFFSET_KV": a.ragged_kv}
    names |= {
        role: name_of(t) for role, t in inputs.items() if t is not None and not t.is_constant and role not in names
    }
    outputs = {"O": a.o, "STATS": a.stats}
    names |= {role: name_of(t, writable=True) for role, t in outputs.items() if t is not None}
    return AttentionParams(params, names)


def _rotated(a: Attention) -> list[tuple[str, str, Tensor]]:
    """(role, scratch name, tensor) of each operand read from the RoPE pre-pass's scratch."""
    return [(role, name, a.q if role == "Q" else a.k) for role, name in a.rotated.items()]


def strides(tensor: Tensor) -> str:
    """``[b, h, s, d]`` strides as C constants (0 for a broadcast size-1 dim), a symbolic one as
    the product of its EXTENT arguments."""
    return ", ".join(
        c_extent(s) if isinstance(s, Sym) and d != 1 else str(s if d != 1 else 0) + "LL"
        for d, s in zip(tensor.dim, tensor.stride)
    )


def stride_arrays(arrays: Sequence[tuple[str, Tensor]]) -> str:
    """``constexpr long long QS[4] = {...}, KS[4] = {...};`` of each (name, tensor), ``const`` where a
    stride is symbolic (read at run time)."""
    symbolic = any(isinstance(s, Sym) for _, t in arrays for s in t.stride)
    declared = ", ".join(f"{name}[4] = {{{strides(t)}}}" for name, t in arrays)
    return f"{'const' if symbolic else 'constexpr'} long long {declared};"


def int_constants(values: Sequence[tuple[str, Extent | str]]) -> list[str]:
    """``constexpr int A = 1, B = 2;`` of each (name, value: a number or a C expression of the
    constants before it); a symbolic value goes to a ``const int`` line after the others, read
    from its EXTENT arguments."""
    fixed = [f"{name} = {value}" for name, value in values if not isinstance(value, Sym)]
    runtime = [f"{name} = (int){c_extent(value)}" for name, value in values if isinstance(value, Sym)]
    return [f"constexpr int {', '.join(fixed)};", *([f"const int {', '.join(runtime)};"] if runtime else [])]


def block_setup(a: Attention, names: dict[str, str], block_m: int) -> list[str]:
    """Constants; then :func:`work_setup` of the block's own work item."""
    return [*constants(a), *work_setup(a, names, block_m, "blockIdx.x")]


def work_setup(a: Attention, names: dict[str, str], block_m: int, work: str) -> list[str]:
    """Work item ``work``'s batch ``b``, head ``h``, kv head ``hk`` and first row ``row0`` (heavy
    causal blocks first); then :func:`lengths_and_scale`."""
    blocks = f"constexpr int M_BLOCKS = {-(-a.rows_per_sequence // block_m)};"
    if isinstance(a.sq_extent, Sym):  # this call's row blocks
        blocks = f"const int M_BLOCKS = (int)({a.row_blocks(block_m)});"
    return [
        blocks,
        f"const int m_block = M_BLOCKS - 1 - (int)({work} % M_BLOCKS);  // the longest causal rows first",
        f"const int h = (int)(({work} / M_BLOCKS) % HQ), b = (int)({work} / M_BLOCKS / HQ);",
        "const int hk = h / GROUP;",
        f"const int row0 = m_block * {block_m};",
        *lengths_and_scale(a, names),
    ]


def constants(a: Attention) -> list[str]:
    """``NEG_INF`` and the problem's extents: HQ, GROUP, SQ, SKV, D, DV."""
    return [
        "const float NEG_INF = __int_as_float(0xff800000);",
        *int_constants([("HQ", a.heads), ("GROUP", a.heads // a.kv_heads), ("SQ", a.sq_extent), ("SKV", a.skv_extent)]),
        f"constexpr int D = {a.d}, DV = {a.dv};",
    ]


def lengths_and_scale(
    a: Attention, names: dict[str, str], with_slope: bool = True, first: tuple[str, str] = ("q", "row0")
) -> list[str]:
    """:func:`sequence_setup` (of ``first``); with ALiBi the ``SLOPES`` table and, unless
    ``with_slope`` is false (a kernel that walks the heads sets it per head), query head ``h``'s
    ``slope``."""
    lines = sequence_setup(a, names, first) + alibi_table(a)
    if a.attrs.use_alibi_mask and with_slope:
        lines.append("const float slope = SLOPES[h];")
    return lines


def sequence_setup(a: Attention, names: dict[str, str], first: tuple[str, str] = ("q", "row0")) -> list[str]:
    """Batch ``b``'s effective lengths ``sq``, ``skv``; ``diag``; the scale ``scale`` (natural units).
    ``first``: the side ("q" or "kv") of the block's rows and its first row, past which a block
    of a packed side leaves before reading the offsets."""
    lines: list[str] = []
    if a.padded:
        assert a.seq_len_q is not None and a.seq_len_kv is not None
        side, row = first
        if _ragged(a, side):  # a block past its sequence's length leaves before reading the offsets
            lines.append(f"if ({row} >= {_given_length(a, names, side)}) return;  // past a packed sequence")
        lines += [*_owned(a, names, "q"), *_owned(a, names, "kv"), _length(a, names, "q"), _length(a, names, "kv")]
    else:
        lines.append(f"{'const' if a.dynamic_lengths else 'constexpr'} int sq = SQ, skv = SKV;")
    lines.append(
        f"const int diag = {'skv - sq' if a.bottom_right else '0'};  // key j is on row i's diagonal when j = i + diag"
    )
    scale = "1.0f" if a.scale is None else scalar_value(a.scale, names.get("ATTN_SCALE"), "float")
    lines.append(f"const float scale = {scale};")
    return lines


def query_rows(a: Attention, names: dict[str, str]) -> list[str]:
    """A packed Q's ``q_start`` and batch b's effective rows ``sq`` (as :func:`sequence_setup`),
    for a kernel whose threads are not one block of one sequence's rows."""
    return [*_owned(a, names, "q"), _length(a, names, "q")]


def _given_length(a: Attention, names: dict[str, str], side: str) -> str:
    return length(a.seq_len_q if side == "q" else a.seq_len_kv, names[f"SEQ_LEN_{side.upper()}"])  # type: ignore[arg-type]


def _owned(a: Attention, names: dict[str, str], side: str) -> list[str]:
    offsets = a.ragged_q if side == "q" else a.ragged_kv
    return [] if offsets is None else _owned_tokens(a, side, offsets, names[f"RAGGED_OFFSET_{side.upper()}"])


def _length(a: Attention, names: dict[str, str], side: str) -> str:
    """``s{side}``: batch b's given length, within its owned tokens (a packed side), SQ or SKV,
    and a packed Q's max_seq_len_q."""
    room = f"{side}_owned" if _ragged(a, side) else f"S{side.upper()}"
    if side == "q" and a.rows_per_sequence < a.sq:
        room = f"min(q_owned, {a.rows_per_sequence})"
    return f"const int s{side} = (int)min((long long){room}, max(0LL, (long long){_given_length(a, names, side)}));"


def _owned_tokens(a: Attention, side: str, offsets: Tensor, name: str) -> list[str]:
    """``{side}_start`` and ``{side}_owned``: the packed tokens batch b's sequence owns, by the
    rule of graphdnn/ops/attention_ragged.py (start at its clamped offset, end at the smallest
    later one), so that sequences never overlap whatever the offsets hold. The lanes of each
    warp share the later offsets (every thread of the block runs this, before any exit)."""
    total = "SQ" if side == "q" else "SKV"
    at = load(offsets.data_type, element(offsets, name, ["c", "0", "0", "0"]), "long long")
    return [
        f"auto {side}_token_at = [&](int c) -> long long {{ return min((long long){total}, max(0LL, {at})); }};",
        f"const long long {side}_start = {side}_token_at(b);",
        f"long long {side}_limit = {total};",
        f"for (int c = b + 1 + (int)(threadIdx.x & 31); c <= {a.batch}; c += 32) "
        f"{side}_limit = min({side}_limit, {side}_token_at(c));",
        f"for (int lanes = 16; lanes > 0; lanes >>= 1) "
        f"{side}_limit = min({side}_limit, __shfl_xor_sync(0xffffffffu, {side}_limit, lanes));",
        f"const int {side}_owned = (int)max(0LL, {side}_limit - {side}_start);",
    ]


def _ragged(a: Attention, side: str) -> bool:
    return (a.ragged_q if side == "q" else a.ragged_kv) is not None


def written_rows(a: Attention, side: str = "q") -> str:
    """The rows of a sequence a kernel reads and writes on ``side`` ("q": query rows, "kv":
    keys): all SQ / SKV (zeros past its length), or a packed sequence's ``sq`` / ``skv`` (the
    rest of a packed output is filled before: attention_ragged.py)."""
    return f"s{side}" if _ragged(a, side) else f"S{side.upper()}"


def packed_exit(a: Attention, side: str = "q", first: str = "row0") -> list[str]:
    """A block whose rows (from ``first``) all lie past its packed sequence's has nothing to write."""
    if not _ragged(a, side):
        return []
    return [f"if ({first} >= {written_rows(a, side)}) return;  // rows past a packed sequence are no one's"]


SIDES = {"q": ("Q", "O", "STATS", "DO", "DQ"), "kv": ("K", "V", "DK", "DV")}  # each side's tensors by role


def coordinates(a: Attention, role: str, head: str, row: str, col: str) -> list[str]:
    """The [b, h, s, d] coordinates of row ``row`` (of the batch's sequence), column ``col`` of
    the tensor in ``role`` (one of :data:`SIDES`): dim 0 is b, or for a packed tensor 0 with the
    row counted from the sequence's first token."""
    side = "q" if role in SIDES["q"] else "kv"
    if not _ragged(a, side):
        return ["b", head, row, col]
    return ["0", head, f"{side}_start + ({row})", col]


def alibi_table(a: Attention) -> list[str]:
    """``SLOPES[HQ]``, the ALiBi slope of each query head (nothing without ALiBi)."""
    if not a.attrs.use_alibi_mask:
        return []
    slopes = ", ".join(literal(slope, "float") for slope in alibi_slopes(a.heads))
    return [f"static constexpr float SLOPES[HQ] = {{{slopes}}};  // static: in constant memory, not per-thread"]


def element(tensor: Tensor, name: str, coordinates: Sequence[str]) -> str:
    """``name[...]`` at the given [b, h, s, d] coordinate expressions, in 64-bit offsets."""
    return f"{name}[{offset_at(tensor, [f'(long long)({c})' for c in coordinates])}]"


def key_row_address(a: Attention, names: dict[str, str], role: str, j: str, page: str = "page") -> str:
    """The first element of key ``j``'s row of K or V (``role``) for kv head ``hk``: dense at
    [b, hk, j], or paged at [``page``, hk, j % page_size] of the pool."""
    tensor, stride = (a.k, "KS") if role == "K" else (a.v, "VS")
    if a.ragged_kv is not None:
        return f"{names[role]} + (long long)hk * {stride}[1] + (kv_start + ({j})) * {stride}[2]"
    if not a.paged:
        return (
            f"{names[role]} + (long long)b * {stride}[0] + (long long)hk * {stride}[1] + (long long)({j}) * {stride}[2]"
        )
    page_size = tensor.static_dim[2]
    return f"{names[role]} + {page} * {stride}[0] + (long long)hk * {stride}[1] + (long long)(({j}) % {page_size}) * {stride}[2]"


def page_of(a: Attention, names: dict[str, str], role: str, j: str) -> str:
    """Key ``j``'s page in the K or V pool, read from batch b's page table (as a long long)."""
    tensor, table = (a.k, a.page_table_k) if role == "K" else (a.v, a.page_table_v)
    assert table is not None
    index = ["b", "0", f"({j}) / {tensor.static_dim[2]}", "0"]
    return load(table.data_type, element(table, names[f"PAGE_TABLE_{role}"], index), "long long")


def length(tensor: Tensor, name: str) -> str:
    """Batch b's sequence length from a [B, 1, 1, 1] tensor."""
    return load(tensor.data_type, element(tensor, name, ["b", "0", "0", "0"]), "double")


def key_range(a: Attention, block_m: int) -> list[str]:
    """``kv_begin`` / ``kv_end``: the keys any row of the block can see."""
    lines = ["int kv_end = skv;", "int kv_begin = 0;"]
    if a.causal:
        lines.append(f"kv_end = max(0, min(kv_end, row0 + {block_m} + diag));")
    if a.window:
        lines.append(f"kv_begin = min(kv_end, max(0, row0 + diag - {a.window - 1}));")
    lines.append("if (row0 >= sq) kv_end = kv_begin;  // rows past the sequence see nothing")
    return lines


def needs_mask(a: Attention, block_m: int, block_n: int) -> str:
    """C condition: the key tile starting at ``kv0`` has keys some row of the block cannot see."""
    terms = [f"kv0 + {block_n} > skv", f"row0 + {block_m} > sq"]
    if a.causal:
        terms.append(f"kv0 + {block_n - 1} > row0 + diag")
    if a.window:
        terms.append(f"kv0 <= row0 + {block_m - 1} + diag - {a.window}")
    return " || ".join(terms)


def folds_scale(a: Attention) -> bool:
    """Whether the scores' scale can wait for the exponent: with no bias and no ALiBi, a
    constant positive scale commutes with the row maximum, so a kernel may keep raw dot
    products and fold ``scale * log2(e)`` into the exponent's FMA (one multiply less per
    score, as FlashAttention-3 does)."""
    if a.bias is not None or a.attrs.use_alibi_mask:
        return False
    if a.scale is None:
        return True
    return a.scale.is_constant and float(rounded_constant(a.scale)) > 0.0


def score_function(a: Attention, names: dict[str, str], fold: bool = False) -> list[str]:
    """``score(dot, i, j, masked)``: the score of query row i and key j in log2 units (the
    kernels use exp2), -inf when masked (rows past sq see nothing, which also keeps the bias
    read inside its tensor); ``masked`` false skips the mask tests (tiles where every key is
    visible to every row).

    ``fold`` (a kernel that takes it): where :func:`folds_scale`, the score is the raw dot
    product and ``TO_LOG2`` is the factor to log2 units, which the kernel applies in its
    exponents (``exp2(fma(s, TO_LOG2, -max * TO_LOG2))``); otherwise ``TO_LOG2`` is 1."""
    terms = ["dot * scale"]
    if a.bias is not None:
        terms.append(load(a.bias.data_type, element(a.bias, names["BIAS"], ["b", "h", "i", "j"]), "float"))
    if a.attrs.use_alibi_mask:
        terms.append("slope * (float)(j - i - diag)")
    conditions = ["j >= skv", "i >= sq"]
    if a.causal:
        conditions.append("j > i + diag")
    if a.window:
        conditions.append(f"j <= i + diag - {a.window}")
    folded = fold and folds_scale(a)
    value = "dot * scale_log2" if len(terms) == 1 else f"({' + '.join(terms)}) * {LOG2E}f"
    if folded:
        value = "dot"
    lines = [f"const float scale_log2 = scale * {LOG2E}f;"]
    if fold:
        lines.append(f"const float TO_LOG2 = {'scale_log2' if folded else '1.0f'};  // raw score to log2 units")
    return [
        *lines,
        "auto score = [&](float dot, int i, int j, bool masked) -> float {",
        f"  if (masked && ({' || '.join(conditions)})) return NEG_INF;",
        f"  return {value};",
        "};",
    ]


def dropout_function(a: Attention) -> list[str]:
    """``kept(head, i, j)``: whether dropout keeps the softmax element of query head ``head``,
    row i and key j of batch ``b`` (nothing without dropout). The mask of the reference
    (:func:`graphdnn.ops.attention.dropout_keep`): rng's Bernoulli draw with probability 1 - p at
    the element's row-major index in [B, HQ, SQ, SKV], keyed by SEED, offset by OFFSET, so every
    kernel, forward and backward, keeps the same elements whatever its tiling."""
    if a.dropout is None:
        return []
    assert a.seed is not None and a.offset is not None
    return [
        f"const unsigned long long dropout_seed = {scalar_integer(a.seed)};",
        f"const unsigned long long dropout_offset = {scalar_integer(a.offset)};",
        "auto kept = [&](int head, int i, int j) -> bool {",
        "  const unsigned long long index = (((unsigned long long)b * HQ + head) * SQ + i) * SKV + j;",
        f"  return gd::bernoulli(dropout_seed, dropout_offset, index, {bernoulli_threshold(1.0 - a.dropout)}u);",
        "};",
    ]


def dropped(a: Attention, p: str, head: str, i: str, j: str) -> str:
    """``p`` where dropout keeps (``head``, ``i``, ``j``), else 0: what P V adds (the row sum takes
    every ``p``; :func:`o_store` scales by 1 / (1 - rate))."""
    return p if a.dropout is None else f"(kept({head}, {i}, {j}) ? {p} : 0.0f)"


def dropout_factor(a: Attention, head: str, i: str, j: str) -> str | None:
    """C: 1 / (1 - rate) where dropout keeps (``head``, ``i``, ``j``), else 0; None without dropout."""
    if a.dropout is None:
        return None
    return f"(kept({head}, {i}, {j}) ? {literal(1.0 / (1.0 - a.dropout), 'float')} : 0.0f)"


def o_pair_store(
    a: Attention, names: dict[str, str], row: str, col: str, values: tuple[str, str], aligned: str
) -> list[str]:
    """Elements ``col`` (even, below DV) and ``col + 1`` (if below DV) of O's row: one 4-byte store
    of two 16-bit values (``pack2``, the kernel's type) where O's rows are contiguous, its offsets
    even and ``aligned`` holds at run time, else element stores."""
    o = a.o
    if o is None:
        return []
    pairs = [
        o_store(a, names, row, col, values[0]),
        f"if ({col} + 1 < DV) {o_store(a, names, row, f'{col} + 1', values[1])}",
    ]
    pairable = (
        o.data_type is a.q.data_type
        and o.data_type.itemsize == 2
        and a.dv % 2 == 0
        and o.stride[3] == 1
        and all(divides(stride, 2) for n, stride in zip(o.dim[:3], o.stride[:3]) if n != 1)
    )
    if not pairable:
        return pairs
    scale = f" * {literal(1.0 / (1.0 - a.dropout), 'float')}" if a.dropout is not None else ""
    packed = f"pack2(({values[0]}){scale}, ({values[1]}){scale})"
    address = element(o, names["O"], coordinates(a, "O", "h", row, col))
    return [
        f"if ({aligned}) {{",
        f"  *reinterpret_cast<unsigned*>(&{address}) = {packed};",
        "} else {",
        *(f"  {line}" for line in pairs),
        "}",
    ]


def o_store(a: Attention, names: dict[str, str], row: str, col: str, value: str) -> str:
    """One element of O, at (b, h, ``row``, ``col``), kept values scaled by 1 / (1 - rate) under
    dropout; nothing when O is not written."""
    if a.o is None:
        return ";"
    if a.dropout is not None:
        value = f"({value}) * {literal(1.0 / (1.0 - a.dropout), 'float')}"
    return f"{element(a.o, names['O'], coordinates(a, 'O', 'h', row, col))} = gd::from<{cuda_type(a.o.data_type)}>({value});"


def stats_store(a: Attention, names: dict[str, str], row: str, lse2: str) -> list[str]:
    """STATS at (b, h, ``row``) from the log2-unit log-sum-exp ``lse2`` (-inf: no visible key)."""
    if a.stats is None:
        return []
    return [f"{element(a.stats, names['STATS'], coordinates(a, 'STATS', 'h', row, '0'))} = ({lse2}) * {LN2}f;"]
