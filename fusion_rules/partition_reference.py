"""Run a partition on the NumPy reference backend, each fused node the way its kernel will.

This is the executable specification of the fused kernels. It deliberately does not call
each member op's reference in turn: a convolution anchor is an im2col matrix product, a
batch norm in an epilogue is the folded per-channel affine, a layer/RMS/group
norm is standardised one set of elements at a time, a training batch norm takes its
statistics from per-channel sums and sums of squares. Comparing :func:`execute_partition`
with :func:`graphdnn.reference.execute` therefore checks both the partition and the
numerics each kernel family is allowed.

Values live in two places, as on the GPU: *memory*, which holds the feeds and what each
fused node writes (its ``outputs``), and the *registers* of the fused node being run,
loaded from its ``inputs`` only. A fused node that reads a tensor no earlier one wrote
raises, so the partition's bookkeeping is checked too. Every value a member op produces
is rounded to its tensor's type, whether it is written or stays in registers (the kernels
keep intermediates in the graph's intermediate type).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from graphdnn.dtypes import round_to
from graphdnn.errors import StructureError, UnsupportedError
from graphdnn.ir import FeedKey, Graph, Node, Tensor
from graphdnn.layout import storage_extent
from graphdnn.ops.conv import ConvMode, conv_attrs
from graphdnn.ops.norms import NormOp
from graphdnn.reference import bind_feeds, operands, output_arrays

from .partition import Family, FusedNode, Partition, computing_nodes, is_elementwise

Kernel = Callable[[Node, Mapping[str, Any]], dict[str, np.ndarray]]


def execute_partition(
    partition: Partition, feeds: Mapping[FeedKey, Any], plain: Mapping[int, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Run ``partition`` on NumPy inputs; same feeds and result as :func:`graphdnn.reference.execute`.

    ``plain``, every tensor's value from :func:`graphdnn.reference.evaluate` on the same
    feeds, saves work: a member that its kernel computes with the op's own reference, on
    inputs bit-identical to the plain ones, takes the plain outputs (the same function of
    the same values) instead of computing them again.
    """
    ir = partition.graph
    memory = bind_feeds(ir, feeds)
    for fused in partition.nodes:
        _run_fused_node(ir, fused, memory, plain or {})
    return output_arrays(ir, {t.id: _load(memory, t, None) for t in ir.outputs})


def _run_fused_node(
    ir: Graph, fused: FusedNode, memory: dict[int, np.ndarray], plain: Mapping[int, np.ndarray]
) -> None:
    """Load the fused node's inputs, compute its members in order, store its outputs."""
    registers = _Registers(ir, fused, {t.id: _load(memory, t, fused) for t in fused.inputs})
    registers.update({t.id: memory[t.id] for t in ir.tensors if t.is_constant})
    computers = computing_nodes(fused)
    for node in computers:
        kernel = _anchor_kernel(fused, node) if node is fused.anchor else _elementwise_kernel(fused, node)
        # A synthesized anchor is not the graph's node: the plain values come from its members.
        if kernel is _op_reference and not fused.synthesized and _same_inputs(node, registers, plain):
            registers.update({t.id: plain[t.id] for t in node.output_tensors()})
            continue
        results = kernel(node, operands(node, _Views(ir, node, registers) if fused.synthesized else registers))
        for role, tensor in node.outputs:
            value = np.asarray(results[role], dtype=np.float64)
            if value.shape != tensor.dim:
                raise AssertionError(f"{fused.name}: {node.op} gave {value.shape} for '{tensor.name}' {tensor.dim}")
            registers[tensor.id] = round_to(tensor.data_type, value)
    computed = {t.id for node in computers for t in node.output_tensors()}
    for tensor in fused.outputs:
        if tensor.id not in computed:
            raise StructureError(f"fused node '{fused.name}' writes '{tensor.name}', which none of its nodes computes")
        memory[tensor.id] = registers[tensor.id]


def _same_inputs(node: Node, registers: Mapping[int, np.ndarray], plain: Mapping[int, np.ndarray]) -> bool:
    """Whether ``plain`` holds the node's outputs, computed from bit-identical inputs
    (compared as integers, so -0.0 differs from 0.0 and NaN payloads count)."""
    if not all(t.id in plain for t in node.output_tensors()):
        return False
    return all(
        t.id in plain and np.array_equal(registers[t.id].view(np.int64), plain[t.id].view(np.int64))
        for t in node.input_tensors()
    )


