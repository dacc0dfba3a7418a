"""The frontend's ragged attention tensors as graphdnn's packed sequences.

The frontend declares every attention tensor ``[B, H, S, d]`` with token-major strides (BSHD,
or THD: S steps one token, B steps S tokens) and gives it ``ragged_offset``: ``[B + 1, 1, 1, 1]``
*element* offsets where each sequence starts in the buffer. graphdnn's ``sdpa`` reads the same
buffer as one packed sequence ``[1, H, B * S, d]`` (the same strides but dim 0's) with *token*
offsets (ops/attention_ragged.py). So each tensor of a ragged side is re-declared packed in
place, and the token offsets are computed inside the graph: a pointwise ``div`` of Q's (K's)
element offsets by Q's (K's) token stride, stored in their integer type (rounded to nearest).

Kernels divide in float: the quotient's relative error is at most about 2^-23, so offsets of
up to 2^21 tokens come out exact (error below 1/4, then rounded), with a token stride below
2^24 (exact in float). Larger packed buffers are refused rather than rounded wrongly.

graphdnn packs a side's tensors by one offsets tensor: Q's for Q, O, dO, Stats and dQ, K's
for K, V, dK and dV. The others' element offsets must start the same tokens (the frontend's
do); they are read by no node, so their variant-pack entries are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..dtypes import DataType
from ..errors import DataTypeError, UnsupportedError
from ..tensor import TensorSpec
from .spec import FrontendTensor, LenientSpec

MAX_TOKENS = 1 << 21  # tokens of a packed buffer whose offsets a float division gives exactly
MAX_TOKEN_STRIDE = 1 << 24  # a token stride float holds exactly


@dataclass(frozen=True)
class Side:
    """One ragged side of an attention node (Q's or K's): the token offsets graphdnn's node
    reads, and what every tensor of the side shares with the leading one."""

    node: str
    lead: str  # the leading tensor's role and name, for messages
    tokens: TensorSpec  # token offsets, [B + 1, 1, 1, 1]
    element_offsets: TensorSpec  # the leading tensor's ragged_offset
    batch: int
    seq_len: int
    token_stride: int


@dataclass(frozen=True)
class PendingOutput:
    """An output of a ragged side, packed at build: the frontend sets its dims, strides and
    ragged offset after the op call returns it."""

    side: Side
    role: str
    tensor: TensorSpec


def ragged_offset(tensor: TensorSpec | None) -> TensorSpec | None:
    return tensor.get_ragged_offset() if isinstance(tensor, FrontendTensor) else None


def pack_side(spec: LenientSpec, node: str, side: str, tensors: Sequence[tuple[str, TensorSpec | None]]) -> Side | None:
    """Pack the input tensors of one side (the leading one, q or k, first) when the leading one
    is ragged, and add the node computing its token offsets; None when the side is not ragged."""
    present = [(role, t) for role, t in tensors if t is not None]
    lead_role, lead = present[0]
    offsets = ragged_offset(lead)
    if offsets is None:
        for role, t in present[1:]:
            if ragged_offset(t) is not None:
                raise UnsupportedError(
                    f"{role} '{t.name}' has a ragged offset but {lead_role} '{lead.name}' has none: graphdnn packs "
                    f"every tensor of {lead_role}'s side by {lead_role}'s offsets, or none",
                    node=node,
                )
        return None
    if offsets.data_type.is_floating or offsets.data_type is DataType.BOOLEAN:
        raise DataTypeError(
            f"the ragged offset '{offsets.name}' of {lead_role} '{lead.name}' is {offsets.data_type.value}; "
            "ragged offsets are integer element offsets (set data_type INT32 or INT64)",
            node=node,
            tensor=offsets.name,
        )
    batch, seq_len, token_stride = _frontend_layout(node, lead_role, lead, lead.stride)
    tokens = spec.div(offsets, token_stride, name=f"{node}::ragged_tokens_{side}")
    tokens.set_data_type(offsets.data_type)
    packed = Side(node, f"{lead_role} '{lead.name}'", tokens, offsets, batch, seq_len, token_stride)
    for role, t in present:
        pack_tensor(packed, role, t)
    return packed


def pack_tensor(side: Side, role: str, tensor: TensorSpec, output: bool = False) -> None:
    """Re-declare ``tensor``, ``[B, H, S, d]`` with token-major strides, as ``[1, H, B * S, d]``
    over the same memory; an ``output`` whose strides are not given gets THD's."""
    if ragged_offset(tensor) is None:
        raise UnsupportedError(
            f"{role} '{tensor.name}' has no ragged offset while {side.lead} has: graphdnn packs every tensor of "
            "that side by its offsets; give it one (set_ragged_offset)",
            node=side.node,
        )
    dims = _ints(side.node, role, tensor, tensor.dim)
    if dims[0] == 1 and dims[2] == side.batch * side.seq_len and side.batch > 1:
        if output and isinstance(tensor, FrontendTensor) and not tensor.stride_is_set:  # inferred: THD strides
            tensor.set_stride(_thd(dims))
        return
    inferred = output and isinstance(tensor, FrontendTensor) and not tensor.stride_is_set
    given = _thd(dims) if inferred else tensor.stride
    batch, seq_len, token_stride = _frontend_layout(side.node, role, tensor, given)
    if (batch, seq_len) != (side.batch, side.seq_len):
        raise UnsupportedError(
            f"{role} '{tensor.name}' has B = {batch} and S = {seq_len}, {side.lead} B = {side.batch} and "
            f"S = {side.seq_len}: a side's ragged tensors hold the same sequences",
            node=side.node,
        )
    if ragged_offset(tensor) is side.element_offsets and token_stride != side.token_stride:
        raise UnsupportedError(
            f"{role} '{tensor.name}' shares the ragged offset of {side.lead} with another token stride "
            f"({token_stride}, not {side.token_stride}): the same element offsets would start other tokens; "
            "give it its own offsets",
            node=side.node,
        )
    stride = _ints(side.node, role, tensor, given)
    tensor.set_dim([1, dims[1], batch * seq_len, dims[3]])
    tensor.set_stride([batch * seq_len * token_stride, stride[1], token_stride, stride[3]])


