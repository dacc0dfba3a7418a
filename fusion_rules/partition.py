"""What fusion produces: a partition of the graph into fused nodes, and why.

Each :class:`FusedNode` becomes the kernels of one *family* in codegen. The partition is
in topological order, lists which tensors each fused node reads from and writes to
memory, and carries the log of every rewrite and every rejected candidate.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from functools import cached_property

from graphdnn.ir import Graph, Node, Tensor
from graphdnn.ops.base import Category


class Family(enum.Enum):
    """The kernel family that implements a fused node."""

    GEMM = "gemm"  # convolution forward, its gradients (when tensor cores fit) or matmul, with an epilogue
    ROW_NORM = "row_norm"  # layernorm / rmsnorm / adalayernorm, optionally after a residual add, with an epilogue
    ROW_NORM_BACKWARD = (
        "row_norm_backward"  # layer / RMS / adaptive layer norm backward: dx per row, then dscale / dbias
    )
    GROUP_NORM = "group_norm"  # groupnorm / instancenorm with an epilogue
    BATCHNORM_TRAIN = "batchnorm_train"  # batch statistics, running averages, apply + epilogue
    BATCHNORM_BACKWARD = "batchnorm_backward"  # per-channel sums of the grad, then dx + epilogue
    REDUCTION = "reduction"  # reduction / softmax with an epilogue
    ATTENTION = "attention"  # scaled dot-product attention: sdpa, or the attention rule's chain as one sdpa
    ATTENTION_BACKWARD = "attention_backward"  # sdpa_backward: delta = rowsum(dO O), then dK/dV and dQ
    ELEMENTWISE = "elementwise"  # a group of pointwise ops (and inference batch norms)
    DIRECT = "direct"  # any other single op, by a straightforward kernel


# Ops that compute each output element from the same element of their (broadcast) inputs:
# they can join an epilogue or an elementwise group.
ELEMENTWISE_EXTRA = frozenset({"batchnorm_inference"})

ANCHOR_FAMILY = {
    "conv_fprop": Family.GEMM,
    "matmul": Family.GEMM,
    "layernorm": Family.ROW_NORM,
    "rmsnorm": Family.ROW_NORM,
    "adalayernorm": Family.ROW_NORM,
    "layernorm_backward": Family.ROW_NORM_BACKWARD,
    "rmsnorm_backward": Family.ROW_NORM_BACKWARD,
    "adalayernorm_backward": Family.ROW_NORM_BACKWARD,
    "groupnorm": Family.GROUP_NORM,
    "instancenorm": Family.GROUP_NORM,
    "batchnorm": Family.BATCHNORM_TRAIN,
    "batchnorm_backward": Family.BATCHNORM_BACKWARD,
    "reduction": Family.REDUCTION,
    "softmax": Family.REDUCTION,
    "log_softmax": Family.REDUCTION,
    "softmax_backward": Family.REDUCTION,
    "argmax": Family.REDUCTION,
    "argmin": Family.REDUCTION,
    "sdpa": Family.ATTENTION,
    "sdpa_backward": Family.ATTENTION_BACKWARD,
}


def is_synthesized(anchor: Node | None, members: tuple[Node, ...]) -> bool:
    """Whether ``anchor`` is a node a rule built (no member of the fused node)."""
    return anchor is not None and all(node is not anchor for node in members)


def computing_nodes(fused: FusedNode) -> tuple[Node, ...]:
    """The nodes whose computation the fused node carries out: its built anchor alone, or its members."""
    if fused.synthesized:
        assert fused.anchor is not None
        return (fused.anchor,)
    return fused.nodes


def is_elementwise(node: Node) -> bool:
    return node.definition.category is Category.POINTWISE or node.op in ELEMENTWISE_EXTRA


def family_of(node: Node) -> Family:
    """The family of a node that stays alone."""
    if node.op in ANCHOR_FAMILY:
        return ANCHOR_FAMILY[node.op]
    return Family.ELEMENTWISE if is_elementwise(node) else Family.DIRECT


@dataclass(frozen=True)
class FusedNode:
    """Nodes that run as one kernel family.

    ``anchor`` is the op the family is built around (None for an elementwise group);
    ``prologue`` an elementwise node before it (the residual add of add+norm);
    ``epilogue`` the elementwise nodes after it, in topological order (for an
    elementwise group: all its nodes). ``inputs`` are read from memory, ``outputs``
    written to memory: graph outputs and tensors that later fused nodes read.

    A *synthesized* anchor is no member: a rule built it to compute all the members at
    once (attention written from primitives becomes an ``sdpa`` node). It reads the
    members' inputs (a tensor it views under other dims or strides keeps that tensor's
    id: the same memory) and writes their outputs; prologue and epilogue are then empty.
    """

    name: str
    rule: str
    family: Family
    nodes: tuple[Node, ...]
    anchor: Node | None
    prologue: Node | None
    epilogue: tuple[Node, ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    @property
    def synthesized(self) -> bool:
        """Whether the anchor is a node the rule built rather than one of the members."""
        return is_synthesized(self.anchor, self.nodes)

    def __repr__(self) -> str:
        return f"FusedNode({self.name!r} {self.family.value}: {', '.join(n.name for n in self.nodes)})"


@dataclass(frozen=True)
class Rewrite:
    """A rule fired: these nodes became one fused node."""

    rule: str
    fused: str
    members: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.rule}: {' + '.join(self.members)} -> {self.fused}"


@dataclass(frozen=True)
class Rejection:
    """A rule considered these nodes and did not fuse them, for ``reason``."""

    rule: str
    nodes: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {' → '.join(self.nodes)} not fused: {self.reason}"


@dataclass(frozen=True)
class Partition:
    graph: Graph
    nodes: tuple[FusedNode, ...]
    rewrites: tuple[Rewrite, ...]
    rejections: tuple[Rejection, ...]

    @cached_property
    def materialized(self) -> tuple[Tensor, ...]:
        """Virtual tensors that cross fused-node boundaries: they live in the workspace."""
        written = {t.id: t for fused in self.nodes for t in fused.outputs if t.is_virtual}
        return tuple(written[tid] for tid in sorted(written))

    def describe(self) -> str:
        """The partition, member by member, then the rewrites and the rejected candidates."""
        lines = [f"partition of '{self.graph.name}': {len(self.graph.nodes)} nodes -> {len(self.nodes)} fused nodes"]
        for fused in self.nodes:
            lines.append(
                f"  {fused.name} [{fused.family.value}, rule {fused.rule}]: {', '.join(n.name for n in fused.nodes)}"
            )
            if fused.synthesized:
                assert fused.anchor is not None
                lines.append(f"    computes {_signature(self.graph, fused.anchor)}")
            lines.append(f"    reads  {', '.join(t.name for t in fused.inputs) or '-'}")
            lines.append(f"    writes {', '.join(t.name for t in fused.outputs)}")
        if self.materialized:
            lines.append("  intermediates in the workspace: " + ", ".join(t.name for t in self.materialized))
        if self.rejections:
            lines.append("  not fused:")
            lines.extend(f"    {r}" for r in self.rejections)
        return "\n".join(lines)


def _signature(graph: Graph, node: Node) -> str:
    """``sdpa(Q=q, K=k [2, 4, 16, 8] view, ..., use_causal_mask=True)``: a synthesized node's roles
    and tensors, with the dims of a tensor it views differently from the graph, then its attributes
    that are not their defaults."""
    parts = []
    for role, bound in node.inputs:
        for tensor in bound if isinstance(bound, tuple) else (bound,):
            text = f"{role}={tensor.value if tensor.is_constant else tensor.name}"
            viewed = (tensor.dim, tensor.stride) != (graph.tensors[tensor.id].dim, graph.tensors[tensor.id].stride)
            parts.append(text + (f" viewed as {list(tensor.dim)} strides {list(tensor.stride)}" if viewed else ""))
    for field in dataclasses.fields(node.attributes):  # the attributes that differ from their defaults
        value = getattr(node.attributes, field.name)
        if field.default is dataclasses.MISSING or value != field.default:
            parts.append(f"{field.name}={value}")
    return f"{node.op}({', '.join(parts)}) -> {', '.join(t.name for t in node.output_tensors())}"