class _Registers(dict[int, np.ndarray]):
    """A fused node's values by tensor id; reading one it never loaded or computed raises."""

    def __init__(self, graph: Graph, fused: FusedNode, loaded: dict[int, np.ndarray]) -> None:
        super().__init__(loaded)
        self.graph, self.fused = graph, fused

    def __missing__(self, tensor_id: int) -> np.ndarray:
        name = self.graph.tensors[tensor_id].name
        raise StructureError(
            f"fused node '{self.fused.name}' reads '{name}', which is neither among its inputs nor computed by it"
        )


class _Views(dict[int, np.ndarray]):
    """A synthesized anchor's operands: each input the anchor views under other dims or
    strides than the graph's tensor of that id (the same memory) is laid out in memory
    with the graph's strides and read back with the anchor's, as the kernel reads it."""

    def __init__(self, graph: Graph, node: Node, registers: Mapping[int, np.ndarray]) -> None:
        super().__init__()
        for tensor in node.input_tensors():
            stored = graph.tensors[tensor.id]
            value = registers[tensor.id]
            same = (tensor.dim, tensor.stride) == (stored.dim, stored.stride)
            self[tensor.id] = value if same else _reinterpret(value, stored, tensor)


def _reinterpret(value: np.ndarray, stored: Tensor, view: Tensor) -> np.ndarray:
    """The elements ``view`` addresses in the memory that holds ``value`` as ``stored``."""
    if min(stored.stride, default=0) < 0 or min(view.stride, default=0) < 0:
        raise UnsupportedError(f"a view of '{stored.name}' with negative strides")
    span = storage_extent(stored.static_dim, stored.static_stride)
    if storage_extent(view.static_dim, view.static_stride) > span:
        raise StructureError(f"a view {list(view.dim)} of '{stored.name}' reaches beyond its memory")
    flat = np.zeros(span, dtype=value.dtype)
    itemsize = flat.itemsize
    np.lib.stride_tricks.as_strided(flat, stored.static_dim, [s * itemsize for s in stored.static_stride])[...] = value
    read = np.lib.stride_tricks.as_strided(flat, view.static_dim, [s * itemsize for s in view.static_stride])
    return np.array(read)


def _load(memory: Mapping[int, np.ndarray], tensor: Tensor, fused: FusedNode | None) -> np.ndarray:
    if tensor.id not in memory:
        reader = f"fused node '{fused.name}'" if fused else "the graph's outputs"
        raise StructureError(f"{reader} reads '{tensor.name}', which no earlier fused node writes to memory")
    return memory[tensor.id]


# -- which computation each member gets ------------------------------------------------------
def _anchor_kernel(fused: FusedNode, node: Node) -> Kernel:
    if fused.family in (Family.REDUCTION, Family.DIRECT):
        return _op_reference
    kernel = _ANCHOR_KERNELS.get(fused.family, {}).get(node.op)
    if kernel is None:
        known = ", ".join(sorted(_ANCHOR_KERNELS.get(fused.family, {}))) or "no anchor"
        raise UnsupportedError(
            f"fused node '{fused.name}': the {fused.family.value} kernel family computes {known}, not {node.op}",
            node=node.name,
        )
    return kernel


def _elementwise_kernel(fused: FusedNode, node: Node) -> Kernel:
    if not is_elementwise(node):
        raise UnsupportedError(
            f"fused node '{fused.name}': {node.op} is not elementwise and cannot be a prologue or epilogue op",
            node=node.name,
        )
    return _folded_batchnorm if node.op == "batchnorm_inference" else _op_reference