def pack_outputs(pending: Sequence[PendingOutput]) -> None:
    """Pack the outputs of ragged sides, as the frontend left them (idempotent: a build step
    may run more than once)."""
    for output in pending:
        pack_tensor(output.side, output.role, output.tensor, output=True)


def check_ragged_uses(tensors: Sequence[TensorSpec], packed: set[TensorSpec]) -> None:
    """Ragged offsets only on the tensors of an attention's ragged side: graphdnn's other ops
    take no packed sequences."""
    for tensor in tensors:
        offsets = ragged_offset(tensor)
        if offsets is not None and tensor not in packed:
            raise UnsupportedError(
                f"'{tensor.name}' has the ragged offset '{offsets.name}' but is no tensor of a ragged sdpa or "
                "sdpa_backward (whose Q or K has ragged offsets; an input's must be set before the call): graphdnn's "
                "other ops take no packed sequences",
                tensor=tensor.name,
            )


def _frontend_layout(node: str, role: str, tensor: TensorSpec, stride: Sequence[object] | None) -> tuple[int, int, int]:
    """(B, S, token stride) of a ragged ``[B, H, S, d]`` tensor, whose strides must be
    token-major: a token's H x d elements within one step of S, B a step of S tokens."""
    dims = _ints(node, role, tensor, tensor.dim)
    steps = _ints(node, role, tensor, stride)
    if len(dims) != 4:
        raise UnsupportedError(
            f"{role} '{tensor.name}' has dims {list(dims)}; a ragged attention tensor is [B, H, S, d]", node=node
        )
    batch, heads, seq_len, width = dims
    span = (heads - 1) * steps[1] + (width - 1) * steps[3] + 1
    if span > steps[2] or (batch > 1 and steps[0] != seq_len * steps[2]) or min(steps) < 0:
        raise UnsupportedError(
            f"{role} '{tensor.name}' has strides {list(steps)} for dims {list(dims)}, which are not token-major: "
            "ragged offsets count tokens, so a token's H x d elements must lie within one step of S and B must "
            "step S tokens (BSHD or THD strides)",
            node=node,
        )
    if batch * seq_len > MAX_TOKENS or steps[2] >= MAX_TOKEN_STRIDE:
        raise UnsupportedError(
            f"{role} '{tensor.name}' holds {batch * seq_len} tokens of stride {steps[2]}: graphdnn turns element "
            f"offsets into tokens by a float division, exact up to {MAX_TOKENS} tokens of stride below "
            f"{MAX_TOKEN_STRIDE}; use gd.OperationGraphSpec.sdpa(ragged_offset_q=) with token offsets",
            node=node,
        )
    return batch, seq_len, steps[2]


def _thd(dims: Sequence[int]) -> list[int]:
    """Token-major strides of ``[B, H, S, d]``: BSHD, tokens of H x d elements."""
    _, heads, seq_len, width = dims
    return [seq_len * heads * width, width, heads * width, 1]


def _ints(node: str, role: str, tensor: TensorSpec, values: Sequence[object] | None) -> tuple[int, ...]:
    if values is None or not all(isinstance(v, int) for v in values):
        raise UnsupportedError(
            f"{role} '{tensor.name}' has dims or strides {values}: a ragged tensor needs static dims and strides",
            node=node,
        )
    return tuple(int(v) for v in values)  # type: ignore[call-overload]