def _op_reference(node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The op's own reference. A matmul anchor uses it too: its batched BLAS product is the
    GEMM in float64, which a second formulation (an einsum) would only repeat ~30x slower."""
    return node.definition.reference(node, x)


def _folded_batchnorm(node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Inference batch norm as the kernel applies it: one per-channel multiply-add."""
    scale = x["scale"] * x["inv_variance"]
    shift = x["bias"] - x["mean"] * scale
    return {"y": x["input"] * scale + shift}


# -- GEMM --------------------------------------------------------------------------------------
def _conv_im2col(node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Forward convolution as one (group-batched) product of an im2col matrix and the filters."""
    a = conv_attrs(node)
    image, weight = x["image"], x["weight"]
    spatial = image.ndim - 2
    if a.convolution_mode is ConvMode.CONVOLUTION:
        weight = np.flip(weight, axis=tuple(range(2, weight.ndim)))
    filt, out = weight.shape[2:], node.outputs[0][1].dim[2:]
    padded = np.pad(image, [(0, 0), (0, 0), *zip(a.pre_padding, a.post_padding)])
    reach = [d * (f - 1) + 1 for f, d in zip(filt, a.dilation)]
    windows = sliding_window_view(padded, reach, axis=tuple(range(2, 2 + spatial)))  # [N, C, *positions, *reach]
    picked = (
        slice(None),
        slice(None),
        *(slice(None, s * (o - 1) + 1, s) for s, o in zip(a.stride, out)),
        *(slice(None, None, d) for d in a.dilation),
    )
    columns = windows[picked]  # [N, C, *out, *filt]
    n, channels = image.shape[:2]
    k, per_group = weight.shape[:2]
    groups = channels // per_group
    columns = columns.reshape(n, groups, per_group, *out, *filt)
    columns = np.moveaxis(columns, (1, 2), (spatial + 1, spatial + 2))  # [N, *out, G, Cg, *filt]
    matrix = np.ascontiguousarray(columns).reshape(-1, groups, per_group * int(np.prod(filt)))
    filters = weight.reshape(groups, k // groups, -1)  # [G, Kg, Cg*filt]
    product = np.matmul(matrix.transpose(1, 0, 2), filters.transpose(0, 2, 1))  # [G, N*out, Kg]
    y = product.transpose(1, 0, 2).reshape(n, *out, k)
    return {"y": np.moveaxis(y, -1, 1)}


# -- normalizations ----------------------------------------------------------------------------
def _standardize_sets(node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Layer, RMS, group and instance norm as a kernel runs them: each set of elements the
    norm standardises is one in-register row; its mean first, then the centered variance
    (the mean of squares for RMS norm) from the same row, rstd = 1/sqrt(var + eps)."""
    data = x["input"]
    grouping = cast(NormOp, node.definition).checked(node)[1]
    sets = np.moveaxis(data.reshape(grouping.view), grouping.axes, range(-len(grouping.axes), 0))
    moved_shape = sets.shape
    rows = sets.reshape(-1, math.prod(grouping.view[a] for a in grouping.axes))
    centered = node.op != "rmsnorm"
    mean = rows.sum(axis=1, keepdims=True) / rows.shape[1] if centered else np.zeros((rows.shape[0], 1))
    deviation = rows - mean
    rstd = 1.0 / np.sqrt((deviation * deviation).sum(axis=1, keepdims=True) / rows.shape[1] + x["epsilon"])
    normalized = np.moveaxis((deviation * rstd).reshape(moved_shape), range(-len(grouping.axes), 0), grouping.axes)
    y = normalized.reshape(data.shape) * x["scale"] + x.get("bias", 0.0)
    return {"y": y, "mean": mean.reshape(grouping.stats), "inv_variance": rstd.reshape(grouping.stats)}


def _batchnorm_train(node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Training batch norm from per-channel sum and sum of squares (one pass over the input),
    var = E[x^2] - mean^2 clamped at 0, then the per-channel affine scale/shift."""
    data = x["input"]
    axes = (0, *range(2, data.ndim))
    count = data.size // data.shape[1]
    mean = data.sum(axis=axes, keepdims=True) / count
    var = np.maximum((data * data).sum(axis=axes, keepdims=True) / count - mean * mean, 0.0)
    rstd = 1.0 / np.sqrt(var + x["epsilon"])
    scale = x["scale"] * rstd
    shift = x["bias"] - mean * scale
    results = {"y": data * scale + shift, "mean": mean, "inv_variance": rstd}
    if "in_running_mean" in x:
        momentum = x["momentum"]
        unbiased = var * (count / (count - 1)) if count > 1 else var
        results["next_running_mean"] = x["in_running_mean"] + momentum * (mean - x["in_running_mean"])
        results["next_running_var"] = x["in_running_var"] + momentum * (unbiased - x["in_running_var"])
    return results


_ANCHOR_KERNELS: dict[Family, dict[str, Kernel]] = {
    Family.GEMM: {
        "conv_fprop": _conv_im2col,
        "matmul": _op_reference,
        "conv_dgrad": _op_reference,
        "conv_wgrad": _op_reference,
    },
    Family.ROW_NORM: {"layernorm": _standardize_sets, "rmsnorm": _standardize_sets, "adalayernorm": _standardize_sets},
    Family.ROW_NORM_BACKWARD: {
        "layernorm_backward": _op_reference,
        "rmsnorm_backward": _op_reference,
        "adalayernorm_backward": _op_reference,
    },
    Family.GROUP_NORM: {"groupnorm": _standardize_sets, "instancenorm": _standardize_sets},
    Family.BATCHNORM_TRAIN: {"batchnorm": _batchnorm_train},
    Family.BATCHNORM_BACKWARD: {"batchnorm_backward": _op_reference},
    Family.ATTENTION: {"sdpa": _op_reference},
    Family.ATTENTION_BACKWARD: {"sdpa_backward": _op_reference},
}
